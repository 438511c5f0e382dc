/* Deterministic random inputs for the numeric suites (test-kernels,
 * test-kernels-cuda, test-optim): one xorshift, so that a CPU oracle, its
 * GPU twin and the optimizer updates see the same numbers for a seed. */
#ifndef TU_FRAND_H
#define TU_FRAND_H

#include <stddef.h>

/* Uniform in [-1, 1) from a 32-bit xorshift that advances *s;
 * deterministic per seed. */
float tu_frand(unsigned *s);

/* n random floats in [-1, 1) (in [0, 1) with positive) from seed, never
 * NULL, even for n == 0 (check fails the test when out of memory); the
 * caller frees it. */
float *tu_frandv(size_t n, unsigned seed, int positive);

#endif
