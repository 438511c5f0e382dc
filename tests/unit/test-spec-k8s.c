/* Unit tests for common/spec/k8s.c: the spec derived from a Kubernetes
 * pod's environment as deploy/k8s gives it, for the pods of the shards'
 * Indexed Job and the workers' (hostname JOB-I and JOB_COMPLETION_INDEX I),
 * and for a StatefulSet's shards (hostname SET-I, no index); the mistakes:
 * a hostname of neither, an index out of range or disagreeing with the
 * hostname, a missing count. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "k8s.h"
#include "spec.h"
#include "spec_fixture.h"
#include "unit.h"

/* The environment both Jobs' pods share (deploy/k8s), and the pod's own
 * hostname and index after it. */
#define POD_ENV                                                                \
  "PSD_K8S_SHARDS=2", "PSD_K8S_WORKERS=3", "PSD_K8S_SERVICE=psd",              \
      "PSD_K8S_SHARD_SET=psd", "PSD_K8S_WORKER_JOB=psd-worker",                \
      "PSD_K8S_PORT=7100", "POD_NAMESPACE=ml"

static struct cm_spec *spec;

static void teardown(void) {
  cm_spec_free(spec);
  spec = NULL;
}

/* Derives from env, expecting CM_ESPEC and no spec. */
static void derive_bad(char *const *env) {
  err[0] = '\0';
  ck_assert_int_eq(cm_k8s_spec(NULL, env, &spec, NULL, err, sizeof err),
                   CM_ESPEC);
  ck_assert_ptr_null(spec);
}

START_TEST(test_indexed_job_pods) {
  char *const shard1[] = {POD_ENV, "HOSTNAME=psd-1", "JOB_COMPLETION_INDEX=1",
                          NULL};
  char *const worker2[] = {POD_ENV, "HOSTNAME=psd-worker-2",
                           "JOB_COMPLETION_INDEX=2", NULL};

  ck_assert_int_eq(cm_k8s_spec(NULL, shard1, &spec, NULL, err, sizeof err), 0);
  ck_assert_str_eq(addrs(spec->ps, spec->nps),
                   "psd-0.psd.ml.svc:7100 psd-1.psd.ml.svc:7100");
  ck_assert_str_eq(addrs(spec->worker, spec->nworker),
                   "psd-worker-0.psd.ml.svc:7200 psd-worker-1.psd.ml.svc:7200 "
                   "psd-worker-2.psd.ml.svc:7200");
  ck_assert_int_eq(spec->task.type, CM_TASK_PS);
  ck_assert_int_eq(spec->task.index, 1);
  teardown();
  ck_assert_int_eq(cm_k8s_spec(NULL, worker2, &spec, NULL, err, sizeof err), 0);
  ck_assert_int_eq(spec->task.type, CM_TASK_WORKER);
  ck_assert_int_eq(spec->task.index, 2);
}
END_TEST

START_TEST(test_hostname_forms) {
  /* A StatefulSet's shard: no index, the ordinal in the hostname. */
  char *const sts[] = {POD_ENV, "HOSTNAME=psd-1.psd.ml.svc.cluster.local",
                       NULL};
  /* A pod's name rather than its hostname: a random suffix. */
  char *const podname[] = {POD_ENV, "HOSTNAME=psd-worker-1-x7k2p",
                           "JOB_COMPLETION_INDEX=1", NULL};
  /* One name extends the other: the longer one is meant. */
  char *const nested[] = {"PSD_K8S_SHARDS=2",      "PSD_K8S_WORKERS=2",
                          "PSD_K8S_SHARD_SET=job", "PSD_K8S_WORKER_JOB=job-1",
                          "HOSTNAME=job-1-0",      "JOB_COMPLETION_INDEX=0",
                          "POD_NAMESPACE=default", NULL};

  ck_assert_int_eq(cm_k8s_spec(NULL, sts, &spec, NULL, err, sizeof err), 0);
  ck_assert_int_eq(spec->task.type, CM_TASK_PS);
  ck_assert_int_eq(spec->task.index, 1);
  teardown();
  ck_assert_int_eq(cm_k8s_spec(NULL, podname, &spec, NULL, err, sizeof err), 0);
  ck_assert_int_eq(spec->task.type, CM_TASK_WORKER);
  ck_assert_int_eq(spec->task.index, 1);
  teardown();
  ck_assert_int_eq(cm_k8s_spec(NULL, nested, &spec, NULL, err, sizeof err), 0);
  ck_assert_int_eq(spec->task.type, CM_TASK_WORKER);
  ck_assert_int_eq(spec->task.index, 0);
}
END_TEST

START_TEST(test_mistakes) {
  char *const web[] = {POD_ENV, "HOSTNAME=web-0", "JOB_COMPLETION_INDEX=0",
                       NULL};
  char *const range[] = {POD_ENV, "HOSTNAME=psd-2", "JOB_COMPLETION_INDEX=2",
                         NULL};
  char *const disagree[] = {POD_ENV, "HOSTNAME=psd-worker-0",
                            "JOB_COMPLETION_INDEX=1", NULL};
  char *const ordinal[] = {POD_ENV, "HOSTNAME=psd-worker-3", NULL};
  char *const no_count[] = {"PSD_K8S_SHARDS=2", "HOSTNAME=psd-0", NULL};

  derive_bad(web);
  has_line("this pod is neither a shard nor a worker: its hostname \"web-0\" "
           "is neither psd-I for I in 0..1 (PSD_K8S_SHARD_SET, "
           "PSD_K8S_SHARDS) nor psd-worker-I for I in 0..2 "
           "(PSD_K8S_WORKER_JOB, PSD_K8S_WORKERS)");
  derive_bad(range);
  has_line("JOB_COMPLETION_INDEX=2: expected an integer in 0..1");
  has_line("JOB_COMPLETION_INDEX: this Indexed Job's pod must be one of the "
           "PSD_K8S_SHARDS=2 shards");
  derive_bad(disagree);
  has_line("JOB_COMPLETION_INDEX=1, but the hostname \"psd-worker-0\" says 0 "
           "(an Indexed Job names its pod JOB-INDEX)");
  derive_bad(ordinal);
  has_line("hostname \"psd-worker-3\": worker:3 is not one of the "
           "PSD_K8S_WORKERS=3 workers (0..2)");
  derive_bad(no_count);
  has_line("PSD_K8S_WORKERS: not set; expected an integer in 1..65536 "
           "(deploy/k8s sets it from the replica counts)");
}
END_TEST

int main(void) {
  Suite *s = suite_create("spec-k8s");
  TCase *tc = tcase_create("core");

  tcase_add_checked_fixture(tc, NULL, teardown);
  tcase_add_test(tc, test_indexed_job_pods);
  tcase_add_test(tc, test_hostname_forms);
  tcase_add_test(tc, test_mistakes);
  suite_add_tcase(s, tc);
  return tu_run(s, 0);
}
