/* The layout's rules that are not inline (layout.h): the row map, a
 * name's hash, the row ranges of a variable, and its placement by load, by
 * name and after a reshard. */
#include "layout.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Buckets ordered by their own hash (ties by index): the order in which
 * each shard gives buckets away when the count grows. */
static int by_hash(const void *a, const void *b) {
  unsigned x = *(const unsigned *)a, y = *(const unsigned *)b;
  uint64_t hx = cm_splitmix64_at(x), hy = cm_splitmix64_at(y);
  return hx < hy ? -1 : hx > hy ? 1 : (x > y) - (x < y);
}

/* The bucket map of nshards shards, built from 1 shard up: at each count
 * k -> k + 1 every old shard keeps floor(B / (k + 1)) buckets, the first
 * B mod (k + 1) of them (most buckets first, then lowest index) one more,
 * and gives the rest, first in by_hash order, to shard k. */
static void buckets_of(uint16_t *shard, int nshards) {
  unsigned order[CM_LAYOUT_BUCKETS];
  int count[CM_LAYOUT_MAX_SHARDS + 1], give[CM_LAYOUT_MAX_SHARDS + 1];
  for (unsigned b = 0; b < CM_LAYOUT_BUCKETS; b++) {
    shard[b] = 0;
    order[b] = b;
  }
  qsort(order, CM_LAYOUT_BUCKETS, sizeof *order, by_hash);
  count[0] = CM_LAYOUT_BUCKETS;
  for (int k = 1; k < nshards; k++) {
    int q = (int)(CM_LAYOUT_BUCKETS / (unsigned)(k + 1));
    int r = (int)(CM_LAYOUT_BUCKETS % (unsigned)(k + 1));
    /* The r shards that keep q + 1: those holding more first. */
    for (int s = 0; s < k; s++)
      give[s] = count[s] - q;
    for (int extra = 0; extra < r; extra++) {
      int best = -1;
      for (int s = 0; s < k; s++)
        if (give[s] == count[s] - q && (best < 0 || count[s] > count[best]))
          best = s;
      give[best]--;
    }
    count[k] = 0;
    for (unsigned i = 0; i < CM_LAYOUT_BUCKETS; i++) {
      unsigned b = order[i];
      if (give[shard[b]] > 0) {
        give[shard[b]]--;
        count[shard[b]]--;
        shard[b] = (uint16_t)k;
        count[k]++;
      }
    }
  }
}

void cm_layout_map_init(struct cm_layout_map *m, int rule, int nshards) {
  rule = rule == CM_LAYOUT_RULE_MODULO ? rule : CM_LAYOUT_RULE_BUCKETS;
  m->nshards = nshards;
  m->rule = rule;
  if (rule == CM_LAYOUT_RULE_BUCKETS)
    buckets_of(m->shard, nshards);
  else
    memset(m->shard, 0, sizeof m->shard);
}

void cm_layout_map_of(struct cm_layout_map *m, int rule, int nshards,
                      int move_to, int moved) {
  if (move_to > 0 && move_to != nshards && rule != CM_LAYOUT_RULE_MODULO)
    cm_layout_map_moving(m, nshards, move_to, moved);
  else
    cm_layout_map_init(m, rule, nshards);
}

/* A move's place in the order: its shard in the smaller count's map, then
 * in the larger's, then its bucket, packed in one key (the bucket in the
 * low 12 bits). */
static int cmp_key(const void *x, const void *y) {
  uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
  return a < b ? -1 : a > b;
}

int cm_layout_moves(int from, int to, uint16_t *buckets) {
  uint16_t a[CM_LAYOUT_BUCKETS], b[CM_LAYOUT_BUCKETS];
  uint64_t key[CM_LAYOUT_BUCKETS];
  int n = 0;
  /* a: the smaller count's map, b: the larger's; the same moves, in the
   * same order, both ways. */
  buckets_of(a, from < to ? from : to);
  buckets_of(b, from < to ? to : from);
  for (unsigned k = 0; k < CM_LAYOUT_BUCKETS; k++)
    if (a[k] != b[k])
      key[n++] = (uint64_t)a[k] << 40 | (uint64_t)b[k] << 20 | k;
  qsort(key, (size_t)n, sizeof *key, cmp_key);
  for (int i = 0; i < n; i++)
    buckets[i] = (uint16_t)(key[i] & (CM_LAYOUT_BUCKETS - 1));
  return n;
}

int cm_layout_map_moving(struct cm_layout_map *m, int from, int to, int done) {
  uint16_t target[CM_LAYOUT_BUCKETS], mv[CM_LAYOUT_BUCKETS];
  int n = cm_layout_moves(from, to, mv);
  m->rule = CM_LAYOUT_RULE_BUCKETS;
  buckets_of(m->shard, from);
  buckets_of(target, to);
  for (int i = 0; i < n && i < done; i++)
    m->shard[mv[i]] = target[mv[i]];
  m->nshards = done >= n ? to : (from > to ? from : to);
  return n;
}

const char *cm_layout_rule_name(int rule) {
  return rule == CM_LAYOUT_RULE_MODULO ? "modulo" : "buckets";
}

int cm_layout_rule_parse(const char *name) {
  if (name && !strcmp(name, "buckets"))
    return CM_LAYOUT_RULE_BUCKETS;
  if (name && !strcmp(name, "modulo"))
    return CM_LAYOUT_RULE_MODULO;
  return 0;
}

const char *cm_layout_map_text(const struct cm_layout_map *m, char *buf,
                               size_t len) {
  if (m->rule == CM_LAYOUT_RULE_MODULO)
    snprintf(buf, len, "splitmix64(id) %% %d", m->nshards);
  else
    snprintf(buf, len, "bucket splitmix64(id) >> %d of %d shards' map",
             64 - CM_LAYOUT_BUCKET_BITS, m->nshards);
  return buf;
}

uint64_t cm_layout_name_hash(const char *name) {
  uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a 64's offset basis */
  for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
    h ^= *p;
    h *= 0x100000001b3ull; /* FNV's 64-bit prime */
  }
  return h;
}

void cm_layout_rows(int64_t rows, int placement, int nshards, int shard,
                    int64_t *begin, int64_t *end) {
  if (rows <= 0 || nshards <= 0 || shard < 0 || shard >= nshards) {
    *begin = *end = 0;
    return;
  }
  if (placement >= 0) {
    *begin = 0;
    *end = placement == shard ? rows : 0;
    return;
  }
  /* floor(s * rows / n): sizes differ by at most one row. */
  *begin = (int64_t)((__int128)rows * shard / nshards);
  *end = (int64_t)((__int128)rows * (shard + 1) / nshards);
}

void cm_layout_auto(const uint64_t *bytes, int n, int nshards,
                    uint64_t split_bytes, int *placement) {
  uint64_t load[256] = {0};
  int cap = nshards < 256 ? nshards : 256;

  for (int i = 0; i < n; i++) {
    if (nshards <= 1 || bytes[i] >= split_bytes || cap < nshards) {
      placement[i] = CM_LAYOUT_SPLIT;
      for (int s = 0; s < cap; s++)
        load[s] += bytes[i] / (uint64_t)nshards;
      continue;
    }
    int best = 0;
    for (int s = 1; s < cap; s++)
      if (load[s] < load[best])
        best = s;
    placement[i] = best;
    load[best] += bytes[i];
  }
}

int cm_layout_by_name(const char *name, uint64_t bytes, int nshards,
                      uint64_t split_bytes) {
  if (nshards <= 1 || bytes >= split_bytes)
    return CM_LAYOUT_SPLIT;
  return (int)(cm_layout_name_hash(name) % (uint64_t)nshards);
}

int cm_layout_replace(int asked, int held, int from, const char *name,
                      uint64_t bytes, int to) {
  if (asked == CM_LAYOUT_SPLIT)
    return CM_LAYOUT_SPLIT;
  if (asked >= 0 && asked < to)
    return asked;
  /* On one shard split and whole look alike: only a declaration says. */
  if (asked < 0 && held == CM_LAYOUT_SPLIT && from > 1)
    return CM_LAYOUT_SPLIT;
  return cm_layout_by_name(name, bytes, to, CM_LAYOUT_SPLIT_BYTES);
}

int cm_layout_asked_from_wire(int32_t wire) {
  return wire == 0 ? CM_LAYOUT_UNSAID : wire > 0 ? wire - 1 : wire;
}

int32_t cm_layout_asked_to_wire(int asked) {
  return asked == CM_LAYOUT_UNSAID ? 0 : asked >= 0 ? asked + 1 : asked;
}
