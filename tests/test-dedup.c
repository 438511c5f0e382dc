/* The applied-push table: a chunk is applied once per (client, seq); a later
 * seq starts afresh and makes older ones duplicates; client 0 is never
 * deduplicated; a refused message can be claimed again; chunks past the
 * inline word and past the limit; the table holds at most its capacity and
 * forgets the least recently used client; concurrent claims of the same
 * message let exactly one through. */
#include <check.h>
#include <pthread.h>
#include <stdlib.h>

#include "dedup.h"
#include "err.h"

START_TEST(chunk_once_per_seq) {
  struct psd_dedup *d;
  struct psd_dedup_stats st;
  ck_assert_int_eq(psd_dedup_new(&d, 8), 0);
  ck_assert_int_eq(psd_dedup_claim(d, 42, 1, 0), 0);
  ck_assert_int_eq(psd_dedup_claim(d, 42, 1, 0), 1); /* a retry */
  ck_assert_int_eq(psd_dedup_claim(d, 42, 1, 1), 0); /* another chunk */
  ck_assert_int_eq(psd_dedup_claim(d, 42, 1, 1), 1);
  /* The next push: every chunk is new again. */
  ck_assert_int_eq(psd_dedup_claim(d, 42, 2, 0), 0);
  ck_assert_int_eq(psd_dedup_claim(d, 42, 2, 1), 0);
  /* A late copy of an older push, whatever its chunk. */
  ck_assert_int_eq(psd_dedup_claim(d, 42, 1, 0), 1);
  ck_assert_int_eq(psd_dedup_claim(d, 42, 1, 7), 1);
  /* Another client's same (seq, chunk) is its own. */
  ck_assert_int_eq(psd_dedup_claim(d, 43, 2, 0), 0);
  /* Seqs need not start at 1 nor be consecutive. */
  ck_assert_int_eq(psd_dedup_claim(d, 44, 1000, 3), 0);
  ck_assert_int_eq(psd_dedup_claim(d, 44, 1005, 3), 0);
  ck_assert_int_eq(psd_dedup_claim(d, 44, 1005, 3), 1);
  psd_dedup_stats(d, &st);
  ck_assert_uint_eq(st.duplicates, 5);
  ck_assert_uint_eq(st.clients, 3);
  ck_assert_uint_eq(st.evicted, 0);
  psd_dedup_free(d);
}
END_TEST

START_TEST(no_identity_and_unclaim) {
  struct psd_dedup *d;
  struct psd_dedup_stats st;
  ck_assert_int_eq(psd_dedup_new(&d, 8), 0);
  for (int i = 0; i < 3; i++)
    ck_assert_int_eq(psd_dedup_claim(d, 0, 1, 0), 0);
  /* A refused message's retry is applied. */
  ck_assert_int_eq(psd_dedup_claim(d, 9, 5, 2), 0);
  psd_dedup_unclaim(d, 9, 5, 2);
  ck_assert_int_eq(psd_dedup_claim(d, 9, 5, 2), 0);
  ck_assert_int_eq(psd_dedup_claim(d, 9, 5, 2), 1);
  /* Unclaiming a seq the client has left does nothing. */
  ck_assert_int_eq(psd_dedup_claim(d, 9, 6, 0), 0);
  psd_dedup_unclaim(d, 9, 5, 2);
  ck_assert_int_eq(psd_dedup_claim(d, 9, 5, 2), 1);
  psd_dedup_unclaim(d, 77, 1, 0); /* unknown client */
  psd_dedup_stats(d, &st);
  ck_assert_uint_eq(st.clients, 1);
  ck_assert_uint_eq(st.duplicates, 2);
  psd_dedup_free(d);
  ck_assert_int_eq(psd_dedup_new(&d, 0), CM_EINVAL);
  ck_assert_ptr_null(d);
  psd_dedup_free(NULL);
}
END_TEST

START_TEST(many_chunks) {
  struct psd_dedup *d;
  ck_assert_int_eq(psd_dedup_new(&d, 2), 0);
  for (uint32_t c = 0; c < 3000; c += 7)
    ck_assert_int_eq(psd_dedup_claim(d, 5, 1, c), 0);
  for (uint32_t c = 0; c < 3000; c++)
    ck_assert_int_eq(psd_dedup_claim(d, 5, 1, c), c % 7 == 0);
  /* A new seq clears the words beyond the first too. */
  ck_assert_int_eq(psd_dedup_claim(d, 5, 2, 2999), 0);
  ck_assert_int_eq(psd_dedup_claim(d, 5, 2, 2996), 0);
  /* Past the limit: never recorded, always applied. */
  ck_assert_int_eq(psd_dedup_claim(d, 5, 2, PSD_DEDUP_MAX_CHUNKS), 0);
  ck_assert_int_eq(psd_dedup_claim(d, 5, 2, PSD_DEDUP_MAX_CHUNKS), 0);
  ck_assert_int_eq(psd_dedup_claim(d, 5, 2, PSD_DEDUP_MAX_CHUNKS - 1), 0);
  ck_assert_int_eq(psd_dedup_claim(d, 5, 2, PSD_DEDUP_MAX_CHUNKS - 1), 1);
  psd_dedup_free(d);
}
END_TEST

START_TEST(bounded_evicts_least_recent) {
  struct psd_dedup *d;
  struct psd_dedup_stats st;
  ck_assert_int_eq(psd_dedup_new(&d, 4), 0);
  for (uint64_t id = 1; id <= 4; id++)
    ck_assert_int_eq(psd_dedup_claim(d, id, 1, 0), 0);
  /* Client 1 is used again, so 2 is now the least recent. */
  ck_assert_int_eq(psd_dedup_claim(d, 1, 2, 0), 0);
  ck_assert_int_eq(psd_dedup_claim(d, 5, 1, 0), 0);
  psd_dedup_stats(d, &st);
  ck_assert_uint_eq(st.clients, 4);
  ck_assert_uint_eq(st.evicted, 1);
  /* 1, 3, 4 and 5 are remembered; 2 was forgotten, so its retry is applied
   * again (the documented limit) and evicts the next least recent, 3. */
  ck_assert_int_eq(psd_dedup_claim(d, 1, 2, 0), 1);
  ck_assert_int_eq(psd_dedup_claim(d, 4, 1, 0), 1);
  ck_assert_int_eq(psd_dedup_claim(d, 5, 1, 0), 1);
  ck_assert_int_eq(psd_dedup_claim(d, 2, 1, 0), 0);
  ck_assert_int_eq(psd_dedup_claim(d, 3, 1, 0), 0);
  psd_dedup_stats(d, &st);
  ck_assert_uint_eq(st.clients, 4);
  ck_assert_uint_eq(st.evicted, 3);
  /* Many clients through a small table: still bounded, still correct for
   * the ones it holds. */
  for (uint64_t id = 100; id < 10100; id++) {
    ck_assert_int_eq(psd_dedup_claim(d, id, 7, 1), 0);
    ck_assert_int_eq(psd_dedup_claim(d, id, 7, 1), 1);
  }
  psd_dedup_stats(d, &st);
  ck_assert_uint_eq(st.clients, 4);
  psd_dedup_free(d);
}
END_TEST

/* Threads claiming the same messages. */
struct racer {
  struct psd_dedup *d; /* shared table */
  int won;             /* claims that returned 0 */
};

static void *race(void *arg) {
  struct racer *r = arg;
  for (uint64_t seq = 1; seq <= 2000; seq++)
    for (uint32_t c = 0; c < 4; c++)
      r->won += psd_dedup_claim(r->d, 1 + seq % 3, seq, c) == 0;
  return NULL;
}

START_TEST(concurrent_claims_one_winner) {
  struct psd_dedup *d;
  struct racer r[4];
  pthread_t t[4];
  ck_assert_int_eq(psd_dedup_new(&d, 16), 0);
  for (int i = 0; i < 4; i++) {
    r[i] = (struct racer){d, 0};
    ck_assert_int_eq(pthread_create(&t[i], NULL, race, &r[i]), 0);
  }
  int won = 0;
  for (int i = 0; i < 4; i++) {
    pthread_join(t[i], NULL);
    won += r[i].won;
  }
  /* Each (client, seq, chunk) was let through at most once; a thread that
   * runs behind finds older seqs already passed (duplicates), so at least
   * the newest seq's chunks of each client got through. */
  ck_assert_int_le(won, 2000 * 4);
  ck_assert_int_ge(won, 3 * 4);
  struct psd_dedup_stats st;
  psd_dedup_stats(d, &st);
  ck_assert_uint_eq(st.duplicates + (uint64_t)won, 4 * 2000 * 4);
  psd_dedup_free(d);
}
END_TEST

int main(void) {
  Suite *s = suite_create("dedup");
  TCase *tc = tcase_create("table");
  tcase_add_test(tc, chunk_once_per_seq);
  tcase_add_test(tc, no_identity_and_unclaim);
  tcase_add_test(tc, many_chunks);
  tcase_add_test(tc, bounded_evicts_least_recent);
  tcase_add_test(tc, concurrent_claims_one_winner);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
