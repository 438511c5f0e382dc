/* Head/bulk splitting: a message built with cm_wire_build parses back into
 * the same head and bulk however the bytes are cut into slices; protobuf-c
 * reads the head; malformed input is refused with CM_EPROTO. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/grpc.h>
#include <grpc/slice.h>

#include "bf16.h"
#include "err.h"
#include "ps.pb-c.h"
#include "unit.h"
#include "wire.h"

/* Re-cuts bb's bytes into slices of `step` bytes. */
static grpc_byte_buffer *recut(grpc_byte_buffer *bb, size_t step) {
  grpc_byte_buffer_reader r;
  grpc_slice s;
  size_t n = grpc_byte_buffer_length(bb), off = 0;
  uint8_t *buf = malloc(n + 1);
  grpc_byte_buffer_reader_init(&r, bb);
  while (grpc_byte_buffer_reader_next(&r, &s)) {
    memcpy(buf + off, GRPC_SLICE_START_PTR(s), GRPC_SLICE_LENGTH(s));
    off += GRPC_SLICE_LENGTH(s);
    grpc_slice_unref(s);
  }
  grpc_byte_buffer_reader_destroy(&r);
  int ns = (int)((n + step - 1) / step);
  grpc_slice *sl = calloc(ns + 1, sizeof *sl);
  for (int i = 0; i < ns; i++) {
    size_t k = n - i * step < step ? n - i * step : step;
    sl[i] = grpc_slice_from_copied_buffer((const char *)buf + i * step, k);
  }
  grpc_byte_buffer *out = grpc_raw_byte_buffer_create(sl, ns);
  for (int i = 0; i < ns; i++)
    grpc_slice_unref(sl[i]);
  free(sl);
  free(buf);
  return out;
}

static int released;
static void on_release(void *p) { released += p == &released; }

START_TEST(build_then_parse_any_cut) {
  Psd__V1__PushRequest req = PSD__V1__PUSH_REQUEST__INIT;
  Psd__V1__Segment seg = PSD__V1__SEGMENT__INIT, *segs[1] = {&seg};
  int64_t shape[2] = {3, 1000};
  float data[3000];
  uint8_t head[256];
  for (int i = 0; i < 3000; i++)
    data[i] = (float)i * 0.5f;
  seg.name = "w";
  seg.count = 3000;
  seg.n_shape = 2;
  seg.shape = shape;
  req.n_segments = 1;
  req.segments = segs;
  req.examples = 64;
  size_t hl = psd__v1__push_request__pack(&req, head);
  struct cm_wire_piece pieces[2] = {{(uint8_t *)data, 4000},
                                    {(uint8_t *)data + 4000, 8000}};
  released = 0;
  grpc_byte_buffer *bb =
      cm_wire_build(head, hl, pieces, 2, on_release, &released);
  ck_assert_ptr_nonnull(bb);

  size_t steps[] = {1, 3, 7, 4096, 1 << 20};
  for (size_t k = 0; k < sizeof steps / sizeof steps[0]; k++) {
    grpc_byte_buffer *cut = recut(bb, steps[k]);
    struct cm_wire_msg m;
    ck_assert_int_eq(cm_wire_parse(&m, cut), 0);
    ck_assert_int_eq(m.has_bulk, 1);
    ck_assert_uint_eq(m.bulk_len, sizeof data);
    float back[3000];
    ck_assert_int_eq(cm_wire_bulk_read(&m, 0, back, sizeof back), 0);
    ck_assert_mem_eq(back, data, sizeof data);
    ck_assert_int_eq(cm_wire_bulk_read(&m, 4, back, sizeof data), CM_ERANGE);
    Psd__V1__PushRequest *r =
        psd__v1__push_request__unpack(NULL, m.head_len, m.head);
    ck_assert_ptr_nonnull(r);
    ck_assert_uint_eq(r->examples, 64);
    ck_assert_str_eq(r->segments[0]->name, "w");
    ck_assert_int_eq(r->segments[0]->shape[1], 1000);
    ck_assert_uint_eq(r->data.len, 0); /* the bulk is not in the head */
    psd__v1__push_request__free_unpacked(r, NULL);
    cm_wire_msg_release(&m);
    grpc_byte_buffer_destroy(cut);
  }
  /* A stock decoder reads the same message, bulk included. */
  {
    grpc_byte_buffer *one = recut(bb, 1 << 20);
    grpc_byte_buffer_reader r;
    grpc_slice s;
    grpc_byte_buffer_reader_init(&r, one);
    grpc_byte_buffer_reader_next(&r, &s);
    Psd__V1__PushRequest *full = psd__v1__push_request__unpack(
        NULL, GRPC_SLICE_LENGTH(s), GRPC_SLICE_START_PTR(s));
    ck_assert_ptr_nonnull(full);
    ck_assert_uint_eq(full->data.len, sizeof data);
    ck_assert_mem_eq(full->data.data, data, sizeof data);
    psd__v1__push_request__free_unpacked(full, NULL);
    grpc_slice_unref(s);
    grpc_byte_buffer_reader_destroy(&r);
    grpc_byte_buffer_destroy(one);
  }
  grpc_byte_buffer_destroy(bb);
  ck_assert_int_eq(released, 2); /* each piece released once, by gRPC */
}
END_TEST

/* bfloat16 bulk (job.wire_dtype "bf16"): read back into floats however the
 * slices cut it, an element split between two slices included. */
START_TEST(bf16_bulk_any_cut) {
  enum { N = 1001 };
  float src[N], back[N], want[N];
  uint16_t wire[N];
  uint8_t head[] = {0x20, 0x07}; /* field 4 (a varint): a small head */
  for (int i = 0; i < N; i++)
    src[i] = (float)i * 1.001f - 300.0f;
  cm_bf16_from_f32(wire, src, N);
  cm_bf16_to_f32(want, wire, N);
  struct cm_wire_piece piece = {(uint8_t *)wire, sizeof wire};
  grpc_byte_buffer *bb =
      cm_wire_build(head, sizeof head, &piece, 1, NULL, NULL);
  size_t steps[] = {1, 3, 7, 1 << 20};
  for (size_t k = 0; k < sizeof steps / sizeof steps[0]; k++) {
    grpc_byte_buffer *cut = recut(bb, steps[k]);
    struct cm_wire_msg m;
    ck_assert_int_eq(cm_wire_parse(&m, cut), 0);
    ck_assert_uint_eq(m.bulk_len, sizeof wire);
    memset(back, 0, sizeof back);
    ck_assert_int_eq(cm_wire_bulk_read_bf16(&m, 0, back, N), 0);
    ck_assert_mem_eq(back, want, sizeof want);
    ck_assert_int_eq(cm_wire_bulk_read_bf16(&m, 2 * 10, back, N - 10), 0);
    ck_assert_mem_eq(back, want + 10, sizeof want - 10 * sizeof *want);
    ck_assert_int_eq(cm_wire_bulk_read_bf16(&m, 2, back, N), CM_ERANGE);
    ck_assert_int_eq(cm_wire_bulk_read_bf16(&m, 1, back, 1), CM_ERANGE);
    cm_wire_msg_release(&m);
    grpc_byte_buffer_destroy(cut);
  }
  grpc_byte_buffer_destroy(bb);
}
END_TEST

static int parse_hex(const char *hex) {
  size_t n = strlen(hex) / 2;
  uint8_t buf[64];
  for (size_t i = 0; i < n; i++)
    sscanf(hex + 2 * i, "%2hhx", &buf[i]);
  grpc_slice s = grpc_slice_from_copied_buffer((const char *)buf, n);
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
  grpc_slice_unref(s);
  struct cm_wire_msg m;
  int rc = cm_wire_parse(&m, bb);
  cm_wire_msg_release(&m);
  grpc_byte_buffer_destroy(bb);
  return rc;
}

START_TEST(malformed_is_eproto) {
  ck_assert_int_eq(parse_hex("0801"), 0);                 /* field 1 varint */
  ck_assert_int_eq(parse_hex("7a020102"), 0);             /* bulk of 2 */
  ck_assert_int_eq(parse_hex("ffffffffffff"), CM_EPROTO); /* runaway varint */
  ck_assert_int_eq(parse_hex("0a05ab"), CM_EPROTO);       /* truncated bytes */
  ck_assert_int_eq(parse_hex("0b"), CM_EPROTO);           /* group start */
  ck_assert_int_eq(parse_hex("7801"), CM_EPROTO);         /* bulk as varint */
  ck_assert_int_eq(parse_hex("7a01017a0102"), CM_EPROTO); /* bulk twice */
  ck_assert_int_eq(parse_hex("0001"), CM_EPROTO);         /* field 0 */
  struct cm_wire_msg m;
  ck_assert_int_eq(cm_wire_parse(&m, NULL), 0); /* empty message */
  ck_assert_uint_eq(m.head_len, 0);
  cm_wire_msg_release(&m);
}
END_TEST

static Suite *wire_suite(void) {
  Suite *s = suite_create("wire");
  TCase *tc = tcase_create("wire");
  tcase_add_test(tc, build_then_parse_any_cut);
  tcase_add_test(tc, malformed_is_eproto);
  tcase_add_test(tc, bf16_bulk_any_cut);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  int status;

  grpc_init();
  status = tu_run(wire_suite(), TU_NOFORK);
  grpc_shutdown();
  return status;
}
