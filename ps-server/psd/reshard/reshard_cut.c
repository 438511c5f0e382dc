/* One new shard's state cut from the old shards' checkpoints (psd
 * --reshard, reshard_internal.h): each old shard is loaded in turn; the
 * rows of each variable that the new shard holds under its new placement
 * are copied with their optimizer slots, and the table rows whose id the
 * new shard holds with their state and statistics. Bit for bit: nothing is
 * computed but where each row goes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"
#include "err.h"
#include "layout.h"
#include "log.h"
#include "reshard_internal.h"
#include "table.h"

/* A variable of the new shard while its rows are gathered. */
struct gather {
  char name[PSD_VAR_MAX_NAME + 1];  /* the variable */
  int ndim;                         /* its dimensions */
  int64_t shape[PSD_VAR_MAX_DIMS];  /* its whole shape */
  int placement;                    /* among the new shards */
  int asked;                        /* how its declaration placed it */
  int own;                          /* 1: its own optimizer (opt) */
  struct cm_optim opt;              /* its optimizer */
  int nslots;                       /* cm_optim_nslots(opt.type) */
  int64_t begin, end;               /* the rows the new shard holds */
  uint64_t row;                     /* elements per row */
  float *value;                     /* (end - begin) x row, owned */
  float *slots[CM_OPTIM_MAX_SLOTS]; /* the same, owned */
  int64_t filled;                   /* rows copied so far */
  uint64_t version;                 /* the largest version of its pieces */
  uint64_t steps_lo, steps_hi;      /* its pieces' optimizer steps */
  int pieces;                       /* pieces copied (with rows) */
};

/* Where a variable held among n old shards goes among m: by how its
 * declaration placed it, the rule clients that follow the move use too
 * (cm_layout_replace). */
static int new_placement(const struct psd_var *v, int n, int m) {
  return cm_layout_replace(v->asked, v->placement, n, v->name,
                           v->numel * sizeof(float), m);
}

static void gather_free(struct gather *g) {
  free(g->value);
  for (int s = 0; s < CM_OPTIM_MAX_SLOTS; s++)
    free(g->slots[s]);
}

/* The gather of v for new shard `shard` of m: found in g[0..*n), or added
 * (*n grows). *out is NULL when the new shard holds none of v. */
static int gather_of(struct gather **g, int *n, int *cap,
                     const struct psd_var *v, int nold, int m, int shard,
                     struct gather **out) {
  *out = NULL;
  int p = new_placement(v, nold, m);
  if (p != CM_LAYOUT_SPLIT && p != shard)
    return 0;
  for (int i = 0; i < *n; i++)
    if (!strcmp((*g)[i].name, v->name)) {
      *out = &(*g)[i];
      return 0;
    }
  if (*n == *cap) {
    int c = *cap ? 2 * *cap : 16;
    struct gather *ng = realloc(*g, (size_t)c * sizeof *ng);
    if (!ng)
      return CM_ENOMEM;
    *g = ng;
    *cap = c;
  }
  struct gather *x = &(*g)[*n];
  memset(x, 0, sizeof *x);
  snprintf(x->name, sizeof x->name, "%s", v->name);
  x->ndim = v->ndim;
  memcpy(x->shape, v->shape, sizeof x->shape);
  x->placement = p;
  x->asked = v->asked;
  x->own = v->own;
  x->opt = v->opt;
  x->nslots = v->nslots;
  x->row = v->numel / (uint64_t)v->shape[0];
  x->steps_lo = UINT64_MAX;
  cm_layout_rows(v->shape[0], p, m, shard, &x->begin, &x->end);
  size_t len = (size_t)(x->end - x->begin) * x->row;
  x->value = malloc(len * sizeof(float) + 1);
  for (int s = 0; s < x->nslots; s++)
    x->slots[s] = malloc(len * sizeof(float) + 1);
  (*n)++;
  if (!x->value)
    return CM_ENOMEM;
  for (int s = 0; s < x->nslots; s++)
    if (!x->slots[s])
      return CM_ENOMEM;
  *out = x;
  return 0;
}

/* Copies the rows of old slice v (of old shard k) that g holds. */
static void gather_copy(struct gather *g, const struct psd_var *v, int k,
                        int shard, struct psd__reshard_cut *cut) {
  int64_t b = v->row_begin > g->begin ? v->row_begin : g->begin;
  int64_t e = v->row_end < g->end ? v->row_end : g->end;
  if (e <= b)
    return;
  size_t to = (size_t)(b - g->begin) * g->row;
  size_t from = (size_t)(b - v->row_begin) * g->row;
  size_t len = (size_t)(e - b) * g->row;
  memcpy(g->value + to, v->value + from, len * sizeof(float));
  for (int s = 0; s < g->nslots; s++)
    memcpy(g->slots[s] + to, v->slots[s] + from, len * sizeof(float));
  g->filled += e - b;
  if (v->version > g->version)
    g->version = v->version;
  uint64_t st = psd_var_steps(v);
  if (st < g->steps_lo)
    g->steps_lo = st;
  if (st > g->steps_hi)
    g->steps_hi = st;
  g->pieces++;
  cut->elems += len;
  if (k != shard)
    cut->elems_moved += len;
}

/* Copies the rows of old table t (of old shard k) into the tables of the
 * same name of the new shards cuts[0..count), each the rows whose id it
 * holds among m: one snapshot of t, each row copied once. */
static int cut_table(struct psd__reshard_cut *cuts, int count,
                     struct psd_table *t, int k, int m, char *err,
                     size_t errlen) {
  const struct cm_table_conf *conf = psd_table_conf(t);
  struct psd_table_snap *all = NULL, mine;
  struct psd_table_stats ts;
  int *to = NULL, rc;

  if ((rc = psd_table_snapshot(t, 0, &all)) ||
      !(to = malloc((all->nrows + 1) * sizeof *to))) {
    rc = CM_ENOMEM;
    goto out;
  }
  /* The new layout's map: a fresh job's of m shards (buckets). */
  struct cm_layout_map map;
  cm_layout_map_init(&map, CM_LAYOUT_RULE_BUCKETS, m);
  for (size_t i = 0; i < all->nrows; i++)
    to[i] = cm_layout_map_id_shard(&map, all->ids[i]);
  psd_table_stats(t, &ts);
  for (int j = 0; j < count; j++) {
    struct psd__reshard_cut *cut = &cuts[j];
    struct psd_table *nt = NULL;
    struct psd_table_stats now;
    size_t n = 0, dim = all->dim, ns = all->nstate;
    int created = 0;
    if ((rc = psd_tables_declare(cut->tables, conf->name, conf->dim,
                                 conf->id_bound, &nt, &created, err, errlen)))
      goto out;
    if (psd_table_nstate(nt) != psd_table_nstate(t)) {
      snprintf(err, errlen,
               "table '%s': old shard %d's rows carry %u state floats; the "
               "spec's optimizer for it %u",
               conf->name, k, psd_table_nstate(t), psd_table_nstate(nt));
      rc = CM_EFORMAT;
      goto out;
    }
    for (size_t i = 0; i < all->nrows; i++)
      n += to[i] == cut->shard;
    memset(&mine, 0, sizeof mine);
    mine.dim = all->dim;
    mine.nstate = all->nstate;
    mine.delta = 1; /* upsert: the rows of every old shard are added */
    mine.ids = malloc(n * sizeof *mine.ids + 1);
    mine.stats = malloc(n * sizeof *mine.stats + 1);
    mine.values = malloc(n * dim * sizeof(float) + 1);
    mine.state = malloc(n * ns * sizeof(float) + 1);
    if (!mine.ids || !mine.stats || !mine.values || !mine.state) {
      rc = CM_ENOMEM;
    } else {
      for (size_t i = 0; i < all->nrows; i++) {
        if (to[i] != cut->shard)
          continue;
        mine.ids[mine.nrows] = all->ids[i];
        mine.stats[mine.nrows] = all->stats[i];
        memcpy(mine.values + mine.nrows * dim, all->values + i * dim,
               dim * sizeof(float));
        memcpy(mine.state + mine.nrows * ns, all->state + i * ns,
               ns * sizeof(float));
        mine.nrows++;
      }
      rc = psd_table_restore(nt, &mine);
    }
    free(mine.ids);
    free(mine.stats);
    free(mine.values);
    free(mine.state);
    if (rc)
      goto out;
    cut->rows += n;
    if (k != cut->shard)
      cut->rows_moved += n;
    /* The table's version (pushes applied): the largest of its pieces. */
    psd_table_stats(nt, &now);
    if (ts.pushes > now.pushes)
      psd_table_set_pushes(nt, ts.pushes);
  }
out:
  if (rc == CM_ENOMEM)
    snprintf(err, errlen, "table '%s': out of memory", conf->name);
  free(to);
  psd_table_snap_free(all);
  return rc;
}

/* Makes the new shard's variables from the gathered rows, in the order
 * first met. */
static int make_vars(struct psd__reshard_cut *cut, struct gather *g, int n,
                     char *err, size_t errlen) {
  for (int i = 0; i < n; i++) {
    struct gather *x = &g[i];
    struct psd_var *v;
    int created = 0, rc;
    if (x->filled != x->end - x->begin) {
      snprintf(err, errlen,
               "variable '%s': the old shards hold %lld of the %lld rows "
               "[%lld, %lld) new shard %d needs (an old shard's checkpoint "
               "lacks it?)",
               x->name, (long long)x->filled, (long long)(x->end - x->begin),
               (long long)x->begin, (long long)x->end, cut->shard);
      return CM_EFORMAT;
    }
    if ((rc = psd_store_declare_values(
             cut->store, x->name, x->ndim, x->shape, x->placement, x->value,
             x->own ? &x->opt : NULL, &v, &created, err, errlen)))
      return rc;
    if (!created || v->nslots != x->nslots) {
      snprintf(err, errlen, "variable '%s': %s", x->name,
               created ? "the spec gives it another optimizer than its "
                         "checkpoint's"
                       : "twice in the old checkpoints");
      return CM_EFORMAT;
    }
    psd_store_set_asked(v, x->asked, 0);
    size_t len = (size_t)(x->end - x->begin) * x->row;
    for (int s = 0; s < x->nslots; s++)
      memcpy(v->slots[s], x->slots[s], len * sizeof(float));
    v->version = x->version;
    if (!x->pieces)
      x->steps_lo = x->steps_hi = 0;
    /* Slices of an async job may have taken different counts of steps;
     * the new slice takes the largest (the step never goes back). */
    if (x->steps_lo != x->steps_hi)
      cm_warn("reshard: variable '%s': its old slices had taken %llu to "
              "%llu optimizer steps (async); new shard %d's slice takes %llu",
              x->name, (unsigned long long)x->steps_lo,
              (unsigned long long)x->steps_hi, cut->shard,
              (unsigned long long)x->steps_hi);
    v->applied = x->steps_hi * len;
  }
  return 0;
}

/* A new shard's variables while its rows are gathered. */
struct gathers {
  struct gather *g; /* owned */
  int n, cap;       /* used, allocated */
};

int psd__reshard_cut(const struct psd__reshard_src *src, int first, int count,
                     struct psd__reshard_cut *out, char *err, size_t errlen) {
  const struct cm_job *job = src->o->job;
  int m = src->o->nshards, rc = 0;
  struct gathers *gs = calloc(count, sizeof *gs);

  memset(out, 0, count * sizeof *out);
  if (!gs)
    return CM_ENOMEM;
  for (int j = 0; !rc && j < count; j++) {
    out[j].shard = first + j;
    if (!(rc = psd_store_new(&out[j].store, first + j, m, &job->optim)))
      rc = psd_tables_new(&out[j].tables, job->tables, job->ntables,
                          &job->table_defaults, job->seed, err, errlen);
  }
  /* Each old shard loaded once for the whole group. */
  for (int k = 0; !rc && k < src->n; k++) {
    struct psd_store *old = NULL;
    struct psd_tables *ots = NULL;
    if ((rc = psd__reshard_load(src, k, &old, &ots, err, errlen)))
      break;
    for (int i = 0; !rc && i < psd_store_count(old); i++) {
      struct psd_var *v = psd_store_at(old, i);
      for (int j = 0; !rc && j < count; j++) {
        struct gather *x;
        if (!(rc = gather_of(&gs[j].g, &gs[j].n, &gs[j].cap, v, src->n, m,
                             first + j, &x)) &&
            x)
          gather_copy(x, v, k, first + j, &out[j]);
      }
    }
    for (int i = 0; !rc && i < psd_tables_count(ots); i++)
      rc = cut_table(out, count, psd_tables_at(ots, i), k, m, err, errlen);
    psd_store_free(old);
    psd_tables_free(ots);
  }
  for (int j = 0; !rc && j < count; j++)
    rc = make_vars(&out[j], gs[j].g, gs[j].n, err, errlen);
  if (rc == CM_ENOMEM)
    snprintf(err, errlen, "out of memory cutting new shards %d..%d", first,
             first + count - 1);
  for (int j = 0; j < count; j++) {
    for (int i = 0; i < gs[j].n; i++)
      gather_free(&gs[j].g[i]);
    free(gs[j].g);
    if (rc)
      psd__reshard_cut_free(&out[j]);
  }
  free(gs);
  return rc;
}

void psd__reshard_cut_free(struct psd__reshard_cut *c) {
  psd_store_free(c->store);
  psd_tables_free(c->tables);
  c->store = NULL;
  c->tables = NULL;
}
