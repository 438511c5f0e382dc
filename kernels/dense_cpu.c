/* CPU twins of the ops in dense.h: the dense layer runs on OpenBLAS sgemm,
 * everything else is a plain loop. These are the oracle the CUDA twins are
 * tested against, so they favour the obvious formula over cleverness.
 *
 * The elementwise loops split n into a multiple of 8 and a tail, and take
 * restrict pointers (with a separate in-place path where dense.h allows
 * aliasing): at -O2, GCC 12's "very cheap" vectorizer cost model refuses
 * loops that would need a runtime alias check or an unknown remainder, and
 * this shape lets it vectorize them anyway. The relu helpers stay out of
 * line because once inlined into their dispatcher GCC no longer sees that
 * the trip count is a multiple of 8. */
#include "dense.h"

#include "optim.h"

#include <cblas.h>
#include <math.h>

/* The largest multiple of 8 not above n: the vectorizable part of a loop. */
static size_t kn__body(size_t n) { return n & ~(size_t)7; }

/* C (m, n) = op(A) op(B) + beta C with op(A) (m, k), all row-major and
 * packed. Degenerate sizes are done here because cblas rejects a leading
 * dimension of 0. */
static void kn__gemm(int ta, int tb, int m, int n, int k, const float *a,
                     const float *b, float beta, float *c) {
  if (m <= 0 || n <= 0)
    return;
  if (k <= 0) {
    for (size_t i = 0; i < (size_t)m * n; i++)
      c[i] = beta == 0.0f ? 0.0f : beta * c[i];
    return;
  }
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
              tb ? CblasTrans : CblasNoTrans, m, n, k, 1.0f, a, ta ? m : k, b,
              tb ? k : n, beta, c, n);
}

/* b may be NULL for a layer without bias. */
void kn_dense_forward(float *y, const float *x, const float *w, const float *b,
                      int B, int in, int out) {
  /* Seed every row of y with the bias so sgemm adds x w^T on top of it. */
  for (int r = 0; r < B; r++)
    for (int j = 0; j < out; j++)
      y[(size_t)r * out + j] = b ? b[j] : 0.0f;
  kn__gemm(0, 1, B, out, in, x, w, 1.0f, y);
}

void kn_dense_backward(float *dx, float *dw, float *db, const float *dy,
                       const float *x, const float *w, int B, int in, int out) {
  /* dw (out, in) = dy^T (out, B) x (B, in) */
  kn__gemm(1, 0, out, in, B, dy, x, 0.0f, dw);
  for (int j = 0; j < out; j++)
    db[j] = 0.0f;
  for (int r = 0; r < B; r++)
    for (int j = 0; j < out; j++)
      db[j] += dy[(size_t)r * out + j];
  /* dx (B, in) = dy (B, out) w (out, in) */
  if (dx)
    kn__gemm(0, 0, B, in, out, dy, w, 0.0f, dx);
}

static __attribute__((noinline)) void kn__relu_inplace(float *y, size_t n) {
  size_t i, m = kn__body(n);
  for (i = 0; i < m; i++)
    y[i] = y[i] > 0.0f ? y[i] : 0.0f;
  for (; i < n; i++)
    y[i] = y[i] > 0.0f ? y[i] : 0.0f;
}

static __attribute__((noinline)) void
kn__relu_copy(float *restrict y, const float *restrict x, size_t n) {
  size_t i, m = kn__body(n);
  for (i = 0; i < m; i++)
    y[i] = x[i] > 0.0f ? x[i] : 0.0f;
  for (; i < n; i++)
    y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

void kn_relu_forward(float *y, const float *x, size_t n) {
  if (y == x)
    kn__relu_inplace(y, n);
  else
    kn__relu_copy(y, x, n);
}

/* The gradient is loaded before the select so the load is unconditional,
 * which GCC needs to if-convert and vectorize the loop. */
static __attribute__((noinline)) void
kn__relu_back_inplace(float *restrict d, const float *restrict y, size_t n) {
  size_t i, m = kn__body(n);
  for (i = 0; i < m; i++) {
    float g = d[i];
    d[i] = y[i] > 0.0f ? g : 0.0f;
  }
  for (; i < n; i++)
    d[i] = y[i] > 0.0f ? d[i] : 0.0f;
}

static __attribute__((noinline)) void
kn__relu_back_copy(float *restrict dx, const float *restrict dy,
                   const float *restrict y, size_t n) {
  size_t i, m = kn__body(n);
  for (i = 0; i < m; i++) {
    float g = dy[i];
    dx[i] = y[i] > 0.0f ? g : 0.0f;
  }
  for (; i < n; i++)
    dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

void kn_relu_backward(float *dx, const float *dy, const float *y, size_t n) {
  if (dx == dy)
    kn__relu_back_inplace(dx, y, n);
  else
    kn__relu_back_copy(dx, dy, y, n);
}

/* The smooth activations are written so that the CUDA twins can do the
 * same float operations in the same order: the derivative from the output,
 * with each product rounded before the next. */
void kn_tanh_forward(float *y, const float *x, size_t n) {
  for (size_t i = 0; i < n; i++)
    y[i] = tanhf(x[i]);
}

void kn_tanh_backward(float *dx, const float *dy, const float *y, size_t n) {
  for (size_t i = 0; i < n; i++) {
    float d = 1.0f - y[i] * y[i];
    dx[i] = dy[i] * d;
  }
}

void kn_sigmoid_forward(float *y, const float *x, size_t n) {
  for (size_t i = 0; i < n; i++)
    y[i] = 1.0f / (1.0f + expf(-x[i]));
}

void kn_sigmoid_backward(float *dx, const float *dy, const float *y, size_t n) {
  for (size_t i = 0; i < n; i++) {
    float d = y[i] * (1.0f - y[i]);
    dx[i] = dy[i] * d;
  }
}

/* Per row: loss = log(sum_j exp(l_j - max)) + max - l_label, accumulated in
 * double over the batch. The CUDA twin uses the same per-row formula and the
 * same summation order within a row. */
float kn_softmax_xent(float *dlogits, int *correct, const float *logits,
                      const uint8_t *labels, int B, int C) {
  double total = 0.0;
  int hits = 0;

  for (int r = 0; r < B; r++) {
    const float *l = logits + (size_t)r * C;
    int label = labels[r], arg = 0;
    float max = l[0], sum = 0.0f;

    for (int j = 1; j < C; j++)
      if (l[j] > max) {
        max = l[j];
        arg = j;
      }
    for (int j = 0; j < C; j++)
      sum += expf(l[j] - max);
    total += logf(sum) + max - l[label];
    hits += arg == label;
    if (dlogits) {
      float *d = dlogits + (size_t)r * C;
      for (int j = 0; j < C; j++)
        d[j] = (expf(l[j] - max) / sum - (j == label ? 1.0f : 0.0f)) / B;
    }
  }
  if (correct)
    *correct = hits;
  return B > 0 ? (float)(total / B) : 0.0f;
}

/* The old names of two updates, kept for their callers: optim.h's
 * kernels with no weight decay compute exactly these. */
void kn_sgd_update(float *w, const float *g, size_t n, float lr) {
  struct kn_optim_hp hp = {.lr = lr};
  kn_sgd_step(w, g, n, &hp);
}

void kn_momentum_update(float *w, float *v, const float *g, size_t n, float lr,
                        float mu) {
  struct kn_optim_hp hp = {.lr = lr, .momentum = mu};
  kn_momentum_step(w, v, g, n, &hp);
}
