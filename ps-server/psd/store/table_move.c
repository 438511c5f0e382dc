/* A live move's copies, drop and install of a set of buckets (table.h,
 * table_internal.h): they walk the bucket index (the rows of those
 * buckets alone), one stripe at a time (psd_table_move_snapshot says why
 * no change is lost). */
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "layout.h"
#include "table_internal.h"

int psd__evict(struct psd_table *t, struct stripe *s, size_t k);

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

void psd__note_moved_change(struct psd_table *t, struct stripe *s,
                            uint64_t id) {
  unsigned b = psd__bucket_of(id);
  struct evlist *e = &s->changed;
  if (!(t->move_bits[b >> 3] >> (b & 7) & 1))
    return;
  if (e->n == e->cap) {
    size_t c = e->cap ? 2 * e->cap : 64;
    uint64_t *ids =
        c <= PSD__CHANGED_MAX ? realloc(e->ids, c * sizeof *ids) : NULL;
    if (!ids) { /* too many, or no memory: the next delta walks */
      s->changed_over = 1;
      return;
    }
    e->ids = ids;
    e->cap = c;
  }
  e->ids[e->n++] = id;
}

static int by_id(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

/* Under st's lock: appends to f the rows of stripe st's list of changed
 * ids (each once) that it still holds and that changed after base (those
 * of the set: the list holds no other). Returns 0 or CM_ENOMEM. */
static int fill_changed(struct mfill *f, struct stripe *st, uint64_t base) {
  struct evlist *e = &st->changed;
  int rc = 0;
  if (e->n > 1) /* none listed: no array (qsort takes none) */
    qsort(e->ids, e->n, sizeof *e->ids, by_id);
  for (size_t i = 0; i < e->n && !rc; i++) {
    if (i && e->ids[i] == e->ids[i - 1])
      continue;
    long k = psd__table_find(st, e->ids[i]);
    if (k >= 0 && psd__rec_at(st, (size_t)k)->gen > base)
      rc = fill_row(f, psd__rec_at(st, (size_t)k));
  }
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
  struct psd__sorter w = {0};
  int rc = CM_ENOMEM;
  *out = NULL;
  if (!set || !f.s)
    goto out;
  bset_of(set, buckets);
  delta = delta && cur->snapped;
  /* The buckets whose changes the stripes list (the same for every
   * snapshot of a move: written when they differ, before any stripe of
   * this set is moving). */
  if (memcmp(t->move_bits, buckets, sizeof t->move_bits))
    memcpy(t->move_bits, buckets, sizeof t->move_bits);
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
    if (delta && st->moving && !st->changed_over) {
      /* The rows changed since this stripe's last copy alone. */
      rc = fill_changed(&f, st, f.s->base_gen);
    } else {
      for (long k = walk_first(&w, st, set); k >= 0 && !rc; k = walk_next(&w)) {
        const struct rec *x = psd__rec_at(st, (size_t)k);
        if (!delta || x->gen > f.s->base_gen)
          rc = fill_row(&f, x);
      }
    }
    if (!rc && delta)
      rc = fill_evicted(&f, st, set);
    if (!rc) {
      st->ev[PSD__MOVE].n = 0;
      st->changed.n = 0;
      st->changed_over = 0;
      st->moving = 1;
    }
    pthread_mutex_unlock(&st->lock);
  }
  if (rc)
    goto out;
  /* No row or no eviction: empty arrays, as a checkpoint's (the sort
   * swaps in its own for every array s has). */
  if ((!f.s->ids && !(f.s->ids = malloc(sizeof *f.s->ids))) ||
      (!f.s->stats && !(f.s->stats = malloc(sizeof *f.s->stats))) ||
      (!f.s->values && !(f.s->values = malloc(sizeof *f.s->values))) ||
      (!f.s->state && !(f.s->state = malloc(sizeof *f.s->state))) ||
      (!f.s->evicted && !(f.s->evicted = malloc(sizeof *f.s->evicted)))) {
    rc = CM_ENOMEM;
    goto out;
  }
  if ((rc = psd__sorter_alloc(&w, f.s, f.s->nrows)))
    goto out;
  psd__sort_snap(&w, f.s, 1);
  cur->gen = f.s->gen;
  cur->snapped = 1;
  *out = f.s;
  f.s = NULL;
out:
  psd__sorter_free(&w);
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
    s->changed.n = 0;
    s->changed_over = 0;
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
    if (!(rc = psd__evict(t, st, (size_t)k)))
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
      if (x >= 0 && !(rc = psd__evict(t, st, (size_t)x)))
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
