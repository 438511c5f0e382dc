/* Unit tests for common/spec/slurm.c: the spec derived from recorded Slurm
 * environments (a job step over several nodes, a batch script outside any
 * step), with the job file's settings and the environment's overrides, and
 * the mistakes of each: missing and malformed variables named with their
 * value, a cyclic layout, a job file that gives the cluster. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* setenv under -std=c11 */
#endif

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "err.h"
#include "slurm.h"
#include "spec.h"
#include "spec_fixture.h"
#include "unit.h"

/* What srun gives task 3 of `srun -N4 -n7 -m block` on four nodes. */
static char *const step_env[] = {"SLURM_JOB_ID=42",
                                 "SLURM_JOB_NODELIST=node[009-011],gpu5",
                                 "SLURM_TASKS_PER_NODE=2(x3),1",
                                 "SLURM_STEP_ID=0",
                                 "SLURM_STEP_NODELIST=node[009-011],gpu5",
                                 "SLURM_STEP_TASKS_PER_NODE=2(x3),1",
                                 "SLURM_STEP_NUM_TASKS=7",
                                 "SLURM_PROCID=3",
                                 "SLURM_NODEID=1",
                                 "SLURM_LOCALID=1",
                                 "PSD_SLURM_PS=2",
                                 NULL};

/* What sbatch gives its batch script (no step): the job's own lists. */
static char *const batch_env[] = {"SLURM_JOB_ID=43",
                                  "SLURM_JOB_NODELIST=a[1-2],b5",
                                  "SLURM_TASKS_PER_NODE=1(x2),2",
                                  "SLURM_PROCID=0",
                                  "SLURM_NODEID=0",
                                  NULL};

static struct cm_spec *spec;
static char *json;

static void teardown(void) {
  cm_spec_free(spec);
  spec = NULL;
  free(json);
  json = NULL;
}

/* Derives with envp and file, expecting CM_ESPEC and no spec. */
static void derive_bad(const char *file, char *const *envp) {
  int rc = cm_slurm_spec(file, envp, &spec, &json, err, sizeof err);

  ck_assert_msg(rc == CM_ESPEC, "rc %d, err: %s", rc, err);
  ck_assert_ptr_null(spec);
  ck_assert_ptr_null(json);
}

START_TEST(test_step_layout) {
  struct cm_spec *again = NULL;

  ck_assert_int_eq(cm_slurm_spec(NULL, step_env, &spec, &json, err, sizeof err),
                   0);
  ck_assert_int_eq(spec->nps, 2);
  ck_assert_str_eq(addrs(spec->ps, spec->nps), "node009:7100 node009:7101");
  ck_assert_str_eq(addrs(spec->worker, spec->nworker),
                   "node010:7100 node010:7101 node011:7100 node011:7101 "
                   "gpu5:7100");
  /* SLURM_PROCID 3 is the second worker. */
  ck_assert_int_eq(spec->task.type, CM_TASK_WORKER);
  ck_assert_int_eq(spec->task.index, 1);
  ck_assert_str_eq(spec->source, "slurm");
  ck_assert_str_eq(spec->job.name, "psd-job");
  /* The printed spec is a spec file of its own, with the same cluster. */
  ck_assert_int_eq(
      cm_spec_parse(json, strlen(json), "p.json", &again, err, sizeof err), 0);
  ck_assert_str_eq(addrs(again->worker, again->nworker),
                   addrs(spec->worker, spec->nworker));
  ck_assert_int_eq(again->task.index, 1);
  ck_assert_uint_eq(cm_spec_fingerprint(again), cm_spec_fingerprint(spec));
  cm_spec_free(again);
}
END_TEST

START_TEST(test_batch_layout) {
  ck_assert_int_eq(cm_slurm_spec(NULL, batch_env, &spec, NULL, err, sizeof err),
                   0);
  ck_assert_str_eq(addrs(spec->ps, spec->nps), "a1:7100");
  ck_assert_str_eq(addrs(spec->worker, spec->nworker),
                   "a2:7100 b5:7100 b5:7101");
  ck_assert_int_eq(spec->task.type, CM_TASK_PS);
  ck_assert_int_eq(spec->task.index, 0);
}
END_TEST

START_TEST(test_job_file) {
  const char *path = job_file(
      "slurm",
      "{\"job\": {\"name\": \"slurm-mlp\", \"epochs\": 2, \"checkpoint\": "
      "{\"dir\": \"ck\"}}, \"slurm\": {\"ps\": 1, \"port\": 9000}}");
  char *const env[] = {"SLURM_JOB_NODELIST=a[1-2],b5",
                       "SLURM_TASKS_PER_NODE=1(x2),2", "SLURM_PROCID=2",
                       "PSD_SLURM_PORT=9100", NULL};
  const char *dir;

  ck_assert_int_eq(cm_slurm_spec(path, env, &spec, &json, err, sizeof err), 0);
  ck_assert_str_eq(spec->job.name, "slurm-mlp");
  ck_assert_int_eq(spec->job.epochs, 2);
  /* PSD_SLURM_PORT wins over slurm.port; slurm.ps is the file's. */
  ck_assert_str_eq(addrs(spec->ps, spec->nps), "a1:9100");
  ck_assert_str_eq(addrs(spec->worker, spec->nworker),
                   "a2:9100 b5:9100 b5:9101");
  ck_assert_int_eq(spec->task.type, CM_TASK_WORKER);
  ck_assert_int_eq(spec->task.index, 1);
  /* A relative path is the file's directory's, as with any spec file. */
  dir = spec->job.ckpt_dir;
  ck_assert_msg(dir[0] == '/' && strstr(dir, "/test-slurm-") &&
                    strcmp(strrchr(dir, '/'), "/ck") == 0,
                "%s", dir);
  ck_assert_ptr_nonnull(strstr(json, "\"slurm-mlp\""));
  ck_assert_ptr_null(strstr(json, "\"slurm\""));
  remove_job_file(path);
}
END_TEST

START_TEST(test_file_mistakes) {
  const char *path = job_file(
      "slurm",
      "{\"cluster\": {\"ps\": [\"h:1\"]}, \"task\": {}, \"jbo\": {}, "
      "\"slurm\": {\"ps\": \"two\", \"prot\": 1}, \"job\": {\"epochs\": 0}}");
  char *const env[] = {"SLURM_JOB_NODELIST=a1", "SLURM_TASKS_PER_NODE=2",
                       "SLURM_PROCID=0", NULL};
  char line[512];

  derive_bad(path, env);
  snprintf(line, sizeof line,
           "%s: cluster: not allowed with --cluster slurm: Slurm's "
           "environment gives it; remove it, or name the file without "
           "\"slurm:\"",
           path);
  has_line(line);
  snprintf(line, sizeof line, "%s: task: not allowed", path);
  has_text(line);
  snprintf(line, sizeof line,
           "%s: jbo: unknown key; expected one of job, auth, slurm", path);
  has_text(line);
  snprintf(line, sizeof line, "%s: slurm.prot: unknown key", path);
  has_text(line);
  snprintf(line, sizeof line, "%s: slurm.ps: expected", path);
  has_text(line);
  remove_job_file(path);

  /* The job's own mistakes come with the file and their path, as ever. */
  path = job_file("slurm", "{\"job\": {\"epochs\": 0}}");
  derive_bad(path, env);
  snprintf(line, sizeof line, "%s: job.epochs:", path);
  has_text(line);
  remove_job_file(path);

  ck_assert_int_eq(
      cm_slurm_spec("/nonexistent/job.json", env, &spec, NULL, err, sizeof err),
      CM_ENOENT);
  has_line("/nonexistent/job.json: No such file or directory");
}
END_TEST

START_TEST(test_env_mistakes) {
  char *const none[] = {"HOME=/root", NULL};
  char *const malformed[] = {"SLURM_STEP_NODELIST=node[1-3",
                             "SLURM_STEP_TASKS_PER_NODE=2(x3",
                             "SLURM_PROCID=x",
                             "PSD_SLURM_PS=0",
                             "PSD_SLURM_PORT=70000",
                             NULL};
  char *const mismatch[] = {"SLURM_JOB_NODELIST=a[1-3]",
                            "SLURM_TASKS_PER_NODE=2(x2)", "SLURM_PROCID=0",
                            NULL};
  char *const range[] = {"SLURM_JOB_NODELIST=a[1-2]",
                         "SLURM_TASKS_PER_NODE=1(x2)",
                         "SLURM_PROCID=2",
                         "PSD_SLURM_PS=2",
                         "PSD_SLURM_PORT=65535",
                         NULL};
  char *const cyclic[] = {"SLURM_STEP_NODELIST=a[1-2]",
                          "SLURM_STEP_TASKS_PER_NODE=2(x2)",
                          "SLURM_PROCID=1",
                          "SLURM_NODEID=1",
                          "SLURM_LOCALID=0",
                          NULL};
  char *const step_no_tasks[] = {"SLURM_STEP_NODELIST=a1",
                                 "SLURM_TASKS_PER_NODE=2", "SLURM_PROCID=0",
                                 NULL};

  derive_bad(NULL, none);
  has_line("SLURM_JOB_NODELIST is not set: not inside a Slurm job (run under "
           "sbatch, salloc or srun)");
  has_line("SLURM_TASKS_PER_NODE is not set: not inside a Slurm job (run "
           "under sbatch, salloc or srun)");
  has_line("SLURM_PROCID is not set: not a task of a Slurm job (run under "
           "sbatch or srun)");

  derive_bad(NULL, malformed);
  has_line("SLURM_STEP_NODELIST=\"node[1-3\": unbalanced '[' at character 5");
  has_line("SLURM_STEP_TASKS_PER_NODE=\"2(x3\": expected ')' at character 5");
  has_line("SLURM_PROCID=\"x\": expected an integer in 0..2147483647");
  has_line("PSD_SLURM_PS=\"0\": expected an integer in 1..65536");
  has_line("PSD_SLURM_PORT=\"70000\": expected an integer in 1..65535");

  derive_bad(NULL, mismatch);
  has_line("SLURM_JOB_NODELIST names 3 hosts but SLURM_TASKS_PER_NODE gives "
           "2 counts");

  derive_bad(NULL, range);
  has_line("SLURM_PROCID=2: out of range; SLURM_TASKS_PER_NODE gives 2 tasks");
  has_line("2 ps tasks (PSD_SLURM_PS or slurm.ps) leave no worker among the 2 "
           "tasks SLURM_TASKS_PER_NODE gives; expected 1..1");
  ck_assert_int_eq(count_lines(err), 2);

  derive_bad(NULL, cyclic);
  has_line("SLURM_NODEID=1 but task 1 of SLURM_STEP_TASKS_PER_NODE is on node "
           "0: the tasks are not laid out in blocks; run srun with "
           "--distribution=block");

  derive_bad(NULL, step_no_tasks);
  has_line("SLURM_STEP_TASKS_PER_NODE is not set, though SLURM_STEP_NODELIST "
           "is");
}
END_TEST

START_TEST(test_open) {
  ck_assert(cm_spec_is_slurm("slurm"));
  ck_assert(cm_spec_is_slurm("slurm:job.json"));
  ck_assert(!cm_spec_is_slurm("./slurm"));
  ck_assert(!cm_spec_is_slurm("slurmy.json"));
  setenv("SLURM_JOB_NODELIST", "n[07-08]", 1);
  setenv("SLURM_TASKS_PER_NODE", "2(x2)", 1);
  setenv("SLURM_PROCID", "1", 1);
  unsetenv("SLURM_STEP_NODELIST");
  unsetenv("PSD_SLURM_PS");
  unsetenv("PSD_SLURM_PORT");
  ck_assert_int_eq(cm_spec_open("slurm", &spec, &json, err, sizeof err), 0);
  ck_assert_str_eq(addrs(spec->ps, spec->nps), "n07:7100");
  ck_assert_str_eq(addrs(spec->worker, spec->nworker),
                   "n07:7101 n08:7100 n08:7101");
  ck_assert_int_eq(spec->task.type, CM_TASK_WORKER);
  ck_assert_int_eq(spec->task.index, 0);
}
END_TEST

int main(void) {
  Suite *s = suite_create("spec-slurm");
  TCase *tc = tcase_create("core");

  tcase_add_checked_fixture(tc, NULL, teardown);
  tcase_add_test(tc, test_step_layout);
  tcase_add_test(tc, test_batch_layout);
  tcase_add_test(tc, test_job_file);
  tcase_add_test(tc, test_file_mistakes);
  tcase_add_test(tc, test_env_mistakes);
  tcase_add_test(tc, test_open);
  suite_add_tcase(s, tc);
  return tu_run(s, 0);
}
