/* Unit tests for common/rpc/request.c, the one way a handler takes its
 * request, on a handler of its own run with cm_rpc_call_local: the caller's
 * job, and for a server that says who it is (cm_request_self), the spec's
 * fingerprint (a mismatch names both specs' counts; 0 is not checked) and
 * the boot id (a caller of an earlier process is refused unless this one
 * resumed from a checkpoint; the words depend on the checkpoint dir). */
#include <check.h>
#include <string.h>

#include "layout.h"
#include "ps.pb-c.h"
#include "request.h"
#include "rpc.h"
#include "rpc_server.h"
#include "unit.h"

#define FP 0x1234abcd5678ef00ull
#define BOOT 0x77aa55cc33ee11ddull

static struct cm_request_self self;
static struct cm_request_host host;

/* Answers OK when cm_request_open takes the request. */
static void on_status(struct cm_rpc_call *call, grpc_byte_buffer *bb,
                      void *ctx) {
  ProtobufCMessage *msg = cm_request_open(
      ctx, call, bb, &psd__v1__status_request__descriptor, "Status", NULL);
  if (msg)
    cm_rpc_reply(call, NULL);
  cm_request_free(msg);
}

static void setup(void) {
  cm_rpc_global_init();
  self = (struct cm_request_self){.shard = 0,
                                  .spec_fp = FP,
                                  .nps = 1,
                                  .nworkers = 2,
                                  .boot = BOOT,
                                  .resumed = 0,
                                  .ckpt_dir = ""};
  cm_request_host_init(&host, "demo", "shard", "shard %d", 0);
  host.self = &self;
}

static void teardown(void) { cm_rpc_global_shutdown(); }

/* Sends a Status request of job `job` from worker `who` with the given
 * fingerprint, counts and boot; expects code and, unless NULL, want in the
 * message. */
static void expect_job(const char *job, const char *who, uint64_t fp, int nps,
                       int nworkers, uint64_t boot, grpc_status_code code,
                       const char *want) {
  struct cm_rpc_method m = {"/psd.v1.Admin/Status", on_status, &host};
  Psd__V1__Caller caller = PSD__V1__CALLER__INIT;
  Psd__V1__StatusRequest req = PSD__V1__STATUS_REQUEST__INIT;
  struct cm_rpc_answer ans;
  caller.job = (char *)job;
  caller.worker = (char *)who;
  caller.spec_fp = fp;
  caller.spec_ps = nps;
  caller.spec_workers = nworkers;
  caller.boot = boot;
  req.caller = &caller;
  grpc_byte_buffer *bb = cm_rpc_pack(&req.base);
  ck_assert_int_eq(cm_rpc_call_local(&m, bb, &ans), 0);
  grpc_byte_buffer_destroy(bb);
  ck_assert(ans.answered);
  ck_assert_msg(ans.status == code, "%s (%s), expected %s",
                cm_rpc_status_name(ans.status), ans.details,
                cm_rpc_status_name(code));
  if (want)
    ck_assert_msg(strstr(ans.details, want), "\"%s\" lacks \"%s\"", ans.details,
                  want);
  cm_rpc_answer_release(&ans);
}

/* The same, of this server's job. */
static void expect(const char *who, uint64_t fp, int nps, int nworkers,
                   uint64_t boot, grpc_status_code code, const char *want) {
  expect_job("demo", who, fp, nps, nworkers, boot, code, want);
}

/* Answers OK when cm_request_open takes a Declare (a Data call). */
static void on_declare(struct cm_rpc_call *call, grpc_byte_buffer *bb,
                       void *ctx) {
  ProtobufCMessage *msg = cm_request_open(
      ctx, call, bb, &psd__v1__declare_request__descriptor, "Declare", NULL);
  if (msg)
    cm_rpc_reply(call, NULL);
  cm_request_free(msg);
}

/* A Declare planned for layout 0 of 2 shards with rows by `rows`, to a
 * shard of layout 0 of 2 placing rows by buckets. */
static void expect_rows(int rows, grpc_status_code code, const char *want) {
  struct cm_rpc_method m = {"/psd.v1.Data/Declare", on_declare, &host};
  Psd__V1__Caller caller = PSD__V1__CALLER__INIT;
  Psd__V1__DeclareRequest req = PSD__V1__DECLARE_REQUEST__INIT;
  struct cm_rpc_answer ans;
  host.check_layout = 1;
  self.nshards = 2;
  self.rows = CM_LAYOUT_RULE_BUCKETS;
  caller.job = "demo";
  caller.worker = "worker:0";
  caller.shards = 2;
  caller.rows = rows;
  req.caller = &caller;
  grpc_byte_buffer *bb = cm_rpc_pack(&req.base);
  ck_assert_int_eq(cm_rpc_call_local(&m, bb, &ans), 0);
  grpc_byte_buffer_destroy(bb);
  ck_assert(ans.answered);
  ck_assert_msg(ans.status == code, "%s (%s)", cm_rpc_status_name(ans.status),
                ans.details);
  if (want)
    ck_assert_msg(strstr(ans.details, want), "\"%s\" lacks \"%s\"", ans.details,
                  want);
  cm_rpc_answer_release(&ans);
}

/* A Data call planned by another rule for rows is "layout moved", naming
 * both rules; one by the same rule, or by none said, is taken. */
START_TEST(rows_rule_is_part_of_the_layout) {
  expect_rows(CM_LAYOUT_RULE_BUCKETS, GRPC_STATUS_OK, NULL);
  expect_rows(0, GRPC_STATUS_OK, NULL);
  expect_rows(CM_LAYOUT_RULE_MODULO, GRPC_STATUS_FAILED_PRECONDITION,
              "layout moved: ps:0 holds layout 0 of 2 shards, rows by "
              "buckets; Declare was planned for layout 0 of 2 shards, rows "
              "by modulo");
}
END_TEST

START_TEST(same_spec_or_none_is_taken) {
  expect("worker:0", FP, 1, 2, 0, GRPC_STATUS_OK, NULL);
  /* An older or foreign client sends no fingerprint. */
  expect("worker:0", 0, 0, 0, 0, GRPC_STATUS_OK, NULL);
  /* A server that does not say who it is checks the job only. */
  host.self = NULL;
  expect("worker:0", FP + 1, 2, 2, BOOT + 1, GRPC_STATUS_OK, NULL);
}
END_TEST

START_TEST(other_spec_is_refused_naming_both) {
  expect("worker:0", FP + 1, 2, 2, 0, GRPC_STATUS_FAILED_PRECONDITION,
         "the worker's and the shard's cluster specs differ: worker:0's spec "
         "lists 2 shards and 2 workers, ps:0's lists 1 shard and 2 workers "
         "(job 'demo'); start every task from the same spec");
  /* The same counts at other addresses. */
  expect("psctl", FP + 1, 1, 2, 0, GRPC_STATUS_FAILED_PRECONDITION,
         "the caller's and the shard's cluster specs differ: psctl's spec "
         "lists 1 shard and 2 workers, ps:0's lists 1 shard and 2 workers "
         "too, at other addresses");
  expect("coordinator", FP + 1, 1, 1, 0, GRPC_STATUS_FAILED_PRECONDITION,
         "the coordinator's and the shard's");
}
END_TEST

START_TEST(caller_of_an_earlier_process_is_refused_unless_resumed) {
  expect("worker:1", FP, 1, 2, BOOT, GRPC_STATUS_OK, NULL);
  /* No boot: an admin tool, the coordinator, before a declare. */
  expect("worker:1", FP, 1, 2, 0, GRPC_STATUS_OK, NULL);
  expect("worker:1", FP, 1, 2, BOOT + 1, GRPC_STATUS_FAILED_PRECONDITION,
         "ps:0 restarted without a checkpoint: the parameters worker:1 "
         "trained there are lost (this is a new psd process that started "
         "from nothing); set job.checkpoint.dir in the spec so that a "
         "restarted shard resumes from its newest checkpoint");
  self.ckpt_dir = "/var/lib/psd/demo/ps-0";
  expect("worker:1", FP, 1, 2, BOOT + 1, GRPC_STATUS_FAILED_PRECONDITION,
         "(this is a new psd process, and it found no checkpoint in "
         "/var/lib/psd/demo/ps-0); a restarted shard resumes from the newest "
         "checkpoint in job.checkpoint.dir");
  /* Resumed from a checkpoint: it holds the job's values; go on. */
  self.resumed = 1;
  expect("worker:1", FP, 1, 2, BOOT + 1, GRPC_STATUS_OK, NULL);
}
END_TEST

START_TEST(spec_is_checked_before_boot_and_job_first) {
  expect("worker:1", FP + 1, 2, 2, BOOT + 1, GRPC_STATUS_FAILED_PRECONDITION,
         "cluster specs differ");
  /* Another job is said as such, whatever else differs. */
  expect_job("other", "worker:1", FP + 1, 2, 2, BOOT + 1,
             GRPC_STATUS_FAILED_PRECONDITION,
             "Status for job 'other' reached shard 0 of job 'demo'");
}
END_TEST

static Suite *request_suite(void) {
  Suite *s = suite_create("request");
  TCase *tc = tcase_create("caller");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, same_spec_or_none_is_taken);
  tcase_add_test(tc, other_spec_is_refused_naming_both);
  tcase_add_test(tc, caller_of_an_earlier_process_is_refused_unless_resumed);
  tcase_add_test(tc, spec_is_checked_before_boot_and_job_first);
  tcase_add_test(tc, rows_rule_is_part_of_the_layout);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(request_suite(), 0); }
