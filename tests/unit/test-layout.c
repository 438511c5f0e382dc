/* Row partitioning: split ranges cover every row once, differ by at most
 * one row, handle more shards than rows; whole placement; auto placement
 * balances bytes deterministically. A shape's element count, bounded. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>

#include "layout.h"
#include "unit.h"

static void check_split(int64_t rows, int n) {
  int64_t next = 0, lo = rows, hi = 0;
  for (int s = 0; s < n; s++) {
    int64_t b, e;
    cm_shard_rows(rows, CM_SHARD_SPLIT, n, s, &b, &e);
    ck_assert_int_eq(b, next); /* contiguous, in shard order */
    ck_assert_int_ge(e, b);
    next = e;
    if (e - b < lo)
      lo = e - b;
    if (e - b > hi)
      hi = e - b;
  }
  ck_assert_int_eq(next, rows);
  ck_assert_int_le(hi - lo, 1);
}

START_TEST(split_even_and_uneven) {
  check_split(784, 2);
  check_split(10, 3);
  check_split(7, 7);
  check_split(1000003, 16);
  int64_t b, e;
  cm_shard_rows(10, CM_SHARD_SPLIT, 3, 0, &b, &e);
  ck_assert_int_eq(b, 0);
  ck_assert_int_eq(e, 3);
  cm_shard_rows(10, CM_SHARD_SPLIT, 3, 2, &b, &e);
  ck_assert_int_eq(b, 6);
  ck_assert_int_eq(e, 10);
}
END_TEST

START_TEST(more_shards_than_rows) {
  int nonempty = 0;
  check_split(3, 8);
  for (int s = 0; s < 8; s++) {
    int64_t b, e;
    cm_shard_rows(3, CM_SHARD_SPLIT, 8, s, &b, &e);
    nonempty += e > b;
  }
  ck_assert_int_eq(nonempty, 3);
  check_split(1, 4);
}
END_TEST

START_TEST(whole_placement_and_bad_input) {
  int64_t b, e;
  cm_shard_rows(50, 1, 3, 1, &b, &e);
  ck_assert_int_eq(b, 0);
  ck_assert_int_eq(e, 50);
  cm_shard_rows(50, 1, 3, 0, &b, &e);
  ck_assert_int_eq(e - b, 0);
  cm_shard_rows(50, CM_SHARD_SPLIT, 3, 5, &b, &e); /* no such shard */
  ck_assert_int_eq(e - b, 0);
  cm_shard_rows(0, CM_SHARD_SPLIT, 3, 0, &b, &e);
  ck_assert_int_eq(e - b, 0);
}
END_TEST

START_TEST(auto_balances_bytes) {
  /* The demo MLP: 784x256 kernel, biases, 256x128, 128x10. */
  uint64_t bytes[] = {784 * 256 * 4, 256 * 4,      128 * 256 * 4,
                      128 * 4,       10 * 128 * 4, 10 * 4};
  int place[6], again[6];
  cm_shard_auto(bytes, 6, 2, 256 << 10, place);
  ck_assert_int_eq(place[0], CM_SHARD_SPLIT); /* 784 KiB: split */
  uint64_t load[2] = {bytes[0] / 2, bytes[0] / 2};
  for (int i = 1; i < 6; i++) {
    ck_assert(place[i] == 0 || place[i] == 1);
    load[place[i]] += bytes[i];
  }
  /* Greedy: no shard carries more than the other plus the largest whole var. */
  uint64_t d = load[0] > load[1] ? load[0] - load[1] : load[1] - load[0];
  ck_assert_uint_le(d, bytes[2]);
  cm_shard_auto(bytes, 6, 2, 256 << 10, again);
  for (int i = 0; i < 6; i++)
    ck_assert_int_eq(place[i], again[i]);
  /* One shard: everything split (that is, whole on shard 0). */
  cm_shard_auto(bytes, 6, 1, 256 << 10, place);
  for (int i = 0; i < 6; i++)
    ck_assert_int_eq(place[i], CM_SHARD_SPLIT);
}
END_TEST

/* cm_numel: the product, 1 for no dimensions, and 0 naming the first
 * dimension at fault: not positive, or where the count passes max. */
START_TEST(numel_counts_and_bounds) {
  int64_t shape[3] = {4, 3, 2}, big[2] = {1 << 20, 1 << 20};
  int64_t bad[3] = {4, 0, -1}, neg[2] = {-3, 2};
  int at = -1;
  ck_assert_uint_eq(cm_numel(3, shape, UINT64_MAX, NULL), 24);
  ck_assert_uint_eq(cm_numel(2, shape + 1, UINT64_MAX, NULL), 6); /* a row */
  ck_assert_uint_eq(cm_numel(0, shape, UINT64_MAX, NULL), 1);
  ck_assert_uint_eq(cm_numel(3, shape, 24, &at), 24); /* max itself is fine */
  ck_assert_int_eq(at, -1);
  ck_assert_uint_eq(cm_numel(3, shape, 23, &at), 0);
  ck_assert_int_eq(at, 2);
  ck_assert_uint_eq(cm_numel(2, big, 1ULL << 40, &at), 1ULL << 40);
  ck_assert_uint_eq(cm_numel(2, big, (1ULL << 40) - 1, &at), 0);
  ck_assert_int_eq(at, 1);
  ck_assert_uint_eq(cm_numel(3, bad, UINT64_MAX, &at), 0);
  ck_assert_int_eq(at, 1);
  ck_assert_uint_eq(cm_numel(2, neg, UINT64_MAX, &at), 0);
  ck_assert_int_eq(at, 0);
  /* No wrap past UINT64_MAX: 2^32 x 2^32 is refused, not 0 elements. */
  int64_t huge[2] = {1LL << 32, 1LL << 32};
  ck_assert_uint_eq(cm_numel(2, huge, UINT64_MAX, &at), 0);
  ck_assert_int_eq(at, 1);
}
END_TEST

START_TEST(by_name_ignores_order_and_others) {
  /* The same name gets the same shard whatever else is declared. */
  int a = cm_shard_by_name("layer1/bias", 1024, 4, 256 << 10);
  ck_assert(a >= 0 && a < 4);
  ck_assert_int_eq(cm_shard_by_name("layer1/bias", 1024, 4, 256 << 10), a);
  /* Large, or one shard: split. */
  ck_assert_int_eq(cm_shard_by_name("big", 256 << 10, 4, 256 << 10),
                   CM_SHARD_SPLIT);
  ck_assert_int_eq(cm_shard_by_name("small", 4, 1, 256 << 10), CM_SHARD_SPLIT);
  /* FNV-1a of "a" is 0xaf63dc4c8601ec8c: shard 0 of 2, 2 of 3. */
  ck_assert_int_eq(cm_shard_by_name("a", 4, 2, 256 << 10), 0);
  ck_assert_int_eq(cm_shard_by_name("a", 4, 3, 256 << 10),
                   (int)(0xaf63dc4c8601ec8cull % 3));
  /* Spread: 64 names over 4 shards leave no shard empty. */
  int seen[4] = {0};
  char name[16];
  for (int i = 0; i < 64; i++) {
    snprintf(name, sizeof name, "v%d", i);
    seen[cm_shard_by_name(name, 64, 4, 256 << 10)]++;
  }
  for (int s = 0; s < 4; s++)
    ck_assert_int_gt(seen[s], 0);
}
END_TEST

/* The one rule of a moved layout (the reshard cut and the client): what
 * the declaration asked for, not what one count happens to hold. */
START_TEST(replace_keeps_what_was_declared) {
  int a2 = cm_shard_by_name("a", 4, 2, CM_SHARD_SPLIT_BYTES);
  int a3 = cm_shard_by_name("a", 4, 3, CM_SHARD_SPLIT_BYTES);
  /* Declared split: split again after one shard, where all looks split. */
  ck_assert_int_eq(
      cm_shard_replace(CM_SHARD_SPLIT, CM_SHARD_SPLIT, 1, "a", 4, 2),
      CM_SHARD_SPLIT);
  ck_assert_int_eq(
      cm_shard_replace(CM_SHARD_SPLIT, CM_SHARD_SPLIT, 3, "a", 4, 1),
      CM_SHARD_SPLIT);
  /* Declared on shard 2: by name on 2 shards, back on 2 with 3; on 0,
   * through one shard and back. */
  ck_assert_int_eq(cm_shard_replace(2, 2, 3, "a", 4, 2), a2);
  ck_assert_int_eq(cm_shard_replace(2, a2, 2, "a", 4, 3), 2);
  ck_assert_int_eq(cm_shard_replace(0, 0, 2, "a", 4, 1), 0);
  ck_assert_int_eq(cm_shard_replace(0, 0, 1, "a", 4, 3), 0);
  /* By name or auto: by name, split when large. */
  ck_assert_int_eq(
      cm_shard_replace(CM_SHARD_NAME, CM_SHARD_SPLIT, 1, "a", 4, 3), a3);
  ck_assert_int_eq(cm_shard_replace(CM_SHARD_AUTO, 1, 2, "a", 4, 3), a3);
  ck_assert_int_eq(cm_shard_replace(CM_SHARD_NAME, CM_SHARD_SPLIT, 2, "big",
                                    CM_SHARD_SPLIT_BYTES, 3),
                   CM_SHARD_SPLIT);
  /* Not said (an older manifest): split stays split, but from one shard. */
  ck_assert_int_eq(
      cm_shard_replace(CM_SHARD_UNSAID, CM_SHARD_SPLIT, 2, "a", 4, 3),
      CM_SHARD_SPLIT);
  ck_assert_int_eq(
      cm_shard_replace(CM_SHARD_UNSAID, CM_SHARD_SPLIT, 1, "a", 4, 3), a3);
  ck_assert_int_eq(cm_shard_replace(CM_SHARD_UNSAID, 1, 2, "a", 4, 3), a3);
}
END_TEST

static Suite *shard_suite(void) {
  Suite *s = suite_create("shard");
  TCase *tc = tcase_create("rows");
  tcase_add_test(tc, split_even_and_uneven);
  tcase_add_test(tc, more_shards_than_rows);
  tcase_add_test(tc, whole_placement_and_bad_input);
  tcase_add_test(tc, auto_balances_bytes);
  tcase_add_test(tc, by_name_ignores_order_and_others);
  tcase_add_test(tc, replace_keeps_what_was_declared);
  tcase_add_test(tc, numel_counts_and_bounds);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(shard_suite(), 0); }
