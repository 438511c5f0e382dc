/* psd-ctrgen: writes the click-through-rate example's data set (ctrgen.h,
 * docs/ctr.md) into a directory: train.svm, test.svm (LIBSVM) or, with
 * --format criteo, train.tsv and test.tsv (Criteo's layout, criteo.h), and
 * truth.json (the settings and the true model's held-out AUC and log
 * loss), into a directory that is new or of psd's own generation only
 * (ctrdata.h: any other is refused). dworker generates the same files
 * itself when job.model "ctr" finds none; this tool makes them ahead, or
 * of other sizes; with --keep it says which files a job reads there. --count
 * FILE prints a Criteo file's distinct ids % the DLRM's bounds per field: the
 * rows its tables hold after an epoch. --drift writes a stream of parts
 * whose truth changes (ctrgen_drift.c), for training on a stream. */
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "criteo.h"
#include "ctrdata.h"
#include "ctrgen.h"
#include "err.h"
#include "units.h"

static void usage(FILE *f) {
  fprintf(
      f,
      "usage: psd-ctrgen --out DIR [--train N] [--test N] [--fields F]\n"
      "                  [--seed S] [--zipf Z]\n"
      "       psd-ctrgen --format criteo --out DIR [--train N] [--test N]\n"
      "                  [--seed S] [--gzip] [--keep]\n"
      "       psd-ctrgen --drift --out DIR [--parts N] [--per-part N]\n"
      "                  [--fields F] [--seed S] [--zipf Z] [--shift R]\n"
      "                  [--turn X] [--parts-from K] [--parts-to M]\n"
      "                  [--delay-s D] [--end NAME]\n"
      "       psd-ctrgen --count FILE\n"
      "\n"
      "Writes DIR/train.svm and DIR/test.svm, LIBSVM lines `label id:1 "
      "...`\n"
      "(one id per field; field f's ids are f * 10^9 + 0..10^9-1, drawn\n"
      "Zipf-distributed), labelled by a known factorization machine, and\n"
      "DIR/truth.json with the settings and that true model's AUC and "
      "log\n"
      "loss on test.svm. The same settings always give the same bytes.\n"
      "--format criteo writes DIR/train.tsv and DIR/test.tsv in Criteo's\n"
      "layout (label, 13 integers, 26 hex categorical values, tabs) with\n"
      "Criteo Kaggle's cardinalities (docs/ctr.md); --count FILE prints\n"
      "such a file's distinct ids %% psd.criteo.CARDINALITIES per field.\n"
      "\n"
      "  --format F    libsvm (default) or criteo\n"
      "  --gzip        criteo: train.tsv.gz and test.tsv.gz\n"
      "  --keep        leave DIR as it is when it holds psd's data of exactly\n"
      "                these settings (truth.json says so, the generator's\n"
      "                version included) or the user's data (files psd\n"
      "                reads there: train.tsv, train.tsv.gz, train.txt or\n"
      "                train.txt.gz and test.* alike; libsvm train.svm and\n"
      "                test.svm), else generate; says which files\n"
      "  --out DIR     the directory (created when missing). psd writes only\n"
      "                into a new or empty directory or one of its own\n"
      "                generation (truth.json marked \"generator\": "
      "\"psd-ctrgen\");\n"
      "                any other is refused, nothing written\n"
      "  --train N     training examples (default 500000; criteo 5000000)\n"
      "  --test N      held-out examples (default 50000; criteo 100000)\n"
      "  --fields F    categorical fields per example, 1..64 (default 8)\n"
      "  --seed S      the data's seed (default 7)\n"
      "  --zipf Z      the ids' Zipf exponent, > 1 (default 1.6)\n"
      "\n"
      "--drift writes a stream: DIR/part-00000.svm, part-00001.svm, ...\n"
      "(each written under a hidden temporary name, then renamed), whose\n"
      "true model changes from part to part: every part each id falls\n"
      "--shift ranks and new ids take the top ranks, the true weights turn\n"
      "by --turn radians; DIR/truth.json gives each part's true AUC and log\n"
      "loss (docs/ctr.md, \"Training on a stream\").\n"
      "  --parts N     parts in the stream (default 10)\n"
      "  --per-part N  examples per part (default 50000)\n"
      "  --shift R     ranks an id falls per part (default 1)\n"
      "  --turn X      radians the true weights turn per part (default 0.1)\n"
      "  --parts-from K, --parts-to M  write parts K..M-1 only (0-based;\n"
      "                default all); truth.json still has every part\n"
      "  --delay-s D   wait D seconds before each part after the first\n"
      "  --end NAME    then create DIR/NAME, the stream's end marker\n"
      "\n"
      "Out: a line `wrote DIR: ...` or `kept DIR: ...`, then `train: PATH`\n"
      "and `test: PATH`, the files a job reads, and `data: generated` (psd's,\n"
      "truth.json its true model) or `data: user` (not for --drift, --count).\n"
      "\n"
      "Exit status: 0 written, kept (or counted), 1 a write or read failed\n"
      "or DIR is not psd's to write, 2 usage.\n");
}

static void progress(const char *file, double done) {
  fprintf(stderr, "psd-ctrgen: %s: %.0f%%\n", file, 100.0 * done);
}

/* --count: a bitmap per field of the ids % bound seen. */
static int count(const char *path) {
  enum { B = 8192 };
  static float label[B], dense[B * DW_CRITEO_INTS];
  static uint64_t ids[B * DW_CRITEO_CATS];
  uint8_t *seen[DW_CRITEO_CATS] = {0};
  uint64_t distinct[DW_CRITEO_CATS] = {0}, total = 0, lines = 0;
  struct dw_criteo *r = NULL;
  char err[2048];
  size_t got;
  int rc = 1;
  for (int f = 0; f < DW_CRITEO_CATS; f++)
    if (!(seen[f] = calloc(dw_criteo_bounds[f] / 8 + 1, 1))) {
      fprintf(stderr, "psd-ctrgen: out of memory\n");
      goto out;
    }
  if (dw_criteo_open(path, 0, 1, &r, err, sizeof err))
    goto fail;
  while (!dw_criteo_read(r, B, dw_criteo_bounds, label, dense, NULL, ids, &got,
                         err, sizeof err)) {
    if (!got) {
      rc = 0;
      break;
    }
    lines += got;
    for (size_t k = 0; k < got * DW_CRITEO_CATS; k++) {
      int f = (int)(k % DW_CRITEO_CATS);
      uint64_t id = ids[k];
      if (!(seen[f][id / 8] & (1u << (id % 8)))) {
        seen[f][id / 8] |= (uint8_t)(1u << (id % 8));
        distinct[f]++;
      }
    }
  }
fail:
  if (rc) {
    fprintf(stderr, "psd-ctrgen: %s\n", err);
    goto out;
  }
  printf("%s: %llu lines\nfield  bound     distinct\n", path,
         (unsigned long long)lines);
  for (int f = 0; f < DW_CRITEO_CATS; f++) {
    printf("C%-4d  %-8llu  %llu\n", f + 1,
           (unsigned long long)dw_criteo_bounds[f],
           (unsigned long long)distinct[f]);
    total += distinct[f];
  }
  printf("total  rows      %llu\n", (unsigned long long)total);
out:
  dw_criteo_close(r);
  for (int f = 0; f < DW_CRITEO_CATS; f++)
    free(seen[f]);
  return rc;
}

/* --drift: each part as it lands (a test feeding a live job waits on
 * these). */
static void said(const char *part) {
  printf("part %s\n", part);
  fflush(stdout);
}

/* The long name of the option whose value is ch. */
static const char *name_of(const struct option *opts, int ch) {
  for (; opts->name; opts++)
    if (opts->val == ch)
      return opts->name;
  return "?";
}

int main(int argc, char **argv) {
  static const struct option opts[] = {
      {"out", required_argument, 0, 'o'},
      {"train", required_argument, 0, 'n'},
      {"test", required_argument, 0, 'm'},
      {"fields", required_argument, 0, 'f'},
      {"seed", required_argument, 0, 's'},
      {"zipf", required_argument, 0, 'z'},
      {"format", required_argument, 0, 'F'},
      {"gzip", no_argument, 0, 'g'},
      {"count", required_argument, 0, 'c'},
      {"keep", no_argument, 0, 'k'},
      {"drift", no_argument, 0, 'D'},
      {"parts", required_argument, 0, 'P'},
      {"per-part", required_argument, 0, 'E'},
      {"shift", required_argument, 0, 'S'},
      {"turn", required_argument, 0, 'T'},
      {"parts-from", required_argument, 0, 'a'},
      {"parts-to", required_argument, 0, 'b'},
      {"delay-s", required_argument, 0, 'd'},
      {"end", required_argument, 0, 'e'},
      {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  struct dw_ctrgen_opts o = {8, 500000, 50000, 7, 1.6};
  struct dw_ctrgen_truth t;
  struct dw_ctrdata found;
  struct dw_ctrgen_criteo_opts co = {DW_CRITEO_TRAIN, DW_CRITEO_TEST, 7, 0};
  const char *out = NULL;
  char err[2048];
  struct dw_ctrgen_drift_opts dr = {0,   10, 50000,      7, 1.6, 1,
                                    0.1, 0,  UINT64_MAX, 0, NULL};
  int ch, criteo = 0, libsvm_only = 0, keep = 0, drift = 0, drift_only = 0;
  while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    long long n = 0;
    const char *bad = NULL;
    switch (ch) {
    case 'o':
      out = optarg;
      break;
    case 'F':
      if (strcmp(optarg, "libsvm") && strcmp(optarg, "criteo"))
        bad = "libsvm or criteo";
      criteo = !strcmp(optarg, "criteo");
      break;
    case 'g':
      co.gzip = 1;
      break;
    case 'k':
      keep = 1;
      break;
    case 'c':
      return count(optarg);
    case 'D':
      drift = 1;
      break;
    case 'P':
    case 'E':
    case 'S':
    case 'a':
    case 'b':
      drift_only = 1;
      if (cm_parse_int(optarg, ch == 'P' || ch == 'E' ? 1 : 0, LLONG_MAX, &n))
        bad = ch == 'P' || ch == 'E' ? "a whole number >= 1"
                                     : "a whole number >= 0";
      else
        *(ch == 'P'   ? &dr.parts
          : ch == 'E' ? &dr.per_part
          : ch == 'S' ? &dr.shift
          : ch == 'a' ? &dr.from
                      : &dr.to) = (uint64_t)n;
      break;
    case 'T':
    case 'd':
      drift_only = 1;
      if (cm_parse_double(optarg, ch == 'T' ? &dr.turn : &dr.delay_s) ||
          dr.delay_s < 0 || !isfinite(dr.turn) || !isfinite(dr.delay_s))
        bad = ch == 'T' ? "a number of radians" : "a number of seconds >= 0";
      break;
    case 'e':
      drift_only = 1;
      dr.end = optarg;
      if (!*optarg || strchr(optarg, '/'))
        bad = "a file name";
      break;
    case 'n':
    case 'm':
    case 's':
      if (cm_parse_int(optarg, 0, LLONG_MAX, &n))
        bad = "a whole number >= 0";
      else if (ch == 'n')
        o.train = co.train = (uint64_t)n;
      else if (ch == 'm')
        o.test = co.test = (uint64_t)n;
      else
        o.seed = co.seed = (uint64_t)n;
      break;
    case 'f':
      if (cm_parse_int(optarg, 1, 64, &n))
        bad = "a whole number 1..64";
      else
        o.fields = (int)n;
      libsvm_only = 1;
      break;
    case 'z':
      if (cm_parse_double(optarg, &o.zipf))
        bad = "a number above 1";
      libsvm_only = 1;
      break;
    default:
      usage(ch == 'h' ? stdout : stderr);
      return ch == 'h' ? 0 : 2;
    }
    if (bad) {
      fprintf(stderr, "psd-ctrgen: --%s takes %s, not '%s'\n",
              name_of(opts, ch), bad, optarg);
      return 2;
    }
  }
  if (!out || o.fields < 1 || o.fields > 64 || o.zipf <= 1 || !o.train ||
      !o.test) {
    fprintf(stderr, "psd-ctrgen: %s\n",
            !out ? "--out DIR is required"
                 : "--fields must be 1..64, --zipf above 1, --train and "
                   "--test at least 1");
    return 2;
  }
  if (drift_only && !drift) {
    fprintf(stderr, "psd-ctrgen: --parts, --per-part, --shift, --turn, "
                    "--parts-from, --parts-to, --delay-s and --end are "
                    "--drift's\n");
    return 2;
  }
  if (drift && keep) {
    fprintf(stderr, "psd-ctrgen: --keep is for the training and held-out "
                    "sets, not --drift's parts\n");
    return 2;
  }
  if (drift && criteo) {
    fprintf(stderr, "psd-ctrgen: --drift writes LIBSVM parts only\n");
    return 2;
  }
  if (criteo && libsvm_only) {
    fprintf(stderr, "psd-ctrgen: --fields and --zipf are the LIBSVM format's; "
                    "--format criteo has 26 fields of its own\n");
    return 2;
  }
  if (!criteo && co.gzip) {
    fprintf(stderr, "psd-ctrgen: --gzip is for --format criteo\n");
    return 2;
  }
  if (keep && (criteo ? dw_ctrgen_criteo_find(out, &co, &found, err, sizeof err)
                      : dw_ctrgen_find(out, &o, &found, err, sizeof err))) {
    fprintf(stderr, "psd-ctrgen: %s\n", err);
    return 1;
  }
  if (keep && found.source == DW_CTRDATA_PSD) {
    printf("kept %s: it holds the data of these settings; the true model's "
           "held-out AUC is %.4f\ntrain: %s\ntest: %s\ndata: generated\n",
           out, found.truth.auc, found.train, found.test);
    return 0;
  }
  if (keep && found.source == DW_CTRDATA_USER) {
    printf(
        "kept %s: the user's data, not psd's (read as it is: no true "
        "model; psd writes nothing there)\ntrain: %s\ntest: %s\ndata: user\n",
        out, found.train, found.test);
    return 0;
  }
  if (drift) {
    if (dw_ctrdata_claim_stream(out, dr.end, err, sizeof err)) {
      fprintf(stderr, "psd-ctrgen: %s\n", err);
      return 1;
    }
    dr.fields = o.fields;
    dr.seed = o.seed;
    dr.zipf = o.zipf;
    if (dr.to > dr.parts)
      dr.to = dr.parts;
    if (dw_ctrgen_drift_write(out, &dr, said, err, sizeof err)) {
      fprintf(stderr, "psd-ctrgen: %s\n", err);
      return 1;
    }
    printf("wrote %s: parts %llu..%llu of %llu, %llu examples each, %d "
           "fields; truth.json has each part's true AUC and log loss\n",
           out, (unsigned long long)dr.from,
           (unsigned long long)(dr.to ? dr.to - 1 : 0),
           (unsigned long long)dr.parts, (unsigned long long)dr.per_part,
           dr.fields);
    return 0;
  }
  if (criteo) {
    if (dw_ctrgen_criteo_write(out, &co, &t, progress, err, sizeof err)) {
      fprintf(stderr, "psd-ctrgen: %s\n", err);
      return 1;
    }
    printf("wrote %s: %llu training and %llu held-out examples in Criteo's "
           "layout; the true model's held-out AUC is %.4f, log loss %.4f "
           "(%.1f%% positive); its integer term alone %.4f\n",
           out, (unsigned long long)co.train, (unsigned long long)co.test,
           t.auc, t.logloss, 100.0 * t.ctr, t.dense_auc);
    dw_ctrgen_criteo_names(&co, out, found.train, found.test,
                           sizeof found.train);
    printf("train: %s\ntest: %s\ndata: generated\n", found.train, found.test);
    return 0;
  }
  if (dw_ctrgen_write(out, &o, &t, progress, err, sizeof err)) {
    fprintf(stderr, "psd-ctrgen: %s\n", err);
    return 1;
  }
  printf("wrote %s: %llu training and %llu held-out examples, %d fields; the "
         "true model's held-out AUC is %.4f, log loss %.4f (%.1f%% positive)\n",
         out, (unsigned long long)o.train, (unsigned long long)o.test, o.fields,
         t.auc, t.logloss, 100.0 * t.ctr);
  printf("train: %s/train.svm\ntest: %s/test.svm\ndata: generated\n", out, out);
  return 0;
}
