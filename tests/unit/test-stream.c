/* The stream follower (worker/data/stream.h) and the drifting generator
 * (psd-ctrgen --drift, ctrgen_drift.c): parts taken in name order once
 * they are renamed into place, temporary names and other suffixes never,
 * a late part skipped, the end marker after every part before it; a
 * growing file's windows of complete lines, a partial line held back
 * until its newline, the rest at the marker; the drifting stream's bytes
 * the same from the same settings whatever range is written, its
 * truth.json per part, and its ids fading part to part. */
#include <check.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ctrgen.h"
#include "err.h"
#include "libsvm.h"
#include "stream.h"
#include "unit.h"

static char dir[128];

static void make_dir(const char *tag) {
  char cmd[300];
  snprintf(dir, sizeof dir, "/tmp/psd-test-stream-%s-%d", tag, (int)getpid());
  snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", dir, dir);
  ck_assert_int_eq(system(cmd), 0);
}

static void remove_dir(void) {
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
  ck_assert_int_eq(system(cmd), 0);
}

static void put(const char *name, const char *text, const char *mode) {
  char p[300];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  FILE *f = fopen(p, mode);
  ck_assert_ptr_nonnull(f);
  fputs(text, f);
  fclose(f);
}

static void move(const char *from, const char *to) {
  char a[300], b[300];
  snprintf(a, sizeof a, "%s/%s", dir, from);
  snprintf(b, sizeof b, "%s/%s", dir, to);
  ck_assert_int_eq(rename(a, b), 0);
}

static const char *const svm[] = {".svm", NULL};

START_TEST(dir_parts_in_order_once) {
  struct dw_stream *s;
  struct dw_stream_window w;
  char err[512];
  make_dir("dir");
  struct dw_stream_opts o = {dir, NULL, svm, "END", 0};
  ck_assert_int_eq(dw_stream_open(&o, &s, err, sizeof err), 0);
  ck_assert_int_eq(dw_stream_poll(s, &w, err, sizeof err), DW_STREAM_NONE);
  /* Being written: a hidden temporary name, another suffix. */
  put(".b.svm.tmp-1", "1 1:1\n", "w");
  put("b.svm.partial", "1 1:1\n", "w");
  put("notes.txt", "x\n", "w");
  put(".e.svm", "1 1:1\n", "w"); /* hidden: a temporary name too */
  ck_assert_int_eq(dw_stream_poll(s, &w, err, sizeof err), DW_STREAM_NONE);
  move(".b.svm.tmp-1", "b.svm");
  put("c.svm", "0 2:1\n", "w");
  ck_assert_int_eq(dw_stream_poll(s, &w, err, sizeof err), DW_STREAM_WINDOW);
  ck_assert_str_eq(w.name, "b.svm");
  ck_assert_ptr_null(w.text);
  ck_assert(strstr(w.path, "/b.svm") != NULL);
  ck_assert_int_eq(dw_stream_poll(s, &w, err, sizeof err), DW_STREAM_WINDOW);
  ck_assert_str_eq(w.name, "c.svm");
  ck_assert_int_eq(dw_stream_poll(s, &w, err, sizeof err), DW_STREAM_NONE);
  ck_assert_uint_eq(dw_stream_late(s), 0); /* b.svm: taken, not late */
  /* Late: named before the last taken; skipped, never taken. */
  put("a.svm", "1 3:1\n", "w");
  ck_assert_int_eq(dw_stream_poll(s, &w, err, sizeof err), DW_STREAM_NONE);
  ck_assert_uint_eq(dw_stream_late(s), 1);
  ck_assert_int_eq(dw_stream_poll(s, &w, err, sizeof err), DW_STREAM_NONE);
  ck_assert_uint_eq(dw_stream_late(s), 1); /* warned once */
  /* Parts there when the marker appears are taken before the end. */
  put("d.svm", "1 4:1\n", "w");
  put("END", "", "w");
  ck_assert_int_eq(dw_stream_poll(s, &w, err, sizeof err), DW_STREAM_WINDOW);
  ck_assert_str_eq(w.name, "d.svm");
  ck_assert_int_eq(dw_stream_poll(s, &w, err, sizeof err), DW_STREAM_END);
  ck_assert_int_eq(dw_stream_windows(s), 3);
  dw_stream_free(s);
  remove_dir();
}
END_TEST

START_TEST(file_complete_lines_only) {
  struct dw_stream *s;
  struct dw_stream_window w;
  struct dw_svm d;
  char err[512], file[200];
  make_dir("file");
  snprintf(file, sizeof file, "%s/clicks.svm", dir);
  struct dw_stream_opts o = {NULL, file, NULL, "END", 2};
  ck_assert_int_eq(dw_stream_open(&o, &s, err, sizeof err), 0);
  /* Not there yet. */
  ck_assert_int_eq(dw_stream_poll(s, &w, err, sizeof err), DW_STREAM_NONE);
  put("clicks.svm", "1 1:1\n0 2:1", "w"); /* the second line unfinished */
  ck_assert_int_eq(dw_stream_poll(s, &w, err, sizeof err), DW_STREAM_NONE);
  put("clicks.svm", "\n1 3:1\n", "a");
  ck_assert_int_eq(dw_stream_poll(s, &w, err, sizeof err), DW_STREAM_WINDOW);
  ck_assert_str_eq(w.name, "clicks.svm:1-2");
  ck_assert_uint_eq(w.lines, 2);
  ck_assert_uint_eq(w.line0, 0);
  ck_assert_uint_eq(w.len, strlen("1 1:1\n0 2:1\n"));
  ck_assert(!memcmp(w.text, "1 1:1\n0 2:1\n", w.len));
  /* The window parses as a file's lines, numbered on. */
  FILE *f = fmemopen((void *)w.text, w.len, "r");
  ck_assert_int_eq(dw_svm_read(f, file, w.line0, 0, 1, &d, err, sizeof err), 0);
  fclose(f);
  ck_assert_uint_eq(d.n, 2);
  ck_assert(d.y[0] == 1 && d.y[1] == 0 && d.idx[1] == 2);
  dw_svm_free(&d);
  ck_assert_int_eq(dw_stream_poll(s, &w, err, sizeof err), DW_STREAM_NONE);
  put("clicks.svm", "x 4:1\n1 5", "a");
  put("END", "", "w");
  /* At the marker: the complete line left is the last window; "1 5" was
   * never finished. */
  ck_assert_int_eq(dw_stream_poll(s, &w, err, sizeof err), DW_STREAM_WINDOW);
  ck_assert_str_eq(w.name, "clicks.svm:3-4");
  ck_assert_uint_eq(w.lines, 2);
  ck_assert(!memcmp(w.text, "1 3:1\nx 4:1\n", w.len));
  f = fmemopen((void *)w.text, w.len, "r");
  ck_assert_int_eq(dw_svm_read(f, file, w.line0, 0, 1, &d, err, sizeof err),
                   CM_EFORMAT);
  fclose(f);
  ck_assert(strstr(err, "clicks.svm:4: the label is not 0 or 1") != NULL);
  ck_assert_int_eq(dw_stream_poll(s, &w, err, sizeof err), DW_STREAM_END);
  dw_stream_free(s);
  remove_dir();
}
END_TEST

START_TEST(wait_stops) {
  struct dw_stream *s;
  struct dw_stream_window w;
  volatile sig_atomic_t stop = 1;
  char err[512];
  make_dir("wait");
  struct dw_stream_opts o = {dir, NULL, svm, "END", 0};
  ck_assert_int_eq(dw_stream_open(&o, &s, err, sizeof err), 0);
  ck_assert_int_eq(dw_stream_wait(s, &w, 0.01, &stop, err, sizeof err),
                   DW_STREAM_STOPPED);
  stop = 0;
  put("END", "", "w");
  ck_assert_int_eq(dw_stream_wait(s, &w, 0.01, &stop, err, sizeof err),
                   DW_STREAM_END);
  dw_stream_free(s);
  struct dw_stream_opts bad = {dir, dir, svm, "END", 0};
  ck_assert_int_eq(dw_stream_open(&bad, &s, err, sizeof err), CM_EINVAL);
  remove_dir();
}
END_TEST

/* Field 0's ids of part p's file. */
static void first_ids(const char *d, int p, uint64_t *ids, size_t *n) {
  char path[300], err[512];
  struct dw_svm x;
  snprintf(path, sizeof path, "%s/part-%05d.svm", d, p);
  ck_assert_int_eq(dw_svm_load(path, 0, 1, &x, err, sizeof err), 0);
  *n = x.n;
  for (size_t i = 0; i < x.n; i++)
    ids[i] = x.idx[x.start[i]];
  dw_svm_free(&x);
}

/* The most frequent of ids[0..n). */
static uint64_t mode_of(const uint64_t *ids, size_t n) {
  uint64_t best = 0;
  size_t bestc = 0;
  for (size_t i = 0; i < n; i++) {
    size_t c = 0;
    for (size_t j = 0; j < n; j++)
      c += ids[j] == ids[i];
    if (c > bestc) {
      bestc = c;
      best = ids[i];
    }
  }
  return best;
}

START_TEST(drift_is_deterministic_with_truth_per_part) {
  char a[200], b[200], cmd[700], err[512];
  struct dw_ctrgen_drift_opts o = {4, 4, 2000, 3, 1.6, 1, 0.1, 0, 4, 0, "END"};
  make_dir("drift");
  snprintf(a, sizeof a, "%s/a", dir);
  snprintf(b, sizeof b, "%s/b", dir);
  mkdir(a, 0755);
  mkdir(b, 0755);
  ck_assert_int_eq(dw_ctrgen_drift_write(a, &o, NULL, err, sizeof err), 0);
  /* Parts 1 and 2 alone, then 3: the same bytes. */
  o.from = 1;
  o.to = 3;
  o.end = NULL;
  ck_assert_int_eq(dw_ctrgen_drift_write(b, &o, NULL, err, sizeof err), 0);
  snprintf(cmd, sizeof cmd, "test ! -e %s/part-00000.svm && test ! -e %s/END",
           b, b);
  ck_assert_int_eq(system(cmd), 0);
  o.from = 3;
  o.to = 4;
  ck_assert_int_eq(dw_ctrgen_drift_write(b, &o, NULL, err, sizeof err), 0);
  snprintf(cmd, sizeof cmd,
           "cd %s && for p in 1 2 3; do cmp -s a/part-0000$p.svm "
           "b/part-0000$p.svm || exit 1; done && cmp -s a/truth.json "
           "b/truth.json && test -e a/END && ! ls -a a | grep -q tmp",
           dir);
  ck_assert_int_eq(system(cmd), 0);
  /* truth.json: every part, its true scores. */
  char p[300];
  json_error_t jerr;
  snprintf(p, sizeof p, "%s/truth.json", a);
  json_t *j = json_load_file(p, 0, &jerr);
  ck_assert_ptr_nonnull(j);
  json_t *parts = json_object_get(j, "parts");
  ck_assert_int_eq(json_array_size(parts), 4);
  for (size_t i = 0; i < 4; i++) {
    json_t *e = json_array_get(parts, i);
    char name[32];
    snprintf(name, sizeof name, "part-%05zu.svm", i);
    ck_assert_str_eq(json_string_value(json_object_get(e, "name")), name);
    ck_assert_int_eq(json_integer_value(json_object_get(e, "examples")), 2000);
    double auc = json_real_value(json_object_get(e, "true_auc"));
    double ll = json_real_value(json_object_get(e, "true_logloss"));
    ck_assert(auc > 0.65 && auc < 0.95);
    ck_assert(ll > 0.2 && ll < 0.69);
  }
  ck_assert_int_eq(json_integer_value(json_object_get(
                       json_object_get(j, "settings"), "shift")),
                   1);
  json_decref(j);
  /* Fading: part 0's most frequent id falls; part 1's is new. */
  static uint64_t i0[2000], i1[2000];
  size_t n0, n1, c0 = 0, c1 = 0;
  first_ids(a, 0, i0, &n0);
  first_ids(a, 1, i1, &n1);
  uint64_t top0 = mode_of(i0, n0), top1 = mode_of(i1, n1);
  ck_assert(top0 != top1);
  for (size_t i = 0; i < n0; i++)
    c0 += i0[i] == top1;
  for (size_t i = 0; i < n1; i++)
    c1 += i1[i] == top0;
  ck_assert_uint_eq(c0, 0);         /* part 1's top id is new */
  ck_assert(c1 > 0 && c1 < n1 / 2); /* part 0's is still seen, less */
  /* Other settings, other bytes. */
  o.from = 0;
  o.to = 1;
  o.seed = 4;
  ck_assert_int_eq(dw_ctrgen_drift_write(b, &o, NULL, err, sizeof err), 0);
  snprintf(cmd, sizeof cmd, "cmp -s %s/part-00000.svm %s/part-00000.svm", a, b);
  ck_assert_int_ne(system(cmd), 0);
  remove_dir();
}
END_TEST

static Suite *stream_suite(void) {
  Suite *s = suite_create("stream");
  TCase *tc = tcase_create("stream");
  tcase_add_test(tc, dir_parts_in_order_once);
  tcase_add_test(tc, file_complete_lines_only);
  tcase_add_test(tc, wait_stops);
  tcase_add_test(tc, drift_is_deterministic_with_truth_per_part);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(stream_suite(), 0); }
