/* psctl status: every shard's counters and slices, the job as the
 * coordinator (shard 0) sees it, the checkpoints and the pushes that held
 * NaN or Inf, from the status documents main fetched (psctl.h). */
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "grid.h"
#include "layout.h"
#include "psctl.h"
#include "units.h"

/* The coordinator's view: workers, and in sync mode the last steps. */
static int print_job(const struct psctl *p, json_t *coord) {
  json_t *workers = json_object_get(coord, "workers"), *w, *steps, *r, *rate;
  struct psctl_grid t;
  size_t i, n;
  long long live = 0, dropped = 0;
  int sync = strcmp(cm_status_str(coord, "mode"), "sync") == 0, rc;

  json_array_foreach(workers, i, w) {
    live += json_is_true(json_object_get(w, "live"));
    dropped += cm_status_int(w, "dropped");
  }
  printf("\nJOB %s  mode %s", p->spec->job.name, cm_status_str(coord, "mode"));
  if (sync)
    printf("  step %lld", cm_status_int(coord, "step"));
  if (sync && cm_status_int(coord, "rollbacks") > 0)
    printf("  rollbacks %lld (last to step %lld)",
           cm_status_int(coord, "rollbacks"),
           cm_status_int(coord, "rollback_step"));
  printf("  workers %lld/%zu live  dropped %lld\n", live,
         json_array_size(workers), dropped);
  /* The job's measured rate, once workers have finished and reported. */
  rate = json_object_get(coord, "job_rate");
  if (cm_status_int(rate, "workers") > 0)
    printf("rate: %lld examples by %lld of %zu workers in %.2f s (first step "
           "to last): %.0f/s\n",
           cm_status_int(rate, "examples"), cm_status_int(rate, "workers"),
           json_array_size(workers), cm_status_num(rate, "wall_s"),
           cm_status_num(rate, "examples_per_s"));
  /* Sync: the gradients the coordinator counted in a step, and those it
   * left out. Async has no steps to count a gradient in (applied stays 0):
   * the honest figure is the pushes the worker made to ps:0, the only shard
   * that times them (a worker with no rows there makes none). */
  if (sync)
    psctl_grid_init(&t, 6, "WORKER", "STATE", ">JOINS", ">APPLIED", ">DROPPED",
                    ">LAST SEEN");
  else
    psctl_grid_init(&t, 5, "WORKER", "STATE", ">JOINS", ">PUSHES TO PS:0",
                    ">LAST SEEN");
  json_array_foreach(workers, i, w) {
    double seen = cm_status_num(w, "last_seen_ms");
    char ago[48] = "never", ms[32];
    if (seen >= 0) {
      cm_fmt_ms(seen, ms, sizeof ms);
      snprintf(ago, sizeof ago, "%s ago", ms);
    }
    psctl_grid_cell(&t, "worker:%lld", cm_status_int(w, "worker"));
    psctl_grid_cell(&t, "%s",
                    json_is_true(json_object_get(w, "live"))     ? "live"
                    : json_is_true(json_object_get(w, "left"))   ? "left"
                    : json_is_true(json_object_get(w, "joined")) ? "gone"
                                                                 : "-");
    psctl_grid_cell(&t, "%lld", cm_status_int(w, "joins"));
    if (sync) {
      psctl_grid_cell(&t, "%lld", cm_status_int(w, "applied"));
      psctl_grid_cell(&t, "%lld", cm_status_int(w, "dropped"));
    } else {
      psctl_grid_cell(&t, "%lld", cm_status_int(w, "pushes"));
    }
    psctl_grid_cell(&t, "%s", ago);
  }
  if ((rc = psctl_grid_print(&t)))
    return rc;
  steps = json_object_get(coord, "steps");
  n = json_array_size(steps);
  if (n == 0)
    return 0;
  printf("\n");
  psctl_grid_init(&t, 3, ">STEP", "APPLIED", "DROPPED");
  for (i = n > 5 ? n - 5 : 0; i < n; i++) {
    char a[128] = "", d[128] = "";
    size_t k, la = 0, ld = 0;
    json_t *x;
    r = json_array_get(steps, i);
    json_array_foreach(json_object_get(r, "applied"), k, x) {
      if (la < sizeof a)
        la += snprintf(a + la, sizeof a - la, "%s%lld", k ? "," : "",
                       json_integer_value(x));
    }
    json_array_foreach(json_object_get(r, "dropped"), k, x) {
      if (ld < sizeof d)
        ld += snprintf(d + ld, sizeof d - ld, "%s%lld", k ? "," : "",
                       json_integer_value(x));
    }
    psctl_grid_cell(&t, "%lld", cm_status_int(r, "step"));
    psctl_grid_cell(&t, "%s", a[0] ? a : "-");
    psctl_grid_cell(&t, "%s", d[0] ? d : "-");
  }
  return psctl_grid_print(&t);
}

/* A line per shard that has seen pushes with NaN or Inf (none: nothing). */
static void print_nonfinite(const struct psctl *p) {
  int first = 1;
  for (int s = 0; s < p->spec->nps; s++) {
    long long n = p->st[s] ? cm_status_int(p->st[s], "nonfinite_pushes") : 0;
    if (n <= 0)
      continue;
    if (first)
      printf("\n");
    first = 0;
    printf("ps:%d: %lld push%s with NaN or Inf in the gradient %s "
           "(job.nonfinite \"%s\")\n",
           s, n, n == 1 ? "" : "es",
           !strcmp(cm_status_str(p->st[s], "nonfinite"), "skip") ? "skipped"
           : !strcmp(cm_status_str(p->st[s], "nonfinite"), "apply")
               ? "applied"
               : "rejected",
           cm_status_str(p->st[s], "nonfinite"));
  }
}

/* `status --json` prints each shard's document as it always has: without
 * the variables' optimizer slots, which the document carries for export. */
static void drop_slots(json_t *st) {
  json_t *v;
  size_t i;
  json_array_foreach(json_object_get(st, "vars"), i, v) {
    json_object_del(v, "slots");
  }
}

int psctl_cmd_status(struct psctl *p) {
  const struct cm_spec *spec = p->spec;
  char held[32], shape[64];
  struct psctl_grid t;
  int rc;

  if ((rc = psctl_no_operands(p, "status")))
    return rc;
  if (p->json) {
    json_t *root = json_object(), *shards = json_array();
    for (int s = 0; s < spec->nps; s++) {
      json_t *e = p->st[s] ? json_incref(p->st[s]) : json_object();
      drop_slots(e);
      json_object_set_new(e, "address", json_string(spec->ps[s].text));
      json_object_set_new(e, "up", json_boolean(p->st[s] != NULL));
      if (!p->st[s])
        json_object_set_new(e, "error",
                            json_string(p->why[s] ? p->why[s] : ""));
      json_array_append_new(shards, e);
    }
    json_object_set_new(root, "shards", shards);
    /* As every command's JSON: the shards that did not answer, and why. */
    json_object_set_new(root, "down", psctl_down_json(p));
    rc = psctl_print_json(root);
    json_decref(root);
    return psctl_finish(p, rc);
  }
  psctl_grid_init(&t, 11, "SHARD", "ADDRESS", "STATE", "MODE", ">VERSION",
                  ">VARS", ">HELD", ">PULLS", ">PUSHES", ">EXAMPLES",
                  ">ERRORS");
  for (int s = 0; s < spec->nps; s++) {
    json_t *st = p->st[s], *vars = json_object_get(st, "vars"), *v;
    size_t i;
    double bytes = 0;
    long long version = 0;
    psctl_grid_cell(&t, "ps:%d", s);
    psctl_grid_cell(&t, "%s", spec->ps[s].text);
    /* A shard outside the job's layout stands by (docs/reshard.md). */
    psctl_grid_cell(&t, "%s",
                    !st                                            ? "down"
                    : json_is_true(json_object_get(st, "standby")) ? "standby"
                                                                   : "up");
    if (!st) {
      for (int c = 3; c < t.ncols; c++)
        psctl_grid_cell(&t, "-");
      continue;
    }
    json_array_foreach(vars, i, v) {
      bytes += cm_status_int(v, "bytes");
      if (cm_status_int(v, "version") > version)
        version = cm_status_int(v, "version");
    }
    /* Sync: steps committed; async: the most pushes any variable took. */
    if (strcmp(cm_status_str(st, "mode"), "sync") == 0)
      version = cm_status_int(st, "step");
    cm_fmt_bytes(bytes, held, sizeof held);
    psctl_grid_cell(&t, "%s", cm_status_str(st, "mode"));
    psctl_grid_cell(&t, "%lld", version);
    psctl_grid_cell(&t, "%zu", json_array_size(vars));
    psctl_grid_cell(&t, "%s", held);
    psctl_grid_cell(&t, "%lld", cm_status_int(st, "pulls"));
    psctl_grid_cell(&t, "%lld", cm_status_int(st, "pushes"));
    psctl_grid_cell(&t, "%lld", cm_status_int(st, "examples"));
    psctl_grid_cell(&t, "%lld", cm_status_int(st, "errors"));
  }
  if ((rc = psctl_grid_print(&t)))
    return psctl_finish(p, rc);
  if (p->st[0]) {
    const char *rs = cm_status_str(p->st[0], "reshard");
    long long n = cm_status_int(p->st[0], "num_shards");
    long long to = 0, moved = 0;
    int at = -1;
    /* A live move of table rows: as far as the shard that knows most. */
    for (int s = 0; s < spec->nps; s++)
      if (p->st[s] && cm_status_int(p->st[s], "move_to") > 0 &&
          cm_status_int(p->st[s], "moved") >= moved) {
        to = cm_status_int(p->st[s], "move_to");
        moved = cm_status_int(p->st[s], "moved");
        at = s;
      }
    printf("LAYOUT %lld: %lld shard%s of %d addresses%s%s\n",
           cm_status_int(p->st[0], "layout"), n, n == 1 ? "" : "s", spec->nps,
           rs[0] ? "; reshard " : "", rs);
    /* The buckets of table rows each shard owns (the modulo rule: none). */
    if (strcmp(cm_status_str(p->st[0], "rows"), "modulo") != 0) {
      printf("BUCKETS:");
      for (int s = 0; s < spec->nps; s++)
        if (p->st[s])
          printf(" ps:%d %lld", s, cm_status_int(p->st[s], "buckets_owned"));
      printf("\n");
    }
    if (to > 0) {
      uint16_t mv[CM_LAYOUT_BUCKETS];
      int total = cm_layout_moves((int)n, (int)to, mv);
      printf("MOVE: table rows to %lld shards, %lld of %d bucket moves made "
             "(ps:%d's count)\n",
             to, moved, total, at);
    }
  }
  printf("\n");
  psctl_grid_init(&t, 6, "VARIABLE", "SHAPE", "SHARD", "ROWS", ">HELD",
                  ">VERSION");
  for (int s = 0; s < spec->nps; s++) {
    json_t *vars = p->st[s] ? json_object_get(p->st[s], "vars") : NULL, *v;
    size_t i;
    json_array_foreach(vars, i, v) {
      json_t *rows = json_object_get(v, "rows");
      psctl_shape_text(json_object_get(v, "shape"), shape, sizeof shape);
      cm_fmt_bytes(cm_status_int(v, "bytes"), held, sizeof held);
      psctl_grid_cell(&t, "%s", cm_status_str(v, "name"));
      psctl_grid_cell(&t, "%s", shape);
      psctl_grid_cell(&t, "ps:%d", s);
      psctl_grid_cell(&t, "[%lld, %lld)",
                      json_integer_value(json_array_get(rows, 0)),
                      json_integer_value(json_array_get(rows, 1)));
      psctl_grid_cell(&t, "%s", held);
      psctl_grid_cell(&t, "%lld", cm_status_int(v, "version"));
    }
  }
  rc = psctl_grid_print(&t);
  if (!rc && p->st[0] && json_is_true(json_object_get(p->st[0], "coordinator")))
    rc = print_job(p, p->st[0]);
  else if (!rc && !p->st[0])
    printf("\nJOB %s: unknown, ps:0 (%s), the coordinator, is down\n",
           spec->job.name, spec->ps[0].text);
  if (!rc)
    psctl_print_checkpoints(spec, p->st);
  if (!rc)
    print_nonfinite(p);
  psctl_print_down(p);
  return psctl_finish(p, rc);
}
