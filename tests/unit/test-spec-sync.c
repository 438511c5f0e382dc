/* Unit tests for job.sync and the liveness timings (common/spec/job.c):
 * defaults from the cluster size, settings of the wrong mode, bounds, the
 * deadline and deterministic order, heartbeat_ms against dead_after_ms,
 * and every sync mistake reported at once. */
#include <check.h>

#include "spec.h"
#include "spec_fixture.h"
#include "unit.h"

START_TEST(test_sync_defaults) {
  struct cm_spec *spec = NULL;

  /* Sync mode alone: k is every worker, m is k, the rest their defaults. */
  ck_assert_msg(parse(FOUR_WORKERS("\"sync\": {\"mode\": \"sync\"}"), &spec) ==
                    0,
                "err: %s", err);
  ck_assert_str_eq(spec->job.mode, "sync");
  ck_assert_int_eq(spec->job.replicas_to_aggregate, 4);
  ck_assert_int_eq(spec->job.min_replicas, 4);
  ck_assert_double_eq(spec->job.deadline_multiple, 3.0);
  ck_assert_int_eq(spec->job.deadline_floor_ms, 1000);
  ck_assert_int_eq(spec->job.deterministic, 0);
  ck_assert_int_eq(spec->job.staleness, -1);
  ck_assert_int_eq(spec->job.heartbeat_ms, 500);
  ck_assert_int_eq(spec->job.dead_after_ms, 5000);
  cm_spec_free(spec);
  spec = NULL;

  /* m follows a given k. */
  ck_assert_msg(parse(FOUR_WORKERS("\"sync\": {\"mode\": \"sync\","
                                   " \"replicas_to_aggregate\": 3}"),
                      &spec) == 0,
                "err: %s", err);
  ck_assert_int_eq(spec->job.replicas_to_aggregate, 3);
  ck_assert_int_eq(spec->job.min_replicas, 3);
  cm_spec_free(spec);
  spec = NULL;

  /* A partial deadline keeps the other half's default. */
  ck_assert_msg(parse(FOUR_WORKERS("\"sync\": {\"mode\": \"sync\","
                                   " \"deadline\": {\"floor_ms\": 1}}"),
                      &spec) == 0,
                "err: %s", err);
  ck_assert_double_eq(spec->job.deadline_multiple, 3.0);
  ck_assert_int_eq(spec->job.deadline_floor_ms, 1);
  cm_spec_free(spec);
  spec = NULL;

  /* Async, explicitly and by default: unbounded staleness, k and m filled. */
  ck_assert_msg(parse(FOUR_WORKERS("\"sync\": {\"mode\": \"async\"}"), &spec) ==
                    0,
                "err: %s", err);
  ck_assert_str_eq(spec->job.mode, "async");
  ck_assert_int_eq(spec->job.staleness, -1);
  ck_assert_int_eq(spec->job.replicas_to_aggregate, 4);
  ck_assert_int_eq(spec->job.min_replicas, 4);
  cm_spec_free(spec);
  spec = NULL;
  ck_assert_msg(parse(FOUR_WORKERS("\"sync\": {\"staleness\": 3}"), &spec) == 0,
                "err: %s", err);
  ck_assert_str_eq(spec->job.mode, "async");
  ck_assert_int_eq(spec->job.staleness, 3);
  cm_spec_free(spec);
}
END_TEST

START_TEST(test_sync_full) {
  static const char text[] =
      "{\"cluster\": {\"ps\": [\"h:1\", \"h:2\"],"
      " \"worker\": [\"h:3\", \"h:4\", \"h:5\", \"h:6\"]},\n"
      " \"job\": {\"sync\": {\"mode\": \"sync\", \"replicas_to_aggregate\": 3,"
      " \"min_replicas\": 2,\n"
      "   \"deadline\": {\"multiple\": 2.5, \"floor_ms\": 250},"
      " \"deterministic\": true},\n"
      "  \"heartbeat_ms\": 100, \"dead_after_ms\": 1000}}\n";
  struct cm_spec *spec = NULL;

  ck_assert_msg(parse(text, &spec) == 0, "err: %s", err);
  ck_assert_str_eq(err, "");
  ck_assert_str_eq(spec->job.mode, "sync");
  ck_assert_int_eq(spec->job.replicas_to_aggregate, 3);
  ck_assert_int_eq(spec->job.min_replicas, 2);
  ck_assert_double_eq(spec->job.deadline_multiple, 2.5);
  ck_assert_int_eq(spec->job.deadline_floor_ms, 250);
  ck_assert_int_eq(spec->job.deterministic, 1);
  ck_assert_int_eq(spec->job.staleness, -1);
  ck_assert_int_eq(spec->job.heartbeat_ms, 100);
  ck_assert_int_eq(spec->job.dead_after_ms, 1000);
  cm_spec_free(spec);
  spec = NULL;

  /* The edges: k = n, m = k = 1 of one worker, an integer multiple,
   * deterministic false. */
  ck_assert_msg(parse(FOUR_WORKERS("\"sync\": {\"mode\": \"sync\","
                                   " \"replicas_to_aggregate\": 4,"
                                   " \"min_replicas\": 4, \"deadline\":"
                                   " {\"multiple\": 1}, \"deterministic\":"
                                   " false}"),
                      &spec) == 0,
                "err: %s", err);
  ck_assert_int_eq(spec->job.replicas_to_aggregate, 4);
  ck_assert_int_eq(spec->job.min_replicas, 4);
  ck_assert_double_eq(spec->job.deadline_multiple, 1.0);
  ck_assert_int_eq(spec->job.deterministic, 0);
  cm_spec_free(spec);
  spec = NULL;
  ck_assert_msg(parse("{\"cluster\": {\"ps\": [\"h:1\"], \"worker\":"
                      " [\"h:2\"]}, \"job\": {\"sync\": {\"mode\": \"sync\","
                      " \"replicas_to_aggregate\": 1, \"min_replicas\": 1}}}",
                      &spec) == 0,
                "err: %s", err);
  ck_assert_int_eq(spec->job.replicas_to_aggregate, 1);
  ck_assert_int_eq(spec->job.min_replicas, 1);
  cm_spec_free(spec);
}
END_TEST

/* Settings of the other mode are mistakes, whether the mode is written or
 * defaulted. */
START_TEST(test_sync_wrong_mode) {
  parse_bad(FOUR_WORKERS("\"sync\": {\"replicas_to_aggregate\": 3,"
                         " \"min_replicas\": 2, \"deadline\": {},"
                         " \"deterministic\": true}"));
  has_line("t.json: job.sync.replicas_to_aggregate: only meaningful with "
           "\"mode\": \"sync\"");
  has_line("t.json: job.sync.min_replicas: only meaningful with \"mode\": "
           "\"sync\"");
  has_line("t.json: job.sync.deadline: only meaningful with \"mode\": "
           "\"sync\"");
  has_line("t.json: job.sync.deterministic: only meaningful with \"mode\": "
           "\"sync\"");
  ck_assert_int_eq(count_lines(err), 4);

  /* The value is not judged as well: one line per key. */
  parse_bad(FOUR_WORKERS("\"sync\": {\"mode\": \"async\", \"min_replicas\":"
                         " 0, \"deadline\": 7}"));
  has_line("t.json: job.sync.min_replicas: only meaningful with \"mode\": "
           "\"sync\"");
  has_line("t.json: job.sync.deadline: only meaningful with \"mode\": "
           "\"sync\"");
  ck_assert_int_eq(count_lines(err), 2);

  parse_bad(FOUR_WORKERS("\"sync\": {\"mode\": \"sync\", \"staleness\": 2}"));
  ck_assert_str_eq(err, "t.json: job.sync.staleness: only meaningful with "
                        "\"mode\": \"async\"");

  /* With the mode itself wrong, each setting is judged on its own. */
  parse_bad(FOUR_WORKERS("\"sync\": {\"mode\": \"bsp\", \"staleness\": -1,"
                         " \"replicas_to_aggregate\": 2, \"min_replicas\":"
                         " 0}"));
  has_line("t.json: job.sync.mode: expected \"async\" or \"sync\", got "
           "\"bsp\"");
  has_line("t.json: job.sync.staleness: expected a non-negative integer, got "
           "-1");
  has_line("t.json: job.sync.min_replicas: expected a positive integer, got "
           "0");
  ck_assert_int_eq(count_lines(err), 3);
}
END_TEST

START_TEST(test_sync_bounds) {
  parse_bad(FOUR_WORKERS(
      "\"sync\": {\"mode\": \"sync\", \"replicas_to_aggregate\": 5}"));
  ck_assert_str_eq(err, "t.json: job.sync.replicas_to_aggregate: 5 is more "
                        "than the 4 workers in cluster.worker");
  parse_bad("{\"cluster\": {\"ps\": [\"h:1\"], \"worker\": [\"h:2\"]},"
            " \"job\": {\"sync\": {\"mode\": \"sync\","
            " \"replicas_to_aggregate\": 2}}}");
  ck_assert_str_eq(err, "t.json: job.sync.replicas_to_aggregate: 2 is more "
                        "than the 1 worker in cluster.worker");
  parse_bad(FOUR_WORKERS(
      "\"sync\": {\"mode\": \"sync\", \"replicas_to_aggregate\": 0}"));
  ck_assert_str_eq(err, "t.json: job.sync.replicas_to_aggregate: expected a "
                        "positive integer, got 0");
  parse_bad(FOUR_WORKERS(
      "\"sync\": {\"mode\": \"sync\", \"replicas_to_aggregate\": \"all\"}"));
  ck_assert_str_eq(err, "t.json: job.sync.replicas_to_aggregate: expected a "
                        "positive integer, got \"all\"");

  parse_bad(FOUR_WORKERS("\"sync\": {\"mode\": \"sync\","
                         " \"replicas_to_aggregate\": 3, \"min_replicas\":"
                         " 4}"));
  ck_assert_str_eq(err, "t.json: job.sync.min_replicas: 4 is more than "
                        "replicas_to_aggregate (3)");
  parse_bad(FOUR_WORKERS("\"sync\": {\"mode\": \"sync\", \"min_replicas\":"
                         " 5}"));
  ck_assert_str_eq(err, "t.json: job.sync.min_replicas: 5 is more than "
                        "replicas_to_aggregate (4, by default the number of "
                        "workers)");
  parse_bad(FOUR_WORKERS("\"sync\": {\"mode\": \"sync\", \"min_replicas\":"
                         " 0}"));
  ck_assert_str_eq(err, "t.json: job.sync.min_replicas: expected a positive "
                        "integer, got 0");
  /* A wrong k is reported once; m is not compared with it. */
  parse_bad(FOUR_WORKERS("\"sync\": {\"mode\": \"sync\","
                         " \"replicas_to_aggregate\": 9, \"min_replicas\":"
                         " 6}"));
  ck_assert_str_eq(err, "t.json: job.sync.replicas_to_aggregate: 9 is more "
                        "than the 4 workers in cluster.worker");

  parse_bad(FOUR_WORKERS("\"sync\": {\"staleness\": -1}"));
  ck_assert_str_eq(err, "t.json: job.sync.staleness: expected a non-negative "
                        "integer, got -1");
  parse_bad(FOUR_WORKERS("\"sync\": {\"staleness\": 1.5}"));
  ck_assert_str_eq(err, "t.json: job.sync.staleness: expected a non-negative "
                        "integer, got 1.5");
}
END_TEST

START_TEST(test_sync_deadline_deterministic) {
  parse_bad(FOUR_WORKERS("\"sync\": {\"mode\": \"sync\", \"deadline\": 3}"));
  ck_assert_str_eq(err, "t.json: job.sync.deadline: expected an object like "
                        "{\"multiple\": 3.0, \"floor_ms\": 1000}, got 3");
  parse_bad(FOUR_WORKERS("\"sync\": {\"mode\": \"sync\", \"deadline\":"
                         " {\"multiple\": 0, \"floor_ms\": 0, \"flor_ms\": 5,"
                         " \"max_ms\": 9}}"));
  has_line("t.json: job.sync.deadline.multiple: expected a positive number, "
           "got 0");
  has_line("t.json: job.sync.deadline.floor_ms: expected a positive integer, "
           "got 0");
  has_line("t.json: job.sync.deadline.flor_ms: unknown key (did you mean "
           "floor_ms?); expected one of multiple, floor_ms");
  has_line("t.json: job.sync.deadline.max_ms: unknown key; expected one of "
           "multiple, floor_ms");
  ck_assert_int_eq(count_lines(err), 4);
  parse_bad(FOUR_WORKERS("\"sync\": {\"mode\": \"sync\", \"deadline\":"
                         " {\"multiple\": -2.5, \"floor_ms\": 10.5}}"));
  has_line("t.json: job.sync.deadline.multiple: expected a positive number, "
           "got -2.5");
  has_line("t.json: job.sync.deadline.floor_ms: expected a positive integer, "
           "got 10.5");
  ck_assert_int_eq(count_lines(err), 2);
  parse_bad(FOUR_WORKERS("\"sync\": {\"mode\": \"sync\", \"deadline\":"
                         " {\"multiple\": \"3\"}}"));
  ck_assert_str_eq(err, "t.json: job.sync.deadline.multiple: expected a "
                        "positive number, got \"3\"");

  parse_bad(FOUR_WORKERS("\"sync\": {\"mode\": \"sync\", \"deterministic\":"
                         " 1}"));
  ck_assert_str_eq(err, "t.json: job.sync.deterministic: expected true or "
                        "false, got 1");
  parse_bad(FOUR_WORKERS("\"sync\": {\"mode\": \"sync\", \"deterministic\":"
                         " \"true\"}"));
  ck_assert_str_eq(err, "t.json: job.sync.deterministic: expected true or "
                        "false, got \"true\"");
  parse_bad(FOUR_WORKERS("\"sync\": {\"mode\": \"sync\", \"deterministic\":"
                         " null}"));
  ck_assert_str_eq(err, "t.json: job.sync.deterministic: expected true or "
                        "false, got null");
}
END_TEST

START_TEST(test_liveness) {
  struct cm_spec *spec = NULL;

  parse_bad(FOUR_WORKERS("\"heartbeat_ms\": 500, \"dead_after_ms\": 500"));
  ck_assert_str_eq(err, "t.json: job.dead_after_ms: 500 is not more than "
                        "job.heartbeat_ms (500); expected a longer silence, "
                        "e.g. 5000 (10 heartbeats)");
  parse_bad(FOUR_WORKERS("\"dead_after_ms\": 400"));
  ck_assert_str_eq(err, "t.json: job.dead_after_ms: 400 is not more than "
                        "job.heartbeat_ms (500, the default); expected a "
                        "longer silence, e.g. 5000 (10 heartbeats)");
  parse_bad(FOUR_WORKERS("\"heartbeat_ms\": 6000"));
  ck_assert_str_eq(err, "t.json: job.heartbeat_ms: 6000 is not less than "
                        "job.dead_after_ms (5000, the default); expected "
                        "less, or set job.dead_after_ms, e.g. to 60000 (10 "
                        "heartbeats)");
  /* A wrong value is reported alone, not compared as well. */
  parse_bad(FOUR_WORKERS("\"heartbeat_ms\": 0, \"dead_after_ms\": -1"));
  has_line("t.json: job.heartbeat_ms: expected a positive integer, got 0");
  has_line("t.json: job.dead_after_ms: expected a positive integer, got -1");
  ck_assert_int_eq(count_lines(err), 2);
  parse_bad(FOUR_WORKERS("\"heartbeat_ms\": 2147483647, \"dead_after_ms\":"
                         " 1000"));
  has_text("e.g. 2147483647 (10 heartbeats)");

  ck_assert_msg(parse(FOUR_WORKERS("\"heartbeat_ms\": 4999"), &spec) == 0,
                "err: %s", err);
  ck_assert_int_eq(spec->job.heartbeat_ms, 4999);
  ck_assert_int_eq(spec->job.dead_after_ms, 5000);
  cm_spec_free(spec);
}
END_TEST

/* Misspelt new keys get a hint; every sync mistake comes out at once. */
START_TEST(test_sync_many_mistakes) {
  parse_bad(
      FOUR_WORKERS("\"sync\": {\"mode\": \"sync\", \"replica_to_aggregate\":"
                   " 2, \"min_replica\": 1, \"staleness\": 1,"
                   " \"deadline\": {\"multiple\": 0}, \"deterministic\":"
                   " \"yes\"}, \"heartbeat_msec\": 100, \"dead_after\":"
                   " 1, \"heartbeat_ms\": 900, \"dead_after_ms\": 800"));
  has_text("t.json: job.sync.replica_to_aggregate: unknown key (did you mean "
           "replicas_to_aggregate?); expected one of mode, ");
  has_text("t.json: job.sync.min_replica: unknown key (did you mean "
           "min_replicas?); expected one of mode, ");
  has_text("t.json: job.heartbeat_msec: unknown key (did you mean "
           "heartbeat_ms?); expected one of name, ");
  has_text("t.json: job.dead_after: unknown key; expected one of name, ");
  has_line("t.json: job.sync.staleness: only meaningful with \"mode\": "
           "\"async\"");
  has_line("t.json: job.sync.deadline.multiple: expected a positive number, "
           "got 0");
  has_line("t.json: job.sync.deterministic: expected true or false, got "
           "\"yes\"");
  has_line("t.json: job.dead_after_ms: 800 is not more than job.heartbeat_ms "
           "(900); expected a longer silence, e.g. 9000 (10 heartbeats)");
  ck_assert_int_eq(count_lines(err), 8);

  parse_bad(FOUR_WORKERS("\"sync\": {\"mode\": \"sync\","
                         " \"replicas_to_aggregate\": 5, \"min_replicas\": 0,"
                         " \"deterministic\": 0}, \"dead_after_ms\": 10"));
  has_line("t.json: job.sync.replicas_to_aggregate: 5 is more than the 4 "
           "workers in cluster.worker");
  has_line("t.json: job.sync.min_replicas: expected a positive integer, got "
           "0");
  has_line("t.json: job.sync.deterministic: expected true or false, got 0");
  has_text("t.json: job.dead_after_ms: 10 is not more than job.heartbeat_ms "
           "(500, the default)");
  ck_assert_int_eq(count_lines(err), 4);

  parse_bad(FOUR_WORKERS("\"sync\": \"sync\""));
  ck_assert_str_eq(err, "t.json: job.sync: expected an object like "
                        "{\"mode\": \"sync\", \"replicas_to_aggregate\": 2}, "
                        "got \"sync\"");
}
END_TEST

static Suite *spec_sync_suite(void) {
  Suite *s = suite_create("spec-sync");
  TCase *tc;

  tc = tcase_create("sync");
  tcase_add_test(tc, test_sync_defaults);
  tcase_add_test(tc, test_sync_full);
  tcase_add_test(tc, test_sync_wrong_mode);
  tcase_add_test(tc, test_sync_bounds);
  tcase_add_test(tc, test_sync_deadline_deterministic);
  tcase_add_test(tc, test_liveness);
  tcase_add_test(tc, test_sync_many_mistakes);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(spec_sync_suite(), 0); }
