/* job.tables (job_tables.h): a list of embedding tables, each an object
 *   {"name": "emb", "dim": 16, "id_bound": 0, "init": "uniform",
 *    "init_scale": 0.01,
 *    "optimizer": {"type": "adagrad", "lr": 0.05, ...},
 *    "admission": {"type": "count", "count": 3},
 *    "eviction": {"after_steps": 10000, "min_count": 2}}
 * and job.table_defaults, the same settings without name, dim and id_bound:
 * where a table entry leaves a setting out, and for every table a client
 * declares that job.tables does not list. Every mistake names its JSON path
 * (job.tables[1].dim). docs/tables.md says what each setting does. */
#include "job_tables.h"

#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "jcheck.h"

/* Parses one table's optimizer object. */
static void parse_rowopt(struct cm__errs *e, json_t *t, const char *path,
                         struct cm_rowopt *o) {
  static const char *const keys[] = {
      "type", "lr", "eps", "initial_accumulator", "beta1", "beta2",
      "l1",   "l2", "beta"};
  static const char *const types[] = {"sgd",  "adagrad", "rowwise_adagrad",
                                      "adam", "ftrl",    NULL};
  char p[96], type[32] = "";
  json_t *v = cm__opt_object(e, t, path, "optimizer",
                             "an object like {\"type\": \"adagrad\", \"lr\": "
                             "0.05}");
  if (!v)
    return;
  snprintf(p, sizeof p, "%s.optimizer", path);
  cm__check_keys(e, v, p, keys, sizeof keys / sizeof keys[0]);
  cm__opt_choice(e, v, p, "type", types, type, sizeof type);
  if (type[0])
    cm_rowopt_parse(type, &o->type);
  cm__opt_number(e, v, p, "lr", 0, 0, 1e9, "a number > 0", &o->lr);
  cm__opt_number(e, v, p, "eps", 0, 0, 1, "a number in (0, 1)", &o->eps);
  cm__opt_number(e, v, p, "initial_accumulator", 0, 1, 1e9, "a number >= 0",
                 &o->initial_accumulator);
  cm__opt_number(e, v, p, "beta1", 0, 1, 1, "a number in [0, 1)", &o->beta1);
  cm__opt_number(e, v, p, "beta2", 0, 1, 1, "a number in [0, 1)", &o->beta2);
  cm__opt_number(e, v, p, "l1", 0, 1, 1e9, "a number >= 0", &o->l1);
  cm__opt_number(e, v, p, "l2", 0, 1, 1e9, "a number >= 0", &o->l2);
  cm__opt_number(e, v, p, "beta", 0, 1, 1e9, "a number >= 0", &o->ftrl_beta);
}

/* Parses one table's admission and eviction objects. */
static void parse_admit_evict(struct cm__errs *e, json_t *t, const char *path,
                              struct cm_table_conf *c) {
  static const char *const akeys[] = {"type", "count", "probability"};
  static const char *const ekeys[] = {"after_steps", "min_count"};
  static const char *const types[] = {"always", "count", "probability", NULL};
  char p[96], type[16] = "";
  json_t *a = cm__opt_object(e, t, path, "admission",
                             "an object like {\"type\": \"count\", \"count\": "
                             "3}");
  if (a) {
    snprintf(p, sizeof p, "%s.admission", path);
    cm__check_keys(e, a, p, akeys, sizeof akeys / sizeof akeys[0]);
    cm__opt_choice(e, a, p, "type", types, type, sizeof type);
    c->admit = !strcmp(type, "count")         ? CM_ADMIT_COUNT
               : !strcmp(type, "probability") ? CM_ADMIT_PROB
                                              : CM_ADMIT_ALWAYS;
    int count = (int)c->admit_count;
    cm__opt_int(e, a, p, "count", 1, INT_MAX, &count);
    c->admit_count = (uint32_t)count;
    cm__opt_number(e, a, p, "probability", 0, 0, 1.0000001,
                   "a number in (0, 1]", &c->admit_prob);
    if (c->admit != CM_ADMIT_COUNT && json_object_get(a, "count"))
      cm__report(e, p, "\"count\" is only meaningful with \"type\": \"count\"");
    if (c->admit != CM_ADMIT_PROB && json_object_get(a, "probability"))
      cm__report(e, p,
                 "\"probability\" is only meaningful with \"type\": "
                 "\"probability\"");
    if (c->admit == CM_ADMIT_COUNT && !json_object_get(a, "count"))
      cm__report(e, p,
                 "type \"count\" needs \"count\": the pushes an id "
                 "needs before it is stored");
    if (c->admit == CM_ADMIT_PROB && !json_object_get(a, "probability"))
      cm__report(e, p, "type \"probability\" needs \"probability\" in (0, 1]");
  }
  json_t *v = cm__opt_object(e, t, path, "eviction",
                             "an object like {\"after_steps\": 10000}");
  if (v) {
    long long x;
    snprintf(p, sizeof p, "%s.eviction", path);
    cm__check_keys(e, v, p, ekeys, sizeof ekeys / sizeof ekeys[0]);
    json_t *as = json_object_get(v, "after_steps");
    char q[128];
    snprintf(q, sizeof q, "%s.after_steps", p);
    if (as && cm__want_int(e, as, q, 0, LLONG_MAX, &x))
      c->evict_after_steps = (uint64_t)x;
    int mc = 0;
    cm__opt_int(e, v, p, "min_count", 0, INT_MAX, &mc);
    c->evict_min_count = (uint32_t)mc;
  }
}

/* Reads a table's name: 1..CM_TABLE_MAX_NAME bytes, none of them a control
 * character (psctl prints the name, and checkpoint and export files carry
 * it). An escaped NUL never gets here: jansson refuses it. */
static void parse_name(struct cm__errs *e, json_t *t, const char *path,
                       struct cm_table_conf *c) {
  json_t *v = json_object_get(t, "name");
  char np[80];
  if (!v) {
    cm__report(e, path, "needs a \"name\" (1..%d bytes)", CM_TABLE_MAX_NAME);
    return;
  }
  if (!cm__opt_string(e, t, path, "name", c->name, sizeof c->name))
    return;
  snprintf(np, sizeof np, "%s.name", path);
  for (size_t i = 0; i < json_string_length(v); i++) {
    unsigned char ch = (unsigned char)json_string_value(v)[i];
    if (ch < 0x20 || ch == 0x7f) {
      cm__report(e, np,
                 "holds the control character 0x%02x at byte %zu; "
                 "expected printable characters",
                 ch, i);
      c->name[0] = '\0'; /* not compared for duplicates */
      return;
    }
  }
}

/* Parses what a table entry and job.table_defaults share: init,
 * init_scale, optimizer, admission, eviction. */
static void parse_settings(struct cm__errs *e, json_t *t, const char *path,
                           struct cm_table_conf *c) {
  static const char *const inits[] = {"zeros", "uniform", NULL};
  char init[16] = "";
  cm__opt_choice(e, t, path, "init", inits, init, sizeof init);
  if (init[0])
    c->init =
        !strcmp(init, "zeros") ? CM_TABLE_INIT_ZEROS : CM_TABLE_INIT_UNIFORM;
  double scale = c->init_scale;
  cm__opt_number(e, t, path, "init_scale", 0, 1, 1e9, "a number >= 0", &scale);
  c->init_scale = (float)scale;
  /* An object given replaces the default's whole: an entry's optimizer
   * takes nothing from job.table_defaults' optimizer. */
  struct cm_table_conf base;
  cm_table_conf_defaults(&base);
  if (json_object_get(t, "optimizer"))
    c->opt = base.opt;
  if (json_object_get(t, "admission")) {
    c->admit = base.admit;
    c->admit_count = base.admit_count;
    c->admit_prob = base.admit_prob;
  }
  if (json_object_get(t, "eviction")) {
    c->evict_after_steps = base.evict_after_steps;
    c->evict_min_count = base.evict_min_count;
  }
  parse_rowopt(e, t, path, &c->opt);
  parse_admit_evict(e, t, path, c);
}

/* job.table_defaults: the settings of every table a client declares that
 * job.tables does not list. */
static void parse_defaults(struct cm__errs *e, json_t *job,
                           struct cm_job *out) {
  static const char *const keys[] = {"init", "init_scale", "optimizer",
                                     "admission", "eviction"};
  const char *path = "job.table_defaults";
  json_t *d = cm__opt_object(e, job, "job", "table_defaults",
                             "an object like {\"optimizer\": {\"type\": "
                             "\"adagrad\", \"lr\": 0.05}}");
  cm_table_conf_defaults(&out->table_defaults);
  if (!d)
    return;
  cm__check_keys(e, d, path, keys, sizeof keys / sizeof keys[0]);
  parse_settings(e, d, path, &out->table_defaults);
}

void cm__parse_tables(struct cm__errs *e, json_t *job, struct cm_job *out) {
  static const char *const keys[] = {"name",      "dim",        "id_bound",
                                     "init",      "init_scale", "optimizer",
                                     "admission", "eviction"};
  json_t *list = json_object_get(job, "tables"), *t;
  size_t i;
  out->ntables = 0;
  parse_defaults(e, job, out);
  if (!list)
    return;
  if (!json_is_array(list)) {
    cm__report(e, "job.tables",
               "expected a list of tables, like [{\"name\": "
               "\"emb\", \"dim\": 16}]");
    return;
  }
  if (json_array_size(list) > CM_TABLE_MAX) {
    cm__report(e, "job.tables", "%zu tables; at most %d", json_array_size(list),
               CM_TABLE_MAX);
    return;
  }
  json_array_foreach(list, i, t) {
    struct cm_table_conf *c = &out->tables[i];
    char path[64];
    long long x;
    snprintf(path, sizeof path, "job.tables[%zu]", i);
    *c = out->table_defaults;
    if (!cm__want_object(e, t, path, "{\"name\": \"emb\", \"dim\": 16}", keys,
                         sizeof keys / sizeof keys[0]))
      continue;
    parse_name(e, t, path, c);
    json_t *d = json_object_get(t, "dim");
    char dp[80];
    snprintf(dp, sizeof dp, "%s.dim", path);
    if (!d)
      cm__report(e, path, "needs \"dim\": the floats per row, 1..%d",
                 CM_TABLE_MAX_DIM);
    else if (cm__want_int(e, d, dp, 1, CM_TABLE_MAX_DIM, &x))
      c->dim = (uint32_t)x;
    json_t *b = json_object_get(t, "id_bound");
    snprintf(dp, sizeof dp, "%s.id_bound", path);
    if (b && cm__want_int(e, b, dp, 0, LLONG_MAX, &x))
      c->id_bound = (uint64_t)x;
    parse_settings(e, t, path, c);
    for (size_t k = 0; k < i; k++)
      if (c->name[0] && !strcmp(out->tables[k].name, c->name))
        cm__report(e, path,
                   "name \"%s\" is job.tables[%zu]'s too; table "
                   "names are unique",
                   c->name, k);
    out->ntables = (int)i + 1;
  }
}
