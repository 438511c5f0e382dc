/* Counter-based initial values (init.h): splitmix64 of a key made from the
 * seed and the name's FNV-1a hash, plus the element's global index. */
#include "init.h"

#include <string.h>

#include "rand.h"

static uint64_t name_hash(const char *name) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (; *name; name++)
    h = (h ^ (uint8_t)*name) * 0x100000001b3ULL;
  return h;
}

void cm_init_fill(float *dst, uint64_t first, uint64_t n,
                  enum cm_init_kind kind, float scale, uint64_t seed,
                  const char *name) {
  if (kind != CM_INIT_UNIFORM) {
    memset(dst, 0, n * sizeof *dst);
    return;
  }
  uint64_t key = cm_splitmix64_at(seed ^ name_hash(name));
  for (uint64_t i = 0; i < n; i++) {
    uint64_t r = cm_splitmix64_at(key + first + i);
    float u = (float)(r >> 40) * (1.0f / 16777216.0f); /* [0, 1) */
    dst[i] = (2.0f * u - 1.0f) * scale;
  }
}
