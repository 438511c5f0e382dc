/* Sync mode's staged sparse gradients (sstage.h): per worker, a list of
 * (table, ids, gradients) runs for the one step it staged for, under one
 * mutex (staging copies; the commit concatenates and applies), oldest
 * first. */
#include "sstage.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"

/* One sparse push staged by one worker. */
struct run {
  struct psd_table *t; /* borrowed: tables live as long as psd */
  uint64_t *ids;       /* owned, n */
  float *g;            /* owned, n x dim */
  size_t n;            /* rows */
  struct run *next;    /* the worker's next run, in arrival order */
};

/* What one worker has staged. */
struct slot {
  uint64_t step;    /* the step its runs are for */
  struct run *runs; /* owned list, oldest first */
  struct run *last; /* its last entry, NULL when empty */
};

struct psd_sstage {
  pthread_mutex_t lock; /* guards slots */
  int nworkers;         /* entries in slots */
  struct slot *slots;   /* owned, one per worker */
};

static void free_runs(struct run *r) {
  while (r) {
    struct run *next = r->next;
    free(r->ids);
    free(r->g);
    free(r);
    r = next;
  }
}

int psd_sstage_new(struct psd_sstage **out, int nworkers) {
  struct psd_sstage *s = calloc(1, sizeof *s);
  if (!s || !(s->slots = calloc((size_t)nworkers + 1, sizeof *s->slots))) {
    free(s);
    return CM_ENOMEM;
  }
  s->nworkers = nworkers;
  pthread_mutex_init(&s->lock, NULL);
  *out = s;
  return 0;
}

void psd_sstage_free(struct psd_sstage *s) {
  if (!s)
    return;
  psd_sstage_clear(s);
  pthread_mutex_destroy(&s->lock);
  free(s->slots);
  free(s);
}

int psd_sstage_put(struct psd_sstage *s, int worker, uint64_t step,
                   struct psd_table *t, const uint64_t *ids, size_t n,
                   const float *g) {
  if (worker < 0 || worker >= s->nworkers)
    return CM_EINVAL;
  size_t dim = psd_table_conf(t)->dim;
  struct run *r = calloc(1, sizeof *r);
  if (!r || !(r->ids = malloc(n * sizeof *ids + 1)) ||
      !(r->g = malloc(n * dim * sizeof *g + 1))) {
    free_runs(r);
    return CM_ENOMEM;
  }
  if (n) { /* an empty run's ids and g may be NULL */
    memcpy(r->ids, ids, n * sizeof *ids);
    memcpy(r->g, g, n * dim * sizeof *g);
  }
  r->t = t;
  r->n = n;
  pthread_mutex_lock(&s->lock);
  struct slot *sl = &s->slots[worker];
  if (sl->runs && sl->step != step) {
    free_runs(sl->runs);
    sl->runs = sl->last = NULL;
  }
  sl->step = step;
  if (sl->runs)
    sl->last->next = r;
  else
    sl->runs = r;
  sl->last = r;
  pthread_mutex_unlock(&s->lock);
  return 0;
}

/* Applies the runs of table t staged for step by applied workers, in
 * ascending worker order and each worker's arrival order: one update per
 * row, each run counted as the push it was (psd_table_push_runs). */
static int apply_table(struct psd_sstage *s, struct psd_table *t, uint64_t step,
                       const int *applied, int napplied) {
  size_t n = 0, dim = psd_table_conf(t)->dim, at = 0, nruns = 0;
  uint64_t *ids = NULL;
  float *g = NULL;
  size_t *ends = NULL;
  int rc = 0;
  for (int k = 0; k < napplied; k++) {
    struct slot *sl = &s->slots[applied[k]];
    if (sl->step == step)
      for (struct run *r = sl->runs; r; r = r->next)
        if (r->t == t) {
          n += r->n;
          nruns++;
        }
  }
  if (!n)
    return 0;
  if (!(ids = malloc(n * sizeof *ids)) || !(g = malloc(n * dim * sizeof *g)) ||
      !(ends = malloc(nruns * sizeof *ends))) {
    rc = CM_ENOMEM;
    goto out;
  }
  nruns = 0;
  for (int k = 0; k < napplied; k++) {
    struct slot *sl = &s->slots[applied[k]];
    if (sl->step != step)
      continue;
    for (struct run *r = sl->runs; r; r = r->next)
      if (r->t == t) {
        memcpy(ids + at, r->ids, r->n * sizeof *ids);
        memcpy(g + at * dim, r->g, r->n * dim * sizeof *g);
        at += r->n;
        ends[nruns++] = at;
      }
  }
  rc = psd_table_push_runs(t, ids, n, g, 1.0f / (float)napplied, step, ends,
                           nruns);
out:
  free(ids);
  free(g);
  free(ends);
  return rc;
}

int psd_sstage_commit(struct psd_sstage *s, uint64_t step, const int *applied,
                      int napplied) {
  int rc = 0;
  pthread_mutex_lock(&s->lock);
  /* Each table once: the distinct tables of the applied workers' runs. */
  for (int k = 0; k < napplied && !rc; k++) {
    struct slot *sl = &s->slots[applied[k]];
    if (sl->step != step)
      continue;
    for (struct run *r = sl->runs; r && !rc; r = r->next) {
      int seen = 0;
      for (int j = 0; j < k && !seen; j++) {
        struct slot *o = &s->slots[applied[j]];
        if (o->step == step)
          for (struct run *q = o->runs; q && !seen; q = q->next)
            seen = q->t == r->t;
      }
      for (struct run *q = sl->runs; q != r && !seen; q = q->next)
        seen = q->t == r->t;
      if (!seen)
        rc = apply_table(s, r->t, step, applied, napplied);
    }
  }
  for (int w = 0; w < s->nworkers; w++)
    if (s->slots[w].runs && s->slots[w].step <= step) {
      free_runs(s->slots[w].runs);
      s->slots[w].runs = s->slots[w].last = NULL;
    }
  pthread_mutex_unlock(&s->lock);
  return rc;
}

void psd_sstage_clear(struct psd_sstage *s) {
  pthread_mutex_lock(&s->lock);
  for (int w = 0; w < s->nworkers; w++) {
    free_runs(s->slots[w].runs);
    s->slots[w].runs = s->slots[w].last = NULL;
  }
  pthread_mutex_unlock(&s->lock);
}

uint64_t psd_sstage_rows(struct psd_sstage *s) {
  uint64_t n = 0;
  pthread_mutex_lock(&s->lock);
  for (int w = 0; w < s->nworkers; w++)
    for (struct run *r = s->slots[w].runs; r; r = r->next)
      n += r->n;
  pthread_mutex_unlock(&s->lock);
  return n;
}
