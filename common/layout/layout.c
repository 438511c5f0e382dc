/* Row partitioning of variables across shards, and their element counts
 * (see shard.h). */
#include "layout.h"

uint64_t cm_numel(int ndim, const int64_t *shape, uint64_t max, int *bad) {
  uint64_t n = 1;
  for (int d = 0; d < ndim; d++) {
    /* n * shape[d] <= max without overflowing. */
    if (shape[d] <= 0 || (uint64_t)shape[d] > max / n) {
      if (bad)
        *bad = d;
      return 0;
    }
    n *= (uint64_t)shape[d];
  }
  return n;
}

void cm_shard_rows(int64_t rows, int placement, int nshards, int shard,
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

void cm_shard_auto(const uint64_t *bytes, int n, int nshards,
                   uint64_t split_bytes, int *placement) {
  uint64_t load[256] = {0};
  int cap = nshards < 256 ? nshards : 256;

  for (int i = 0; i < n; i++) {
    if (nshards <= 1 || bytes[i] >= split_bytes || cap < nshards) {
      placement[i] = CM_SHARD_SPLIT;
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

int cm_shard_by_name(const char *name, uint64_t bytes, int nshards,
                     uint64_t split_bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  if (nshards <= 1 || bytes >= split_bytes)
    return CM_SHARD_SPLIT;
  for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
    h ^= *p;
    h *= 0x100000001b3ull;
  }
  return (int)(h % (uint64_t)nshards);
}

int cm_shard_replace(int asked, int held, int from, const char *name,
                     uint64_t bytes, int to) {
  if (asked == CM_SHARD_SPLIT)
    return CM_SHARD_SPLIT;
  if (asked >= 0 && asked < to)
    return asked;
  /* On one shard split and whole look alike: only a declaration says. */
  if (asked < 0 && held == CM_SHARD_SPLIT && from > 1)
    return CM_SHARD_SPLIT;
  return cm_shard_by_name(name, bytes, to, CM_SHARD_SPLIT_BYTES);
}

int cm_shard_asked_from_wire(int32_t wire) {
  return wire == 0 ? CM_SHARD_UNSAID : wire > 0 ? wire - 1 : wire;
}

int32_t cm_shard_asked_to_wire(int asked) {
  return asked == CM_SHARD_UNSAID ? 0 : asked >= 0 ? asked + 1 : asked;
}
