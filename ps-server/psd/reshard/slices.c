/* A variable's new slice made from the pieces its old holders have
 * (reshard_internal.h): the one rule of psd --reshard's offline cut
 * (reshard_cut.c, pieces from the old checkpoints) and of a live layout
 * switch (switch.c, pieces from the frozen shards' Admin/DenseRows). The
 * rows are copied bit for bit with their optimizer slots; the new slice's
 * version is the largest of its pieces', and its optimizer steps the
 * largest (async slices may have taken different counts; the step never
 * goes back). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "layout.h"
#include "log.h"
#include "reshard_internal.h"

void psd__piece_of(const struct psd_var *v, struct psd__piece *p) {
  memset(p, 0, sizeof *p);
  p->row_begin = v->row_begin;
  p->row_end = v->row_end;
  p->value = v->value;
  for (int s = 0; s < v->nslots; s++)
    p->slots[s] = v->slots[s];
  p->version = v->version;
  p->steps = psd_var_steps(v);
}

int psd__gather_init(struct psd__gather *g, const char *name, int ndim,
                     const int64_t *shape, int placement, int asked, int own,
                     const struct cm_optim *opt, int m, int shard) {
  memset(g, 0, sizeof *g);
  snprintf(g->name, sizeof g->name, "%s", name);
  g->ndim = ndim;
  memcpy(g->shape, shape, (size_t)ndim * sizeof *shape);
  g->placement = placement;
  g->asked = asked;
  g->own = own;
  g->opt = *opt;
  g->nslots = cm_optim_nslots(opt->type);
  g->row = 1;
  for (int i = 1; i < ndim; i++)
    g->row *= (uint64_t)shape[i];
  g->steps_lo = UINT64_MAX;
  cm_layout_rows(shape[0], placement, m, shard, &g->begin, &g->end);
  size_t len = (size_t)(g->end - g->begin) * g->row;
  g->value = malloc(len * sizeof(float) + 1);
  for (int s = 0; s < g->nslots; s++)
    g->slots[s] = malloc(len * sizeof(float) + 1);
  if (!g->value)
    return CM_ENOMEM;
  for (int s = 0; s < g->nslots; s++)
    if (!g->slots[s])
      return CM_ENOMEM;
  return 0;
}

uint64_t psd__gather_add(struct psd__gather *g, const struct psd__piece *p) {
  int64_t b = p->row_begin > g->begin ? p->row_begin : g->begin;
  int64_t e = p->row_end < g->end ? p->row_end : g->end;
  if (e <= b)
    return 0;
  size_t to = (size_t)(b - g->begin) * g->row;
  size_t from = (size_t)(b - p->row_begin) * g->row;
  size_t len = (size_t)(e - b) * g->row;
  memcpy(g->value + to, p->value + from, len * sizeof(float));
  for (int s = 0; s < g->nslots; s++)
    memcpy(g->slots[s] + to, p->slots[s] + from, len * sizeof(float));
  g->filled += e - b;
  if (p->version > g->version)
    g->version = p->version;
  if (p->steps < g->steps_lo)
    g->steps_lo = p->steps;
  if (p->steps > g->steps_hi)
    g->steps_hi = p->steps;
  g->pieces++;
  return len;
}

int psd__gather_make(struct psd__gather *g, struct psd_store *store, int shard,
                     const char *who, char *err, size_t errlen) {
  struct psd_var *v;
  int created = 0, rc;
  if (g->filled != g->end - g->begin) {
    snprintf(err, errlen,
             "variable '%s': the old shards hold %lld of the %lld rows "
             "[%lld, %lld) new shard %d needs (an old shard lacks it?)",
             g->name, (long long)g->filled, (long long)(g->end - g->begin),
             (long long)g->begin, (long long)g->end, shard);
    return CM_EFORMAT;
  }
  if ((rc = psd_store_declare_values(
           store, g->name, g->ndim, g->shape, g->placement, g->value,
           g->own ? &g->opt : NULL, &v, &created, err, errlen)))
    return rc;
  if (!created || v->nslots != g->nslots) {
    snprintf(err, errlen, "variable '%s': %s", g->name,
             created ? "the spec gives it another optimizer than its "
                       "old slices'"
                     : "twice among the old slices");
    return CM_EFORMAT;
  }
  psd_store_set_asked(v, g->asked, 0);
  size_t len = (size_t)(g->end - g->begin) * g->row;
  for (int s = 0; s < g->nslots; s++)
    memcpy(v->slots[s], g->slots[s], len * sizeof(float));
  v->version = g->version;
  if (!g->pieces)
    g->steps_lo = g->steps_hi = 0;
  if (g->steps_lo != g->steps_hi)
    cm_warn("%s: variable '%s': its old slices had taken %llu to %llu "
            "optimizer steps (async); new shard %d's slice takes %llu",
            who, g->name, (unsigned long long)g->steps_lo,
            (unsigned long long)g->steps_hi, shard,
            (unsigned long long)g->steps_hi);
  v->applied = g->steps_hi * len;
  return 0;
}

void psd__gather_free(struct psd__gather *g) {
  free(g->value);
  for (int s = 0; s < CM_OPTIM_MAX_SLOTS; s++)
    free(g->slots[s]);
  memset(g, 0, sizeof *g);
}
