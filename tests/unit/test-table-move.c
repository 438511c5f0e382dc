/* A live move's copies of a shard's embedding table (table.h, "A live
 * move of some buckets"): the copies of a set of buckets, then of their
 * changes, then the drop, installed on another table; through the bucket
 * index they equal a brute-force filter of every row after random pushes,
 * pulls, admissions, evictions, drops, installs and restores; and deltas
 * taken while another thread pushes and evicts lose no change. */
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt.h"
#include "err.h"
#include "layout.h"
#include "table.h"
#include "table_internal.h"
#include "tables.h"
#include "unit.h"

/* The conf of the tables here: adagrad (rows have state) at dim 4. */
static void adagrad_conf(struct cm_table_conf *c) {
  cm_table_conf_defaults(c);
  strcpy(c->name, "t");
  c->dim = 4;
  c->opt.type = CM_ROWOPT_ADAGRAD;
  c->opt.lr = 0.5;
}

START_TEST(move_copies_buckets_then_changes_then_drops) {
  struct cm_table_conf c;
  struct psd_table *t, *dst;
  adagrad_conf(&c);
  c.evict_min_count = 2; /* a row pushed once goes at the next shrink */
  char err[128];
  ck_assert_int_eq(psd_table_new(&t, &c, 9, err, sizeof err), 0);
  ck_assert_int_eq(psd_table_new(&dst, &c, 9, err, sizeof err), 0);
  uint8_t set[CM_LAYOUT_BUCKETS / 8] = {0};
  for (unsigned b = 0; b < CM_LAYOUT_BUCKETS; b += 3) /* a third of them */
    set[b >> 3] |= (uint8_t)(1u << (b & 7));
#define IN(id)                                                                 \
  (set[cm_layout_bucket(cm_layout_id_hash(id)) >> 3] >>                        \
       (cm_layout_bucket(cm_layout_id_hash(id)) & 7) &                         \
   1)
  enum { N = 3000 };
  float g[4] = {1, 2, 3, 4};
  size_t mine = 0;
  for (uint64_t id = 0; id < N; id++) {
    psd_table_push(t, &id, 1, g, 1, 1);
    psd_table_push(t, &id, 1, g, 1, 1); /* twice: kept by shrink */
    mine += IN(id);
  }
  struct psd_table_snap *s0 = NULL, *s1 = NULL, *ck = NULL, *ck2 = NULL;
  ck_assert_int_eq(psd_table_snapshot(t, 0, &ck), 0); /* a checkpoint */
  ck_assert_int_eq(psd_table_move_snapshot(t, set, 1, &s0), 0);
  ck_assert(!s0->delta); /* the first: every row of the set */
  ck_assert_uint_eq(s0->nrows, mine);
  ck_assert_uint_gt(mine, N / 4);
  for (size_t k = 0; k < s0->nrows; k++)
    ck_assert(IN(s0->ids[k]));
  /* Meanwhile: pushes in and out of the set, new rows, an eviction. */
  uint64_t pushed_in = 0, pushed_out = 0, gone = 0, fresh = N + 1;
  while (!IN(pushed_in))
    pushed_in++;
  while (IN(pushed_out))
    pushed_out++;
  while (!IN(fresh))
    fresh++;
  psd_table_push(t, &pushed_in, 1, g, 1, 2);
  psd_table_push(t, &pushed_out, 1, g, 1, 2);
  psd_table_push(t, &fresh, 1, g, 1, 2); /* once: evicted by the shrink */
  uint64_t ev = 0;
  psd_table_shrink(t, 3, &ev);
  ck_assert_uint_eq(ev, 1);
  gone = fresh;
  psd_table_push(t, &pushed_in, 1, g, 1, 3);
  ck_assert_int_eq(psd_table_move_snapshot(t, set, 1, &s1), 0);
  ck_assert(s1->delta);
  ck_assert_uint_eq(s1->nrows, 1);
  ck_assert_uint_eq(s1->ids[0], pushed_in);
  ck_assert_uint_eq(s1->nevicted, 1);
  ck_assert_uint_eq(s1->evicted[0], gone);
  /* The destination from both equals the source in the set. */
  ck_assert_int_eq(psd_table_restore(dst, s0), 0);
  ck_assert_int_eq(psd_table_restore(dst, s1), 0);
  for (uint64_t id = 0; id < N + 100; id++) {
    float a[8], b[8];
    struct psd_row_stats x, y;
    int ra = psd_table_get(t, id, a, a + 4, &x);
    int rb = psd_table_get(dst, id, b, b + 4, &y);
    if (!IN(id)) {
      ck_assert_int_eq(rb, CM_ENOENT);
      continue;
    }
    ck_assert_int_eq(ra, rb);
    if (ra == 0) {
      ck_assert_mem_eq(a, b, sizeof a);
      ck_assert_uint_eq(x.count, y.count);
    }
  }
  /* Handed over: the source drops the set's rows, keeps the others. */
  psd_table_move_end(t);
  uint64_t dropped = 0;
  ck_assert_int_eq(psd_table_drop_buckets(t, set, &dropped), 0);
  ck_assert_uint_eq(dropped, mine);
  ck_assert_int_eq(psd_table_get(t, pushed_in, NULL, NULL, NULL), CM_ENOENT);
  ck_assert_int_eq(psd_table_get(t, pushed_out, NULL, NULL, NULL), 0);
  struct psd_table_stats st;
  psd_table_stats(t, &st);
  ck_assert_uint_eq(st.rows, N - mine);
  /* The checkpoints' next delta removes them. */
  ck_assert_int_eq(psd_table_snapshot(t, 1, &ck2), 0);
  ck_assert_uint_eq(ck2->nevicted, mine + 1); /* and the shrink's */
#undef IN
  psd_table_snap_free(s0);
  psd_table_snap_free(s1);
  psd_table_snap_free(ck);
  psd_table_snap_free(ck2);
  psd_table_free(dst);
  psd_table_free(t);
}
END_TEST

/* ---- the bucket index: a move's copies and drops against brute force ---- */

static uint64_t rnd(uint64_t *x) { /* xorshift64 */
  *x ^= *x << 13;
  *x ^= *x >> 7;
  *x ^= *x << 17;
  return *x;
}

static int in_set(const uint8_t *set, uint64_t id) {
  unsigned b = cm_layout_bucket(cm_layout_id_hash(id));
  return set[b >> 3] >> (b & 7) & 1;
}

/* A random set of buckets: none, a few, about one in `every`, or (with
 * all) every bucket. */
static void random_set(uint64_t *x, uint8_t *set, int all) {
  memset(set, 0, CM_LAYOUT_BUCKETS / 8);
  unsigned kind = (unsigned)(rnd(x) % (all ? 6 : 5));
  if (!all && kind == 1)
    kind = 5;
  if (kind == 0)
    return;
  if (kind == 1) {
    memset(set, 0xff, CM_LAYOUT_BUCKETS / 8);
    return;
  }
  unsigned every = kind == 2 ? 500 : kind == 3 ? 64 : kind == 4 ? 8 : 2;
  for (unsigned b = 0; b < CM_LAYOUT_BUCKETS; b++)
    if (rnd(x) % every == 0)
      set[b >> 3] |= (uint8_t)(1u << (b & 7));
}

/* The rows of t in the set, by brute force: a page of every row (a scan of
 * every record, no bucket index) filtered. */
static struct psd_table_snap *rows_in(struct psd_table *t, const uint8_t *set) {
  struct psd_table_snap *p;
  size_t k = 0;
  ck_assert_int_eq(psd_table_page(t, 0, 0, (size_t)1 << 30, &p), 0);
  for (size_t i = 0; i < p->nrows; i++) {
    if (!in_set(set, p->ids[i]))
      continue;
    p->ids[k] = p->ids[i];
    p->stats[k] = p->stats[i];
    memmove(p->values + k * p->dim, p->values + i * p->dim,
            p->dim * sizeof(float));
    memmove(p->state + k * p->nstate, p->state + i * p->nstate,
            p->nstate * sizeof(float));
    k++;
  }
  p->nrows = k;
  return p;
}

/* a and b hold the same rows: ids, values, state, stats. */
static void same_rows(const struct psd_table_snap *a,
                      const struct psd_table_snap *b, const char *what) {
  ck_assert_msg(a->nrows == b->nrows, "%s: %zu rows, brute force %zu", what,
                a->nrows, b->nrows);
  for (size_t i = 0; i < a->nrows; i++)
    ck_assert_msg(a->ids[i] == b->ids[i], "%s: row %zu is id %llu, not %llu",
                  what, i, (unsigned long long)a->ids[i],
                  (unsigned long long)b->ids[i]);
  ck_assert(!memcmp(a->values, b->values, a->nrows * a->dim * sizeof(float)));
  ck_assert(!memcmp(a->state, b->state, a->nrows * a->nstate * sizeof(float)));
  ck_assert(!memcmp(a->stats, b->stats, a->nrows * sizeof *a->stats));
}

/* A move's full copy of set from t equals brute force. */
static void check_full_copy(struct psd_table *t, const uint8_t *set) {
  struct psd_table_snap *m, *want = rows_in(t, set);
  ck_assert_int_eq(psd_table_move_snapshot(t, set, 1, &m), 0);
  ck_assert(!m->delta);
  same_rows(m, want, "move copy");
  ck_assert_uint_eq(m->nevicted, 0);
  psd_table_snap_free(m);
  psd_table_snap_free(want);
}

enum {
  IDS = 8000,  /* random ops' ids: 0..IDS - 1, about 2 rows a bucket */
  BULK = 40000 /* rows of ids from 1,000,000 on pushed each round */
};

/* One random change of t at step: a push, a pull, a shrink (admission
 * and eviction settings of admit_evict_conf), a drop of a random set, an
 * install of another table's copy of a random set, or (with restore) a
 * restore of t from its own full checkpoint. */
static void random_op(uint64_t *x, struct psd_table *t, struct psd_table *other,
                      uint64_t step, int restore) {
  uint64_t ids[64];
  float g[64 * 4], out[64 * 4];
  size_t n = 1 + (size_t)(rnd(x) % 64);
  for (size_t i = 0; i < n; i++) /* half of them among 2,000 hot ids */
    ids[i] = rnd(x) % (i & 1 ? IDS : 2000);
  for (size_t i = 0; i < n * 4; i++)
    g[i] = (float)(rnd(x) % 17) * 0.0625f - 0.5f;
  unsigned op = (unsigned)(rnd(x) % 100);
  if (op < 70) {
    ck_assert_int_eq(psd_table_push(t, ids, n, g, 1, step), 0);
  } else if (op < 85) {
    ck_assert_int_eq(psd_table_pull(t, ids, n, out), 0);
  } else if (op < 93) {
    ck_assert_int_eq(psd_table_shrink(t, step, NULL), 0);
  } else if (op < 96) {
    uint8_t set[CM_LAYOUT_BUCKETS / 8];
    uint64_t d;
    struct psd_table_snap *want;
    random_set(x, set, 0);
    want = rows_in(t, set);
    ck_assert_int_eq(psd_table_drop_buckets(t, set, &d), 0);
    ck_assert_uint_eq(d, want->nrows);
    psd_table_snap_free(want);
    want = rows_in(t, set);
    ck_assert_uint_eq(want->nrows, 0);
    psd_table_snap_free(want);
  } else if (op < 99 || !restore) {
    /* other's copy of a set (its own move, ended) installed here */
    uint8_t set[CM_LAYOUT_BUCKETS / 8];
    struct psd_table_snap *s, *want, *got;
    uint64_t rows;
    random_set(x, set, 0);
    for (size_t i = 0; i < n; i++)
      ids[i] = IDS + rnd(x) % IDS; /* some rows of other's own */
    ck_assert_int_eq(psd_table_push(other, ids, n, g, 1, step), 0);
    psd_table_move_end(other);
    ck_assert_int_eq(psd_table_move_snapshot(other, set, 0, &s), 0);
    ck_assert_int_eq(psd_table_move_install(t, s, set, &rows), 0);
    ck_assert_uint_eq(rows, s->nrows);
    want = rows_in(other, set);
    got = rows_in(t, set);
    same_rows(got, want, "installed");
    psd_table_snap_free(s);
    psd_table_snap_free(want);
    psd_table_snap_free(got);
  } else {
    struct psd_table_snap *ck;
    ck_assert_int_eq(psd_table_snapshot(t, 0, &ck), 0);
    ck_assert_int_eq(psd_table_restore(t, ck), 0);
    psd_table_snap_free(ck);
  }
}

/* Admission by count, eviction by age (untouched for `after` steps) and
 * count (pushed fewer than `min` times), as the tests above; adagrad at
 * dim 4. */
static struct psd_table *admit_evict_table(uint64_t after, uint32_t min) {
  struct cm_table_conf c;
  struct psd_table *t;
  char err[128];
  adagrad_conf(&c);
  c.admit = CM_ADMIT_COUNT;
  c.admit_count = 2;
  c.evict_after_steps = after;
  c.evict_min_count = min;
  ck_assert_int_eq(psd_table_new(&t, &c, 9, err, sizeof err), 0);
  return t;
}

START_TEST(move_index_equals_brute_force) {
  struct psd_table *t = admit_evict_table(100, 2);
  struct psd_table *other = admit_evict_table(100, 2);
  struct psd_table *dst = admit_evict_table(100, 2);
  uint64_t x = 0x9e3779b97f4a7c15ull, step = 1;
  uint8_t set[CM_LAYOUT_BUCKETS / 8];
  /* other holds rows of ids t never pushes itself, and some of t's */
  for (uint64_t id = 0; id < 2 * IDS; id += 3) {
    float g[4] = {1, 1, 1, 1};
    psd_table_push(other, &id, 1, g, 1, 1);
    psd_table_push(other, &id, 1, g, 1, 1);
  }
  uint64_t *bulk = malloc(BULK * sizeof *bulk);
  float *bulk_g = calloc(BULK * 4, sizeof *bulk_g);
  for (int round = 0; round < 12; round++) {
    /* BULK rows more, pushed afresh each round (admitted at the first
     * round's second push), so that the stripes' indexes grow (from 16
     * heads to 256); some of them move, are dropped or age out */
    for (int k = 0; k < 2; k++) {
      for (uint64_t i = 0; i < BULK; i++)
        bulk[i] = 1000000 + i * (round % 3 ? 1 : 2);
      ck_assert_int_eq(psd_table_push(t, bulk, BULK, bulk_g, 1, step / 4), 0);
    }
    /* anything, a restore included; then the index's copies equal brute
     * force for random sets */
    for (int half = 0; half < 2; half++) {
      for (int k = 0; k < 150; k++, step++)
        random_op(&x, t, other, step / 4, 1);
      for (int k = 0; k < 3; k++) {
        random_set(&x, set, 1);
        psd_table_move_end(t);
        check_full_copy(t, set);
      }
    }
    /* a move: its full copy, changes, its delta; the destination then
     * holds the set's rows as t does */
    psd_table_move_end(t);
    random_set(&x, set, 1);
    struct psd_table_snap *s, *want, *got;
    uint64_t rows;
    ck_assert_int_eq(psd_table_move_snapshot(t, set, 1, &s), 0);
    ck_assert_int_eq(psd_table_move_install(dst, s, set, &rows), 0);
    psd_table_snap_free(s);
    for (int d = 0; d < 2; d++) {
      for (int k = 0; k < 100; k++, step++)
        random_op(&x, t, other, step / 4, 0);
      ck_assert_int_eq(psd_table_move_snapshot(t, set, 1, &s), 0);
      ck_assert(s->delta);
      for (size_t i = 0; i < s->nrows; i++)
        ck_assert(in_set(set, s->ids[i]));
      for (size_t i = 0; i < s->nevicted; i++)
        ck_assert(in_set(set, s->evicted[i]));
      ck_assert_int_eq(psd_table_move_install(dst, s, set, &rows), 0);
      psd_table_snap_free(s);
      want = rows_in(t, set);
      got = rows_in(dst, set);
      same_rows(got, want, "destination after a delta");
      psd_table_snap_free(want);
      psd_table_snap_free(got);
    }
  }
  psd_table_move_end(t);
  free(bulk);
  free(bulk_g);
  psd_table_free(t);
  psd_table_free(other);
  psd_table_free(dst);
}
END_TEST

/* Pushes and evictions while a move copies: thread state. */
struct mover_writer {
  struct psd_table *t; /* shared */
  volatile int stop;   /* set by the test */
  uint64_t pushes;     /* pushes made (atomic: the test waits on it) */
};

static void *push_and_shrink(void *arg) {
  struct mover_writer *w = arg;
  uint64_t x = 0x2545f4914f6cdd1dull, ids[32];
  float g[32 * 4];
  for (int i = 0; i < 32 * 4; i++)
    g[i] = 0.25f;
  for (uint64_t step = 1; !w->stop; step++) {
    for (int i = 0; i < 32; i++)
      ids[i] = rnd(&x) % 5000;
    psd_table_push(w->t, ids, 32, g, 1, step / 8);
    if (step % 50 == 0)
      psd_table_shrink(w->t, step / 8, NULL);
    __atomic_add_fetch(&w->pushes, 1, __ATOMIC_RELAXED);
  }
  return NULL;
}

START_TEST(move_deltas_lose_no_concurrent_change) {
  struct psd_table *t = admit_evict_table(100, 0);
  struct psd_table *dst = admit_evict_table(100, 0);
  uint8_t set[CM_LAYOUT_BUCKETS / 8] = {0};
  for (unsigned b = 0; b < CM_LAYOUT_BUCKETS; b += 2) /* half */
    set[b >> 3] |= (uint8_t)(1u << (b & 7));
  struct mover_writer w = {t, 0, 0};
  struct psd_table_snap *s, *want, *got;
  uint64_t rows, deltas = 0;
  pthread_t th;
  pthread_create(&th, NULL, push_and_shrink, &w);
  ck_assert_int_eq(psd_table_move_snapshot(t, set, 1, &s), 0);
  ck_assert_int_eq(psd_table_move_install(dst, s, set, &rows), 0);
  psd_table_snap_free(s);
  /* deltas while the writer pushes and evicts, the last after it stops; at
   * least 400 deltas and 2,000 pushes (a loaded machine runs the writer
   * slowly: a count of deltas alone once left it 910 rows) */
  for (int k = 0;
       k < 400 || __atomic_load_n(&w.pushes, __ATOMIC_RELAXED) < 2000;
       k++, deltas++) {
    ck_assert_int_eq(psd_table_move_snapshot(t, set, 1, &s), 0);
    ck_assert(s->delta);
    ck_assert_int_eq(psd_table_move_install(dst, s, set, &rows), 0);
    psd_table_snap_free(s);
  }
  w.stop = 1;
  pthread_join(th, NULL);
  ck_assert_int_eq(psd_table_move_snapshot(t, set, 1, &s), 0);
  ck_assert_int_eq(psd_table_move_install(dst, s, set, &rows), 0);
  psd_table_snap_free(s);
  want = rows_in(t, set);
  got = rows_in(dst, set);
  printf("move deltas: %llu deltas over %llu concurrent pushes, %zu rows\n",
         (unsigned long long)deltas, (unsigned long long)w.pushes, want->nrows);
  ck_assert_uint_gt(want->nrows, 1000);
  same_rows(got, want, "destination after concurrent deltas");
  psd_table_snap_free(want);
  psd_table_snap_free(got);
  psd_table_free(t);
  psd_table_free(dst);
}
END_TEST

/* ---- a delta's rows: the stripes' lists of changes, or a walk ---- */

/* A delta visits the rows a stripe listed as changed since its last copy;
 * a stripe that changed more than its list keeps (PSD__CHANGED_MAX,
 * repeats included) walks the set's rows instead: a row changed after the
 * list filled is in the delta all the same. */
START_TEST(move_delta_walks_a_stripe_whose_list_overflowed) {
  struct cm_table_conf c;
  struct psd_table *t;
  char err[128];
  adagrad_conf(&c);
  ck_assert_int_eq(psd_table_new(&t, &c, 9, err, sizeof err), 0);
  uint8_t set[CM_LAYOUT_BUCKETS / 8];
  memset(set, 0xff, sizeof set); /* every bucket */
  uint64_t a = 1, b = 2;
  while (stripe_of(b) != stripe_of(a))
    b++;
  float g[4] = {1, 2, 3, 4};
  psd_table_push(t, &a, 1, g, 1, 1);
  psd_table_push(t, &b, 1, g, 1, 1);
  struct psd_table_snap *s0, *s1;
  ck_assert_int_eq(psd_table_move_snapshot(t, set, 1, &s0), 0);
  ck_assert_uint_eq(s0->nrows, 2);
  for (int k = 0; k <= PSD__CHANGED_MAX; k++) /* fills a's stripe's list */
    psd_table_push(t, &a, 1, g, 1, 2);
  ck_assert(t->st[stripe_of(a)].changed_over);
  psd_table_push(t, &b, 1, g, 1, 3); /* not listed: the delta walks */
  ck_assert_int_eq(psd_table_move_snapshot(t, set, 1, &s1), 0);
  ck_assert(s1->delta);
  ck_assert_uint_eq(s1->nrows, 2);
  ck_assert(!t->st[stripe_of(a)].changed_over); /* listed again from here */
  psd_table_snap_free(s0);
  psd_table_snap_free(s1);
  psd_table_move_end(t);
  psd_table_free(t);
}
END_TEST

/* ---- a move file in two parts (ckpt.h) ---- */

/* Whether dir holds an entry whose name starts with prefix. */
static int has_entry(const char *dir, const char *prefix) {
  return tu_count_entries(dir, prefix) > 0;
}

/* The destination writes the copies' rows before the hand-over and the
 * hand-over's delta (a row changed, one evicted) after it; a start applies
 * both and holds what the source held. Without the hand-over's part the
 * changed row would be old and the evicted one back. A file abandoned
 * leaves nothing. */
START_TEST(move_file_in_two_parts_holds_the_handover) {
  struct cm_table_conf c;
  struct psd_table *src;
  struct psd_tables *dst, *again;
  struct psd_ckpt *ck, *ck2;
  char err[1200], root[] = "/tmp/psd-movefile-XXXXXX", dir[700];
  adagrad_conf(&c);
  c.evict_min_count = 2;
  ck_assert_ptr_nonnull(mkdtemp(root));
  ck_assert_int_eq(psd_table_new(&src, &c, 9, err, sizeof err), 0);
  ck_assert_int_eq(psd_tables_new(&dst, &c, 1, NULL, 0, err, sizeof err), 0);
  ck_assert_int_eq(psd_tables_new(&again, &c, 1, NULL, 0, err, sizeof err), 0);
  static const struct cm_optim_set no_optims;
  struct psd_ckpt_opts o = {.root = root,
                            .job = "j",
                            .shard = 2,
                            .nshards = 3,
                            .mode = "async",
                            .keep = 1,
                            .optims = &no_optims,
                            .layout = 0};
  ck_assert_int_eq(psd_ckpt_new(&ck, &o, err, sizeof err), 0);
  ck_assert_int_eq(psd_ckpt_new(&ck2, &o, err, sizeof err), 0);
  psd_ckpt_set_tables(ck, dst);
  psd_ckpt_set_tables(ck2, again);
  snprintf(dir, sizeof dir, "%s", psd_ckpt_dir(ck));
  uint8_t set[CM_LAYOUT_BUCKETS / 8] = {0};
  for (unsigned b = 0; b < CM_LAYOUT_BUCKETS; b += 3)
    set[b >> 3] |= (uint8_t)(1u << (b & 7));
  float g[4] = {1, 2, 3, 4};
  uint64_t changed = UINT64_MAX, gone = UINT64_MAX;
  for (uint64_t id = 0; id < 2000; id++) {
    psd_table_push(src, &id, 1, g, 1, 1);
    if (!in_set(set, id))
      continue;
    if (gone == UINT64_MAX)
      gone = id; /* pushed once: the shrink evicts it */
    else {
      psd_table_push(src, &id, 1, g, 1, 1);
      if (changed == UINT64_MAX)
        changed = id;
    }
  }
  for (uint64_t id = 0; id < 2000; id++) /* the rest kept by the shrink */
    if (!in_set(set, id))
      psd_table_push(src, &id, 1, g, 1, 1);
  struct psd_table *d = psd_tables_at(dst, 0);
  struct psd_table_snap *s0, *s1;
  uint64_t n = 0;
  ck_assert_int_eq(psd_table_move_snapshot(src, set, 1, &s0), 0);
  ck_assert_int_eq(psd_table_move_install(d, s0, set, &n), 0);
  /* A writer abandoned: nothing in place, no temporary directory. */
  struct psd_ckpt_move_file *f = NULL;
  ck_assert_int_eq(psd_ckpt_move_begin(ck, set, 4, &f, err, sizeof err), 0);
  ck_assert(has_entry(dir, ".tmp-"));
  psd_ckpt_move_abandon(f);
  ck_assert(!has_entry(dir, ".tmp-"));
  ck_assert(!has_entry(dir, "move-L"));
  /* The copies' part, then the hand-over's changes. */
  ck_assert_int_eq(psd_ckpt_move_begin(ck, set, 5, &f, err, sizeof err), 0);
  ck_assert(!has_entry(dir, "move-L")); /* not in place before the end */
  psd_table_push(src, &changed, 1, g, 1, 2);
  uint64_t ev = 0;
  psd_table_shrink(src, 3, &ev);
  ck_assert_uint_eq(ev, 1);
  ck_assert_int_eq(psd_table_move_snapshot(src, set, 1, &s1), 0);
  ck_assert(s1->delta);
  ck_assert_uint_eq(s1->nrows, 1);
  ck_assert_uint_eq(s1->nevicted, 1);
  ck_assert_int_eq(psd_table_move_install(d, s1, set, &n), 0);
  ck_assert_int_eq(psd_ckpt_move_add(f, &c, s1, err, sizeof err), 0);
  ck_assert_int_eq(psd_ckpt_move_finish(f, 1, 0x42, 3, err, sizeof err), 0);
  ck_assert(has_entry(dir, "move-L0-0000000005"));
  ck_assert(!has_entry(dir, ".tmp-"));
  /* A start applies both parts: the source's rows of the set exactly. */
  int files = 0;
  uint64_t rows = 0;
  ck_assert_int_eq(
      psd_ckpt_move_apply(ck2, 3, 0, 5, &files, &rows, err, sizeof err), 0);
  ck_assert_int_eq(files, 1);
  struct psd_table_snap *want = rows_in(src, set),
                        *got = rows_in(psd_tables_at(again, 0), set);
  same_rows(got, want, "move file applied");
  ck_assert_int_eq(
      psd_table_get(psd_tables_at(again, 0), gone, NULL, NULL, NULL),
      CM_ENOENT);
  psd_table_snap_free(want);
  psd_table_snap_free(got);
  psd_table_snap_free(s0);
  psd_table_snap_free(s1);
  psd_ckpt_free(ck);
  psd_ckpt_free(ck2);
  psd_tables_free(dst);
  psd_tables_free(again);
  psd_table_free(src);
  char cmd[200];
  snprintf(cmd, sizeof cmd, "rm -rf %s", root);
  ck_assert_int_eq(system(cmd), 0);
}
END_TEST

static Suite *table_move_suite(void) {
  Suite *s = suite_create("table-move");
  TCase *tc = tcase_create("table-move");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, move_copies_buckets_then_changes_then_drops);
  tcase_add_test(tc, move_index_equals_brute_force);
  tcase_add_test(tc, move_deltas_lose_no_concurrent_change);
  tcase_add_test(tc, move_file_in_two_parts_holds_the_handover);
  tcase_add_test(tc, move_delta_walks_a_stripe_whose_list_overflowed);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(table_move_suite(), 0); }
