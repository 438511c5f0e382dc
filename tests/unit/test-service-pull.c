/* Unit tests for psd.v1.Data/Pull (ps-server/psd/service_pull.c): a pull's
 * segments are checked against this shard's slice and the message limit, and a
 * sync pull parked for the next step is answered when the service stops. The
 * shard and the calls are service_fixture.h's. */
#include <check.h>
#include <stdint.h>

#include "ps.pb-c.h"
#include "rpc_server.h"
#include "service.h"
#include "service_fixture.h"
#include "unit.h"

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
  /* An answer that would not fit in a message. */
  int64_t big[2] = {4096, 4096}; /* 32 MiB here */
  declare("big", 2, big);
  psd_service_set_limits(svc, &(struct psd_limits){.max_message = 4 << 20});
  s = seg("big", 0, 2 << 20, 0, NULL);
  call(p, pull_req(&s, 1, 0), GRPC_STATUS_RESOURCE_EXHAUSTED,
       "pull asks for more than 4190208 bytes in one message");
  s = seg("big", 0, 1 << 19, 0, NULL);
  call(p, pull_req(&s, 1, 0), GRPC_STATUS_OK, NULL);
}
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

  tc = service_tcase(s, "sync");
  tcase_add_test(tc, sync_parked_pull_answered_at_stop);
  return s;
}

int main(void) { return tu_run(pull_suite(), 0); }
