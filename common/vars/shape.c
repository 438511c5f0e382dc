/* A shape's element count, bounded (shape.h). */
#include "shape.h"

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
