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

/* Where a variable held among n old shards goes among m: by how its
 * declaration placed it, the rule clients that follow the move use too
 * (cm_layout_replace). */
static int new_placement(const struct psd_var *v, int n, int m) {
  return cm_layout_replace(v->asked, v->placement, n, v->name,
                           v->numel * sizeof(float), m);
}

/* The gather of v for new shard `shard` of m: found in g[0..*n), or added
 * (*n grows). *out is NULL when the new shard holds none of v. */
static int gather_of(struct psd__gather **g, int *n, int *cap,
                     const struct psd_var *v, int nold, int m, int shard,
                     struct psd__gather **out) {
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
    struct psd__gather *ng = realloc(*g, (size_t)c * sizeof *ng);
    if (!ng)
      return CM_ENOMEM;
    *g = ng;
    *cap = c;
  }
  struct psd__gather *x = &(*g)[(*n)++];
  int rc = psd__gather_init(x, v->name, v->ndim, v->shape, p, v->asked, v->own,
                            &v->opt, m, shard);
  if (!rc)
    *out = x;
  return rc;
}

/* Copies the rows of old slice v (of old shard k) that g holds. */
static void gather_copy(struct psd__gather *g, const struct psd_var *v, int k,
                        int shard, struct psd__reshard_cut *cut) {
  struct psd__piece p;
  psd__piece_of(v, &p);
  uint64_t len = psd__gather_add(g, &p);
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
static int make_vars(struct psd__reshard_cut *cut, struct psd__gather *g, int n,
                     char *err, size_t errlen) {
  for (int i = 0; i < n; i++) {
    int rc =
        psd__gather_make(&g[i], cut->store, cut->shard, "reshard", err, errlen);
    if (rc)
      return rc;
  }
  return 0;
}

/* A new shard's variables while its rows are gathered. */
struct gathers {
  struct psd__gather *g; /* owned */
  int n, cap;            /* used, allocated */
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
        struct psd__gather *x;
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
      psd__gather_free(&gs[j].g[i]);
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
