/* A shard's embedding table (table.h): lookup and lazy creation, the shard
 * function's spread, initial rows independent of order, duplicates summed,
 * pushes counted as pushes (an id named twice in one push counts once, for
 * its count and its admission; a sync step's runs one each; an empty push
 * nothing), FTRL's new rows consistent with their initial value,
 * concurrent pushes while stripes grow (every row's count and value exact),
 * admission by count and probability, a pull mixing stored and
 * not-admitted ids over every stripe, eviction by age and count, top, the
 * memory bound, snapshot consistency under a concurrent writer (value and
 * state of every row replay from its initial row bit for bit), full and
 * delta snapshots restoring to the same table (evicted and re-created rows
 * included), and the snapshot file (round trip; a flipped byte refused).
 * A live move's copies: test-table-move.c. */
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "err.h"
#include "init.h"
#include "layout.h"
#include "optstep.h"
#include "table.h"
#include "unit.h"

static struct psd_table *make(enum cm_rowopt_type type, uint32_t dim,
                              struct cm_table_conf *c) {
  struct psd_table *t;
  char err[256];
  cm_table_conf_defaults(c);
  strcpy(c->name, "t");
  c->dim = dim;
  c->opt.type = type;
  c->opt.lr = 0.5;
  ck_assert_int_eq(psd_table_new(&t, c, 9, err, sizeof err), 0);
  return t;
}

START_TEST(lookup_create_and_spread) {
  struct cm_table_conf c;
  struct psd_table *t = make(CM_ROWOPT_SGD, 4, &c);
  float a[8], b[8], want[4];
  uint64_t ids[2] = {5, 1ull << 62};
  struct psd_row_stats st;
  ck_assert_int_eq(psd_table_get(t, 5, a, NULL, NULL), CM_ENOENT);
  ck_assert_int_eq(psd_table_pull(t, ids, 2, a), 0);
  ck_assert_int_eq(psd_table_get(t, 5, b, NULL, &st), 0);
  ck_assert(!memcmp(a, b, 4 * sizeof(float)));
  ck_assert_uint_eq(st.count, 0);
  cm_table_init_row(&c, 9, 1ull << 62, want);
  ck_assert(!memcmp(a + 4, want, sizeof want)); /* the seeded initial row */
  /* consecutive ids spread evenly over 4 shards (a fresh job's map) */
  int n[4] = {0};
  static struct cm_layout_map m4;
  cm_layout_map_init(&m4, CM_LAYOUT_RULE_BUCKETS, 4);
  for (uint64_t i = 0; i < 40000; i++)
    n[cm_layout_map_id_shard(&m4, i)]++;
  for (int s = 0; s < 4; s++)
    ck_assert(n[s] > 9600 && n[s] < 10400);
  psd_table_free(t);
}
END_TEST

START_TEST(duplicates_summed_and_scaled) {
  struct cm_table_conf c;
  c.init = CM_TABLE_INIT_ZEROS;
  struct psd_table *t = make(CM_ROWOPT_SGD, 2, &c);
  psd_table_free(t);
  c.init = CM_TABLE_INIT_ZEROS;
  char err[128];
  ck_assert_int_eq(psd_table_new(&t, &c, 9, err, sizeof err), 0);
  uint64_t ids[3] = {7, 8, 7};
  float g[6] = {1, 2, 10, 20, 3, 4}, v[2];
  struct psd_row_stats st;
  ck_assert_int_eq(psd_table_push(t, ids, 3, g, 0.5f, 11), 0);
  ck_assert_int_eq(psd_table_get(t, 7, v, NULL, &st), 0);
  ck_assert(v[0] == -0.5f * 0.5f * 4 && v[1] == -0.5f * 0.5f * 6);
  ck_assert_uint_eq(st.count, 1); /* one push, however often it names 7 */
  ck_assert_uint_eq(st.t, 1);
  ck_assert_uint_eq(st.last_step, 11);
  psd_table_free(t);
}
END_TEST

START_TEST(pushes_counted_as_pushes_not_rows) {
  /* The table's pushes (an async shard's version) count pushes: 4 pushes
   * naming 13 rows make 4; an empty push changes nothing. A push naming an
   * id twice counts once towards its count and its admission; a sync
   * step's runs (psd_table_push_runs) count one each. */
  struct cm_table_conf c;
  struct psd_table *t = make(CM_ROWOPT_SGD, 1, &c);
  uint64_t ids[13];
  float g[13];
  struct psd_table_stats ts;
  struct psd_row_stats st;
  for (int i = 0; i < 13; i++) {
    ids[i] = 100 + (uint64_t)i;
    g[i] = 1.0f;
  }
  ck_assert_int_eq(psd_table_push(t, ids, 4, g, 1, 1), 0);
  ck_assert_int_eq(psd_table_push(t, ids + 4, 4, g, 1, 1), 0);
  ck_assert_int_eq(psd_table_push(t, ids + 8, 3, g, 1, 1), 0);
  ck_assert_int_eq(psd_table_push(t, ids + 11, 2, g, 1, 1), 0);
  ck_assert_int_eq(psd_table_push(t, ids, 0, g, 1, 1), 0); /* empty */
  psd_table_stats(t, &ts);
  ck_assert_uint_eq(ts.pushes, 4);
  ck_assert_uint_eq(ts.rows_pushed, 13);
  ck_assert_uint_eq(ts.rows, 13);
  /* runs {7, 8}, {7}, {}, {7, 7, 9}: 7 once in two and twice in a third
   * counts 3; the empty run is no push */
  uint64_t r[6] = {7, 8, 7, 7, 7, 9};
  float rg[6] = {1, 1, 1, 1, 1, 1};
  size_t ends[4] = {2, 3, 3, 6};
  ck_assert_int_eq(psd_table_push_runs(t, r, 6, rg, 1, 2, ends, 4), 0);
  ck_assert_int_eq(psd_table_get(t, 7, NULL, NULL, &st), 0);
  ck_assert_uint_eq(st.count, 3);
  ck_assert_uint_eq(st.t, 1);
  ck_assert_int_eq(psd_table_get(t, 8, NULL, NULL, &st), 0);
  ck_assert_uint_eq(st.count, 1);
  psd_table_stats(t, &ts);
  ck_assert_uint_eq(ts.pushes, 4 + 3);
  psd_table_set_pushes(t, 40);
  psd_table_stats(t, &ts);
  ck_assert_uint_eq(ts.pushes, 40);
  psd_table_free(t);
  /* admission by count 2: one push naming an id twice does not admit it */
  cm_table_conf_defaults(&c);
  strcpy(c.name, "t");
  c.dim = 1;
  c.opt.type = CM_ROWOPT_SGD;
  c.admit = CM_ADMIT_COUNT;
  c.admit_count = 2;
  char err[128];
  ck_assert_int_eq(psd_table_new(&t, &c, 9, err, sizeof err), 0);
  uint64_t twice[2] = {5, 5};
  ck_assert_int_eq(psd_table_push(t, twice, 2, g, 1, 1), 0);
  ck_assert_int_eq(psd_table_get(t, 5, NULL, NULL, NULL), CM_ENOENT);
  psd_table_stats(t, &ts);
  ck_assert_uint_eq(ts.pending, 1);
  ck_assert_int_eq(psd_table_push(t, twice, 1, g, 1, 1), 0); /* the 2nd */
  ck_assert_int_eq(psd_table_get(t, 5, NULL, NULL, &st), 0);
  ck_assert_uint_eq(st.count, 2);
  ck_assert_uint_eq(st.t, 1);
  psd_table_free(t);
}
END_TEST

START_TEST(ftrl_rows_start_consistent) {
  /* A new FTRL row holds its initializer's value, and a z from which
   * FTRL's formula gives that value back (kernels/rowopt.h). */
  struct cm_table_conf c;
  struct psd_table *t = make(CM_ROWOPT_FTRL, 8, &c);
  uint64_t id = 77;
  float v[8], st[16], w0[8], want[16];
  ck_assert_int_eq(psd_table_pull(t, &id, 1, v), 0);
  cm_table_init_row(&c, 9, id, w0);
  ck_assert(!memcmp(v, w0, sizeof v));
  ck_assert_int_eq(psd_table_get(t, id, NULL, st, NULL), 0);
  cm_rowopt_init_state(&c.opt, 8, w0, want);
  ck_assert(!memcmp(st, want, sizeof st));
  for (int i = 0; i < 8; i++)
    ck_assert(w0[i] == 0.0f ? st[i] == 0.0f : st[i] * w0[i] < 0.0f);
  psd_table_free(t);
}
END_TEST

struct pusher {
  struct psd_table *t; /* shared */
  int k;               /* which thread */
};

#define NT 4
#define ROUNDS 200
#define NIDS 2000

static void *push_many(void *arg) {
  struct pusher *p = arg;
  uint64_t ids[NIDS];
  float g[NIDS * 2];
  for (int r = 0; r < ROUNDS; r++) {
    for (int i = 0; i < NIDS; i++) {
      ids[i] = (uint64_t)(r * NIDS + i) % 20000 + 1000 * (uint64_t)p->k;
      g[2 * i] = g[2 * i + 1] = 0.25f; /* sums stay exact */
    }
    ck_assert_int_eq(psd_table_push(p->t, ids, NIDS, g, 1.0f, 1), 0);
    float out[16];
    ck_assert_int_eq(psd_table_pull(p->t, ids, 8, out), 0);
  }
  return NULL;
}

START_TEST(concurrent_pushes_while_growing) {
  struct cm_table_conf c;
  char err[128];
  struct psd_table *t;
  cm_table_conf_defaults(&c);
  strcpy(c.name, "t");
  c.dim = 2;
  c.init = CM_TABLE_INIT_ZEROS;
  c.opt.type = CM_ROWOPT_SGD;
  c.opt.lr = 1.0;
  ck_assert_int_eq(psd_table_new(&t, &c, 9, err, sizeof err), 0);
  pthread_t th[NT];
  struct pusher p[NT];
  for (int k = 0; k < NT; k++) {
    p[k] = (struct pusher){t, k};
    pthread_create(&th[k], NULL, push_many, &p[k]);
  }
  for (int k = 0; k < NT; k++)
    pthread_join(th[k], NULL);
  /* Thread k pushes ids 1000k .. 1000k + 19999, each ROUNDS*NIDS/20000
   * times; overlapping ranges add up. */
  struct psd_table_stats st;
  psd_table_stats(t, &st);
  ck_assert_uint_eq(st.rows, 20000 + 1000 * (NT - 1));
  for (uint64_t id = 0; id < 20000 + 1000 * (NT - 1); id++) {
    int owners = 0;
    for (int k = 0; k < NT; k++)
      owners += id >= 1000u * k && id < 1000u * k + 20000;
    uint32_t each = ROUNDS * NIDS / 20000;
    float v[2];
    struct psd_row_stats rs;
    ck_assert_int_eq(psd_table_get(t, id, v, NULL, &rs), 0);
    ck_assert_uint_eq(rs.count, each * owners);
    ck_assert(v[0] == -0.25f * (float)(each * owners));
  }
  psd_table_free(t);
}
END_TEST

START_TEST(admission_count_and_probability) {
  struct cm_table_conf c;
  char err[128];
  struct psd_table *t;
  cm_table_conf_defaults(&c);
  strcpy(c.name, "t");
  c.dim = 1;
  c.init = CM_TABLE_INIT_ZEROS;
  c.opt.type = CM_ROWOPT_SGD;
  c.opt.lr = 1.0;
  c.admit = CM_ADMIT_COUNT;
  c.admit_count = 3;
  ck_assert_int_eq(psd_table_new(&t, &c, 9, err, sizeof err), 0);
  uint64_t id = 42;
  float g = 1, v;
  ck_assert_int_eq(psd_table_pull(t, &id, 1, &v), 0);
  ck_assert_int_eq(psd_table_get(t, id, NULL, NULL, NULL), CM_ENOENT);
  psd_table_push(t, &id, 1, &g, 1, 1);
  psd_table_push(t, &id, 1, &g, 1, 1);
  ck_assert_int_eq(psd_table_get(t, id, NULL, NULL, NULL), CM_ENOENT);
  psd_table_push(t, &id, 1, &g, 1, 1); /* the third: stored and applied */
  ck_assert_int_eq(psd_table_get(t, id, &v, NULL, NULL), 0);
  ck_assert(v == -1.0f);
  psd_table_free(t);
  /* probability: the same ids admitted in two tables of the same seed */
  c.admit = CM_ADMIT_PROB;
  c.admit_prob = 0.3;
  struct psd_table *u;
  ck_assert_int_eq(psd_table_new(&t, &c, 9, err, sizeof err), 0);
  ck_assert_int_eq(psd_table_new(&u, &c, 9, err, sizeof err), 0);
  int stored = 0;
  for (uint64_t i = 0; i < 2000; i++) {
    psd_table_push(t, &i, 1, &g, 1, 1);
    psd_table_push(u, &i, 1, &g, 1, 1);
    int a = psd_table_get(t, i, NULL, NULL, NULL) == 0;
    ck_assert_int_eq(a, psd_table_get(u, i, NULL, NULL, NULL) == 0);
    stored += a;
  }
  ck_assert(stored > 500 && stored < 700);
  psd_table_free(t);
  psd_table_free(u);
}
END_TEST

/* One pull of many ids over every stripe, some stored, some not admitted
 * and some repeated: each position gets its row (the stored value, or the
 * initial row made outside the locks), in request order. */
START_TEST(pull_mixes_stored_and_not_admitted) {
  struct cm_table_conf c;
  struct psd_table *t = make(CM_ROWOPT_SGD, 3, &c);
  psd_table_free(t);
  c.admit = CM_ADMIT_COUNT;
  c.admit_count = 1;
  char err[128];
  ck_assert_int_eq(psd_table_new(&t, &c, 9, err, sizeof err), 0);
  enum { N = 3000 };
  uint64_t *ids = malloc(N * sizeof *ids);
  float *out = malloc(N * 3 * sizeof *out), g[3] = {1, 2, 3}, want[3];
  for (size_t i = 0; i < N; i++) {
    ids[i] = (i * 7919) % 1000; /* each id 3 times, in no order */
    if (ids[i] % 3 == 0 && i < 1000)
      psd_table_push(t, &ids[i], 1, g, 1, 1); /* admitted: stored */
  }
  ck_assert_int_eq(psd_table_pull(t, ids, N, out), 0);
  for (size_t i = 0; i < N; i++) {
    if (psd_table_get(t, ids[i], want, NULL, NULL) == CM_ENOENT)
      cm_table_init_row(&c, 9, ids[i], want);
    else
      ck_assert_uint_eq(ids[i] % 3, 0);
    ck_assert_msg(!memcmp(out + i * 3, want, sizeof want),
                  "position %zu id %llu", i, (unsigned long long)ids[i]);
  }
  struct psd_table_stats st;
  psd_table_stats(t, &st);
  ck_assert_uint_eq(st.rows, 334); /* 0, 3, ..., 999 */
  ck_assert_uint_eq(st.not_admitted, 3 * 666);
  free(ids);
  free(out);
  psd_table_free(t);
}
END_TEST

/* A live move of some buckets: the first copy holds exactly the rows of
 * those buckets, a delta the ones of them pushed since and the ones
 * evicted since, and a destination restored from both equals the source's
 * rows there; dropping them leaves the other buckets' rows, and the
 * checkpoints' next delta says they are gone. */
START_TEST(eviction_top_and_memory) {
  struct cm_table_conf c;
  struct psd_table *t = make(CM_ROWOPT_ADAGRAD, 16, &c);
  psd_table_free(t);
  c.evict_after_steps = 10;
  c.evict_min_count = 2;
  char err[128];
  ck_assert_int_eq(psd_table_new(&t, &c, 9, err, sizeof err), 0);
  float g[16] = {1};
  uint64_t a = 1, b = 2, d = 3;
  psd_table_push(t, &a, 1, g, 1, 5); /* old, pushed twice */
  psd_table_push(t, &a, 1, g, 1, 5);
  psd_table_push(t, &b, 1, g, 1, 20); /* recent, pushed once */
  psd_table_push(t, &d, 1, g, 1, 20); /* recent, pushed three times */
  psd_table_push(t, &d, 1, g, 1, 20);
  psd_table_push(t, &d, 1, g, 1, 20);
  uint64_t ids[3], ev = 0;
  struct psd_row_stats st[3];
  size_t n;
  psd_table_top(t, 3, ids, st, &n);
  ck_assert_uint_eq(n, 3);
  ck_assert(ids[0] == 3 && ids[1] == 1 && ids[2] == 2);
  psd_table_shrink(t, 21, &ev);
  ck_assert_uint_eq(ev, 2); /* 1: untouched for 16 steps; 2: once */
  ck_assert_int_eq(psd_table_get(t, 3, NULL, NULL, NULL), 0);
  ck_assert_int_eq(psd_table_get(t, 1, NULL, NULL, NULL), CM_ENOENT);
  psd_table_free(t);
  /* memory: at most 1.5x the rows' value and state at dim 16 adagrad */
  t = make(CM_ROWOPT_ADAGRAD, 16, &c);
  float *rows = malloc(8192 * 16 * sizeof *rows);
  uint64_t *many = malloc(8192 * sizeof *many);
  for (uint64_t r = 0; r < 1000000; r += 8192) {
    for (int i = 0; i < 8192; i++)
      many[i] = r + (uint64_t)i;
    psd_table_pull(t, many, 8192, rows);
  }
  struct psd_table_stats ts;
  psd_table_stats(t, &ts);
  printf("memory: %.3f x the raw bytes at %llu rows\n",
         (double)ts.bytes / (double)ts.raw_bytes, (unsigned long long)ts.rows);
  ck_assert((double)ts.bytes <= 1.5 * (double)ts.raw_bytes);
  free(rows);
  free(many);
  psd_table_free(t);
}
END_TEST

struct writer {
  struct psd_table *t; /* shared */
  volatile int stop;   /* set by the test */
};

static void *keep_pushing(void *arg) {
  struct writer *w = arg;
  uint64_t ids[64];
  float g[64 * 4];
  for (int i = 0; i < 64; i++)
    ids[i] = (uint64_t)i * 7919;
  for (int i = 0; i < 64 * 4; i++)
    g[i] = 0.5f;
  /* Bounded: each snapshot replays every row's updates, so a writer left
   * to run while the test thread waits for a core (a loaded machine, the
   * sanitizers) would make the replays grow without end. */
  for (int n = 0; n < 4000 && !w->stop; n++)
    psd_table_push(w->t, ids, 64, g, 1.0f, 1);
  return NULL;
}

/* Row r of s (dim 4) against n updates of a constant gradient g replayed
 * on id's first value and state: its value, and without pub its state. */
static void assert_replayed(const struct cm_table_conf *c,
                            const struct psd_table_snap *s, size_t r,
                            uint32_t n, float g, int pub) {
  float v[4], st[4], gs[4] = {g, g, g, g};
  uint32_t tt = 0;
  cm_table_init_row(c, 9, s->ids[r], v);
  cm_rowopt_init_state(&c->opt, 4, v, st);
  for (uint32_t u = 0; u < n; u++)
    cm_rowopt_apply(&c->opt, 4, v, st, &tt, gs);
  ck_assert(!memcmp(v, s->values + r * 4, sizeof v));
  if (!pub)
    ck_assert(!memcmp(st, s->state + r * 4, sizeof st));
}

START_TEST(snapshot_is_one_instant) {
  struct cm_table_conf c;
  struct psd_table *t = make(CM_ROWOPT_ADAGRAD, 4, &c);
  struct writer w = {t, 0};
  pthread_t th;
  pthread_create(&th, NULL, keep_pushing, &w);
  for (int k = 0; k < 50; k++) {
    struct psd_table_snap *s;
    ck_assert_int_eq(psd_table_snapshot(t, 0, &s), 0);
    for (size_t r = 0; r < s->nrows; r++) {
      /* replay the row's t updates of a constant gradient */
      assert_replayed(&c, s, r, s->stats[r].t, 0.5f, 0);
      ck_assert_uint_eq(s->stats[r].count, s->stats[r].t);
    }
    psd_table_snap_free(s);
  }
  w.stop = 1;
  pthread_join(th, NULL);
  psd_table_free(t);
}
END_TEST

/* Pushes batches of ids never pushed before (batch k: ids k * 256 + i,
 * i < 256, a constant gradient), up to 200 batches. */
static void *keep_adding(void *arg) {
  struct writer *w = arg;
  uint64_t ids[256];
  float g[256 * 4];
  for (int i = 0; i < 256 * 4; i++)
    g[i] = 0.25f;
  for (uint64_t k = 0; k < 200 && !w->stop; k++) {
    for (int i = 0; i < 256; i++)
      ids[i] = k * 256 + (uint64_t)i;
    psd_table_push(w->t, ids, 256, g, 1.0f, 1);
  }
  return NULL;
}

/* A snapshot's arrays are sized before it holds the stripes: rows added
 * between that and its instant (past the room it keeps for them) are
 * copied too, sorted, each with its value, and a publication's carry
 * values alone. */
START_TEST(snapshot_while_rows_are_added) {
  struct cm_table_conf c;
  struct psd_table *t = make(CM_ROWOPT_ADAGRAD, 4, &c);
  struct writer w = {t, 0};
  pthread_t th;
  size_t last = 0;
  pthread_create(&th, NULL, keep_adding, &w);
  for (int k = 0; k < 30; k++) {
    struct psd_table_snap *s;
    int pub = k % 3 == 2;
    ck_assert_int_eq(pub ? psd_table_pub_snapshot(t, 1, &s)
                         : psd_table_snapshot(t, 0, &s),
                     0);
    ck_assert_uint_ge(s->nrows, last);
    ck_assert_uint_eq(s->nstate, pub ? 0 : 4);
    ck_assert(pub == !s->stats);
    last = s->nrows;
    for (size_t r = 0; r < s->nrows; r++) {
      ck_assert(!r || s->ids[r - 1] < s->ids[r]);
      ck_assert_uint_lt(s->ids[r], 200 * 256);
      assert_replayed(&c, s, r, 1, 0.25f, pub);
      if (!pub)
        ck_assert_uint_eq(s->stats[r].t, 1);
    }
    psd_table_snap_free(s);
  }
  w.stop = 1;
  pthread_join(th, NULL);
  psd_table_free(t);
}
END_TEST

/* Pushes ids [from, to) once each, a gradient of 0.25 (dim 4). */
static void push_range(struct psd_table *t, uint64_t from, uint64_t to) {
  float g[4] = {0.25f, 0.25f, 0.25f, 0.25f};
  for (uint64_t id = from; id < to; id++)
    ck_assert_int_eq(psd_table_push(t, &id, 1, g, 1.0f, 1), 0);
}

/* psd_table_snap_prepare, _take, _sort: the snapshot is the table at the
 * take, whatever changed between the calls (rows added after the
 * preparation are in it; pushes after the take are not), sorted once
 * sorted; a delta taken after it holds what changed since the take. */
START_TEST(snapshot_in_three_calls) {
  struct cm_table_conf c;
  struct psd_table *t = make(CM_ROWOPT_SGD, 4, &c);
  struct psd_table_snap *s, *d;
  push_range(t, 0, 1000);
  ck_assert_int_eq(psd_table_snap_prepare(t, 0, 0, &s), 0);
  push_range(t, 1000, 3000); /* past the room prepared */
  ck_assert_int_eq(psd_table_snap_take(t, s), 0);
  ck_assert_int_eq(s->delta, 0);
  push_range(t, 0, 100); /* after the instant */
  push_range(t, 5000, 5010);
  ck_assert_int_eq(psd_table_snap_sort(s), 0);
  ck_assert_uint_eq(s->nrows, 3000);
  for (size_t r = 0; r < s->nrows; r++) {
    ck_assert_uint_eq(s->ids[r], r);
    ck_assert_uint_eq(s->stats[r].count, 1);
  }
  ck_assert_int_eq(psd_table_snap_prepare(t, 0, 1, &d), 0);
  ck_assert_int_eq(psd_table_snap_take(t, d), 0);
  ck_assert_int_eq(psd_table_snap_sort(d), 0);
  ck_assert_int_eq(d->delta, 1);
  ck_assert_uint_eq(d->nrows, 110);
  for (size_t r = 0; r < 100; r++) {
    ck_assert_uint_eq(d->ids[r], r);
    ck_assert_uint_eq(d->stats[r].count, 2);
  }
  ck_assert_uint_eq(d->ids[100], 5000);
  psd_table_snap_free(s);
  psd_table_snap_free(d);
  psd_table_free(t);
}
END_TEST

/* Two tables hold the same rows, values, state and stats. */
static void same(struct psd_table *a, struct psd_table *b) {
  struct psd_table_snap *x, *y;
  ck_assert_int_eq(psd_table_page(a, 0, 0, 1 << 20, &x), 0);
  ck_assert_int_eq(psd_table_page(b, 0, 0, 1 << 20, &y), 0);
  ck_assert_uint_eq(x->nrows, y->nrows);
  ck_assert(!memcmp(x->ids, y->ids, x->nrows * 8));
  ck_assert(!memcmp(x->values, y->values, x->nrows * x->dim * 4));
  ck_assert(!memcmp(x->state, y->state, x->nrows * x->nstate * 4));
  ck_assert(!memcmp(x->stats, y->stats, x->nrows * sizeof *x->stats));
  psd_table_snap_free(x);
  psd_table_snap_free(y);
}

START_TEST(full_then_deltas_restore) {
  struct cm_table_conf c;
  struct psd_table *t = make(CM_ROWOPT_ADAGRAD, 3, &c), *u;
  psd_table_free(t);
  c.evict_min_count = 2;
  char err[128], path[64];
  ck_assert_int_eq(psd_table_new(&t, &c, 9, err, sizeof err), 0);
  ck_assert_int_eq(psd_table_new(&u, &c, 9, err, sizeof err), 0);
  float g[30];
  for (int i = 0; i < 30; i++)
    g[i] = 0.125f * (float)(i + 1);
  uint64_t ids[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  struct psd_table_snap *s[3];
  psd_table_push(t, ids, 10, g, 1, 1);
  psd_table_push(t, ids, 5, g, 1, 2); /* ids 1..5 twice */
  ck_assert_int_eq(psd_table_snapshot(t, 0, &s[0]), 0);
  psd_table_shrink(t, 3, NULL);           /* 6..10 evicted */
  psd_table_push(t, ids + 7, 1, g, 1, 4); /* 8 comes back */
  psd_table_push(t, ids, 1, g, 1, 4);
  ck_assert_int_eq(psd_table_snapshot(t, 1, &s[1]), 0);
  ck_assert(s[1]->delta);
  ck_assert_uint_eq(s[1]->nrows, 2); /* 1 and 8 */
  ck_assert_uint_eq(s[1]->nevicted, 5);
  psd_table_push(t, ids + 1, 1, g, 1, 5);
  ck_assert_int_eq(psd_table_snapshot(t, 1, &s[2]), 0);
  for (int k = 0; k < 3; k++) {
    /* through a file each time */
    struct psd_table_snap *r;
    snprintf(path, sizeof path, "/tmp/psd-test-table-%d-%d", (int)getpid(), k);
    ck_assert_int_eq(psd_table_snap_write(s[k], &c, path, err, sizeof err), 0);
    ck_assert_int_eq(psd_table_snap_read(path, &c, &r, err, sizeof err), 0);
    ck_assert_int_eq(psd_table_restore(u, r), 0);
    psd_table_snap_free(r);
    if (k == 2) {
      /* a flipped byte is refused, naming the file */
      FILE *f = fopen(path, "r+b");
      fseek(f, 40, SEEK_SET);
      int ch = fgetc(f);
      fseek(f, 40, SEEK_SET);
      fputc(ch ^ 1, f);
      fclose(f);
      ck_assert_int_eq(psd_table_snap_read(path, &c, &r, err, sizeof err),
                       CM_EFORMAT);
      ck_assert(strstr(err, path) != NULL);
    }
    unlink(path);
    psd_table_snap_free(s[k]);
  }
  same(t, u);
  psd_table_free(t);
  psd_table_free(u);
}
END_TEST

static Suite *table_suite(void) {
  Suite *s = suite_create("table");
  TCase *tc = tcase_create("table");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, lookup_create_and_spread);
  tcase_add_test(tc, duplicates_summed_and_scaled);
  tcase_add_test(tc, pushes_counted_as_pushes_not_rows);
  tcase_add_test(tc, ftrl_rows_start_consistent);
  tcase_add_test(tc, concurrent_pushes_while_growing);
  tcase_add_test(tc, admission_count_and_probability);
  tcase_add_test(tc, pull_mixes_stored_and_not_admitted);
  tcase_add_test(tc, eviction_top_and_memory);
  tcase_add_test(tc, snapshot_is_one_instant);
  tcase_add_test(tc, snapshot_while_rows_are_added);
  tcase_add_test(tc, snapshot_in_three_calls);
  tcase_add_test(tc, full_then_deltas_restore);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(table_suite(), 0); }
