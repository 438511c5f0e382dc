/* The layout's rules that are not inline (layout.h): a name's hash, the
 * row ranges of a variable, and its placement by load, by name and after a
 * reshard. */
#include "layout.h"

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
