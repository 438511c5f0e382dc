/* CRC-32C and TensorBoard event files (common/base/crc32c.h, tfevents.h):
 * the CRC against published vectors (the "123456789" check value, and
 * RFC 3720's iSCSI vectors); the mask; an event's bytes against a
 * hand-assembled protobuf encoding; and a written file read back record by
 * record, every length and CRC checked. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "crc32c.h"
#include "err.h"
#include "tfevents.h"
#include "unit.h"

START_TEST(crc32c_check_value) {
  ck_assert_uint_eq(cm_crc32c(0, "123456789", 9), 0xe3069283u);
  ck_assert_uint_eq(cm_crc32c(0, "", 0), 0);
}
END_TEST

/* RFC 3720, B.4: 32 bytes of zeros, of ones, increasing, decreasing. */
START_TEST(crc32c_rfc3720_vectors) {
  unsigned char b[32];
  memset(b, 0, sizeof b);
  ck_assert_uint_eq(cm_crc32c(0, b, sizeof b), 0x8a9136aau);
  memset(b, 0xff, sizeof b);
  ck_assert_uint_eq(cm_crc32c(0, b, sizeof b), 0x62a8ab43u);
  for (int i = 0; i < 32; i++)
    b[i] = (unsigned char)i;
  ck_assert_uint_eq(cm_crc32c(0, b, sizeof b), 0x46dd794eu);
  for (int i = 0; i < 32; i++)
    b[i] = (unsigned char)(31 - i);
  ck_assert_uint_eq(cm_crc32c(0, b, sizeof b), 0x113fdb5cu);
}
END_TEST

START_TEST(crc32c_continues) {
  const char *s = "123456789";
  ck_assert_uint_eq(cm_crc32c(cm_crc32c(0, s, 4), s + 4, 5), 0xe3069283u);
}
END_TEST

START_TEST(mask_is_rotate_then_add) {
  ck_assert_uint_eq(cm_crc32c_mask(0), 0xa282ead8u);
  /* 0xe3069283 rotated right by 15 is 0x2507c60d; plus the delta. */
  ck_assert_uint_eq(cm_crc32c_mask(0xe3069283u), 0x2507c60du + 0xa282ead8u);
}
END_TEST

static uint32_t le32(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
         (uint32_t)p[3] << 24;
}

static uint64_t le64(const unsigned char *p) {
  return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

START_TEST(record_head_and_foot) {
  unsigned char head[CM_TFRECORD_HEAD], foot[CM_TFRECORD_FOOT];
  cm_tfrecord_head(head, 0x0102030405060708ull);
  ck_assert_uint_eq(le64(head), 0x0102030405060708ull);
  ck_assert_uint_eq(le32(head + 8), cm_crc32c_mask(cm_crc32c(0, head, 8)));
  cm_tfrecord_foot(foot, "123456789", 9);
  ck_assert_uint_eq(le32(foot), cm_crc32c_mask(0xe3069283u));
}
END_TEST

/* wall_time 1.5, step 3, one scalar "a" = 2.0, assembled by hand. */
START_TEST(event_bytes) {
  static const unsigned char want[] = {
      0x09, 0,    0,   0, 0,   0, 0, 0xf8, 0x3f, /* 1: double 1.5 */
      0x10, 0x03,                                /* 2: varint 3 */
      0x2a, 0x0a,                                /* 5: Summary, 10 bytes */
      0x0a, 0x08,                                /* Summary.value, 8 bytes */
      0x0a, 0x01, 'a',                           /* tag */
      0x15, 0,    0,   0, 0x40};                 /* simple_value: float 2.0 */
  static const unsigned char version[] = {
      0x09, 0,   0,   0,   0,   0,   0,   0xf8, 0x3f, 0x1a, 0x0d, 'b',
      'r',  'a', 'i', 'n', '.', 'E', 'v', 'e',  'n',  't',  ':',  '2'};
  struct cm_tf_scalar s = {"a", 2.0f};
  unsigned char buf[64];
  int n = cm_tfevents_encode(buf, sizeof buf, 1.5, 3, NULL, &s, 1);
  ck_assert_int_eq(n, (int)sizeof want);
  ck_assert_mem_eq(buf, want, sizeof want);
  /* Step 0 is proto3's default, left out. */
  n = cm_tfevents_encode(buf, sizeof buf, 1.5, 0, CM_TFEVENTS_VERSION, NULL, 0);
  ck_assert_int_eq(n, (int)sizeof version);
  ck_assert_mem_eq(buf, version, sizeof version);
}
END_TEST

START_TEST(encode_refuses_what_does_not_fit) {
  char tag[CM_TFEVENTS_MAX_TAG + 2];
  struct cm_tf_scalar s = {"train/loss", 1.0f};
  unsigned char buf[512];
  ck_assert_int_eq(cm_tfevents_encode(buf, 20, 1.0, 1, NULL, &s, 1), CM_ERANGE);
  memset(tag, 'x', sizeof tag - 1);
  tag[sizeof tag - 1] = '\0';
  s.tag = tag;
  ck_assert_int_eq(cm_tfevents_encode(buf, sizeof buf, 1.0, 1, NULL, &s, 1),
                   CM_ERANGE);
}
END_TEST

/* Reads the whole file at path into a malloc'd buffer. */
static unsigned char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  unsigned char *b = malloc(1 << 16);
  ck_assert_ptr_nonnull(f);
  ck_assert_ptr_nonnull(b);
  *len = fread(b, 1, 1 << 16, f);
  fclose(f);
  return b;
}

START_TEST(file_reads_back_record_by_record) {
  char root[] = "/tmp/tu-tfevents-XXXXXX", dir[128], cmd[160];
  struct cm_tfevents *w;
  struct cm_tf_scalar s[2] = {{"train/loss", 0.5f}, {"train/step_ms", 3.0f}};
  unsigned char *b;
  size_t len, off = 0;
  int records = 0;
  const char *name;

  ck_assert_ptr_nonnull(mkdtemp(root));
  snprintf(dir, sizeof dir, "%s/a/b", root); /* parents made too */
  ck_assert_int_eq(cm_tfevents_open(&w, dir, 7), 0);
  name = strrchr(cm_tfevents_path(w), '/') + 1;
  ck_assert_int_eq(strncmp(name, "events.out.tfevents.", 20), 0);
  ck_assert_str_eq(name + strlen(name) - 2, ".7");
  ck_assert_int_eq(cm_tfevents_write(w, 10, s, 2), 0);
  ck_assert_int_eq(cm_tfevents_write(w, 20, s, 1), 0);
  /* Flushed already: read before closing, as after a crash. */
  b = slurp(cm_tfevents_path(w), &len);
  while (off < len) {
    uint64_t n;
    ck_assert_uint_ge(len - off, CM_TFRECORD_HEAD);
    n = le64(b + off);
    ck_assert_uint_eq(le32(b + off + 8),
                      cm_crc32c_mask(cm_crc32c(0, b + off, 8)));
    ck_assert_uint_ge(len - off - CM_TFRECORD_HEAD, n + CM_TFRECORD_FOOT);
    ck_assert_uint_eq(le32(b + off + CM_TFRECORD_HEAD + n),
                      cm_crc32c_mask(cm_crc32c(0, b + off + 12, n)));
    if (records == 0) /* the version event ends with its string */
      ck_assert_mem_eq(b + off + CM_TFRECORD_HEAD + n - 13, "brain.Event:2",
                       13);
    off += CM_TFRECORD_HEAD + n + CM_TFRECORD_FOOT;
    records++;
  }
  ck_assert_int_eq(records, 3);
  free(b);
  ck_assert_int_eq(cm_tfevents_close(w), 0);
  snprintf(cmd, sizeof cmd, "rm -rf %s", root);
  ck_assert_int_eq(system(cmd), 0);
}
END_TEST

START_TEST(open_fails_where_no_directory_can_be) {
  struct cm_tfevents *w = (void *)1;
  ck_assert_int_eq(cm_tfevents_open(&w, "/dev/null/tb", 0), CM_EIO);
  ck_assert_ptr_null(w);
  ck_assert_int_eq(errno, ENOTDIR);
}
END_TEST

static Suite *tfevents_suite(void) {
  Suite *s = suite_create("tfevents");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, crc32c_check_value);
  tcase_add_test(tc, crc32c_rfc3720_vectors);
  tcase_add_test(tc, crc32c_continues);
  tcase_add_test(tc, mask_is_rotate_then_add);
  tcase_add_test(tc, record_head_and_foot);
  tcase_add_test(tc, event_bytes);
  tcase_add_test(tc, encode_refuses_what_does_not_fit);
  tcase_add_test(tc, file_reads_back_record_by_record);
  tcase_add_test(tc, open_fails_where_no_directory_can_be);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(tfevents_suite(), 0); }
