/* Prometheus metric families from status documents, and their text
 * (prom.h). The names, types and help texts are the contract: dashboards
 * (deploy/grafana/psd-dashboard.json) and alerts query them, psctl(1)
 * lists them. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* open_memstream under -std=c11 */
#endif

#include "prom.h"
#include "status_json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Adds a metric family to `all`; returns its samples array (borrowed). */
static json_t *family(json_t *all, const char *name, const char *type,
                      const char *help) {
  json_t *samples = json_array();
  json_array_append_new(all,
                        json_pack("{s:s, s:s, s:s, s:o}", "name", name, "type",
                                  type, "help", help, "samples", samples));
  return samples;
}

/* Adds a sample; labels and value are stolen. */
static void sample(json_t *samples, const char *name, json_t *labels,
                   json_t *value) {
  json_array_append_new(samples, json_pack("{s:s, s:o, s:o}", "name", name,
                                           "labels", labels, "value", value));
}

static json_t *shard_label(int s) {
  char v[16];
  snprintf(v, sizeof v, "%d", s);
  return json_pack("{s:s}", "shard", v);
}

/* The samples of one histogram (bucket counts from the status document,
 * per bucket) under `labels` (borrowed; each sample gets a copy). */
static void hist_samples(json_t *samples, const char *base, json_t *labels,
                         json_t *h) {
  char name[128], le[32];
  json_t *bounds = json_object_get(h, "bounds"),
         *counts = json_object_get(h, "counts");
  long long cum = 0;
  for (size_t i = 0; i < json_array_size(counts); i++) {
    json_t *l = json_deep_copy(labels);
    cum += json_integer_value(json_array_get(counts, i));
    if (i < json_array_size(bounds))
      snprintf(le, sizeof le, "%g",
               json_number_value(json_array_get(bounds, i)));
    else
      snprintf(le, sizeof le, "+Inf");
    json_object_set_new(l, "le", json_string(le));
    snprintf(name, sizeof name, "%s_bucket", base);
    sample(samples, name, l, json_integer(cum));
  }
  snprintf(name, sizeof name, "%s_sum", base);
  sample(samples, name, json_deep_copy(labels),
         json_real(cm_status_num(h, "sum")));
  snprintf(name, sizeof name, "%s_count", base);
  sample(samples, name, json_deep_copy(labels), json_integer(cum));
}

/* Every family, built from the status documents. */
json_t *cm_prom_families(const struct cm_prom_shard *sh, int n) {
  static const struct {
    const char *key, *name, *type, *help;
  } per_shard[] = {
      {"uptime_s", "psd_uptime_seconds", "gauge", "Seconds since psd started."},
      {"pulls", "psd_pulls_total", "counter", "Pull calls answered."},
      {"pushes", "psd_pushes_total", "counter",
       "Push calls applied (async) or staged (sync)."},
      {"examples", "psd_examples_total", "counter",
       "Examples behind the pushes."},
      {"bytes_in", "psd_received_bytes_total", "counter",
       "Gradient payload bytes received by pushes."},
      {"bytes_out", "psd_sent_bytes_total", "counter",
       "Value payload bytes sent by pulls."},
      {"errors", "psd_errors_total", "counter",
       "Calls answered with an error."},
      {"unauthenticated", "psd_unauthenticated_total", "counter",
       "Calls refused for a missing or wrong bearer token."},
      {"nonfinite_pushes", "psd_nonfinite_pushes_total", "counter",
       "Pushes whose gradient held NaN or Inf, rejected, skipped or applied "
       "(job.nonfinite)."},
      {"duplicates", "psd_duplicate_pushes_total", "counter",
       "Push messages acknowledged without effect: retries of messages "
       "applied already."},
      {"step", "psd_step", "gauge", "Sync: steps committed on the shard."},
      {"buckets_owned", "psd_buckets_owned", "gauge",
       "Buckets of the row map whose table rows the shard holds (0: rows "
       "placed by the modulo rule)."},
  };
  json_t *all = json_array(), *f, *coord = NULL;
  char v[32];

  if (!all)
    return NULL;
  for (int s = 0; s < n; s++)
    if (json_is_true(json_object_get(sh[s].status, "coordinator")))
      coord = sh[s].status;

  f = family(all, "psd_up", "gauge", "1 when the shard answered.");
  for (int s = 0; s < n; s++) {
    json_t *l = shard_label(sh[s].index);
    json_object_set_new(l, "address", json_string(sh[s].address));
    sample(f, "psd_up", l, json_integer(sh[s].status != NULL));
  }
  for (size_t k = 0; k < sizeof per_shard / sizeof per_shard[0]; k++) {
    f = family(all, per_shard[k].name, per_shard[k].type, per_shard[k].help);
    for (int s = 0; s < n; s++) {
      json_t *x =
          sh[s].status ? json_object_get(sh[s].status, per_shard[k].key) : 0;
      /* Steps exist in sync jobs only. */
      if (x && !strcmp(per_shard[k].key, "step") &&
          strcmp(cm_status_str(sh[s].status, "mode"), "sync") != 0)
        continue;
      if (x)
        sample(f, per_shard[k].name, shard_label(sh[s].index),
               json_deep_copy(x));
    }
  }
  json_t *fv = family(all, "psd_variables", "gauge", "Variables declared.");
  json_t *fb = family(all, "psd_held_bytes", "gauge",
                      "Bytes held: values and optimizer slots.");
  for (int s = 0; s < n; s++) {
    json_t *vars = sh[s].status ? json_object_get(sh[s].status, "vars") : NULL,
           *x;
    long long bytes = 0;
    size_t i;
    if (!vars)
      continue;
    json_array_foreach(vars, i, x) bytes += cm_status_int(x, "bytes");
    sample(fv, "psd_variables", shard_label(sh[s].index),
           json_integer(json_array_size(vars)));
    sample(fb, "psd_held_bytes", shard_label(sh[s].index), json_integer(bytes));
  }
  fv = family(all, "psd_variable_version", "gauge",
              "Pushes applied (async) or steps committed (sync) to the "
              "variable's rows on the shard.");
  fb = family(all, "psd_variable_held_bytes", "gauge",
              "Bytes the shard holds for the variable.");
  for (int s = 0; s < n; s++) {
    json_t *vars = sh[s].status ? json_object_get(sh[s].status, "vars") : NULL,
           *x;
    size_t i;
    json_array_foreach(vars, i, x) {
      json_t *rows = json_object_get(x, "rows");
      if (json_integer_value(json_array_get(rows, 1)) <=
          json_integer_value(json_array_get(rows, 0)))
        continue; /* no rows here */
      snprintf(v, sizeof v, "%d", sh[s].index);
      sample(fv, "psd_variable_version",
             json_pack("{s:s, s:s}", "variable", cm_status_str(x, "name"),
                       "shard", v),
             json_integer(cm_status_int(x, "version")));
      sample(fb, "psd_variable_held_bytes",
             json_pack("{s:s, s:s}", "variable", cm_status_str(x, "name"),
                       "shard", v),
             json_integer(cm_status_int(x, "bytes")));
    }
  }
  /* Embedding tables, per table and shard. */
  static const struct {
    const char *key, *name, *type, *help;
  } tab[] = {
      {"rows", "psd_table_rows", "gauge", "Rows of the table stored."},
      {"bytes", "psd_table_held_bytes", "gauge",
       "Memory held for the table's rows, indexes and counters."},
      {"raw_bytes", "psd_table_raw_bytes", "gauge",
       "The stored rows' value and optimizer state bytes."},
      {"pending", "psd_table_pending", "gauge",
       "Ids counted towards admission, not stored yet."},
      {"admitted", "psd_table_admitted_total", "counter", "Rows stored."},
      {"not_admitted", "psd_table_not_admitted_total", "counter",
       "Pulls answered with the initial row and pushes counted, not "
       "applied, for ids not admitted."},
      {"evicted", "psd_table_evicted_total", "counter", "Rows evicted."},
      {"rows_pulled", "psd_table_rows_pulled_total", "counter",
       "Ids answered by sparse pulls."},
      {"rows_pushed", "psd_table_rows_pushed_total", "counter",
       "Rows updated by sparse pushes."}};
  for (size_t k = 0; k < sizeof tab / sizeof tab[0]; k++) {
    json_t *f = family(all, tab[k].name, tab[k].type, tab[k].help), *x;
    for (int s = 0; s < n; s++) {
      json_t *tl =
          sh[s].status ? json_object_get(sh[s].status, "tables") : NULL;
      size_t i;
      snprintf(v, sizeof v, "%d", sh[s].index);
      json_array_foreach(tl, i, x)
          sample(f, tab[k].name,
                 json_pack("{s:s, s:s}", "table", cm_status_str(x, "name"),
                           "shard", v),
                 json_integer(cm_status_int(x, tab[k].key)));
    }
  }
  static const struct {
    const char *key, *name, *help;
  } hists[] = {
      {"push_seconds", "psd_push_seconds",
       "Push handling time on the shard, request decoded to answer sent."},
      {"pull_seconds", "psd_pull_seconds",
       "Pull handling time on the shard (a parked pull's wait excluded)."},
  };
  for (size_t k = 0; k < sizeof hists / sizeof hists[0]; k++) {
    f = family(all, hists[k].name, "histogram", hists[k].help);
    for (int s = 0; s < n; s++) {
      /* NULL too when the shard is down (no document). */
      json_t *h = cm_status_find_named(
          json_object_get(sh[s].status, "histograms"), hists[k].key);
      if (h) {
        json_t *l = shard_label(sh[s].index);
        hist_samples(f, hists[k].name, l, h);
        json_decref(l);
      }
    }
  }
  /* ps:0's live move, once it has driven one (docs/reshard.md "Live:
   * psctl reshard"): its figures as they stand. */
  static const struct {
    const char *key, *name, *type, *help;
    double scale;
  } mv[] = {
      {"running", "psd_move_running", "gauge",
       "1 while ps:0 drives a live move of table rows (its batches or its "
       "switch), 0 after it.",
       1},
      {"moved", "psd_move_buckets_moved", "gauge",
       "Bucket moves of the live move made (the job's, resumed ones too).", 1},
      {"left", "psd_move_buckets_left", "gauge",
       "Bucket moves of the live move not made yet.", 1},
      {"batches", "psd_move_batches_total", "counter",
       "MoveBuckets calls the live move made (this run).", 1},
      {"rows", "psd_move_rows_total", "counter",
       "Table rows the live move installed on destinations (this run; a row "
       "copied twice counts twice).",
       1},
      {"bytes", "psd_move_bytes_total", "counter",
       "Row bytes the live move carried (this run).", 1},
      {"bytes_per_s", "psd_move_bytes_per_second", "gauge",
       "Bytes the live move carried per second over its last batches.", 1},
      {"lag_rows", "psd_move_lag_rows", "gauge",
       "Rows of the last batch's hand-over copy: the rows written while the "
       "batch was copied.",
       1},
      {"last_rounds", "psd_move_last_rounds", "gauge",
       "Copies the last batch made before its hand-over.", 1},
      {"last_pause_us", "psd_move_last_pause_seconds", "gauge",
       "The last batch's hand-over: how long its buckets' writes paused.",
       1e-6},
      {"waits", "psd_move_waits_total", "counter",
       "Waits between batches to keep to the move's rate (--rate).", 1},
  };
  for (size_t k = 0; k < sizeof mv / sizeof mv[0]; k++) {
    f = family(all, mv[k].name, mv[k].type, mv[k].help);
    for (int s = 0; s < n; s++) {
      json_t *o = sh[s].status ? json_object_get(sh[s].status, "move") : NULL,
             *x = json_object_get(o, mv[k].key);
      if (!x)
        continue;
      sample(f, mv[k].name, shard_label(sh[s].index),
             json_is_boolean(x) ? json_integer(json_is_true(x))
             : mv[k].scale == 1
                 ? json_deep_copy(x)
                 : json_real(json_number_value(x) * mv[k].scale));
    }
  }
  if (coord && json_is_true(json_object_get(coord, "coordinator"))) {
    json_t *workers = json_object_get(coord, "workers"), *w;
    json_t *fl = family(all, "psd_worker_live", "gauge",
                        "1 when the coordinator counts the worker as live.");
    json_t *fa = family(all, "psd_worker_applied_total", "counter",
                        "Sync: the worker's gradients applied.");
    json_t *fd = family(all, "psd_worker_dropped_total", "counter",
                        "Sync: the worker's gradients dropped.");
    json_t *fp = family(all, "psd_worker_pushes_total", "counter",
                        "Async: the worker's pushes to shard 0.");
    json_t *fs = family(all, "psd_worker_last_seen_seconds", "gauge",
                        "Seconds since the coordinator last heard from the "
                        "worker.");
    json_t *fwn = family(all, "psd_worker_windows_total", "counter",
                         "On a stream: the windows the worker scored before "
                         "training on them (progressive validation).");
    json_t *fwa = family(all, "psd_worker_window_auc", "gauge",
                         "On a stream: the AUC of the worker's last window, "
                         "scored before training on it.");
    json_t *fwl = family(all, "psd_worker_window_logloss", "gauge",
                         "On a stream: the log loss of the worker's last "
                         "window, scored before training on it.");
    json_t *fh =
        family(all, "psd_worker_step_seconds", "histogram",
               "The worker's step time: between its admissions (sync) or "
               "its pushes to shard 0 (async).");
    size_t i;
    json_array_foreach(workers, i, w) {
      snprintf(v, sizeof v, "%lld", cm_status_int(w, "worker"));
      json_t *l = json_pack("{s:s}", "worker", v);
      sample(fl, "psd_worker_live", json_deep_copy(l),
             json_integer(json_is_true(json_object_get(w, "live"))));
      sample(fa, "psd_worker_applied_total", json_deep_copy(l),
             json_integer(cm_status_int(w, "applied")));
      sample(fd, "psd_worker_dropped_total", json_deep_copy(l),
             json_integer(cm_status_int(w, "dropped")));
      sample(fp, "psd_worker_pushes_total", json_deep_copy(l),
             json_integer(cm_status_int(w, "pushes")));
      if (cm_status_num(w, "last_seen_ms") >= 0)
        sample(fs, "psd_worker_last_seen_seconds", json_deep_copy(l),
               json_real(cm_status_num(w, "last_seen_ms") / 1e3));
      if (cm_status_int(w, "windows") > 0) {
        sample(fwn, "psd_worker_windows_total", json_deep_copy(l),
               json_integer(cm_status_int(w, "windows")));
        sample(fwa, "psd_worker_window_auc", json_deep_copy(l),
               json_real(cm_status_num(w, "window_auc")));
        sample(fwl, "psd_worker_window_logloss", json_deep_copy(l),
               json_real(cm_status_num(w, "window_logloss")));
      }
      if (json_object_get(w, "step_time"))
        hist_samples(fh, "psd_worker_step_seconds", l,
                     json_object_get(w, "step_time"));
      json_decref(l);
    }
  }
  return all;
}

/* A label value with \, " and newlines escaped, as the format asks. */
static void print_label_value(FILE *o, const char *s) {
  for (; *s; s++) {
    if (*s == '\\' || *s == '"')
      fprintf(o, "\\%c", *s);
    else if (*s == '\n')
      fprintf(o, "\\n");
    else
      putc(*s, o);
  }
}

static void print_value(FILE *o, json_t *v) {
  if (json_is_integer(v)) {
    fprintf(o, "%lld", json_integer_value(v));
  } else {
    double x = json_number_value(v);
    if (isnan(x))
      fprintf(o, "NaN");
    else if (isinf(x))
      fprintf(o, x > 0 ? "+Inf" : "-Inf");
    else
      fprintf(o, "%.9g", x);
  }
}

/* The text of one sample: name{labels} value. */
static void print_sample(FILE *o, json_t *s) {
  json_t *labels = json_object_get(s, "labels"), *lv;
  const char *key;
  int first = 1;
  fprintf(o, "%s", cm_status_str(s, "name"));
  json_object_foreach(labels, key, lv) {
    fprintf(o, "%s%s=\"", first ? "{" : ",", key);
    print_label_value(o, json_string_value(lv));
    fprintf(o, "\"");
    first = 0;
  }
  fprintf(o, "%s ", first ? "" : "}");
  print_value(o, json_object_get(s, "value"));
  fprintf(o, "\n");
}

char *cm_prom_text(json_t *families) {
  char *text = NULL;
  size_t len = 0, i, k;
  json_t *f, *s;
  FILE *o = open_memstream(&text, &len);
  if (!o)
    return NULL;
  json_array_foreach(families, i, f) {
    if (json_array_size(json_object_get(f, "samples")) == 0)
      continue;
    fprintf(o, "# HELP %s %s\n# TYPE %s %s\n", cm_status_str(f, "name"),
            cm_status_str(f, "help"), cm_status_str(f, "name"),
            cm_status_str(f, "type"));
    json_array_foreach(json_object_get(f, "samples"), k, s) print_sample(o, s);
  }
  if (fclose(o) != 0) {
    free(text);
    return NULL;
  }
  return text;
}
