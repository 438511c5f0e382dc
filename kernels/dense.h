/* Dense layers, activations, the softmax cross-entropy loss and two plain
 * optimizer updates (the rest are in optim.h). CPU twins (OpenBLAS, in
 * *_cpu.c) are the oracle; CUDA twins (in *_cuda.cu, built when nvcc is
 * found) take device pointers and a kn_cuda context and must match the CPU
 * ones within the tolerance stated in tests/unit/test-kernels-cuda.c. Shapes
 * are in the comment above each function; all matrices are row-major f32. */
#ifndef KN_DENSE_H
#define KN_DENSE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* x is (B, in), w is (out, in), b is (out) or NULL, y is (B, out):
 * y = x w^T + b */
void kn_dense_forward(float *y, const float *x, const float *w, const float *b,
                      int B, int in, int out);

/* dy is (B, out), x is (B, in), w is (out, in).
 * dw (out, in) = dy^T x and db (out) = sum over B of dy; both overwritten.
 * dx (B, in) = dy w, overwritten; skipped when dx is NULL. */
void kn_dense_backward(float *dx, float *dw, float *db, const float *dy,
                       const float *x, const float *w, int B, int in, int out);

/* x, y are (n): y = max(x, 0); y may equal x */
void kn_relu_forward(float *y, const float *x, size_t n);

/* dy, y, dx are (n): dx = dy where y > 0, else 0; dx may equal dy */
void kn_relu_backward(float *dx, const float *dy, const float *y, size_t n);

/* x, y are (n): y = tanh(x); y may equal x */
void kn_tanh_forward(float *y, const float *x, size_t n);

/* dy, y, dx are (n), y the forward output: dx = dy (1 - y^2); dx may equal
 * dy */
void kn_tanh_backward(float *dx, const float *dy, const float *y, size_t n);

/* x, y are (n): y = 1 / (1 + exp(-x)); y may equal x */
void kn_sigmoid_forward(float *y, const float *x, size_t n);

/* dy, y, dx are (n), y the forward output: dx = dy y (1 - y); dx may equal
 * dy */
void kn_sigmoid_backward(float *dx, const float *dy, const float *y, size_t n);

/* logits is (B, C), labels is (B) with values < C, dlogits is (B, C).
 * Returns the mean cross-entropy of softmax(logits); writes
 * dlogits = (softmax(logits) - onehot(labels)) / B when dlogits is not NULL,
 * and the number of rows whose argmax equals the label into *correct when
 * correct is not NULL. Numerically stable (max subtracted). */
float kn_softmax_xent(float *dlogits, int *correct, const float *logits,
                      const uint8_t *labels, int B, int C);

/* w, g are (n): w -= lr * g. The optimizers are in optim.h; this and the
 * next are kn_sgd_step and kn_momentum_step without weight decay. */
void kn_sgd_update(float *w, const float *g, size_t n, float lr);

/* w, v, g are (n): v = mu * v + g; w -= lr * v  (PyTorch's SGD momentum) */
void kn_momentum_update(float *w, float *v, const float *g, size_t n, float lr,
                        float mu);

#ifdef __cplusplus
}
#endif

#endif
