/* The per-row optimizers of embedding tables: the update of one row of dim
 * f32 and its state, beside the dense updates (optim.h). Pure math over
 * plain arrays: common/vars/optstep.c turns a table's configured optimizer
 * (common/spec/tabconf.h) into a kn_row_hp, lays the row's state out and
 * picks the function here. The CPU versions (rowopt_cpu.c) are the oracle;
 * no CUDA twin exists yet (psd updates rows on its CPU). One would follow
 * optim's layout: rowopt_cuda.h with these names plus _cuda and a kn_cuda
 * context first, rowopt_cuda.cu built with the other .cu files in
 * meson.build, using kn_row_adam_consts' floats as optim_cuda.cu uses
 * kn_adam_consts', checked against these in tests/unit/test-kernels-cuda.c.
 * Arrays must not overlap.
 *
 * As the dense updates do, every constant is computed in double from the
 * configured (double) hyper-parameters and rounded once to float; each
 * element is then updated in float, with IEEE sqrt and no fused
 * multiply-add, in exactly the order written here (docs/tables.md gives the
 * same order, so a client can replay an update bit for bit):
 *
 *   sgd              w = w - lr*g
 *   adagrad          a = a + g*g;  w = w - (lr*g) / (sqrt(a) + eps)
 *   rowwise_adagrad  s = (..((g0*g0 + g1*g1) + g2*g2) ..);  a = a + s/dim;
 *                    w = w - (lr*g) / (sqrt(a) + eps)
 *   adam (lazy)      m = b1*m + omb1*g;  v = b2*v + omb2*(g*g);
 *                    w = w - step * (m / (sqrt(v)*rbc2 + eps))
 *                    constants: omb1 = 1 - b1, omb2 = 1 - b2,
 *                    step = lr / (1 - b1^t), rbc2 = 1 / sqrt(1 - b2^t)
 *                    (t is the row's own count of updates, this one
 *                    included)
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
#ifndef KN_ROWOPT_H
#define KN_ROWOPT_H

#include <stdint.h>

#include "optim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The hyper-parameters of a per-row optimizer (those its rule does not use
 * are ignored). */
struct kn_row_hp {
  double lr;    /* learning rate (ftrl: alpha); double: adam's step
                   lr / (1 - b1^t) is computed from it in double, the
                   other rules use it rounded to float */
  double beta1; /* adam: first-moment decay b1 (double: 1 - b1 is rounded
                   to float from it) */
  double beta2; /* adam: second-moment decay b2 */
  float eps;    /* adagrad (both), adam: added to the denominator */
  float accum0; /* adagrad (both), ftrl: the accumulators' start (n0) */
  float l1;     /* ftrl: L1 strength */
  float l2;     /* ftrl: L2 strength */
  float beta;   /* ftrl: beta in the per-coordinate rate */
};

/* w, g are (dim): w = w - lr*g */
void kn_row_sgd(float *w, const float *g, uint32_t dim,
                const struct kn_row_hp *hp);

/* w, a, g are (dim): a = a + g*g; w = w - (lr*g) / (sqrt(a) + eps) */
void kn_row_adagrad(float *w, float *a, const float *g, uint32_t dim,
                    const struct kn_row_hp *hp);

/* w, g are (dim), a is (1): a = a + (sum of g*g in index order)/dim;
 * w = w - (lr*g) / (sqrt(a) + eps) */
void kn_row_rowwise_adagrad(float *w, float *a, const float *g, uint32_t dim,
                            const struct kn_row_hp *hp);

/* Fills c for update t (1-based) of a row: b1, b2, omb1, omb2, step and
 * rbc2 as above, each computed in double and rounded once; decay 1. */
void kn_row_adam_consts(struct kn_adam_consts *c, const struct kn_row_hp *hp,
                        uint32_t t);

/* w, m, v, g are (dim), t the row's update count with this one (>= 1):
 * m = b1*m + omb1*g; v = b2*v + omb2*(g*g);
 * w = w - step * (m / (sqrt(v)*rbc2 + eps)) */
void kn_row_adam(float *w, float *m, float *v, const float *g, uint32_t dim,
                 uint32_t t, const struct kn_row_hp *hp);

/* w, z, n are (dim): a new row's state for its initial value w:
 * n = accum0; z = 0 where w = 0, else -(w*d + copysign(l1, w)) */
void kn_row_ftrl_init(const float *w, float *z, float *n, uint32_t dim,
                      const struct kn_row_hp *hp);

/* w, z, n, g are (dim): the ftrl update above */
void kn_row_ftrl(float *w, float *z, float *n, const float *g, uint32_t dim,
                 const struct kn_row_hp *hp);

#ifdef __cplusplus
}
#endif

#endif
