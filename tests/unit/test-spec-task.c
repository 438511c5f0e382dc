/* Unit tests for common/spec/task.c: the spec's "task" object, --task
 * parsing, and which task a process is: the precedence of --task, the spec
 * and TF_CONFIG, and the mistakes of each. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* setenv under -std=c11 */
#endif

#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "spec.h"
#include "spec_fixture.h"
#include "unit.h"

START_TEST(test_task_in_spec) {
  parse_bad("{\"cluster\": {\"ps\": [\"h:1\"], \"worker\": [\"h:2\", "
            "\"h:3\"]}, \"task\": {\"type\": \"worker\", \"index\": 5}}");
  has_line("t.json: task.index: 5 out of range; cluster.worker has 2 entries");
  parse_bad("{\"cluster\": {\"ps\": [\"h:1\"], \"worker\": [\"h:2\"]},"
            " \"task\": {\"type\": \"chief\", \"index\": -1, \"x\": 0}}");
  has_line("t.json: task.index: expected a non-negative integer, got -1");
  has_line("t.json: task.x: unknown key; expected one of type, index");
  parse_bad("{\"cluster\": {\"ps\": [\"h:1\"], \"worker\": [\"h:2\"]},"
            " \"task\": {}}");
  has_line("t.json: task.type: missing; expected \"ps\", \"worker\" or "
           "\"serve\"");
  has_line("t.json: task.index: missing; expected a non-negative integer");
}
END_TEST

START_TEST(test_task_parse) {
  struct cm_task t;

  ck_assert_int_eq(cm_task_parse("ps:1", &t, err, sizeof err), 0);
  ck_assert_int_eq(t.type, CM_TASK_PS);
  ck_assert_int_eq(t.index, 1);
  ck_assert_int_eq(cm_task_parse("worker:0", &t, err, sizeof err), 0);
  ck_assert_int_eq(t.type, CM_TASK_WORKER);
  ck_assert_int_eq(t.index, 0);

  ck_assert_int_eq(cm_task_parse("worker", &t, err, sizeof err), CM_EINVAL);
  ck_assert_str_eq(err, "--task \"worker\": expected TYPE:INDEX, e.g. "
                        "worker:0");
  ck_assert_int_eq(cm_task_parse("serve:3", &t, err, sizeof err), 0);
  ck_assert_int_eq(t.type, CM_TASK_SERVE);
  ck_assert_int_eq(t.index, 3);
  ck_assert_str_eq(cm_task_type_name(CM_TASK_SERVE), "serve");
  /* Kubeflow's chief is worker 0. */
  ck_assert_int_eq(cm_task_parse("chief:0", &t, err, sizeof err), 0);
  ck_assert_int_eq(t.type, CM_TASK_WORKER);
  ck_assert_int_eq(t.index, 0);
  ck_assert_int_eq(cm_task_parse("chief:1", &t, err, sizeof err), CM_EINVAL);
  ck_assert_str_eq(err, "--task \"chief:1\": index \"1\"; a job has one "
                        "chief, chief:0");
  ck_assert_int_eq(cm_task_parse("boss:0", &t, err, sizeof err), CM_EINVAL);
  ck_assert_str_eq(err, "--task \"boss:0\": unknown type \"boss\"; expected "
                        "ps, worker, serve or chief");
  ck_assert_int_eq(cm_task_parse("ps:-1", &t, err, sizeof err), CM_EINVAL);
  ck_assert_str_eq(err, "--task \"ps:-1\": index \"-1\" is not a non-negative "
                        "integer");
  ck_assert_int_eq(cm_task_parse("ps:", &t, err, sizeof err), CM_EINVAL);
  ck_assert_int_eq(cm_task_parse("ps:99999999999", &t, err, sizeof err),
                   CM_EINVAL);
  has_text("index out of range");

  ck_assert_str_eq(cm_task_type_name(CM_TASK_PS), "ps");
  ck_assert_str_eq(cm_task_type_name(CM_TASK_WORKER), "worker");
}
END_TEST

#define TWO_WORKERS                                                            \
  "\"cluster\": {\"ps\": [\"h:1\", \"h:2\"], \"worker\": [\"h:3\", \"h:4\"]}"

START_TEST(test_resolve_precedence) {
  struct cm_spec *with = NULL, *without = NULL;

  ck_assert_int_eq(parse("{" TWO_WORKERS ", \"task\": {\"type\": \"worker\","
                         " \"index\": 1}}",
                         &with),
                   0);
  ck_assert_int_eq(parse("{" TWO_WORKERS "}", &without), 0);
  setenv("TF_CONFIG",
         "{\"cluster\": {\"chief\": [\"x:1\"]}, \"task\": {\"type\": \"ps\","
         " \"index\": 0, \"trial\": \"7\"}}",
         1);

  /* --task beats the spec and TF_CONFIG. */
  ck_assert_int_eq(cm_spec_resolve_task(with, "ps:1", err, sizeof err), 0);
  ck_assert_int_eq(with->task.type, CM_TASK_PS);
  ck_assert_int_eq(with->task.index, 1);

  /* The spec's "task" beats TF_CONFIG. */
  with->task.type = CM_TASK_WORKER;
  with->task.index = 1;
  ck_assert_int_eq(cm_spec_resolve_task(with, NULL, err, sizeof err), 0);
  ck_assert_int_eq(with->task.type, CM_TASK_WORKER);
  ck_assert_int_eq(with->task.index, 1);

  /* TF_CONFIG is the last resort. */
  ck_assert_msg(cm_spec_resolve_task(without, NULL, err, sizeof err) == 0,
                "err: %s", err);
  ck_assert_int_eq(without->task.type, CM_TASK_PS);
  ck_assert_int_eq(without->task.index, 0);

  unsetenv("TF_CONFIG");
  cm_spec_free(with);
  cm_spec_free(without);
}
END_TEST

START_TEST(test_resolve_errors) {
  struct cm_spec *spec = NULL;

  unsetenv("TF_CONFIG");
  ck_assert_int_eq(parse("{" TWO_WORKERS "}", &spec), 0);

  ck_assert_int_eq(cm_spec_resolve_task(spec, NULL, err, sizeof err), CM_ESPEC);
  ck_assert_str_eq(err, "no task given: pass --task TYPE:INDEX, set \"task\" "
                        "in t.json, or TF_CONFIG");
  ck_assert_int_eq(spec->task.type, CM_TASK_NONE);

  ck_assert_int_eq(cm_spec_resolve_task(spec, "worker:5", err, sizeof err),
                   CM_ESPEC);
  ck_assert_str_eq(err, "--task \"worker:5\": index 5 out of range; "
                        "cluster.worker has 2 entries");
  ck_assert_int_eq(spec->task.type, CM_TASK_NONE);

  ck_assert_int_eq(cm_spec_resolve_task(spec, "boss:1", err, sizeof err),
                   CM_ESPEC);
  has_text("--task \"boss:1\": unknown type");

  setenv("TF_CONFIG", "{\"task\": {\"type\": \"worker\", ", 1);
  ck_assert_int_eq(cm_spec_resolve_task(spec, NULL, err, sizeof err), CM_ESPEC);
  ck_assert_msg(strncmp(err, "TF_CONFIG:1:", 12) == 0, "err: %s", err);
  has_text("JSON syntax error");

  setenv("TF_CONFIG", "{\"task\": {\"type\": \"worker\", \"index\": 2}}", 1);
  ck_assert_int_eq(cm_spec_resolve_task(spec, NULL, err, sizeof err), CM_ESPEC);
  ck_assert_str_eq(err, "TF_CONFIG: task.index: 2 out of range; "
                        "cluster.worker has 2 entries");

  setenv("TF_CONFIG", "{\"task\": {\"type\": \"evaluator\", \"index\": 0}}", 1);
  ck_assert_int_eq(cm_spec_resolve_task(spec, NULL, err, sizeof err), CM_ESPEC);
  has_text("TF_CONFIG's task is of type \"evaluator\", which is not a psd "
           "task");

  setenv("TF_CONFIG", "{\"task\": {\"type\": 7, \"index\": 0}}", 1);
  ck_assert_int_eq(cm_spec_resolve_task(spec, NULL, err, sizeof err), CM_ESPEC);
  ck_assert_str_eq(err, "TF_CONFIG: task.type: expected \"ps\", "
                        "\"worker\" or \"serve\", got 7");

  setenv("TF_CONFIG", "{\"cluster\": {}}", 1);
  ck_assert_int_eq(cm_spec_resolve_task(spec, NULL, err, sizeof err), CM_ESPEC);
  has_text("no task given");
  has_text("(TF_CONFIG has no \"task\")");

  /* A --task makes TF_CONFIG irrelevant, even a broken one. */
  setenv("TF_CONFIG", "not json", 1);
  ck_assert_int_eq(cm_spec_resolve_task(spec, "ps:1", err, sizeof err), 0);
  ck_assert_int_eq(spec->task.type, CM_TASK_PS);
  ck_assert_int_eq(spec->task.index, 1);

  unsetenv("TF_CONFIG");
  cm_spec_free(spec);
}
END_TEST

static Suite *spec_task_suite(void) {
  Suite *s = suite_create("spec-task");
  TCase *tc;

  tc = tcase_create("parse");
  tcase_add_test(tc, test_task_in_spec);
  suite_add_tcase(s, tc);

  tc = tcase_create("task");
  tcase_add_test(tc, test_task_parse);
  tcase_add_test(tc, test_resolve_precedence);
  tcase_add_test(tc, test_resolve_errors);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(spec_task_suite(), 0); }
