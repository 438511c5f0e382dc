/* An embedding table's snapshots (checkpoints' and publications'), a live
 * move's copies, drop and install, pages, eviction and hottest rows
 * (table.h, table_internal.h). A checkpoint's or publication's snapshot
 * holds every stripe's lock at once, taken in stripe order, so it is one
 * instant of the whole table. A move's walk the bucket index (the rows of
 * their buckets alone) one stripe at a time (psd_table_move_snapshot says
 * why no change is lost). */
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

/* Live records matching (delta: changed since base gen; page: id above
 * after), into a new array (*n of them). Stripes held. */
static struct pick *collect(struct psd_table *t, int delta, uint64_t base,
                            int has_after, uint64_t after, size_t *n) {
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
      if (!psd__rec_live(x) || (delta && x->gen <= base) ||
          (has_after && x->id <= after))
        continue;
      p[k++] = (struct pick){x->id, x};
    }
  }
  *n = k;
  return p;
}

/* The ids evicted since cursor c's last snapshot, sorted, into s
 * (stripes held). The publications' leave out the ids s holds as rows
 * (stored again since) and repeats (evicted, stored, evicted again); a
 * checkpoint's keep them, as its files always have. */
static int take_evicted(struct psd_table *t, enum psd__cursor_of c,
                        struct psd_table_snap *s) {
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
                    struct psd_table_snap **out) {
  struct cursor *cur = &t->cur[c];
  struct psd_table_snap *s = NULL;
  size_t n = 0;
  int rc = CM_ENOMEM;
  lock_all(t);
  delta = delta && cur->snapped;
  uint64_t base = cur->gen;
  struct pick *p = collect(t, delta, base, 0, 0, &n);
  if (!p || !(s = copy_out(t, p, n, c == PSD__PUB)) ||
      (delta && take_evicted(t, c, s)))
    goto out;
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
  return snapshot(t, PSD__CKPT, delta, out);
}

int psd_table_pub_snapshot(struct psd_table *t, int full,
                           struct psd_table_snap **out) {
  return snapshot(t, PSD__PUB, !full, out);
}

/* ---- A live move: the bucket index's walks ---- */

static int evict(struct psd_table *t, struct stripe *s, size_t k);

/* A set of buckets: its bitset (table.h's psd_table_move_snapshot) and its
 * buckets listed, ascending. */
struct bset {
  const uint8_t *bits;           /* borrowed: CM_LAYOUT_BUCKETS bits */
  unsigned n;                    /* buckets in the set */
  uint16_t b[CM_LAYOUT_BUCKETS]; /* b[0..n): the set's buckets, ascending */
};

static void bset_of(struct bset *set, const uint8_t *bits) {
  set->bits = bits;
  set->n = 0;
  for (unsigned b = 0; b < CM_LAYOUT_BUCKETS; b++)
    if (bits[b >> 3] >> (b & 7) & 1)
      set->b[set->n++] = (uint16_t)b;
}

static int in_bset(const struct bset *set, uint64_t id) {
  unsigned b = psd__bucket_of(id);
  return set->bits[b >> 3] >> (b & 7) & 1;
}

/* A walk of the live records of a set's buckets in one stripe (its lock
 * held): each group holding one of the buckets once, each of its records
 * tested. The body may remove the record it is given (evict): the walk
 * has read its successor already.
 *   struct walk w;
 *   for (long k = walk_first(&w, s, set); k >= 0; k = walk_next(&w)) */
struct walk {
  const struct stripe *s; /* borrowed: the stripe walked */
  const struct bset *set; /* borrowed: the buckets */
  unsigned i;             /* set->b[i]: the next bucket whose group is
                             not walked yet */
  uint32_t next;          /* the next record of the group walked, + 1 */
};

static long walk_next(struct walk *w) {
  for (;;) {
    while (w->next) {
      const struct rec *r = psd__rec_at(w->s, w->next - 1);
      long k = (long)w->next - 1;
      w->next = r->next;
      if (in_bset(w->set, r->id))
        return k;
    }
    if (w->i == w->set->n)
      return -1;
    /* The next group: the set's buckets ascend, so do their groups. */
    size_t g = psd__group_of(w->s, w->set->b[w->i]);
    while (w->i < w->set->n && psd__group_of(w->s, w->set->b[w->i]) == g)
      w->i++;
    w->next = w->s->heads[g];
  }
}

static long walk_first(struct walk *w, const struct stripe *s,
                       const struct bset *set) {
  *w = (struct walk){s, set, s->heads ? 0 : set->n, 0};
  return walk_next(w);
}

/* A move snapshot being filled, stripe after stripe: its arrays grown
 * by doubling. */
struct mfill {
  struct psd_table_snap *s; /* owned: nrows and nevicted in use */
  size_t cap, evcap;        /* rows and evicted ids allocated */
};

/* Under s's lock: appends record x to f. Returns 0 or CM_ENOMEM. */
static int fill_row(struct mfill *f, const struct rec *x) {
  struct psd_table_snap *s = f->s;
  uint32_t dim = s->dim, ns = s->nstate;
  if (s->nrows == f->cap) {
    size_t c = f->cap ? 2 * f->cap : 256;
    uint64_t *ids = realloc(s->ids, c * sizeof *ids);
    if (ids)
      s->ids = ids;
    struct psd_row_stats *st = realloc(s->stats, c * sizeof *st);
    if (st)
      s->stats = st;
    float *v = realloc(s->values, c * dim * sizeof *v);
    if (v)
      s->values = v;
    float *a = realloc(s->state, (c * ns + 1) * sizeof *a);
    if (a)
      s->state = a;
    if (!ids || !st || !v || !a)
      return CM_ENOMEM;
    f->cap = c;
  }
  const float *v = psd__rec_val((struct rec *)x);
  size_t i = s->nrows++;
  s->ids[i] = x->id;
  s->stats[i] = (struct psd_row_stats){x->count, x->t, x->last_step};
  memcpy(s->values + i * dim, v, dim * sizeof(float));
  memcpy(s->state + i * ns, v + dim, ns * sizeof(float));
  return 0;
}

/* Under s's lock: appends to f the ids that stripe st evicted since the
 * move last copied it, those of the set that it does not hold again (a
 * row stored again since is in this copy's rows). Returns 0 or
 * CM_ENOMEM. */
static int fill_evicted(struct mfill *f, const struct stripe *st,
                        const struct bset *set) {
  struct psd_table_snap *s = f->s;
  const struct evlist *e = &st->ev[PSD__MOVE];
  for (size_t i = 0; i < e->n; i++) {
    uint64_t id = e->ids[i];
    if (!in_bset(set, id) || psd__table_find(st, id) >= 0)
      continue;
    if (s->nevicted == f->evcap) {
      size_t c = f->evcap ? 2 * f->evcap : 64;
      uint64_t *ids = realloc(s->evicted, c * sizeof *ids);
      if (!ids)
        return CM_ENOMEM;
      s->evicted = ids;
      f->evcap = c;
    }
    s->evicted[s->nevicted++] = id;
  }
  return 0;
}

/* Sorts s's rows by id (a permutation through new arrays), and its
 * evicted ids, repeats dropped. Returns 0 or CM_ENOMEM. */
static int sort_move_snap(struct psd_table_snap *s) {
  size_t n = s->nrows, k = 0;
  uint32_t dim = s->dim, ns = s->nstate;
  struct {
    uint64_t id; /* a row's id */
    size_t at;   /* its place in the unsorted arrays */
  } *ord = malloc((n + 1) * sizeof *ord);
  uint64_t *ids = malloc((n + 1) * sizeof *ids);
  struct psd_row_stats *st = malloc((n + 1) * sizeof *st);
  float *v = malloc((n * dim + 1) * sizeof *v);
  float *a = malloc((n * ns + 1) * sizeof *a);
  int rc = CM_ENOMEM;
  if (!ord || !ids || !st || !v || !a)
    goto out;
  for (size_t i = 0; i < n; i++) {
    ord[i].id = s->ids[i];
    ord[i].at = i;
  }
  qsort(ord, n, sizeof *ord, cmp_u64); /* by id, its first member */
  for (size_t i = 0; i < n; i++) {
    size_t j = ord[i].at;
    ids[i] = s->ids[j];
    st[i] = s->stats[j];
    memcpy(v + i * dim, s->values + j * dim, dim * sizeof *v);
    memcpy(a + i * ns, s->state + j * ns, ns * sizeof *a);
  }
#define SWAP(x, y)                                                             \
  do {                                                                         \
    void *tmp_ = (x);                                                          \
    (x) = (y);                                                                 \
    (y) = tmp_;                                                                \
  } while (0)
  SWAP(s->ids, ids);
  SWAP(s->stats, st);
  SWAP(s->values, v);
  SWAP(s->state, a);
#undef SWAP
  if (!s->evicted && !(s->evicted = malloc(sizeof *s->evicted)))
    goto out; /* none: an empty array, as a checkpoint's */
  qsort(s->evicted, s->nevicted, sizeof *s->evicted, cmp_u64);
  for (size_t i = 0; i < s->nevicted; i++)
    if (!k || s->evicted[k - 1] != s->evicted[i])
      s->evicted[k++] = s->evicted[i];
  s->nevicted = k;
  rc = 0;
out:
  free(ord);
  free(ids);
  free(st);
  free(v);
  free(a);
  return rc;
}

/* A move snapshot holds one stripe at a time, so that the table's writers
 * wait for one stripe's copy, not the whole set's; it is then no one
 * instant of the table, and need not be: the destination upserts each
 * copy, and what it must not miss is a change. None is lost between two
 * of them:
 *   - The snapshot takes its generation G (t->gen moves on to G + 1)
 *     before it locks any stripe, and the next delta takes the rows
 *     changed after G (rec.gen > G).
 *   - A writer stamps a row with t->gen under its stripe's lock. One that
 *     locks stripe i after this snapshot let it go happens after the
 *     fetch_add (the mutex orders them), so it reads G + 1 or more: the
 *     row is in the next delta. One that held stripe i before this
 *     snapshot took it is done with the row when it is copied: the row
 *     is in this copy (a stamp of G or less by then, but in it), and in
 *     the next delta too if stamped G + 1 (a duplicate, harmless).
 *   - Evictions alike: a stripe's list is taken and emptied under its
 *     lock when it is copied; an eviction after that is on its list for
 *     the next delta. A stripe's evictions are kept from its first copy
 *     (stripe.moving) until the move ends.
 * A failure (out of memory) leaves some stripes copied and others not:
 * the next move snapshot is then a full one (delta 0), which the
 * destination installs as the set's whole content. Calls of one table's
 * move (this, psd_table_move_end) are one at a time: the move's cursor is
 * theirs alone. */
int psd_table_move_snapshot(struct psd_table *t, const uint8_t *buckets,
                            int delta, struct psd_table_snap **out) {
  struct cursor *cur = &t->cur[PSD__MOVE];
  struct bset *set = malloc(sizeof *set);
  struct mfill f = {calloc(1, sizeof *f.s), 0, 0};
  int rc = CM_ENOMEM;
  *out = NULL;
  if (!set || !f.s)
    goto out;
  bset_of(set, buckets);
  delta = delta && cur->snapped;
  f.s->dim = t->conf.dim;
  f.s->nstate = t->nstate;
  f.s->delta = delta;
  f.s->base_gen = delta ? cur->gen : 0;
  f.s->gen = __atomic_fetch_add(&t->gen, 1, __ATOMIC_RELAXED);
  cur->snapped = 0; /* until this one is whole */
  rc = 0;
  for (int i = 0; i < PSD__NSTRIPES && !rc; i++) {
    struct stripe *st = &t->st[i];
    struct walk w;
    pthread_mutex_lock(&st->lock);
    for (long k = walk_first(&w, st, set); k >= 0 && !rc; k = walk_next(&w)) {
      const struct rec *x = psd__rec_at(st, (size_t)k);
      if (!delta || x->gen > f.s->base_gen)
        rc = fill_row(&f, x);
    }
    if (!rc && delta)
      rc = fill_evicted(&f, st, set);
    if (!rc) {
      st->ev[PSD__MOVE].n = 0;
      st->moving = 1;
    }
    pthread_mutex_unlock(&st->lock);
  }
  if (rc || (rc = sort_move_snap(f.s)))
    goto out;
  cur->gen = f.s->gen;
  cur->snapped = 1;
  *out = f.s;
  f.s = NULL;
out:
  psd_table_snap_free(f.s);
  free(set);
  return rc;
}

void psd_table_move_end(struct psd_table *t) {
  t->cur[PSD__MOVE].snapped = 0;
  for (int i = 0; i < PSD__NSTRIPES; i++) {
    struct stripe *s = &t->st[i];
    pthread_mutex_lock(&s->lock);
    s->ev[PSD__MOVE].n = 0;
    s->moving = 0;
    pthread_mutex_unlock(&s->lock);
  }
}

/* Under st's lock: evicts the rows of the set in st; *gone counts them.
 * Returns 0 or CM_ENOMEM (those before are evicted). */
static int evict_set(struct psd_table *t, struct stripe *st,
                     const struct bset *set, uint64_t *gone) {
  struct walk w;
  int rc = 0;
  for (long k = walk_first(&w, st, set); k >= 0 && !rc; k = walk_next(&w))
    if (!(rc = evict(t, st, (size_t)k)))
      (*gone)++;
  return rc;
}

/* One stripe at a time, as a move's snapshot: the rows dropped are those
 * of buckets this shard no longer serves, which no writer touches. */
int psd_table_drop_buckets(struct psd_table *t, const uint8_t *buckets,
                           uint64_t *dropped) {
  struct bset *set = malloc(sizeof *set);
  int rc = 0;
  *dropped = 0;
  if (!set)
    return CM_ENOMEM;
  bset_of(set, buckets);
  for (int i = 0; i < PSD__NSTRIPES && !rc; i++) {
    struct stripe *s = &t->st[i];
    pthread_mutex_lock(&s->lock);
    /* As evictions: the next checkpoint's and publication's deltas say
     * the rows are gone from here. */
    rc = evict_set(t, s, set, dropped);
    pthread_mutex_unlock(&s->lock);
  }
  free(set);
  return rc;
}

/* One stripe at a time, as a move's snapshot: the buckets are not this
 * shard's yet (or no writer's during a hand-over's), and a checkpoint
 * between two stripes holds some of the copy's rows, each whole. */
int psd_table_move_install(struct psd_table *t, const struct psd_table_snap *s,
                           const uint8_t *buckets, uint64_t *rows) {
  uint32_t dim = t->conf.dim, ns = t->nstate;
  uint64_t gone = 0;
  size_t first[PSD__NSTRIPES + 1] = {0}, efirst[PSD__NSTRIPES + 1] = {0};
  size_t at[PSD__NSTRIPES], eat[PSD__NSTRIPES];
  size_t *ord = malloc((s->nrows + 1) * sizeof *ord);
  size_t *eord = malloc((s->nevicted + 1) * sizeof *eord);
  struct bset *set = malloc(sizeof *set);
  int rc = 0;
  *rows = 0;
  if (s->dim != dim || s->nstate != ns) {
    rc = CM_EINVAL;
    goto out;
  }
  if (!ord || !eord || !set) {
    rc = CM_ENOMEM;
    goto out;
  }
  bset_of(set, buckets);
  /* The rows and the evicted ids grouped by stripe (a counting sort). */
  for (size_t i = 0; i < s->nrows; i++)
    first[stripe_of(s->ids[i]) + 1]++;
  for (size_t i = 0; i < s->nevicted; i++)
    efirst[stripe_of(s->evicted[i]) + 1]++;
  for (int k = 0; k < PSD__NSTRIPES; k++) {
    first[k + 1] += first[k];
    efirst[k + 1] += efirst[k];
  }
  memcpy(at, first, sizeof at);
  memcpy(eat, efirst, sizeof eat);
  for (size_t i = 0; i < s->nrows; i++)
    ord[at[stripe_of(s->ids[i])]++] = i;
  for (size_t i = 0; i < s->nevicted; i++)
    eord[eat[stripe_of(s->evicted[i])]++] = i;
  for (int k = 0; k < PSD__NSTRIPES && !rc; k++) {
    struct stripe *st = &t->st[k];
    pthread_mutex_lock(&st->lock);
    if (!s->delta)
      rc = evict_set(t, st, set, &gone);
    for (size_t j = efirst[k]; j < efirst[k + 1] && !rc; j++) {
      long x = psd__table_find(st, s->evicted[eord[j]]);
      if (x >= 0 && !(rc = evict(t, st, (size_t)x)))
        gone++;
    }
    for (size_t j = first[k]; j < first[k + 1] && !rc; j++) {
      size_t i = ord[j];
      long x = psd__table_find(st, s->ids[i]);
      if (x < 0 && (x = psd__table_create(t, st, s->ids[i],
                                          psd_rows_hash(s->ids[i]))) < 0) {
        rc = CM_ENOMEM;
        break;
      }
      struct rec *r = psd__rec_at(st, (size_t)x);
      float *v = psd__rec_val(r);
      memcpy(v, s->values + i * dim, dim * sizeof(float));
      if (ns) /* an optimizer without state (sgd): no array */
        memcpy(v + dim, s->state + i * ns, ns * sizeof(float));
      r->count = s->stats[i].count;
      r->t = s->stats[i].t;
      r->last_step = s->stats[i].last_step;
      r->gen = psd__gen_now(t); /* changed now: in every cursor's next delta */
      (*rows)++;
    }
    pthread_mutex_unlock(&st->lock);
  }
  pthread_mutex_lock(&t->stat_lock);
  t->evicted += gone;
  pthread_mutex_unlock(&t->stat_lock);
out:
  free(ord);
  free(eord);
  free(set);
  return rc;
}

int psd_table_page(struct psd_table *t, int has_after, uint64_t after,
                   size_t max_rows, struct psd_table_snap **out) {
  size_t n = 0;
  struct psd_table_snap *s = NULL;
  lock_all(t);
  struct pick *p = collect(t, 0, 0, has_after, after, &n);
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

/* Whether cursor c keeps the ids stripe s evicts now: the checkpoints'
 * always, the publications' once one was taken since the table was made
 * or restored, a move's once it copied s. */
static int keeps_evicted(const struct psd_table *t, const struct stripe *s,
                         enum psd__cursor_of c) {
  if (c == PSD__MOVE)
    return s->moving;
  return c == PSD__CKPT || t->cur[c].snapped;
}

/* Under s's lock: frees record k, its id kept by the cursors that keep
 * evictions for their next delta. */
static int evict(struct psd_table *t, struct stripe *s, size_t k) {
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
  struct pick *p = collect(t, 0, 0, 0, 0, &m);
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
