/* Unit tests for ps-server/psctl/rowids.c: --ids parsed strictly (every
 * u64, and every malformed list refused with its message), the shards'
 * sorted runs merged into one ascending order, and export pages checked
 * for order. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "rowids.h"
#include "unit.h"

static char err[256];

/* Parses text expecting CM_EINVAL and the message want. */
static void ids_bad(const char *text, const char *want) {
  uint64_t *ids = (uint64_t *)1;
  size_t n = 7;
  err[0] = '\0';
  ck_assert_int_eq(psctl_parse_ids(text, &ids, &n, err, sizeof err), CM_EINVAL);
  ck_assert_ptr_null(ids);
  ck_assert_uint_eq(n, 0);
  ck_assert_str_eq(err, want);
}

START_TEST(test_ids_good) {
  uint64_t *ids = NULL;
  size_t n = 0;

  ck_assert_int_eq(psctl_parse_ids("1,5,9", &ids, &n, err, sizeof err), 0);
  ck_assert_uint_eq(n, 3);
  ck_assert(ids[0] == 1 && ids[1] == 5 && ids[2] == 9);
  free(ids);
  /* The extremes, leading zeros, the order and repeats kept as given. */
  ck_assert_int_eq(psctl_parse_ids("18446744073709551615,0,007,0", &ids, &n,
                                   err, sizeof err),
                   0);
  ck_assert_uint_eq(n, 4);
  ck_assert(ids[0] == UINT64_MAX && ids[1] == 0 && ids[2] == 7 && ids[3] == 0);
  free(ids);
  ck_assert_int_eq(psctl_parse_ids("42", &ids, &n, err, sizeof err), 0);
  ck_assert_uint_eq(n, 1);
  ck_assert(ids[0] == 42);
  free(ids);
}
END_TEST

START_TEST(test_ids_bad) {
  ids_bad("1,x,3", "--ids: 'x' is not an unsigned 64-bit id");
  /* One past 2^64-1, and far past it. */
  ids_bad("18446744073709551616",
          "--ids: '18446744073709551616' is not an unsigned 64-bit id");
  ids_bad("99999999999999999999999",
          "--ids: '99999999999999999999999' is not an unsigned 64-bit id");
  /* strtoull would take these three. */
  ids_bad("-1", "--ids: '-1' is not an unsigned 64-bit id");
  ids_bad("1, 2", "--ids: ' 2' is not an unsigned 64-bit id");
  ids_bad("+3", "--ids: '+3' is not an unsigned 64-bit id");
  ids_bad("0x10", "--ids: '0x10' is not an unsigned 64-bit id");
  ids_bad("1.5", "--ids: '1.5' is not an unsigned 64-bit id");
  ids_bad("", "--ids: no ids given (expected like 1,5,9)");
  ids_bad("1,,2",
          "--ids: an empty entry at byte 2 of '1,,2' (expected like 1,5,9)");
  ids_bad(",1", "--ids: an empty entry at byte 0 of ',1' (expected like "
                "1,5,9)");
  ids_bad("1,", "--ids: an empty entry at byte 2 of '1,' (expected like "
                "1,5,9)");
}
END_TEST

/* Four runs (one empty, one at the top of the id range) merge into one
 * ascending order; each pick names the run the id came from. */
START_TEST(test_merge) {
  static const uint64_t r0[] = {1, 4, 9}, r1[] = {2, 3},
                        r3[] = {5, 100, UINT64_MAX};
  static const uint64_t want[] = {1, 2, 3, 4, 5, 9, 100, UINT64_MAX};
  static const int from[] = {0, 1, 1, 0, 3, 0, 3, 3};
  struct psctl_run runs[4] = {{r0, 3}, {r1, 2}, {NULL, 0}, {r3, 3}};
  size_t at[4] = {0};

  for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
    int r = psctl_merge_pick(runs, 4, at);
    ck_assert_int_eq(r, from[k]);
    ck_assert(runs[r].ids[at[r]] == want[k]);
    at[r]++;
  }
  ck_assert_int_eq(psctl_merge_pick(runs, 4, at), -1);
  /* No runs at all, and only empty ones. */
  ck_assert_int_eq(psctl_merge_pick(runs, 0, at), -1);
  memset(at, 0, sizeof at);
  ck_assert_int_eq(psctl_merge_pick(&runs[2], 1, at), -1);
}
END_TEST

/* A page is strictly ascending and starts past the request's after. */
START_TEST(test_page_order) {
  static const uint64_t up[] = {3, 8, 20}, dup[] = {3, 8, 8}, down[] = {3, 2};
  ck_assert_uint_eq(psctl_ids_unordered(up, 3, 0, 0), 3);
  ck_assert_uint_eq(psctl_ids_unordered(up, 3, 1, 2), 3);
  ck_assert_uint_eq(psctl_ids_unordered(up, 3, 1, 3), 0);
  ck_assert_uint_eq(psctl_ids_unordered(dup, 3, 0, 0), 2);
  ck_assert_uint_eq(psctl_ids_unordered(down, 2, 0, 0), 1);
  ck_assert_uint_eq(psctl_ids_unordered(NULL, 0, 1, 5), 0);
  /* Without after, id 0 may come first. */
  static const uint64_t zero[] = {0, 1};
  ck_assert_uint_eq(psctl_ids_unordered(zero, 2, 0, 0), 2);
  ck_assert_uint_eq(psctl_ids_unordered(zero, 2, 1, 0), 0);
}
END_TEST

static Suite *psctl_rowids_suite(void) {
  Suite *s = suite_create("psctl-rowids");
  TCase *tc = tcase_create("rowids");

  tcase_add_test(tc, test_ids_good);
  tcase_add_test(tc, test_ids_bad);
  tcase_add_test(tc, test_merge);
  tcase_add_test(tc, test_page_order);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(psctl_rowids_suite(), 0); }
