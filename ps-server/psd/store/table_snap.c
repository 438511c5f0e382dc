/* An embedding table's snapshots (checkpoints' and publications'), pages,
 * eviction and hottest rows (table.h, table_internal.h). A snapshot holds
 * every stripe's lock at once, taken in stripe order, so it is one instant
 * of the whole table. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "layout.h"
#include "table_internal.h"

static void lock_all(struct psd_table *t) {
  for (int i = 0; i < PSD__NSTRIPES; i++)
    pthread_mutex_lock(&t->st[i].lock);
}

static void unlock_all(struct psd_table *t) {
  for (int i = PSD__NSTRIPES - 1; i >= 0; i--)
    pthread_mutex_unlock(&t->st[i].lock);
}

void psd_table_snap_free(struct psd_table_snap *s) {
  if (!s)
    return;
  free(s->ids);
  free(s->stats);
  free(s->values);
  free(s->state);
  free(s->evicted);
  free(s);
}

/* Orders (id, record pointer) pairs by id. */
struct pick {
  uint64_t id;     /* the row's id */
  struct rec *rec; /* its record (stripes held) */
};

static int cmp_pick(const void *a, const void *b) {
  uint64_t x = ((const struct pick *)a)->id, y = ((const struct pick *)b)->id;
  return x < y ? -1 : x > y;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* Copies picks[0..n) into a new snapshot (stripes held); values_only:
 * no state, no stats (a publication's). */
static struct psd_table_snap *copy_out(const struct psd_table *t,
                                       struct pick *picks, size_t n,
                                       int values_only) {
  uint32_t dim = t->conf.dim, ns = values_only ? 0 : t->nstate;
  struct psd_table_snap *s = calloc(1, sizeof *s);
  if (!s)
    return NULL;
  s->dim = dim;
  s->nstate = ns;
  s->nrows = n;
  s->ids = malloc((n + 1) * sizeof *s->ids);
  s->stats = values_only ? NULL : malloc((n + 1) * sizeof *s->stats);
  s->values = malloc((n * dim + 1) * sizeof *s->values);
  s->state = malloc((n * ns + 1) * sizeof *s->state);
  if (!s->ids || (!values_only && !s->stats) || !s->values || !s->state) {
    psd_table_snap_free(s);
    return NULL;
  }
  qsort(picks, n, sizeof *picks, cmp_pick);
  for (size_t i = 0; i < n; i++) {
    struct rec *r = picks[i].rec;
    float *v = psd__rec_val(r);
    s->ids[i] = r->id;
    if (!values_only)
      s->stats[i] = (struct psd_row_stats){r->count, r->t, r->last_step};
    memcpy(s->values + i * dim, v, dim * sizeof(float));
    memcpy(s->state + i * ns, v + dim, ns * sizeof(float));
  }
  return s;
}

/* Whether id's bucket is in the set (a bitset of CM_LAYOUT_BUCKETS bits;
 * NULL: every bucket). */
static int in_buckets(const uint8_t *set, uint64_t id) {
  unsigned b = cm_layout_bucket(cm_layout_id_hash(id));
  return !set || (set[b >> 3] >> (b & 7) & 1);
}

/* Live records matching (delta: changed since base gen; page: id above
 * after; buckets: in that set), into a new array (*n of them). Stripes
 * held. */
static struct pick *collect(struct psd_table *t, int delta, uint64_t base,
                            int has_after, uint64_t after,
                            const uint8_t *buckets, size_t *n) {
  size_t total = 0, k = 0;
  for (int i = 0; i < PSD__NSTRIPES; i++)
    total += psd_rows_live(&t->st[i].rows);
  struct pick *p = malloc((total + 1) * sizeof *p);
  if (!p)
    return NULL;
  for (int i = 0; i < PSD__NSTRIPES; i++) {
    struct stripe *s = &t->st[i];
    for (size_t r = 0; r < psd_rows_used(&s->rows); r++) {
      struct rec *x = psd__rec_at(s, r);
      if (!x->live || (delta && x->gen <= base) ||
          (has_after && x->id <= after) || !in_buckets(buckets, x->id))
        continue;
      p[k++] = (struct pick){x->id, x};
    }
  }
  *n = k;
  return p;
}

/* The ids evicted since cursor c's last snapshot (a move's: those of its
 * buckets), sorted, into s (stripes held). The publications' and a
 * move's leave out the ids s holds as rows (stored again since) and
 * repeats (evicted, stored, evicted again); a checkpoint's keep them, as
 * its files always have. */
static int take_evicted(struct psd_table *t, enum psd__cursor_of c,
                        const uint8_t *buckets, struct psd_table_snap *s) {
  size_t total = 0, k = 0, j = 0;
  for (int i = 0; i < PSD__NSTRIPES; i++)
    total += t->st[i].ev[c].n;
  uint64_t *ids = malloc((total + 1) * sizeof *ids);
  if (!ids)
    return CM_ENOMEM;
  for (int i = 0; i < PSD__NSTRIPES; i++) {
    const struct evlist *e = &t->st[i].ev[c];
    if (e->n) /* a stripe's list is NULL until it first evicts */
      memcpy(ids + k, e->ids, e->n * sizeof *ids);
    k += e->n;
  }
  qsort(ids, total, sizeof *ids, cmp_u64);
  s->evicted = ids;
  s->nevicted = total;
  if (c == PSD__CKPT)
    return 0;
  /* Both sorted: drop those among the rows, and repeats. */
  k = 0;
  for (size_t i = 0; i < total; i++) {
    uint64_t id = ids[i];
    if (!in_buckets(buckets, id))
      continue;
    while (j < s->nrows && s->ids[j] < id)
      j++;
    if ((j < s->nrows && s->ids[j] == id) || (k && ids[k - 1] == id))
      continue;
    ids[k++] = id;
  }
  s->nevicted = k;
  return 0;
}

/* A snapshot for cursor c (checkpoints' or publications'): every row, or
 * with delta (and a snapshot of c taken before) the rows changed since
 * c's last one and the ids evicted since; then c moves to now. A
 * publication's rows carry values only. */
static int snapshot(struct psd_table *t, enum psd__cursor_of c, int delta,
                    const uint8_t *buckets, struct psd_table_snap **out) {
  struct cursor *cur = &t->cur[c];
  struct psd_table_snap *s = NULL;
  size_t n = 0;
  int rc = CM_ENOMEM;
  lock_all(t);
  delta = delta && cur->snapped;
  uint64_t base = cur->gen;
  struct pick *p = collect(t, delta, base, 0, 0, buckets, &n);
  if (!p || !(s = copy_out(t, p, n, c == PSD__PUB)) ||
      (delta && take_evicted(t, c, buckets, s)))
    goto out;
  s->delta = delta;
  s->base_gen = delta ? base : 0;
  s->gen = t->gen;
  /* Changes from now on belong to c's next snapshot. */
  cur->gen = t->gen;
  t->gen++;
  cur->snapped = 1;
  for (int i = 0; i < PSD__NSTRIPES; i++)
    t->st[i].ev[c].n = 0;
  rc = 0;
out:
  unlock_all(t);
  free(p);
  if (rc) {
    psd_table_snap_free(s);
    s = NULL;
  }
  *out = s;
  return rc;
}

int psd_table_snapshot(struct psd_table *t, int delta,
                       struct psd_table_snap **out) {
  return snapshot(t, PSD__CKPT, delta, NULL, out);
}

int psd_table_pub_snapshot(struct psd_table *t, int full,
                           struct psd_table_snap **out) {
  return snapshot(t, PSD__PUB, !full, NULL, out);
}

static int evict(struct psd_table *t, struct stripe *s, size_t k);

int psd_table_move_snapshot(struct psd_table *t, const uint8_t *buckets,
                            int delta, struct psd_table_snap **out) {
  return snapshot(t, PSD__MOVE, delta, buckets, out);
}

void psd_table_move_end(struct psd_table *t) {
  lock_all(t);
  t->cur[PSD__MOVE].snapped = 0;
  for (int i = 0; i < PSD__NSTRIPES; i++)
    t->st[i].ev[PSD__MOVE].n = 0;
  unlock_all(t);
}

int psd_table_drop_buckets(struct psd_table *t, const uint8_t *buckets,
                           uint64_t *dropped) {
  int rc = 0;
  *dropped = 0;
  lock_all(t);
  for (int i = 0; i < PSD__NSTRIPES && !rc; i++) {
    struct stripe *s = &t->st[i];
    for (size_t r = 0; r < psd_rows_used(&s->rows) && !rc; r++) {
      struct rec *x = psd__rec_at(s, r);
      if (!x->live || !in_buckets(buckets, x->id))
        continue;
      /* As an eviction: the next checkpoint's and publication's deltas
       * say the row is gone from here. */
      if (!(rc = evict(t, s, r)))
        (*dropped)++;
    }
  }
  unlock_all(t);
  return rc;
}

int psd_table_move_install(struct psd_table *t, const struct psd_table_snap *s,
                           const uint8_t *buckets, uint64_t *rows) {
  uint32_t dim = t->conf.dim, ns = t->nstate;
  uint64_t gone = 0;
  int rc = 0;
  *rows = 0;
  if (s->dim != dim || s->nstate != ns)
    return CM_EINVAL;
  lock_all(t);
  for (int i = 0; i < PSD__NSTRIPES && !s->delta && !rc; i++) {
    struct stripe *st = &t->st[i];
    for (size_t r = 0; r < psd_rows_used(&st->rows) && !rc; r++) {
      struct rec *x = psd__rec_at(st, r);
      if (x->live && in_buckets(buckets, x->id) && !(rc = evict(t, st, r)))
        gone++;
    }
  }
  for (size_t i = 0; i < s->nevicted && !rc; i++) {
    struct stripe *st = &t->st[stripe_of(s->evicted[i])];
    long k = psd__table_find(st, s->evicted[i]);
    if (k >= 0 && !(rc = evict(t, st, (size_t)k)))
      gone++;
  }
  for (size_t i = 0; i < s->nrows && !rc; i++) {
    struct stripe *st = &t->st[stripe_of(s->ids[i])];
    long k = psd__table_find(st, s->ids[i]);
    if (k < 0 && (k = psd__table_create(t, st, s->ids[i],
                                        psd_rows_hash(s->ids[i]))) < 0) {
      rc = CM_ENOMEM;
      break;
    }
    struct rec *r = psd__rec_at(st, (size_t)k);
    float *v = psd__rec_val(r);
    memcpy(v, s->values + i * dim, dim * sizeof(float));
    if (ns) /* an optimizer without state (sgd): no array */
      memcpy(v + dim, s->state + i * ns, ns * sizeof(float));
    r->count = s->stats[i].count;
    r->t = s->stats[i].t;
    r->last_step = s->stats[i].last_step;
    r->gen = t->gen; /* changed now: in every cursor's next delta */
    (*rows)++;
  }
  unlock_all(t);
  pthread_mutex_lock(&t->stat_lock);
  t->evicted += gone;
  pthread_mutex_unlock(&t->stat_lock);
  return rc;
}

int psd_table_page(struct psd_table *t, int has_after, uint64_t after,
                   size_t max_rows, struct psd_table_snap **out) {
  size_t n = 0;
  struct psd_table_snap *s = NULL;
  lock_all(t);
  struct pick *p = collect(t, 0, 0, has_after, after, NULL, &n);
  if (p) {
    qsort(p, n, sizeof *p, cmp_pick);
    s = copy_out(t, p, n < max_rows ? n : max_rows, 0);
  }
  unlock_all(t);
  free(p);
  *out = s;
  return s ? 0 : CM_ENOMEM;
}

/* Makes room for one more entry in *arr (n used of *cap, elements of
 * size sz), doubling it. Returns 0 or CM_ENOMEM. */
static int room(void **arr, size_t n, size_t *cap, size_t sz) {
  if (n < *cap)
    return 0;
  size_t c = *cap ? 2 * *cap : 64;
  void *p = realloc(*arr, c * sz);
  if (!p)
    return CM_ENOMEM;
  *arr = p;
  *cap = c;
  return 0;
}

/* Whether cursor c keeps the ids evicted now: the checkpoints' always,
 * the publications' once one was taken since the table was made or
 * restored. */
static int keeps_evicted(const struct psd_table *t, enum psd__cursor_of c) {
  return c == PSD__CKPT || t->cur[c].snapped;
}

/* Under s's lock: frees record k, its id kept by the cursors that keep
 * evictions for their next delta. */
static int evict(struct psd_table *t, struct stripe *s, size_t k) {
  struct rec *r = psd__rec_at(s, k);
  for (int c = 0; c < PSD__NCURSORS; c++) {
    struct evlist *e = &s->ev[c];
    if (keeps_evicted(t, c) &&
        room((void **)&e->ids, e->n, &e->cap, sizeof *e->ids))
      return CM_ENOMEM;
  }
  psd_rows_remove(&s->rows, r->id, psd_rows_hash(r->id));
  for (int c = 0; c < PSD__NCURSORS; c++)
    if (keeps_evicted(t, c))
      s->ev[c].ids[s->ev[c].n++] = r->id;
  r->live = 0;
  return 0;
}

int psd_table_shrink(struct psd_table *t, uint64_t now_step,
                     uint64_t *evicted) {
  uint64_t n = 0, after = t->conf.evict_after_steps;
  uint32_t min = t->conf.evict_min_count;
  for (int i = 0; i < PSD__NSTRIPES && (after || min); i++) {
    struct stripe *s = &t->st[i];
    pthread_mutex_lock(&s->lock);
    for (size_t k = 0; k < psd_rows_used(&s->rows); k++) {
      struct rec *r = psd__rec_at(s, k);
      if (!r->live)
        continue;
      if ((after && now_step >= r->last_step &&
           now_step - r->last_step >= after) ||
          (min && r->count < min))
        if (!evict(t, s, k))
          n++;
    }
    pthread_mutex_unlock(&s->lock);
  }
  pthread_mutex_lock(&t->stat_lock);
  t->evicted += n;
  pthread_mutex_unlock(&t->stat_lock);
  if (evicted)
    *evicted = n;
  return 0;
}

/* Orders picks by count, highest first, then by id. */
static int cmp_hot(const void *a, const void *b) {
  const struct pick *x = a, *y = b;
  if (x->rec->count != y->rec->count)
    return x->rec->count > y->rec->count ? -1 : 1;
  return x->id < y->id ? -1 : x->id > y->id;
}

int psd_table_top(struct psd_table *t, size_t k, uint64_t *ids,
                  struct psd_row_stats *stats, size_t *n) {
  size_t m = 0;
  lock_all(t);
  struct pick *p = collect(t, 0, 0, 0, 0, NULL, &m);
  if (p) {
    qsort(p, m, sizeof *p, cmp_hot);
    *n = m < k ? m : k;
    for (size_t i = 0; i < *n; i++) {
      ids[i] = p[i].id;
      stats[i] = (struct psd_row_stats){p[i].rec->count, p[i].rec->t,
                                        p[i].rec->last_step};
    }
  }
  unlock_all(t);
  free(p);
  return p ? 0 : CM_ENOMEM;
}

int psd_table_restore(struct psd_table *t, const struct psd_table_snap *s) {
  uint32_t dim = t->conf.dim, ns = t->nstate;
  int rc = 0;
  if (s->dim != dim || s->nstate != ns)
    return CM_EINVAL;
  lock_all(t);
  if (!s->delta) {
    /* A full snapshot replaces every row. */
    for (int i = 0; i < PSD__NSTRIPES; i++) {
      struct stripe *st = &t->st[i];
      psd_rows_clear(&st->rows);
      for (int c = 0; c < PSD__NCURSORS; c++)
        st->ev[c].n = 0;
    }
  }
  for (size_t i = 0; i < s->nevicted; i++) {
    struct stripe *st = &t->st[stripe_of(s->evicted[i])];
    long k = psd__table_find(st, s->evicted[i]);
    if (k >= 0 && (rc = evict(t, st, (size_t)k)))
      goto out;
  }
  for (size_t i = 0; i < s->nrows; i++) {
    struct stripe *st = &t->st[stripe_of(s->ids[i])];
    long k = psd__table_find(st, s->ids[i]);
    if (k < 0 && (k = psd__table_create(t, st, s->ids[i],
                                        psd_rows_hash(s->ids[i]))) < 0) {
      rc = CM_ENOMEM;
      goto out;
    }
    struct rec *r = psd__rec_at(st, (size_t)k);
    float *v = psd__rec_val(r);
    memcpy(v, s->values + i * dim, dim * sizeof(float));
    memcpy(v + dim, s->state + i * ns, ns * sizeof(float));
    r->count = s->stats[i].count;
    r->t = s->stats[i].t;
    r->last_step = s->stats[i].last_step;
  }
  /* Evictions replayed here are not news to the next delta; the next
   * publication is full (its rows were replaced). */
  for (int i = 0; i < PSD__NSTRIPES; i++)
    for (int c = 0; c < PSD__NCURSORS; c++)
      t->st[i].ev[c].n = 0;
  t->cur[PSD__PUB].snapped = 0;
out:
  unlock_all(t);
  return rc;
}
