/* Unit tests for what the spec says about serving (docs/serving.md):
 * cluster.serve (addr.c: a multiple of the shards, addresses of their own)
 * with the task type serve (task.c), and job.publish (job_publish.c:
 * defaults, bounds, unknown keys, a relative dir made absolute by
 * cm_spec_load). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "err.h"
#include "spec.h"
#include "spec_fixture.h"
#include "unit.h"

#define TWO_PS(serve, job)                                                     \
  "{\"cluster\": {\"ps\": [\"h:1\", \"h:2\"], \"worker\": [\"h:3\"]" serve     \
  "}, \"job\": {" job "}}"

START_TEST(test_cluster_serve) {
  struct cm_spec *spec = NULL;
  ck_assert_msg(parse(TWO_PS(", \"serve\": [\"h:4\", \"h:5\", \"h:6\", "
                             "\"h:7\"]",
                             ""),
                      &spec) == 0,
                "%s", err);
  ck_assert_int_eq(spec->nserve, 4);
  ck_assert_str_eq(addrs(spec->serve, spec->nserve), "h:4 h:5 h:6 h:7");
  ck_assert_int_eq(cm_spec_resolve_task(spec, "serve:3", err, sizeof err), 0);
  ck_assert_int_eq(spec->task.type, CM_TASK_SERVE);
  ck_assert_int_eq(spec->task.index, 3);
  ck_assert_int_eq(cm_spec_resolve_task(spec, "serve:4", err, sizeof err),
                   CM_ESPEC);
  has_line("--task \"serve:4\": index 4 out of range; cluster.serve has 4 "
           "entries");
  cm_spec_free(spec);

  /* Absent: no serving tasks, and serve:0 is out of range. */
  spec = NULL;
  ck_assert_msg(parse(TWO_PS("", ""), &spec) == 0, "%s", err);
  ck_assert_int_eq(spec->nserve, 0);
  ck_assert_ptr_null(spec->serve);
  ck_assert_int_eq(cm_spec_resolve_task(spec, "serve:0", err, sizeof err),
                   CM_ESPEC);
  has_line("--task \"serve:0\": index 0 out of range; cluster.serve has 0 "
           "entries");
  cm_spec_free(spec);

  /* A task object in the spec may be a serving task. */
  spec = NULL;
  ck_assert_msg(parse("{\"cluster\": {\"ps\": [\"h:1\"], \"worker\": "
                      "[\"h:2\"], \"serve\": [\"h:3\"]}, \"task\": "
                      "{\"type\": \"serve\", \"index\": 0}}",
                      &spec) == 0,
                "%s", err);
  ck_assert_int_eq(spec->task.type, CM_TASK_SERVE);
  cm_spec_free(spec);
}
END_TEST

START_TEST(test_cluster_serve_mistakes) {
  parse_bad(TWO_PS(", \"serve\": [\"h:4\", \"h:5\", \"h:6\"]", ""));
  has_line("t.json: cluster.serve: 3 entries; expected a multiple of "
           "cluster.ps's 2 (serve:J follows shard J % 2, the same number of "
           "replicas of each)");
  parse_bad(TWO_PS(", \"serve\": [\"h:4\", \"h:1\"]", ""));
  has_line("t.json: cluster.serve[1]: \"h:1\" is also cluster.ps[0]; expected "
           "every task to have its own address");
  parse_bad(TWO_PS(", \"serve\": []", ""));
  has_line("t.json: cluster.serve: empty; expected at least one \"host:port\" "
           "string");
  parse_bad(TWO_PS(", \"serve\": [\"h:4\", \"h\"]", ""));
  has_line("t.json: cluster.serve[1]: \"h\" has no port; expected "
           "\"host:port\"");
}
END_TEST

START_TEST(test_publish_settings) {
  struct cm_spec *spec = NULL;
  ck_assert_msg(parse(TWO_PS("", ""), &spec) == 0, "%s", err);
  ck_assert_str_eq(spec->job.publish_dir, "");
  ck_assert(spec->job.publish_interval_s == 5);
  ck_assert_int_eq(spec->job.publish_full_every, 10);
  ck_assert_int_eq(spec->job.publish_keep, 2);
  cm_spec_free(spec);

  spec = NULL;
  ck_assert_msg(parse(TWO_PS("", "\"publish\": {\"dir\": \"/srv/pub\", "
                                 "\"interval_s\": 0.5, \"full_every\": 1, "
                                 "\"keep\": 4}"),
                      &spec) == 0,
                "%s", err);
  ck_assert_str_eq(spec->job.publish_dir, "/srv/pub");
  ck_assert(spec->job.publish_interval_s == 0.5);
  ck_assert_int_eq(spec->job.publish_full_every, 1);
  ck_assert_int_eq(spec->job.publish_keep, 4);
  cm_spec_free(spec);
}
END_TEST

START_TEST(test_publish_mistakes) {
  parse_bad(TWO_PS("", "\"publish\": {\"interval_s\": 0, \"full_every\": 0, "
                       "\"keep\": 0, \"every\": 1}"));
  has_line("t.json: job.publish.dir: missing; expected the directory the "
           "shards publish into");
  has_line("t.json: job.publish.interval_s: expected a number of seconds > 0, "
           "got 0");
  has_line("t.json: job.publish.full_every: expected a positive integer, got "
           "0");
  has_line("t.json: job.publish.keep: expected a positive integer, got 0");
  has_text("t.json: job.publish.every: unknown key");
  parse_bad(TWO_PS("", "\"publish\": {\"dir\": \"\"}"));
  has_line("t.json: job.publish.dir: empty; expected a non-empty string");
  parse_bad(TWO_PS("", "\"publish\": \"pub\""));
  has_text("t.json: job.publish: expected an object like {\"dir\": \"pub\", "
           "\"interval_s\": 5}");
}
END_TEST

START_TEST(test_publish_dir_relative) {
  char dir[] = "/tmp/test-spec-serve-XXXXXX", path[256], want[300];
  struct cm_spec *spec = NULL;
  FILE *f;
  ck_assert_ptr_nonnull(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/job.json", dir);
  ck_assert_ptr_nonnull(f = fopen(path, "w"));
  fputs(TWO_PS("", "\"publish\": {\"dir\": \"pub\"}"), f);
  fclose(f);
  ck_assert_msg(cm_spec_load(path, &spec, err, sizeof err) == 0, "%s", err);
  snprintf(want, sizeof want, "%s/pub", dir);
  ck_assert_str_eq(spec->job.publish_dir, want);
  cm_spec_free(spec);
  unlink(path);
  rmdir(dir);
}
END_TEST

static Suite *spec_serve_suite(void) {
  Suite *s = suite_create("spec-serve");
  TCase *tc = tcase_create("parse");
  tcase_add_test(tc, test_cluster_serve);
  tcase_add_test(tc, test_cluster_serve_mistakes);
  tcase_add_test(tc, test_publish_settings);
  tcase_add_test(tc, test_publish_mistakes);
  tcase_add_test(tc, test_publish_dir_relative);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(spec_serve_suite(), 0); }
