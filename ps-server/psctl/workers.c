/* psctl workers: each worker as the coordinator (shard 0) sees it, with
 * its step times and a straggler mark. The straggler rule lives here: a
 * live worker's p50 well above the median p50 of the live workers (the
 * help of `workers` in psctl.c says it in words). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "grid.h"
#include "psctl.h"
#include "units.h"

/* Straggler rule (workers): p50 above this multiple of the live workers'
 * median p50, and above it by at least STRAGGLER_MIN_MS, with at least
 * STRAGGLER_SAMPLES step times behind each p50 compared. */
#define STRAGGLER_FACTOR 1.5
#define STRAGGLER_MIN_MS 1.0
#define STRAGGLER_SAMPLES 5

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* The p50 the straggler rule compares (see the help of `workers`). */
static double rule_p50(json_t *w, int sync) {
  return cm_status_num(w, sync ? "lag_p50_ms" : "step_p50_ms");
}

static int rule_eligible(json_t *w) {
  return json_is_true(json_object_get(w, "live")) &&
         cm_status_int(w, "step_samples") >= STRAGGLER_SAMPLES;
}

/* Median of the eligible workers' p50; sets *n to how many there are. */
static double rule_median(json_t *workers, int sync, int *n) {
  double v[256], med = 0;
  json_t *w;
  size_t i;
  *n = 0;
  json_array_foreach(workers, i, w) {
    if (rule_eligible(w) && *n < 256)
      v[(*n)++] = rule_p50(w, sync);
  }
  if (*n > 0) {
    qsort(v, *n, sizeof *v, cmp_double);
    med = *n % 2 ? v[*n / 2] : (v[*n / 2 - 1] + v[*n / 2]) / 2;
  }
  return med;
}

int psctl_cmd_workers(struct psctl *p) {
  json_t *coord = p->st[0], *workers, *w, *list = NULL, *root = NULL;
  int sync, ssp = p->spec->job.staleness >= 0, n, rc = 0;
  double med;
  size_t i;

  if ((rc = psctl_no_operands(p, "workers")))
    return rc;
  if (!coord) {
    fprintf(stderr,
            "psctl: workers: ps:0 (%s), the coordinator, is down; only it "
            "knows the workers\n",
            p->spec->ps[0].text);
    if (p->json) {
      root = json_pack("{s:[], s:o}", "workers", "down", psctl_down_json(p));
      rc = psctl_print_json(root);
      json_decref(root);
    }
    return psctl_finish(p, rc ? rc : 1);
  }
  sync = strcmp(cm_status_str(coord, "mode"), "sync") == 0;
  workers = json_object_get(coord, "workers");
  med = rule_median(workers, sync, &n);
  list = json_array();
  json_array_foreach(workers, i, w) {
    int live = json_is_true(json_object_get(w, "live"));
    int straggler = rule_eligible(w) && n >= 2 &&
                    rule_p50(w, sync) > STRAGGLER_FACTOR * med &&
                    rule_p50(w, sync) - med >= STRAGGLER_MIN_MS;
    json_t *o = json_pack(
        "{s:I, s:s, s:b, s:I, s:I, s:I, s:I, s:f, s:f, s:I, s:I, s:f, s:b}",
        "worker", (json_int_t)cm_status_int(w, "worker"), "state",
        live                                         ? "live"
        : json_is_true(json_object_get(w, "left"))   ? "left"
        : json_is_true(json_object_get(w, "joined")) ? "gone"
                                                     : "never joined",
        "live", live, "joins", (json_int_t)cm_status_int(w, "joins"),
        "last_step", (json_int_t)cm_status_int(w, "last_step"), "pushes",
        (json_int_t)cm_status_int(w, "pushes"), "clock",
        (json_int_t)cm_status_int(w, "clock"), "step_p50_ms",
        cm_status_num(w, "step_p50_ms"), "step_p95_ms",
        cm_status_num(w, "step_p95_ms"), "step_samples",
        (json_int_t)cm_status_int(w, "step_samples"), "applied",
        (json_int_t)cm_status_int(w, "applied"), "last_seen_ms",
        cm_status_num(w, "last_seen_ms"), "straggler", straggler);
    json_object_set_new(o, "dropped",
                        json_integer(cm_status_int(w, "dropped")));
    if (sync) {
      json_object_set_new(o, "lag_p50_ms",
                          json_real(cm_status_num(w, "lag_p50_ms")));
      json_object_set_new(o, "lag_p95_ms",
                          json_real(cm_status_num(w, "lag_p95_ms")));
    }
    json_array_append_new(list, o);
  }
  if (p->json) {
    char rule[256];
    snprintf(rule, sizeof rule,
             "live, %s p50 > %.1f x median of the live workers' (%d of them "
             "with >= %d steps) and >= %.0f ms above it",
             sync ? "lag" : "step", STRAGGLER_FACTOR, n, STRAGGLER_SAMPLES,
             STRAGGLER_MIN_MS);
    root = json_pack("{s:s, s:s, s:O, s:{s:s, s:f, s:i}, s:o}", "job",
                     p->spec->job.name, "mode", cm_status_str(coord, "mode"),
                     "workers", list, "straggler_rule", "text", rule,
                     "median_p50_ms", med, "compared", n, "down",
                     psctl_down_json(p));
    rc = psctl_print_json(root);
  } else {
    struct psctl_grid t;
    if (sync)
      psctl_grid_init(&t, 10, "WORKER", "STATE", ">STEP", ">STEP p50",
                      ">STEP p95", ">LAG p50", ">APPLIED", ">DROPPED",
                      ">LAST SEEN", "NOTE");
    else if (ssp)
      psctl_grid_init(&t, 9, "WORKER", "STATE", ">PUSHES", ">CLOCK",
                      ">STEP p50", ">STEP p95", ">DROPPED", ">LAST SEEN",
                      "NOTE");
    else
      psctl_grid_init(&t, 8, "WORKER", "STATE", ">PUSHES", ">STEP p50",
                      ">STEP p95", ">DROPPED", ">LAST SEEN", "NOTE");
    json_array_foreach(list, i, w) {
      char t50[32] = "-", t95[32] = "-", lag[32] = "-", seen[48] = "never";
      if (cm_status_int(w, "step_samples") > 0) {
        cm_fmt_ms(cm_status_num(w, "step_p50_ms"), t50, sizeof t50);
        cm_fmt_ms(cm_status_num(w, "step_p95_ms"), t95, sizeof t95);
      }
      if (sync && cm_status_num(w, "lag_p50_ms") > 0)
        cm_fmt_ms(cm_status_num(w, "lag_p50_ms"), lag, sizeof lag);
      if (cm_status_num(w, "last_seen_ms") >= 0) {
        char ms[32];
        cm_fmt_ms(cm_status_num(w, "last_seen_ms"), ms, sizeof ms);
        snprintf(seen, sizeof seen, "%s ago", ms);
      }
      psctl_grid_cell(&t, "worker:%lld", cm_status_int(w, "worker"));
      psctl_grid_cell(&t, "%s", cm_status_str(w, "state"));
      if (sync)
        psctl_grid_cell(&t, "%lld", cm_status_int(w, "last_step"));
      else
        psctl_grid_cell(&t, "%lld", cm_status_int(w, "pushes"));
      if (ssp && !sync)
        psctl_grid_cell(&t, "%lld", cm_status_int(w, "clock"));
      psctl_grid_cell(&t, "%s", t50);
      psctl_grid_cell(&t, "%s", t95);
      if (sync) {
        psctl_grid_cell(&t, "%s", lag);
        psctl_grid_cell(&t, "%lld", cm_status_int(w, "applied"));
      }
      psctl_grid_cell(&t, "%lld", cm_status_int(w, "dropped"));
      psctl_grid_cell(&t, "%s", seen);
      psctl_grid_cell(
          &t, "%s",
          json_is_true(json_object_get(w, "straggler")) ? "straggler" : "");
    }
    rc = psctl_grid_print(&t);
    if (!rc) {
      char m[32];
      cm_fmt_ms(med, m, sizeof m);
      if (n >= 2)
        printf("straggler: live and %s p50 > %.1f x %s (the median of %d "
               "live workers) and >= %.0f ms above it\n",
               sync ? "lag" : "step", STRAGGLER_FACTOR, m, n, STRAGGLER_MIN_MS);
      else
        printf("straggler: needs 2 live workers with %d timed steps or "
               "more; %d so far\n",
               STRAGGLER_SAMPLES, n);
    }
    psctl_print_down(p);
  }
  json_decref(list);
  json_decref(root);
  return psctl_finish(p, rc);
}
