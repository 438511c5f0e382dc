/* Unit tests for common/spec/job_tables.c: job.tables read into the job's
 * table settings (defaults, every key, every optimizer), and every mistake
 * reported at its JSON path: ranges, types, unknown keys, missing and bad
 * names, duplicates naming both entries, admission and eviction. */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "spec.h"
#include "spec_fixture.h"
#include "unit.h"

/* A name and dim alone: everything else is cm_table_conf_defaults. */
START_TEST(test_defaults) {
  struct cm_spec *spec = NULL;
  struct cm_table_conf def;
  const struct cm_table_conf *c;

  ck_assert_msg(parse(ONE_WORKER("\"tables\": [{\"name\": \"emb\", \"dim\": "
                                 "16}]"),
                      &spec) == 0,
                "err: %s", err);
  ck_assert_int_eq(spec->job.ntables, 1);
  c = &spec->job.tables[0];
  cm_table_conf_defaults(&def);
  ck_assert_str_eq(c->name, "emb");
  ck_assert_uint_eq(c->dim, 16);
  ck_assert_uint_eq(c->id_bound, 0);
  ck_assert_int_eq(c->init, CM_TABLE_INIT_UNIFORM);
  ck_assert_float_eq(c->init_scale, 0.01f);
  ck_assert_int_eq(c->opt.type, CM_ROWOPT_ADAGRAD);
  ck_assert_double_eq(c->opt.lr, 0.05);
  ck_assert_double_eq(c->opt.eps, 1e-8);
  ck_assert_double_eq(c->opt.initial_accumulator, 0.1);
  ck_assert_int_eq(c->admit, CM_ADMIT_ALWAYS);
  ck_assert_uint_eq(c->evict_after_steps, 0);
  ck_assert_uint_eq(c->evict_min_count, 0);
  /* Nothing else differs from the defaults. */
  def.dim = 16;
  snprintf(def.name, sizeof def.name, "emb");
  ck_assert_int_eq(memcmp(&def, c, sizeof def), 0);
  cm_spec_free(spec);
  spec = NULL;

  /* No job.tables: none; an empty list: none. */
  ck_assert_int_eq(parse(ONE_WORKER("\"name\": \"j\""), &spec), 0);
  ck_assert_int_eq(spec->job.ntables, 0);
  cm_spec_free(spec);
  spec = NULL;
  ck_assert_int_eq(parse(ONE_WORKER("\"tables\": []"), &spec), 0);
  ck_assert_int_eq(spec->job.ntables, 0);
  cm_spec_free(spec);
}
END_TEST

/* Every key of two tables, in their order. */
START_TEST(test_every_key) {
  struct cm_spec *spec = NULL;
  const struct cm_table_conf *a, *b;

  ck_assert_msg(
      parse(ONE_WORKER(
                "\"seed\": 7, \"tables\": ["
                "{\"name\": \"user\", \"dim\": 1024, \"id_bound\": 1000000,"
                " \"init\": \"zeros\", \"init_scale\": 0,"
                " \"optimizer\": {\"type\": \"ftrl\", \"lr\": 0.1,"
                " \"initial_accumulator\": 0, \"l1\": 1.5, \"l2\": 0.25,"
                " \"beta\": 2},"
                " \"admission\": {\"type\": \"count\", \"count\": 3},"
                " \"eviction\": {\"after_steps\": 10000, \"min_count\": 2}},"
                "{\"name\": \"item/emb v2\", \"dim\": 1, \"init\": "
                "\"uniform\", \"init_scale\": 0.5,"
                " \"optimizer\": {\"type\": \"adam\", \"lr\": 0.001,"
                " \"eps\": 1e-6, \"beta1\": 0, \"beta2\": 0.99},"
                " \"admission\": {\"type\": \"probability\","
                " \"probability\": 1},"
                " \"eviction\": {\"after_steps\": 0}}]"),
            &spec) == 0,
      "err: %s", err);
  ck_assert_int_eq(spec->job.ntables, 2);
  a = &spec->job.tables[0];
  b = &spec->job.tables[1];
  ck_assert_str_eq(a->name, "user");
  ck_assert_uint_eq(a->dim, 1024);
  ck_assert_uint_eq(a->id_bound, 1000000);
  ck_assert_int_eq(a->init, CM_TABLE_INIT_ZEROS);
  ck_assert_float_eq(a->init_scale, 0);
  ck_assert_int_eq(a->opt.type, CM_ROWOPT_FTRL);
  ck_assert_double_eq(a->opt.lr, 0.1);
  ck_assert_double_eq(a->opt.initial_accumulator, 0);
  ck_assert_double_eq(a->opt.l1, 1.5);
  ck_assert_double_eq(a->opt.l2, 0.25);
  ck_assert_double_eq(a->opt.ftrl_beta, 2);
  ck_assert_int_eq(a->admit, CM_ADMIT_COUNT);
  ck_assert_uint_eq(a->admit_count, 3);
  ck_assert_uint_eq(a->evict_after_steps, 10000);
  ck_assert_uint_eq(a->evict_min_count, 2);

  ck_assert_str_eq(b->name, "item/emb v2");
  ck_assert_uint_eq(b->dim, 1);
  ck_assert_int_eq(b->init, CM_TABLE_INIT_UNIFORM);
  ck_assert_float_eq(b->init_scale, 0.5f);
  ck_assert_int_eq(b->opt.type, CM_ROWOPT_ADAM);
  ck_assert_double_eq(b->opt.lr, 0.001);
  ck_assert_double_eq(b->opt.eps, 1e-6);
  ck_assert_double_eq(b->opt.beta1, 0);
  ck_assert_double_eq(b->opt.beta2, 0.99);
  ck_assert_int_eq(b->admit, CM_ADMIT_PROB);
  ck_assert_double_eq(b->admit_prob, 1);
  ck_assert_uint_eq(b->evict_after_steps, 0);
  ck_assert_uint_eq(b->evict_min_count, 0);
  cm_spec_free(spec);
}
END_TEST

/* Each optimizer type by name, with its state size. */
START_TEST(test_optimizer_types) {
  static const struct {
    const char *name;
    enum cm_rowopt_type type;
    uint32_t nstate; /* floats of state at dim 8 */
  } want[] = {{"sgd", CM_ROWOPT_SGD, 0},
              {"adagrad", CM_ROWOPT_ADAGRAD, 8},
              {"rowwise_adagrad", CM_ROWOPT_ROWWISE_ADAGRAD, 1},
              {"adam", CM_ROWOPT_ADAM, 16},
              {"ftrl", CM_ROWOPT_FTRL, 16}};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    struct cm_spec *spec = NULL;
    char text[512];
    snprintf(text, sizeof text,
             ONE_WORKER("\"tables\": [{\"name\": \"t\", \"dim\": 8,"
                        " \"optimizer\": {\"type\": \"%s\"}}]"),
             want[i].name);
    ck_assert_msg(parse(text, &spec) == 0, "%s: err: %s", want[i].name, err);
    ck_assert_int_eq(spec->job.tables[0].opt.type, want[i].type);
    ck_assert_str_eq(cm_rowopt_name(spec->job.tables[0].opt.type),
                     want[i].name);
    ck_assert_uint_eq(cm_rowopt_nstate(want[i].type, 8), want[i].nstate);
    /* The type alone keeps the other hyper-parameters' defaults. */
    ck_assert_double_eq(spec->job.tables[0].opt.lr, 0.05);
    cm_spec_free(spec);
  }
}
END_TEST

/* Names: the longest allowed, too long, empty, missing, of the wrong type,
 * with a control character (an escaped NUL is a syntax error). */
START_TEST(test_names) {
  struct cm_spec *spec = NULL;
  char text[1024], name[CM_TABLE_MAX_NAME + 2];

  memset(name, 'n', CM_TABLE_MAX_NAME);
  name[CM_TABLE_MAX_NAME] = '\0';
  snprintf(text, sizeof text,
           ONE_WORKER("\"tables\": [{\"name\": \"%s\", \"dim\": 2}]"), name);
  ck_assert_msg(parse(text, &spec) == 0, "err: %s", err);
  ck_assert_uint_eq(strlen(spec->job.tables[0].name), CM_TABLE_MAX_NAME);
  cm_spec_free(spec);

  strcat(name, "n");
  snprintf(text, sizeof text,
           ONE_WORKER("\"tables\": [{\"name\": \"%s\", \"dim\": 2}]"), name);
  parse_bad(text);
  ck_assert_str_eq(err, "t.json: job.tables[0].name: 201 characters long; "
                        "expected at most 200");

  parse_bad(ONE_WORKER("\"tables\": [{\"name\": \"\", \"dim\": 2}]"));
  ck_assert_str_eq(err, "t.json: job.tables[0].name: empty; expected a "
                        "non-empty string");
  parse_bad(ONE_WORKER("\"tables\": [{\"dim\": 2}]"));
  ck_assert_str_eq(err, "t.json: job.tables[0]: needs a \"name\" (1..200 "
                        "bytes)");
  parse_bad(ONE_WORKER("\"tables\": [{\"name\": 5, \"dim\": 2}]"));
  ck_assert_str_eq(err, "t.json: job.tables[0].name: expected a string, got 5");
  parse_bad(ONE_WORKER("\"tables\": [{\"name\": \"a\\tb\", \"dim\": 2}]"));
  ck_assert_str_eq(err, "t.json: job.tables[0].name: holds the control "
                        "character 0x09 at byte 1; expected printable "
                        "characters");
  parse_bad(ONE_WORKER("\"tables\": [{\"name\": \"ab\\u0000\", \"dim\": 2}]"));
  /* jansson refuses an escaped NUL before job.tables sees it. */
  has_text("JSON syntax error: \\u0000 is not allowed");
  parse_bad(ONE_WORKER("\"tables\": [{\"name\": \"x\\u007f\", \"dim\": 2}]"));
  has_text("job.tables[0].name: holds the control character 0x7f at byte 1");
}
END_TEST

/* A name twice is refused naming both entries; a bad name is not compared. */
START_TEST(test_duplicates) {
  parse_bad(ONE_WORKER("\"tables\": [{\"name\": \"a\", \"dim\": 2},"
                       " {\"name\": \"b\", \"dim\": 2},"
                       " {\"name\": \"a\", \"dim\": 4}]"));
  ck_assert_str_eq(err, "t.json: job.tables[2]: name \"a\" is "
                        "job.tables[0]'s too; table names are unique");
  parse_bad(ONE_WORKER("\"tables\": [{\"name\": \"a\", \"dim\": 2},"
                       " {\"name\": \"a\", \"dim\": 2},"
                       " {\"name\": \"a\", \"dim\": 2}]"));
  has_line("t.json: job.tables[1]: name \"a\" is job.tables[0]'s too; table "
           "names are unique");
  has_line("t.json: job.tables[2]: name \"a\" is job.tables[0]'s too; table "
           "names are unique");
  has_line("t.json: job.tables[2]: name \"a\" is job.tables[1]'s too; table "
           "names are unique");
  ck_assert_int_eq(count_lines(err), 3);
}
END_TEST

/* The list itself: its type, an entry's type, too many tables. */
START_TEST(test_list_mistakes) {
  char text[8192];
  size_t used;

  parse_bad(ONE_WORKER("\"tables\": {\"name\": \"emb\", \"dim\": 16}"));
  ck_assert_str_eq(err, "t.json: job.tables: expected a list of tables, like "
                        "[{\"name\": \"emb\", \"dim\": 16}]");
  parse_bad(ONE_WORKER("\"tables\": [{\"name\": \"a\", \"dim\": 2}, "
                       "\"b\"]"));
  ck_assert_str_eq(err, "t.json: job.tables[1]: expected an object like "
                        "{\"name\": \"emb\", \"dim\": 16}, got \"b\"");

  used = (size_t)snprintf(text, sizeof text, "%s",
                          "{\"cluster\": {\"ps\": [\"h:1\"], \"worker\": "
                          "[\"h:2\"]}, \"job\": {\"tables\": [");
  for (int i = 0; i <= CM_TABLE_MAX; i++)
    used +=
        (size_t)snprintf(text + used, sizeof text - used,
                         "%s{\"name\": \"t%d\", \"dim\": 1}", i ? "," : "", i);
  snprintf(text + used, sizeof text - used, "]}}");
  parse_bad(text);
  ck_assert_str_eq(err, "t.json: job.tables: 65 tables; at most 64");
}
END_TEST

/* Ranges and types of a table's own keys, and unknown keys at each level,
 * all reported by one parse. */
START_TEST(test_table_mistakes) {
  parse_bad(ONE_WORKER("\"tables\": [{\"name\": \"a\", \"dim\": 0},"
                       " {\"name\": \"b\", \"dim\": 1025, \"id_bound\": -1,"
                       " \"init\": \"normal\", \"init_scale\": -0.1},"
                       " {\"name\": \"c\", \"dims\": 4},"
                       " {\"name\": \"d\", \"dim\": \"8\"}]"));
  has_line("t.json: job.tables[0].dim: expected a positive integer, got 0");
  has_line("t.json: job.tables[1].dim: 1025 out of range; expected a positive "
           "integer up to 1024");
  has_line("t.json: job.tables[1].id_bound: expected a non-negative integer, "
           "got -1");
  has_line("t.json: job.tables[1].init: expected \"zeros\" or \"uniform\", got "
           "\"normal\"");
  has_line("t.json: job.tables[1].init_scale: expected a number >= 0, got "
           "-0.1");
  has_text("t.json: job.tables[2].dims: unknown key (did you mean dim?)");
  has_line("t.json: job.tables[2]: needs \"dim\": the floats per row, 1..1024");
  has_line("t.json: job.tables[3].dim: expected a positive integer, got "
           "\"8\"");
  ck_assert_int_eq(count_lines(err), 8);
}
END_TEST

/* The optimizer object: its type, each hyper-parameter's range, unknown
 * keys. */
START_TEST(test_optimizer_mistakes) {
  parse_bad(ONE_WORKER("\"tables\": [{\"name\": \"a\", \"dim\": 2,"
                       " \"optimizer\": {\"type\": \"lion\", \"lr\": 0,"
                       " \"eps\": 1, \"initial_accumulator\": -1,"
                       " \"beta1\": 1, \"beta2\": -0.5, \"l1\": -1,"
                       " \"l2\": -2, \"beta\": -3, \"momentum\": 0.9}}]"));
  has_line("t.json: job.tables[0].optimizer.type: expected \"sgd\", "
           "\"adagrad\", \"rowwise_adagrad\", \"adam\" or \"ftrl\", got "
           "\"lion\"");
  has_line("t.json: job.tables[0].optimizer.lr: expected a number > 0, got 0");
  has_line("t.json: job.tables[0].optimizer.eps: expected a number in (0, 1), "
           "got 1");
  has_line("t.json: job.tables[0].optimizer.initial_accumulator: expected a "
           "number >= 0, got -1");
  has_line("t.json: job.tables[0].optimizer.beta1: expected a number in [0, "
           "1), got 1");
  has_line("t.json: job.tables[0].optimizer.beta2: expected a number in [0, "
           "1), got -0.5");
  has_line("t.json: job.tables[0].optimizer.l1: expected a number >= 0, got "
           "-1");
  has_line("t.json: job.tables[0].optimizer.l2: expected a number >= 0, got "
           "-2");
  has_line("t.json: job.tables[0].optimizer.beta: expected a number >= 0, got "
           "-3");
  has_text("t.json: job.tables[0].optimizer.momentum: unknown key");
  ck_assert_int_eq(count_lines(err), 10);

  parse_bad(ONE_WORKER("\"tables\": [{\"name\": \"a\", \"dim\": 2,"
                       " \"optimizer\": \"adagrad\"}]"));
  ck_assert_str_eq(err, "t.json: job.tables[0].optimizer: expected an object "
                        "like {\"type\": \"adagrad\", \"lr\": 0.05}, got "
                        "\"adagrad\"");
}
END_TEST

/* Admission and eviction: what a type needs, keys of another type, ranges,
 * unknown keys. */
START_TEST(test_admission_eviction_mistakes) {
  parse_bad(ONE_WORKER("\"tables\": ["
                       "{\"name\": \"a\", \"dim\": 2,"
                       " \"admission\": {\"type\": \"count\"}},"
                       "{\"name\": \"b\", \"dim\": 2,"
                       " \"admission\": {\"type\": \"probability\"}},"
                       "{\"name\": \"c\", \"dim\": 2,"
                       " \"admission\": {\"type\": \"always\", \"count\": 2,"
                       " \"probability\": 0.5}},"
                       "{\"name\": \"d\", \"dim\": 2,"
                       " \"admission\": {\"type\": \"probability\","
                       " \"probability\": 0}},"
                       "{\"name\": \"e\", \"dim\": 2,"
                       " \"admission\": {\"type\": \"count\", \"count\": 0,"
                       " \"after\": 1}}]"));
  has_line("t.json: job.tables[0].admission: type \"count\" needs \"count\": "
           "the pushes an id needs before it is stored");
  has_line("t.json: job.tables[1].admission: type \"probability\" needs "
           "\"probability\" in (0, 1]");
  has_line("t.json: job.tables[2].admission: \"count\" is only meaningful "
           "with \"type\": \"count\"");
  has_line("t.json: job.tables[2].admission: \"probability\" is only "
           "meaningful with \"type\": \"probability\"");
  has_line("t.json: job.tables[3].admission.probability: expected a number in "
           "(0, 1], got 0");
  has_line("t.json: job.tables[4].admission.count: expected a positive "
           "integer, got 0");
  has_text("t.json: job.tables[4].admission.after: unknown key");
  ck_assert_int_eq(count_lines(err), 7);

  parse_bad(ONE_WORKER("\"tables\": [{\"name\": \"a\", \"dim\": 2,"
                       " \"admission\": {\"type\": \"probability\","
                       " \"probability\": 1.5},"
                       " \"eviction\": {\"after_steps\": -1, \"min_count\":"
                       " 1.5, \"max_rows\": 10}}]"));
  has_line("t.json: job.tables[0].admission.probability: expected a number in "
           "(0, 1], got 1.5");
  has_line("t.json: job.tables[0].eviction.after_steps: expected a "
           "non-negative integer, got -1");
  has_line("t.json: job.tables[0].eviction.min_count: expected a non-negative "
           "integer, got 1.5");
  has_text("t.json: job.tables[0].eviction.max_rows: unknown key");
  ck_assert_int_eq(count_lines(err), 4);

  parse_bad(ONE_WORKER("\"tables\": [{\"name\": \"a\", \"dim\": 2,"
                       " \"admission\": \"count\", \"eviction\": 100}]"));
  has_line("t.json: job.tables[0].admission: expected an object like "
           "{\"type\": \"count\", \"count\": 3}, got \"count\"");
  has_line("t.json: job.tables[0].eviction: expected an object like "
           "{\"after_steps\": 10000}, got 100");
  ck_assert_int_eq(count_lines(err), 2);
}
END_TEST

/* job.table_defaults: the settings of every table a client declares that
 * job.tables does not list, and what an entry leaves out; an entry's own
 * keys win. */
START_TEST(test_table_defaults) {
  struct cm_spec *spec = NULL;
  struct cm_table_conf def;
  const struct cm_table_conf *d, *a, *b;

  ck_assert_msg(
      parse(ONE_WORKER("\"table_defaults\": {\"init\": \"zeros\","
                       " \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.5,"
                       " \"initial_accumulator\": 0.7},"
                       " \"admission\": {\"type\": \"count\", \"count\": 2}},"
                       " \"tables\": [{\"name\": \"a\", \"dim\": 4},"
                       " {\"name\": \"b\", \"dim\": 8, \"init\": \"uniform\","
                       " \"optimizer\": {\"type\": \"adam\", \"lr\": 0.01}}]"),
            &spec) == 0,
      "err: %s", err);
  d = &spec->job.table_defaults;
  a = &spec->job.tables[0];
  b = &spec->job.tables[1];
  ck_assert_int_eq(d->init, CM_TABLE_INIT_ZEROS);
  ck_assert_int_eq(d->opt.type, CM_ROWOPT_SGD);
  ck_assert_double_eq(d->opt.lr, 0.5);
  ck_assert_int_eq(d->admit, CM_ADMIT_COUNT);
  ck_assert_uint_eq(d->admit_count, 2);
  /* An entry leaving them out takes them. */
  ck_assert_int_eq(a->init, CM_TABLE_INIT_ZEROS);
  ck_assert_int_eq(a->opt.type, CM_ROWOPT_SGD);
  ck_assert_double_eq(a->opt.lr, 0.5);
  ck_assert_uint_eq(a->admit_count, 2);
  /* An entry's own win. */
  ck_assert_int_eq(b->init, CM_TABLE_INIT_UNIFORM);
  ck_assert_int_eq(b->opt.type, CM_ROWOPT_ADAM);
  ck_assert_double_eq(b->opt.lr, 0.01);
  /* ... whole: nothing of the default's optimizer object. */
  ck_assert_double_eq(a->opt.initial_accumulator, 0.7);
  ck_assert_double_eq(b->opt.initial_accumulator, 0.1);
  cm_spec_free(spec);
  spec = NULL;

  /* None given: cm_table_conf_defaults. */
  ck_assert_int_eq(parse(ONE_WORKER("\"name\": \"j\""), &spec), 0);
  cm_table_conf_defaults(&def);
  ck_assert_int_eq(memcmp(&def, &spec->job.table_defaults, sizeof def), 0);
  cm_spec_free(spec);

  /* Mistakes at their paths; a table's name, dim and bound are not
   * defaults. */
  parse_bad(ONE_WORKER("\"table_defaults\": {\"dim\": 4, \"init\": \"normal\","
                       " \"optimizer\": {\"type\": \"sgd\", \"lr\": -1}}"));
  has_text("t.json: job.table_defaults.dim: unknown key");
  has_line("t.json: job.table_defaults.init: expected \"zeros\" or "
           "\"uniform\", got \"normal\"");
  has_text("t.json: job.table_defaults.optimizer.lr: expected a number > 0");
  ck_assert_int_eq(count_lines(err), 3);
  parse_bad(ONE_WORKER("\"table_defaults\": [1]"));
  has_line(
      "t.json: job.table_defaults: expected an object like "
      "{\"optimizer\": {\"type\": \"adagrad\", \"lr\": 0.05}}, got an array");
  ck_assert_int_eq(count_lines(err), 1);
}
END_TEST

static Suite *spec_tables_suite(void) {
  Suite *s = suite_create("spec-tables");
  TCase *tc;

  tc = tcase_create("good");
  tcase_add_test(tc, test_defaults);
  tcase_add_test(tc, test_every_key);
  tcase_add_test(tc, test_optimizer_types);
  tcase_add_test(tc, test_table_defaults);
  suite_add_tcase(s, tc);
  tc = tcase_create("bad");
  tcase_add_test(tc, test_names);
  tcase_add_test(tc, test_duplicates);
  tcase_add_test(tc, test_list_mistakes);
  tcase_add_test(tc, test_table_mistakes);
  tcase_add_test(tc, test_optimizer_mistakes);
  tcase_add_test(tc, test_admission_eviction_mistakes);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(spec_tables_suite(), 0); }
