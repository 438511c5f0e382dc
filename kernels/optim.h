/* The optimizer updates: one fused pass over memory per update, reading
 * each of (value, slots..., gradient) once and writing value and slots
 * once. The CPU versions (optim_cpu.c) are the oracle for the CUDA twins
 * (optim_cuda.h, same names plus _cuda). All tensors are (n) f32 and must
 * not overlap. The formulas are PyTorch's (torch.optim, v2.x), per element,
 * with g' = g + weight_decay w (L2) where the optimizer takes it:
 *
 *   sgd        w = w - lr g'
 *   momentum   v = mu v + g';  w = w - lr v
 *   nesterov   v = mu v + g';  w = w - lr (g' + mu v)
 *   adagrad    a = a + g'^2;   w = w - lr g' / (sqrt(a) + eps)
 *   adam       m = b1 m + (1 - b1) g';  v = b2 v + (1 - b2) g'^2;
 *              w = w - lr/(1 - b1^t) m / (sqrt(v)/sqrt(1 - b2^t) + eps)
 *   adamw      w = w (1 - lr wd), then adam's step with g (no L2)
 *
 * Updates that do not use weight decay with weight_decay 0 compute exactly
 * the formula without it (no 0 * w term). The float operations and their
 * order are stated above each function; sqrt is IEEE (correctly rounded),
 * and no multiply-add is fused. */
#ifndef KN_OPTIM_H
#define KN_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The hyper-parameters of one update, the learning rate already taken from
 * the schedule at this step. */
struct kn_optim_hp {
  float lr;           /* learning rate of this update */
  float momentum;     /* momentum, nesterov: mu */
  double beta1;       /* adam(w): first-moment decay b1 (double: 1 - b2 is
                         rounded to float from it, as PyTorch does) */
  double beta2;       /* adam(w): second-moment decay b2 */
  float eps;          /* adagrad, adam(w): added to the denominator */
  float weight_decay; /* wd: L2 added to g, or decoupled (adamw) */
  uint64_t t;         /* adam(w): this update's 1-based step, for the bias
                         corrections; >= 1 */
};

/* Per-update constants of adam(w), computed on the host in double and
 * each rounded once to float, so that the CPU and CUDA versions use the
 * same floats. */
struct kn_adam_consts {
  float b1;    /* b1 */
  float b2;    /* b2 */
  float omb1;  /* 1 - b1 */
  float omb2;  /* 1 - b2 */
  float step;  /* lr / (1 - b1^t) */
  float rbc2;  /* 1 / sqrt(1 - b2^t) */
  float decay; /* adamw: 1 - lr wd; adam: 1 */
};

/* Which compiled version of the CPU updates runs on this CPU: "avx2" or
 * "baseline" (optim_cpu.c says why there are two; they give the same
 * bits). A static string. */
const char *kn_optim_isa(void);

/* Fills c for hp (adamw: decoupled, else adam). */
void kn_adam_consts(struct kn_adam_consts *c, const struct kn_optim_hp *hp,
                    int adamw);

/* w, g are (n): g' = g + wd*w (when wd != 0); w = w - lr*g' */
void kn_sgd_step(float *w, const float *g, size_t n,
                 const struct kn_optim_hp *hp);

/* w, v, g are (n): g' as sgd; v = mu*v + g'; w = w - lr*v */
void kn_momentum_step(float *w, float *v, const float *g, size_t n,
                      const struct kn_optim_hp *hp);

/* w, v, g are (n): g' as sgd; v = mu*v + g'; w = w - lr*(g' + mu*v) */
void kn_nesterov_step(float *w, float *v, const float *g, size_t n,
                      const struct kn_optim_hp *hp);

/* w, a, g are (n): g' as sgd; a = a + g'*g'; w = w - (lr*g') / (sqrt(a) +
 * eps) */
void kn_adagrad_step(float *w, float *a, const float *g, size_t n,
                     const struct kn_optim_hp *hp);

/* w, m, v, g are (n), c from kn_adam_consts: g' as sgd;
 * m = b1*m + omb1*g'; v = b2*v + omb2*(g'*g');
 * w = w - (step*m) / (sqrt(v)*rbc2 + eps) */
void kn_adam_step(float *w, float *m, float *v, const float *g, size_t n,
                  const struct kn_optim_hp *hp);

/* w, m, v, g are (n): as kn_adam_step with g' = g, after w = w*decay */
void kn_adamw_step(float *w, float *m, float *v, const float *g, size_t n,
                   const struct kn_optim_hp *hp);

/* x is (n): the sum of x[i]^2 in double: element i is added to partial
 * sum i mod 8 in index order, then ((s0 + s1) + (s2 + s3)) + ((s4 + s5) +
 * (s6 + s7)). */
double kn_sumsq(const float *x, size_t n);

/* x is (n): x = x * s */
void kn_scale(float *x, size_t n, float s);

/* g is (n), the whole gradient of one step: when its L2 norm exceeds
 * max_norm (> 0), scales it by max_norm / norm (PyTorch's
 * clip_grad_norm_, without its 1e-6). Returns the norm before clipping. */
double kn_clip_global_norm(float *g, size_t n, double max_norm);

#ifdef __cplusplus
}
#endif

#endif
