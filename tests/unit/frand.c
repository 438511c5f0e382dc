/* Deterministic random inputs for the numeric suites (frand.h). */
#include "frand.h"

#include <check.h>
#include <math.h>
#include <stdlib.h>

float tu_frand(unsigned *s) {
  *s ^= *s << 13;
  *s ^= *s >> 17;
  *s ^= *s << 5;
  return (float)(*s >> 8) / (float)(1 << 23) - 1.0f;
}

float *tu_frandv(size_t n, unsigned seed, int positive) {
  float *v = malloc((n ? n : 1) * sizeof *v);

  ck_assert_ptr_nonnull(v);
  for (size_t i = 0; i < n; i++) {
    v[i] = tu_frand(&seed);
    if (positive)
      v[i] = fabsf(v[i]);
  }
  return v;
}
