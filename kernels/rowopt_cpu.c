/* CPU versions of the per-row optimizers (rowopt.h): the formulas in float,
 * in the order the header writes them, with constants computed in double
 * and rounded once. meson builds this file as it builds optim_cpu.c
 * (-ffp-contract=off: no multiply-add is fused; -fno-math-errno, which
 * only stops sqrtf setting errno and changes no float result). A row is at
 * most 1024 floats, so the loops are plain ones, without optim_cpu.c's
 * clones. */
#include "rowopt.h"

#include <math.h>

/* FTRL's denominator d = (beta + sqrt(n))/lr + l2, in float. */
static float kn__ftrl_den(float n, float beta, float lr, float l2) {
  return (beta + sqrtf(n)) / lr + l2;
}

void kn_row_sgd(float *w, const float *g, uint32_t dim,
                const struct kn_row_hp *hp) {
  const float lr = (float)hp->lr;

  for (uint32_t i = 0; i < dim; i++)
    w[i] = w[i] - lr * g[i];
}

void kn_row_adagrad(float *w, float *a, const float *g, uint32_t dim,
                    const struct kn_row_hp *hp) {
  const float lr = (float)hp->lr, eps = hp->eps;

  for (uint32_t i = 0; i < dim; i++) {
    a[i] = a[i] + g[i] * g[i];
    w[i] = w[i] - (lr * g[i]) / (sqrtf(a[i]) + eps);
  }
}

void kn_row_rowwise_adagrad(float *w, float *a, const float *g, uint32_t dim,
                            const struct kn_row_hp *hp) {
  const float lr = (float)hp->lr, eps = hp->eps;
  float s = 0;

  for (uint32_t i = 0; i < dim; i++)
    s = s + g[i] * g[i];
  a[0] = a[0] + s / (float)dim;
  float d = sqrtf(a[0]) + eps;
  for (uint32_t i = 0; i < dim; i++)
    w[i] = w[i] - (lr * g[i]) / d;
}

void kn_row_adam_consts(struct kn_adam_consts *c, const struct kn_row_hp *hp,
                        uint32_t t) {
  /* As kn_adam_consts: 1 - b in double, then rounded (not 1 - f32(b),
   * which is 1.3e-5 off for b2 = 0.999); but step from the double lr. */
  const double tt = (double)t;

  c->b1 = (float)hp->beta1;
  c->b2 = (float)hp->beta2;
  c->omb1 = (float)(1.0 - hp->beta1);
  c->omb2 = (float)(1.0 - hp->beta2);
  c->step = (float)(hp->lr / (1.0 - pow(hp->beta1, tt)));
  c->rbc2 = (float)(1.0 / sqrt(1.0 - pow(hp->beta2, tt)));
  c->decay = 1.0f;
}

void kn_row_adam(float *w, float *m, float *v, const float *g, uint32_t dim,
                 uint32_t t, const struct kn_row_hp *hp) {
  const float eps = hp->eps;
  struct kn_adam_consts c;

  kn_row_adam_consts(&c, hp, t);
  for (uint32_t i = 0; i < dim; i++) {
    m[i] = c.b1 * m[i] + c.omb1 * g[i];
    v[i] = c.b2 * v[i] + c.omb2 * (g[i] * g[i]);
    w[i] = w[i] - c.step * (m[i] / (sqrtf(v[i]) * c.rbc2 + eps));
  }
}

void kn_row_ftrl_init(const float *w, float *z, float *n, uint32_t dim,
                      const struct kn_row_hp *hp) {
  const float a = hp->accum0, lr = (float)hp->lr,
              d = kn__ftrl_den(a, hp->beta, lr, hp->l2);

  for (uint32_t i = 0; i < dim; i++) {
    z[i] = w[i] == 0.0f ? 0.0f : -(w[i] * d + copysignf(hp->l1, w[i]));
    n[i] = a;
  }
}

void kn_row_ftrl(float *w, float *z, float *n, const float *g, uint32_t dim,
                 const struct kn_row_hp *hp) {
  const float lr = (float)hp->lr, l1 = hp->l1, l2 = hp->l2, beta = hp->beta;

  for (uint32_t i = 0; i < dim; i++) {
    float n1 = n[i] + g[i] * g[i];
    float sigma = (sqrtf(n1) - sqrtf(n[i])) / lr;
    z[i] = z[i] + (g[i] - sigma * w[i]);
    n[i] = n1;
    if (fabsf(z[i]) <= l1)
      w[i] = 0.0f;
    else
      w[i] = -(z[i] - copysignf(l1, z[i])) / kn__ftrl_den(n1, beta, lr, l2);
  }
}
