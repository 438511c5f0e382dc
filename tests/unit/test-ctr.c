/* The click-through-rate pieces: the LIBSVM reader (shares, values, and
 * every mistake named with its file and line), the AUC on known cases, the
 * wide & deep model's gradients against finite differences (dense weights,
 * embedding rows and wide weights), and the generator (the same bytes from
 * the same settings; truth.json found again). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ctr.h"
#include "ctrdata.h"
#include "ctrgen.h"
#include "err.h"
#include "libsvm.h"
#include "unit.h"

static char path[64];

static void write_text(const char *text) {
  snprintf(path, sizeof path, "/tmp/psd-test-svm-%d", (int)getpid());
  FILE *f = fopen(path, "w");
  fputs(text, f);
  fclose(f);
}

START_TEST(reads_shares) {
  struct dw_svm d;
  char err[512];
  write_text("1 5:1 7:0.5\n# a comment\n\n0 9:2\n-1 3:1\n+1 4:1 4:1\n");
  ck_assert_int_eq(dw_svm_load(path, 0, 1, &d, err, sizeof err), 0);
  ck_assert_uint_eq(d.n, 4);
  ck_assert(d.y[0] == 1 && d.y[1] == 0 && d.y[2] == 0 && d.y[3] == 1);
  ck_assert_uint_eq(d.nnz, 6);
  ck_assert(d.idx[1] == 7 && d.val[1] == 0.5f);
  dw_svm_free(&d);
  ck_assert_int_eq(dw_svm_load(path, 1, 2, &d, err, sizeof err), 0);
  ck_assert_uint_eq(d.n, 2); /* lines 2 and 4 of the examples */
  ck_assert(d.idx[0] == 9);
  dw_svm_free(&d);
  unlink(path);
}
END_TEST

START_TEST(names_mistakes) {
  static const struct {
    const char *text, *want;
  } bad[] = {{"1 5:1\n2 3:1\n", ":2: the label is not 0 or 1"},
             {"1 5:1\n0 3:x\n", ":2: the value of feature 3"},
             {"1 abc\n", ":1: 'abc' is not idx:val"},
             {"1 -3:1\n", ":1: a negative feature index"},
             {"1 3:inf\n", ":1: the value of feature 3 is not a finite"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    struct dw_svm d;
    char err[512];
    write_text(bad[i].text);
    ck_assert_int_eq(dw_svm_load(path, 0, 1, &d, err, sizeof err), CM_EFORMAT);
    ck_assert_msg(strstr(err, bad[i].want) && strstr(err, path), "%s", err);
    unlink(path);
  }
  struct dw_svm d;
  char err[512];
  ck_assert_int_eq(dw_svm_load("/nonexistent/x.svm", 0, 1, &d, err, sizeof err),
                   CM_ENOENT);
}
END_TEST

START_TEST(auc_known_cases) {
  float s[4] = {0.1f, 0.4f, 0.35f, 0.8f};
  uint8_t y[4] = {0, 0, 1, 1};
  ck_assert(fabs(dw_auc(s, y, 4) - 0.75) < 1e-12);
  float t[4] = {0.5f, 0.5f, 0.5f, 0.5f};
  ck_assert(fabs(dw_auc(t, y, 4) - 0.5) < 1e-12); /* ties count half */
  uint8_t one[4] = {1, 1, 1, 1};
  ck_assert(dw_auc(s, one, 4) == 0.5);
}
END_TEST

START_TEST(gradients_match_finite_differences) {
  struct dw_ctr *m;
  int hidden[1] = {5};
  ck_assert_int_eq(dw_ctr_new(&m, 2, 3, hidden, 1, _i, 8), 0);
  for (size_t i = 0; i < m->nparams; i++)
    m->params[i] = 0.3f * sinf((float)i * 1.7f + 0.2f);
  /* 3 examples over 4 unique rows; example 1 has two features in field 0 */
  size_t start[4] = {0, 2, 5, 7};
  int field[7] = {0, 1, 0, 0, 1, 0, 1};
  float val[7] = {1, 1, 1, 0.5f, 1, 2, 1};
  uint32_t row[7] = {0, 1, 2, 0, 3, 2, 1};
  uint8_t y[3] = {1, 0, 1};
  struct dw_ctr_batch b = {3, start, field, val, row, 4, y};
  float emb[12], wide[4], gemb[12], gwide[4], loss, l2, eps = 1e-3f;
  for (int i = 0; i < 12; i++)
    emb[i] = 0.2f * cosf((float)i);
  for (int i = 0; i < 4; i++)
    wide[i] = 0.1f * (float)i - 0.15f;
  ck_assert_int_eq(dw_ctr_step(m, &b, emb, wide, NULL, &loss, gemb, gwide), 0);
  float *g = malloc(m->nparams * sizeof *g), ge[12], gw[4];
  memcpy(g, m->grads, m->nparams * sizeof *g);
  memcpy(ge, gemb, sizeof ge);
  memcpy(gw, gwide, sizeof gw);
#define FD(x, grad)                                                            \
  do {                                                                         \
    float keep = (x), up, down;                                                \
    (x) = keep + eps;                                                          \
    dw_ctr_step(m, &b, emb, wide, NULL, &up, gemb, gwide);                     \
    (x) = keep - eps;                                                          \
    dw_ctr_step(m, &b, emb, wide, NULL, &down, gemb, gwide);                   \
    (x) = keep;                                                                \
    l2 = (up - down) / (2 * eps);                                              \
    ck_assert_msg(fabsf(l2 - (grad)) < 2e-3f, "%s: %g vs %g", #x, l2,          \
                  (double)(grad));                                             \
  } while (0)
  for (size_t i = 0; i < m->nparams; i++)
    FD(m->params[i], g[i]);
  for (int i = 0; i < 12; i++)
    FD(emb[i], ge[i]);
  for (int i = 0; i < 4; i++)
    FD(wide[i], gw[i]);
  free(g);
  dw_ctr_free(m);
}
END_TEST

/* The bytes of dir/name ("" when absent), into buf. */
static const char *slurp(const char *dir, const char *name, char *buf,
                         size_t size) {
  char p[1100];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  FILE *f = fopen(p, "r");
  size_t n = f ? fread(buf, 1, size - 1, f) : 0;
  buf[n] = '\0';
  if (f)
    fclose(f);
  return buf;
}

/* ctrdata.h, LIBSVM: the user's files beside a truth.json psd did not write
 * are read and never written; a directory of other files is refused,
 * naming it, the names looked for and what it holds; psd's files changed
 * by the user make the directory the user's; a path in a result line is
 * one token. */
START_TEST(data_dir_is_never_overwritten) {
  struct dw_ctrgen_opts o = {4, 300, 200, 3, 1.5};
  struct dw_ctrgen_truth t;
  struct dw_ctrdata d;
  char dir[64], p[1100], cmd[256], err[2048], buf[4096], tok[64];
  static const char *const names[] = {"train.svm", "test.svm", "truth.json"};
  static const char *const mine[] = {"1 1:1\n0 2:1\n", "0 1:1\n1 2:1\n",
                                     "{\"settings\": \"mine\"}\n"};
  snprintf(dir, sizeof dir, "/tmp/psd-test-data-%d", (int)getpid());
  ck_assert_int_eq(mkdir(dir, 0700), 0);
  for (int i = 0; i < 3; i++) {
    snprintf(p, sizeof p, "%s/%s", dir, names[i]);
    FILE *f = fopen(p, "w");
    fputs(mine[i], f);
    fclose(f);
  }
  ck_assert_int_eq(dw_ctrgen_find(dir, &o, &d, err, sizeof err), 0);
  ck_assert_int_eq(d.source, DW_CTRDATA_USER);
  snprintf(p, sizeof p, "%s/train.svm", dir);
  ck_assert_str_eq(d.train, p);
  ck_assert(isnan(d.truth.auc));
  ck_assert_int_eq(dw_ctrgen_write(dir, &o, &t, NULL, err, sizeof err),
                   CM_EEXIST);
  ck_assert_msg(strstr(err, dir) && strstr(err, "no mark of psd's"), "%s", err);
  for (int i = 0; i < 3; i++)
    ck_assert_str_eq(slurp(dir, names[i], buf, sizeof buf), mine[i]);
  /* Only other files: refused, nothing written. */
  unlink(d.train);
  unlink(d.test);
  ck_assert_int_eq(dw_ctrgen_find(dir, &o, &d, err, sizeof err), CM_EEXIST);
  ck_assert_msg(strstr(err, dir) && strstr(err, "looked for train.svm") &&
                    strstr(err, "and test.svm") &&
                    strstr(err, "it holds truth.json"),
                "%s", err);
  ck_assert_int_eq(dw_ctrgen_write(dir, &o, &t, NULL, err, sizeof err),
                   CM_EEXIST);
  snprintf(cmd, sizeof cmd, "test \"$(ls -A %s)\" = truth.json", dir);
  ck_assert_int_eq(system(cmd), 0);
  ck_assert_str_eq(slurp(dir, "truth.json", buf, sizeof buf), mine[2]);
  /* psd's, then a file of it changed: the user's. */
  unlink(p);
  snprintf(p, sizeof p, "%s/truth.json", dir);
  unlink(p);
  ck_assert_int_eq(dw_ctrgen_write(dir, &o, &t, NULL, err, sizeof err), 0);
  snprintf(p, sizeof p, "%s/test.svm", dir);
  FILE *f = fopen(p, "a");
  fputs("1 3:1\n", f);
  fclose(f);
  o.seed++;
  ck_assert_int_eq(dw_ctrgen_find(dir, &o, &d, err, sizeof err), 0);
  ck_assert_int_eq(d.source, DW_CTRDATA_USER);
  ck_assert_int_eq(dw_ctrgen_write(dir, &o, &t, NULL, err, sizeof err),
                   CM_EEXIST);
  ck_assert_msg(strstr(err, "test.svm is not as psd wrote it"), "%s", err);
  snprintf(cmd, sizeof cmd, "rm -r %s", dir);
  ck_assert_int_eq(system(cmd), 0);
  dw_ctrdata_token("/a b/c%d\t", tok, sizeof tok);
  ck_assert_str_eq(tok, "/a%20b/c%25d%09");
}
END_TEST

START_TEST(generator_is_deterministic) {
  char a[64], b[64], cmd[512];
  struct dw_ctrgen_opts o = {4, 300, 200, 3, 1.5};
  struct dw_ctrgen_truth t1, t2, t3;
  struct dw_ctrdata d;
  char err[2048];
  snprintf(a, sizeof a, "/tmp/psd-test-gen-a-%d", (int)getpid());
  snprintf(b, sizeof b, "/tmp/psd-test-gen-b-%d", (int)getpid());
  snprintf(cmd, sizeof cmd, "mkdir -p %s %s", a, b);
  ck_assert_int_eq(system(cmd), 0);
  ck_assert_int_eq(dw_ctrgen_write(a, &o, &t1, NULL, err, sizeof err), 0);
  ck_assert_int_eq(dw_ctrgen_write(b, &o, &t2, NULL, err, sizeof err), 0);
  snprintf(cmd, sizeof cmd,
           "cmp -s %s/train.svm %s/train.svm && cmp -s "
           "%s/test.svm %s/test.svm",
           a, b, a, b);
  ck_assert_int_eq(system(cmd), 0);
  ck_assert(t1.auc == t2.auc && t1.auc > 0.6 && t1.auc < 1);
  ck_assert_int_eq(dw_ctrgen_find(a, &o, &d, err, sizeof err), 0);
  ck_assert_int_eq(d.source, DW_CTRDATA_PSD);
  ck_assert(d.truth.auc == t1.auc);
  o.seed = 4;
  ck_assert_int_eq(dw_ctrgen_find(a, &o, &d, err, sizeof err), 0);
  ck_assert_int_eq(d.source, DW_CTRDATA_GENERATE); /* other settings */
  ck_assert_int_eq(dw_ctrgen_write(a, &o, &t3, NULL, err, sizeof err), 0);
  ck_assert_int_eq(dw_ctrgen_find(a, &o, &d, err, sizeof err), 0);
  ck_assert_int_eq(d.source, DW_CTRDATA_PSD); /* psd's own: regenerated */
  snprintf(cmd, sizeof cmd, "rm -rf %s %s", a, b);
  ck_assert_int_eq(system(cmd), 0);
}
END_TEST

static Suite *ctr_suite(void) {
  Suite *s = suite_create("ctr");
  TCase *tc = tcase_create("ctr");
  tcase_add_test(tc, reads_shares);
  tcase_add_test(tc, names_mistakes);
  tcase_add_test(tc, auc_known_cases);
  tcase_add_loop_test(tc, gradients_match_finite_differences, 0, 2);
  tcase_add_test(tc, generator_is_deterministic);
  tcase_add_test(tc, data_dir_is_never_overwritten);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(ctr_suite(), 0); }
