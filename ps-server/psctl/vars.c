/* psctl vars, and the shard map it is made from: where each variable's
 * rows live, per shard, from the status documents of the shards that
 * answered and, for a shard that is down, from the spec's sharding rule
 * (psctl get reads the rows through the same map). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "err.h"
#include "grid.h"
#include "layout.h"
#include "psctl.h"
#include "units.h"

/* ---- the shard map ---- */

/* The variable's entry in one shard's status, or NULL. */
static json_t *find_var(json_t *st, const char *name) {
  return cm_status_find_named(json_object_get(st, "vars"), name);
}

void psctl_map_free(struct psctl_var_map *m) {
  free(m->begin);
  free(m->end);
  free(m->slice);
  memset(m, 0, sizeof *m);
}

int psctl_map_var(const struct psctl *p, const char *name,
                  struct psctl_var_map *m) {
  int n = p->spec->nps;
  json_t *first = NULL;
  memset(m, 0, sizeof *m);
  for (int s = 0; s < n && !first; s++)
    first = p->st[s] ? find_var(p->st[s], name) : NULL;
  if (!first)
    return CM_ENOENT;
  m->begin = calloc(n, sizeof *m->begin);
  m->end = calloc(n, sizeof *m->end);
  m->slice = calloc(n, sizeof *m->slice);
  if (!m->begin || !m->end || !m->slice) {
    psctl_map_free(m);
    return CM_ENOMEM;
  }
  m->name = cm_status_str(first, "name");
  m->shape = json_object_get(first, "shape");
  m->rows = json_integer_value(json_array_get(m->shape, 0));
  m->row_len = 1;
  for (size_t d = 1; d < json_array_size(m->shape); d++)
    m->row_len *= (uint64_t)json_integer_value(json_array_get(m->shape, d));
  m->placement = (int)cm_status_int(first, "placement");
  for (int s = 0; s < n; s++) {
    json_t *v = p->st[s] ? find_var(p->st[s], name) : NULL;
    m->slice[s] = v;
    if (v) {
      json_t *rows = json_object_get(v, "rows");
      m->begin[s] = json_integer_value(json_array_get(rows, 0));
      m->end[s] = json_integer_value(json_array_get(rows, 1));
    } else {
      cm_layout_rows(m->rows, m->placement, n, s, &m->begin[s], &m->end[s]);
    }
  }
  return 0;
}

int psctl_no_such_var(const struct psctl *p, const char *name) {
  json_t *st = NULL, *v;
  size_t i;
  for (int s = 0; s < p->spec->nps && !st; s++)
    st = p->st[s];
  fprintf(stderr, "psctl: no variable '%s' in job '%s'", name,
          p->spec->job.name);
  if (p->down)
    fprintf(stderr, " on the shards that answered");
  fprintf(stderr, " (it has: ");
  json_array_foreach(json_object_get(st, "vars"), i, v) {
    fprintf(stderr, "%s%s", i ? ", " : "", cm_status_str(v, "name"));
  }
  fprintf(stderr, "%s)\n",
          json_array_size(json_object_get(st, "vars")) ? "" : "no variables");
  return 1;
}

/* ---- vars ---- */

int psctl_cmd_vars(struct psctl *p) {
  const struct cm_spec *spec = p->spec;
  json_t *names = NULL, *root = NULL, *list = NULL, *v;
  const char *optim = NULL;
  int same_optim = 1, rc = 0;
  struct psctl_grid t;
  size_t i;

  if ((rc = psctl_no_operands(p, "vars")))
    return rc;
  /* Every shard lists every variable (declare goes to all of them), in
   * declaration order; take the names from the first that answered. */
  for (int s = 0; s < spec->nps && !names; s++)
    names = p->st[s] ? json_object_get(p->st[s], "vars") : NULL;
  list = json_array();
  json_array_foreach(names, i, v) {
    struct psctl_var_map m;
    json_t *shards = json_array(), *o;
    long long bytes = 0, vmin = -1, vmax = -1;
    const char *opt = cm_status_str(v, "optimizer");
    if ((rc = psctl_map_var(p, cm_status_str(v, "name"), &m)))
      break;
    for (int s = 0; s < spec->nps; s++) {
      json_t *sl = m.slice[s];
      if (m.end[s] <= m.begin[s])
        continue;
      json_t *e = json_pack("{s:i, s:s, s:b, s:[I, I]}", "shard", s, "address",
                            spec->ps[s].text, "up", sl != NULL, "rows",
                            (json_int_t)m.begin[s], (json_int_t)m.end[s]);
      if (sl) {
        long long ver = cm_status_int(sl, "version");
        json_object_set_new(e, "bytes",
                            json_integer(cm_status_int(sl, "bytes")));
        json_object_set_new(e, "version", json_integer(ver));
        bytes += cm_status_int(sl, "bytes");
        vmin = vmin < 0 || ver < vmin ? ver : vmin;
        vmax = ver > vmax ? ver : vmax;
      }
      json_array_append_new(shards, e);
    }
    if (optim && strcmp(optim, opt) != 0)
      same_optim = 0;
    optim = opt;
    /* Versions are null when every shard holding rows is down. */
    o = json_pack("{s:s, s:O, s:s, s:i, s:o, s:I, s:o, s:o, s:s}", "name",
                  m.name, "shape", m.shape, "dtype", "f32", "placement",
                  m.placement, "shards", shards, "bytes", (json_int_t)bytes,
                  "version", vmax < 0 ? json_null() : json_integer(vmax),
                  "version_min", vmin < 0 ? json_null() : json_integer(vmin),
                  "optimizer", opt);
    json_array_append_new(list, o);
    psctl_map_free(&m);
  }
  if (rc)
    goto out;
  if (p->json) {
    root = json_pack("{s:s, s:O, s:o}", "job", spec->job.name, "vars", list,
                     "down", psctl_down_json(p));
    rc = psctl_print_json(root);
    goto out;
  }
  psctl_grid_init(&t, same_optim ? 6 : 7, "VARIABLE", "SHAPE", "DTYPE",
                  "SHARDS (ROWS)", ">HELD", ">VERSION", "OPTIMIZER");
  json_array_foreach(list, i, v) {
    char shape[64], map[256], held[32];
    size_t k, n = 0;
    json_t *e, *shards = json_object_get(v, "shards");
    int missing = 0;
    psctl_shape_text(json_object_get(v, "shape"), shape, sizeof shape);
    if (json_array_size(shards) > 4) {
      snprintf(map, sizeof map, "split over %zu shards",
               json_array_size(shards));
    } else {
      map[0] = 0;
      json_array_foreach(shards, k, e) {
        json_t *r = json_object_get(e, "rows");
        int up = json_is_true(json_object_get(e, "up"));
        missing |= !up;
        if (n < sizeof map)
          n += snprintf(map + n, sizeof map - n, "%sps:%lld%s [%lld, %lld)",
                        k ? " " : "", cm_status_int(e, "shard"),
                        up ? "" : "(down)",
                        json_integer_value(json_array_get(r, 0)),
                        json_integer_value(json_array_get(r, 1)));
      }
      if (!map[0])
        snprintf(map, sizeof map, "no rows");
    }
    cm_fmt_bytes(cm_status_int(v, "bytes"), held, sizeof held);
    psctl_grid_cell(&t, "%s", cm_status_str(v, "name"));
    psctl_grid_cell(&t, "%s", shape);
    psctl_grid_cell(&t, "f32");
    psctl_grid_cell(&t, "%s", map);
    psctl_grid_cell(&t, "%s%s", held, missing ? "+?" : "");
    if (json_is_null(json_object_get(v, "version")))
      psctl_grid_cell(&t, "?");
    else if (cm_status_int(v, "version_min") != cm_status_int(v, "version"))
      psctl_grid_cell(&t, "%lld-%lld", cm_status_int(v, "version_min"),
                      cm_status_int(v, "version"));
    else
      psctl_grid_cell(&t, "%lld", cm_status_int(v, "version"));
    if (!same_optim)
      psctl_grid_cell(&t, "%s", cm_status_str(v, "optimizer"));
  }
  rc = psctl_grid_print(&t);
  if (!rc && optim && same_optim)
    printf("optimizer (every variable): %s\n", optim);
  psctl_print_down(p);
out:
  json_decref(list);
  json_decref(root);
  return psctl_finish(p, rc);
}
