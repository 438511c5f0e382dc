/* How many elements a variable's shape makes (cm_numel): the one count of
 * a variable's elements that shards, the client and workers all use. Where
 * its rows live is the layout's (common/layout/layout.h). */
#ifndef CM_SHAPE_H
#define CM_SHAPE_H

#include <stdint.h>

/* The elements of a tensor of shape[0..ndim) (1 when ndim is 0; a row's:
 * the shape past its first dimension). 0 when a dimension is not positive
 * or the count would pass max (UINT64_MAX: no bound); *bad (when not NULL)
 * is then that dimension's index, the first one at fault in order. */
uint64_t cm_numel(int ndim, const int64_t *shape, uint64_t max, int *bad);

#endif
