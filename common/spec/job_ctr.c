/* job.ctr (job_tables.h): the click-through-rate model's settings
 *   {"format": "libsvm", "fields": 8, "pooling": "sum",
 *    "embedding_table": "emb",
 *    "wide_table": "wide",
 *    "generate": {"train": 500000, "test": 50000, "seed": 7, "zipf": 1.6},
 *    "stream": {"dir": "parts", "poll_s": 0.5, "end": "END"}}
 * ("stream": "dir" or "file", "window" with "file" only)
 * docs/ctr.md says what each does. */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "jcheck.h"
#include "job_tables.h"

/* job.ctr.stream: a directory or a file, how often to look, the marker. */
static void parse_stream(struct cm__errs *e, json_t *o, struct cm_ctr_conf *c,
                         int criteo) {
  static const char *const skeys[] = {"dir", "file", "poll_s", "end", "window"};
  json_t *s = cm__opt_object(e, o, "job.ctr", "stream",
                             "an object like {\"dir\": \"parts\", "
                             "\"poll_s\": 0.5}");
  if (!s)
    return;
  cm__check_keys(e, s, "job.ctr.stream", skeys, sizeof skeys / sizeof skeys[0]);
  int has_dir = json_object_get(s, "dir") != NULL;
  int file = json_object_get(s, "file") != NULL;
  cm__opt_string(e, s, "job.ctr.stream", "dir", c->stream_dir,
                 sizeof c->stream_dir);
  cm__opt_string(e, s, "job.ctr.stream", "file", c->stream_file,
                 sizeof c->stream_file);
  if (has_dir == file)
    cm__report(e, "job.ctr.stream",
               "needs one of \"dir\" (a directory of parts) or \"file\" "
               "(one growing file), %s",
               file ? "not both" : "got neither");
  if (file && criteo)
    cm__report(e, "job.ctr.stream.file",
               "only for format \"libsvm\" (Criteo parts: use "
               "\"dir\")");
  if (cm__opt_string(e, s, "job.ctr.stream", "end", c->stream_end,
                     sizeof c->stream_end) &&
      strchr(c->stream_end, '/'))
    cm__report(e, "job.ctr.stream.end",
               "a file name, not a path ('%s' has a '/')", c->stream_end);
  cm__opt_number(e, s, "job.ctr.stream", "poll_s", 0, 0, 60,
                 "a number of seconds in (0, 60)", &c->stream_poll_s);
  json_t *v = json_object_get(s, "window");
  long long x;
  if (v && !file)
    cm__report(e, "job.ctr.stream.window",
               "only with \"file\" (a directory's window is a part)");
  else if (v && cm__want_int(e, v, "job.ctr.stream.window", 1, 1LL << 32, &x))
    c->stream_window = x;
}

void cm__parse_ctr(struct cm__errs *e, json_t *job, struct cm_job *out) {
  static const char *const keys[] = {
      "format",     "fields",   "pooling", "embedding_table",
      "wide_table", "generate", "stream"};
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
  snprintf(c->stream_end, sizeof c->stream_end, "END");
  c->stream_poll_s = 0.5;
  c->stream_window = 10000;
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
  parse_stream(e, o, c, criteo);
  if ((c->stream_dir[0] || c->stream_file[0]) && !strcmp(out->mode, "sync"))
    cm__report(e, "job.ctr.stream",
               "only with job.sync.mode \"async\" (a stream has no step "
               "count for the workers to share)");
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
