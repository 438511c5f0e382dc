/* Unit tests for common/spec/optjson.c: a variable's own optimizer read from
 * JSON text with job.optimizer's defaults, keys and messages, written back
 * and read again as the same optimizer, and cm_optim_same. */
#include <check.h>
#include <string.h>

#include "err.h"
#include "optjson.h"
#include "spec_fixture.h"
#include "unit.h"

/* Parses text (a C string) into *o; returns cm_optim_from_json's code. */
static int from(const char *text, struct cm_optim *o) {
  return cm_optim_from_json(text, strlen(text), o, err, sizeof err);
}

/* 1 when every field of a and b is equal, used by the update or not
 * (memcmp would compare the padding too). */
static int all_equal(const struct cm_optim *a, const struct cm_optim *b) {
  const struct cm_schedule *x = &a->schedule, *y = &b->schedule;
  return a->type == b->type && a->lr == b->lr && a->momentum == b->momentum &&
         a->weight_decay == b->weight_decay && a->beta1 == b->beta1 &&
         a->beta2 == b->beta2 && a->eps == b->eps && x->type == y->type &&
         x->warmup_steps == y->warmup_steps &&
         x->decay_every == y->decay_every && x->gamma == y->gamma &&
         x->total_steps == y->total_steps && x->min_lr == y->min_lr;
}

/* Given keys are taken, the others are job.optimizer's defaults. */
START_TEST(test_defaults_and_keys) {
  struct cm_optim o, d;

  cm_optim_defaults(&d);
  ck_assert_int_eq(from("{}", &o), 0);
  ck_assert_int_eq(cm_optim_same(&o, &d), 1);
  ck_assert_int_eq(o.type, CM_OPT_MOMENTUM);
  ck_assert_double_eq(o.lr, 0.05);

  ck_assert_msg(from("{\"type\": \"sgd\", \"lr\": 0.5}", &o) == 0, "err: %s",
                err);
  ck_assert_int_eq(o.type, CM_OPT_SGD);
  ck_assert_double_eq(o.lr, 0.5);
  ck_assert_double_eq(o.momentum, 0.9); /* unused, the default */
  ck_assert_int_eq(o.schedule.type, CM_SCHED_CONSTANT);

  ck_assert_msg(from("{\"type\": \"adamw\", \"lr\": 0.002, \"beta1\": 0.8,"
                     " \"beta2\": 0.99, \"eps\": 1e-6, \"weight_decay\": 0.01,"
                     " \"schedule\": {\"type\": \"cosine\", \"warmup_steps\":"
                     " 10, \"total_steps\": 1000, \"min_lr\": 0.0001}}",
                     &o) == 0,
                "err: %s", err);
  ck_assert_int_eq(o.type, CM_OPT_ADAMW);
  ck_assert_double_eq(o.beta1, 0.8);
  ck_assert_double_eq(o.beta2, 0.99);
  ck_assert_double_eq(o.eps, 1e-6);
  ck_assert_double_eq(o.weight_decay, 0.01);
  ck_assert_int_eq(o.schedule.type, CM_SCHED_COSINE);
  ck_assert_uint_eq(o.schedule.warmup_steps, 10);
  ck_assert_uint_eq(o.schedule.total_steps, 1000);
  ck_assert_double_eq(o.schedule.min_lr, 0.0001);
}
END_TEST

/* Mistakes are the spec's, at paths under "optimizer"; *out is untouched. */
START_TEST(test_mistakes) {
  struct cm_optim o, keep;

  cm_optim_defaults(&keep);
  keep.lr = 7;
  o = keep;
  ck_assert_int_eq(from("{\"type\": \"sgd\", \"lr\": -1}", &o), CM_ESPEC);
  ck_assert_str_eq(err, "optimizer.lr: expected a positive number, got -1");
  ck_assert_double_eq(o.lr, 7);

  ck_assert_int_eq(from("{\"type\": \"sdg\", \"lr\": 0, \"beta2\": 1,"
                        " \"clip_norm\": 1, \"lrr\": 3}",
                        &o),
                   CM_ESPEC);
  has_text("optimizer.type: expected \"sgd\", ");
  has_line("optimizer.lr: expected a positive number, got 0");
  has_line("optimizer.beta2: expected a number in [0, 1), got 1");
  has_line("optimizer.clip_norm: clipping is per job, not per variable (the "
           "global norm is over every variable's gradient); set "
           "job.optimizer.clip_norm");
  has_text("optimizer.lrr: unknown key (did you mean lr?)");
  ck_assert_int_eq(count_lines(err), 5);

  ck_assert_int_eq(from("{\"type\": \"nesterov\", \"momentum\": 0}", &o),
                   CM_ESPEC);
  ck_assert_str_eq(err, "optimizer.momentum: nesterov needs a momentum above "
                        "0 (with 0 it is plain sgd)");
  ck_assert_int_eq(from("{\"schedule\": {\"type\": \"step\"}}", &o), CM_ESPEC);
  has_text("optimizer.schedule: \"type\": \"step\" needs \"decay_every\"");

  /* Not an object, not JSON, nothing. */
  ck_assert_int_eq(from("[1]", &o), CM_ESPEC);
  ck_assert_str_eq(err, "optimizer: expected an object like {\"type\": "
                        "\"sgd\", \"lr\": 0.1}, got an array");
  ck_assert_int_eq(from("{\"type\": sgd}", &o), CM_ESPEC);
  ck_assert_msg(strncmp(err, "optimizer:1:", 12) == 0 &&
                    strstr(err, "JSON syntax error") != NULL,
                "err: %s", err);
  ck_assert_int_eq(from("", &o), CM_ESPEC);
  has_text("JSON syntax error");
  ck_assert_int_eq(from("{\"lr\": 1, \"lr\": 2}", &o), CM_ESPEC);
  has_text("JSON syntax error");
  ck_assert_int_eq(all_equal(&o, &keep), 1);
  /* No buffer: only the code. */
  ck_assert_int_eq(cm_optim_from_json("{\"lr\": -1}", 10, &o, NULL, 0),
                   CM_ESPEC);
}
END_TEST

/* What cm_optim_to_json writes reads back as the same optimizer, to the
 * last bit of every number. */
START_TEST(test_round_trip) {
  static const char *const texts[] = {
      "{\"type\": \"sgd\", \"lr\": 0.1}",
      "{\"type\": \"momentum\", \"lr\": 0.3333333333333333, \"momentum\": "
      "0.95}",
      "{\"type\": \"nesterov\", \"lr\": 1e-7, \"momentum\": 0.5, "
      "\"weight_decay\": 0.0001}",
      "{\"type\": \"adagrad\", \"lr\": 0.01, \"eps\": 1e-10}",
      "{\"type\": \"adam\", \"lr\": 0.001, \"schedule\": {\"type\": \"step\", "
      "\"warmup_steps\": 5, \"decay_every\": 100, \"gamma\": 0.7}}",
      "{\"type\": \"adamw\", \"lr\": 0.002, \"beta1\": 0.8, \"beta2\": 0.99, "
      "\"weight_decay\": 0.01, \"schedule\": {\"type\": \"cosine\", "
      "\"total_steps\": 2000, \"min_lr\": 1.5e-5}}",
  };
  char buf[CM_OPTIM_JSON_MAX];

  for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
    struct cm_optim a, b;
    ck_assert_msg(from(texts[i], &a) == 0, "%s: %s", texts[i], err);
    ck_assert_int_eq(cm_optim_to_json(&a, buf, sizeof buf), 0);
    ck_assert_msg(from(buf, &b) == 0, "%s: %s", buf, err);
    ck_assert_msg(all_equal(&a, &b), "%s came back otherwise", buf);
  }
  {
    struct cm_optim a;
    ck_assert_int_eq(from("{\"type\": \"sgd\", \"lr\": 0.5}", &a), 0);
    ck_assert_int_eq(cm_optim_to_json(&a, buf, sizeof buf), 0);
    ck_assert_str_eq(buf, "{\"type\": \"sgd\", \"lr\": 0.5, \"momentum\": 0.9, "
                          "\"weight_decay\": 0, \"beta1\": 0.9, \"beta2\": "
                          "0.999, \"eps\": 1e-08, \"schedule\": {\"type\": "
                          "\"constant\", \"warmup_steps\": 0}}");
    ck_assert_int_eq(cm_optim_to_json(&a, buf, 20), CM_ERANGE);
  }
}
END_TEST

/* Only what the update uses counts. */
START_TEST(test_same) {
  struct cm_optim a, b;

  cm_optim_defaults(&a);
  b = a;
  ck_assert_int_eq(cm_optim_same(&a, &b), 1);
  b.beta1 = 0.5; /* momentum does not use it */
  ck_assert_int_eq(cm_optim_same(&a, &b), 1);
  b.momentum = 0.8;
  ck_assert_int_eq(cm_optim_same(&a, &b), 0);
  b = a;
  b.type = CM_OPT_NESTEROV;
  ck_assert_int_eq(cm_optim_same(&a, &b), 0);
  b = a;
  b.lr = 0.05000001;
  ck_assert_int_eq(cm_optim_same(&a, &b), 0);
  b = a;
  b.schedule.gamma = 0.5; /* a constant schedule does not use it */
  ck_assert_int_eq(cm_optim_same(&a, &b), 1);
  b.schedule.warmup_steps = 1;
  ck_assert_int_eq(cm_optim_same(&a, &b), 0);
  a.type = b.type = CM_OPT_ADAM;
  b = a;
  b.momentum = 0.1;
  ck_assert_int_eq(cm_optim_same(&a, &b), 1);
  b.eps = 1e-7;
  ck_assert_int_eq(cm_optim_same(&a, &b), 0);
}
END_TEST

static Suite *spec_optjson_suite(void) {
  Suite *s = suite_create("spec-optjson");
  TCase *tc = tcase_create("optjson");

  tcase_add_test(tc, test_defaults_and_keys);
  tcase_add_test(tc, test_mistakes);
  tcase_add_test(tc, test_round_trip);
  tcase_add_test(tc, test_same);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(spec_optjson_suite(), 0); }
