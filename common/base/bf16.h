/* bfloat16 on the wire (job.wire_dtype "bf16"): pulls and pushes travel as
 * the top 16 bits of each f32, rounded to nearest with ties to even, while
 * shards keep f32 values and optimizer state. Halving the bytes halves the
 * copies through the kernel and gRPC that bound a step's communication
 * (docs/performance.md). */
#ifndef CM_BF16_H
#define CM_BF16_H

#include <stddef.h>
#include <stdint.h>

/* Bytes per element on the wire for each job.wire_dtype. */
#define CM_BF16_BYTES 2

/* The bfloat16 nearest to x, ties to even. NaN stays NaN (quieted, sign
 * kept), infinities stay infinite, and a finite value rounds to an
 * infinity only beyond bfloat16's largest (3.39e38), as IEEE rounding
 * does. */
static inline uint16_t cm_bf16_from_f32_one(uint32_t u) {
  /* Branch-free, so that loops over it vectorize: the rounded value, or
   * for a NaN its upper half with the quiet bit set. */
  uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  uint32_t q = (u >> 16) | 0x0040u;
  return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? q : r);
}

/* Rounds n floats of src into dst (n bfloat16s, little-endian). One pass
 * that the compiler vectorizes (bf16.c is built with -O3). */
void cm_bf16_from_f32(uint16_t *dst, const float *src, size_t n);

/* Widens n bfloat16s of src (little-endian, any alignment: a received
 * slice's bytes) into dst: exact. */
void cm_bf16_to_f32(float *dst, const void *src, size_t n);

#endif
