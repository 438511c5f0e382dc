/* Unit tests for psd.v1.Data/Push (ps-server/psd/shard/service_push.c): a push
 * is checked whole before anything is applied, and a gradient with NaN or
 * infinities is rejected, skipped or applied as job.nonfinite says. Also
 * cm_first_nonfinite (common/base/finite.h, push's scan) against a plain loop.
 * The shard and the calls are service_fixture.h's. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "finite.h"
#include "ps.pb-c.h"
#include "rpc.h"
#include "rpc_server.h"
#include "service.h"
#include "service_fixture.h"
#include "unit.h"

/* ---- Push ---- */

START_TEST(push_checks_before_applying) {
  int64_t shape[2] = {4, 2}, wrong[2] = {4, 3}, one[1] = {3};
  const char *p = "/psd.v1.Data/Push";
  float g[8] = {1, 2, 3, 4, 5, 6, 7, 8}, got[4];
  declare("w", 2, shape);
  call("/psd.v1.Data/Declare", declare_req("b", 1, one, 0), GRPC_STATUS_OK,
       NULL); /* whole on shard 0 */
  Psd__V1__PushRequest r = PSD__V1__PUSH_REQUEST__INIT;
  Psd__V1__Segment s[3];

  s[0] = seg("w", 0, 4, 2, wrong);
  call(p, push_req(&r, s, 1, g, 4), GRPC_STATUS_INVALID_ARGUMENT,
       "push to 'w': gradient shape [4, 3] does not match the variable's "
       "shape [4, 2]");
  s[0] = seg("w", 0, 4, 2, shape);
  /* A wrong data length names the variable and both byte counts. */
  call(p, push_req(&r, s, 1, g, 3), GRPC_STATUS_INVALID_ARGUMENT,
       "push to 'w' on shard 0: its 1 segment describes 4 elements, 16 bytes "
       "of f32 gradient, but the data field holds 12 bytes; send each "
       "segment's count x 4 bytes");
  call(p, push_req(&r, s, 1, g, 5), GRPC_STATUS_INVALID_ARGUMENT,
       "push to 'w' on shard 0: its 1 segment describes 4 elements, 16 bytes "
       "of f32 gradient, but the data field holds 20 bytes");
  s[1] = seg("b", 0, 3, 1, one); /* and a second variable: both named */
  call(p, push_req(&r, s, 2, g, 8), GRPC_STATUS_INVALID_ARGUMENT,
       "push to 'w', 'b' on shard 0: the 2 segments describe 7 elements, 28 "
       "bytes of f32 gradient, but the data field holds 32 bytes");
  /* Overlapping segments of one variable, in any order. */
  s[0] = seg("w", 2, 2, 2, shape);
  s[1] = seg("b", 0, 3, 1, one);
  s[2] = seg("w", 0, 3, 2, shape);
  call(p, push_req(&r, s, 3, g, 8), GRPC_STATUS_INVALID_ARGUMENT,
       "push to 'w': segments 0 and 2 overlap (elements [0, 3) and [2, 4))");
  s[2] = seg("w", 2, 2, 2, shape);
  call(p, push_req(&r, s, 3, g, 7), GRPC_STATUS_INVALID_ARGUMENT,
       "segments 0 and 2 overlap (elements [2, 4) and [2, 4))");
  /* A named worker must exist. */
  s[0] = seg("w", 0, 4, 2, shape);
  r.has_worker = 1;
  r.worker = 2;
  call(p, push_req(&r, s, 1, g, 4), GRPC_STATUS_INVALID_ARGUMENT,
       "Push: worker 2 out of range; cluster.worker has 2 entries");
  r.worker = -1;
  call(p, push_req(&r, s, 1, g, 4), GRPC_STATUS_INVALID_ARGUMENT,
       "worker -1 out of range");
  /* Unknown variable in the second segment: the first is not applied. */
  s[1] = seg("nosuch", 0, 1, 1, one);
  r.worker = 0;
  call(p, push_req(&r, s, 2, g, 5), GRPC_STATUS_NOT_FOUND, "'nosuch'");
  pull_values("w", 0, 4, got);
  for (int i = 0; i < 4; i++)
    ck_assert_float_eq(got[i], 0.0f);
  /* Adjacent segments are fine; lr 1 sgd: w = -g. */
  s[0] = seg("w", 0, 2, 2, shape);
  s[1] = seg("w", 2, 2, 2, shape);
  call(p, push_req(&r, s, 2, g, 4), GRPC_STATUS_OK, NULL);
  pull_values("w", 0, 4, got);
  for (int i = 0; i < 4; i++)
    ck_assert_float_eq(got[i], -g[i]);
}
END_TEST

/* job.nonfinite "reject": the first bad element is named, by variable and
 * element index, and nothing of the push is applied. */
START_TEST(nonfinite_rejected) {
  int64_t shape[2] = {4, 2}, one[1] = {3};
  const char *p = "/psd.v1.Data/Push";
  float g[7] = {1, 2, 3, 4, 5, 6, 7}, got[4], b[3];
  declare("w", 2, shape);
  call("/psd.v1.Data/Declare", declare_req("b", 1, one, 0), GRPC_STATUS_OK,
       NULL); /* whole on shard 0 */
  Psd__V1__PushRequest r = PSD__V1__PUSH_REQUEST__INIT;
  Psd__V1__Segment s[2] = {seg("w", 0, 4, 2, shape), seg("b", 0, 3, 1, one)};
  g[5] = NAN;
  call(p, push_req(&r, s, 2, g, 7), GRPC_STATUS_INVALID_ARGUMENT,
       "push to 'b': gradient element 1 (segment 1) is NaN; nothing of this "
       "push was applied (job.nonfinite is \"reject\")");
  g[5] = 6;
  g[2] = INFINITY;
  call(p, push_req(&r, s, 2, g, 7), GRPC_STATUS_INVALID_ARGUMENT,
       "push to 'w': gradient element 2 (segment 0) is +Inf");
  g[2] = -INFINITY;
  s[0] = seg("w", 1, 3, 2, shape);
  call(p, push_req(&r, s, 1, g, 3), GRPC_STATUS_INVALID_ARGUMENT,
       "gradient element 3 (segment 0) is -Inf");
  pull_values("w", 0, 4, got);
  pull_values("b", 0, 3, b);
  for (int i = 0; i < 4; i++)
    ck_assert_float_eq(got[i], 0.0f);
  for (int i = 0; i < 3; i++)
    ck_assert_float_eq(b[i], 0.0f);
  Psd__V1__StatusResponse *st = status();
  ck_assert_uint_eq(st->nonfinite_pushes, 3);
  ck_assert_str_eq(st->nonfinite, "reject");
  ck_assert_uint_eq(st->pushes, 0);
  ck_assert_uint_eq(st->errors, 3);
  ck_assert_uint_eq(st->max_message_bytes, 64 << 20);
  psd__v1__status_response__free_unpacked(st, NULL);
}
END_TEST

/* job.nonfinite "skip": acknowledged, not applied, counted. */
START_TEST(nonfinite_skipped) {
  int64_t shape[1] = {100};
  float g[100] = {0}, got[50];
  struct cm_rpc_answer ans;
  uint8_t *data;
  size_t len;
  psd_service_set_limits(svc,
                         &(struct psd_limits){.max_message = 64 << 20,
                                              .nonfinite = PSD_NONFINITE_SKIP});
  declare("v", 1, shape);
  Psd__V1__PushRequest r = PSD__V1__PUSH_REQUEST__INIT;
  Psd__V1__Segment s = seg("v", 0, 50, 1, shape);
  for (int i = 0; i < 50; i++)
    g[i] = 1;
  g[49] = NAN;
  call_ans("/psd.v1.Data/Push", push_req(&r, &s, 1, g, 50), GRPC_STATUS_OK,
           NULL, &ans);
  ck_assert_int_eq(cm_rpc_readall(ans.response, &data, &len), 0);
  Psd__V1__PushResponse *pr = psd__v1__push_response__unpack(NULL, len, data);
  ck_assert_uint_eq(pr->n_versions, 1);
  ck_assert_uint_eq(pr->versions[0], 0); /* not applied: still version 0 */
  psd__v1__push_response__free_unpacked(pr, NULL);
  free(data);
  cm_rpc_answer_release(&ans);
  pull_values("v", 0, 50, got);
  for (int i = 0; i < 50; i++)
    ck_assert_float_eq(got[i], 0.0f);
  g[49] = 1;
  call("/psd.v1.Data/Push", push_req(&r, &s, 1, g, 50), GRPC_STATUS_OK, NULL);
  pull_values("v", 0, 50, got);
  for (int i = 0; i < 50; i++)
    ck_assert_float_eq(got[i], -1.0f);
  Psd__V1__StatusResponse *st = status();
  ck_assert_uint_eq(st->nonfinite_pushes, 1);
  ck_assert_str_eq(st->nonfinite, "skip");
  ck_assert_uint_eq(st->pushes, 1);
  ck_assert_uint_eq(st->errors, 0);
  psd__v1__status_response__free_unpacked(st, NULL);
}
END_TEST

/* job.nonfinite "apply": applied as it is, and counted. */
START_TEST(nonfinite_applied) {
  int64_t shape[1] = {100};
  float g[50] = {0}, got[50];
  psd_service_set_limits(
      svc, &(struct psd_limits){.max_message = 64 << 20,
                                .nonfinite = PSD_NONFINITE_APPLY});
  declare("v", 1, shape);
  Psd__V1__PushRequest r = PSD__V1__PUSH_REQUEST__INIT;
  Psd__V1__Segment s = seg("v", 0, 50, 1, shape);
  g[3] = NAN;
  g[4] = INFINITY;
  g[5] = 2;
  call("/psd.v1.Data/Push", push_req(&r, &s, 1, g, 50), GRPC_STATUS_OK, NULL);
  pull_values("v", 0, 50, got);
  ck_assert(isnan(got[3]));
  ck_assert(isinf(got[4]) && got[4] < 0);
  ck_assert_float_eq(got[5], -2.0f);
  Psd__V1__StatusResponse *st = status();
  ck_assert_uint_eq(st->nonfinite_pushes, 1);
  ck_assert_str_eq(st->nonfinite, "apply");
  ck_assert_uint_eq(st->pushes, 1);
  psd__v1__status_response__free_unpacked(st, NULL);
}
END_TEST

/* A gradient of many slices over two segments: applied exactly, and a NaN
 * far into the second segment is found, named and refuses it whole. */
START_TEST(push_of_many_blocks) {
  enum { N = 12000, A = 8000 };
  int64_t shape[2] = {6, 4000}; /* rows 0-2 on shard 0: 12000 elements */
  static float g[N], got[N];
  for (int i = 0; i < N; i++)
    g[i] = (float)(i % 7) - 3.0f + (float)i / 65536.0f;
  declare("big", 2, shape);
  Psd__V1__PushRequest r = PSD__V1__PUSH_REQUEST__INIT;
  Psd__V1__Segment s[2] = {seg("big", 0, A, 2, shape),
                           seg("big", A, N - A, 2, shape)};
  call("/psd.v1.Data/Push", push_req(&r, s, 2, g, N), GRPC_STATUS_OK, NULL);
  pull_values("big", 0, N, got);
  for (int i = 0; i < N; i++)
    ck_assert_float_eq(got[i], -g[i]); /* sgd, lr 1, from zeros */
  g[A + 1000] = NAN;
  call("/psd.v1.Data/Push", push_req(&r, s, 2, g, N),
       GRPC_STATUS_INVALID_ARGUMENT,
       "push to 'big': gradient element 9000 (segment 1) is NaN");
  g[A + 1000] = 0.0f;
  pull_values("big", 0, N, got);
  for (int i = 0; i < N; i++)
    ck_assert_float_eq(
        got[i],
        i == A + 1000 ? -((float)(i % 7) - 3.0f + (float)i / 65536.0f) : -g[i]);
}
END_TEST

/* The vectorized scan finds exactly the first NaN or infinity, at every
 * position and length, and no finite value (the largest, the smallest
 * subnormal, negative zero) is taken for one. */
START_TEST(first_nonfinite_matches_a_plain_loop) {
  float g[300] = {0};
  const float bad[3] = {NAN, INFINITY, -INFINITY};
  const float fine[4] = {3.4028235e38f, -3.4028235e38f, 1e-45f, -0.0f};
  for (size_t n = 0; n <= 300; n += (n < 140 ? 1 : 37)) {
    for (size_t i = 0; i < n; i++)
      g[i] = fine[i % 4];
    ck_assert_uint_eq(cm_first_nonfinite(g, n), n);
    for (size_t at = 0; at < n; at++) {
      for (int k = 0; k < 3; k++) {
        g[at] = bad[k];
        ck_assert_uint_eq(cm_first_nonfinite(g, n), at);
        if (at + 70 < n) { /* a second one later changes nothing */
          g[at + 70] = NAN;
          ck_assert_uint_eq(cm_first_nonfinite(g, n), at);
          g[at + 70] = fine[(at + 70) % 4];
        }
      }
      g[at] = fine[at % 4];
    }
  }
}
END_TEST

static Suite *push_suite(void) {
  Suite *s = suite_create("push");
  TCase *tc = service_tcase(s, "async");
  tcase_add_test(tc, push_checks_before_applying);
  tcase_add_test(tc, nonfinite_rejected);
  tcase_add_test(tc, nonfinite_skipped);
  tcase_add_test(tc, nonfinite_applied);
  tcase_add_test(tc, push_of_many_blocks);
  tcase_add_test(tc, first_nonfinite_matches_a_plain_loop);
  return s;
}

int main(void) { return tu_run(push_suite(), 0); }
