/* A serving task's object and its version (serve.h): what psd_serve_new
 * makes, and a publication applied in place. An apply prepares outside the
 * lock what it can (new tables, the new list of dense variables, whose
 * values it takes from the publication without a copy), then holds the
 * table-wide lock exclusively only while it writes rows, so that a Lookup
 * sees the version before or the one after, never a mix. */
#include "serve_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "err.h"
#include "log.h"
#include "pubfile.h"

int psd_serve_new(struct psd_serve **out, const struct psd_serve_conf *c) {
  struct psd_serve *s = calloc(1, sizeof *s);
  if (!s)
    return CM_ENOMEM;
  snprintf(s->dir, sizeof s->dir, "%s", c->dir);
  snprintf(s->job, sizeof s->job, "%s", c->job);
  s->replica = c->replica;
  s->shard = c->shard;
  s->shards = c->shards;
  cm_layout_map_init(&s->map, CM_LAYOUT_RULE_BUCKETS,
                     c->job_shards > 0 ? c->job_shards : s->shards);
  s->keep_left_ms = c->keep_left_ms;
  s->seed = c->seed;
  s->max_message = c->max_message;
  if (c->defaults)
    s->defaults = *c->defaults;
  else
    cm_table_conf_defaults(&s->defaults);
  /* Writers first: a steady stream of Lookups must not hold a new version
   * back (glibc's rwlocks prefer readers by default). */
  pthread_rwlockattr_t attr;
  pthread_rwlockattr_init(&attr);
  pthread_rwlockattr_setkind_np(&attr,
                                PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
  pthread_rwlock_init(&s->lock, &attr);
  pthread_rwlockattr_destroy(&attr);
  pthread_mutex_init(&s->stat_lock, NULL);
  clock_gettime(CLOCK_MONOTONIC, &s->started);
  cm_request_host_init(&s->host, s->job, "serving task", "serve:%d",
                       c->replica);
  /* The spec's tables are answered (initial rows) before any publication
   * holds them. */
  if (c->ntables > 0) {
    s->spec_tables = malloc(c->ntables * sizeof *s->spec_tables);
    s->tabs = calloc(c->ntables, sizeof *s->tabs);
    if (!s->spec_tables || !s->tabs) {
      psd_serve_free(s);
      return CM_ENOMEM;
    }
    memcpy(s->spec_tables, c->tables, c->ntables * sizeof *s->spec_tables);
    s->nspec = s->ntabs = c->ntables;
    for (int i = 0; i < c->ntables; i++)
      s->tabs[i].conf = c->tables[i];
  }
  psd__serve_methods_init(s);
  *out = s;
  return 0;
}

static void free_dense(struct psd__serve_dense *d, int n) {
  for (int i = 0; i < n; i++)
    free(d[i].values);
  free(d);
}

void psd_serve_free(struct psd_serve *s) {
  if (!s)
    return;
  for (int i = 0; i < s->ntabs; i++)
    psd_serve_table_free(s->tabs[i].rows);
  free(s->tabs);
  free_dense(s->dense, s->ndense);
  free(s->spec_tables);
  pthread_rwlock_destroy(&s->lock);
  pthread_mutex_destroy(&s->stat_lock);
  free(s);
}

void psd_serve_set_self(struct psd_serve *s,
                        const struct cm_request_self *self) {
  s->host.self = self;
}

void psd_serve_set_server(struct psd_serve *s, struct cm_server *rpc) {
  s->rpc = rpc;
}

const struct cm_rpc_method *psd_serve_methods(struct psd_serve *s, int *n) {
  *n = s->nmethods;
  return s->methods;
}

struct psd__serve_tab *psd__serve_find(struct psd_serve *s, const char *name) {
  for (int i = 0; i < s->ntabs; i++)
    if (!strcmp(s->tabs[i].conf.name, name))
      return &s->tabs[i];
  return NULL;
}

void psd__serve_size(struct psd_serve *s, uint64_t *rows, uint64_t *bytes) {
  *rows = 0;
  *bytes = 0;
  for (int i = 0; i < s->ntabs; i++)
    if (s->tabs[i].rows) {
      *rows += psd_serve_table_rows(s->tabs[i].rows);
      *bytes += psd_serve_table_bytes(s->tabs[i].rows);
    }
  for (int i = 0; i < s->ndense; i++)
    *bytes += s->dense[i].nvalues * sizeof(float);
}

void psd_serve_state(struct psd_serve *s, struct psd_serve_state *out) {
  memset(out, 0, sizeof *out);
  pthread_rwlock_rdlock(&s->lock);
  out->version = s->version;
  out->base = s->base;
  out->step = s->step;
  out->time_unix_ms = s->time_unix_ms;
  out->layout = s->layout;
  out->shards = s->version ? s->lshards : 0;
  out->move_to = s->move_to;
  out->moved = s->moved;
  psd__serve_size(s, &out->rows, &out->bytes);
  pthread_rwlock_unlock(&s->lock);
  pthread_mutex_lock(&s->stat_lock);
  out->newest_seen = s->newest_seen;
  out->applied = s->applied;
  out->refused = s->refused;
  snprintf(out->last_refusal, sizeof out->last_refusal, "%s", s->last_refusal);
  pthread_mutex_unlock(&s->stat_lock);
  out->lookups = atomic_load(&s->lookups);
  out->errors = atomic_load(&s->errors);
}

/* Floats of a dense variable's rows [row_begin, row_end). */
static size_t dense_floats(const struct psd_pub_dense *d) {
  size_t row = 1;
  for (int k = 1; k < d->ndim; k++)
    row *= (size_t)d->shape[k];
  return (size_t)(d->row_end - d->row_begin) * row;
}

/* What an apply prepares before it takes the lock. */
struct prep {
  struct psd__serve_tab *tabs;    /* the table list after it (entries of
                                     tables held are copied, rows shared) */
  int ntabs;                      /* entries in tabs */
  struct psd_serve_table **made;  /* tables made for it, one per p->tables
                                     entry (NULL: an existing one) */
  int *at;                        /* p->tables[i]'s entry in tabs */
  struct psd__serve_dense *dense; /* the new dense list */
  struct cm_layout_map *map;      /* the version's row map */
};

/* Checks p against what is held and prepares what applying it needs.
 * Returns 0, CM_EFORMAT (err), CM_ENOMEM. */
static int prepare(struct psd_serve *s, struct psd_pub *p, struct prep *pr,
                   char *err, size_t errlen) {
  int n = s->ntabs + p->ntables;
  memset(pr, 0, sizeof *pr);
  if (!p->full && (!s->version || s->need_full || p->prev != s->version ||
                   p->base != s->base)) {
    snprintf(err, errlen,
             "version %llu is a delta after version %llu of the chain from "
             "full version %llu; this task holds version %llu (from full "
             "version %llu)%s",
             (unsigned long long)p->version, (unsigned long long)p->prev,
             (unsigned long long)p->base, (unsigned long long)s->version,
             (unsigned long long)s->base,
             s->need_full ? " and waits for a full publication" : "");
    return CM_EFORMAT;
  }
  pr->tabs = calloc(n + 1, sizeof *pr->tabs);
  pr->made = calloc(p->ntables + 1, sizeof *pr->made);
  pr->at = calloc(p->ntables + 1, sizeof *pr->at);
  pr->dense = calloc(p->ndense + 1, sizeof *pr->dense);
  pr->map = malloc(sizeof *pr->map);
  if (!pr->tabs || !pr->made || !pr->at || !pr->dense || !pr->map)
    return CM_ENOMEM;
  /* The rows it holds: the buckets its layout and live move give the
   * shard (docs/serving.md "Following a reshard"). */
  cm_layout_map_of(pr->map, p->rows, p->shards, p->move_to, p->moved);
  if (s->ntabs)
    memcpy(pr->tabs, s->tabs, s->ntabs * sizeof *pr->tabs);
  pr->ntabs = s->ntabs;
  for (int i = 0; i < p->ntables; i++) {
    struct psd_pub_table *pt = &p->tables[i];
    int k = 0;
    while (k < pr->ntabs && strcmp(pr->tabs[k].conf.name, pt->name))
      k++;
    struct psd__serve_tab *tab = &pr->tabs[k];
    int same =
        k < pr->ntabs && tab->rows && psd_serve_table_dim(tab->rows) == pt->dim;
    if (!p->full && k < pr->ntabs && tab->rows && !same) {
      snprintf(err, errlen,
               "table '%s' has dim %u in version %llu, %u in the version "
               "held (%llu)",
               pt->name, pt->dim, (unsigned long long)p->version,
               psd_serve_table_dim(tab->rows), (unsigned long long)s->version);
      return CM_EFORMAT;
    }
    if (!same && psd_serve_table_new(&pr->made[i], pt->dim)) {
      snprintf(err, errlen, "table '%s': dim %u", pt->name, pt->dim);
      return pt->dim ? CM_ENOMEM : CM_EFORMAT;
    }
    if (k == pr->ntabs)
      pr->ntabs++;
    cm_table_conf_for(s->spec_tables, s->nspec, &s->defaults, pt->name, pt->dim,
                      &tab->conf);
    pr->at[i] = k;
  }
  for (int i = 0; i < p->ndense; i++) {
    struct psd_pub_dense *pd = &p->dense[i];
    struct psd__serve_dense *d = &pr->dense[i];
    snprintf(d->name, sizeof d->name, "%s", pd->name);
    memcpy(d->shape, pd->shape, sizeof d->shape);
    d->ndim = pd->ndim;
    d->row_begin = pd->row_begin;
    d->row_end = pd->row_end;
    d->nvalues = dense_floats(pd);
  }
  return 0;
}

static void prep_free(struct prep *pr, int nmade) {
  for (int i = 0; pr->made && i < nmade; i++)
    psd_serve_table_free(pr->made[i]);
  free(pr->tabs);
  free(pr->made);
  free(pr->at);
  free(pr->dense);
  free(pr->map);
}

/* The buckets whose rows an apply drops (drop_if's ctx). */
struct drop_set {
  const uint8_t *bucket; /* per bucket: 1 drop */
};

static int drop_bucket(void *ctx, uint64_t id) {
  const struct drop_set *d = ctx;
  return d->bucket[cm_layout_bucket(cm_layout_id_hash(id))];
}

/* Under the lock, before the rows change: the buckets map takes from this
 * shard are marked left now (their rows still answered for keep_left_ms),
 * those it gives back or anew are not; into drop (per bucket) the left
 * ones whose time is up, and with keep (per bucket) the rows a full
 * publication keeps: the left ones. Returns whether any bucket is in
 * drop, and *kept whether any is in keep. */
static int follow_map(struct psd_serve *s, const struct cm_layout_map *map,
                      uint8_t *drop, uint8_t *keep, int *kept) {
  double now = cm_mono_ms();
  int any = 0;
  *kept = 0;
  memset(drop, 0, CM_LAYOUT_BUCKETS);
  memset(keep, 0, CM_LAYOUT_BUCKETS);
  if (map->rule == CM_LAYOUT_RULE_MODULO ||
      s->map.rule == CM_LAYOUT_RULE_MODULO) {
    memset(s->left_ms, 0, sizeof s->left_ms);
    return 0;
  }
  for (unsigned b = 0; b < CM_LAYOUT_BUCKETS; b++) {
    if (map->shard[b] == s->shard)
      s->left_ms[b] = 0;
    else if (s->version && s->map.shard[b] == s->shard && !s->left_ms[b])
      s->left_ms[b] = now;
    if (s->left_ms[b] && now - s->left_ms[b] > s->keep_left_ms) {
      s->left_ms[b] = 0;
      drop[b] = 1;
      any = 1;
    }
    if (s->left_ms[b])
      keep[b] = 1, *kept = 1;
  }
  return any;
}

static int keep_bucket(void *ctx, uint64_t id) { return !drop_bucket(ctx, id); }

/* Under the lock, the map followed: drops the removed ids but those of
 * buckets that left (a source lists the rows it gave away as removed;
 * they stay answered while their bucket's left time lasts). */
static void remove_owned(struct psd_serve *s, struct psd_serve_table *t,
                         const uint64_t *ids, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (s->map.rule != CM_LAYOUT_RULE_MODULO &&
        s->left_ms[cm_layout_bucket(cm_layout_id_hash(ids[i]))])
      continue;
    psd_serve_table_remove(t, &ids[i], 1);
  }
}

int psd_serve_apply(struct psd_serve *s, struct psd_pub *p, char *err,
                    size_t errlen) {
  struct psd_serve_table **old = NULL;
  struct psd__serve_dense *old_dense;
  struct prep pr;
  int rc, nold = 0, old_ndense;

  if ((rc = prepare(s, p, &pr, err, errlen))) {
    prep_free(&pr, p->ntables);
    if (rc == CM_ENOMEM)
      snprintf(err, errlen, "out of memory preparing version %llu",
               (unsigned long long)p->version);
    return rc;
  }
  /* The tables a full publication leaves out, or gives another dim, are
   * dropped; their rows are freed once the lock is released. */
  if (!(old = calloc(pr.ntabs + p->ntables + 1, sizeof *old))) {
    prep_free(&pr, p->ntables);
    snprintf(err, errlen, "out of memory");
    return CM_ENOMEM;
  }
  pthread_rwlock_wrlock(&s->lock);
  uint8_t drop[CM_LAYOUT_BUCKETS], keep[CM_LAYOUT_BUCKETS];
  int kept, dropping = follow_map(s, pr.map, drop, keep, &kept);
  for (int i = 0; i < p->ntables; i++)
    if (pr.made[i]) {
      if (pr.tabs[pr.at[i]].rows)
        old[nold++] = pr.tabs[pr.at[i]].rows;
      pr.tabs[pr.at[i]].rows = pr.made[i];
      pr.made[i] = NULL;
    }
  /* A full publication replaces every row but those of buckets that left
   * lately; their time up, those go too. */
  for (int k = 0; k < pr.ntabs; k++) {
    struct psd_serve_table *t = pr.tabs[k].rows;
    if (!t)
      continue;
    if (p->full && !kept)
      psd_serve_table_clear(t);
    else if (p->full)
      psd_serve_table_drop_if(t, keep_bucket, &(struct drop_set){keep});
    else if (dropping)
      psd_serve_table_drop_if(t, drop_bucket, &(struct drop_set){drop});
  }
  for (int i = 0; i < p->ntables && !rc; i++) {
    struct psd_pub_table *pt = &p->tables[i];
    struct psd_serve_table *t = pr.tabs[pr.at[i]].rows;
    remove_owned(s, t, pt->removed, pt->nremoved);
    rc = psd_serve_table_upsert(t, pt->ids, pt->nrows, pt->values);
  }
  for (int i = 0; i < p->ndense; i++) {
    pr.dense[i].values = p->dense[i].values; /* taken, not copied */
    p->dense[i].values = NULL;
  }
  free(s->tabs);
  s->tabs = pr.tabs;
  s->ntabs = pr.ntabs;
  pr.tabs = NULL;
  old_dense = s->dense;
  old_ndense = s->ndense;
  s->dense = pr.dense;
  s->ndense = p->ndense;
  pr.dense = NULL;
  s->version = p->version;
  s->map = *pr.map;
  s->layout = p->layout;
  s->lshards = p->shards;
  s->move_to = p->move_to;
  s->moved = p->moved;
  s->base = p->full ? p->version : s->base;
  s->step = p->step;
  s->time_unix_ms = p->time_unix_ms;
  if (p->full)
    s->need_full = 0;
  if (rc) {
    /* Some rows of this version are in, some not: only a full one can
     * make the task whole again. */
    s->need_full = 1;
    snprintf(err, errlen, "out of memory applying version %llu",
             (unsigned long long)p->version);
  }
  pthread_rwlock_unlock(&s->lock);
  for (int i = 0; i < nold; i++)
    psd_serve_table_free(old[i]);
  free(old);
  free_dense(old_dense, old_ndense);
  prep_free(&pr, p->ntables);
  return rc;
}
