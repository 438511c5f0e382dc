/* An embedding table's publication cursor (table.h,
 * psd_table_pub_snapshot): the first publication snapshot is full and
 * values only; each later one holds exactly the rows changed since the
 * previous one and the ids evicted since (less those stored again), its
 * values those of the table at that instant; and it is independent of the
 * checkpoints' delta snapshots taken in between, each of which still sees
 * its own changes and evictions. A forced full one, and a restore, start
 * over. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "table.h"
#include "unit.h"

static struct psd_table *make(struct cm_table_conf *c) {
  struct psd_table *t;
  char err[256];
  cm_table_conf_defaults(c);
  strcpy(c->name, "t");
  c->dim = 3;
  c->opt.type = CM_ROWOPT_ADAGRAD;
  c->opt.lr = 0.5;
  c->evict_after_steps = 10;
  ck_assert_int_eq(psd_table_new(&t, c, 9, err, sizeof err), 0);
  return t;
}

/* Pushes a gradient of 1s to ids[0..n) at step. */
static void push(struct psd_table *t, const uint64_t *ids, size_t n,
                 uint64_t step) {
  float g[3 * 16];
  for (size_t i = 0; i < 3 * n; i++)
    g[i] = 1.0f;
  ck_assert_int_eq(psd_table_push(t, ids, n, g, 1.0f, step), 0);
}

/* s holds exactly ids[0..n) (ascending), each with the table's value now,
 * and evicted ids ev[0..nev). */
static void holds(struct psd_table *t, const struct psd_table_snap *s,
                  const uint64_t *ids, size_t n, const uint64_t *ev,
                  size_t nev) {
  ck_assert_uint_eq(s->nrows, n);
  ck_assert_uint_eq(s->nevicted, nev);
  for (size_t i = 0; i < n; i++) {
    float v[3];
    ck_assert_uint_eq(s->ids[i], ids[i]);
    ck_assert_int_eq(psd_table_get(t, ids[i], v, NULL, NULL), 0);
    ck_assert(!memcmp(v, s->values + 3 * i, sizeof v));
  }
  for (size_t i = 0; i < nev; i++)
    ck_assert_uint_eq(s->evicted[i], ev[i]);
}

START_TEST(changes_since_the_last_publication) {
  struct cm_table_conf c;
  struct psd_table *t = make(&c);
  struct psd_table_snap *p, *k;
  uint64_t a[] = {1, 2, 3, 4, 5}, b[] = {2, 4}, d[] = {5};
  push(t, a, 5, 1);
  /* a checkpoint first: the publication's first is still full */
  ck_assert_int_eq(psd_table_snapshot(t, 1, &k), 0);
  ck_assert_uint_eq(k->nrows, 5);
  psd_table_snap_free(k);
  ck_assert_int_eq(psd_table_pub_snapshot(t, 0, &p), 0);
  ck_assert_int_eq(p->delta, 0);
  ck_assert_uint_eq(p->nstate, 0); /* values only */
  ck_assert_ptr_null(p->stats);
  holds(t, p, a, 5, NULL, 0);
  psd_table_snap_free(p);
  /* interleaved: pub, ckpt, pub, ckpt each see their own changes */
  push(t, b, 2, 2);
  ck_assert_int_eq(psd_table_pub_snapshot(t, 0, &p), 0);
  ck_assert_int_eq(p->delta, 1);
  holds(t, p, b, 2, NULL, 0);
  psd_table_snap_free(p);
  push(t, d, 1, 3);
  ck_assert_int_eq(psd_table_snapshot(t, 1, &k), 0);
  uint64_t bd[] = {2, 4, 5};
  ck_assert_int_eq(k->delta, 1);
  ck_assert_uint_eq(k->nstate, 3); /* the checkpoint's keeps its state */
  holds(t, k, bd, 3, NULL, 0);
  psd_table_snap_free(k);
  ck_assert_int_eq(psd_table_pub_snapshot(t, 0, &p), 0);
  holds(t, p, d, 1, NULL, 0);
  psd_table_snap_free(p);
  /* nothing changed: both empty */
  ck_assert_int_eq(psd_table_pub_snapshot(t, 0, &p), 0);
  holds(t, p, NULL, 0, NULL, 0);
  psd_table_snap_free(p);
  ck_assert_int_eq(psd_table_snapshot(t, 1, &k), 0);
  holds(t, k, NULL, 0, NULL, 0);
  psd_table_snap_free(k);
  /* forced full */
  ck_assert_int_eq(psd_table_pub_snapshot(t, 1, &p), 0);
  ck_assert_int_eq(p->delta, 0);
  holds(t, p, a, 5, NULL, 0);
  psd_table_snap_free(p);
  psd_table_free(t);
}
END_TEST

START_TEST(evicted_ids_for_each_consumer) {
  struct cm_table_conf c;
  struct psd_table *t = make(&c);
  struct psd_table_snap *p, *k;
  uint64_t a[] = {1, 2, 3, 4, 5}, young[] = {4, 5}, back[] = {2};
  push(t, a, 5, 1);
  ck_assert_int_eq(psd_table_pub_snapshot(t, 0, &p), 0);
  psd_table_snap_free(p);
  ck_assert_int_eq(psd_table_snapshot(t, 0, &k), 0);
  psd_table_snap_free(k);
  push(t, young, 2, 15);
  uint64_t n;
  ck_assert_int_eq(psd_table_shrink(t, 20, &n), 0); /* 1, 2, 3 are old */
  ck_assert_uint_eq(n, 3);
  push(t, back, 1, 21); /* 2 stored again */
  ck_assert_int_eq(psd_table_pub_snapshot(t, 0, &p), 0);
  uint64_t rows[] = {2, 4, 5}, gone[] = {1, 3}, gone3[] = {1, 2, 3};
  holds(t, p, rows, 3, gone, 2);
  psd_table_snap_free(p);
  /* the checkpoint's delta still has all three evictions */
  ck_assert_int_eq(psd_table_snapshot(t, 1, &k), 0);
  holds(t, k, rows, 3, gone3, 3);
  psd_table_snap_free(k);
  /* taken once: the next publication has none */
  ck_assert_int_eq(psd_table_pub_snapshot(t, 0, &p), 0);
  holds(t, p, NULL, 0, NULL, 0);
  psd_table_snap_free(p);
  /* a restore starts the publications over with a full one */
  ck_assert_int_eq(psd_table_snapshot(t, 0, &k), 0);
  ck_assert_int_eq(psd_table_restore(t, k), 0);
  psd_table_snap_free(k);
  ck_assert_int_eq(psd_table_pub_snapshot(t, 0, &p), 0);
  ck_assert_int_eq(p->delta, 0);
  holds(t, p, rows, 3, NULL, 0);
  psd_table_snap_free(p);
  psd_table_free(t);
}
END_TEST

START_TEST(no_evictions_kept_before_a_publication) {
  struct cm_table_conf c;
  struct psd_table *t = make(&c);
  struct psd_table_snap *p;
  uint64_t a[] = {1, 2, 3};
  push(t, a, 3, 1);
  ck_assert_int_eq(psd_table_shrink(t, 50, NULL), 0);
  /* never published: the first is full and names no eviction */
  ck_assert_int_eq(psd_table_pub_snapshot(t, 0, &p), 0);
  ck_assert_int_eq(p->delta, 0);
  holds(t, p, NULL, 0, NULL, 0);
  psd_table_snap_free(p);
  psd_table_free(t);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("table-pub");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, changes_since_the_last_publication);
  tcase_add_test(tc, evicted_ids_for_each_consumer);
  tcase_add_test(tc, no_evictions_kept_before_a_publication);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(suite(), 0); }
