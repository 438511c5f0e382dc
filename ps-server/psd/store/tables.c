/* A shard's embedding tables by name (tables.h): a fixed array guarded by a
 * read-write lock; lookups take it for reading. */
#include "tables.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"

struct psd_tables {
  pthread_rwlock_t lock;                   /* guards n and t */
  uint64_t seed;                           /* the job's */
  int nspec;                               /* entries in spec */
  struct cm_table_conf spec[CM_TABLE_MAX]; /* the spec's job.tables */
  struct cm_table_conf defaults;           /* any other table's settings */
  int n;                                   /* tables in t */
  struct psd_table *t[CM_TABLE_MAX];       /* owned, in creation order */
};

void psd_tables_conf_for(const struct psd_tables *ts, const char *name,
                         uint32_t dim, uint64_t id_bound,
                         struct cm_table_conf *out) {
  cm_table_conf_for(ts->spec, ts->nspec, &ts->defaults, name, dim, out);
  out->id_bound = id_bound;
}

int psd_tables_new(struct psd_tables **out, const struct cm_table_conf *spec,
                   int nspec, const struct cm_table_conf *defaults,
                   uint64_t seed, char *err, size_t errlen) {
  struct psd_tables *ts = calloc(1, sizeof *ts);
  int rc = 0;
  if (!ts)
    return CM_ENOMEM;
  if (nspec > CM_TABLE_MAX) {
    snprintf(err, errlen, "%d tables; at most %d", nspec, CM_TABLE_MAX);
    free(ts);
    return CM_EINVAL;
  }
  pthread_rwlock_init(&ts->lock, NULL);
  ts->seed = seed;
  if (defaults)
    ts->defaults = *defaults;
  else
    cm_table_conf_defaults(&ts->defaults);
  ts->nspec = nspec;
  if (nspec)
    memcpy(ts->spec, spec, (size_t)nspec * sizeof *spec);
  for (int i = 0; i < nspec; i++) {
    struct psd_table *t;
    int created;
    rc = psd_tables_declare(ts, spec[i].name, spec[i].dim, spec[i].id_bound, &t,
                            &created, err, errlen);
    if (rc) {
      psd_tables_free(ts);
      return rc;
    }
  }
  *out = ts;
  return 0;
}

void psd_tables_free(struct psd_tables *ts) {
  if (!ts)
    return;
  for (int i = 0; i < ts->n; i++)
    psd_table_free(ts->t[i]);
  pthread_rwlock_destroy(&ts->lock);
  free(ts);
}

/* The table called name; caller holds the lock. */
static struct psd_table *find_locked(struct psd_tables *ts, const char *name) {
  for (int i = 0; i < ts->n; i++)
    if (!strcmp(psd_table_conf(ts->t[i])->name, name))
      return ts->t[i];
  return NULL;
}

struct psd_table *psd_tables_find(struct psd_tables *ts, const char *name) {
  pthread_rwlock_rdlock(&ts->lock);
  struct psd_table *t = find_locked(ts, name);
  pthread_rwlock_unlock(&ts->lock);
  return t;
}

int psd_tables_declare(struct psd_tables *ts, const char *name, uint32_t dim,
                       uint64_t id_bound, struct psd_table **out, int *created,
                       char *err, size_t errlen) {
  struct cm_table_conf conf;
  struct psd_table *t;
  int rc = 0;
  *created = 0;
  if (dim < 1 || dim > CM_TABLE_MAX_DIM) {
    snprintf(err, errlen, "table '%s': dim %u; expected 1..%d", name, dim,
             CM_TABLE_MAX_DIM);
    return CM_EINVAL;
  }
  pthread_rwlock_wrlock(&ts->lock);
  if ((t = find_locked(ts, name))) {
    const struct cm_table_conf *c = psd_table_conf(t);
    if (c->dim != dim || c->id_bound != id_bound) {
      snprintf(err, errlen,
               "table '%s' exists with dim %u and id_bound %llu; declared "
               "with dim %u and id_bound %llu",
               name, c->dim, (unsigned long long)c->id_bound, dim,
               (unsigned long long)id_bound);
      rc = CM_EEXIST;
    }
    goto out;
  }
  if (ts->n >= CM_TABLE_MAX) {
    snprintf(err, errlen, "table '%s': this shard holds %d tables, the most",
             name, CM_TABLE_MAX);
    rc = CM_EINVAL;
    goto out;
  }
  psd_tables_conf_for(ts, name, dim, id_bound, &conf);
  if ((rc = psd_table_new(&t, &conf, ts->seed, err, errlen)))
    goto out;
  ts->t[ts->n++] = t;
  *created = 1;
out:
  pthread_rwlock_unlock(&ts->lock);
  if (!rc)
    *out = t;
  return rc;
}

int psd_tables_count(struct psd_tables *ts) {
  pthread_rwlock_rdlock(&ts->lock);
  int n = ts->n;
  pthread_rwlock_unlock(&ts->lock);
  return n;
}

struct psd_table *psd_tables_at(struct psd_tables *ts, int i) {
  pthread_rwlock_rdlock(&ts->lock);
  struct psd_table *t = i >= 0 && i < ts->n ? ts->t[i] : NULL;
  pthread_rwlock_unlock(&ts->lock);
  return t;
}

int psd_tables_adopt(struct psd_tables *ts, struct psd_table *t) {
  int rc = 0;
  pthread_rwlock_wrlock(&ts->lock);
  struct psd_table *old = find_locked(ts, psd_table_conf(t)->name);
  if (old) {
    /* The restored one replaces the empty one created from the spec. */
    for (int i = 0; i < ts->n; i++)
      if (ts->t[i] == old) {
        ts->t[i] = t;
        psd_table_free(old);
        break;
      }
  } else if (ts->n >= CM_TABLE_MAX) {
    rc = CM_EINVAL;
  } else {
    ts->t[ts->n++] = t;
  }
  pthread_rwlock_unlock(&ts->lock);
  return rc;
}

void psd_tables_describe_admission(const struct cm_table_conf *c, char *buf,
                                   size_t len) {
  if (c->admit == CM_ADMIT_COUNT)
    snprintf(buf, len, "count(%u)", c->admit_count);
  else if (c->admit == CM_ADMIT_PROB)
    snprintf(buf, len, "probability(%g)", c->admit_prob);
  else
    snprintf(buf, len, "always");
}

void psd_tables_describe_eviction(const struct cm_table_conf *c, char *buf,
                                  size_t len) {
  if (c->evict_after_steps && c->evict_min_count)
    snprintf(buf, len, "after_steps(%llu), min_count(%u)",
             (unsigned long long)c->evict_after_steps, c->evict_min_count);
  else if (c->evict_after_steps)
    snprintf(buf, len, "after_steps(%llu)",
             (unsigned long long)c->evict_after_steps);
  else if (c->evict_min_count)
    snprintf(buf, len, "min_count(%u)", c->evict_min_count);
  else
    snprintf(buf, len, "off");
}
