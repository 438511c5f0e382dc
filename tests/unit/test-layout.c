/* The layout (common/layout/layout.h). Pinned values: the row rule, the
 * name hash and the placement of a fixed set of variables are what psd
 * computed before the rules moved into one module (common/vars/shard.c,
 * psd_table_shard_of, cm_name_hash), so a job's rows and variables stay
 * where its checkpoints and running clients have them. Row partitioning:
 * split ranges cover every row once, differ by at most one row, handle
 * more shards than rows; whole placement; auto placement balances bytes
 * deterministically. Serving tasks' shards. A shape's element count,
 * bounded (common/vars/shape.h: the count the rows are cut from). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "layout.h"
#include "rand.h"
#include "shape.h"
#include "unit.h"

/* ---- Pinned: what psd computed before this module ---- */

/* The row rule: splitmix64(id) % nshards, the literal formula of
 * psd_table_shard_of and the client's copies, and the shards it gave. */
START_TEST(row_rule_pinned) {
  static const uint64_t ids[] = {0,
                                 1,
                                 2,
                                 3,
                                 41,
                                 1000,
                                 123456789,
                                 0xffffffffffffffffull,
                                 0x8000000000000000ull};
  static const int counts[] = {1, 2, 3, 4, 7, 8, 9, 64};
  /* ids[i]'s shard among counts[j], from the code before the move. */
  static const int want[9][8] = {
      {0, 1, 1, 3, 2, 7, 7, 47}, {0, 1, 2, 1, 2, 1, 5, 1},
      {0, 0, 1, 2, 4, 6, 4, 14}, {0, 1, 0, 1, 2, 5, 0, 45},
      {0, 1, 0, 1, 6, 1, 0, 9},  {0, 0, 1, 0, 0, 0, 4, 8},
      {0, 1, 2, 1, 5, 1, 8, 57}, {0, 0, 2, 0, 0, 0, 8, 32},
      {0, 1, 1, 3, 6, 3, 4, 27}};
  static struct cm_layout_map m;
  for (size_t j = 0; j < sizeof counts / sizeof *counts; j++) {
    int n = counts[j];
    cm_layout_map_init(&m, CM_LAYOUT_RULE_MODULO, n);
    for (size_t i = 0; i < sizeof ids / sizeof *ids; i++) {
      int old = (int)(cm_splitmix64_at(ids[i]) % (uint64_t)n);
      ck_assert_int_eq(cm_layout_map_id_shard(&m, ids[i]), old);
      ck_assert_int_eq(cm_layout_map_id_shard(&m, ids[i]), want[i][j]);
      /* Hashed ahead, placed later (the client's plan): the same. */
      ck_assert_int_eq(cm_layout_map_hash_shard(&m, cm_layout_id_hash(ids[i])),
                       old);
    }
  }
  ck_assert_uint_eq(cm_layout_id_hash(1), cm_splitmix64_at(1));
}
END_TEST

/* ---- The bucket map ---- */

/* A bucket is the hash's top 12 bits; the shards of fixed buckets in the
 * maps of fixed counts are pinned (tests/integration/hashes.py computes the
 * same). */
START_TEST(buckets_pinned) {
  static struct cm_layout_map m;
  static const unsigned bs[] = {0, 1, 2, 100, 4095};
  static const int counts[] = {2, 3, 8, 100};
  static const int want[5][4] = {{0, 0, 0, 92},
                                 {0, 2, 2, 72},
                                 {0, 2, 2, 77},
                                 {1, 2, 5, 76},
                                 {0, 0, 4, 27}};
  ck_assert_uint_eq(CM_LAYOUT_BUCKETS, 4096);
  ck_assert_uint_eq(cm_layout_bucket(0xfff0000000000000ull), 4095);
  ck_assert_uint_eq(cm_layout_bucket(0x000fffffffffffffull), 0);
  ck_assert_uint_eq(cm_layout_bucket(cm_layout_id_hash(41)),
                    (unsigned)(cm_splitmix64_at(41) >> 52));
  cm_layout_map_init(&m, CM_LAYOUT_RULE_BUCKETS, 1);
  for (unsigned b = 0; b < CM_LAYOUT_BUCKETS; b++)
    ck_assert_int_eq(m.shard[b], 0);
  for (int j = 0; j < 4; j++) {
    cm_layout_map_init(&m, CM_LAYOUT_RULE_BUCKETS, counts[j]);
    ck_assert_int_eq(m.rule, CM_LAYOUT_RULE_BUCKETS);
    ck_assert_int_eq(m.nshards, counts[j]);
    for (int i = 0; i < 5; i++)
      ck_assert_int_eq(m.shard[bs[i]], want[i][j]);
    /* An id's shard is its bucket's. */
    for (uint64_t id = 0; id < 1000; id++)
      ck_assert_int_eq(cm_layout_map_id_shard(&m, id),
                       m.shard[cm_splitmix64_at(id) >> 52]);
  }
  /* Any rule but modulo is buckets. */
  cm_layout_map_init(&m, 0, 3);
  ck_assert_int_eq(m.rule, CM_LAYOUT_RULE_BUCKETS);
}
END_TEST

/* Every count up to 100: each shard holds floor or ceil of 4096 / n
 * buckets; n -> n + 1 moves exactly floor(4096 / (n + 1)) buckets, each to
 * the new shard, so n + 1 -> n moves back exactly those. */
START_TEST(buckets_balance_and_move_least) {
  static struct cm_layout_map a, b;
  cm_layout_map_init(&a, CM_LAYOUT_RULE_BUCKETS, 1);
  for (int n = 1; n <= 100; n++) {
    int held[101] = {0}, moved = 0;
    cm_layout_map_init(&b, CM_LAYOUT_RULE_BUCKETS, n + 1);
    for (unsigned k = 0; k < CM_LAYOUT_BUCKETS; k++) {
      ck_assert_int_lt(a.shard[k], n);
      held[a.shard[k]]++;
      if (a.shard[k] != b.shard[k]) {
        ck_assert_int_eq(b.shard[k], n); /* only to the new shard */
        moved++;
      }
    }
    int q = (int)(CM_LAYOUT_BUCKETS / (unsigned)n);
    for (int s = 0; s < n; s++)
      ck_assert_msg(held[s] == q || held[s] == q + 1,
                    "n=%d: shard %d holds %d buckets, want %d or %d", n, s,
                    held[s], q, q + 1);
    ck_assert_int_eq(moved, (int)(CM_LAYOUT_BUCKETS / (unsigned)(n + 1)));
    a = b;
  }
}
END_TEST

/* A move bucket by bucket: partway maps go from one count's map to the
 * other's one bucket at a time, in cm_layout_moves's order (by pair of
 * shards, then bucket), each bucket to its shard in the target; both
 * directions make the same moves in the same order. */
START_TEST(moves_bucket_by_bucket) {
  static struct cm_layout_map m, a, b, prev;
  static uint16_t mv[CM_LAYOUT_BUCKETS], back[CM_LAYOUT_BUCKETS];
  static const int pairs[][2] = {{2, 3}, {3, 2}, {1, 4}, {8, 5}, {5, 5}};
  for (size_t p = 0; p < sizeof pairs / sizeof *pairs; p++) {
    int from = pairs[p][0], to = pairs[p][1];
    int n = cm_layout_moves(from, to, mv);
    ck_assert_int_eq(cm_layout_moves(to, from, back), n);
    ck_assert_mem_eq(mv, back, (size_t)n * sizeof *mv);
    cm_layout_map_init(&a, CM_LAYOUT_RULE_BUCKETS, from);
    cm_layout_map_init(&b, CM_LAYOUT_RULE_BUCKETS, to);
    /* Grouped by pair (the smaller count's shard, the larger's), each
     * pair's buckets ascending. */
    const uint16_t *lo = from < to ? a.shard : b.shard,
                   *hi = from < to ? b.shard : a.shard;
    for (int k = 1; k < n; k++) {
      unsigned p0 = (unsigned)lo[mv[k - 1]] << 16 | hi[mv[k - 1]],
               p1 = (unsigned)lo[mv[k]] << 16 | hi[mv[k]];
      ck_assert(p0 < p1 || (p0 == p1 && mv[k - 1] < mv[k]));
    }
    const int dones[] = {0, 1, 2, n / 2, n / 2 + 1, n - 1, n};
    for (size_t d = 0; d < sizeof dones / sizeof *dones; d++) {
      int done = dones[d] < 0 ? 0 : dones[d] > n ? n : dones[d];
      ck_assert_int_eq(cm_layout_map_moving(&m, from, to, done), n);
      ck_assert_int_eq(m.rule, CM_LAYOUT_RULE_BUCKETS);
      ck_assert_int_eq(m.nshards, done == n ? to : (from > to ? from : to));
      for (int k = 0; k < n; k++)
        ck_assert_int_eq(m.shard[mv[k]],
                         k < done ? b.shard[mv[k]] : a.shard[mv[k]]);
      /* One move more than the map before differs in that bucket alone. */
      if (d && done == dones[d - 1] + 1)
        for (unsigned k = 0; k < CM_LAYOUT_BUCKETS; k++)
          ck_assert(m.shard[k] == prev.shard[k] || k == mv[done - 1]);
      prev = m;
    }
    ck_assert_mem_eq(m.shard, b.shard, sizeof b.shard);
    cm_layout_map_moving(&m, from, to, n + 7); /* past the end: done */
    ck_assert_mem_eq(m.shard, b.shard, sizeof b.shard);
  }
  ck_assert_int_eq(cm_layout_moves(2, 3, mv), (int)(CM_LAYOUT_BUCKETS / 3));
}
END_TEST

/* Rows: 2 -> 3 moves a third of 200,000 random ids (at most 0.36, the
 * issue's bound), where splitmix64(id) % n moved two thirds. */
START_TEST(rows_moved_two_to_three) {
  static struct cm_layout_map m2, m3, o2, o3;
  uint64_t x = 7;
  int moved = 0, moved_mod = 0, n = 200000;
  cm_layout_map_init(&m2, CM_LAYOUT_RULE_BUCKETS, 2);
  cm_layout_map_init(&m3, CM_LAYOUT_RULE_BUCKETS, 3);
  cm_layout_map_init(&o2, CM_LAYOUT_RULE_MODULO, 2);
  cm_layout_map_init(&o3, CM_LAYOUT_RULE_MODULO, 3);
  for (int i = 0; i < n; i++) {
    uint64_t id = cm_splitmix64_at(x++) >> 14;
    moved += cm_layout_map_id_shard(&m2, id) != cm_layout_map_id_shard(&m3, id);
    moved_mod +=
        cm_layout_map_id_shard(&o2, id) != cm_layout_map_id_shard(&o3, id);
  }
  ck_assert_msg(moved <= 0.36 * n && moved >= 0.30 * n, "moved %d of %d", moved,
                n);
  ck_assert_msg(moved_mod >= 0.64 * n, "modulo moved %d of %d", moved_mod, n);
}
END_TEST

START_TEST(rule_names) {
  static struct cm_layout_map m;
  char buf[96];
  ck_assert_str_eq(cm_layout_rule_name(CM_LAYOUT_RULE_MODULO), "modulo");
  ck_assert_str_eq(cm_layout_rule_name(CM_LAYOUT_RULE_BUCKETS), "buckets");
  ck_assert_int_eq(cm_layout_rule_parse("modulo"), CM_LAYOUT_RULE_MODULO);
  ck_assert_int_eq(cm_layout_rule_parse("buckets"), CM_LAYOUT_RULE_BUCKETS);
  ck_assert_int_eq(cm_layout_rule_parse("bucket"), 0);
  ck_assert_int_eq(cm_layout_rule_parse(NULL), 0);
  cm_layout_map_init(&m, CM_LAYOUT_RULE_MODULO, 2);
  ck_assert_str_eq(cm_layout_map_text(&m, buf, sizeof buf),
                   "splitmix64(id) % 2");
  cm_layout_map_init(&m, CM_LAYOUT_RULE_BUCKETS, 3);
  ck_assert_str_eq(cm_layout_map_text(&m, buf, sizeof buf),
                   "bucket splitmix64(id) >> 52 of 3 shards' map");
}
END_TEST

/* The name hash: FNV-1a 64 (the published test vectors, and names of
 * psd's own variables and tables). */
START_TEST(name_hash_is_fnv1a) {
  ck_assert_uint_eq(cm_layout_name_hash(""), 0xcbf29ce484222325ull);
  ck_assert_uint_eq(cm_layout_name_hash("a"), 0xaf63dc4c8601ec8cull);
  ck_assert_uint_eq(cm_layout_name_hash("foobar"), 0x85944171f73967e8ull);
  ck_assert_uint_eq(cm_layout_name_hash("layer1/kernel"),
                    0x25b4aeb2340294b7ull);
  ck_assert_uint_eq(cm_layout_name_hash("emb"), 0xc2ec1718f04f892full);
  ck_assert_uint_eq(cm_layout_name_hash("w"), 0xaf63ea4c86020456ull);
}
END_TEST

/* Placement of a fixed set of variables by load, by name and after a
 * reshard: what cm_shard_auto, cm_shard_by_name and cm_shard_replace gave. */
START_TEST(placement_pinned) {
  /* The demo MLP's six and a small embedding, among 3 shards. */
  static const uint64_t bytes[] = {784 * 256 * 4, 256 * 4,      128 * 256 * 4,
                                   128 * 4,       10 * 128 * 4, 10 * 4,
                                   1000 * 8 * 4};
  static const int auto3[] = {CM_LAYOUT_SPLIT, 0, 1, 2, 2, 0, 0};
  int place[7];
  cm_layout_auto(bytes, 7, 3, CM_LAYOUT_SPLIT_BYTES, place);
  for (int i = 0; i < 7; i++)
    ck_assert_int_eq(place[i], auto3[i]);
  /* By name, among 2, 3, 4 and 5 shards. */
  static const char *names[] = {"layer1/kernel", "layer1/bias", "out/bias",
                                "emb",           "w",           "v17"};
  static const int byname[6][4] = {{1, 0, 3, 4}, {1, 0, 3, 3}, {1, 1, 1, 3},
                                   {1, 2, 3, 0}, {0, 0, 2, 0}, {1, 0, 1, 3}};
  for (int i = 0; i < 6; i++)
    for (int n = 2; n <= 5; n++)
      ck_assert_int_eq(
          cm_layout_by_name(names[i], 1024, n, CM_LAYOUT_SPLIT_BYTES),
          byname[i][n - 2]);
  /* After a reshard (asked, held, from -> to). */
  ck_assert_int_eq(
      cm_layout_replace(CM_LAYOUT_AUTO, 1, 2, "layer1/bias", 1024, 3),
      0 /* by name among 3 */);
  ck_assert_int_eq(cm_layout_replace(4, 4, 5, "out/bias", 40, 3),
                   1 /* no shard 4 among 3: by name */);
  ck_assert_int_eq(cm_layout_replace(CM_LAYOUT_UNSAID, 0, 1, "emb", 32000, 4),
                   3 /* whole on 1: by name among 4 */);
  /* The wire's VarSpec.asked. */
  ck_assert_int_eq(cm_layout_asked_to_wire(CM_LAYOUT_UNSAID), 0);
  ck_assert_int_eq(cm_layout_asked_to_wire(2), 3);
  ck_assert_int_eq(cm_layout_asked_to_wire(CM_LAYOUT_NAME), -3);
  ck_assert_int_eq(cm_layout_asked_from_wire(0), CM_LAYOUT_UNSAID);
  ck_assert_int_eq(cm_layout_asked_from_wire(3), 2);
  ck_assert_int_eq(cm_layout_asked_from_wire(-1), CM_LAYOUT_SPLIT);
}
END_TEST

/* serve:J follows shard J % nps as its replica J / nps; a spec's serving
 * tasks come in whole rounds of the shards. */
START_TEST(serving_tasks) {
  ck_assert_int_eq(cm_layout_serve_shard(5, 2), 1);
  ck_assert_int_eq(cm_layout_serve_replica(5, 2), 2);
  ck_assert_int_eq(cm_layout_serve_task(1, 2, 2), 5);
  for (int j = 0; j < 12; j++)
    ck_assert_int_eq(cm_layout_serve_task(cm_layout_serve_shard(j, 3),
                                          cm_layout_serve_replica(j, 3), 3),
                     j);
  ck_assert_int_eq(cm_layout_serve_replicas(6, 3), 2);
  ck_assert_int_eq(cm_layout_serve_replicas(3, 3), 1);
  ck_assert_int_eq(cm_layout_serve_replicas(5, 3), 0);
  ck_assert_int_eq(cm_layout_serve_replicas(2, 3), 0);
}
END_TEST

/* ---- The rules' properties ---- */

static void check_split(int64_t rows, int n) {
  int64_t next = 0, lo = rows, hi = 0;
  for (int s = 0; s < n; s++) {
    int64_t b, e;
    cm_layout_rows(rows, CM_LAYOUT_SPLIT, n, s, &b, &e);
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
  cm_layout_rows(10, CM_LAYOUT_SPLIT, 3, 0, &b, &e);
  ck_assert_int_eq(b, 0);
  ck_assert_int_eq(e, 3);
  cm_layout_rows(10, CM_LAYOUT_SPLIT, 3, 2, &b, &e);
  ck_assert_int_eq(b, 6);
  ck_assert_int_eq(e, 10);
}
END_TEST

START_TEST(more_shards_than_rows) {
  int nonempty = 0;
  check_split(3, 8);
  for (int s = 0; s < 8; s++) {
    int64_t b, e;
    cm_layout_rows(3, CM_LAYOUT_SPLIT, 8, s, &b, &e);
    nonempty += e > b;
  }
  ck_assert_int_eq(nonempty, 3);
  check_split(1, 4);
}
END_TEST

START_TEST(whole_placement_and_bad_input) {
  int64_t b, e;
  cm_layout_rows(50, 1, 3, 1, &b, &e);
  ck_assert_int_eq(b, 0);
  ck_assert_int_eq(e, 50);
  cm_layout_rows(50, 1, 3, 0, &b, &e);
  ck_assert_int_eq(e - b, 0);
  cm_layout_rows(50, CM_LAYOUT_SPLIT, 3, 5, &b, &e); /* no such shard */
  ck_assert_int_eq(e - b, 0);
  cm_layout_rows(0, CM_LAYOUT_SPLIT, 3, 0, &b, &e);
  ck_assert_int_eq(e - b, 0);
}
END_TEST

START_TEST(auto_balances_bytes) {
  /* The demo MLP: 784x256 kernel, biases, 256x128, 128x10. */
  uint64_t bytes[] = {784 * 256 * 4, 256 * 4,      128 * 256 * 4,
                      128 * 4,       10 * 128 * 4, 10 * 4};
  int place[6], again[6];
  cm_layout_auto(bytes, 6, 2, 256 << 10, place);
  ck_assert_int_eq(place[0], CM_LAYOUT_SPLIT); /* 784 KiB: split */
  uint64_t load[2] = {bytes[0] / 2, bytes[0] / 2};
  for (int i = 1; i < 6; i++) {
    ck_assert(place[i] == 0 || place[i] == 1);
    load[place[i]] += bytes[i];
  }
  /* Greedy: no shard carries more than the other plus the largest whole var. */
  uint64_t d = load[0] > load[1] ? load[0] - load[1] : load[1] - load[0];
  ck_assert_uint_le(d, bytes[2]);
  cm_layout_auto(bytes, 6, 2, 256 << 10, again);
  for (int i = 0; i < 6; i++)
    ck_assert_int_eq(place[i], again[i]);
  /* One shard: everything split (that is, whole on shard 0). */
  cm_layout_auto(bytes, 6, 1, 256 << 10, place);
  for (int i = 0; i < 6; i++)
    ck_assert_int_eq(place[i], CM_LAYOUT_SPLIT);
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
  int a = cm_layout_by_name("layer1/bias", 1024, 4, 256 << 10);
  ck_assert(a >= 0 && a < 4);
  ck_assert_int_eq(cm_layout_by_name("layer1/bias", 1024, 4, 256 << 10), a);
  /* Large, or one shard: split. */
  ck_assert_int_eq(cm_layout_by_name("big", 256 << 10, 4, 256 << 10),
                   CM_LAYOUT_SPLIT);
  ck_assert_int_eq(cm_layout_by_name("small", 4, 1, 256 << 10),
                   CM_LAYOUT_SPLIT);
  /* FNV-1a of "a" is 0xaf63dc4c8601ec8c: shard 0 of 2, 2 of 3. */
  ck_assert_int_eq(cm_layout_by_name("a", 4, 2, 256 << 10), 0);
  ck_assert_int_eq(cm_layout_by_name("a", 4, 3, 256 << 10),
                   (int)(0xaf63dc4c8601ec8cull % 3));
  /* Spread: 64 names over 4 shards leave no shard empty. */
  int seen[4] = {0};
  char name[16];
  for (int i = 0; i < 64; i++) {
    snprintf(name, sizeof name, "v%d", i);
    seen[cm_layout_by_name(name, 64, 4, 256 << 10)]++;
  }
  for (int s = 0; s < 4; s++)
    ck_assert_int_gt(seen[s], 0);
}
END_TEST

/* The one rule of a moved layout (the reshard cut and the client): what
 * the declaration asked for, not what one count happens to hold. */
START_TEST(replace_keeps_what_was_declared) {
  int a2 = cm_layout_by_name("a", 4, 2, CM_LAYOUT_SPLIT_BYTES);
  int a3 = cm_layout_by_name("a", 4, 3, CM_LAYOUT_SPLIT_BYTES);
  /* Declared split: split again after one shard, where all looks split. */
  ck_assert_int_eq(
      cm_layout_replace(CM_LAYOUT_SPLIT, CM_LAYOUT_SPLIT, 1, "a", 4, 2),
      CM_LAYOUT_SPLIT);
  ck_assert_int_eq(
      cm_layout_replace(CM_LAYOUT_SPLIT, CM_LAYOUT_SPLIT, 3, "a", 4, 1),
      CM_LAYOUT_SPLIT);
  /* Declared on shard 2: by name on 2 shards, back on 2 with 3; on 0,
   * through one shard and back. */
  ck_assert_int_eq(cm_layout_replace(2, 2, 3, "a", 4, 2), a2);
  ck_assert_int_eq(cm_layout_replace(2, a2, 2, "a", 4, 3), 2);
  ck_assert_int_eq(cm_layout_replace(0, 0, 2, "a", 4, 1), 0);
  ck_assert_int_eq(cm_layout_replace(0, 0, 1, "a", 4, 3), 0);
  /* By name or auto: by name, split when large. */
  ck_assert_int_eq(
      cm_layout_replace(CM_LAYOUT_NAME, CM_LAYOUT_SPLIT, 1, "a", 4, 3), a3);
  ck_assert_int_eq(cm_layout_replace(CM_LAYOUT_AUTO, 1, 2, "a", 4, 3), a3);
  ck_assert_int_eq(cm_layout_replace(CM_LAYOUT_NAME, CM_LAYOUT_SPLIT, 2, "big",
                                     CM_LAYOUT_SPLIT_BYTES, 3),
                   CM_LAYOUT_SPLIT);
  /* Not said (an older manifest): split stays split, but from one shard. */
  ck_assert_int_eq(
      cm_layout_replace(CM_LAYOUT_UNSAID, CM_LAYOUT_SPLIT, 2, "a", 4, 3),
      CM_LAYOUT_SPLIT);
  ck_assert_int_eq(
      cm_layout_replace(CM_LAYOUT_UNSAID, CM_LAYOUT_SPLIT, 1, "a", 4, 3), a3);
  ck_assert_int_eq(cm_layout_replace(CM_LAYOUT_UNSAID, 1, 2, "a", 4, 3), a3);
}
END_TEST

static Suite *layout_suite(void) {
  Suite *s = suite_create("layout");
  TCase *pin = tcase_create("pinned");
  tcase_add_test(pin, row_rule_pinned);
  tcase_add_test(pin, buckets_pinned);
  tcase_add_test(pin, buckets_balance_and_move_least);
  tcase_add_test(pin, rows_moved_two_to_three);
  tcase_add_test(pin, moves_bucket_by_bucket);
  tcase_add_test(pin, rule_names);
  tcase_add_test(pin, name_hash_is_fnv1a);
  tcase_add_test(pin, placement_pinned);
  tcase_add_test(pin, serving_tasks);
  suite_add_tcase(s, pin);
  TCase *tc = tcase_create("rows");
  tcase_add_test(tc, split_even_and_uneven);
  tcase_add_test(tc, more_shards_than_rows);
  tcase_add_test(tc, whole_placement_and_bad_input);
  tcase_add_test(tc, auto_balances_bytes);
  tcase_add_test(tc, by_name_ignores_order_and_others);
  tcase_add_test(tc, replace_keeps_what_was_declared);
  suite_add_tcase(s, tc);
  TCase *shape = tcase_create("shape");
  tcase_add_test(shape, numel_counts_and_bounds);
  suite_add_tcase(s, shape);
  return s;
}

int main(void) { return tu_run(layout_suite(), 0); }
