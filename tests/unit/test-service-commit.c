/* Unit tests for where a closed sync step is applied
 * (ps-server/psd/shard/service_commit.c): a
 * Commit's worker sets are checked, a commit applies what was staged and
 * answers the pulls parked for it, a late push is ABORTED, a Rollback never
 * takes the generation back, and an async shard refuses Commit (with the
 * saver's Checkpoint call, off without a checkpoint dir). The shard and the
 * calls are service_fixture.h's. */
#include <check.h>
#include <math.h>
#include <stdint.h>

#include "ps.pb-c.h"
#include "rpc.h"
#include "rpc_server.h"
#include "service_fixture.h"
#include "unit.h"

/* ---- sync: staging, commits, parked pulls ---- */

START_TEST(sync_push_late_ahead_and_nonfinite) {
  int64_t shape[1] = {8}; /* shard 0 holds elements [0, 4) */
  const char *p = "/psd.v1.Data/Push", *c = "/psd.v1.Data/Commit";
  float g[4] = {1, 2, 3, 4}, got[4];
  declare("s", 1, shape);
  Psd__V1__PushRequest r = PSD__V1__PUSH_REQUEST__INIT;
  Psd__V1__Segment s = seg("s", 0, 4, 1, shape);
  Psd__V1__CommitRequest cr = PSD__V1__COMMIT_REQUEST__INIT;
  int32_t applied[3] = {0, 1, 0}, dropped[2] = {1, 5};

  /* The worker index must exist, with or without has_worker. */
  r.worker = 2;
  call(p, push_req(&r, &s, 1, g, 4), GRPC_STATUS_INVALID_ARGUMENT,
       "Push: worker 2 out of range; cluster.worker has 2 entries");
  r.worker = 0;
  r.step = 3;
  call(p, push_req(&r, &s, 1, g, 4), GRPC_STATUS_FAILED_PRECONDITION,
       "push to 's' for step 3 from worker 0: this shard has committed 0 "
       "steps (the open step is 0)");
  /* NaN in a staged gradient: refused, nothing staged. */
  r.step = 0;
  g[1] = NAN;
  call(p, push_req(&r, &s, 1, g, 4), GRPC_STATUS_INVALID_ARGUMENT,
       "push to 's': gradient element 1 (segment 0) is NaN");
  g[1] = 2;

  /* Commit's sets: range, duplicates, both applied and dropped. */
  cr.caller = &caller;
  cr.step = 0;
  cr.applied = applied;
  cr.dropped = dropped;
  cr.n_applied = 3;
  call(c, cm_rpc_pack(&cr.base), GRPC_STATUS_INVALID_ARGUMENT,
       "Commit of step 0: 3 workers in applied; the job has 2");
  cr.n_applied = 2;
  applied[1] = 0;
  call(c, cm_rpc_pack(&cr.base), GRPC_STATUS_INVALID_ARGUMENT,
       "Commit of step 0: worker 0 is listed twice in applied");
  applied[1] = 7;
  call(c, cm_rpc_pack(&cr.base), GRPC_STATUS_INVALID_ARGUMENT,
       "worker 7 in applied is out of range; cluster.worker has 2 entries");
  cr.n_applied = 1;
  cr.n_dropped = 2;
  call(c, cm_rpc_pack(&cr.base), GRPC_STATUS_INVALID_ARGUMENT,
       "worker 5 in dropped is out of range");
  dropped[0] = 0;
  cr.n_dropped = 1;
  call(c, cm_rpc_pack(&cr.base), GRPC_STATUS_INVALID_ARGUMENT,
       "worker 0 is listed both in applied and in dropped");
  cr.step = 5;
  cr.n_dropped = 0;
  call(c, cm_rpc_pack(&cr.base), GRPC_STATUS_FAILED_PRECONDITION,
       "commit of step 5: this shard has committed only 0 steps");

  /* A pull too far ahead is refused; one step ahead is parked until the
   * commit; the commit applies worker 0's gradient (the NaN one was never
   * staged: the values are -g). */
  Psd__V1__Segment ps = seg("s", 0, 4, 0, NULL);
  call("/psd.v1.Data/Pull", pull_req(&ps, 1, 2),
       GRPC_STATUS_FAILED_PRECONDITION,
       "Pull: version 2 asked for, but shard 0 has committed 0 steps");
  struct cm_rpc_answer parked;
  grpc_byte_buffer *bb = pull_req(&ps, 1, 1);
  ck_assert_int_eq(cm_rpc_call_local(method("/psd.v1.Data/Pull"), bb, &parked),
                   0);
  grpc_byte_buffer_destroy(bb);
  ck_assert_int_eq(parked.answered, 0);
  call(p, push_req(&r, &s, 1, g, 4), GRPC_STATUS_OK, NULL);
  call(c, cm_rpc_pack(&cr.base), GRPC_STATUS_FAILED_PRECONDITION, NULL);
  cr.step = 0;
  call(c, cm_rpc_pack(&cr.base), GRPC_STATUS_OK, NULL);
  ck_assert_int_eq(parked.answered, 1);
  ck_assert_int_eq(parked.status, GRPC_STATUS_OK);
  cm_rpc_answer_release(&parked);
  pull_values("s", 0, 4, got);
  for (int i = 0; i < 4; i++)
    ck_assert_float_eq(got[i], -g[i]);

  /* A push for the closed step 0: ABORTED, naming the step and the open
   * one; nothing staged, so committing step 1 changes nothing. */
  call(p, push_req(&r, &s, 1, g, 4), GRPC_STATUS_ABORTED,
       "push to 's' for step 0 from worker 0: step 0 is already closed (this "
       "shard has committed 1 steps; the open step is 1); the gradient is "
       "dropped");
  cr.step = 1;
  call(c, cm_rpc_pack(&cr.base), GRPC_STATUS_OK, NULL);
  pull_values("s", 0, 4, got);
  for (int i = 0; i < 4; i++)
    ck_assert_float_eq(got[i], -g[i]);
}
END_TEST

/* Data/Rollback: a retry at the step the shard is at is answered OK; one
 * that would take the generation back is refused; a real one needs the
 * checkpoints this shard does not keep. */
static grpc_byte_buffer *rollback_req(uint64_t step, uint64_t gen) {
  Psd__V1__RollbackRequest r = PSD__V1__ROLLBACK_REQUEST__INIT;
  r.caller = &caller;
  r.step = step;
  r.gen = gen;
  return cm_rpc_pack(&r.base);
}

START_TEST(sync_rollback_checks_generation) {
  call("/psd.v1.Data/Rollback", rollback_req(0, 0), GRPC_STATUS_OK, NULL);
  call("/psd.v1.Data/Rollback", rollback_req(5, 0),
       GRPC_STATUS_FAILED_PRECONDITION,
       "Rollback to step 5 in generation 0: shard 0 is at generation 0 "
       "already");
  call("/psd.v1.Data/Rollback", rollback_req(5, 1),
       GRPC_STATUS_FAILED_PRECONDITION, "cannot:");
}
END_TEST

START_TEST(checkpoint_off_and_commit_in_async) {
  Psd__V1__CheckpointRequest k = PSD__V1__CHECKPOINT_REQUEST__INIT;
  Psd__V1__CommitRequest c = PSD__V1__COMMIT_REQUEST__INIT;
  k.caller = c.caller = &caller;
  call("/psd.v1.Admin/Checkpoint", cm_rpc_pack(&k.base),
       GRPC_STATUS_FAILED_PRECONDITION, NULL);
  call("/psd.v1.Data/Commit", cm_rpc_pack(&c.base),
       GRPC_STATUS_FAILED_PRECONDITION,
       "Commit: shard 0 runs an asynchronous job");
}
END_TEST

static Suite *commit_suite(void) {
  Suite *s = suite_create("commit");
  TCase *tc = service_tcase(s, "async");
  tcase_add_test(tc, checkpoint_off_and_commit_in_async);

  tc = service_tcase(s, "sync");
  tcase_add_test(tc, sync_push_late_ahead_and_nonfinite);
  tcase_add_test(tc, sync_rollback_checks_generation);
  return s;
}

int main(void) { return tu_run(commit_suite(), 0); }
