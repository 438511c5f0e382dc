/* Zipf-distributed ids for the sparse benchmarks (pstool sparse and
 * sparse_mem draw the same stream): rank r in 1..n with P(r) ~ r^-s, by
 * inverting the continuous Zipf CDF (close to the discrete one for the
 * sizes used), then spread over the u64 id space by a bijection, so hot ids
 * are not neighbours. */
#ifndef PS_ZIPF_H
#define PS_ZIPF_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "rand.h"

/* The id of rank r (1..n): a bijection of r, so ranks 1..n are n ids. */
static inline uint64_t zipf_id(uint64_t r) {
  return cm_mix64(r * 0x2545F4914F6CDD1Dull);
}

/* A rank in 1..n drawn with exponent s (> 1) from the generator *state. */
static inline uint64_t zipf_rank(uint64_t *state, uint64_t n, double s) {
  double u = (double)(cm_splitmix64(state) >> 11) * (1.0 / 9007199254740992.0);
  double a = 1.0 - s, top = pow((double)n, a);
  uint64_t r = (uint64_t)pow((top - 1.0) * u + 1.0, 1.0 / a);
  return r < 1 ? 1 : r > n ? n : r;
}

/* Ids of the timed phases, drawn before the clock starts (pow per id
 * would otherwise be timed too): a pool of ZIPF_POOL ids of ranks in 1..n,
 * cycled through. Returns a new array (free()), or NULL. */
#define ZIPF_POOL (1u << 20)
static inline uint64_t *zipf_pool(uint64_t seed, uint64_t n, double s) {
  uint64_t *p = (uint64_t *)malloc(ZIPF_POOL * sizeof *p), st = seed;
  for (size_t i = 0; p && i < ZIPF_POOL; i++)
    p[i] = zipf_id(zipf_rank(&st, n, s));
  return p;
}

#endif
