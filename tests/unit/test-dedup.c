/* The applied-push table: a chunk is applied once per (client, seq); a later
 * seq starts afresh and makes older ones duplicates; client 0 is never
 * deduplicated; a refused message can be claimed again; chunks past the
 * inline word and past the limit; the table holds at most its capacity and
 * forgets the least recently used client; concurrent claims of the same
 * message let exactly one through; a saved table loads back with the same
 * answers and its eviction order, and a malformed snapshot is refused
 * naming the field. */
#include <check.h>
#include <jansson.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "dedup.h"
#include "err.h"
#include "unit.h"

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

/* A saved table, through its JSON text, loaded into a new table of cap. */
static struct psd_dedup *round_trip(struct psd_dedup *d, int cap) {
  struct psd_dedup *t;
  json_t *snap, *back;
  json_error_t jerr;
  char err[256] = "", *text;
  ck_assert_int_eq(psd_dedup_save(d, &snap), 0);
  ck_assert_ptr_nonnull(text = json_dumps(snap, JSON_COMPACT));
  ck_assert_msg((back = json_loads(text, 0, &jerr)) != NULL, "%s", jerr.text);
  ck_assert_int_eq(psd_dedup_new(&t, cap), 0);
  ck_assert_msg(psd_dedup_load(t, back, err, sizeof err) == 0, "%s", err);
  free(text);
  json_decref(snap);
  json_decref(back);
  return t;
}

START_TEST(save_load_same_answers) {
  struct psd_dedup *d, *t;
  struct psd_dedup_stats st;
  ck_assert_int_eq(psd_dedup_new(&d, 8), 0);
  /* Chunks in the inline word, in the allocated words, and far out. */
  for (uint32_t c = 0; c < 3001; c += 100)
    ck_assert_int_eq(psd_dedup_claim(d, 0x5eed, 3, c), 0);
  ck_assert_int_eq(psd_dedup_claim(d, 0x5eed, 3, 63), 0);
  ck_assert_int_eq(psd_dedup_claim(d, 0x5eed, 3, 64), 0);
  ck_assert_int_eq(psd_dedup_claim(d, UINT64_MAX, UINT64_MAX, 1), 0);
  /* A client whose only chunk was given back: no chunk is applied. */
  ck_assert_int_eq(psd_dedup_claim(d, 7, 1, 70), 0);
  psd_dedup_unclaim(d, 7, 1, 70);
  t = round_trip(d, 8);
  psd_dedup_stats(t, &st);
  ck_assert_uint_eq(st.clients, 3);
  ck_assert_uint_eq(st.duplicates, 0);
  for (uint32_t c = 0; c < 3001; c += 100)
    ck_assert_int_eq(psd_dedup_claim(t, 0x5eed, 3, c), 1); /* duplicates */
  ck_assert_int_eq(psd_dedup_claim(t, 0x5eed, 3, 63), 1);
  ck_assert_int_eq(psd_dedup_claim(t, 0x5eed, 3, 64), 1);
  ck_assert_int_eq(psd_dedup_claim(t, 0x5eed, 3, 65), 0); /* new chunks */
  ck_assert_int_eq(psd_dedup_claim(t, 0x5eed, 3, 2999), 0);
  ck_assert_int_eq(psd_dedup_claim(t, 0x5eed, 2, 5), 1); /* an older seq */
  ck_assert_int_eq(psd_dedup_claim(t, UINT64_MAX, UINT64_MAX, 1), 1);
  ck_assert_int_eq(psd_dedup_claim(t, UINT64_MAX, UINT64_MAX, 2), 0);
  ck_assert_int_eq(psd_dedup_claim(t, 7, 1, 70), 0);
  ck_assert_int_eq(psd_dedup_claim(t, 7, 0, 70), 1);
  ck_assert_int_eq(psd_dedup_claim(t, 8, 1, 0), 0);      /* an unknown client */
  ck_assert_int_eq(psd_dedup_claim(t, 0x5eed, 4, 0), 0); /* the next seq */
  psd_dedup_free(t);
  /* The same answers from the original. */
  ck_assert_int_eq(psd_dedup_claim(d, 0x5eed, 3, 2900), 1);
  ck_assert_int_eq(psd_dedup_claim(d, 0x5eed, 3, 2999), 0);
  psd_dedup_free(d);
}
END_TEST

START_TEST(save_load_keeps_eviction_order) {
  struct psd_dedup *d, *t;
  struct psd_dedup_stats st;
  ck_assert_int_eq(psd_dedup_new(&d, 4), 0);
  ck_assert_int_eq(psd_dedup_claim(d, 1, 1, 0), 0);
  ck_assert_int_eq(psd_dedup_claim(d, 2, 1, 0), 0);
  ck_assert_int_eq(psd_dedup_claim(d, 3, 1, 0), 0);
  ck_assert_int_eq(psd_dedup_claim(d, 1, 2, 0), 0); /* 1 heard from last */
  /* A smaller table keeps the most recent: 3 and 1, not 2. */
  t = round_trip(d, 2);
  psd_dedup_stats(t, &st);
  ck_assert_uint_eq(st.clients, 2);
  ck_assert_uint_eq(st.evicted, 1);
  ck_assert_int_eq(psd_dedup_claim(t, 1, 2, 0), 1);
  ck_assert_int_eq(psd_dedup_claim(t, 3, 1, 0), 1);
  ck_assert_int_eq(psd_dedup_claim(t, 2, 1, 0), 0); /* forgotten */
  psd_dedup_free(t);
  /* Restored, the order goes on: 2 and 3 are older than 1. */
  t = round_trip(d, 4);
  ck_assert_int_eq(psd_dedup_claim(t, 4, 1, 0), 0);
  ck_assert_int_eq(psd_dedup_claim(t, 5, 1, 0), 0); /* evicts 2 */
  ck_assert_int_eq(psd_dedup_claim(t, 1, 2, 0), 1);
  ck_assert_int_eq(psd_dedup_claim(t, 3, 1, 0), 1);
  ck_assert_int_eq(psd_dedup_claim(t, 2, 1, 0), 0);
  psd_dedup_free(t);
  psd_dedup_free(d);
}
END_TEST

START_TEST(save_empty) {
  struct psd_dedup *d, *t;
  json_t *snap;
  ck_assert_int_eq(psd_dedup_new(&d, 4), 0);
  ck_assert_int_eq(psd_dedup_save(d, &snap), 0);
  ck_assert(json_is_array(snap));
  ck_assert_uint_eq(json_array_size(snap), 0);
  json_decref(snap);
  t = round_trip(d, 4);
  ck_assert_int_eq(psd_dedup_claim(t, 1, 1, 0), 0);
  psd_dedup_free(t);
  psd_dedup_free(d);
}
END_TEST

#define C1 "\"client\": \"0000000000005eed\""
#define S1 "\"seq\": \"0000000000000001\""
#define K1 "\"chunks\": [\"0000000000000001\"]"

/* Malformed snapshots and the field each error must name. */
static const struct {
  const char *json; /* the snapshot */
  const char *says; /* in the error */
} bad[] = {
    {"{}", "dedup: not an array"},
    {"[1]", "dedup[0]: not an object"},
    {"[{" C1 ", " S1 "}]", "dedup[0]: not an object"},
    {"[{" C1 ", " S1 ", " K1 ", \"x\": 1}]", "dedup[0]: not an object"},
    {"[{" C1 ", " S1 ", " K1 "}, {" S1 ", " K1 ", \"client\": 5}]",
     "dedup[1].client"},
    {"[{\"client\": \"0000000000000000\", " S1 ", " K1 "}]", "dedup[0].client"},
    {"[{\"client\": \"00000000005eed\", " S1 ", " K1 "}]", "dedup[0].client"},
    {"[{\"client\": \"000000000000xeed\", " S1 ", " K1 "}]", "dedup[0].client"},
    {"[{" C1 ", \"seq\": 1, " K1 "}]", "dedup[0].seq"},
    {"[{" C1 ", " S1 ", \"chunks\": \"0000000000000001\"}]", "dedup[0].chunks"},
    {"[{" C1 ", " S1 ", \"chunks\": [\"0\"]}]", "dedup[0].chunks[0]"},
    {"[{" C1 ", " S1 ", \"chunks\": [\"0000000000000001\", 3]}]",
     "dedup[0].chunks[1]"},
    {"[{" C1 ", " S1 ", " K1 "}, {" C1 ", " S1 ", " K1 "}]",
     "dedup[1].client: 0000000000005eed is there twice"},
};

START_TEST(load_refuses_malformed) {
  struct psd_dedup *d;
  json_error_t jerr;
  char err[256] = "";
  json_t *j = json_loads(bad[_i].json, 0, &jerr);
  ck_assert_msg(j != NULL, "%s: %s", bad[_i].json, jerr.text);
  ck_assert_int_eq(psd_dedup_new(&d, 4), 0);
  ck_assert_int_eq(psd_dedup_load(d, j, err, sizeof err), CM_EFORMAT);
  ck_assert_msg(strstr(err, bad[_i].says) != NULL, "%s: '%s' lacks '%s'",
                bad[_i].json, err, bad[_i].says);
  json_decref(j);
  psd_dedup_free(d);
}
END_TEST

START_TEST(load_refuses_too_many_words) {
  struct psd_dedup *d;
  json_t *chunks = json_array(), *j;
  char err[256] = "";
  for (int w = 0; w <= PSD_DEDUP_MAX_CHUNKS / 64; w++)
    json_array_append_new(chunks, json_string("0000000000000001"));
  j = json_pack("[{s:s, s:s, s:o}]", "client", "0000000000000001", "seq",
                "0000000000000001", "chunks", chunks);
  ck_assert_ptr_nonnull(j);
  ck_assert_int_eq(psd_dedup_new(&d, 4), 0);
  ck_assert_int_eq(psd_dedup_load(d, j, err, sizeof err), CM_EFORMAT);
  ck_assert_msg(strstr(err, "dedup[0].chunks") != NULL, "%s", err);
  /* The most words a push can need load. */
  json_array_remove(json_object_get(json_array_get(j, 0), "chunks"), 0);
  psd_dedup_free(d);
  ck_assert_int_eq(psd_dedup_new(&d, 4), 0);
  ck_assert_msg(psd_dedup_load(d, j, err, sizeof err) == 0, "%s", err);
  ck_assert_int_eq(psd_dedup_claim(d, 1, 1, PSD_DEDUP_MAX_CHUNKS - 64), 1);
  ck_assert_int_eq(psd_dedup_claim(d, 1, 1, PSD_DEDUP_MAX_CHUNKS - 63), 0);
  json_decref(j);
  psd_dedup_free(d);
}
END_TEST

static Suite *dedup_suite(void) {
  Suite *s = suite_create("dedup");
  TCase *tc = tcase_create("table");
  tcase_add_test(tc, chunk_once_per_seq);
  tcase_add_test(tc, no_identity_and_unclaim);
  tcase_add_test(tc, many_chunks);
  tcase_add_test(tc, bounded_evicts_least_recent);
  tcase_add_test(tc, concurrent_claims_one_winner);
  suite_add_tcase(s, tc);
  tc = tcase_create("snapshot");
  tcase_add_test(tc, save_load_same_answers);
  tcase_add_test(tc, save_load_keeps_eviction_order);
  tcase_add_test(tc, save_empty);
  tcase_add_loop_test(tc, load_refuses_malformed, 0,
                      (int)(sizeof bad / sizeof bad[0]));
  tcase_add_test(tc, load_refuses_too_many_words);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(dedup_suite(), 0); }
