/* CUDA twins of the optimizer updates in optim.h, with the same names plus
 * _cuda and a kn_cuda context first (dense_cuda.h: creating one, device
 * memory, the error and synchronization rules). Every tensor is a device
 * pointer of n floats; hp is a host pointer, read before the call returns.
 * Each does the CPU version's float operations in its order (no fused
 * multiply-add, IEEE sqrt and division), so the results match the oracle
 * bit for bit; tests/unit/test-kernels-cuda.c checks that at a stated
 * tolerance. Includable from C without the CUDA headers. */
#ifndef KN_OPTIM_CUDA_H
#define KN_OPTIM_CUDA_H

#include <stddef.h>

#include "dense_cuda.h"
#include "optim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* w, g are (n): as kn_sgd_step */
int kn_sgd_step_cuda(struct kn_cuda *ctx, float *w, const float *g, size_t n,
                     const struct kn_optim_hp *hp);

/* w, v, g are (n): as kn_momentum_step */
int kn_momentum_step_cuda(struct kn_cuda *ctx, float *w, float *v,
                          const float *g, size_t n,
                          const struct kn_optim_hp *hp);

/* w, v, g are (n): as kn_nesterov_step */
int kn_nesterov_step_cuda(struct kn_cuda *ctx, float *w, float *v,
                          const float *g, size_t n,
                          const struct kn_optim_hp *hp);

/* w, a, g are (n): as kn_adagrad_step */
int kn_adagrad_step_cuda(struct kn_cuda *ctx, float *w, float *a,
                         const float *g, size_t n,
                         const struct kn_optim_hp *hp);

/* w, m, v, g are (n): as kn_adam_step */
int kn_adam_step_cuda(struct kn_cuda *ctx, float *w, float *m, float *v,
                      const float *g, size_t n, const struct kn_optim_hp *hp);

/* w, m, v, g are (n): as kn_adamw_step */
int kn_adamw_step_cuda(struct kn_cuda *ctx, float *w, float *m, float *v,
                       const float *g, size_t n, const struct kn_optim_hp *hp);

/* x is (n): *out (a host pointer) = the sum of x[i]^2 in double. Waits for
 * the result. The summation order is not the CPU version's (per-thread
 * sums, then a tree), so it matches kn_sumsq to about 1e-12 relative. */
int kn_sumsq_cuda(struct kn_cuda *ctx, double *out, const float *x, size_t n);

/* x is (n): x = x * s */
int kn_scale_cuda(struct kn_cuda *ctx, float *x, size_t n, float s);

/* g is (n): as kn_clip_global_norm; *norm (host, may be NULL) gets the norm
 * before clipping. Waits for the norm. */
int kn_clip_global_norm_cuda(struct kn_cuda *ctx, double *norm, float *g,
                             size_t n, double max_norm);

#ifdef __cplusplus
}
#endif

#endif
