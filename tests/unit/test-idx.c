/* Unit tests for worker/data/idx.c: the IDX reader on small files written here
 * (gzipped and plain, valid and broken in each way the reader must catch),
 * the labelled-dataset loader and its 1/n split, and, when the
 * dataset-fashion-mnist package is installed, the real t10k set. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "err.h"
#include "idx.h"
#include "unit.h"

#define FASHION_DIR "/usr/share/datasets/fashion-mnist"

/* The scratch directory of the running test (each test runs in its own
 * forked child with its own directory). */
static char tmpdir[64];

static void make_tmpdir(void) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/test-idx-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

/* Removes the files the tests create, then the directory. */
static void remove_tmpdir(void) {
  static const char *names[] = {
      "a.gz",
      "a.idx",
      "cut.gz",
      "train-images-idx3-ubyte.gz",
      "train-labels-idx1-ubyte.gz",
  };
  char path[128];
  size_t i;

  for (i = 0; i < sizeof names / sizeof names[0]; i++) {
    snprintf(path, sizeof path, "%s/%s", tmpdir, names[i]);
    unlink(path);
  }
  rmdir(tmpdir);
}

static const char *tpath(const char *name) {
  static char path[128];

  snprintf(path, sizeof path, "%s/%s", tmpdir, name);
  return path;
}

/* Writes len bytes to tmpdir/name, through gzip when gz is set. */
static void write_bytes(const char *name, int gz, const void *buf, size_t len) {
  const char *path = tpath(name);

  if (gz) {
    gzFile f = gzopen(path, "wb");

    ck_assert_ptr_nonnull(f);
    if (len > 0)
      ck_assert_int_eq(gzwrite(f, buf, (unsigned)len), (int)len);
    ck_assert_int_eq(gzclose(f), Z_OK);
  } else {
    FILE *f = fopen(path, "wb");

    ck_assert_ptr_nonnull(f);
    if (len > 0)
      ck_assert_uint_eq(fwrite(buf, 1, len, f), len);
    ck_assert_int_eq(fclose(f), 0);
  }
}

/* Builds an IDX image in buf: magic 00 00 <dtype> <ndim>, the dims big-endian,
 * then `ndata` data bytes counting 0, 1, 2, ... (mod 256). Returns its size. */
static size_t build_idx(uint8_t *buf, uint8_t dtype, int ndim,
                        const uint32_t *dims, size_t ndata) {
  size_t n = 0, i;
  int d;

  buf[n++] = 0;
  buf[n++] = 0;
  buf[n++] = dtype;
  buf[n++] = (uint8_t)ndim;
  for (d = 0; d < ndim; d++) {
    buf[n++] = (uint8_t)(dims[d] >> 24);
    buf[n++] = (uint8_t)(dims[d] >> 16);
    buf[n++] = (uint8_t)(dims[d] >> 8);
    buf[n++] = (uint8_t)dims[d];
  }
  for (i = 0; i < ndata; i++)
    buf[n++] = (uint8_t)i;
  return n;
}

START_TEST(test_valid_3d) {
  uint32_t dims[3] = {4, 3, 2};
  uint8_t buf[64];
  struct dw_idx idx;
  char err[256];
  size_t n = build_idx(buf, 0x08, 3, dims, 24), i;
  int gz = _i; /* loop: 0 plain, 1 gzipped */
  const char *name = gz ? "a.gz" : "a.idx";

  write_bytes(name, gz, buf, n);
  ck_assert_int_eq(dw_idx_load(tpath(name), &idx, err, sizeof err), 0);
  ck_assert_int_eq(idx.ndim, 3);
  ck_assert_uint_eq(idx.dims[0], 4);
  ck_assert_uint_eq(idx.dims[1], 3);
  ck_assert_uint_eq(idx.dims[2], 2);
  ck_assert_uint_eq(idx.count, 24);
  for (i = 0; i < 24; i++)
    ck_assert_uint_eq(idx.data[i], i);
  dw_idx_free(&idx);
  ck_assert_ptr_null(idx.data);
}
END_TEST

START_TEST(test_valid_1d) {
  uint32_t dims[1] = {300};
  uint8_t buf[512];
  struct dw_idx idx;
  char err[256];
  size_t n = build_idx(buf, 0x08, 1, dims, 300);
  int gz = _i;
  const char *name = gz ? "a.gz" : "a.idx";

  write_bytes(name, gz, buf, n);
  ck_assert_int_eq(dw_idx_load(tpath(name), &idx, err, sizeof err), 0);
  ck_assert_int_eq(idx.ndim, 1);
  ck_assert_uint_eq(idx.dims[0], 300);
  ck_assert_uint_eq(idx.count, 300);
  ck_assert_uint_eq(idx.data[299], 299 % 256);
  dw_idx_free(&idx);
}
END_TEST

START_TEST(test_bad_magic) {
  uint32_t dims[1] = {4};
  uint8_t buf[64];
  struct dw_idx idx;
  char err[256];
  size_t n = build_idx(buf, 0x08, 1, dims, 4);

  buf[0] = 0x1f; /* as if someone handed over a gzip header as data */
  write_bytes("a.gz", 1, buf, n);
  ck_assert_int_eq(dw_idx_load(tpath("a.gz"), &idx, err, sizeof err),
                   CM_EFORMAT);
  ck_assert_ptr_nonnull(strstr(err, tpath("a.gz")));
  ck_assert_ptr_nonnull(strstr(err, "magic"));
  ck_assert_ptr_null(idx.data);
}
END_TEST

START_TEST(test_wrong_dtype) {
  uint32_t dims[1] = {4};
  uint8_t buf[64];
  struct dw_idx idx;
  char err[256];
  size_t n = build_idx(buf, 0x0D, 1, dims, 16); /* 0x0D: float */

  write_bytes("a.gz", 1, buf, n);
  ck_assert_int_eq(dw_idx_load(tpath("a.gz"), &idx, err, sizeof err),
                   CM_EFORMAT);
  ck_assert_ptr_nonnull(strstr(err, "dtype 0x0d"));
}
END_TEST

START_TEST(test_bad_ndim) {
  uint32_t dims[5] = {1, 1, 1, 1, 1};
  uint8_t buf[64];
  struct dw_idx idx;
  char err[256];
  size_t n = build_idx(buf, 0x08, 5, dims, 1);

  write_bytes("a.gz", 1, buf, n);
  ck_assert_int_eq(dw_idx_load(tpath("a.gz"), &idx, err, sizeof err),
                   CM_EFORMAT);
  n = build_idx(buf, 0x08, 0, dims, 1);
  write_bytes("a.gz", 1, buf, n);
  ck_assert_int_eq(dw_idx_load(tpath("a.gz"), &idx, err, sizeof err),
                   CM_EFORMAT);
  ck_assert_ptr_nonnull(strstr(err, "0 dimensions"));
}
END_TEST

START_TEST(test_truncated_data) {
  uint32_t dims[3] = {4, 3, 2};
  uint8_t buf[64];
  struct dw_idx idx;
  char err[256], want[256];
  size_t n = build_idx(buf, 0x08, 3, dims, 20); /* 4 bytes short */
  int gz = _i;
  const char *name = gz ? "a.gz" : "a.idx";

  write_bytes(name, gz, buf, n);
  ck_assert_int_eq(dw_idx_load(tpath(name), &idx, err, sizeof err), CM_ETRUNC);
  /* 16 header bytes + 24 promised data bytes; 16 + 20 present */
  snprintf(want, sizeof want,
           "%s: truncated: header promises 40 bytes, "
           "file has 36",
           tpath(name));
  ck_assert_str_eq(err, want);
  ck_assert_ptr_null(idx.data);
}
END_TEST

START_TEST(test_truncated_header) {
  uint32_t dims[3] = {4, 3, 2};
  uint8_t buf[64];
  struct dw_idx idx;
  char err[256];

  build_idx(buf, 0x08, 3, dims, 24);
  write_bytes("a.gz", 1, buf, 10); /* stops inside the dims */
  ck_assert_int_eq(dw_idx_load(tpath("a.gz"), &idx, err, sizeof err),
                   CM_ETRUNC);
  write_bytes("a.gz", 1, buf, 0); /* empty */
  ck_assert_int_eq(dw_idx_load(tpath("a.gz"), &idx, err, sizeof err),
                   CM_ETRUNC);
}
END_TEST

/* A gzip stream cut short (a partial download) is a truncation too, not a
 * format error. */
START_TEST(test_truncated_gzip_stream) {
  uint32_t dims[1] = {4000};
  static uint8_t buf[8192];
  static uint8_t gzbytes[16384];
  struct dw_idx idx;
  char err[256];
  size_t n = build_idx(buf, 0x08, 1, dims, 4000), len, i;
  uint32_t r = 12345;
  FILE *f;

  /* incompressible data, so that half the gzip file is half the data */
  for (i = 8; i < n; i++) {
    r = r * 1664525u + 1013904223u;
    buf[i] = (uint8_t)(r >> 24);
  }
  write_bytes("a.gz", 1, buf, n);
  f = fopen(tpath("a.gz"), "rb");
  ck_assert_ptr_nonnull(f);
  len = fread(gzbytes, 1, sizeof gzbytes, f);
  fclose(f);
  ck_assert_uint_gt(len, 40);
  f = fopen(tpath("cut.gz"), "wb");
  ck_assert_ptr_nonnull(f);
  ck_assert_uint_eq(fwrite(gzbytes, 1, len / 2, f), len / 2);
  fclose(f);
  ck_assert_int_eq(dw_idx_load(tpath("cut.gz"), &idx, err, sizeof err),
                   CM_ETRUNC);
  ck_assert_ptr_nonnull(strstr(err, "gzip stream is cut off"));
}
END_TEST

START_TEST(test_corrupt_gzip) {
  static const uint8_t bad[] = {0x1f, 0x8b, 0x08, 0,   0,   0,   0,   0,  0,
                                3,    'g',  'a',  'r', 'b', 'a', 'g', 'e'};
  struct dw_idx idx;
  char err[256];

  write_bytes("a.idx", 0, bad, sizeof bad);
  ck_assert_int_eq(dw_idx_load(tpath("a.idx"), &idx, err, sizeof err),
                   CM_EFORMAT);
  ck_assert_ptr_nonnull(strstr(err, "corrupt gzip data"));
}
END_TEST

START_TEST(test_zero_dim) {
  uint32_t dims[3] = {4, 0, 2};
  uint8_t buf[64];
  struct dw_idx idx;
  char err[256];
  size_t n = build_idx(buf, 0x08, 3, dims, 0);

  write_bytes("a.gz", 1, buf, n);
  ck_assert_int_eq(dw_idx_load(tpath("a.gz"), &idx, err, sizeof err),
                   CM_EFORMAT);
  ck_assert_ptr_nonnull(strstr(err, "dimension 1 is zero"));
}
END_TEST

/* Dimensions whose product overflows (or is absurd) are refused before any
 * allocation. */
START_TEST(test_huge_dims) {
  uint32_t dims[4] = {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu};
  uint8_t buf[64];
  struct dw_idx idx;
  char err[256];
  size_t n = build_idx(buf, 0x08, 4, dims, 8);

  write_bytes("a.gz", 1, buf, n);
  ck_assert_int_eq(dw_idx_load(tpath("a.gz"), &idx, err, sizeof err),
                   CM_EFORMAT);
}
END_TEST

START_TEST(test_missing_file) {
  struct dw_idx idx;
  char err[256];

  ck_assert_int_eq(dw_idx_load(tpath("nope.gz"), &idx, err, sizeof err),
                   CM_ENOENT);
  ck_assert_ptr_nonnull(strstr(err, "nope.gz"));
}
END_TEST

/* Writes a small train set: n images of 2x3 pixels (pixel p of image i is
 * 10 * i + p) and nlabels labels (label i is i % 10, or bad_label at 2). */
static void write_set(uint32_t n, uint32_t nlabels, int bad_label) {
  uint8_t buf[1024];
  uint32_t dims[3] = {n, 2, 3};
  size_t len;
  uint32_t i;

  len = build_idx(buf, 0x08, 3, dims, 0);
  for (i = 0; i < n * 6; i++)
    buf[len++] = (uint8_t)(10 * (i / 6) + i % 6);
  write_bytes("train-images-idx3-ubyte.gz", 1, buf, len);
  len = build_idx(buf, 0x08, 1, &nlabels, 0);
  for (i = 0; i < nlabels; i++)
    buf[len++] = (uint8_t)(i == 2 && bad_label ? (uint32_t)bad_label : i % 10);
  write_bytes("train-labels-idx1-ubyte.gz", 1, buf, len);
}

START_TEST(test_dataset_split) {
  struct dw_dataset ds;
  char err[256];
  int k, p;

  write_set(5, 5, 0);
  ck_assert_int_eq(dw_dataset_load(tmpdir, "train", 0, 1, &ds, err, sizeof err),
                   0);
  ck_assert_int_eq(ds.n, 5);
  ck_assert_int_eq(ds.dim, 6);
  ck_assert_float_eq(ds.x[0], 0.0f);
  ck_assert_float_eq_tol(ds.x[4 * 6 + 5], 45.f / 255.f, 1e-7);
  dw_dataset_free(&ds);
  ck_assert_ptr_null(ds.x);

  /* part 1 of 2 keeps examples 1 and 3 */
  ck_assert_int_eq(dw_dataset_load(tmpdir, "train", 1, 2, &ds, err, sizeof err),
                   0);
  ck_assert_int_eq(ds.n, 2);
  ck_assert_int_eq(ds.y[0], 1);
  ck_assert_int_eq(ds.y[1], 3);
  for (k = 0; k < 2; k++)
    for (p = 0; p < 6; p++)
      ck_assert_float_eq_tol(ds.x[k * 6 + p], (10.f * (2 * k + 1) + p) / 255.f,
                             1e-7);
  dw_dataset_free(&ds);

  /* part 0 of 2 keeps 0, 2, 4 */
  ck_assert_int_eq(dw_dataset_load(tmpdir, "train", 0, 2, &ds, err, sizeof err),
                   0);
  ck_assert_int_eq(ds.n, 3);
  ck_assert_int_eq(ds.y[2], 4);
  dw_dataset_free(&ds);
}
END_TEST

START_TEST(test_dataset_count_mismatch) {
  struct dw_dataset ds;
  char err[256];

  write_set(5, 4, 0);
  ck_assert_int_eq(dw_dataset_load(tmpdir, "train", 0, 1, &ds, err, sizeof err),
                   CM_ESHAPE);
  ck_assert_ptr_nonnull(strstr(err, "5 images"));
  ck_assert_ptr_nonnull(strstr(err, "4 labels"));
  ck_assert_ptr_null(ds.x);
}
END_TEST

START_TEST(test_dataset_bad_label) {
  struct dw_dataset ds;
  char err[256];

  write_set(5, 5, 12);
  ck_assert_int_eq(dw_dataset_load(tmpdir, "train", 0, 1, &ds, err, sizeof err),
                   CM_EFORMAT);
  ck_assert_ptr_nonnull(strstr(err, "label 2 is 12"));
}
END_TEST

START_TEST(test_dataset_bad_part) {
  struct dw_dataset ds;
  char err[256];

  write_set(5, 5, 0);
  ck_assert_int_eq(dw_dataset_load(tmpdir, "train", 2, 2, &ds, err, sizeof err),
                   CM_EINVAL);
  ck_assert_int_eq(dw_dataset_load(tmpdir, "train", 0, 0, &ds, err, sizeof err),
                   CM_EINVAL);
  /* more parts than examples: part 6 of 7 has nothing */
  ck_assert_int_eq(dw_dataset_load(tmpdir, "train", 6, 7, &ds, err, sizeof err),
                   CM_ERANGE);
  ck_assert_int_eq(dw_dataset_load(tmpdir, "t10k", 0, 1, &ds, err, sizeof err),
                   CM_ENOENT);
}
END_TEST

START_TEST(test_fashion_t10k) {
  struct dw_dataset ds;
  char err[512];
  int hist[10] = {0}, bad = 0;
  size_t i;

  if (access(FASHION_DIR "/t10k-images-idx3-ubyte.gz", R_OK) != 0)
    return; /* dataset-fashion-mnist not installed: nothing to check */
  ck_assert_msg(
      dw_dataset_load(FASHION_DIR, "t10k", 0, 1, &ds, err, sizeof err) == 0,
      "%s", err);
  ck_assert_int_eq(ds.n, 10000);
  ck_assert_int_eq(ds.dim, 784);
  /* count, then assert once: a check assertion per pixel is slow */
  for (i = 0; i < (size_t)ds.n; i++) {
    if (ds.y[i] < 10)
      hist[ds.y[i]]++;
    else
      bad++;
  }
  ck_assert_int_eq(bad, 0);
  for (i = 0; i < 10; i++)
    ck_assert_int_eq(hist[i], 1000); /* t10k is balanced */
  for (i = 0; i < (size_t)ds.n * 784; i++)
    bad += !(ds.x[i] >= 0.0f && ds.x[i] <= 1.0f);
  ck_assert_int_eq(bad, 0);
  dw_dataset_free(&ds);
}
END_TEST

static Suite *idx_suite(void) {
  Suite *s = suite_create("idx");
  TCase *tc = tcase_create("idx");

  tcase_add_checked_fixture(tc, make_tmpdir, remove_tmpdir);
  tcase_add_loop_test(tc, test_valid_3d, 0, 2);
  tcase_add_loop_test(tc, test_valid_1d, 0, 2);
  tcase_add_test(tc, test_bad_magic);
  tcase_add_test(tc, test_wrong_dtype);
  tcase_add_test(tc, test_bad_ndim);
  tcase_add_loop_test(tc, test_truncated_data, 0, 2);
  tcase_add_test(tc, test_truncated_header);
  tcase_add_test(tc, test_truncated_gzip_stream);
  tcase_add_test(tc, test_corrupt_gzip);
  tcase_add_test(tc, test_zero_dim);
  tcase_add_test(tc, test_huge_dims);
  tcase_add_test(tc, test_missing_file);
  suite_add_tcase(s, tc);

  tc = tcase_create("dataset");
  tcase_add_checked_fixture(tc, make_tmpdir, remove_tmpdir);
  tcase_add_test(tc, test_dataset_split);
  tcase_add_test(tc, test_dataset_count_mismatch);
  tcase_add_test(tc, test_dataset_bad_label);
  tcase_add_test(tc, test_dataset_bad_part);
  tcase_add_test(tc, test_fashion_t10k);
  tcase_set_timeout(tc, 60);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(idx_suite(), 0); }
