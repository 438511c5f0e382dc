/* Sync mode's staged sparse rows (sstage.h): nothing touches a table until
 * the commit; the commit applies exactly the applied workers' rows, summed
 * in ascending worker order then arrival order whatever order they were
 * staged in, scaled by 1 / the set's size; a worker left out is dropped;
 * rows staged for an older step are dropped; a clear drops everything. */
#include <check.h>
#include <string.h>

#include "err.h"
#include "sstage.h"
#include "table.h"
#include "unit.h"

/* A zero-initialised sgd table of dim 2, lr 1: a row is minus the sum of
 * what was applied to it. */
static struct psd_table *new_table(void) {
  struct cm_table_conf c;
  struct psd_table *t;
  char err[256];
  cm_table_conf_defaults(&c);
  strcpy(c.name, "t");
  c.dim = 2;
  c.init = CM_TABLE_INIT_ZEROS;
  c.opt.type = CM_ROWOPT_SGD;
  c.opt.lr = 1.0;
  ck_assert_int_eq(psd_table_new(&t, &c, 1, err, sizeof err), 0);
  return t;
}

static void row(struct psd_table *t, uint64_t id, float *v) {
  ck_assert_int_eq(psd_table_pull(t, &id, 1, v), 0);
}

START_TEST(commit_applies_the_set_in_worker_order) {
  struct psd_table *t = new_table();
  struct psd_sstage *s;
  float v[2];
  ck_assert_int_eq(psd_sstage_new(&s, 3), 0);
  uint64_t a[] = {7, 8}, b[] = {7};
  float ga[] = {1, 2, 3, 4}, gb[] = {1e8f, 1}, gc[] = {-1e8f, 0};
  /* Staged in the order 2, 0, 1: applied as 0, 1, 2. */
  ck_assert_int_eq(psd_sstage_put(s, 2, 5, t, b, 1, gc), 0);
  ck_assert_int_eq(psd_sstage_put(s, 0, 5, t, a, 2, ga), 0);
  ck_assert_int_eq(psd_sstage_put(s, 1, 5, t, b, 1, gb), 0);
  ck_assert_uint_eq(psd_sstage_rows(s), 4);
  row(t, 7, v); /* nothing applied before the commit */
  ck_assert(v[0] == 0 && v[1] == 0);
  int set[] = {0, 1, 2};
  ck_assert_int_eq(psd_sstage_commit(s, 5, set, 3), 0);
  ck_assert_uint_eq(psd_sstage_rows(s), 0);
  /* (1 + 1e8) - 1e8 = 0 in float in this order; then / 3. */
  row(t, 7, v);
  float want0 = -((1.0f + 1e8f) + -1e8f) * (1.0f / 3.0f);
  float want1 = -((2.0f + 1.0f) + 0.0f) * (1.0f / 3.0f);
  ck_assert(v[0] == want0);
  ck_assert(v[1] == want1);
  row(t, 8, v);
  ck_assert(v[0] == -3.0f * (1.0f / 3.0f) && v[1] == -4.0f * (1.0f / 3.0f));
  psd_sstage_free(s);
  psd_table_free(t);
}
END_TEST

START_TEST(left_out_and_old_steps_dropped) {
  struct psd_table *t = new_table();
  struct psd_sstage *s;
  float v[2], g[] = {2, 2};
  uint64_t id = 9;
  ck_assert_int_eq(psd_sstage_new(&s, 2), 0);
  ck_assert_int_eq(psd_sstage_put(s, 0, 3, t, &id, 1, g), 0);
  ck_assert_int_eq(psd_sstage_put(s, 1, 3, t, &id, 1, g), 0);
  int set[] = {0};
  ck_assert_int_eq(psd_sstage_commit(s, 3, set, 1), 0);
  row(t, 9, v);
  ck_assert(v[0] == -2.0f && v[1] == -2.0f); /* worker 1's row dropped */
  ck_assert_uint_eq(psd_sstage_rows(s), 0);
  /* Staged for step 4, then a new step without a commit of 4: dropped. */
  ck_assert_int_eq(psd_sstage_put(s, 0, 4, t, &id, 1, g), 0);
  ck_assert_int_eq(psd_sstage_put(s, 0, 5, t, &id, 1, g), 0);
  ck_assert_uint_eq(psd_sstage_rows(s), 1);
  psd_sstage_clear(s);
  ck_assert_uint_eq(psd_sstage_rows(s), 0);
  ck_assert_int_eq(psd_sstage_commit(s, 5, set, 1), 0);
  row(t, 9, v);
  ck_assert(v[0] == -2.0f);
  ck_assert_int_eq(psd_sstage_put(s, 2, 5, t, &id, 1, g), CM_EINVAL);
  psd_sstage_free(s);
  psd_table_free(t);
}
END_TEST

static Suite *sstage_suite(void) {
  Suite *s = suite_create("sstage");
  TCase *tc = tcase_create("commit");
  tcase_add_test(tc, commit_applies_the_set_in_worker_order);
  tcase_add_test(tc, left_out_and_old_steps_dropped);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(sstage_suite(), 0); }
