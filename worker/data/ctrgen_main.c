/* psd-ctrgen: writes the click-through-rate example's data set (ctrgen.h,
 * docs/ctr.md) into a directory: train.svm, test.svm (LIBSVM) and
 * truth.json (the settings and the true model's held-out AUC and log
 * loss). dworker generates the same files itself when job.model "ctr"
 * finds none; this tool makes them ahead, or of other sizes. */
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "ctrgen.h"
#include "units.h"

static void usage(FILE *f) {
  fprintf(f,
          "usage: psd-ctrgen --out DIR [--train N] [--test N] [--fields F]\n"
          "                  [--seed S] [--zipf Z]\n"
          "\n"
          "Writes DIR/train.svm and DIR/test.svm, LIBSVM lines `label id:1 "
          "...`\n"
          "(one id per field; field f's ids are f * 10^9 + 0..10^9-1, drawn\n"
          "Zipf-distributed), labelled by a known factorization machine, and\n"
          "DIR/truth.json with the settings and that true model's AUC and "
          "log\n"
          "loss on test.svm. The same settings always give the same bytes.\n"
          "\n"
          "  --out DIR     the directory (created when missing)\n"
          "  --train N     training examples (default 500000)\n"
          "  --test N      held-out examples (default 50000)\n"
          "  --fields F    categorical fields per example, 1..64 (default 8)\n"
          "  --seed S      the data's seed (default 7)\n"
          "  --zipf Z      the ids' Zipf exponent, > 1 (default 1.6)\n"
          "\n"
          "Exit status: 0 written, 1 a write failed, 2 usage.\n");
}

static void progress(const char *file, double done) {
  fprintf(stderr, "psd-ctrgen: %s: %.0f%%\n", file, 100.0 * done);
}

/* The long name of the option whose value is ch. */
static const char *name_of(const struct option *opts, int ch) {
  for (; opts->name; opts++)
    if (opts->val == ch)
      return opts->name;
  return "?";
}

int main(int argc, char **argv) {
  static const struct option opts[] = {{"out", required_argument, 0, 'o'},
                                       {"train", required_argument, 0, 'n'},
                                       {"test", required_argument, 0, 'm'},
                                       {"fields", required_argument, 0, 'f'},
                                       {"seed", required_argument, 0, 's'},
                                       {"zipf", required_argument, 0, 'z'},
                                       {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
  struct dw_ctrgen_opts o = {8, 500000, 50000, 7, 1.6};
  struct dw_ctrgen_truth t;
  const char *out = NULL;
  char err[2048];
  int ch;
  while ((ch = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    long long n = 0;
    const char *bad = NULL;
    switch (ch) {
    case 'o':
      out = optarg;
      break;
    case 'n':
    case 'm':
    case 's':
      if (cm_parse_int(optarg, 0, LLONG_MAX, &n))
        bad = "a whole number >= 0";
      else if (ch == 'n')
        o.train = (uint64_t)n;
      else if (ch == 'm')
        o.test = (uint64_t)n;
      else
        o.seed = (uint64_t)n;
      break;
    case 'f':
      if (cm_parse_int(optarg, 1, 64, &n))
        bad = "a whole number 1..64";
      else
        o.fields = (int)n;
      break;
    case 'z':
      if (cm_parse_double(optarg, &o.zipf))
        bad = "a number above 1";
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
  mkdir(out, 0755);
  if (dw_ctrgen_write(out, &o, &t, progress, err, sizeof err)) {
    fprintf(stderr, "psd-ctrgen: %s\n", err);
    return 1;
  }
  printf("wrote %s: %llu training and %llu held-out examples, %d fields; the "
         "true model's held-out AUC is %.4f, log loss %.4f (%.1f%% positive)\n",
         out, (unsigned long long)o.train, (unsigned long long)o.test, o.fields,
         t.auc, t.logloss, 100.0 * t.ctr);
  return 0;
}
