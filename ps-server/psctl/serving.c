/* psctl serving: every serving task of the spec's cluster.serve, asked for
 * its Admin/Status one by one (serve:J itself, never another replica): the
 * publication version its answers reflect, that version's training step,
 * its age (now minus the version's cut), how many versions it is behind
 * the newest it has seen, rows and memory held, publications refused and
 * lookups answered. A task that does not answer, or answers without a
 * serving block (not a serving task), is named on stderr and psctl exits
 * 1; the others are printed all the same. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include <jansson.h>

#include "err.h"
#include "grid.h"
#include "layout.h"
#include "psctl.h"
#include "serving.h"
#include "units.h"

/* Unix time in ms, to set against a version's cut. */
static double now_unix_ms(void) {
  struct timeval tv;
  gettimeofday(&tv, NULL);
  return tv.tv_sec * 1000.0 + tv.tv_usec / 1000.0;
}

/* One task: what it answered, or why not. */
struct task_row {
  int up;                      /* 1: it answered as a serving task */
  struct psc__serve_status st; /* its answer */
  char why[1024];              /* why not, when !up */
};

/* How old a version is (ms); 0 when it has none or its clock is ahead. */
static double age_ms(const struct task_row *r, double now) {
  double age = now - (double)r->st.time_unix_ms;
  return r->st.version && r->st.time_unix_ms > 0 && age > 0 ? age : 0;
}

static uint64_t behind(const struct task_row *r) {
  return r->st.newest_seen > r->st.version ? r->st.newest_seen - r->st.version
                                           : 0;
}

static int print_json(const struct cm_spec *spec, const struct task_row *rows,
                      double now) {
  json_t *root = json_object(), *list = json_array(), *down = json_array();
  int rc;
  for (int t = 0; t < spec->nserve; t++) {
    const struct task_row *r = &rows[t];
    if (!r->up) {
      json_array_append_new(
          down, json_pack("{s:s, s:i, s:s, s:s}", "task", "serve", "index", t,
                          "address", spec->serve[t].text, "error", r->why));
      continue;
    }
    json_t *e = json_pack(
        "{s:s, s:i, s:s, s:i, s:i, s:s, s:I, s:I, s:I, s:f, s:I, s:I, s:I, "
        "s:I, s:I, s:I, s:s, s:I}",
        "task", "serve", "index", t, "address", spec->serve[t].text, "shard",
        r->st.shard, "replica", r->st.replica, "dir", r->st.dir, "version",
        (json_int_t)r->st.version, "step", (json_int_t)r->st.step,
        "time_unix_ms", (json_int_t)r->st.time_unix_ms, "age_ms",
        age_ms(r, now), "newest_seen", (json_int_t)r->st.newest_seen, "behind",
        (json_int_t)behind(r), "rows", (json_int_t)r->st.rows, "bytes",
        (json_int_t)r->st.bytes, "applied", (json_int_t)r->st.applied,
        "refused", (json_int_t)r->st.refused, "last_refusal",
        r->st.last_refusal, "lookups", (json_int_t)r->st.lookups);
    if (e && r->st.shards > 0)
      json_object_set_new(e, "layout",
                          json_pack("{s:I, s:i, s:i, s:i}", "version",
                                    (json_int_t)r->st.layout, "shards",
                                    r->st.shards, "move_to", r->st.move_to,
                                    "moved", r->st.moved));
    json_array_append_new(list, e);
  }
  json_object_set_new(root, "serving", list);
  json_object_set_new(root, "down", down);
  rc = psctl_print_json(root);
  json_decref(root);
  return rc;
}

static int print_grid(const struct cm_spec *spec, const struct task_row *rows,
                      double now) {
  struct psctl_grid g;
  char buf[64];
  int rc;
  psctl_grid_init(&g, 12, "TASK", "ADDRESS", ">SHARD", ">VERSION", ">STEP",
                  ">AGE", ">BEHIND", ">ROWS", ">MEMORY", ">REFUSED", ">LOOKUPS",
                  "LAYOUT");
  for (int t = 0; t < spec->nserve; t++) {
    const struct task_row *r = &rows[t];
    psctl_grid_cell(&g, "serve:%d", t);
    psctl_grid_cell(&g, "%s", spec->serve[t].text);
    psctl_grid_cell(&g, "%d",
                    r->up ? r->st.shard : cm_layout_serve_shard(t, spec->nps));
    if (!r->up) {
      psctl_grid_cell(&g, "down");
      for (int k = 0; k < 8; k++)
        psctl_grid_cell(&g, "-");
      continue;
    }
    psctl_grid_cell(&g, "%llu", (unsigned long long)r->st.version);
    psctl_grid_cell(&g, "%llu", (unsigned long long)r->st.step);
    psctl_grid_cell(&g, "%s",
                    r->st.version ? cm_fmt_ms(age_ms(r, now), buf, sizeof buf)
                                  : "-");
    psctl_grid_cell(&g, "%llu", (unsigned long long)behind(r));
    psctl_grid_cell(&g, "%llu", (unsigned long long)r->st.rows);
    psctl_grid_cell(&g, "%s",
                    cm_fmt_bytes((double)r->st.bytes, buf, sizeof buf));
    psctl_grid_cell(&g, "%llu", (unsigned long long)r->st.refused);
    psctl_grid_cell(&g, "%llu", (unsigned long long)r->st.lookups);
    if (r->st.shards < 1)
      psctl_grid_cell(&g, "-");
    else if (r->st.move_to)
      psctl_grid_cell(&g, "%llu of %d, to %d after %d moves",
                      (unsigned long long)r->st.layout, r->st.shards,
                      r->st.move_to, r->st.moved);
    else
      psctl_grid_cell(&g, "%llu of %d", (unsigned long long)r->st.layout,
                      r->st.shards);
  }
  if ((rc = psctl_grid_print(&g)))
    return rc;
  for (int t = 0; t < spec->nserve; t++) {
    if (!rows[t].up)
      printf("serve:%d (%s) is down: nothing from it above\n", t,
             spec->serve[t].text);
    else if (rows[t].st.last_refusal[0])
      printf("serve:%d last refused a publication: %s\n", t,
             rows[t].st.last_refusal);
  }
  return 0;
}

int psctl_cmd_serving(struct psctl *p) {
  const struct cm_spec *spec = p->spec;
  struct psc__serving_opts o = {
      .worker = "psctl", .timeout_ms = p->timeout_ms, .retry_s = -1};
  struct psc__serving *sv = NULL;
  struct task_row *rows = NULL;
  char err[1024];
  double now;
  int rc;

  if ((rc = psctl_no_operands(p, "serving")))
    return rc;
  if (spec->nserve < 1) {
    fprintf(stderr,
            "psctl: serving: %s has no cluster.serve: the job has no serving "
            "tasks\n",
            spec->source);
    return 1;
  }
  if ((rc = psc__serving_new(&sv, spec, &o, err, sizeof err))) {
    fprintf(stderr, "psctl: serving: %s\n", err);
    return 1;
  }
  if (!(rows = calloc((size_t)spec->nserve, sizeof *rows))) {
    rc = CM_ENOMEM;
    goto out;
  }
  for (int t = 0; t < spec->nserve; t++) {
    struct task_row *r = &rows[t];
    int src = psc__serving_status(sv, t, &r->st);
    if (src)
      snprintf(r->why, sizeof r->why, "%s", psc__serving_error(sv));
    else if (!r->st.serving)
      snprintf(r->why, sizeof r->why,
               "it answered, but not as a serving task (no serving status: "
               "a training shard at that address?)");
    r->up = !src && r->st.serving;
    if (!r->up) {
      /* The client's error names the task already. */
      if (src)
        fprintf(stderr, "psctl: %s\n", r->why);
      else
        fprintf(stderr, "psctl: serve:%d (%s) is down: %s\n", t,
                spec->serve[t].text, r->why);
      p->down++;
    }
  }
  now = now_unix_ms();
  rc = p->json ? print_json(spec, rows, now) : print_grid(spec, rows, now);
out:
  free(rows);
  psc__serving_free(sv);
  return psctl_finish(p, rc);
}
