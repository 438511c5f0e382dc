/* Per-row optimizers (rowopt.h): the formulas in float, in the order the
 * header writes them, with constants computed in double and rounded once
 * (common/meson.build builds this file without fused multiply-adds). */
#include "rowopt.h"

#include <math.h>
#include <string.h>

/* FTRL's denominator d = (beta + sqrt(n))/lr + l2, in float. */
static float ftrl_den(float n, float beta, float lr, float l2) {
  return (beta + sqrtf(n)) / lr + l2;
}

void cm_rowopt_init_state(const struct cm_rowopt *o, uint32_t dim,
                          const float *w, float *state) {
  uint32_t n = cm_rowopt_nstate(o->type, dim);
  float a = (float)o->initial_accumulator;
  switch (o->type) {
  case CM_ROWOPT_ADAGRAD:
  case CM_ROWOPT_ROWWISE_ADAGRAD:
    for (uint32_t i = 0; i < n; i++)
      state[i] = a;
    break;
  case CM_ROWOPT_FTRL: {
    /* n = initial_accumulator; z such that w(z, n) is the initial w. */
    const float lr = (float)o->lr, l1 = (float)o->l1, l2 = (float)o->l2,
                beta = (float)o->ftrl_beta, d = ftrl_den(a, beta, lr, l2);
    for (uint32_t i = 0; i < dim; i++) {
      state[i] = w[i] == 0.0f ? 0.0f : -(w[i] * d + copysignf(l1, w[i]));
      state[dim + i] = a;
    }
    break;
  }
  default:
    memset(state, 0, n * sizeof *state);
    break;
  }
}

void cm_rowopt_apply(const struct cm_rowopt *o, uint32_t dim, float *w,
                     float *state, uint32_t *t, const float *g) {
  const float lr = (float)o->lr, eps = (float)o->eps;
  *t += 1;
  switch (o->type) {
  case CM_ROWOPT_SGD:
    for (uint32_t i = 0; i < dim; i++)
      w[i] = w[i] - lr * g[i];
    break;
  case CM_ROWOPT_ADAGRAD:
    for (uint32_t i = 0; i < dim; i++) {
      state[i] = state[i] + g[i] * g[i];
      w[i] = w[i] - (lr * g[i]) / (sqrtf(state[i]) + eps);
    }
    break;
  case CM_ROWOPT_ROWWISE_ADAGRAD: {
    float s = 0;
    for (uint32_t i = 0; i < dim; i++)
      s = s + g[i] * g[i];
    state[0] = state[0] + s / (float)dim;
    float d = sqrtf(state[0]) + eps;
    for (uint32_t i = 0; i < dim; i++)
      w[i] = w[i] - (lr * g[i]) / d;
    break;
  }
  case CM_ROWOPT_ADAM: {
    /* As kn_adam_consts: 1 - b in double, then rounded (not 1 - f32(b),
     * which is 1.3e-5 off for b2 = 0.999). */
    const double tt = (double)*t;
    const float b1 = (float)o->beta1, b2 = (float)o->beta2,
                omb1 = (float)(1.0 - o->beta1), omb2 = (float)(1.0 - o->beta2),
                step = (float)(o->lr / (1.0 - pow(o->beta1, tt))),
                rbc2 = (float)(1.0 / sqrt(1.0 - pow(o->beta2, tt)));
    float *m = state, *v = state + dim;
    for (uint32_t i = 0; i < dim; i++) {
      m[i] = b1 * m[i] + omb1 * g[i];
      v[i] = b2 * v[i] + omb2 * (g[i] * g[i]);
      w[i] = w[i] - step * (m[i] / (sqrtf(v[i]) * rbc2 + eps));
    }
    break;
  }
  case CM_ROWOPT_FTRL: {
    const float l1 = (float)o->l1, l2 = (float)o->l2,
                beta = (float)o->ftrl_beta;
    float *z = state, *n = state + dim;
    for (uint32_t i = 0; i < dim; i++) {
      float n1 = n[i] + g[i] * g[i];
      float sigma = (sqrtf(n1) - sqrtf(n[i])) / lr;
      z[i] = z[i] + (g[i] - sigma * w[i]);
      n[i] = n1;
      if (fabsf(z[i]) <= l1)
        w[i] = 0.0f;
      else
        w[i] = -(z[i] - copysignf(l1, z[i])) / ftrl_den(n1, beta, lr, l2);
    }
    break;
  }
  default:
    break;
  }
}
