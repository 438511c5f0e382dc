/* job.ctr (job_tables.h): the click-through-rate model's settings
 *   {"format": "libsvm", "fields": 8, "pooling": "sum",
 *    "embedding_table": "emb",
 *    "wide_table": "wide",
 *    "generate": {"train": 500000, "test": 50000, "seed": 7, "zipf": 1.6}}
 * docs/ctr.md says what each does. */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "jcheck.h"
#include "job_tables.h"

void cm__parse_ctr(struct cm__errs *e, json_t *job, struct cm_job *out) {
  static const char *const keys[] = {"format",     "fields",
                                     "pooling",    "embedding_table",
                                     "wide_table", "generate"};
  static const char *const formats[] = {"libsvm", "criteo", NULL};
  static const char *const gkeys[] = {"train", "test", "seed", "zipf"};
  static const char *const poolings[] = {"sum", "mean", NULL};
  struct cm_ctr_conf *c = &out->ctr;
  long long x;
  c->fields = 8;
  snprintf(c->format, sizeof c->format, "libsvm");
  snprintf(c->pooling, sizeof c->pooling, "sum");
  snprintf(c->emb_table, sizeof c->emb_table, "emb");
  snprintf(c->wide_table, sizeof c->wide_table, "wide");
  c->train = 500000;
  c->test = 50000;
  c->data_seed = 7;
  c->zipf = 1.6;
  json_t *o = cm__opt_object(e, job, "job", "ctr",
                             "an object like {\"fields\": 8, \"generate\": "
                             "{\"train\": 200000}}");
  if (!o)
    return;
  if (strcmp(out->model, "ctr") != 0) {
    cm__report(e, "job.ctr",
               "only for job.model \"ctr\" (this job's is \"%s\")", out->model);
    return;
  }
  cm__check_keys(e, o, "job.ctr", keys, sizeof keys / sizeof keys[0]);
  cm__opt_choice(e, o, "job.ctr", "format", formats, c->format,
                 sizeof c->format);
  int criteo = !strcmp(c->format, "criteo");
  if (criteo) { /* 26 categorical and 13 integer features */
    c->fields = 39;
    c->train = 5000000;
    c->test = 100000;
  }
  if (criteo && json_object_get(o, "fields"))
    cm__report(e, "job.ctr.fields",
               "not with format \"criteo\" (its 39 fields are 26 "
               "categorical and 13 integer features)");
  else
    cm__opt_int(e, o, "job.ctr", "fields", 1, 64, &c->fields);
  cm__opt_choice(e, o, "job.ctr", "pooling", poolings, c->pooling,
                 sizeof c->pooling);
  cm__opt_string(e, o, "job.ctr", "embedding_table", c->emb_table,
                 sizeof c->emb_table);
  cm__opt_string(e, o, "job.ctr", "wide_table", c->wide_table,
                 sizeof c->wide_table);
  json_t *g = cm__opt_object(e, o, "job.ctr", "generate",
                             "an object like {\"train\": 200000, \"test\": "
                             "50000}");
  if (!g)
    return;
  cm__check_keys(e, g, "job.ctr.generate", gkeys,
                 sizeof gkeys / sizeof gkeys[0]);
  json_t *v;
  if (criteo && json_object_get(g, "zipf"))
    cm__report(e, "job.ctr.generate.zipf",
               "only for format \"libsvm\" (the Criteo format's draws are "
               "its own: docs/ctr.md)");
  if ((v = json_object_get(g, "train")) &&
      cm__want_int(e, v, "job.ctr.generate.train", 1, 1LL << 32, &x))
    c->train = x;
  if ((v = json_object_get(g, "test")) &&
      cm__want_int(e, v, "job.ctr.generate.test", 1, 1LL << 32, &x))
    c->test = x;
  if ((v = json_object_get(g, "seed")) &&
      cm__want_int(e, v, "job.ctr.generate.seed", 0, LLONG_MAX, &x))
    c->data_seed = (uint64_t)x;
  cm__opt_number(e, g, "job.ctr.generate", "zipf", 1, 0, 4,
                 "a number in (1, 4)", &c->zipf);
}
