/* CPU versions of the optimizer updates (optim.h): one loop per update that
 * reads each input once and writes each output once, so that the update
 * runs at memory speed.
 *
 * How GCC is made to vectorize them at -O2 (GCC 12's "very cheap" cost
 * model, which gives up on a loop that needs a runtime alias check or an
 * unknown remainder): the pointers are restrict, n is split into a multiple
 * of 8 and a tail, and each element's arithmetic is one inline function
 * used by both loops. sqrtf vectorizes only without errno, so meson builds
 * this file with -fno-math-errno (sqrt of a negative never happens here:
 * its argument is a sum of squares) and -ffp-contract=off (no multiply-add
 * is fused, whatever the compiler's default); nothing else changes the
 * float results, which are the same in the vector body and the scalar tail.
 * Weight decay is a compile-time flag of each loop, so that wd = 0 costs
 * nothing and adds no 0 * w term.
 *
 * Each loop is compiled twice on x86-64, for AVX2 and for the baseline
 * (SSE2), and the loader picks one for the CPU it runs on (target_clones,
 * an ifunc). Why: with 4-wide SSE, adagrad and adam wait on the divider
 * (a sqrtps and a divps per 4 elements, 0.84 ns per element in L1 here)
 * for about as long as on memory (28 bytes at ~25 GB/s, 1.1 ns), and the
 * two did not overlap: adam ran at 1.9 ns per element, 0.74 of the triad.
 * 8-wide AVX2 halves the divider's share and adam runs at memory speed.
 * Both versions do the same IEEE operations per element, so they give the
 * same bits (tests/unit/test-optim.c checks each against a scalar loop;
 * the optim-baseline suite builds this file with KN_OPTIM_NO_CLONES). */
#include "optim.h"

#include <math.h>

/* Inlined into each loop, so that the flags below are constants there. */
#define KN__INLINE static inline __attribute__((always_inline))

/* A loop of its own, compiled for AVX2 and the baseline (see above); a
 * clone is called through its ifunc, never inlined (clang rejects
 * noinline beside target_clones). */
#if defined(__x86_64__) && !defined(KN_OPTIM_NO_CLONES)
#define KN__CLONES 1
#define KN__KERNEL static __attribute__((target_clones("avx2", "default")))
#else
#define KN__CLONES 0
#define KN__KERNEL static __attribute__((noinline))
#endif

/* The largest multiple of 8 not above n: the vectorizable part of a loop. */
static size_t kn__body(size_t n) { return n & ~(size_t)7; }

/* g + wd*w when l2, else g. */
KN__INLINE float kn__l2(float g, float w, float wd, const int l2) {
  return l2 ? g + wd * w : g;
}

/* One loop over n elements with element function F and its arguments. */
#define KN__LOOP(n, F, ...)                                                    \
  do {                                                                         \
    size_t i_, m_ = kn__body(n);                                               \
    for (i_ = 0; i_ < m_; i_++)                                                \
      F(__VA_ARGS__, i_);                                                      \
    for (; i_ < (n); i_++)                                                     \
      F(__VA_ARGS__, i_);                                                      \
  } while (0)

/* The element functions take i last, as KN__LOOP passes it. */
KN__INLINE void kn__sgd_i(float *restrict w, const float *restrict g, float lr,
                          float wd, int l2, size_t i) {
  float gi = kn__l2(g[i], w[i], wd, l2);
  w[i] = w[i] - lr * gi;
}

KN__KERNEL void kn__sgd_plain(float *restrict w, const float *restrict g,
                              size_t n, float lr) {
  KN__LOOP(n, kn__sgd_i, w, g, lr, 0.0f, 0);
}

KN__KERNEL void kn__sgd_l2(float *restrict w, const float *restrict g, size_t n,
                           float lr, float wd) {
  KN__LOOP(n, kn__sgd_i, w, g, lr, wd, 1);
}

void kn_sgd_step(float *w, const float *g, size_t n,
                 const struct kn_optim_hp *hp) {
  if (hp->weight_decay != 0.0f)
    kn__sgd_l2(w, g, n, hp->lr, hp->weight_decay);
  else
    kn__sgd_plain(w, g, n, hp->lr);
}

KN__INLINE void kn__mom_i(float *restrict w, float *restrict v,
                          const float *restrict g, float lr, float mu, float wd,
                          int l2, int nesterov, size_t i) {
  float gi = kn__l2(g[i], w[i], wd, l2);
  float vi = mu * v[i] + gi;
  v[i] = vi;
  w[i] = w[i] - lr * (nesterov ? gi + mu * vi : vi);
}

KN__KERNEL void kn__mom(float *restrict w, float *restrict v,
                        const float *restrict g, size_t n, float lr, float mu) {
  KN__LOOP(n, kn__mom_i, w, v, g, lr, mu, 0.0f, 0, 0);
}

KN__KERNEL void kn__mom_l2(float *restrict w, float *restrict v,
                           const float *restrict g, size_t n, float lr,
                           float mu, float wd) {
  KN__LOOP(n, kn__mom_i, w, v, g, lr, mu, wd, 1, 0);
}

KN__KERNEL void kn__nag(float *restrict w, float *restrict v,
                        const float *restrict g, size_t n, float lr, float mu) {
  KN__LOOP(n, kn__mom_i, w, v, g, lr, mu, 0.0f, 0, 1);
}

KN__KERNEL void kn__nag_l2(float *restrict w, float *restrict v,
                           const float *restrict g, size_t n, float lr,
                           float mu, float wd) {
  KN__LOOP(n, kn__mom_i, w, v, g, lr, mu, wd, 1, 1);
}

void kn_momentum_step(float *w, float *v, const float *g, size_t n,
                      const struct kn_optim_hp *hp) {
  if (hp->weight_decay != 0.0f)
    kn__mom_l2(w, v, g, n, hp->lr, hp->momentum, hp->weight_decay);
  else
    kn__mom(w, v, g, n, hp->lr, hp->momentum);
}

void kn_nesterov_step(float *w, float *v, const float *g, size_t n,
                      const struct kn_optim_hp *hp) {
  if (hp->weight_decay != 0.0f)
    kn__nag_l2(w, v, g, n, hp->lr, hp->momentum, hp->weight_decay);
  else
    kn__nag(w, v, g, n, hp->lr, hp->momentum);
}

KN__INLINE void kn__adagrad_i(float *restrict w, float *restrict a,
                              const float *restrict g, float lr, float eps,
                              float wd, int l2, size_t i) {
  float gi = kn__l2(g[i], w[i], wd, l2);
  float ai = a[i] + gi * gi;
  a[i] = ai;
  w[i] = w[i] - lr * (gi / (sqrtf(ai) + eps));
}

KN__KERNEL void kn__adagrad(float *restrict w, float *restrict a,
                            const float *restrict g, size_t n, float lr,
                            float eps) {
  KN__LOOP(n, kn__adagrad_i, w, a, g, lr, eps, 0.0f, 0);
}

KN__KERNEL void kn__adagrad_l2(float *restrict w, float *restrict a,
                               const float *restrict g, size_t n, float lr,
                               float eps, float wd) {
  KN__LOOP(n, kn__adagrad_i, w, a, g, lr, eps, wd, 1);
}

void kn_adagrad_step(float *w, float *a, const float *g, size_t n,
                     const struct kn_optim_hp *hp) {
  if (hp->weight_decay != 0.0f)
    kn__adagrad_l2(w, a, g, n, hp->lr, hp->eps, hp->weight_decay);
  else
    kn__adagrad(w, a, g, n, hp->lr, hp->eps);
}

const char *kn_optim_isa(void) {
#if KN__CLONES
  /* What the ifunc resolver of target_clones asks. */
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2"))
    return "avx2";
#endif
  return "baseline";
}

void kn_adam_consts(struct kn_adam_consts *c, const struct kn_optim_hp *hp,
                    int adamw) {
  double t = (double)(hp->t ? hp->t : 1);
  double bc1 = 1.0 - pow(hp->beta1, t);
  double bc2 = 1.0 - pow(hp->beta2, t);

  c->b1 = (float)hp->beta1;
  c->b2 = (float)hp->beta2;
  c->omb1 = (float)(1.0 - hp->beta1);
  c->omb2 = (float)(1.0 - hp->beta2);
  c->step = (float)((double)hp->lr / bc1);
  c->rbc2 = (float)(1.0 / sqrt(bc2));
  c->decay = adamw ? (float)(1.0 - (double)hp->lr * hp->weight_decay) : 1.0f;
}

/* The constants an adam loop takes, by value so they stay in registers. */
KN__INLINE void kn__adam_i(float *restrict w, float *restrict m,
                           float *restrict v, const float *restrict g,
                           struct kn_adam_consts c, float eps, float wd, int l2,
                           int decoupled, size_t i) {
  float wi = decoupled ? w[i] * c.decay : w[i];
  float gi = kn__l2(g[i], wi, wd, l2);
  float mi = c.b1 * m[i] + c.omb1 * gi;
  float vi = c.b2 * v[i] + c.omb2 * (gi * gi);
  m[i] = mi;
  v[i] = vi;
  w[i] = wi - c.step * (mi / (sqrtf(vi) * c.rbc2 + eps));
}

KN__KERNEL void kn__adam(float *restrict w, float *restrict m,
                         float *restrict v, const float *restrict g, size_t n,
                         struct kn_adam_consts c, float eps) {
  KN__LOOP(n, kn__adam_i, w, m, v, g, c, eps, 0.0f, 0, 0);
}

KN__KERNEL void kn__adam_l2(float *restrict w, float *restrict m,
                            float *restrict v, const float *restrict g,
                            size_t n, struct kn_adam_consts c, float eps,
                            float wd) {
  KN__LOOP(n, kn__adam_i, w, m, v, g, c, eps, wd, 1, 0);
}

KN__KERNEL void kn__adamw(float *restrict w, float *restrict m,
                          float *restrict v, const float *restrict g, size_t n,
                          struct kn_adam_consts c, float eps) {
  KN__LOOP(n, kn__adam_i, w, m, v, g, c, eps, 0.0f, 0, 1);
}

void kn_adam_step(float *w, float *m, float *v, const float *g, size_t n,
                  const struct kn_optim_hp *hp) {
  struct kn_adam_consts c;

  kn_adam_consts(&c, hp, 0);
  if (hp->weight_decay != 0.0f)
    kn__adam_l2(w, m, v, g, n, c, hp->eps, hp->weight_decay);
  else
    kn__adam(w, m, v, g, n, c, hp->eps);
}

void kn_adamw_step(float *w, float *m, float *v, const float *g, size_t n,
                   const struct kn_optim_hp *hp) {
  struct kn_adam_consts c;

  kn_adam_consts(&c, hp, 1);
  kn__adamw(w, m, v, g, n, c, hp->eps);
}

/* Element i goes to partial sum i mod 8, and the 8 are added pairwise at
 * the end: a fixed order, so the result does not depend on vector width,
 * with 8 independent chains of additions instead of one (GCC vectorizes
 * the body): 86 us for the demo's 235k floats here, one chain 129 us. */
double kn_sumsq(const float *restrict x, size_t n) {
  double s[8] = {0};
  size_t i, m = kn__body(n);

  for (i = 0; i < m; i += 8)
    for (int j = 0; j < 8; j++)
      s[j] += (double)x[i + j] * x[i + j];
  for (; i < n; i++)
    s[i & 7] += (double)x[i] * x[i];
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

void kn_scale(float *restrict x, size_t n, float s) {
  size_t i, m = kn__body(n);

  for (i = 0; i < m; i++)
    x[i] = x[i] * s;
  for (; i < n; i++)
    x[i] = x[i] * s;
}

double kn_clip_global_norm(float *g, size_t n, double max_norm) {
  double norm = sqrt(kn_sumsq(g, n));

  if (max_norm > 0 && norm > max_norm)
    kn_scale(g, n, (float)(max_norm / norm));
  return norm;
}
