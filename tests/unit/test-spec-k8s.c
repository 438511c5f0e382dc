/* Unit tests for common/spec/k8s.c: the spec derived from a Kubernetes
 * pod's environment as deploy/k8s gives it, for the pods of the shards'
 * Indexed Job and the workers' (hostname JOB-I and JOB_COMPLETION_INDEX I),
 * and for a StatefulSet's shards (hostname SET-I, no index); the mistakes:
 * a hostname of neither, an index out of range or disagreeing with the
 * hostname, a missing count. Then what the frame of resolve.c does for
 * k8s and TF_CONFIG: the derived text, the job file's mistakes reported with
 * the environment's, and the --cluster words that name an engine. */
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
static char *json;

static void teardown(void) {
  cm_spec_free(spec);
  spec = NULL;
  free(json);
  json = NULL;
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

/* The derived spec's text: the cluster, the task, the job file's "job". */
START_TEST(test_derived_text) {
  /* The first of a name is the one read: one worker. */
  char *const shard0[] = {"PSD_K8S_WORKERS=1", POD_ENV, "HOSTNAME=psd-0", NULL};
  const char *path = job_file("k8s", "{\"job\": {\"epochs\": 2}}");

  ck_assert_int_eq(cm_k8s_spec(path, shard0, &spec, &json, err, sizeof err), 0);
  ck_assert_str_eq(json, "{\n"
                         "  \"cluster\": {\n"
                         "    \"ps\": [\n"
                         "      \"psd-0.psd.ml.svc:7100\",\n"
                         "      \"psd-1.psd.ml.svc:7100\"\n"
                         "    ],\n"
                         "    \"worker\": [\n"
                         "      \"psd-worker-0.psd.ml.svc:7200\"\n"
                         "    ]\n"
                         "  },\n"
                         "  \"task\": {\n"
                         "    \"type\": \"ps\",\n"
                         "    \"index\": 0\n"
                         "  },\n"
                         "  \"job\": {\n"
                         "    \"epochs\": 2\n"
                         "  }\n"
                         "}");
  ck_assert_str_eq(spec->source, path);
  ck_assert_int_eq(spec->job.epochs, 2);
  remove_job_file(path);
}
END_TEST

/* The job file's mistakes come with the environment's, all at once. */
START_TEST(test_job_file_mistakes) {
  char *const no_count[] = {"PSD_K8S_SHARDS=2", "HOSTNAME=psd-0", NULL};
  const char *path = job_file("k8s", "{\"cluster\": {}, \"job\": {}}");
  char line[512];

  err[0] = '\0';
  ck_assert_int_eq(cm_k8s_spec(path, no_count, &spec, &json, err, sizeof err),
                   CM_ESPEC);
  ck_assert_ptr_null(spec);
  ck_assert_ptr_null(json);
  snprintf(line, sizeof line,
           "%s: cluster: not allowed with --cluster k8s, which derives it "
           "from the pod's environment; keep only \"job\" and \"auth\"",
           path);
  has_line(line);
  has_line("PSD_K8S_WORKERS: not set; expected an integer in 1..65536 "
           "(deploy/k8s sets it from the replica counts)");
  ck_assert_int_eq(count_lines(err), 2);
  remove_job_file(path);

  path = job_file("k8s", "[1]");
  ck_assert_int_eq(cm_k8s_spec(path, no_count, &spec, NULL, err, sizeof err),
                   CM_ESPEC);
  snprintf(line, sizeof line,
           "%s: expected a JSON object with \"job\" (and \"auth\")", path);
  has_line(line);
  remove_job_file(path);

  ck_assert_int_eq(cm_k8s_spec("/nonexistent/job.json", no_count, &spec, NULL,
                               err, sizeof err),
                   CM_ENOENT);
  ck_assert_str_eq(err, "/nonexistent/job.json: No such file or directory");
}
END_TEST

/* Kubeflow's TF_CONFIG with a job file: the chief folded into the workers
 * in the text psd runs, the source named after both. */
START_TEST(test_tf_config) {
  const char *tf = "{\"cluster\": {\"chief\": [\"c:1\"], \"ps\": [\"p:1\"], "
                   "\"worker\": [\"w:1\"]}, \"task\": {\"type\": \"worker\", "
                   "\"index\": 0}, \"environment\": \"cloud\"}";
  const char *path =
      job_file("k8s", "{\"job\": {\"epochs\": 2}, \"task\": {}}");
  char line[512];

  err[0] = '\0';
  ck_assert_int_eq(cm_tf_config_spec(path, tf, &spec, &json, err, sizeof err),
                   CM_ESPEC);
  snprintf(line, sizeof line,
           "%s: task: not allowed with --cluster tf_config, which derives it "
           "from the pod's environment; keep only \"job\" and \"auth\"",
           path);
  has_line(line);
  remove_job_file(path);

  path = job_file("k8s", "{\"job\": {\"epochs\": 2}}");
  ck_assert_int_eq(cm_tf_config_spec(path, tf, &spec, &json, err, sizeof err),
                   0);
  snprintf(line, sizeof line, "TF_CONFIG with %s", path);
  ck_assert_str_eq(spec->source, line);
  ck_assert_str_eq(json, "{\n"
                         "  \"cluster\": {\n"
                         "    \"ps\": [\n"
                         "      \"p:1\"\n"
                         "    ],\n"
                         "    \"worker\": [\n"
                         "      \"c:1\",\n"
                         "      \"w:1\"\n"
                         "    ]\n"
                         "  },\n"
                         "  \"task\": {\n"
                         "    \"type\": \"worker\",\n"
                         "    \"index\": 1\n"
                         "  },\n"
                         "  \"job\": {\n"
                         "    \"epochs\": 2\n"
                         "  }\n"
                         "}");
  remove_job_file(path);
  teardown();

  ck_assert_int_eq(cm_tf_config_spec(NULL, "", &spec, &json, err, sizeof err),
                   CM_ESPEC);
  ck_assert_str_eq(err, "TF_CONFIG: not set; --cluster tf_config takes the "
                        "cluster and the task from it (Kubeflow's TFJob sets "
                        "it)");
  ck_assert_int_eq(
      cm_tf_config_spec(NULL, "[1]", &spec, &json, err, sizeof err), CM_ESPEC);
  ck_assert_str_eq(err, "TF_CONFIG: expected a JSON object with \"cluster\"");
  ck_assert_int_eq(cm_tf_config_spec(NULL, "{", &spec, &json, err, sizeof err),
                   CM_ESPEC);
  has_text("TF_CONFIG:1:1: JSON syntax error:");
  ck_assert_ptr_null(spec);
  ck_assert_ptr_null(json);
}
END_TEST

/* The --cluster arguments that name an engine, and those that name a file. */
START_TEST(test_engine_words) {
  static const char *const engines[] = {"slurm",     "slurm:job.json",
                                        "k8s",       "k8s:job.json",
                                        "tf_config", "tf_config:job.json"};
  static const char *const files[] = {"./k8s",      "k8sy.json",
                                      "tf_configs", "slurmy.json",
                                      "job.json",   "kubernetes:job.json"};

  for (size_t i = 0; i < sizeof engines / sizeof engines[0]; i++)
    ck_assert_msg(cm_spec_is_engine(engines[i]), "%s", engines[i]);
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)
    ck_assert_msg(!cm_spec_is_engine(files[i]), "%s", files[i]);
  ck_assert(!cm_spec_is_engine(NULL));
}
END_TEST

int main(void) {
  Suite *s = suite_create("spec-k8s");
  TCase *tc = tcase_create("core");

  tcase_add_checked_fixture(tc, NULL, teardown);
  tcase_add_test(tc, test_indexed_job_pods);
  tcase_add_test(tc, test_hostname_forms);
  tcase_add_test(tc, test_mistakes);
  tcase_add_test(tc, test_derived_text);
  tcase_add_test(tc, test_job_file_mistakes);
  tcase_add_test(tc, test_tf_config);
  tcase_add_test(tc, test_engine_words);
  suite_add_tcase(s, tc);
  return tu_run(s, 0);
}
