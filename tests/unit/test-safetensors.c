/* Unit tests for common/vars/safetensors.c: a written file reads back with the
 * same names, shapes, metadata and bytes, laid out as the format says (8-byte
 * length, space-padded JSON, tensors back to back); per-tensor CRCs match
 * zlib's whatever the write pieces; U64 tensors beside F32 ones; the writer
 * refuses bad names, dtypes it cannot write and wrong amounts of data; the
 * reader refuses every truncation of a valid file and every kind of bad header
 * with a message (never a crash), and bounds its reads; random garbage never
 * crashes it. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* mkstemp under -std=c11 */
#endif

#include <check.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "err.h"
#include "safetensors.h"
#include "unit.h"

static char path[64];
static char err[4096];

static void setup(void) {
  snprintf(path, sizeof path, "/tmp/test-st-XXXXXX");
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  close(fd);
}

static void teardown(void) { unlink(path); }

/* Writes raw bytes as the whole file. */
static void put(const void *p, size_t n) {
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  ck_assert_uint_eq(fwrite(p, 1, n, f), n);
  fclose(f);
}

/* Reads the whole file into *out (caller frees); returns its size. */
static size_t get(unsigned char **out) {
  struct stat st;
  ck_assert_int_eq(stat(path, &st), 0);
  *out = malloc(st.st_size + 1);
  FILE *f = fopen(path, "rb");
  ck_assert_uint_eq(fread(*out, 1, st.st_size, f), (size_t)st.st_size);
  fclose(f);
  return st.st_size;
}

/* A file with a header given as JSON text and `data` bytes of zeros. */
static void put_header(const char *json, size_t data) {
  size_t n = strlen(json);
  unsigned char *b = calloc(1, 8 + n + data);
  for (int i = 0; i < 8; i++)
    b[i] = (unsigned char)((uint64_t)n >> (8 * i));
  memcpy(b + 8, json, n);
  put(b, 8 + n + data);
  free(b);
}

/* Opens path expecting failure rc; returns nothing, checks the message. */
static void open_bad(int want, const char *text) {
  struct cm_st_file *f = (struct cm_st_file *)1;
  err[0] = 0;
  int rc = cm_st_open(&f, path, err, sizeof err);
  ck_assert_msg(rc == want, "rc %s, want %s: %s", cm_err_name(rc),
                cm_err_name(want), err);
  ck_assert_ptr_null(f);
  ck_assert_msg(strstr(err, path) != NULL, "no path in: %s", err);
  if (text)
    ck_assert_msg(strstr(err, text) != NULL, "no \"%s\" in: %s", text, err);
}

static float a[6] = {1, 2, 3, 4, 5, 6};
static float b[24];
static const int64_t sa[2] = {2, 3}, sb[3] = {2, 3, 4}, sz[2] = {0, 7};

/* Writes tensors "a" (2,3), "empty" (0,7), "b/c \"q\"" (2,3,4) and two
 * metadata entries, feeding the data in pieces of `piece` bytes. */
static void write_sample(size_t piece) {
  struct cm_st_desc d[3] = {
      {"a", 2, sa}, {"empty", 2, sz}, {"b/c \"q\" \xc3\xa9", 3, sb}};
  struct cm_st_meta m[2] = {{"job", "t"}, {"step", "42"}};
  struct cm_st_writer *w = NULL;
  unsigned char all[sizeof a + sizeof b];
  int fd = open(path, O_WRONLY | O_TRUNC);

  for (int i = 0; i < 24; i++)
    b[i] = (float)i * 0.5f - 3;
  memcpy(all, a, sizeof a);
  memcpy(all + sizeof a, b, sizeof b);
  ck_assert_int_eq(cm_st_writer_new(&w, fd, path, d, 3, m, 2, err, sizeof err),
                   0);
  for (size_t off = 0; off < sizeof all; off += piece) {
    size_t k = sizeof all - off < piece ? sizeof all - off : piece;
    ck_assert_int_eq(cm_st_writer_write(w, all + off, k, err, sizeof err), 0);
  }
  ck_assert_int_eq(cm_st_writer_finish(w, err, sizeof err), 0);
  ck_assert_uint_eq(cm_st_writer_crc(w, 0),
                    crc32(0, (const Bytef *)a, sizeof a));
  ck_assert_uint_eq(cm_st_writer_crc(w, 1), 0);
  ck_assert_uint_eq(cm_st_writer_crc(w, 2),
                    crc32(0, (const Bytef *)b, sizeof b));
  struct stat st;
  fstat(fd, &st);
  ck_assert_uint_eq(cm_st_writer_size(w), (uint64_t)st.st_size);
  cm_st_writer_free(w);
  close(fd);
}

START_TEST(test_roundtrip) {
  struct cm_st_file *f = NULL;
  const struct cm_st_tensor *t;
  unsigned char *raw;
  float got[24];
  uint64_t hlen = 0;
  size_t size;

  write_sample(1 << 20);
  size = get(&raw);
  for (int i = 7; i >= 0; i--)
    hlen = hlen << 8 | raw[i];
  /* Space-padded so the data starts 8-byte aligned; data back to back. */
  ck_assert_uint_eq(hlen % 8, 0);
  ck_assert_int_eq(raw[8], '{');
  ck_assert_uint_eq(size, 8 + hlen + sizeof a + sizeof b);
  ck_assert_int_eq(memcmp(raw + 8 + hlen, a, sizeof a), 0);
  ck_assert_int_eq(memcmp(raw + 8 + hlen + sizeof a, b, sizeof b), 0);
  ck_assert_ptr_nonnull(strstr((char *)raw + 8,
                               "\"__metadata__\":{\"job\":\"t\",\"step\":"
                               "\"42\"}"));
  ck_assert_ptr_nonnull(strstr(
      (char *)raw + 8,
      "\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}"));
  free(raw);

  ck_assert_int_eq(cm_st_open(&f, path, err, sizeof err), 0);
  ck_assert_int_eq(cm_st_count(f), 3);
  ck_assert_str_eq(cm_st_meta_get(f, "job"), "t");
  ck_assert_str_eq(cm_st_meta_get(f, "step"), "42");
  ck_assert_ptr_null(cm_st_meta_get(f, "nope"));
  t = cm_st_find(f, "b/c \"q\" \xc3\xa9");
  ck_assert_ptr_nonnull(t);
  ck_assert_str_eq(t->dtype, "F32");
  ck_assert_int_eq(t->ndim, 3);
  ck_assert_int_eq(t->shape[2], 4);
  ck_assert_uint_eq(t->begin, 24);
  ck_assert_uint_eq(t->end, 24 + 96);
  ck_assert_int_eq(cm_st_read(f, t, 0, got, sizeof b, err, sizeof err), 0);
  ck_assert_int_eq(memcmp(got, b, sizeof b), 0);
  ck_assert_int_eq(cm_st_read(f, t, 8, got, 8, err, sizeof err), 0);
  ck_assert(got[0] == b[2] && got[1] == b[3]);
  /* Reads stay inside the tensor. */
  ck_assert_int_eq(cm_st_read(f, t, 90, got, 8, err, sizeof err), CM_ERANGE);
  ck_assert_int_eq(cm_st_read(f, t, UINT64_MAX - 2, got, 8, err, sizeof err),
                   CM_ERANGE);
  t = cm_st_find(f, "empty");
  ck_assert_ptr_nonnull(t);
  ck_assert_uint_eq(t->begin, t->end);
  ck_assert_int_eq(cm_st_read(f, t, 0, got, 0, err, sizeof err), 0);
  ck_assert_ptr_null(cm_st_find(f, "missing"));
  /* In data order. */
  ck_assert_str_eq(cm_st_at(f, 0)->name, "a");
  ck_assert_ptr_null(cm_st_at(f, 3));
  cm_st_close(f);
}
END_TEST

START_TEST(test_crc_whatever_the_pieces) {
  for (size_t piece = 1; piece <= 40; piece++)
    write_sample(piece); /* asserts the CRCs and sizes inside */
}
END_TEST

START_TEST(test_writer_refuses) {
  struct cm_st_writer *w = NULL;
  int fd = open(path, O_WRONLY | O_TRUNC);
  int64_t neg[1] = {-1};
  struct cm_st_desc dup[2] = {{"x", 2, sa}, {"x", 2, sa}};
  struct cm_st_desc meta[1] = {{"__metadata__", 2, sa}};
  struct cm_st_desc bad[1] = {{"n", 1, neg}};
  struct cm_st_desc deep[1] = {{"d", CM_ST_MAX_DIMS + 1, sb}};
  struct cm_st_desc nonutf8[1] = {{"\xff\xfe", 2, sa}};

  ck_assert_int_eq(
      cm_st_writer_new(&w, fd, path, dup, 2, NULL, 0, err, sizeof err),
      CM_EINVAL);
  ck_assert_ptr_nonnull(strstr(err, "'x'"));
  ck_assert_int_eq(
      cm_st_writer_new(&w, fd, path, meta, 1, NULL, 0, err, sizeof err),
      CM_EINVAL);
  ck_assert_int_eq(
      cm_st_writer_new(&w, fd, path, bad, 1, NULL, 0, err, sizeof err),
      CM_EINVAL);
  ck_assert_int_eq(
      cm_st_writer_new(&w, fd, path, deep, 1, NULL, 0, err, sizeof err),
      CM_EINVAL);
  ck_assert_int_eq(
      cm_st_writer_new(&w, fd, path, nonutf8, 1, NULL, 0, err, sizeof err),
      CM_EINVAL);
  ck_assert_ptr_null(w);
  /* Too much, then too little data. */
  ck_assert_int_eq(
      cm_st_writer_new(&w, fd, path, dup, 1, NULL, 0, err, sizeof err), 0);
  ck_assert_int_eq(cm_st_writer_write(w, b, 28, err, sizeof err), CM_EINVAL);
  ck_assert_ptr_nonnull(strstr(err, "more bytes"));
  ck_assert_int_eq(cm_st_writer_write(w, a, 20, err, sizeof err), 0);
  ck_assert_int_eq(cm_st_writer_finish(w, err, sizeof err), CM_EINVAL);
  ck_assert_ptr_nonnull(strstr(err, "20 bytes"));
  cm_st_writer_free(w);
  close(fd);
  /* A write error is CM_EIO with the reason. */
  fd = open(path, O_RDONLY);
  ck_assert_int_eq(
      cm_st_writer_new(&w, fd, path, dup, 1, NULL, 0, err, sizeof err), CM_EIO);
  ck_assert_ptr_nonnull(strstr(err, "Bad file descriptor"));
  close(fd);
}
END_TEST

/* U64 tensors beside F32 ones (psctl export's "ids" and "values"): 8 bytes
 * an element, the dtype in the header, the bytes back as written; a dtype
 * the writer cannot write is refused rather than mislabelled. */
START_TEST(test_u64) {
  static const uint64_t ids[3] = {1, 1ull << 40, UINT64_MAX};
  static const float vals[6] = {0.5f, -1, 2, 3, -4, 5.25f};
  static const int64_t si[1] = {3}, sv[2] = {3, 2};
  struct cm_st_desc d[2] = {{"ids", 1, si, "U64"}, {"values", 2, sv, NULL}};
  struct cm_st_desc i64[1] = {{"x", 1, si, "I64"}};
  struct cm_st_writer *w = NULL;
  struct cm_st_file *f = NULL;
  const struct cm_st_tensor *t;
  uint64_t got[3];
  float gotv[6];
  int fd = open(path, O_WRONLY | O_TRUNC);

  ck_assert_int_eq(
      cm_st_writer_new(&w, fd, path, i64, 1, NULL, 0, err, sizeof err),
      CM_EINVAL);
  ck_assert_ptr_nonnull(strstr(err, "F32 or U64"));
  ck_assert_ptr_null(w);
  ck_assert_int_eq(
      cm_st_writer_new(&w, fd, path, d, 2, NULL, 0, err, sizeof err), 0);
  ck_assert_int_eq(cm_st_writer_write(w, ids, sizeof ids, err, sizeof err), 0);
  ck_assert_int_eq(cm_st_writer_write(w, vals, sizeof vals, err, sizeof err),
                   0);
  ck_assert_int_eq(cm_st_writer_finish(w, err, sizeof err), 0);
  ck_assert_uint_eq(cm_st_writer_crc(w, 0),
                    crc32(0, (const Bytef *)ids, sizeof ids));
  cm_st_writer_free(w);
  close(fd);

  ck_assert_int_eq(cm_st_open(&f, path, err, sizeof err), 0);
  t = cm_st_find(f, "ids");
  ck_assert_ptr_nonnull(t);
  ck_assert_str_eq(t->dtype, "U64");
  ck_assert_int_eq(t->ndim, 1);
  ck_assert_int_eq(t->shape[0], 3);
  ck_assert_uint_eq(t->begin, 0);
  ck_assert_uint_eq(t->end, 24);
  ck_assert_int_eq(cm_st_read(f, t, 0, got, sizeof got, err, sizeof err), 0);
  ck_assert_int_eq(memcmp(got, ids, sizeof ids), 0);
  t = cm_st_find(f, "values");
  ck_assert_str_eq(t->dtype, "F32");
  ck_assert_uint_eq(t->begin, 24);
  ck_assert_uint_eq(t->end, 48);
  ck_assert_int_eq(cm_st_read(f, t, 0, gotv, sizeof gotv, err, sizeof err), 0);
  ck_assert_int_eq(memcmp(gotv, vals, sizeof vals), 0);
  cm_st_close(f);
}
END_TEST

START_TEST(test_every_truncation_is_refused) {
  unsigned char *raw;
  size_t size;

  write_sample(1 << 20);
  size = get(&raw);
  for (size_t n = 0; n < size; n++) {
    put(raw, n);
    struct cm_st_file *f = NULL;
    int rc = cm_st_open(&f, path, err, sizeof err);
    ck_assert_msg(rc == CM_ETRUNC || rc == CM_EFORMAT,
                  "truncated to %zu: rc %d %s", n, rc, err);
    ck_assert_ptr_null(f);
    ck_assert_ptr_nonnull(strstr(err, path));
  }
  /* The data section cut short says "truncated". */
  put(raw, size - 1);
  open_bad(CM_ETRUNC, "truncated");
  put(raw, 5);
  open_bad(CM_ETRUNC, "8-byte header length");
  /* One byte too many is also refused. */
  unsigned char *more = calloc(1, size + 1);
  memcpy(more, raw, size);
  put(more, size + 1);
  open_bad(CM_EFORMAT, "1 bytes follow the last tensor");
  free(more);
  free(raw);
}
END_TEST

START_TEST(test_bad_headers) {
  unsigned char huge[16] = {0, 0, 0, 0, 0, 0, 0, 1, '{', '}'};
  put(huge, sizeof huge);
  open_bad(CM_EFORMAT, "not a safetensors file");
  unsigned char longer[12] = {200, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
  put(longer, sizeof longer);
  open_bad(CM_ETRUNC, "truncated");
  put_header("[1, 2]  ", 0);
  open_bad(CM_EFORMAT, "does not start with '{'");
  put_header("{\"a\": 1,}", 0);
  open_bad(CM_EFORMAT, "not a JSON object");
  put_header("{\"a\": {\"dtype\": \"F33\", \"shape\": [1], "
             "\"data_offsets\": [0, 4]}}",
             4);
  open_bad(CM_EFORMAT, "unknown dtype");
  put_header("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], "
             "\"data_offsets\": [0, 4]}}",
             4);
  open_bad(CM_EFORMAT, "do not hold its shape");
  put_header("{\"a\": {\"dtype\": \"F32\", \"shape\": [-1], "
             "\"data_offsets\": [0, 4]}}",
             4);
  open_bad(CM_EFORMAT, "not a non-negative integer");
  put_header("{\"a\": {\"dtype\": \"F32\", \"shape\": [1]}}", 4);
  open_bad(CM_EFORMAT, "data_offsets");
  put_header("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], "
             "\"data_offsets\": [4, 0]}}",
             4);
  open_bad(CM_EFORMAT, "do not hold");
  /* A gap, then an overlap, between tensors. */
  put_header("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], "
             "\"data_offsets\": [0, 4]}, \"b\": {\"dtype\": \"F32\", "
             "\"shape\": [1], \"data_offsets\": [8, 12]}}",
             12);
  open_bad(CM_EFORMAT, "back to back");
  put_header("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], "
             "\"data_offsets\": [0, 8]}, \"b\": {\"dtype\": \"F32\", "
             "\"shape\": [1], \"data_offsets\": [4, 8]}}",
             8);
  open_bad(CM_EFORMAT, "back to back");
  put_header("{\"__metadata__\": {\"k\": 1}}", 0);
  open_bad(CM_EFORMAT, "not a string");
  put_header("{\"__metadata__\": [1]}", 0);
  open_bad(CM_EFORMAT, "not an object");
  put_header("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], "
             "\"data_offsets\": [0, 4]}, \"a\": {}}",
             4);
  open_bad(CM_EFORMAT, NULL); /* duplicate key */
  put_header("{\"a\": {\"dtype\": \"F32\", \"shape\": [1,1,1,1,1,1,1,1,1], "
             "\"data_offsets\": [0, 4]}}",
             4);
  open_bad(CM_EFORMAT, "dimensions");
  put_header("{\"a\": {\"dtype\": \"F32\", \"shape\": [4294967296, "
             "4294967296, 4294967296], \"data_offsets\": [0, 4]}}",
             4);
  open_bad(CM_EFORMAT, NULL); /* overflowing shape */
  /* An empty, valid file: no tensors. */
  put_header("{}      ", 0);
  struct cm_st_file *f = NULL;
  ck_assert_int_eq(cm_st_open(&f, path, err, sizeof err), 0);
  ck_assert_int_eq(cm_st_count(f), 0);
  cm_st_close(f);
  unlink(path);
  open_bad(CM_ENOENT, "No such file");
}
END_TEST

START_TEST(test_garbage_never_crashes) {
  unsigned char buf[512];
  unsigned char *raw;
  size_t size;
  unsigned seed = 12345;

  write_sample(1 << 20);
  size = get(&raw);
  for (int iter = 0; iter < 3000; iter++) {
    size_t n;
    if (iter % 2) {
      /* A valid file with a few bytes flipped anywhere. */
      n = size < sizeof buf ? size : sizeof buf;
      memcpy(buf, raw, n);
      for (int k = 0; k < 3; k++)
        buf[rand_r(&seed) % n] ^= (unsigned char)(1 + rand_r(&seed) % 255);
    } else {
      n = rand_r(&seed) % sizeof buf;
      for (size_t i = 0; i < n; i++)
        buf[i] = (unsigned char)rand_r(&seed);
      if (n >= 8) {
        uint64_t h = rand_r(&seed) % (n - 7);
        for (int i = 0; i < 8; i++)
          buf[i] = (unsigned char)(h >> (8 * i));
        buf[8] = '{';
      }
    }
    put(buf, n);
    struct cm_st_file *f = NULL;
    if (cm_st_open(&f, path, err, sizeof err) == 0) {
      /* Whatever it accepted reads within bounds. */
      for (int i = 0; i < cm_st_count(f); i++) {
        const struct cm_st_tensor *t = cm_st_at(f, i);
        uint64_t len = t->end - t->begin;
        ck_assert_uint_le(len, n);
        unsigned char tmp[512];
        ck_assert_int_eq(cm_st_read(f, t, 0, tmp, len, err, sizeof err), 0);
      }
      cm_st_close(f);
    } else {
      ck_assert_ptr_null(f);
      ck_assert_ptr_nonnull(strstr(err, path));
    }
  }
  free(raw);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("safetensors");
  TCase *tc = tcase_create("core");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_roundtrip);
  tcase_add_test(tc, test_crc_whatever_the_pieces);
  tcase_add_test(tc, test_writer_refuses);
  tcase_add_test(tc, test_u64);
  tcase_add_test(tc, test_every_truncation_is_refused);
  tcase_add_test(tc, test_bad_headers);
  tcase_add_test(tc, test_garbage_never_crashes);
  /* 3000 files written and read back take 0.5 s alone, and more than
   * check's default 4 s on a busy shared machine. */
  tcase_set_timeout(tc, 60);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(suite(), 0); }
