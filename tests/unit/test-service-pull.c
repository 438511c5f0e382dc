/* Unit tests for psd.v1.Data/Pull (ps-server/psd/shard/service_pull.c): a
 * pull's segments are checked against this shard's slice, its answer fits the
 * caller's and the shard's message limits (cut short and marked partial when
 * the whole would not), and a sync pull parked for the next step is answered
 * when the service stops. The shard and the calls are service_fixture.h's. */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>

#include "ps.pb-c.h"
#include "rpc.h"
#include "rpc_server.h"
#include "service.h"
#include "service_fixture.h"
#include "unit.h"
#include "wire.h"

/* ---- Pull ---- */

START_TEST(pull_checks_segments) {
  int64_t shape[2] = {4, 2};
  const char *p = "/psd.v1.Data/Pull";
  declare("w", 2, shape); /* shard 0: rows [0, 2) = elements [0, 4) */
  Psd__V1__Segment s = seg("nosuch", 0, 1, 0, NULL);
  call(p, pull_req(&s, 1, 0), GRPC_STATUS_NOT_FOUND,
       "pull: no variable 'nosuch' on shard 0 (declare it first)");
  s = seg("w", 0, 0, 0, NULL);
  call(p, pull_req(&s, 1, 0), GRPC_STATUS_INVALID_ARGUMENT,
       "pull of 'w': segment 0 has count 0");
  s = seg("w", 2, 4, 0, NULL);
  call(p, pull_req(&s, 1, 0), GRPC_STATUS_OUT_OF_RANGE,
       "pull of 'w' elements [2, 6) is outside shard 0's slice, elements "
       "[0, 4) (rows [0, 2))");
  /* offset + count wraps around 2^64: still refused, and said exactly. */
  s = seg("w", 1ULL << 63, (1ULL << 63) + 5, 0, NULL);
  call(p, pull_req(&s, 1, 0), GRPC_STATUS_OUT_OF_RANGE,
       "elements [9223372036854775808, 9223372036854775808 + "
       "9223372036854775813)");
  s = seg("w", 1, UINT64_MAX, 0, NULL);
  call(p, pull_req(&s, 1, 0), GRPC_STATUS_OUT_OF_RANGE, "elements [1, 1 + ");
}
END_TEST

/* 1 when "big" holds the ramp (async: pushed_ramp applied it), 0 when it
 * holds its initial zeros (sync: a push is only staged). */
static int ramped;

/* Pulls and checks one answer: the whole message at most `cap` bytes, its
 * data whole elements that its `elements` counts, partial when fewer than
 * `asked`, each element i -(first + i) (ramped) or 0. Returns the elements
 * it holds. */
static uint64_t check_answer(grpc_byte_buffer *req, uint64_t cap,
                             uint64_t asked, uint64_t first) {
  struct cm_rpc_answer ans;
  struct cm_wire_msg m;
  Psd__V1__PullResponse *r;
  float *got = malloc(asked * sizeof *got + 1);
  uint64_t n;
  call_ans("/psd.v1.Data/Pull", req, GRPC_STATUS_OK, NULL, &ans);
  ck_assert_uint_le(grpc_byte_buffer_length(ans.response), cap);
  ck_assert_int_eq(cm_wire_parse(&m, ans.response), 0);
  r = psd__v1__pull_response__unpack(NULL, m.head_len, m.head);
  ck_assert_ptr_nonnull(r);
  n = m.bulk_len / sizeof(float);
  ck_assert_uint_eq(m.bulk_len, n * sizeof(float));
  ck_assert_uint_eq(r->elements, n);
  ck_assert_uint_le(n, asked);
  ck_assert_int_eq(r->partial, n < asked);
  ck_assert_int_eq(cm_wire_bulk_read(&m, 0, got, m.bulk_len), 0);
  for (uint64_t i = 0; i < n; i++)
    if (got[i] != (ramped ? -(float)(first + i) : 0.0f))
      ck_abort_msg("element %llu: %g, expected %g", (unsigned long long)i,
                   (double)got[i], ramped ? -(double)(first + i) : 0.0);
  psd__v1__pull_response__free_unpacked(r, NULL);
  cm_wire_msg_release(&m);
  cm_rpc_answer_release(&ans);
  free(got);
  return n;
}

/* Declares "big" (4096 x 4096; shard 0 holds elements [0, 2^23)) and, with
 * ramp (async), pushes the gradient i at element i of [0, n): with sgd at lr
 * 1 the value is -i, exact in f32. */
static void pushed_ramp(uint64_t n, int ramp) {
  static int64_t big[2] = {4096, 4096};
  Psd__V1__PushRequest r = PSD__V1__PUSH_REQUEST__INIT;
  Psd__V1__Segment s = seg("big", 0, n, 2, big);
  float *g = malloc(n * sizeof *g);
  declare("big", 2, big);
  ramped = ramp;
  if (!ramp) {
    free(g);
    return;
  }
  for (uint64_t i = 0; i < n; i++)
    g[i] = (float)i;
  call("/psd.v1.Data/Push", push_req(&r, &s, 1, g, n), GRPC_STATUS_OK, NULL);
  free(g);
}

/* Every answer fits the caller's limit (gRPC's default 4 MiB unless it
 * names its own) and the shard's: a pull of exactly 4 MiB of elements is
 * cut short and says so, in async and in sync mode alike. */
static void answers_fit_the_limits(int ramp) {
  const uint64_t mi = 1 << 20, four = 4 << 20;
  Psd__V1__Segment s[2];
  uint64_t n;
  pushed_ramp(mi + 16, ramp);
  /* A stock client: 1 Mi floats do not fit 4 MiB with the head (under 64
   * bytes here); the first ones do, and the rest come with the next pull. */
  s[0] = seg("big", 0, mi, 0, NULL);
  n = check_answer(pull_req(s, 1, 0), four, mi, 0);
  ck_assert_uint_ge(n, mi - 16);
  ck_assert_uint_lt(n, mi);
  s[0] = seg("big", n, mi - n, 0, NULL);
  ck_assert_uint_eq(check_answer(pull_req(s, 1, 0), four, mi - n, n), mi - n);
  /* A client that accepts 64 MiB gets it whole. */
  s[0] = seg("big", 0, mi, 0, NULL);
  ck_assert_uint_eq(
      check_answer(pull_req_max(s, 1, 0, 64 << 20), 64 << 20, mi, 0), mi);
  /* The cut may fall inside a later segment. */
  s[0] = seg("big", 0, mi / 2, 0, NULL);
  s[1] = seg("big", mi / 2, mi / 2 + 16, 0, NULL);
  n = check_answer(pull_req_max(s, 2, 0, four), four, mi + 16, 0);
  ck_assert_uint_ge(n, mi - 16);
  /* The shard's own limit holds too, whatever the caller accepts. */
  psd_service_set_limits(svc, &(struct psd_limits){.max_message = four});
  s[0] = seg("big", 0, mi + 16, 0, NULL);
  n = check_answer(pull_req_max(s, 1, 0, 64 << 20), four, mi + 16, 0);
  ck_assert_uint_ge(n, mi - 16);
  ck_assert_uint_lt(n, mi);
  /* A limit no head fits in is refused, saying why. */
  s[0] = seg("big", 0, 1, 0, NULL);
  call("/psd.v1.Data/Pull", pull_req_max(s, 1, 0, 8),
       GRPC_STATUS_RESOURCE_EXHAUSTED,
       "pull of 1 segment from shard 0: not one element fits in an "
       "answer of 8 bytes");
}

START_TEST(async_answer_fits_the_limits) { answers_fit_the_limits(1); }
END_TEST

START_TEST(sync_answer_fits_the_limits) { answers_fit_the_limits(0); }
END_TEST

/* Parked pulls are answered UNAVAILABLE when the service stops. */
START_TEST(sync_parked_pull_answered_at_stop) {
  int64_t shape[1] = {8};
  declare("s", 1, shape);
  Psd__V1__Segment ps = seg("s", 0, 4, 0, NULL);
  struct cm_rpc_answer parked;
  grpc_byte_buffer *bb = pull_req(&ps, 1, 1);
  ck_assert_int_eq(cm_rpc_call_local(method("/psd.v1.Data/Pull"), bb, &parked),
                   0);
  grpc_byte_buffer_destroy(bb);
  ck_assert_int_eq(parked.answered, 0);
  psd_service_stop(svc);
  ck_assert_int_eq(parked.answered, 1);
  ck_assert_int_eq(parked.status, GRPC_STATUS_UNAVAILABLE);
}
END_TEST

static Suite *pull_suite(void) {
  Suite *s = suite_create("pull");
  TCase *tc = service_tcase(s, "async");
  tcase_add_test(tc, pull_checks_segments);
  tcase_add_test(tc, async_answer_fits_the_limits);

  tc = service_tcase(s, "sync");
  tcase_add_test(tc, sync_parked_pull_answered_at_stop);
  tcase_add_test(tc, sync_answer_fits_the_limits);
  return s;
}

int main(void) { return tu_run(pull_suite(), 0); }
