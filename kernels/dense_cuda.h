/* CUDA twins of the ops in dense.h, with the same names plus _cuda. Every
 * tensor argument is a device pointer with the shape stated in dense.h;
 * host pointers are marked as such. Work is queued on the context's stream
 * and runs in order there; an op returns once its work is queued, except
 * where it hands a result back to the host. Every function returns 0 or a
 * negative CM_E* code (CM_ECUDA when a CUDA or cuBLAS call failed; the call,
 * file and line are logged). An error from a kernel that already ran
 * asynchronously shows up in the next call that synchronizes.
 *
 * Includable from C without the CUDA headers: the context is opaque. */
#ifndef KN_DENSE_CUDA_H
#define KN_DENSE_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A cuBLAS handle, the stream all its work runs on, and scratch memory for
 * reductions. One per thread that drives the GPU. */
struct kn_cuda;

/* Creates a context on the current device; *out is set on success only. */
int kn_cuda_create(struct kn_cuda **out);

/* Waits for ctx's queued work, then frees it; NULL is a no-op. Returns the
 * first error met, having freed everything anyway. */
int kn_cuda_destroy(struct kn_cuda *ctx);

/* Waits until everything queued on ctx has run. */
int kn_cuda_sync(struct kn_cuda *ctx);

/* Device memory for tensors: *out is set on success only; kn_cuda_free
 * takes what kn_cuda_alloc gave (or NULL) and synchronizes the device. */
int kn_cuda_alloc(void **out, size_t bytes);
void kn_cuda_free(void *p);

/* Copies bytes from host src to device dst (upload) or from device src to
 * host dst (download) on ctx's stream; both return once the copy is done. */
int kn_cuda_upload(struct kn_cuda *ctx, void *dst, const void *src,
                   size_t bytes);
int kn_cuda_download(struct kn_cuda *ctx, void *dst, const void *src,
                     size_t bytes);

/* x is (B, in), w is (out, in), b is (out) or NULL, y is (B, out):
 * y = x w^T + b */
int kn_dense_forward_cuda(struct kn_cuda *ctx, float *y, const float *x,
                          const float *w, const float *b, int B, int in,
                          int out);

/* dy is (B, out), x is (B, in), w is (out, in); dw (out, in) = dy^T x,
 * db (out) = column sums of dy, dx (B, in) = dy w (skipped when dx is NULL),
 * all overwritten. */
int kn_dense_backward_cuda(struct kn_cuda *ctx, float *dx, float *dw, float *db,
                           const float *dy, const float *x, const float *w,
                           int B, int in, int out);

/* x, y are (n): y = max(x, 0); y may equal x */
int kn_relu_forward_cuda(struct kn_cuda *ctx, float *y, const float *x,
                         size_t n);

/* dy, y, dx are (n): dx = dy where y > 0, else 0; dx may equal dy */
int kn_relu_backward_cuda(struct kn_cuda *ctx, float *dx, const float *dy,
                          const float *y, size_t n);

/* x, y are (n): y = tanh(x); y may equal x */
int kn_tanh_forward_cuda(struct kn_cuda *ctx, float *y, const float *x,
                         size_t n);

/* dy, y, dx are (n): dx = dy (1 - y^2); dx may equal dy */
int kn_tanh_backward_cuda(struct kn_cuda *ctx, float *dx, const float *dy,
                          const float *y, size_t n);

/* x, y are (n): y = 1 / (1 + exp(-x)); y may equal x */
int kn_sigmoid_forward_cuda(struct kn_cuda *ctx, float *y, const float *x,
                            size_t n);

/* dy, y, dx are (n): dx = dy y (1 - y); dx may equal dy */
int kn_sigmoid_backward_cuda(struct kn_cuda *ctx, float *dx, const float *dy,
                             const float *y, size_t n);

/* logits, dlogits are (B, C), labels is (B) of uint8_t < C. As
 * kn_softmax_xent, but the mean loss goes to *loss and the number of right
 * argmaxes to *correct; loss and correct are host pointers (either may be
 * NULL; when one is given the call waits for the result). dlogits may be
 * NULL. */
int kn_softmax_xent_cuda(struct kn_cuda *ctx, float *loss, float *dlogits,
                         int *correct, const float *logits,
                         const uint8_t *labels, int B, int C);

/* w, g are (n): w -= lr * g */
int kn_sgd_update_cuda(struct kn_cuda *ctx, float *w, const float *g, size_t n,
                       float lr);

/* w, v, g are (n): v = mu * v + g; w -= lr * v */
int kn_momentum_update_cuda(struct kn_cuda *ctx, float *w, float *v,
                            const float *g, size_t n, float lr, float mu);

#ifdef __cplusplus
}
#endif

#endif
