/* Per-row optimizers for embedding tables (tabconf.h names them): the
 * update of one row of `dim` floats, its state beside it. Pure functions
 * over plain arrays, used by psd's tables and by the in-memory baseline of
 * bench sparse. The unit tests check them against a double-precision
 * transcription of each formula.
 *
 * As the dense optimizers do (kernels/optim.h), every constant is computed
 * in double from the configured (double) hyper-parameters and rounded once
 * to float; each element is then updated in float, with IEEE sqrt and no
 * fused multiply-add, in exactly the order written here (docs/tables.md
 * gives the same order, so a client can replay an update bit for bit):
 *
 *   sgd              w = w - lr*g
 *   adagrad          a = a + g*g;  w = w - (lr*g) / (sqrt(a) + eps)
 *   rowwise_adagrad  s = (..((g0*g0 + g1*g1) + g2*g2) ..);  a = a + s/dim;
 *                    w = w - (lr*g) / (sqrt(a) + eps)
 *   adam (lazy)      t = t + 1;  m = b1*m + omb1*g;  v = b2*v + omb2*(g*g);
 *                    w = w - step * (m / (sqrt(v)*rbc2 + eps))
 *                    constants: omb1 = 1 - b1, omb2 = 1 - b2,
 *                    step = lr / (1 - b1^t), rbc2 = 1 / sqrt(1 - b2^t)
 *                    (t is the row's own count of updates)
 *   ftrl             n1 = n + g*g;  sigma = (sqrt(n1) - sqrt(n)) / lr;
 *                    z = z + (g - sigma*w);  n = n1;
 *                    w = 0 if |z| <= l1, else
 *                        -(z - sign(z)*l1) / ((beta + sqrt(n))/lr + l2)
 *
 * FTRL-Proximal (McMahan et al. 2013) holds w as a function of z and n. A
 * new row starts consistent with that: n = initial_accumulator, and z such
 * that the formula gives the row's initial value w0:
 *   z = 0 when w0 = 0, else z = -(w0*d + copysign(l1, w0)) with
 *   d = (beta + sqrt(n))/lr + l2
 * (zeros as the initializer is McMahan's start, z = 0 and w = 0). */
#ifndef CM_ROWOPT_H
#define CM_ROWOPT_H

#include <stdint.h>

#include "tabconf.h"

/* Fills a new row's state (cm_rowopt_nstate(o->type, dim) floats) for its
 * initial value w (dim floats): the accumulators with initial_accumulator
 * (adagrad, rowwise_adagrad, ftrl's n), ftrl's z from w and n as above,
 * the rest (adam's m and v) with zeros. */
void cm_rowopt_init_state(const struct cm_rowopt *o, uint32_t dim,
                          const float *w, float *state);

/* Applies o to row w (dim floats) with gradient g (dim floats) and the
 * row's state; *t is the row's update count (Adam's t), incremented. */
void cm_rowopt_apply(const struct cm_rowopt *o, uint32_t dim, float *w,
                     float *state, uint32_t *t, const float *g);

#endif
