/* bfloat16 conversions (bf16.h). The wire is little-endian, as this host
 * is (x86-64, arm64: psd's targets); memcpy keeps any alignment legal and
 * still vectorizes. */
#include "bf16.h"

#include <string.h>

void cm_bf16_from_f32(uint16_t *dst, const float *src, size_t n) {
  for (size_t i = 0; i < n; i++) {
    uint32_t u;
    memcpy(&u, &src[i], sizeof u);
    dst[i] = cm_bf16_from_f32_one(u);
  }
}

void cm_bf16_to_f32(float *dst, const void *src, size_t n) {
  const uint8_t *s = src;
  for (size_t i = 0; i < n; i++) {
    uint16_t h;
    uint32_t u;
    memcpy(&h, s + 2 * i, sizeof h);
    u = (uint32_t)h << 16;
    memcpy(&dst[i], &u, sizeof u);
  }
}
