/* The Criteo TSV reader (worker/data/criteo.h): the id hash against
 * constants computed by hand (a separate Python implementation of
 * docs/ctr.md's formula), values, empty fields, CRLF, gzip, shares,
 * batches, bounds, the CTR model's sparse form, and each mistake named
 * with its file and line. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "criteo.h"
#include "ctrdata.h"
#include "ctrgen.h"
#include "err.h"
#include "unit.h"

static char path[64];

/* A line with label y, integers "1".."13" but I2 empty and I3 -5, and
 * categorical values "c<k>" but C4 empty. */
static const char *const LINE =
    "1\t1\t\t-5\t4\t5\t6\t7\t8\t9\t10\t11\t12\t13\t"
    "c1\tc2\tc3\t\tc5\tc6\tc7\tc8\tc9\tc10\tc11\tc12\tc13\tc14\tc15\tc16\t"
    "c17\tc18\tc19\tc20\tc21\tc22\tc23\tc24\tc25\tc26";

static void write_text(const char *text, int gz) {
  snprintf(path, sizeof path, "/tmp/psd-test-criteo-%d%s", (int)getpid(),
           gz ? ".gz" : "");
  if (gz) {
    gzFile g = gzopen(path, "wb");
    gzwrite(g, text, (unsigned)strlen(text));
    gzclose(g);
  } else {
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
  }
}

/* Reads path whole (share 0 of 1) into the arrays (room for 8). */
static int read_all(const uint64_t *bounds, float *label, float *dense,
                    uint8_t *present, uint64_t *ids, size_t *got, char *err,
                    size_t errlen) {
  struct dw_criteo *r;
  int rc = dw_criteo_open(path, 0, 1, &r, err, errlen);
  if (rc)
    return rc;
  rc = dw_criteo_read(r, 8, bounds, label, dense, present, ids, got, err,
                      errlen);
  dw_criteo_close(r);
  return rc;
}

START_TEST(id_hash_constants) {
  /* Computed apart from this code (FNV-1a 64, splitmix64's finalizer). */
  ck_assert_uint_eq(dw_criteo_id(0, "", 0), 0x36178ff42bee28e5ull);
  ck_assert_uint_eq(dw_criteo_id(0, "68fd1e64", 8), 0xc55845092d8f8baaull);
  ck_assert_uint_eq(dw_criteo_id(2, "68fd1e64", 8), 0xde43c5c924fd7a53ull);
  ck_assert_uint_eq(dw_criteo_id(25, "a", 1), 0x762771c053bd537aull);
  ck_assert_uint_eq(dw_criteo_id(25, "", 0), 0xa8ea973f03213198ull);
}
END_TEST

/* The line's values, plain and gzip, `\n` and `\r\n`, with a last line
 * lacking its newline. */
static void check_values(int gz, const char *eol) {
  char text[1024], err[512];
  float label[8], dense[8 * 13];
  uint8_t present[8 * 13];
  uint64_t ids[8 * 26];
  size_t got;
  snprintf(text, sizeof text, "%s%s0%s", LINE, eol, LINE + 1);
  write_text(text, gz);
  ck_assert_int_eq(
      read_all(NULL, label, dense, present, ids, &got, err, sizeof err), 0);
  ck_assert_uint_eq(got, 2);
  ck_assert(label[0] == 1 && label[1] == 0);
  for (int k = 0; k < 2; k++) {
    const float *d = dense + 13 * k;
    ck_assert(d[0] == 1 && d[1] == 0 && d[2] == -5 && d[12] == 13);
    ck_assert(present[13 * k] == 1 && present[13 * k + 1] == 0 &&
              present[13 * k + 2] == 1);
    ck_assert_uint_eq(ids[26 * k], dw_criteo_id(0, "c1", 2));
    ck_assert_uint_eq(ids[26 * k + 3], dw_criteo_id(3, "", 0));
    ck_assert_uint_eq(ids[26 * k + 25], dw_criteo_id(25, "c26", 3));
  }
  unlink(path);
}

START_TEST(values_plain_lf) { check_values(0, "\n"); }
END_TEST
START_TEST(values_plain_crlf) { check_values(0, "\r\n"); }
END_TEST
START_TEST(values_gzip) { check_values(1, "\n"); }
END_TEST
START_TEST(values_gzip_crlf) { check_values(1, "\r\n"); }
END_TEST

START_TEST(bounds_shares_batches) {
  char text[8192], err[512];
  float label[8], dense[8 * 13];
  uint64_t ids[8 * 26];
  uint64_t bounds[26];
  size_t got, n = 0;
  text[0] = 0;
  for (int i = 0; i < 7; i++) { /* line i's label: i % 2 */
    strcat(text, i % 2 ? "1" : "0");
    strcat(text, LINE + 1);
    strcat(text, "\n");
  }
  write_text(text, 0);
  for (int c = 0; c < 26; c++)
    bounds[c] = (uint64_t)c + 2;
  ck_assert_int_eq(
      read_all(bounds, label, dense, NULL, ids, &got, err, sizeof err), 0);
  ck_assert_uint_eq(got, 7);
  ck_assert_uint_eq(ids[0], dw_criteo_id(0, "c1", 2) % 2);
  ck_assert_uint_eq(ids[25], dw_criteo_id(25, "c26", 3) % 27);
  /* Share 1 of 3: lines 1 and 4, in batches of one. */
  struct dw_criteo *r;
  ck_assert_int_eq(dw_criteo_open(path, 1, 3, &r, err, sizeof err), 0);
  for (;;) {
    ck_assert_int_eq(dw_criteo_read(r, 1, NULL, label + n, dense, NULL, ids,
                                    &got, err, sizeof err),
                     0);
    if (!got)
      break;
    n += got;
  }
  ck_assert_uint_eq(n, 2); /* lines 1 and 4 (0-based) of 0..6 */
  ck_assert(label[0] == 1 && label[1] == 0);
  ck_assert_uint_eq(dw_criteo_lines(r), 7);
  dw_criteo_close(r);
  ck_assert_int_eq(dw_criteo_open(path, 3, 3, &r, err, sizeof err), CM_EINVAL);
  unlink(path);
}
END_TEST

START_TEST(as_ctr_features) {
  struct dw_svm d;
  char err[512];
  write_text(LINE, 1);
  ck_assert_int_eq(dw_criteo_load_svm(path, 0, 1, &d, err, sizeof err), 0);
  ck_assert_uint_eq(d.n, 1);
  ck_assert_uint_eq(d.nnz, 26 + 12); /* I2 is missing */
  ck_assert(d.y[0] == 1);
  ck_assert_uint_eq(d.idx[3],
                    3 * DW_CTR_SPAN + dw_criteo_id(3, "", 0) % DW_CTR_SPAN);
  ck_assert(d.val[3] == 1);
  ck_assert_uint_eq(d.idx[26], 26 * DW_CTR_SPAN); /* I1 = 1 */
  ck_assert(fabsf(d.val[26] - logf(2)) < 1e-6f);
  ck_assert_uint_eq(d.idx[27], 28 * DW_CTR_SPAN); /* I3 = -5: log(1 + 0) */
  ck_assert(d.val[27] == 0);
  dw_svm_free(&d);
  unlink(path);
}
END_TEST

/* LINE with field k (0-based; -1: none) replaced by v, fields from `drop`
 * on left out (40: none), into out. */
static void edited(int k, const char *v, int drop, char *out, size_t size) {
  const char *p = LINE;
  out[0] = 0;
  for (int i = 0; i < drop && p; i++) {
    const char *tab = strchr(p, '\t');
    size_t n = tab ? (size_t)(tab - p) : strlen(p);
    size_t at = strlen(out);
    snprintf(out + at, size - at, "%s%.*s", i ? "\t" : "", i == k ? 0 : (int)n,
             p);
    if (i == k) {
      at = strlen(out);
      snprintf(out + at, size - at, "%s", v);
    }
    p = tab ? tab + 1 : NULL;
  }
}

START_TEST(names_mistakes) {
  static const struct {
    int field;        /* the field replaced, -1: none */
    const char *with; /* by this */
    int keep;         /* fields kept */
    const char *want; /* in the message, after the path */
  } bad[] = {
      {-1, "", 3, ":2: 3 tab-separated fields, want 40"},
      {-1, "", 0, ":2: 1 tab-separated fields, want 40"},
      {39, "c26\tc27", 40, ":2: 41 tab-separated fields, want 40"},
      {0, "2", 40, ":2: the label is '2', not 0 or 1"},
      {0, "10", 40, ":2: the label is '10', not 0 or 1"},
      {0, "", 40, ":2: the label is '', not 0 or 1"},
      {2, "x", 40, ":2: integer feature I2 is 'x', not a whole number"},
      {3, "-", 40, ":2: integer feature I3 is '-', not a whole number"},
      {3, "1234567890123456789", 40,
       ":2: integer feature I3 is '1234567890123456789'"},
      {4, "2.5", 40, ":2: integer feature I4 is '2.5'"},
      {13, " 7", 40, ":2: integer feature I13 is ' 7'"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char line[1024], text[4096], err[512];
    float label[8], dense[8 * 13];
    uint64_t ids[8 * 26];
    size_t got;
    edited(bad[i].field, bad[i].with, bad[i].keep, line, sizeof line);
    snprintf(text, sizeof text, "%s\n%s\n%s\n", LINE, line, LINE);
    write_text(text, (int)(i % 2));
    ck_assert_int_eq(
        read_all(NULL, label, dense, NULL, ids, &got, err, sizeof err),
        CM_EFORMAT);
    ck_assert_msg(strstr(err, bad[i].want) && strstr(err, path), "%zu: %s", i,
                  err);
    unlink(path);
  }
  struct dw_criteo *r;
  char err[512];
  ck_assert_int_eq(
      dw_criteo_open("/nonexistent/x.tsv", 0, 1, &r, err, sizeof err),
      CM_ENOENT);
  ck_assert_msg(strstr(err, "/nonexistent/x.tsv"), "%s", err);
}
END_TEST

START_TEST(truncated_gzip) {
  char text[16384], err[512];
  float label[8], dense[8 * 13];
  uint64_t ids[8 * 26];
  size_t got;
  text[0] = 0;
  for (int i = 0; i < 8; i++) {
    strcat(text, LINE);
    strcat(text, "\n");
  }
  write_text(text, 1);
  FILE *f = fopen(path, "r+");
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fclose(f);
  ck_assert_int_eq(truncate(path, size - 12), 0);
  ck_assert_int_eq(
      read_all(NULL, label, dense, NULL, ids, &got, err, sizeof err), CM_EIO);
  ck_assert_msg(strstr(err, path), "%s", err);
  /* Named once: zlib's message starts with the path too. */
  ck_assert_msg(!strstr(strstr(err, path) + strlen(path), path), "%s", err);
  ck_assert_msg(strstr(err, "unexpected end of file"), "%s", err);
  unlink(path);
}
END_TEST

/* Criteo Kaggle's test.txt: 39 fields, no label; named as such. */
START_TEST(unlabelled_line) {
  char text[4096], err[1024];
  float label[8], dense[8 * 13];
  uint64_t ids[8 * 26];
  size_t got;
  snprintf(text, sizeof text, "%s\n%s\n", LINE, strchr(LINE, '\t') + 1);
  write_text(text, 0);
  ck_assert_int_eq(
      read_all(NULL, label, dense, NULL, ids, &got, err, sizeof err),
      CM_EFORMAT);
  ck_assert_msg(strstr(err, path) &&
                    strstr(err, ":2: 39 tab-separated fields, want 40: an "
                                "unlabelled line (Criteo Kaggle's test.txt"),
                "%s", err);
  unlink(path);
}
END_TEST

/* A file of text in dir/name (gzip when gz). */
static void put(const char *dir, const char *name, const char *text, int gz) {
  char p[1100];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  if (gz) {
    gzFile g = gzopen(p, "wb");
    gzwrite(g, text, (unsigned)strlen(text));
    gzclose(g);
  } else {
    FILE *f = fopen(p, "w");
    fputs(text, f);
    fclose(f);
  }
}

/* ctrdata.h, the Criteo format: Kaggle's names read as the user's; an
 * unlabelled held-out file refused; the generator's gzip files replaced by
 * plain ones, nothing of the old generation left. */
START_TEST(data_dir_criteo) {
  char dir[64], cmd[256], err[2048], text[4096];
  struct dw_ctrgen_criteo_opts o = {300, 100, 11, 1};
  struct dw_ctrdata d;
  struct dw_ctrgen_truth t;
  struct stat st;
  snprintf(dir, sizeof dir, "/tmp/psd-test-cdata-%d", (int)getpid());
  ck_assert_int_eq(mkdir(dir, 0700), 0);
  snprintf(text, sizeof text, "%s\n%s\n", LINE, LINE);
  put(dir, "train.txt", text, 0);
  put(dir, "test.txt.gz", text, 1);
  ck_assert_int_eq(dw_ctrgen_criteo_find(dir, &o, &d, err, sizeof err), 0);
  ck_assert_int_eq(d.source, DW_CTRDATA_USER);
  ck_assert(strstr(d.train, "/train.txt") && strstr(d.test, "/test.txt.gz"));
  ck_assert(isnan(d.truth.auc));
  ck_assert_int_eq(dw_ctrgen_criteo_write(dir, &o, &t, NULL, err, sizeof err),
                   CM_EEXIST);
  ck_assert_msg(strstr(err, dir) && strstr(err, "not psd's to write"), "%s",
                err);
  snprintf(text, sizeof text, "%s\n", strchr(LINE, '\t') + 1);
  put(dir, "test.txt.gz", text, 1); /* Kaggle's: no labels */
  ck_assert_int_eq(dw_ctrgen_criteo_find(dir, &o, &d, err, sizeof err),
                   CM_EFORMAT);
  ck_assert_msg(strstr(err, "test.txt.gz:1: 39 tab-separated fields") &&
                    strstr(err, "unlabelled"),
                "%s", err);
  snprintf(cmd, sizeof cmd, "rm -r %s", dir);
  ck_assert_int_eq(system(cmd), 0);
  /* psd's own: gzip, then plain with other settings. */
  ck_assert_int_eq(dw_ctrgen_criteo_write(dir, &o, &t, NULL, err, sizeof err),
                   0);
  ck_assert_int_eq(dw_ctrgen_criteo_find(dir, &o, &d, err, sizeof err), 0);
  ck_assert_int_eq(d.source, DW_CTRDATA_PSD);
  ck_assert(d.truth.auc == t.auc && strstr(d.train, "/train.tsv.gz"));
  o.gzip = 0;
  ck_assert_int_eq(dw_ctrgen_criteo_find(dir, &o, &d, err, sizeof err), 0);
  ck_assert_int_eq(d.source, DW_CTRDATA_GENERATE);
  ck_assert_msg(dw_ctrgen_criteo_write(dir, &o, &t, NULL, err, sizeof err) == 0,
                "%s", err);
  snprintf(cmd, sizeof cmd, "%s/train.tsv.gz", dir);
  ck_assert_int_ne(stat(cmd, &st), 0); /* the old generation's: gone */
  ck_assert_int_eq(dw_ctrgen_criteo_find(dir, &o, &d, err, sizeof err), 0);
  ck_assert_int_eq(d.source, DW_CTRDATA_PSD);
  snprintf(cmd, sizeof cmd, "rm -r %s", dir);
  ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* Reads a whole file: adds its examples, its labels' sum and a checksum of
 * its ids to *n, *pos and *sum. */
static void scan(const char *file, size_t *n, double *pos, uint64_t *sum) {
  static float label[512], dense[512 * 13];
  static uint64_t ids[512 * 26];
  struct dw_criteo *r;
  char err[512];
  size_t got;
  ck_assert_int_eq(dw_criteo_open(file, 0, 1, &r, err, sizeof err), 0);
  do {
    ck_assert_msg(dw_criteo_read(r, 512, dw_criteo_bounds, label, dense, NULL,
                                 ids, &got, err, sizeof err) == 0,
                  "%s", err);
    for (size_t i = 0; i < got; i++) {
      *pos += label[i];
      for (int c = 0; c < 26; c++) {
        ck_assert_uint_lt(ids[26 * i + c], dw_criteo_bounds[c]);
        *sum = *sum * 31 + ids[26 * i + c];
      }
    }
    *n += got;
  } while (got);
  dw_criteo_close(r);
}

static struct dw_ctrdata d;

/* Whether dir gives o's job source (d filled). */
static int found(const char *dir, const struct dw_ctrgen_criteo_opts *o,
                 int source) {
  char err[2048];
  int rc = dw_ctrgen_criteo_find(dir, o, &d, err, sizeof err);
  ck_assert_msg(rc == 0, "%s", err);
  return d.source == source;
}

/* psd-ctrgen --format criteo: files the reader takes, the same bytes from
 * the same settings (plain or gzip), truth.json found again. */
START_TEST(generator_round_trip) {
  char dir[64], cmd[256], err[512], train[1100], test[1100];
  struct dw_ctrgen_criteo_opts o = {3000, 1000, 11, 0};
  struct dw_ctrgen_truth t;
  size_t n[2] = {0, 0};
  double pos[2] = {0, 0}, tpos;
  uint64_t sum[2] = {0, 0};
  snprintf(dir, sizeof dir, "/tmp/psd-test-cgen-%d", (int)getpid());
  for (int gz = 0; gz < 2; gz++) {
    o.gzip = gz;
    ck_assert_int_eq(mkdir(dir, 0700), 0);
    ck_assert_int_eq(dw_ctrgen_criteo_write(dir, &o, &t, NULL, err, sizeof err),
                     0);
    ck_assert(t.auc > 0.7 && t.auc < 0.95 && t.ctr > 0.1 && t.ctr < 0.4);
    ck_assert(t.dense_auc > 0.5 && t.dense_auc < t.auc - 0.1);
    ck_assert(found(dir, &o, DW_CTRDATA_PSD) && d.truth.auc == t.auc);
    o.seed++;
    ck_assert(found(dir, &o, DW_CTRDATA_GENERATE));
    o.seed--;
    dw_ctrgen_criteo_names(&o, dir, train, test, sizeof train);
    scan(train, &n[gz], &pos[gz], &sum[gz]);
    ck_assert_uint_eq(n[gz], 3000);
    tpos = pos[gz];
    scan(test, &n[gz], &pos[gz], &sum[gz]);
    ck_assert_uint_eq(n[gz], 4000);
    ck_assert(fabs((pos[gz] - tpos) / 1000 - t.ctr) < 1e-9);
    unlink(test);
    ck_assert(found(dir, &o, DW_CTRDATA_GENERATE));
    snprintf(cmd, sizeof cmd, "rm -r %s", dir);
    ck_assert_int_eq(system(cmd), 0);
  }
  ck_assert(sum[0] == sum[1] && pos[0] == pos[1]); /* the same lines */
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("criteo");
  TCase *t = tcase_create("reader");
  tcase_add_test(t, id_hash_constants);
  tcase_add_test(t, values_plain_lf);
  tcase_add_test(t, values_plain_crlf);
  tcase_add_test(t, values_gzip);
  tcase_add_test(t, values_gzip_crlf);
  tcase_add_test(t, bounds_shares_batches);
  tcase_add_test(t, as_ctr_features);
  tcase_add_test(t, names_mistakes);
  tcase_add_test(t, truncated_gzip);
  tcase_add_test(t, unlabelled_line);
  tcase_add_test(t, data_dir_criteo);
  tcase_add_test(t, generator_round_trip);
  suite_add_tcase(s, t);
  return s;
}

int main(void) { return tu_run(suite(), 0); }
