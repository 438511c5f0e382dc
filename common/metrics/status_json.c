/* A shard's Admin/Status answer as JSON (status_json.h): StatusResponse's
 * fields under their proto names; histograms keep their bounds and
 * per-bucket counts. */
#include "status_json.h"

#include <string.h>

#include <stdio.h>

/* {"name", "bounds", "counts", "sum", "count"}, as in the message. */
static json_t *hist_json(const Psd__V1__Histogram *h) {
  json_t *b = json_array(), *n = json_array();
  for (size_t i = 0; i < h->n_bounds; i++)
    json_array_append_new(b, json_real(h->bounds[i]));
  for (size_t i = 0; i < h->n_counts; i++)
    json_array_append_new(n, json_integer((json_int_t)h->counts[i]));
  return json_pack("{s:s, s:o, s:o, s:f, s:I}", "name", h->name, "bounds", b,
                   "counts", n, "sum", h->sum, "count", (json_int_t)h->count);
}

/* The shard's embedding tables, as TableStatus has them. */
static json_t *tables_json(const Psd__V1__StatusResponse *resp) {
  json_t *a = json_array();
  for (size_t i = 0; a && i < resp->n_tables; i++) {
    const Psd__V1__TableStatus *t = resp->tables[i];
    json_t *state = json_array();
    for (size_t k = 0; state && k < t->n_state; k++)
      json_array_append_new(state, json_string(t->state[k]));
    json_array_append_new(
        a, json_pack("{s:s, s:i, s:I, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, "
                     "s:I, s:I, s:s, s:s, s:o}",
                     "name", t->name, "dim", (int)t->dim, "id_bound",
                     (json_int_t)t->id_bound, "optimizer", t->optimizer, "rows",
                     (json_int_t)t->rows, "bytes", (json_int_t)t->bytes,
                     "raw_bytes", (json_int_t)t->raw_bytes, "admitted",
                     (json_int_t)t->admitted, "not_admitted",
                     (json_int_t)t->not_admitted, "evicted",
                     (json_int_t)t->evicted, "pending", (json_int_t)t->pending,
                     "rows_pulled", (json_int_t)t->rows_pulled, "rows_pushed",
                     (json_int_t)t->rows_pushed, "admission", t->admission,
                     "eviction", t->eviction, "state", state));
  }
  return a;
}

/* ps:0's figures of a live move (MoveStatus), under their proto names,
 * and "left", the bucket moves not made yet. */
static json_t *move_json(const Psd__V1__MoveStatus *m) {
  json_t *o = json_object();
  json_object_set_new(o, "running", json_boolean(m->running));
  json_object_set_new(o, "from", json_integer(m->from));
  json_object_set_new(o, "to", json_integer(m->to));
  json_object_set_new(o, "moves", json_integer(m->moves));
  json_object_set_new(o, "moved", json_integer(m->moved));
  json_object_set_new(
      o, "left", json_integer(m->moves > m->moved ? m->moves - m->moved : 0));
  json_object_set_new(o, "batch", json_integer(m->batch));
  json_object_set_new(o, "batches", json_integer(m->batches));
  json_object_set_new(o, "rows", json_integer((json_int_t)m->rows));
  json_object_set_new(o, "bytes", json_integer((json_int_t)m->bytes));
  json_object_set_new(o, "bytes_per_s", json_real(m->bytes_per_s));
  json_object_set_new(o, "lag_rows", json_integer((json_int_t)m->lag_rows));
  json_object_set_new(o, "last_rounds", json_integer(m->last_rounds));
  json_object_set_new(o, "last_pause_us",
                      json_integer((json_int_t)m->last_pause_us));
  json_object_set_new(o, "max_pause_us",
                      json_integer((json_int_t)m->max_pause_us));
  json_object_set_new(o, "rate_mbps", json_real(m->rate_mbps));
  json_object_set_new(o, "waits", json_integer(m->waits));
  json_object_set_new(o, "waited_s", json_real(m->waited_s));
  json_object_set_new(o, "cancelled", json_boolean(m->cancelled));
  json_object_set_new(o, "elapsed_s", json_real(m->elapsed_s));
  return o;
}

json_t *cm_status_json(const Psd__V1__StatusResponse *resp) {
  json_t *root, *vars;

  root = json_pack("{s:i, s:i, s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:f, "
                   "s:I}",
                   "shard", resp->shard, "num_shards", resp->num_shards, "job",
                   resp->job, "mode", resp->mode, "pulls",
                   (json_int_t)resp->pulls, "pushes", (json_int_t)resp->pushes,
                   "examples", (json_int_t)resp->examples, "bytes_in",
                   (json_int_t)resp->bytes_in, "bytes_out",
                   (json_int_t)resp->bytes_out, "errors",
                   (json_int_t)resp->errors, "uptime_s", resp->uptime_s,
                   "unauthenticated", (json_int_t)resp->unauthenticated);
  if (root) { /* job.nonfinite: pushes with NaN or Inf, and the policy */
    json_object_set_new(root, "nonfinite_pushes",
                        json_integer((json_int_t)resp->nonfinite_pushes));
    json_object_set_new(root, "nonfinite", json_string(resp->nonfinite));
  }
  vars = json_array();
  for (size_t i = 0; root && i < resp->n_vars; i++) {
    const Psd__V1__VarStatus *v = resp->vars[i];
    json_t *shape = json_array(), *slots = json_array();
    for (size_t d = 0; d < v->n_shape; d++)
      json_array_append_new(shape, json_integer(v->shape[d]));
    for (size_t k = 0; k < v->n_slots; k++)
      json_array_append_new(slots, json_string(v->slots[k]));
    json_array_append_new(
        vars,
        json_pack("{s:s, s:o, s:[I, I], s:I, s:I, s:s, s:i, s:o}", "name",
                  v->name, "shape", shape, "rows", (json_int_t)v->row_begin,
                  (json_int_t)v->row_end, "version", (json_int_t)v->version,
                  "bytes", (json_int_t)v->bytes, "optimizer", v->optimizer,
                  "placement", v->placement, "slots", slots));
  }
  if (!root) {
    json_decref(vars);
    return NULL;
  }
  json_object_set_new(root, "vars", vars);
  json_object_set_new(root, "tables", tables_json(resp));
  json_object_set_new(root, "step", json_integer((json_int_t)resp->step));
  json_object_set_new(root, "duplicates",
                      json_integer((json_int_t)resp->duplicates));
  json_object_set_new(root, "rollbacks",
                      json_integer((json_int_t)resp->rollbacks));
  json_object_set_new(root, "rollback_step",
                      json_integer((json_int_t)resp->rollback_step));
  json_object_set_new(root, "resumed", json_boolean(resp->resumed));
  /* The layout (docs/reshard.md "Live"). */
  json_object_set_new(root, "layout", json_integer((json_int_t)resp->layout));
  json_object_set_new(root, "standby", json_boolean(resp->standby));
  json_object_set_new(root, "rows", json_string(resp->rows ? resp->rows : ""));
  json_object_set_new(root, "move_to", json_integer((json_int_t)resp->move_to));
  json_object_set_new(root, "moved", json_integer((json_int_t)resp->moved));
  json_object_set_new(root, "buckets_owned",
                      json_integer((json_int_t)resp->buckets_owned));
  json_object_set_new(root, "reshard",
                      json_string(resp->reshard ? resp->reshard : ""));
  if (resp->move) /* ps:0, once it has driven a live move */
    json_object_set_new(root, "move", move_json(resp->move));
  { /* hex: JSON integers stop at 2^63 */
    char boot[17];
    snprintf(boot, sizeof boot, "%016llx", (unsigned long long)resp->boot);
    json_object_set_new(root, "boot", json_string(boot));
  }
  json_object_set_new(root, "dedup_clients",
                      json_integer((json_int_t)resp->dedup_clients));
  json_object_set_new(root, "dedup_evicted",
                      json_integer((json_int_t)resp->dedup_evicted));
  json_object_set_new(root, "coordinator", json_boolean(resp->coordinator));
  {
    json_t *steps = json_array(), *workers = json_array();
    for (size_t i = 0; i < resp->n_steps; i++) {
      const Psd__V1__StepRecord *r = resp->steps[i];
      json_t *a = json_array(), *d = json_array();
      for (size_t k = 0; k < r->n_applied; k++)
        json_array_append_new(a, json_integer(r->applied[k]));
      for (size_t k = 0; k < r->n_dropped; k++)
        json_array_append_new(d, json_integer(r->dropped[k]));
      json_array_append_new(steps, json_pack("{s:I, s:o, s:o}", "step",
                                             (json_int_t)r->step, "applied", a,
                                             "dropped", d));
    }
    for (size_t i = 0; i < resp->n_workers; i++) {
      const Psd__V1__WorkerStatus *w = resp->workers[i];
      json_t *o =
          json_pack("{s:i, s:b, s:b, s:I, s:I, s:I, s:f, s:i}", "worker",
                    w->worker, "live", w->live, "joined", w->joined, "applied",
                    (json_int_t)w->applied, "dropped", (json_int_t)w->dropped,
                    "clock", (json_int_t)w->clock, "last_seen_ms",
                    w->last_seen_ms, "joins", (int)w->joins);
      json_object_set_new(o, "left", json_boolean(w->left));
      json_object_set_new(o, "last_step", json_integer(w->last_step));
      json_object_set_new(o, "pushes", json_integer(w->pushes));
      json_object_set_new(o, "step_samples", json_integer(w->step_samples));
      json_object_set_new(o, "step_p50_ms", json_real(w->step_p50_ms));
      json_object_set_new(o, "step_p95_ms", json_real(w->step_p95_ms));
      json_object_set_new(o, "lag_p50_ms", json_real(w->lag_p50_ms));
      json_object_set_new(o, "lag_p95_ms", json_real(w->lag_p95_ms));
      json_object_set_new(o, "examples", json_integer((json_int_t)w->examples));
      json_object_set_new(o, "examples_per_s", json_real(w->examples_per_s));
      json_object_set_new(o, "windows", json_integer((json_int_t)w->windows));
      json_object_set_new(o, "window_auc", json_real(w->window_auc));
      json_object_set_new(o, "window_logloss", json_real(w->window_logloss));
      if (w->step_time)
        json_object_set_new(o, "step_time", hist_json(w->step_time));
      json_array_append_new(workers, o);
    }
    json_t *hists = json_array();
    for (size_t i = 0; i < resp->n_histograms; i++)
      json_array_append_new(hists, hist_json(resp->histograms[i]));
    json_object_set_new(root, "histograms", hists);
    json_object_set_new(root, "steps", steps);
    json_object_set_new(root, "workers", workers);
    json_object_set_new(root, "max_clock_spread",
                        json_integer((json_int_t)resp->max_clock_spread));
    if (resp->job_rate)
      json_object_set_new(root, "job_rate",
                          json_pack("{s:i, s:I, s:f, s:f}", "workers",
                                    (int)resp->job_rate->workers, "examples",
                                    (json_int_t)resp->job_rate->examples,
                                    "wall_s", resp->job_rate->wall_s,
                                    "examples_per_s",
                                    resp->job_rate->examples_per_s));
  }
  if (resp->checkpoint) {
    const Psd__V1__CheckpointStatus *k = resp->checkpoint;
    json_object_set_new(
        root, "checkpoint",
        json_pack("{s:s, s:I, s:I, s:I, s:s, s:I, s:f, s:s}", "dir", k->dir,
                  "written", (json_int_t)k->written, "failed",
                  (json_int_t)k->failed, "step", (json_int_t)k->step, "path",
                  k->path, "bytes", (json_int_t)k->bytes, "ms", k->ms, "error",
                  k->error));
  }
  if (resp->publish) {
    const Psd__V1__PublishStatus *u = resp->publish;
    json_object_set_new(
        root, "publish",
        json_pack("{s:s, s:I, s:I, s:b, s:I, s:I, s:f, s:I, s:I, s:s, s:I}",
                  "dir", u->dir, "version", (json_int_t)u->version, "step",
                  (json_int_t)u->step, "full", (int)u->full, "rows",
                  (json_int_t)u->rows, "bytes", (json_int_t)u->bytes, "ms",
                  u->ms, "written", (json_int_t)u->written, "failed",
                  (json_int_t)u->failed, "error", u->error, "time_unix_ms",
                  (json_int_t)u->time_unix_ms));
  }
  return root;
}

long long cm_status_int(json_t *o, const char *key) {
  return json_integer_value(json_object_get(o, key));
}

double cm_status_num(json_t *o, const char *key) {
  return json_number_value(json_object_get(o, key));
}

const char *cm_status_str(json_t *o, const char *key) {
  const char *s = json_string_value(json_object_get(o, key));
  return s ? s : "";
}

json_t *cm_status_find_named(json_t *list, const char *name) {
  json_t *e;
  size_t i;
  json_array_foreach(list, i, e) {
    if (strcmp(cm_status_str(e, "name"), name) == 0)
      return e;
  }
  return NULL;
}
