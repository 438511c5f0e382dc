/* Per-row optimizers for embedding tables (tabconf.h names them): the
 * update of one row of `dim` floats, its state beside it. Pure functions
 * over plain arrays, used by psd's tables and by the in-memory baseline of
 * bench sparse. Each is its published formula, computed in float in the
 * order written below; the unit tests check them against a double-precision
 * transcription of the formula.
 *
 *   sgd              w -= lr g
 *   adagrad          a += g^2;           w -= lr g / (sqrt(a) + eps)
 *   rowwise_adagrad  a += sum(g^2)/dim;  w -= lr g / (sqrt(a) + eps)
 *   adam (lazy)      t += 1; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 *                    w -= lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
 *                    (t is the row's own count of updates)
 *   ftrl             sigma = (sqrt(n + g^2) - sqrt(n)) / lr
 *                    z += g - sigma w;  n += g^2
 *                    w = 0 if |z| <= l1, else
 *                        -(z - sign(z) l1) / ((beta + sqrt(n)) / lr + l2)
 */
#ifndef CM_ROWOPT_H
#define CM_ROWOPT_H

#include <stdint.h>

#include "tabconf.h"

/* Fills a new row's state (cm_rowopt_nstate(o->type, dim) floats): the
 * accumulators with initial_accumulator (adagrad, rowwise_adagrad, ftrl's
 * n), the rest with zeros. */
void cm_rowopt_init_state(const struct cm_rowopt *o, uint32_t dim,
                          float *state);

/* Applies o to row w (dim floats) with gradient g (dim floats) and the
 * row's state; *t is the row's update count (Adam's t), incremented. */
void cm_rowopt_apply(const struct cm_rowopt *o, uint32_t dim, float *w,
                     float *state, uint32_t *t, const float *g);

#endif
