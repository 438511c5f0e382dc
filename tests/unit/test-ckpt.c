/* Unit tests for a shard's checkpoints written and loaded back
 * (ps-server/psd/ckpt/ckpt.c, ckpt_write.c, ckpt_load.c): a checkpoint loads
 * back into a store with the same variables, rows, values, slots and versions,
 * or is restored into a live one in place; no checkpoint gives an empty
 * start; pruning keeps exactly `keep`; a crash's .tmp-* is removed, however
 * deep; the same step written twice keeps the second; a write that fails (a
 * file where the directory should be, the file size limit mid-write or at
 * the manifest) leaves the previous checkpoint intact and no temporary
 * behind; --resume-step
 * loads the newest at or below it and renames the newer ones. Each
 * variable's optimizer and all its slots round-trip; format 1 checkpoints
 * (one momentum slot, no step counts) still load. Damaged checkpoints are
 * test-ckpt-verify.c's, the table of applied pushes test-ckpt-dedup.c's. */
#include <check.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt.h"
#include "ckpt_fixture.h"
#include "err.h"
#include "safetensors.h"
#include "store.h"
#include "unit.h"

static char err[4096];

/* Entries of the shard directory whose name starts with prefix. */
static int count_entries(struct psd_ckpt *c, const char *prefix) {
  return tu_count_entries(psd_ckpt_dir(c), prefix);
}

/* File p whole, NUL-terminated (the caller frees it), or NULL. */
static char *slurp(const char *p) {
  FILE *f = fopen(p, "rb");
  long n;
  char *b = NULL;
  if (f && fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 &&
      fseek(f, 0, SEEK_SET) == 0 && (b = calloc(1, (size_t)n + 1)) &&
      fread(b, 1, (size_t)n, f) != (size_t)n) {
    free(b);
    b = NULL;
  }
  if (f)
    fclose(f);
  return b;
}

START_TEST(test_roundtrip) {
  for (int shard = 0; shard < 2; shard++) {
    struct psd_ckpt *c = open_ckpt("job", shard, 2, &momentum, 3);
    struct psd_store *s = make_store(shard, &momentum, 1), *t;
    struct psd_ckpt_result r;
    char p[1400], q[1400], want[1200];

    ck_assert_int_eq(psd_ckpt_write(c, s, NULL, 42, 1, &r, err, sizeof err), 0);
    snprintf(want, sizeof want, "%s/job/ps-%d/ckpt-0000000042", root, shard);
    ck_assert_str_eq(r.path, want);
    ck_assert_int_eq(r.nvars, 3);
    ckpt_file(c, 42, "shard.safetensors", p, sizeof p);
    ckpt_file(c, 42, "manifest.json", q, sizeof q);
    ck_assert_uint_eq(r.bytes, (uint64_t)(file_size(p) + file_size(q)));
    t = load_step(c, 42, 0);
    same_store(s, t);
    psd_store_free(t);
    psd_store_free(s);
    psd_ckpt_free(c);
  }
}
END_TEST

/* Sync rollback: a store reloaded in place from its checkpoint of one step
 * holds exactly what was written then (values, slots, versions, optimizer
 * steps); the newer checkpoint is set aside; a step without a checkpoint is
 * CM_ENOENT and changes nothing. */
START_TEST(test_restore_in_place) {
  struct psd_ckpt *c = open_ckpt("job", 0, 2, &momentum, 3);
  struct psd_store *s100 = make_store(0, &momentum, 1);
  struct psd_store *live = make_store(0, &momentum, 2);
  struct psd_store *s150 = make_store(0, &momentum, 2);
  struct psd_ckpt_result r;
  uint64_t steps[8];

  write_ok(c, s100, 100);
  write_ok(c, s150, 150);
  /* Moved on past 150: other values, versions and step counts. */
  for (int i = 0; i < psd_store_count(live); i++) {
    struct psd_var *v = psd_store_at(live, i);
    v->value[0] = 1e6f;
    v->version = 99;
    v->applied = 7;
  }
  ck_assert_int_eq(psd_ckpt_restore(c, 120, live, &r, err, sizeof err),
                   CM_ENOENT);
  ck_assert_msg(strstr(err, "no checkpoint of step 120"), "%s", err);
  ck_assert_float_eq(psd_store_at(live, 0)->value[0], 1e6f);
  ck_assert_msg(psd_ckpt_restore(c, 100, live, &r, err, sizeof err) == 0, "%s",
                err);
  ck_assert_uint_eq(r.step, 100);
  same_store(s100, live);
  ck_assert_int_eq(psd_ckpt_list(c, steps, 8), 1);
  ck_assert_uint_eq(steps[0], 100);
  ck_assert_int_eq(count_entries(c, "superseded-ckpt-"), 1);
  psd_store_free(s100);
  psd_store_free(s150);
  psd_store_free(live);
  psd_ckpt_free(c);
}
END_TEST

START_TEST(test_empty_dir_is_a_fresh_start) {
  struct psd_ckpt *c = open_ckpt("job", 0, 2, &momentum, 3);
  struct psd_store *s = (struct psd_store *)1;
  struct psd_ckpt_result r;
  ck_assert_int_eq(psd_ckpt_load(c, &s, NULL, &r, err, sizeof err), 0);
  ck_assert_ptr_null(s);
  psd_ckpt_free(c);
}
END_TEST

/* Each variable's own optimizer and all its slots come back, under the
 * tensor names "<name>/<slot>". */
START_TEST(test_per_variable_optimizers_roundtrip) {
  struct cm_optim_set set;
  struct cm_st_file *f = NULL;
  struct psd_store *s, *t;
  struct psd_ckpt *c;
  char p[1400];
  static const char *const tensors[] = {"w",   "w/m",          "w/v",
                                        "one", "one/momentum", NULL};

  set_of(&set, CM_OPT_ADAM, 0.001);
  add_rule(&set, "b", CM_OPT_SGD);
  add_rule(&set, "o*", CM_OPT_MOMENTUM);
  c = open_ckpt("job", 0, 2, &set, 3);
  s = make_store(0, &set, 1);
  ck_assert_int_eq(psd_store_at(s, 0)->nslots, 2);
  ck_assert_int_eq(psd_store_at(s, 1)->nslots, 0);
  ck_assert_int_eq(psd_store_at(s, 2)->nslots, 1);
  write_ok(c, s, 7);
  t = load_step(c, 7, 0);
  same_store(s, t);
  ck_assert_uint_eq(psd_var_steps(psd_store_at(t, 0)), 20);
  ckpt_file(c, 7, "shard.safetensors", p, sizeof p);
  ck_assert_int_eq(cm_st_open(&f, p, err, sizeof err), 0);
  for (int i = 0; tensors[i]; i++)
    ck_assert_msg(cm_st_find(f, tensors[i]), "no tensor %s", tensors[i]);
  ck_assert_ptr_null(cm_st_find(f, "w/momentum"));
  cm_st_close(f);
  psd_store_free(t);
  psd_store_free(s);
  psd_ckpt_free(c);
}
END_TEST

/* Rewrites a manifest as format 1 wrote it: one optimizer for the job,
 * momentum's tensor as "slot", no per-variable optimizer or step count. */
static void to_format_1(json_t *m) {
  json_t *vars, *e;
  size_t i;

  json_object_set_new(m, "format", json_string("psd-checkpoint-1"));
  json_object_del(json_object_get(m, "optimizer"), "describe");
  vars = json_object_get(m, "vars");
  json_array_foreach(vars, i, e) {
    json_t *slot = json_array_get(json_object_get(e, "slots"), 0);
    json_object_set(e, "slot", slot);
    json_object_del(e, "slots");
    json_object_del(e, "optimizer");
    json_object_del(e, "opt_step");
  }
}

/* Rewrites checkpoint step's manifest as format 1 wrote it, with a new
 * checksum. */
static void make_format_1(struct psd_ckpt *c, uint64_t step) {
  rewrite_manifest(c, step, to_format_1);
}

START_TEST(test_format_1_loads) {
  struct psd_store *s = make_store(0, &momentum, 1), *t;
  struct psd_ckpt *c = open_ckpt("job", 0, 2, &momentum, 3);

  write_ok(c, s, 5);
  make_format_1(c, 5);
  t = load_step(c, 5, 0);
  /* Values, momentum and versions as written; the step count was not
   * kept, so it is the version. */
  for (int i = 0; i < psd_store_count(s); i++) {
    struct psd_var *v = psd_store_at(s, i);
    v->applied = v->version * (v->elem_end - v->elem_begin);
  }
  same_store(s, t);
  psd_store_free(t);
  psd_store_free(s);
  psd_ckpt_free(c);
}
END_TEST

START_TEST(test_prune_keeps_exactly_k) {
  struct psd_ckpt *c = open_ckpt("job", 0, 2, &momentum, 2);
  struct psd_store *s = make_store(0, &momentum, 1);
  uint64_t steps[8];
  for (uint64_t step = 10; step <= 50; step += 10) {
    write_ok(c, s, step);
    ck_assert_int_eq(count_entries(c, "ckpt-"), step < 20 ? 1 : 2);
  }
  ck_assert_int_eq(psd_ckpt_list(c, steps, 8), 2);
  ck_assert_uint_eq(steps[0], 50);
  ck_assert_uint_eq(steps[1], 40);
  /* keep 1 leaves the newest only. */
  psd_ckpt_free(c);
  c = open_ckpt("job", 0, 2, &momentum, 1);
  write_ok(c, s, 60);
  ck_assert_int_eq(psd_ckpt_list(c, steps, 8), 1);
  ck_assert_uint_eq(steps[0], 60);
  psd_store_free(s);
  psd_ckpt_free(c);
}
END_TEST

START_TEST(test_stale_tmp_is_removed) {
  struct psd_ckpt *c = open_ckpt("job", 0, 2, &momentum, 3);
  char p[1400];
  snprintf(p, sizeof p, "%s/.tmp-7-12345", psd_ckpt_dir(c));
  ck_assert_int_eq(mkdir(p, 0755), 0);
  snprintf(p, sizeof p, "%s/.tmp-7-12345/shard.safetensors", psd_ckpt_dir(c));
  fclose(fopen(p, "w"));
  psd_ckpt_free(c);
  c = open_ckpt("job", 0, 2, &momentum, 3);
  ck_assert_int_eq(count_entries(c, ".tmp-"), 0);
  psd_ckpt_free(c);
}
END_TEST

/* A stale temporary directory is removed whole, subdirectories included,
 * and a link in it is removed, not followed. */
START_TEST(test_stale_tmp_tree_is_removed) {
  struct psd_ckpt *c = open_ckpt("job", 0, 2, &momentum, 3);
  char p[1400], outside[256];
  snprintf(outside, sizeof outside, "%s/outside", root);
  ck_assert_int_eq(mkdir(outside, 0755), 0);
  snprintf(p, sizeof p, "%s/kept", outside);
  fclose(fopen(p, "w"));
  snprintf(p, sizeof p, "%s/.tmp-8-1", psd_ckpt_dir(c));
  ck_assert_int_eq(mkdir(p, 0755), 0);
  snprintf(p, sizeof p, "%s/.tmp-8-1/a", psd_ckpt_dir(c));
  ck_assert_int_eq(mkdir(p, 0755), 0);
  snprintf(p, sizeof p, "%s/.tmp-8-1/a/b", psd_ckpt_dir(c));
  ck_assert_int_eq(mkdir(p, 0755), 0);
  snprintf(p, sizeof p, "%s/.tmp-8-1/a/b/shard.safetensors", psd_ckpt_dir(c));
  fclose(fopen(p, "w"));
  snprintf(p, sizeof p, "%s/.tmp-8-1/a/link", psd_ckpt_dir(c));
  ck_assert_int_eq(symlink(outside, p), 0);
  psd_ckpt_free(c);
  c = open_ckpt("job", 0, 2, &momentum, 3);
  ck_assert_int_eq(count_entries(c, ".tmp-"), 0);
  snprintf(p, sizeof p, "%s/kept", outside);
  ck_assert_int_eq(access(p, F_OK), 0);
  psd_ckpt_free(c);
}
END_TEST

START_TEST(test_same_step_twice_keeps_the_second) {
  struct psd_ckpt *c = open_ckpt("job", 0, 2, &momentum, 3);
  struct psd_store *a = make_store(0, &momentum, 1);
  struct psd_store *b = make_store(0, &momentum, 2), *t;
  write_ok(c, a, 9);
  write_ok(c, b, 9);
  ck_assert_int_eq(count_entries(c, "ckpt-"), 1);
  ck_assert_int_eq(count_entries(c, ".tmp-"), 0);
  t = load_step(c, 9, 0);
  same_store(b, t);
  psd_store_free(t);
  psd_store_free(a);
  psd_store_free(b);
  psd_ckpt_free(c);
}
END_TEST

START_TEST(test_failed_write_keeps_the_previous) {
  struct psd_ckpt *c = open_ckpt("job", 0, 2, &momentum, 3);
  struct psd_store *a = make_store(0, &momentum, 1), *t;
  struct psd_store *big = NULL;
  struct psd_ckpt_result r;
  static const int64_t shape[2] = {1 << 12, 1 << 10}; /* 16 MiB + slot */
  struct psd_var *v;
  int created;

  write_ok(c, a, 1);
  /* A write that fails half way: the file size limit (as a full disk). */
  signal(SIGXFSZ, SIG_IGN);
  struct rlimit lim = {4 << 20, 4 << 20};
  ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
  ck_assert_int_eq(psd_store_new(&big, 0, 1, &momentum), 0);
  ck_assert_int_eq(psd_store_declare(big, "big", 2, shape, -1, PSD_INIT_ZEROS,
                                     0, 0, NULL, &v, &created, err, sizeof err),
                   0);
  ck_assert_int_eq(psd_ckpt_write(c, big, NULL, 2, 1, &r, err, sizeof err),
                   CM_EIO);
  ck_assert_msg(strstr(err, "File too large") && strstr(err, "/.tmp-2-"), "%s",
                err);
  ck_assert_int_eq(count_entries(c, ".tmp-"), 0);
  ck_assert_int_eq(count_entries(c, "ckpt-"), 1);
  t = load_step(c, 1, 0);
  same_store(a, t);
  psd_store_free(t);
  psd_store_free(big);
  psd_ckpt_free(c);
  /* A regular file where the shard's directory should be. */
  char p[256];
  snprintf(p, sizeof p, "%s/job2", root);
  fclose(fopen(p, "w"));
  struct psd_ckpt_opts o = {root, "job2", 0, 2, "sync", &momentum, 3};
  c = (struct psd_ckpt *)1;
  ck_assert_int_eq(psd_ckpt_new(&c, &o, err, sizeof err), CM_EIO);
  ck_assert_ptr_null(c);
  ck_assert_msg(strstr(err, "job2") && strstr(err, "not a directory"), "%s",
                err);
  psd_store_free(a);
}
END_TEST

/* A write that fails at its last file, the manifest (the file size limit
 * between the shard file's size and the manifest's), over a checkpoint of
 * the same step: the temporary directory goes, the one written before
 * stays whole, byte for byte, and loads. */
START_TEST(test_failed_manifest_keeps_the_previous) {
  struct psd_ckpt *c = open_ckpt("job", 0, 2, &momentum, 3);
  struct psd_store *a = make_store(0, &momentum, 1);
  struct psd_store *b = make_store(0, &momentum, 2), *t;
  struct psd_ckpt_result r;
  char shard[1300], man[1300], *before, *after;

  write_ok(c, a, 2);
  ckpt_file(c, 2, "shard.safetensors", shard, sizeof shard);
  ckpt_file(c, 2, "manifest.json", man, sizeof man);
  long s = file_size(shard), m = file_size(man);
  /* b's manifest differs from a's in a few digits of its CRCs at most */
  ck_assert_msg(s > 0 && s + 64 < m, "shard file %ld bytes, manifest %ld", s,
                m);
  ck_assert_ptr_nonnull(before = slurp(man));
  struct rlimit was = tu_file_size_limit((rlim_t)(s + m) / 2);
  int rc = psd_ckpt_write(c, b, NULL, 2, 1, &r, err, sizeof err);
  tu_file_size_restore(&was);
  ck_assert_int_eq(rc, CM_EIO);
  ck_assert_msg(strstr(err, "File too large") && strstr(err, "/.tmp-2-") &&
                    strstr(err, "/manifest.json"),
                "%s", err);
  ck_assert_int_eq(count_entries(c, ".tmp-"), 0);
  ck_assert_int_eq(count_entries(c, "ckpt-"), 1);
  ck_assert_ptr_nonnull(after = slurp(man));
  ck_assert_str_eq(after, before);
  t = load_step(c, 2, 0);
  same_store(a, t);
  free(before);
  free(after);
  psd_store_free(t);
  psd_store_free(a);
  psd_store_free(b);
  psd_ckpt_free(c);
}
END_TEST

START_TEST(test_resume_step) {
  struct psd_ckpt *c = open_ckpt("job", 0, 2, &momentum, 5), *d;
  struct psd_store *s = make_store(0, &momentum, 1), *t = NULL;
  struct psd_ckpt_result r;
  uint64_t steps[8];
  for (uint64_t step = 10; step <= 30; step += 10)
    write_ok(c, s, step);
  /* Nothing at or below 5: an error, and nothing is set aside. */
  struct psd_ckpt_opts o = {root, "job", 0, 2, "sync", &momentum, 5, 1, 5};
  ck_assert_int_eq(psd_ckpt_new(&d, &o, err, sizeof err), 0);
  ck_assert_int_eq(psd_ckpt_load(d, &t, NULL, &r, err, sizeof err), CM_ENOENT);
  ck_assert_ptr_nonnull(strstr(err, "--resume-step 5"));
  ck_assert_int_eq(psd_ckpt_list(d, steps, 8), 3);
  psd_ckpt_free(d);
  /* At or below 25: step 20, and 30 is renamed out of the way. */
  o.resume_step = 25;
  ck_assert_int_eq(psd_ckpt_new(&d, &o, err, sizeof err), 0);
  t = load_step(d, 20, 0);
  psd_store_free(t);
  ck_assert_int_eq(psd_ckpt_list(d, steps, 8), 2);
  ck_assert_uint_eq(steps[0], 20);
  ck_assert_int_eq(count_entries(d, "superseded-ckpt-0000000030-"), 1);
  psd_ckpt_free(d);
  psd_store_free(s);
  psd_ckpt_free(c);
}
END_TEST

static Suite *ckpt_suite(void) {
  Suite *s = suite_create("ckpt");
  TCase *tc = ckf_tcase();
  tcase_add_test(tc, test_roundtrip);
  tcase_add_test(tc, test_restore_in_place);
  tcase_add_test(tc, test_empty_dir_is_a_fresh_start);
  tcase_add_test(tc, test_per_variable_optimizers_roundtrip);
  tcase_add_test(tc, test_format_1_loads);
  tcase_add_test(tc, test_prune_keeps_exactly_k);
  tcase_add_test(tc, test_stale_tmp_is_removed);
  tcase_add_test(tc, test_stale_tmp_tree_is_removed);
  tcase_add_test(tc, test_same_step_twice_keeps_the_second);
  tcase_add_test(tc, test_failed_write_keeps_the_previous);
  tcase_add_test(tc, test_failed_manifest_keeps_the_previous);
  tcase_add_test(tc, test_resume_step);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(ckpt_suite(), 0); }
