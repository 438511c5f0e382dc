/* Unit tests for psd's data service as a whole (ps-server/psd/shard/service.c,
 * service_checks.c, service_declare.c, service_status.c) and the coordinator's
 * handlers served beside it (coord.c): every class of bad input gets its status
 * and a message naming the field, variable or shape, and changes nothing. The
 * shard and the calls are service_fixture.h's. Pull, push and the sync step
 * have their own suites (test-service-pull.c, test-service-push.c,
 * test-service-commit.c). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps.pb-c.h"
#include "rpc.h"
#include "rpc_server.h"
#include "service.h"
#include "service_fixture.h"
#include "store.h"
#include "unit.h"

/* ---- callers ---- */

static const char *const all_methods[] = {
    "/psd.v1.Data/Declare",    "/psd.v1.Data/Pull",
    "/psd.v1.Data/Push",       "/psd.v1.Data/Commit",
    "/psd.v1.Admin/Status",    "/psd.v1.Coord/Join",
    "/psd.v1.Coord/Heartbeat", "/psd.v1.Coord/Admit",
    "/psd.v1.Coord/Clock",     "/psd.v1.Admin/Checkpoint",
    "/psd.v1.Data/Rollback",   "/psd.v1.Data/SparsePull",
    "/psd.v1.Data/SparsePush", "/psd.v1.Admin/Rows",
    "/psd.v1.Admin/Shrink",    "/psd.v1.Admin/Export"};

/* Every method: an empty message has no caller; a caller of another job is
 * refused naming both jobs; bytes that are not protobuf are malformed. */
START_TEST(caller_missing_wrong_or_malformed) {
  /* field 1 (caller) = {job: "other"} */
  static const uint8_t other[] = {0x0a, 0x07, 0x0a, 0x05, 'o',
                                  't',  'h',  'e',  'r'};
  static const uint8_t junk[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 1, 2};
  for (size_t i = 0; i < sizeof all_methods / sizeof *all_methods; i++) {
    const char *m = all_methods[i];
    call(m, NULL, GRPC_STATUS_INVALID_ARGUMENT, "caller.job is missing");
    /* Commit in an async job is refused for the mode only after the
     * caller; every other method names the other job. */
    call(m, raw(other, sizeof other), GRPC_STATUS_FAILED_PRECONDITION,
         "'other'");
    call(m, raw(junk, sizeof junk), GRPC_STATUS_INVALID_ARGUMENT,
         "malformed protobuf");
  }
}
END_TEST

/* ---- Declare ---- */

START_TEST(declare_checks_every_field) {
  const char *d = "/psd.v1.Data/Declare";
  int64_t five[5] = {1, 1, 1, 1, 1}, neg[2] = {3, -1}, zero[2] = {0, 4},
          big[2] = {1 << 20, 1 << 21}, wrap[2] = {1LL << 62, 4}, ok[2] = {4, 3};
  char long_name[PSD_VAR_MAX_NAME + 2];
  memset(long_name, 'a', sizeof long_name - 1);
  long_name[sizeof long_name - 1] = 0;

  call(d, declare_req("a", 0, ok, -1), GRPC_STATUS_INVALID_ARGUMENT,
       "'a': the shape has 0 dimensions; expected 1..4");
  call(d, declare_req("a", 5, five, -1), GRPC_STATUS_INVALID_ARGUMENT,
       "the shape has 5 dimensions");
  call(d, declare_req("a", 2, neg, -1), GRPC_STATUS_INVALID_ARGUMENT,
       "'a': shape [3, -1]: dimension 1 is -1; expected a positive size");
  call(d, declare_req("a", 2, zero, -1), GRPC_STATUS_INVALID_ARGUMENT,
       "dimension 0 is 0");
  call(d, declare_req("a", 2, big, -1), GRPC_STATUS_INVALID_ARGUMENT,
       "shape [1048576, 2097152] has more than 2^40 elements");
  call(d, declare_req("a", 2, wrap, -1), GRPC_STATUS_INVALID_ARGUMENT,
       "more than 2^40 elements");
  call(d, declare_req("a", 2, ok, 2), GRPC_STATUS_INVALID_ARGUMENT,
       "'a': placement 2; expected -1 (split) or a shard index 0..1");
  call(d, declare_req("a", 2, ok, -2), GRPC_STATUS_INVALID_ARGUMENT,
       "placement -2");
  call(d, declare_req("", 2, ok, -1), GRPC_STATUS_INVALID_ARGUMENT,
       "variable 0: the variable name is 0 bytes long; expected 1..200");
  call(d, declare_req(long_name, 2, ok, -1), GRPC_STATUS_INVALID_ARGUMENT,
       "the variable name is 201 bytes long");
  call(d, declare_req("a\nb", 2, ok, -1), GRPC_STATUS_INVALID_ARGUMENT,
       "control character (0x0a) at byte 1");

  /* init and init_scale */
  Psd__V1__DeclareRequest r = PSD__V1__DECLARE_REQUEST__INIT;
  Psd__V1__VarSpec vs = PSD__V1__VAR_SPEC__INIT, *vp[2] = {&vs, &vs};
  vs.name = "a";
  vs.n_shape = 2;
  vs.shape = ok;
  vs.placement = -1;
  vs.init = 7;
  r.caller = &caller;
  r.n_vars = 1;
  r.vars = vp;
  call(d, cm_rpc_pack(&r.base), GRPC_STATUS_INVALID_ARGUMENT,
       "'a': init 7 is not an Init value");
  vs.init = PSD__V1__INIT__INIT_UNIFORM;
  vs.init_scale = NAN;
  call(d, cm_rpc_pack(&r.base), GRPC_STATUS_INVALID_ARGUMENT,
       "init_scale nan; expected a finite number >= 0");
  vs.init_scale = -1;
  call(d, cm_rpc_pack(&r.base), GRPC_STATUS_INVALID_ARGUMENT, "init_scale -1");

  /* A name twice in one request with different shapes; and a bad second
   * variable: neither request creates anything. */
  Psd__V1__VarSpec v2 = PSD__V1__VAR_SPEC__INIT;
  int64_t other[2] = {4, 4};
  vs.init_scale = 0.1f;
  v2 = vs;
  v2.shape = other;
  vp[1] = &v2;
  r.n_vars = 2;
  call(d, cm_rpc_pack(&r.base), GRPC_STATUS_INVALID_ARGUMENT,
       "'a' is declared twice in one request with different shapes");
  v2.name = "b";
  v2.n_shape = 0;
  call(d, cm_rpc_pack(&r.base), GRPC_STATUS_INVALID_ARGUMENT,
       "'b': the shape has 0 dimensions");
  Psd__V1__StatusResponse *st = status();
  ck_assert_uint_eq(st->n_vars, 0);
  ck_assert_uint_eq(st->errors, 16);
  psd__v1__status_response__free_unpacked(st, NULL);
  /* The same name twice with the same shape is one variable. */
  v2 = vs;
  call(d, cm_rpc_pack(&r.base), GRPC_STATUS_OK, NULL);
  st = status();
  ck_assert_uint_eq(st->n_vars, 1);
  psd__v1__status_response__free_unpacked(st, NULL);
  /* And another shape later is ALREADY_EXISTS naming both. */
  call(d, declare_req("a", 2, other, -1), GRPC_STATUS_ALREADY_EXISTS,
       "'a' already exists with shape [4, 3] placement -1; this declaration "
       "asks for shape [4, 4]");
}
END_TEST

/* A variable the shard cannot hold is refused before any memory is taken. */
START_TEST(declare_beyond_memory) {
  int64_t huge[1] = {1LL << 39}, mib[2] = {512, 1024}, kib[1] = {256};
  call("/psd.v1.Data/Declare", declare_req("huge", 1, huge, -1),
       GRPC_STATUS_RESOURCE_EXHAUSTED,
       "need 1.0 TiB on shard 0 (values and optimizer slots), which holds 0 "
       "B already; its limit is");
  call("/psd.v1.Data/Declare", declare_req("huge", 1, huge, -1),
       GRPC_STATUS_RESOURCE_EXHAUSTED, "(this machine's memory)");
  /* Without a limit, what the machine has free now still counts. */
  psd_service_set_limits(svc, &(struct psd_limits){.max_message = 64 << 20,
                                                   .max_held = UINT64_MAX});
  call("/psd.v1.Data/Declare", declare_req("huge", 1, huge, -1),
       GRPC_STATUS_RESOURCE_EXHAUSTED,
       "need 1.0 TiB on shard 0 (values and optimizer slots), but this "
       "machine has ");
  psd_service_set_limits(
      svc, &(struct psd_limits){.max_message = 64 << 20, .max_held = 1 << 20});
  /* Shard 0 of 2 holds 256 rows of 1024 floats: exactly 1 MiB. */
  declare("m", 2, mib);
  call("/psd.v1.Data/Declare", declare_req("k", 1, kib, 0),
       GRPC_STATUS_RESOURCE_EXHAUSTED,
       "need 1.0 KiB on shard 0 (values and optimizer slots), which holds "
       "1.0 MiB already; its limit is 1.0 MiB");
  /* Placed on the other shard it takes nothing here. */
  call("/psd.v1.Data/Declare", declare_req("k", 1, kib, 1), GRPC_STATUS_OK,
       NULL);
}
END_TEST

/* More segments than any request may carry. */
START_TEST(too_many_segments) {
  int64_t shape[1] = {4};
  declare("w", 1, shape);
  Psd__V1__PullRequest r = PSD__V1__PULL_REQUEST__INIT;
  size_t n = PSD_MAX_SEGMENTS + 1;
  Psd__V1__Segment s = seg("w", 0, 1, 1, shape), **ptr = calloc(n, sizeof *ptr);
  for (size_t i = 0; i < n; i++)
    ptr[i] = &s;
  r.caller = &caller;
  r.n_segments = n;
  r.segments = ptr;
  call("/psd.v1.Data/Pull", cm_rpc_pack(&r.base), GRPC_STATUS_INVALID_ARGUMENT,
       "Pull: 65537 segments in one request; at most 65536");
  Psd__V1__PushRequest pr = PSD__V1__PUSH_REQUEST__INIT;
  pr.caller = &caller;
  pr.n_segments = n;
  pr.segments = ptr;
  call("/psd.v1.Data/Push", cm_rpc_pack(&pr.base), GRPC_STATUS_INVALID_ARGUMENT,
       "Push: 65537 segments");
  free(ptr);
}
END_TEST

/* ---- the coordinator ---- */

START_TEST(coordinator_checks_workers_and_clocks) {
  Psd__V1__JoinRequest j = PSD__V1__JOIN_REQUEST__INIT;
  Psd__V1__HeartbeatRequest h = PSD__V1__HEARTBEAT_REQUEST__INIT;
  Psd__V1__ClockRequest c = PSD__V1__CLOCK_REQUEST__INIT;
  Psd__V1__AdmitRequest a = PSD__V1__ADMIT_REQUEST__INIT;
  j.caller = h.caller = c.caller = a.caller = &caller;
  j.worker = 2;
  call("/psd.v1.Coord/Join", cm_rpc_pack(&j.base), GRPC_STATUS_INVALID_ARGUMENT,
       "Join: worker 2 out of range; cluster.worker has 2 entries");
  h.worker = -1;
  call("/psd.v1.Coord/Heartbeat", cm_rpc_pack(&h.base),
       GRPC_STATUS_INVALID_ARGUMENT, "Heartbeat: worker -1 out of range");
  c.worker = 0;
  c.clock = UINT64_MAX;
  call("/psd.v1.Coord/Clock", cm_rpc_pack(&c.base),
       GRPC_STATUS_INVALID_ARGUMENT,
       "Clock: worker 0 reports clock 18446744073709551615; a clock counts a "
       "worker's pushes and is at most 2^48");
  a.worker = 0;
  call("/psd.v1.Coord/Admit", cm_rpc_pack(&a.base),
       GRPC_STATUS_FAILED_PRECONDITION, "Admit: job 't' is asynchronous");
  j.worker = 1;
  call("/psd.v1.Coord/Join", cm_rpc_pack(&j.base), GRPC_STATUS_OK, NULL);
}
END_TEST

START_TEST(sync_admit_far_ahead) {
  Psd__V1__JoinRequest j = PSD__V1__JOIN_REQUEST__INIT;
  Psd__V1__AdmitRequest a = PSD__V1__ADMIT_REQUEST__INIT;
  j.caller = a.caller = &caller;
  j.worker = 0;
  call("/psd.v1.Coord/Join", cm_rpc_pack(&j.base), GRPC_STATUS_OK, NULL);
  a.worker = 0;
  a.step = 1ULL << 60;
  call("/psd.v1.Coord/Admit", cm_rpc_pack(&a.base),
       GRPC_STATUS_FAILED_PRECONDITION,
       "Admit: step 1152921504606846976 is not open yet (open: 0)");
  a.worker = 9;
  call("/psd.v1.Coord/Admit", cm_rpc_pack(&a.base),
       GRPC_STATUS_INVALID_ARGUMENT, "Admit: worker 9 out of range");
}
END_TEST

/* A heartbeat's answer: rejoin and restarted, as bits 1 and 2. */
static int heartbeat_flags(int worker) {
  Psd__V1__HeartbeatRequest h = PSD__V1__HEARTBEAT_REQUEST__INIT;
  Psd__V1__HeartbeatResponse *r;
  struct cm_rpc_answer ans;
  uint8_t *data = NULL;
  size_t len = 0;
  int flags;
  h.caller = &caller;
  h.worker = worker;
  call_ans("/psd.v1.Coord/Heartbeat", cm_rpc_pack(&h.base), GRPC_STATUS_OK,
           NULL, &ans);
  ck_assert_int_eq(cm_rpc_readall(ans.response, &data, &len), 0);
  r = psd__v1__heartbeat_response__unpack(NULL, len, data);
  ck_assert_ptr_nonnull(r);
  flags = (r->rejoin ? 1 : 0) | (r->restarted ? 2 : 0);
  psd__v1__heartbeat_response__free_unpacked(r, NULL);
  free(data);
  cm_rpc_answer_release(&ans);
  return flags;
}

/* A worker this coordinator never saw join (it restarted since) is asked to
 * join again, and told the coordinator restarted, so that a sync worker
 * joins from its training thread; once joined, neither. */
START_TEST(sync_heartbeat_of_unknown_worker_says_restarted) {
  Psd__V1__JoinRequest j = PSD__V1__JOIN_REQUEST__INIT;
  j.caller = &caller;
  j.worker = 1;
  ck_assert_int_eq(heartbeat_flags(1), 3);
  call("/psd.v1.Coord/Join", cm_rpc_pack(&j.base), GRPC_STATUS_OK, NULL);
  ck_assert_int_eq(heartbeat_flags(1), 0);
}
END_TEST

static Suite *service_suite(void) {
  Suite *s = suite_create("service");
  TCase *tc = service_tcase(s, "async");
  tcase_add_test(tc, caller_missing_wrong_or_malformed);
  tcase_add_test(tc, declare_checks_every_field);
  tcase_add_test(tc, declare_beyond_memory);
  tcase_add_test(tc, too_many_segments);
  tcase_add_test(tc, coordinator_checks_workers_and_clocks);

  tc = service_tcase(s, "sync");
  tcase_add_test(tc, sync_heartbeat_of_unknown_worker_says_restarted);
  tcase_add_test(tc, sync_admit_far_ahead);
  return s;
}

int main(void) { return tu_run(service_suite(), 0); }
