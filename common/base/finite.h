/* Finding NaN and infinities in a gradient fast: psd checks each push
 * message it receives (job.nonfinite), libpsclient a whole gradient before
 * it sends any of it. */
#ifndef CM_FINITE_H
#define CM_FINITE_H

#include <stddef.h>

/* Position of the first NaN or infinity in g[0..n), or n when there is none.
 * One pass that the compiler vectorizes (about 35 GB/s from memory here). */
size_t cm_first_nonfinite(const float *g, size_t n);

/* Copies n floats from src to dst (not overlapping) and returns the
 * position of the first NaN or infinity among them, or n: the copy and the
 * scan in one pass, for a push that is copied anyway (the shared-memory
 * path, docs/wire.md). The whole of src is copied in either case. */
size_t cm_copy_first_nonfinite(float *dst, const float *src, size_t n);

#endif
