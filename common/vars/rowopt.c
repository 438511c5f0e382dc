/* Per-row optimizers (rowopt.h): the formulas, in float, in the order the
 * header writes them. */
#include "rowopt.h"

#include <math.h>
#include <string.h>

void cm_rowopt_init_state(const struct cm_rowopt *o, uint32_t dim,
                          float *state) {
  uint32_t n = cm_rowopt_nstate(o->type, dim);
  float a = (float)o->initial_accumulator;
  switch (o->type) {
  case CM_ROWOPT_ADAGRAD:
  case CM_ROWOPT_ROWWISE_ADAGRAD:
    for (uint32_t i = 0; i < n; i++)
      state[i] = a;
    break;
  case CM_ROWOPT_FTRL: /* z = 0, n = initial_accumulator */
    memset(state, 0, dim * sizeof *state);
    for (uint32_t i = 0; i < dim; i++)
      state[dim + i] = a;
    break;
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
      w[i] -= lr * g[i];
    break;
  case CM_ROWOPT_ADAGRAD:
    for (uint32_t i = 0; i < dim; i++) {
      state[i] += g[i] * g[i];
      w[i] -= lr * g[i] / (sqrtf(state[i]) + eps);
    }
    break;
  case CM_ROWOPT_ROWWISE_ADAGRAD: {
    float s = 0;
    for (uint32_t i = 0; i < dim; i++)
      s += g[i] * g[i];
    state[0] += s / (float)dim;
    float d = sqrtf(state[0]) + eps;
    for (uint32_t i = 0; i < dim; i++)
      w[i] -= lr * g[i] / d;
    break;
  }
  case CM_ROWOPT_ADAM: {
    const float b1 = (float)o->beta1, b2 = (float)o->beta2;
    const float c1 = (float)(1.0 - pow(o->beta1, (double)*t));
    const float c2 = (float)(1.0 - pow(o->beta2, (double)*t));
    float *m = state, *v = state + dim;
    for (uint32_t i = 0; i < dim; i++) {
      m[i] = b1 * m[i] + (1.0f - b1) * g[i];
      v[i] = b2 * v[i] + (1.0f - b2) * g[i] * g[i];
      w[i] -= lr * (m[i] / c1) / (sqrtf(v[i] / c2) + eps);
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
      z[i] += g[i] - sigma * w[i];
      n[i] = n1;
      if (fabsf(z[i]) <= l1)
        w[i] = 0.0f;
      else
        w[i] =
            -(z[i] - (z[i] > 0 ? l1 : -l1)) / ((beta + sqrtf(n[i])) / lr + l2);
    }
    break;
  }
  default:
    break;
  }
}
