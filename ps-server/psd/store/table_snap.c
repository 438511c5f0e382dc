/* An embedding table's snapshots (checkpoints' and publications'), pages,
 * restore, eviction and hottest rows (table.h, table_internal.h); a live
 * move's copies are table_move.c's. A checkpoint's or publication's
 * snapshot holds every stripe's lock at once, taken in stripe order, so
 * it is one instant of the whole table, while it copies the rows as they
 * lie in memory; it sorts them by id after letting go. */
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

/* Copies picks[0..n), sorted by id, into a new snapshot (stripes held):
 * a page's. */
static struct psd_table_snap *copy_out(const struct psd_table *t,
                                       const struct pick *picks, size_t n) {
  uint32_t dim = t->conf.dim, ns = t->nstate;
  struct psd_table_snap *s = calloc(1, sizeof *s);
  if (!s)
    return NULL;
  s->dim = dim;
  s->nstate = ns;
  s->nrows = n;
  s->ids = malloc((n + 1) * sizeof *s->ids);
  s->stats = malloc((n + 1) * sizeof *s->stats);
  s->values = malloc((n * dim + 1) * sizeof *s->values);
  s->state = malloc((n * ns + 1) * sizeof *s->state);
  if (!s->ids || !s->stats || !s->values || !s->state) {
    psd_table_snap_free(s);
    return NULL;
  }
  for (size_t i = 0; i < n; i++) {
    struct rec *r = picks[i].rec;
    float *v = psd__rec_val(r);
    s->ids[i] = r->id;
    s->stats[i] = (struct psd_row_stats){r->count, r->t, r->last_step};
    memcpy(s->values + i * dim, v, dim * sizeof(float));
    memcpy(s->state + i * ns, v + dim, ns * sizeof(float));
  }
  return s;
}

/* Live records (has_after: those with ids above after), into a new array
 * (*n of them). Stripes held. */
static struct pick *collect(struct psd_table *t, int has_after, uint64_t after,
                            size_t *n) {
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
      if (!psd__rec_live(x) || (has_after && x->id <= after))
        continue;
      p[k++] = (struct pick){x->id, x};
    }
  }
  *n = k;
  return p;
}

/* ---- Snapshots: rows copied under the locks in record order, sorted
 * by id after the locks are let go ---- */

void psd__sorter_free(struct psd__sorter *w) {
  free(w->ord);
  free(w->ids);
  free(w->st);
  free(w->v);
  free(w->a);
  *w = (struct psd__sorter){0};
}

int psd__sorter_alloc(struct psd__sorter *w, const struct psd_table_snap *s,
                      size_t n) {
  *w = (struct psd__sorter){0};
  w->ord = malloc((n + 1) * sizeof *w->ord);
  w->ids = malloc((n + 1) * sizeof *w->ids);
  w->st = s->stats ? malloc((n + 1) * sizeof *w->st) : NULL;
  w->v = malloc((n * s->dim + 1) * sizeof *w->v);
  w->a = malloc((n * s->nstate + 1) * sizeof *w->a);
  if (!w->ord || !w->ids || (s->stats && !w->st) || !w->v || !w->a) {
    psd__sorter_free(w);
    return CM_ENOMEM;
  }
  return 0;
}

void psd__sort_snap(struct psd__sorter *w, struct psd_table_snap *s,
                    int unique) {
  size_t n = s->nrows, k = 0;
  uint32_t dim = s->dim, ns = s->nstate;
  for (size_t i = 0; i < n; i++)
    w->ord[i] = (struct psd__ord){s->ids[i], i};
  qsort(w->ord, n, sizeof *w->ord, cmp_u64); /* by id, its first member */
  for (size_t i = 0; i < n; i++) {
    size_t j = w->ord[i].at;
    w->ids[i] = s->ids[j];
    if (s->stats)
      w->st[i] = s->stats[j];
    memcpy(w->v + i * dim, s->values + j * dim, dim * sizeof *w->v);
    memcpy(w->a + i * ns, s->state + j * ns, ns * sizeof *w->a);
  }
#define SWAP(x, y)                                                             \
  do {                                                                         \
    void *tmp_ = (x);                                                          \
    (x) = (y);                                                                 \
    (y) = tmp_;                                                                \
  } while (0)
  SWAP(s->ids, w->ids);
  SWAP(s->values, w->v);
  SWAP(s->state, w->a);
  if (s->stats)
    SWAP(s->stats, w->st);
#undef SWAP
  qsort(s->evicted, s->nevicted, sizeof *s->evicted, cmp_u64);
  if (!unique)
    return;
  for (size_t i = 0; i < s->nevicted; i++)
    if (!k || s->evicted[k - 1] != s->evicted[i])
      s->evicted[k++] = s->evicted[i];
  s->nevicted = k;
}

/* A publication's evicted ids (both sorted): those s holds as rows
 * (stored again since) and repeats (evicted, stored, evicted again) left
 * out. A checkpoint's keep them, as its files always have. */
static void drop_held_evicted(struct psd_table_snap *s) {
  size_t k = 0, j = 0;
  for (size_t i = 0; i < s->nevicted; i++) {
    uint64_t id = s->evicted[i];
    while (j < s->nrows && s->ids[j] < id)
      j++;
    if ((j < s->nrows && s->ids[j] == id) || (k && s->evicted[k - 1] == id))
      continue;
    s->evicted[k++] = id;
  }
  s->nevicted = k;
}

/* Sizes s's row arrays for n rows (stats unless values_only), keeping
 * what they hold. Returns 0 or CM_ENOMEM (what was allocated stays s's,
 * freed by psd_table_snap_free). */
static int snap_rows_alloc(struct psd_table_snap *s, size_t n,
                           int values_only) {
  void *p;
#define GROW(field, count)                                                     \
  do {                                                                         \
    if (!(p = realloc(s->field, ((count) + 1) * sizeof *s->field)))            \
      return CM_ENOMEM;                                                        \
    s->field = p;                                                              \
  } while (0)
  GROW(ids, n);
  if (!values_only)
    GROW(stats, n);
  GROW(values, n * s->dim);
  GROW(state, n * s->nstate);
#undef GROW
  return 0;
}

/* Touches every page of s's row arrays for n rows, so that the copy under
 * the locks writes to memory the kernel has handed over already (at
 * 400,000 rows, 60 MiB of first touches). */
static void snap_prefault(struct psd_table_snap *s, size_t n) {
  memset(s->ids, 0, n * sizeof *s->ids);
  if (s->stats)
    memset(s->stats, 0, n * sizeof *s->stats);
  memset(s->values, 0, n * s->dim * sizeof *s->values);
  memset(s->state, 0, n * s->nstate * sizeof *s->state);
}

/* The rows t holds now, or with delta those changed after generation
 * base (each stripe counted under its own lock). */
static size_t count_rows(struct psd_table *t, int delta, uint64_t base) {
  size_t n = 0;
  for (int i = 0; i < PSD__NSTRIPES; i++) {
    struct stripe *st = &t->st[i];
    pthread_mutex_lock(&st->lock);
    if (!delta)
      n += psd_rows_live(&st->rows);
    for (size_t r = 0; delta && r < psd_rows_used(&st->rows); r++) {
      const struct rec *x = psd__rec_at(st, r);
      n += psd__rec_live(x) && x->gen > base;
    }
    pthread_mutex_unlock(&st->lock);
  }
  return n;
}

/* Under st's lock: appends its live records (delta: those changed after
 * generation base) to s, in record order: one pass over the stripe's
 * memory, into arrays of *cap rows, doubled when short. Returns 0 or
 * CM_ENOMEM (the rows before are in). */
static int copy_stripe(const struct stripe *st, struct psd_table_snap *s,
                       size_t *cap, int delta, uint64_t base) {
  uint32_t dim = s->dim, ns = s->nstate;
  for (size_t r = 0; r < psd_rows_used(&st->rows); r++) {
    struct rec *x = psd__rec_at(st, r);
    if (!psd__rec_live(x) || (delta && x->gen <= base))
      continue;
    if (s->nrows == *cap) {
      if (snap_rows_alloc(s, 2 * *cap + 256, !s->stats))
        return CM_ENOMEM;
      *cap = 2 * *cap + 256;
    }
    const float *v = psd__rec_val(x);
    size_t i = s->nrows++;
    s->ids[i] = x->id;
    if (s->stats)
      s->stats[i] = (struct psd_row_stats){x->count, x->t, x->last_step};
    memcpy(s->values + i * dim, v, dim * sizeof(float));
    memcpy(s->state + i * ns, v + dim, ns * sizeof(float));
  }
  return 0;
}

/* A snapshot for cursor c in the making (snap_prepare, then snap_take):
 * its arrays allocated and touched before it holds anything, for the rows
 * a full one would copy now (a delta: those changed since c's last one)
 * and room for more. The calls of one cursor are one at a time (its
 * fields are theirs, read here before the locks). */
static int snap_prepare(struct psd_table *t, enum psd__cursor_of c, int delta,
                        struct psd_table_snap **out) {
  int values_only = c == PSD__PUB;
  struct psd_table_snap *s = calloc(1, sizeof *s);
  *out = NULL;
  if (!s)
    return CM_ENOMEM;
  s->dim = t->conf.dim;
  s->nstate = values_only ? 0 : t->nstate;
  s->pub = values_only;
  s->delta = delta; /* asked; snap_take says what it is */
  delta = delta && t->cur[c].snapped;
  size_t n = count_rows(t, delta, t->cur[c].gen), cap = n + n / 8 + 256;
  if (snap_rows_alloc(s, cap, values_only)) {
    psd_table_snap_free(s);
    return CM_ENOMEM;
  }
  snap_prefault(s, cap);
  s->nrows = cap; /* the room, until snap_take */
  *out = s;
  return 0;
}

/* Takes s (snap_prepare's) for cursor c at one instant: every stripe held
 * at once, but only while the rows are copied in the order they lie in
 * memory (into the room prepared; more only when it is short), and w,
 * when given, gets the sort's scratch there, so that nothing fails after.
 * Every row, or with s->delta (and a snapshot of c taken before) the rows
 * changed since c's last one and the ids evicted since, unsorted; then c
 * moves to now. Returns 0 or CM_ENOMEM (c and the table unchanged). At
 * 400,000 rows of dim 16 with Adagrad's state, a push of 4,096 rows
 * beside it took 9 ms at most (2-3 ms with no snapshot); when the rows'
 * pointers were sorted under the locks, 250-440 ms. */
static int snap_take(struct psd_table *t, enum psd__cursor_of c,
                     struct psd_table_snap *s, struct psd__sorter *w) {
  struct cursor *cur = &t->cur[c];
  int rc = CM_ENOMEM;
  size_t nev = 0, cap = s->nrows;
  s->nrows = 0;
  lock_all(t);
  int delta = s->delta && cur->snapped;
  uint64_t base = cur->gen;
  for (int i = 0; i < PSD__NSTRIPES; i++)
    nev += delta ? t->st[i].ev[c].n : 0;
  if (!(s->evicted = malloc((nev + 1) * sizeof *s->evicted)))
    goto out;
  for (int i = 0; i < PSD__NSTRIPES; i++)
    if ((rc = copy_stripe(&t->st[i], s, &cap, delta, base)))
      goto out;
  if (w && (rc = psd__sorter_alloc(w, s, s->nrows)))
    goto out;
  for (int i = 0; i < PSD__NSTRIPES && delta; i++) {
    const struct evlist *e = &t->st[i].ev[c];
    if (e->n) /* a stripe's list is NULL until it first evicts */
      memcpy(s->evicted + s->nevicted, e->ids, e->n * sizeof *e->ids);
    s->nevicted += e->n;
  }
  s->delta = delta;
  s->base_gen = delta ? base : 0;
  /* Changes from now on belong to c's next snapshot (a move's snapshot
   * may move the generation on too, holding no lock of ours: atomic). */
  s->gen = cur->gen = __atomic_fetch_add(&t->gen, 1, __ATOMIC_RELAXED);
  cur->snapped = 1;
  for (int i = 0; i < PSD__NSTRIPES; i++)
    t->st[i].ev[c].n = 0;
  rc = 0;
out:
  unlock_all(t);
  return rc;
}

/* Sorts a taken snapshot through w: its rows and evicted ids by id; a
 * publication's evicted ids then leave out those it holds as rows. */
static void snap_sort(struct psd__sorter *w, struct psd_table_snap *s) {
  psd__sort_snap(w, s, 0);
  if (s->pub)
    drop_held_evicted(s);
}

/* A snapshot for cursor c, whole (checkpoints' or publications'):
 * prepared, taken with the sort's scratch, sorted. A publication's rows
 * carry values only. */
static int snapshot(struct psd_table *t, enum psd__cursor_of c, int delta,
                    struct psd_table_snap **out) {
  struct psd_table_snap *s;
  struct psd__sorter w = {0};
  int rc = snap_prepare(t, c, delta, &s);
  if (!rc && !(rc = snap_take(t, c, s, &w)))
    snap_sort(&w, s);
  psd__sorter_free(&w);
  if (rc)
    psd_table_snap_free(s);
  *out = rc ? NULL : s;
  return rc;
}

int psd_table_snapshot(struct psd_table *t, int delta,
                       struct psd_table_snap **out) {
  return snapshot(t, PSD__CKPT, delta, out);
}

int psd_table_pub_snapshot(struct psd_table *t, int full,
                           struct psd_table_snap **out) {
  return snapshot(t, PSD__PUB, !full, out);
}

int psd_table_snap_prepare(struct psd_table *t, int pub, int delta,
                           struct psd_table_snap **out) {
  return snap_prepare(t, pub ? PSD__PUB : PSD__CKPT, delta, out);
}

int psd_table_snap_take(struct psd_table *t, struct psd_table_snap *s) {
  return snap_take(t, s->pub ? PSD__PUB : PSD__CKPT, s, NULL);
}

int psd_table_snap_sort(struct psd_table_snap *s) {
  struct psd__sorter w;
  if (psd__sorter_alloc(&w, s, s->nrows))
    return CM_ENOMEM;
  snap_sort(&w, s);
  psd__sorter_free(&w);
  return 0;
}

int psd_table_page(struct psd_table *t, int has_after, uint64_t after,
                   size_t max_rows, struct psd_table_snap **out) {
  size_t n = 0;
  struct psd_table_snap *s = NULL;
  lock_all(t);
  struct pick *p = collect(t, has_after, after, &n);
  if (p) {
    qsort(p, n, sizeof *p, cmp_pick);
    s = copy_out(t, p, n < max_rows ? n : max_rows);
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

/* Whether cursor c keeps the ids stripe s evicts now: the checkpoints'
 * always, the publications' once one was taken since the table was made
 * or restored, a move's once it copied s. */
static int keeps_evicted(const struct psd_table *t, const struct stripe *s,
                         enum psd__cursor_of c) {
  if (c == PSD__MOVE)
    return s->moving;
  return c == PSD__CKPT || t->cur[c].snapped;
}

int psd__evict(struct psd_table *t, struct stripe *s, size_t k) {
  struct rec *r = psd__rec_at(s, k);
  for (int c = 0; c < PSD__NCURSORS; c++) {
    struct evlist *e = &s->ev[c];
    if (keeps_evicted(t, s, c) &&
        room((void **)&e->ids, e->n, &e->cap, sizeof *e->ids))
      return CM_ENOMEM;
  }
  psd__table_remove(s, k);
  for (int c = 0; c < PSD__NCURSORS; c++)
    if (keeps_evicted(t, s, c))
      s->ev[c].ids[s->ev[c].n++] = r->id;
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
      if (!psd__rec_live(r))
        continue;
      if ((after && now_step >= r->last_step &&
           now_step - r->last_step >= after) ||
          (min && r->count < min))
        if (!psd__evict(t, s, k))
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
  struct pick *p = collect(t, 0, 0, &m);
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
      psd__table_clear(st);
      for (int c = 0; c < PSD__NCURSORS; c++)
        st->ev[c].n = 0;
    }
  }
  for (size_t i = 0; i < s->nevicted; i++) {
    struct stripe *st = &t->st[stripe_of(s->evicted[i])];
    long k = psd__table_find(st, s->evicted[i]);
    if (k >= 0 && (rc = psd__evict(t, st, (size_t)k)))
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
