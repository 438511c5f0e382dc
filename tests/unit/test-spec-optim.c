/* Unit tests for common/spec/job_optim.c: every optimizer key, schedules,
 * clipping, per-variable overrides and which rule a variable gets, and
 * their mistakes. */
#include <check.h>

#include "spec.h"
#include "spec_fixture.h"
#include "unit.h"

/* Every optimizer key, a schedule, clipping and two overrides; which rule
 * each variable gets. */
START_TEST(test_optimizer_full) {
  struct cm_spec *spec = NULL;
  const struct cm_optim *o;
  int rule;

  ck_assert_msg(
      parse(ONE_WORKER(
                "\"optimizer\": {\"type\": \"adamw\", \"lr\": 0.002,"
                " \"weight_decay\": 0.01, \"beta1\": 0.8, \"beta2\": 0.99,"
                " \"eps\": 1e-6, \"clip_norm\": 5,"
                " \"schedule\": {\"type\": \"cosine\", \"warmup_steps\": 10,"
                " \"total_steps\": 1000, \"min_lr\": 0.0001}},"
                " \"optimizer_overrides\": {"
                " \"*/bias\": {\"weight_decay\": 0},"
                " \"dense0/bias\": {\"type\": \"nesterov\", \"lr\": 0.1,"
                " \"momentum\": 0.5, \"schedule\": {\"type\": \"step\","
                " \"decay_every\": 100, \"gamma\": 0.5}}}"),
            &spec) == 0,
      "err: %s", err);
  o = &spec->job.optim.def;
  ck_assert_int_eq(o->type, CM_OPT_ADAMW);
  ck_assert_double_eq(o->lr, 0.002);
  ck_assert_double_eq(o->weight_decay, 0.01);
  ck_assert_double_eq(o->beta1, 0.8);
  ck_assert_double_eq(o->beta2, 0.99);
  ck_assert_double_eq(o->eps, 1e-6);
  ck_assert_double_eq(o->momentum, 0.9); /* default, unused */
  ck_assert_int_eq(o->schedule.type, CM_SCHED_COSINE);
  ck_assert_uint_eq(o->schedule.warmup_steps, 10);
  ck_assert_uint_eq(o->schedule.total_steps, 1000);
  ck_assert_double_eq(o->schedule.min_lr, 0.0001);
  ck_assert_double_eq(spec->job.clip_norm, 5);
  ck_assert_int_eq(spec->job.optim.nrules, 2);

  /* An override starts from the job's optimizer and keeps its schedule. */
  o = cm_optim_pick(&spec->job.optim, "dense1/bias", &rule);
  ck_assert_int_eq(rule, 0);
  ck_assert_str_eq(spec->job.optim.rules[0].pattern, "*/bias");
  ck_assert_int_eq(o->type, CM_OPT_ADAMW);
  ck_assert_double_eq(o->weight_decay, 0);
  ck_assert_double_eq(o->lr, 0.002);
  ck_assert_double_eq(o->beta1, 0.8);
  ck_assert_int_eq(o->schedule.type, CM_SCHED_COSINE);
  /* An exact name beats an earlier glob; its schedule replaces the job's
   * whole (no warm-up left over). */
  o = cm_optim_pick(&spec->job.optim, "dense0/bias", &rule);
  ck_assert_int_eq(rule, 1);
  ck_assert_int_eq(o->type, CM_OPT_NESTEROV);
  ck_assert_double_eq(o->lr, 0.1);
  ck_assert_double_eq(o->momentum, 0.5);
  ck_assert_double_eq(o->weight_decay, 0.01);
  ck_assert_int_eq(o->schedule.type, CM_SCHED_STEP);
  ck_assert_uint_eq(o->schedule.decay_every, 100);
  ck_assert_double_eq(o->schedule.gamma, 0.5);
  ck_assert_uint_eq(o->schedule.warmup_steps, 0);
  /* No rule: the job's. */
  o = cm_optim_pick(&spec->job.optim, "dense0/kernel", &rule);
  ck_assert_int_eq(rule, -1);
  ck_assert_ptr_eq(o, &spec->job.optim.def);
  cm_spec_free(spec);
  spec = NULL;

  /* Warm-up alone, with the default gamma of a step schedule unused. */
  ck_assert_msg(parse(ONE_WORKER("\"optimizer\": {\"type\": \"adam\","
                                 " \"schedule\": {\"warmup_steps\": 50}}"),
                      &spec) == 0,
                "err: %s", err);
  ck_assert_int_eq(spec->job.optim.def.type, CM_OPT_ADAM);
  ck_assert_int_eq(spec->job.optim.def.schedule.type, CM_SCHED_CONSTANT);
  ck_assert_uint_eq(spec->job.optim.def.schedule.warmup_steps, 50);
  cm_spec_free(spec);
}
END_TEST

START_TEST(test_optimizer_mistakes) {
  parse_bad(ONE_WORKER("\"optimizer\": {\"type\": \"adam\", \"beta1\": 1,"
                       " \"beta2\": -0.1, \"eps\": 0, \"weight_decay\": -1,"
                       " \"clip_norm\": 0, \"schedul\": {}}"));
  has_line("t.json: job.optimizer.beta1: expected a number in [0, 1), got 1");
  has_line("t.json: job.optimizer.beta2: expected a number in [0, 1), got "
           "-0.1");
  has_line("t.json: job.optimizer.eps: expected a positive number, got 0");
  has_line("t.json: job.optimizer.weight_decay: expected a number >= 0, got "
           "-1");
  has_line("t.json: job.optimizer.clip_norm: expected a positive number (the "
           "largest global L2 norm of a worker's gradient), got 0");
  has_text("t.json: job.optimizer.schedul: unknown key (did you mean "
           "schedule?)");
  ck_assert_int_eq(count_lines(err), 6);

  parse_bad(ONE_WORKER("\"optimizer\": {\"type\": \"nesterov\","
                       " \"momentum\": 0}"));
  ck_assert_str_eq(err, "t.json: job.optimizer.momentum: nesterov needs a "
                        "momentum above 0 (with 0 it is plain sgd)");
}
END_TEST

START_TEST(test_schedule_mistakes) {
  /* Keys of another schedule type, and what a type needs. */
  parse_bad(ONE_WORKER("\"optimizer\": {\"schedule\": {\"type\": \"step\","
                       " \"total_steps\": 10, \"gamma\": 1.5}}"));
  has_line("t.json: job.optimizer.schedule.total_steps: only meaningful with "
           "\"type\": \"cosine\"");
  has_line("t.json: job.optimizer.schedule: \"type\": \"step\" needs "
           "\"decay_every\" (steps between decays, e.g. 1000) and takes "
           "\"gamma\" (default 0.1)");
  has_line("t.json: job.optimizer.schedule.gamma: expected a number in (0, "
           "1], got 1.5");
  ck_assert_int_eq(count_lines(err), 3);

  parse_bad(ONE_WORKER("\"optimizer\": {\"lr\": 0.1, \"schedule\":"
                       " {\"type\": \"cosine\", \"warmup_steps\": 100,"
                       " \"total_steps\": 100, \"min_lr\": 0.5,"
                       " \"decay_every\": 3}}"));
  has_line("t.json: job.optimizer.schedule.decay_every: only meaningful with "
           "\"type\": \"step\"");
  has_line("t.json: job.optimizer.schedule.total_steps: 100 is not more than "
           "warmup_steps (100); expected the step at which the decay ends, "
           "counted from the first");
  has_line("t.json: job.optimizer.schedule.min_lr: 0.5 is more than the "
           "optimizer's lr (0.1)");
  ck_assert_int_eq(count_lines(err), 3);

  parse_bad(ONE_WORKER("\"optimizer\": {\"schedule\": {\"type\": \"cosine\","
                       " \"warmup_steps\": -1}}"));
  has_line("t.json: job.optimizer.schedule: \"type\": \"cosine\" needs "
           "\"total_steps\" (the step at which lr reaches min_lr, warm-up "
           "included)");
  has_line("t.json: job.optimizer.schedule.warmup_steps: expected a "
           "non-negative integer, got -1");
  ck_assert_int_eq(count_lines(err), 2);

  parse_bad(
      ONE_WORKER("\"optimizer\": {\"schedule\": {\"type\": \"linear\"}}"));
  ck_assert_str_eq(err, "t.json: job.optimizer.schedule.type: expected "
                        "\"constant\", \"step\" or \"cosine\", got \"linear\"");
}
END_TEST

START_TEST(test_override_mistakes) {
  parse_bad(ONE_WORKER("\"optimizer_overrides\": {\"*/bias\": {\"lr\": -1,"
                       " \"clip_norm\": 1}, \"dense0/kernel\": 0.1,"
                       " \"dense1/kernel\": {\"type\": \"lion\"}}"));
  has_line("t.json: job.optimizer_overrides[\"*/bias\"].lr: expected a "
           "positive number, got -1");
  has_line("t.json: job.optimizer_overrides[\"*/bias\"].clip_norm: clipping "
           "is per job, not per variable (the global norm is over every "
           "variable's gradient); set job.optimizer.clip_norm");
  has_line("t.json: job.optimizer_overrides[\"dense0/kernel\"]: expected an "
           "object of optimizer keys like {\"type\": \"sgd\", \"lr\": 0.1}, "
           "got 0.1");
  has_text("t.json: job.optimizer_overrides[\"dense1/kernel\"].type: expected "
           "\"sgd\", ");
  ck_assert_int_eq(count_lines(err), 4);

  /* An lr under the min_lr of the cosine an entry keeps from the job. */
  parse_bad(ONE_WORKER("\"optimizer\": {\"lr\": 0.1, \"schedule\": {\"type\":"
                       " \"cosine\", \"total_steps\": 10, \"min_lr\": 0.01}},"
                       " \"optimizer_overrides\": {\"b\": {\"lr\": 0.001}}"));
  ck_assert_str_eq(err, "t.json: job.optimizer_overrides.b.lr: 0.001 is "
                        "below the min_lr (0.01) of the schedule it keeps from "
                        "job.optimizer; give this entry a \"schedule\" of its "
                        "own");

  parse_bad(ONE_WORKER("\"optimizer_overrides\": [\"*/bias\"]"));
  has_text("t.json: job.optimizer_overrides: expected an object like "
           "{\"*/bias\": {\"weight_decay\": 0}}");
  parse_bad(ONE_WORKER("\"optimizer_overrides\": {\"\": {}}"));
  ck_assert_str_eq(err, "t.json: job.optimizer_overrides[\"\"]: expected a "
                        "variable name or glob of 1..200 characters");
}
END_TEST

static Suite *spec_optim_suite(void) {
  Suite *s = suite_create("spec-optim");
  TCase *tc;

  tc = tcase_create("optimizer");
  tcase_add_test(tc, test_optimizer_full);
  tcase_add_test(tc, test_optimizer_mistakes);
  tcase_add_test(tc, test_schedule_mistakes);
  tcase_add_test(tc, test_override_mistakes);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(spec_optim_suite(), 0); }
