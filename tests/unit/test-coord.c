/* The decision a starting sync coordinator takes from the shards' states
 * (psd__coord_plan): a fresh job and a cluster restarted at one step go on
 * as they are; a cluster restarted from different checkpoints stops as
 * before; shards that ran on while shard 0 was away (it was killed and
 * restarted) make the job roll back to the lowest step of any shard, with
 * the highest generation any shard knows of to build on. */
#include <check.h>
#include <stdlib.h>

#include "coord_internal.h"
#include "unit.h"

/* The plan for nps shards; its outputs in *step, *culprit, *from, *gen. */
static enum psd_coord_start plan(const struct psd_coord_shard *s, int nps,
                                 uint64_t open, uint64_t *step, int *culprit,
                                 uint64_t *from, uint64_t *gen) {
  *step = *from = *gen = 12345;
  *culprit = -7;
  return psd__coord_plan(s, nps, open, step, culprit, from, gen);
}

START_TEST(fresh_and_whole_restarts) {
  uint64_t step, from, gen;
  int culprit;
  /* A fresh job: every shard at 0, nothing resumed, nothing committed. */
  struct psd_coord_shard fresh[3] = {{0, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 0}};
  ck_assert_int_eq(plan(fresh, 3, 0, &step, &culprit, &from, &gen),
                   PSD_COORD_AGREE);
  ck_assert_uint_eq(gen, 0);
  /* Every shard restarted at step 300 (--resume-step): as before. */
  struct psd_coord_shard same[2] = {{300, 0, 1, 0}, {300, 0, 1, 0}};
  ck_assert_int_eq(plan(same, 2, 300, &step, &culprit, &from, &gen),
                   PSD_COORD_AGREE);
  ck_assert_uint_eq(step, 300);
  /* Every shard restarted, from different checkpoints: stop as before
   * (test_ckpt.py SyncStepsTest). */
  struct psd_coord_shard differ[2] = {{2, 0, 1, 0}, {4, 0, 1, 0}};
  ck_assert_int_eq(plan(differ, 2, 2, &step, &culprit, &from, &gen),
                   PSD_COORD_DIFFER);
  /* A fresh coordinator beside a shard that just resumed: stop too. */
  struct psd_coord_shard lost[2] = {{0, 0, 0, 0}, {4, 0, 1, 0}};
  ck_assert_int_eq(plan(lost, 2, 0, &step, &culprit, &from, &gen),
                   PSD_COORD_DIFFER);
}
END_TEST

START_TEST(coordinator_restarted_alone) {
  uint64_t step, from, gen;
  int culprit;
  /* ps:0 resumed at 300, ps:1 served on to 350: back to 300, shard 0's. */
  struct psd_coord_shard a[2] = {{300, 0, 1, 0}, {350, 0, 0, 350}};
  ck_assert_int_eq(plan(a, 2, 300, &step, &culprit, &from, &gen),
                   PSD_COORD_ROLLBACK);
  ck_assert_uint_eq(step, 300);
  ck_assert_int_eq(culprit, 0);
  ck_assert_uint_eq(from, 350);
  ck_assert_uint_eq(gen, 0);
  /* After earlier rollbacks; the old coordinator died in the middle of one
   * (ps:2 is one generation behind ps:1): the highest is learned. */
  struct psd_coord_shard b[3] = {
      {300, 0, 1, 0}, {360, 2, 0, 60}, {350, 1, 0, 50}};
  ck_assert_int_eq(plan(b, 3, 300, &step, &culprit, &from, &gen),
                   PSD_COORD_ROLLBACK);
  ck_assert_uint_eq(step, 300);
  ck_assert_uint_eq(from, 360);
  ck_assert_uint_eq(gen, 2);
  /* The others at the coordinator's step but having committed since they
   * started (a worker may be one step ahead): a rollback all the same, so
   * that a new generation tells every worker in flight. */
  struct psd_coord_shard c[2] = {{300, 0, 1, 0}, {300, 0, 0, 300}};
  ck_assert_int_eq(plan(c, 2, 300, &step, &culprit, &from, &gen),
                   PSD_COORD_ROLLBACK);
  ck_assert_uint_eq(step, 300);
  ck_assert_uint_eq(from, 300);
  /* One rolled back and nothing committed since: it ran on too. */
  struct psd_coord_shard d[2] = {{300, 0, 1, 0}, {200, 1, 0, 0}};
  ck_assert_int_eq(plan(d, 2, 300, &step, &culprit, &from, &gen),
                   PSD_COORD_ROLLBACK);
  /* ...and it is the lowest: the job goes back to its step. */
  ck_assert_uint_eq(step, 200);
  ck_assert_int_eq(culprit, 1);
  ck_assert_uint_eq(from, 300);
  ck_assert_uint_eq(gen, 1);
  /* A coordinator without checkpoints (step 0) beside a shard that served:
   * back to 0, which the shards cannot load (the rollback says so). */
  struct psd_coord_shard e[2] = {{0, 0, 0, 0}, {120, 0, 0, 120}};
  ck_assert_int_eq(plan(e, 2, 0, &step, &culprit, &from, &gen),
                   PSD_COORD_ROLLBACK);
  ck_assert_uint_eq(step, 0);
  ck_assert_uint_eq(from, 120);
}
END_TEST

static Suite *coord_suite(void) {
  Suite *s = suite_create("coord");
  TCase *tc = tcase_create("start");
  tcase_add_test(tc, fresh_and_whole_restarts);
  tcase_add_test(tc, coordinator_restarted_alone);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(coord_suite(), 0); }
