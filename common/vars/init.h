/* Initial values of variables, shared by psd (which creates them) and
 * dworker --standalone (which must start from the same model). Values come
 * from a counter-based generator keyed by (seed, variable name, global
 * element index), so they do not depend on how a variable is sharded. */
#ifndef CM_INIT_H
#define CM_INIT_H

#include <stdint.h>

enum cm_init_kind { CM_INIT_ZEROS = 0, CM_INIT_UNIFORM = 1 };

/* Fills dst[0..n) with elements [first, first + n) of variable `name`:
 * zeros, or uniform in [-scale, scale). */
void cm_init_fill(float *dst, uint64_t first, uint64_t n,
                  enum cm_init_kind kind, float scale, uint64_t seed,
                  const char *name);

#endif
