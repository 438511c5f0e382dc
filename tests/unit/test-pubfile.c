/* A shard's publications for serving (pubfile.h): a full one and a delta
 * written and read back bit for bit (dense variables, table rows, removed
 * ids, the chain's fields), an empty shard's, the versions listed in order, a
 * version never written again, and every damage refused with the file and what
 * is wrong: a truncated table file, a flipped byte in a table file, in the
 * dense file and in the manifest, another job's or shard's publication; a
 * missing one is CM_ENOENT. Pruning keeps the newest full chains. A write
 * that fails at its manifest leaves nothing behind and the version before
 * it whole. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "err.h"
#include "pubfile.h"
#include "unit.h"

static char root[256];

static void setup(void) {
  snprintf(root, sizeof root, "/tmp/psd-test-pubfile-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(root));
}

static void teardown(void) {
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", root);
  ck_assert_int_eq(system(cmd), 0);
}

/* Publication `version` of a two-shard job "j": a 3x2 variable's rows
 * 1..3 and a vector, table "emb" of dim 2 with rows ids[0..n) and removed
 * ids rm[0..nrm), and an empty table "none". Values derive from the
 * version. Arrays are static: one publication at a time. */
static struct psd_pub *make(uint64_t version, int full, uint64_t base,
                            const uint64_t *ids, size_t n, const uint64_t *rm,
                            size_t nrm) {
  static struct psd_pub p;
  static struct psd_pub_dense d[3];
  static struct psd_pub_table t[2];
  static float w[6], b[4], rows[64];
  static uint64_t idv[32], rmv[32];
  memset(&p, 0, sizeof p);
  memset(d, 0, sizeof d);
  memset(t, 0, sizeof t);
  for (int i = 0; i < 6; i++)
    w[i] = (float)version + i * 0.25f;
  for (int i = 0; i < 4; i++)
    b[i] = -(float)version - i;
  for (size_t i = 0; i < 2 * n; i++)
    rows[i] = (float)version * 100 + (float)i;
  if (n)
    memcpy(idv, ids, n * 8);
  if (nrm)
    memcpy(rmv, rm, nrm * 8);
  p = (struct psd_pub){.version = version,
                       .base = base,
                       .prev = full ? 0 : version - 1,
                       .step = version * 10,
                       .full = full,
                       .time_unix_ms = 1700000000000 + version,
                       .shard = 1,
                       .shards = 2,
                       .ndense = 3,
                       .dense = d,
                       .ntables = 2,
                       .tables = t};
  strcpy(p.job, "j");
  strcpy(d[0].name, "w");
  d[0].ndim = 2;
  d[0].shape[0] = 5;
  d[0].shape[1] = 2;
  d[0].row_begin = 1;
  d[0].row_end = 4;
  d[0].values = w;
  strcpy(d[1].name, "b");
  d[1].ndim = 1;
  d[1].shape[0] = 4;
  d[1].row_end = 4;
  d[1].values = b;
  strcpy(d[2].name, "none here"); /* a variable with no rows on this shard */
  d[2].ndim = 2;
  d[2].shape[0] = 3;
  d[2].shape[1] = 2;
  d[2].values = b;
  strcpy(t[0].name, "emb");
  t[0].dim = 2;
  t[0].nrows = n;
  t[0].ids = idv;
  t[0].values = rows;
  t[0].nremoved = nrm;
  t[0].removed = rmv;
  strcpy(t[1].name, "none");
  t[1].dim = 3;
  return &p;
}

static void same(const struct psd_pub *a, const struct psd_pub *b) {
  ck_assert_uint_eq(a->version, b->version);
  ck_assert_uint_eq(a->base, b->base);
  ck_assert_uint_eq(a->prev, b->prev);
  ck_assert_uint_eq(a->step, b->step);
  ck_assert_int_eq(a->full, b->full);
  ck_assert_int_eq(a->time_unix_ms, b->time_unix_ms);
  ck_assert_str_eq(a->job, b->job);
  ck_assert_int_eq(a->ndense, b->ndense);
  for (int i = 0; i < a->ndense; i++) {
    const struct psd_pub_dense *x = &a->dense[i], *y = &b->dense[i];
    ck_assert_str_eq(x->name, y->name);
    ck_assert_int_eq(x->ndim, y->ndim);
    ck_assert_int_eq(x->row_begin, y->row_begin);
    ck_assert_int_eq(x->row_end, y->row_end);
    ck_assert(!memcmp(x->shape, y->shape, x->ndim * sizeof x->shape[0]));
    size_t n = (size_t)(x->row_end - x->row_begin);
    for (int k = 1; k < x->ndim; k++)
      n *= (size_t)x->shape[k];
    ck_assert(!memcmp(x->values, y->values, n * 4));
  }
  ck_assert_int_eq(a->ntables, b->ntables);
  for (int i = 0; i < a->ntables; i++) {
    const struct psd_pub_table *x = &a->tables[i], *y = &b->tables[i];
    ck_assert_str_eq(x->name, y->name);
    ck_assert_uint_eq(x->dim, y->dim);
    ck_assert_uint_eq(x->nrows, y->nrows);
    ck_assert_uint_eq(x->nremoved, y->nremoved);
    if (x->nrows) {
      ck_assert(!memcmp(x->ids, y->ids, x->nrows * 8));
      ck_assert(!memcmp(x->values, y->values, x->nrows * x->dim * 4));
    }
    if (x->nremoved)
      ck_assert(!memcmp(x->removed, y->removed, x->nremoved * 8));
  }
}

static const uint64_t ids1[] = {3, 9, 1000, 1ull << 60};
static const uint64_t ids2[] = {9, 12};
static const uint64_t rm2[] = {3, 1000};

/* Writes version 1 (full) and 2 (a delta) into root/j/ps-1. */
static void write_two(char *dir, size_t len) {
  char err[512];
  uint64_t bytes = 0;
  psd_pub_dir(root, "j", 1, dir, len);
  ck_assert_int_eq(psd_pub_prepare(dir, err, sizeof err), 0);
  ck_assert_int_eq(psd_pub_write(dir, make(1, 1, 1, ids1, 4, NULL, 0), "async",
                                 &bytes, err, sizeof err),
                   0);
  ck_assert_uint_gt(bytes, 4 * (8 + 8));
  ck_assert_int_eq(psd_pub_write(dir, make(2, 0, 1, ids2, 2, rm2, 2), "async",
                                 NULL, err, sizeof err),
                   0);
}

START_TEST(round_trip) {
  char dir[512], err[512];
  struct psd_pub *p;
  uint64_t *v;
  size_t n;
  write_two(dir, sizeof dir);
  ck_assert_int_eq(psd_pub_list(dir, &v, &n, err, sizeof err), 0);
  ck_assert_uint_eq(n, 2);
  ck_assert_uint_eq(v[0], 1);
  ck_assert_uint_eq(v[1], 2);
  free(v);
  ck_assert_int_eq(psd_pub_read(dir, 1, "j", 1, 2, &p, err, sizeof err), 0);
  same(p, make(1, 1, 1, ids1, 4, NULL, 0));
  psd_pub_free(p);
  ck_assert_int_eq(psd_pub_read(dir, 2, "j", 1, 2, &p, err, sizeof err), 0);
  same(p, make(2, 0, 1, ids2, 2, rm2, 2));
  ck_assert_uint_eq(p->tables[0].removed[1], 1000);
  psd_pub_free(p);
  /* a version is never written twice */
  ck_assert_int_eq(psd_pub_write(dir, make(2, 0, 1, ids2, 2, rm2, 2), "async",
                                 NULL, err, sizeof err),
                   CM_EEXIST);
  ck_assert_ptr_nonnull(strstr(err, "pub-0000000002 exists already"));
  /* a delta must follow its prev */
  struct psd_pub *bad = make(3, 0, 1, ids2, 2, NULL, 0);
  bad->prev = 1;
  ck_assert_int_eq(psd_pub_write(dir, bad, "async", NULL, err, sizeof err),
                   CM_EINVAL);
  /* nothing half-written is left: only the two versions */
  ck_assert_int_eq(psd_pub_list(dir, &v, &n, err, sizeof err), 0);
  ck_assert_uint_eq(n, 2);
  free(v);
}
END_TEST

START_TEST(empty_shard) {
  /* A shard with nothing declared yet publishes too. */
  char dir[512], err[512];
  struct psd_pub *p,
      e = {.version = 1, .base = 1, .full = 1, .shard = 1, .shards = 2};
  strcpy(e.job, "j");
  psd_pub_dir(root, "j", 1, dir, sizeof dir);
  ck_assert_int_eq(psd_pub_prepare(dir, err, sizeof err), 0);
  ck_assert_int_eq(psd_pub_write(dir, &e, "sync", NULL, err, sizeof err), 0);
  ck_assert_msg(psd_pub_read(dir, 1, "j", 1, 2, &p, err, sizeof err) == 0, "%s",
                err);
  ck_assert_int_eq(p->ndense, 0);
  ck_assert_int_eq(p->ntables, 0);
  ck_assert_int_eq(p->full, 1);
  psd_pub_free(p);
}
END_TEST

START_TEST(missing) {
  char dir[512], err[512];
  struct psd_pub *p = (void *)1;
  write_two(dir, sizeof dir);
  ck_assert_int_eq(psd_pub_read(dir, 3, "j", 1, 2, &p, err, sizeof err),
                   CM_ENOENT);
  ck_assert_ptr_null(p);
  uint64_t *v;
  size_t n;
  ck_assert_int_eq(psd_pub_list("/nonexistent/psd", &v, &n, err, sizeof err),
                   CM_ENOENT);
}
END_TEST

/* Reads version v of dir expecting CM_EFORMAT and a message holding both
 * strings. */
static void refused(const char *dir, uint64_t v, const char *job, int shard,
                    const char *a, const char *b) {
  char err[1024] = "";
  struct psd_pub *p = (void *)1;
  ck_assert_int_eq(psd_pub_read(dir, v, job, shard, 2, &p, err, sizeof err),
                   CM_EFORMAT);
  ck_assert_ptr_null(p);
  ck_assert_msg(strstr(err, a) && strstr(err, b), "message: %s", err);
}

/* Flips one byte of file (in pub-<v> of dir) at off (from the end when
 * negative). */
static void flip(const char *dir, uint64_t v, const char *file, long off) {
  char path[1024];
  snprintf(path, sizeof path, "%s/pub-%010llu/%s", dir, (unsigned long long)v,
           file);
  FILE *f = fopen(path, "r+b");
  ck_assert_ptr_nonnull(f);
  ck_assert_int_eq(fseek(f, off, off < 0 ? SEEK_END : SEEK_SET), 0);
  int c = fgetc(f);
  ck_assert_int_ne(c, EOF);
  ck_assert_int_eq(fseek(f, -1, SEEK_CUR), 0);
  fputc(c ^ 0x10, f);
  fclose(f);
}

START_TEST(truncated) {
  char dir[512], path[1024];
  write_two(dir, sizeof dir);
  snprintf(path, sizeof path, "%s/pub-0000000001/table-0.bin", dir);
  struct stat st;
  ck_assert_int_eq(stat(path, &st), 0);
  ck_assert_int_eq(truncate(path, st.st_size - 9), 0);
  refused(dir, 1, "j", 1, "table-0.bin", "truncated");
  /* the manifest cut short */
  snprintf(path, sizeof path, "%s/pub-0000000002/manifest.json", dir);
  ck_assert_int_eq(stat(path, &st), 0);
  ck_assert_int_eq(truncate(path, st.st_size / 2), 0);
  refused(dir, 2, "j", 1, "pub-0000000002/manifest.json", "truncated");
}
END_TEST

START_TEST(flipped_byte) {
  char dir[512];
  write_two(dir, sizeof dir);
  flip(dir, 2, "table-0.bin", 60); /* in the ids */
  refused(dir, 2, "j", 1, "pub-0000000002/table-0.bin", "checksum");
  flip(dir, 1, "dense.safetensors", -3); /* in b's values */
  refused(dir, 1, "j", 1, "dense.safetensors", "tensor 'b' fails its checksum");
}
END_TEST

START_TEST(manifest_flipped) {
  char dir[512], path[1024];
  write_two(dir, sizeof dir);
  /* "step": 10 -> 11, a valid JSON the checksum alone catches */
  snprintf(path, sizeof path, "%s/pub-0000000001/manifest.json", dir);
  FILE *f = fopen(path, "rb");
  char buf[8192];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  char *s = strstr(buf, "\"step\": 10");
  ck_assert_ptr_nonnull(s);
  flip(dir, 1, "manifest.json", (long)(s - buf) + 9);
  refused(dir, 1, "j", 1, "pub-0000000001/manifest.json", "fails its checksum");
}
END_TEST

START_TEST(other_job_or_shard) {
  char dir[512];
  write_two(dir, sizeof dir);
  refused(dir, 1, "k", 1, "manifest.json",
          "job 'j' shard 1 of 2; expected "
          "job 'k' shard 1 of 2");
  refused(dir, 2, "j", 0, "manifest.json", "expected job 'j' shard 0 of 2");
}
END_TEST

START_TEST(manifest_write_fails) {
  /* The write fails at its last file, the manifest (the file size limit
   * above every other file's size, below the manifest's): nothing of it
   * is left and the publication before it reads back whole. */
  static const char *files[] = {"dense.safetensors", "table-0.bin",
                                "table-1.bin"};
  char dir[512], err[512], p1[1024];
  struct psd_pub *p;
  uint64_t *v;
  size_t n;
  struct stat st;
  off_t most = 0;
  psd_pub_dir(root, "j", 1, dir, sizeof dir);
  ck_assert_int_eq(psd_pub_prepare(dir, err, sizeof err), 0);
  ck_assert_int_eq(psd_pub_write(dir, make(1, 1, 1, ids1, 4, NULL, 0), "async",
                                 NULL, err, sizeof err),
                   0);
  for (int i = 0; i < 3; i++) {
    snprintf(p1, sizeof p1, "%s/pub-0000000001/%s", dir, files[i]);
    ck_assert_int_eq(stat(p1, &st), 0);
    most = st.st_size > most ? st.st_size : most;
  }
  snprintf(p1, sizeof p1, "%s/pub-0000000001/manifest.json", dir);
  ck_assert_int_eq(stat(p1, &st), 0);
  /* version 2's files: as long, but for a few digits */
  ck_assert_msg(most + 64 < st.st_size, "files %lld bytes, manifest %lld",
                (long long)most, (long long)st.st_size);
  struct rlimit was = tu_file_size_limit((rlim_t)(most + st.st_size) / 2);
  int rc = psd_pub_write(dir, make(2, 0, 1, ids2, 2, rm2, 2), "async", NULL,
                         err, sizeof err);
  tu_file_size_restore(&was);
  ck_assert_int_eq(rc, CM_EIO);
  ck_assert_msg(strstr(err, "File too large") && strstr(err, "/.tmp-2-") &&
                    strstr(err, "/manifest.json"),
                "%s", err);
  ck_assert_int_eq(tu_count_entries(dir, ".tmp-"), 0);
  ck_assert_int_eq(psd_pub_list(dir, &v, &n, err, sizeof err), 0);
  ck_assert_uint_eq(n, 1);
  ck_assert_uint_eq(v[0], 1);
  free(v);
  ck_assert_msg(psd_pub_read(dir, 1, "j", 1, 2, &p, err, sizeof err) == 0, "%s",
                err);
  same(p, make(1, 1, 1, ids1, 4, NULL, 0));
  psd_pub_free(p);
}
END_TEST

START_TEST(prune_keeps_full_chains) {
  char dir[512], err[512];
  uint64_t *v, ids[] = {1};
  size_t n;
  psd_pub_dir(root, "j", 1, dir, sizeof dir);
  ck_assert_int_eq(psd_pub_prepare(dir, err, sizeof err), 0);
  /* 1 full, 2 3 deltas, 4 full, 5 delta, 6 full, 7 delta */
  uint64_t base = 0;
  for (uint64_t ver = 1; ver <= 7; ver++) {
    int full = ver == 1 || ver == 4 || ver == 6;
    base = full ? ver : base;
    ck_assert_int_eq(psd_pub_write(dir, make(ver, full, base, ids, 1, NULL, 0),
                                   "sync", NULL, err, sizeof err),
                     0);
  }
  /* a crash's leftover is cleaned by the next prepare */
  char tmp[1100];
  snprintf(tmp, sizeof tmp, "%s/.tmp-8-1", dir);
  ck_assert_int_eq(mkdir(tmp, 0755), 0);
  ck_assert_int_eq(psd_pub_prune(dir, 2), 3);
  ck_assert_int_eq(psd_pub_prepare(dir, err, sizeof err), 0);
  ck_assert_int_ne(access(tmp, F_OK), 0);
  ck_assert_int_eq(psd_pub_list(dir, &v, &n, err, sizeof err), 0);
  ck_assert_uint_eq(n, 4);
  ck_assert_uint_eq(v[0], 4);
  ck_assert_uint_eq(v[3], 7);
  free(v);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("pubfile");
  TCase *tc = tcase_create("core");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, round_trip);
  tcase_add_test(tc, empty_shard);
  tcase_add_test(tc, missing);
  tcase_add_test(tc, truncated);
  tcase_add_test(tc, flipped_byte);
  tcase_add_test(tc, manifest_flipped);
  tcase_add_test(tc, other_job_or_shard);
  tcase_add_test(tc, prune_keeps_full_chains);
  tcase_add_test(tc, manifest_write_fails);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(suite(), 0); }
