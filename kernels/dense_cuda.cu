/* CUDA twins of dense_cpu.c. The dense layer is cuBLAS sgemm (plain FP32,
 * no TF32); the rest are small grid-stride kernels that do the CPU twin's
 * float operations in the CPU twin's order, with __fmul_rn / __fadd_rn where
 * nvcc would otherwise fuse a multiply and an add into one FMA, so that
 * relu and the updates match the oracle bit for bit and the loss nearly so.
 * Each entry point queues its work on the context's stream and checks the
 * launch; see dense_cuda.h for the error and synchronization rules. */
#include "cuda_ctx.cuh"
#include "optim_cuda.h"

#include <stdlib.h>

/* What kn__xent_total leaves at the start of the scratch memory. */
struct kn__xent_sums {
  double total; /* sum over the batch of the per-row losses */
  int hits;     /* rows whose argmax is the label */
};

static int kn__first(int rc, int e) { return rc ? rc : e; }

int kn_cuda_create(struct kn_cuda **out) {
  struct kn_cuda *ctx = (struct kn_cuda *)calloc(1, sizeof *ctx);
  int rc = 0;

  if (!ctx) {
    rc = CM_ENOMEM;
    goto out;
  }
  KN__TRY(cudaStreamCreate(&ctx->stream));
  KN__TRY(cublasCreate(&ctx->blas));
  KN__TRY(cublasSetStream(ctx->blas, ctx->stream));
  KN__TRY(cublasSetMathMode(ctx->blas, CUBLAS_DEFAULT_MATH));
  *out = ctx;
  ctx = NULL;
out:
  kn_cuda_destroy(ctx);
  return rc;
}

int kn_cuda_destroy(struct kn_cuda *ctx) {
  int rc = 0;

  if (!ctx)
    return 0;
  if (ctx->stream)
    rc = KN__CHECK(cudaStreamSynchronize(ctx->stream));
  if (ctx->scratch)
    rc = kn__first(rc, KN__CHECK(cudaFree(ctx->scratch)));
  if (ctx->blas)
    rc = kn__first(rc, KN__CHECK(cublasDestroy(ctx->blas)));
  if (ctx->stream)
    rc = kn__first(rc, KN__CHECK(cudaStreamDestroy(ctx->stream)));
  free(ctx);
  return rc;
}

int kn_cuda_sync(struct kn_cuda *ctx) {
  return KN__CHECK(cudaStreamSynchronize(ctx->stream));
}

int kn_cuda_alloc(void **out, size_t bytes) {
  void *p = NULL;
  int rc = KN__CHECK(cudaMalloc(&p, bytes ? bytes : 1));

  if (!rc)
    *out = p;
  return rc;
}

void kn_cuda_free(void *p) {
  if (p)
    (void)KN__CHECK(cudaFree(p));
}

/* Copies bytes on ctx's stream in direction dir and waits for the copy. */
static int kn__copy(struct kn_cuda *ctx, void *dst, const void *src,
                    size_t bytes, cudaMemcpyKind dir) {
  int rc = 0;

  if (!bytes)
    goto out;
  KN__TRY(cudaMemcpyAsync(dst, src, bytes, dir, ctx->stream));
  KN__TRY(cudaStreamSynchronize(ctx->stream));
out:
  return rc;
}

int kn_cuda_upload(struct kn_cuda *ctx, void *dst, const void *src,
                   size_t bytes) {
  return kn__copy(ctx, dst, src, bytes, cudaMemcpyHostToDevice);
}

int kn_cuda_download(struct kn_cuda *ctx, void *dst, const void *src,
                     size_t bytes) {
  return kn__copy(ctx, dst, src, bytes, cudaMemcpyDeviceToHost);
}

int kn__cuda_scratch(struct kn_cuda *ctx, size_t bytes) {
  int rc = 0;

  if (ctx->scratch_bytes >= bytes)
    goto out;
  kn_cuda_free(ctx->scratch);
  ctx->scratch = NULL;
  ctx->scratch_bytes = 0;
  KN__TRY(cudaMalloc(&ctx->scratch, bytes));
  ctx->scratch_bytes = bytes;
out:
  return rc;
}

/* Row-major C (m, n) = op(A) op(B) + beta C with op(A) (m, k), as kn__gemm
 * in dense_cpu.c. cuBLAS is column-major and a row-major matrix read
 * column-major is its transpose, so this asks cuBLAS for
 * C^T = op(B)^T op(A)^T, operands swapped. Degenerate sizes are done here
 * because cuBLAS rejects a leading dimension of 0. */
int kn__gemm(struct kn_cuda *ctx, int ta, int tb, int m, int n, int k,
             const float *a, const float *b, float beta, float *c) {
  const float one = 1.0f;
  int rc = 0;

  if (m <= 0 || n <= 0)
    goto out;
  if (k <= 0) {
    if (beta == 0.0f)
      KN__TRY(cudaMemsetAsync(c, 0, sizeof(float) * m * n, ctx->stream));
    goto out;
  }
  KN__TRY(cublasSgemm(ctx->blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N,
                      ta ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &one, b,
                      tb ? k : n, a, ta ? m : k, &beta, c, n));
out:
  return rc;
}

// y is (B, out), b is (out) or NULL: every row of y = b (or 0)
__global__ void kn__bias_rows(float *y, const float *b, int B, int out) {
  KN__FOR(i, (size_t)B * out) { y[i] = b ? b[i % out] : 0.0f; }
}

// dy is (B, out), db is (out): db[j] = sum over rows r of dy[r, j], summed
// in row order like the CPU twin; one thread per column
__global__ void kn__col_sums(float *db, const float *dy, int B, int out) {
  int j = blockIdx.x * blockDim.x + threadIdx.x;
  float s = 0.0f;

  if (j >= out)
    return;
  for (int r = 0; r < B; r++)
    s += dy[(size_t)r * out + j];
  db[j] = s;
}

// x is (B, in), w is (out, in), b is (out) or NULL, y is (B, out)
int kn_dense_forward_cuda(struct kn_cuda *ctx, float *y, const float *x,
                          const float *w, const float *b, int B, int in,
                          int out) {
  size_t n = (size_t)(B > 0 ? B : 0) * (out > 0 ? out : 0);
  int rc = 0;

  if (!n)
    goto out;
  kn__bias_rows<<<kn__blocks(n), KN__THREADS, 0, ctx->stream>>>(y, b, B, out);
  KN__TRY(cudaGetLastError());
  rc = kn__gemm(ctx, 0, 1, B, out, in, x, w, 1.0f, y);
out:
  return rc;
}

// dy is (B, out), x is (B, in), w is (out, in); dw is (out, in), db is
// (out), dx is (B, in) or NULL
int kn_dense_backward_cuda(struct kn_cuda *ctx, float *dx, float *dw, float *db,
                           const float *dy, const float *x, const float *w,
                           int B, int in, int out) {
  int rc = 0;

  if ((rc = kn__gemm(ctx, 1, 0, out, in, B, dy, x, 0.0f, dw)) < 0)
    goto out;
  if (out > 0) {
    kn__col_sums<<<(out + KN__THREADS - 1) / KN__THREADS, KN__THREADS, 0,
                   ctx->stream>>>(db, dy, B, out);
    KN__TRY(cudaGetLastError());
  }
  if (dx)
    rc = kn__gemm(ctx, 0, 0, B, in, out, dy, w, 0.0f, dx);
out:
  return rc;
}

// x, y are (n): y = max(x, 0)
__global__ void kn__relu_fwd(float *y, const float *x, size_t n) {
  KN__FOR(i, n) { y[i] = x[i] > 0.0f ? x[i] : 0.0f; }
}

int kn_relu_forward_cuda(struct kn_cuda *ctx, float *y, const float *x,
                         size_t n) {
  if (!n)
    return 0;
  kn__relu_fwd<<<kn__blocks(n), KN__THREADS, 0, ctx->stream>>>(y, x, n);
  return KN__CHECK(cudaGetLastError());
}

// dy, y, dx are (n): dx = dy where y > 0, else 0
__global__ void kn__relu_bwd(float *dx, const float *dy, const float *y,
                             size_t n) {
  KN__FOR(i, n) { dx[i] = y[i] > 0.0f ? dy[i] : 0.0f; }
}

int kn_relu_backward_cuda(struct kn_cuda *ctx, float *dx, const float *dy,
                          const float *y, size_t n) {
  if (!n)
    return 0;
  kn__relu_bwd<<<kn__blocks(n), KN__THREADS, 0, ctx->stream>>>(dx, dy, y, n);
  return KN__CHECK(cudaGetLastError());
}

// x, y are (n): y = tanh(x)
__global__ void kn__tanh_fwd(float *y, const float *x, size_t n) {
  KN__FOR(i, n) { y[i] = tanhf(x[i]); }
}

int kn_tanh_forward_cuda(struct kn_cuda *ctx, float *y, const float *x,
                         size_t n) {
  if (!n)
    return 0;
  kn__tanh_fwd<<<kn__blocks(n), KN__THREADS, 0, ctx->stream>>>(y, x, n);
  return KN__CHECK(cudaGetLastError());
}

// dy, y, dx are (n): dx = dy (1 - y^2), unfused as on the CPU
__global__ void kn__tanh_bwd(float *dx, const float *dy, const float *y,
                             size_t n) {
  KN__FOR(i, n) {
    float d = __fsub_rn(1.0f, __fmul_rn(y[i], y[i]));
    dx[i] = __fmul_rn(dy[i], d);
  }
}

int kn_tanh_backward_cuda(struct kn_cuda *ctx, float *dx, const float *dy,
                          const float *y, size_t n) {
  if (!n)
    return 0;
  kn__tanh_bwd<<<kn__blocks(n), KN__THREADS, 0, ctx->stream>>>(dx, dy, y, n);
  return KN__CHECK(cudaGetLastError());
}

// x, y are (n): y = 1 / (1 + exp(-x))
__global__ void kn__sigmoid_fwd(float *y, const float *x, size_t n) {
  KN__FOR(i, n) { y[i] = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x[i]))); }
}

int kn_sigmoid_forward_cuda(struct kn_cuda *ctx, float *y, const float *x,
                            size_t n) {
  if (!n)
    return 0;
  kn__sigmoid_fwd<<<kn__blocks(n), KN__THREADS, 0, ctx->stream>>>(y, x, n);
  return KN__CHECK(cudaGetLastError());
}

// dy, y, dx are (n): dx = dy y (1 - y), unfused as on the CPU
__global__ void kn__sigmoid_bwd(float *dx, const float *dy, const float *y,
                                size_t n) {
  KN__FOR(i, n) {
    float d = __fmul_rn(y[i], __fsub_rn(1.0f, y[i]));
    dx[i] = __fmul_rn(dy[i], d);
  }
}

int kn_sigmoid_backward_cuda(struct kn_cuda *ctx, float *dx, const float *dy,
                             const float *y, size_t n) {
  if (!n)
    return 0;
  kn__sigmoid_bwd<<<kn__blocks(n), KN__THREADS, 0, ctx->stream>>>(dx, dy, y, n);
  return KN__CHECK(cudaGetLastError());
}

// logits, dlogits are (B, C), labels, row_loss, row_hit are (B). One thread
// per row, in the CPU twin's order: C is a handful of classes.
__global__ void kn__xent_rows(float *row_loss, int *row_hit, float *dlogits,
                              const float *logits, const uint8_t *labels, int B,
                              int C) {
  int r = blockIdx.x * blockDim.x + threadIdx.x;

  if (r >= B)
    return;
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
  row_loss[r] = logf(sum) + max - l[label];
  row_hit[r] = arg == label;
  if (dlogits) {
    float *d = dlogits + (size_t)r * C;
    for (int j = 0; j < C; j++)
      d[j] = (expf(l[j] - max) / sum - (j == label ? 1.0f : 0.0f)) / B;
  }
}

// row_loss, row_hit are (B): sums->total and sums->hits are their sums, in
// double like the CPU twin. One block of KN__THREADS threads.
__global__ void kn__xent_total(struct kn__xent_sums *sums,
                               const float *row_loss, const int *row_hit,
                               int B) {
  __shared__ double total[KN__THREADS];
  __shared__ int hits[KN__THREADS];
  unsigned t = threadIdx.x;
  double s = 0.0;
  int h = 0;

  for (int r = t; r < B; r += KN__THREADS) {
    s += row_loss[r];
    h += row_hit[r];
  }
  total[t] = s;
  hits[t] = h;
  __syncthreads();
  for (unsigned k = KN__THREADS / 2; k > 0; k >>= 1) {
    if (t < k) {
      total[t] += total[t + k];
      hits[t] += hits[t + k];
    }
    __syncthreads();
  }
  if (t == 0) {
    sums->total = total[0];
    sums->hits = hits[0];
  }
}

int kn_softmax_xent_cuda(struct kn_cuda *ctx, float *loss, float *dlogits,
                         int *correct, const float *logits,
                         const uint8_t *labels, int B, int C) {
  struct kn__xent_sums sums = {0.0, 0};
  float *row_loss;
  int *row_hit, rc = 0;

  if (B < 0 || C <= 0) {
    rc = CM_EINVAL;
    goto out;
  }
  if (!B)
    goto done;
  /* Scratch holds the sums, then B row losses, then B row hits. */
  if ((rc = kn__cuda_scratch(ctx, sizeof sums + (size_t)B * 8)) < 0)
    goto out;
  row_loss = (float *)((char *)ctx->scratch + sizeof sums);
  row_hit = (int *)(row_loss + B);
  kn__xent_rows<<<(B + KN__THREADS - 1) / KN__THREADS, KN__THREADS, 0,
                  ctx->stream>>>(row_loss, row_hit, dlogits, logits, labels, B,
                                 C);
  KN__TRY(cudaGetLastError());
  if (!loss && !correct)
    goto out;
  kn__xent_total<<<1, KN__THREADS, 0, ctx->stream>>>(
      (struct kn__xent_sums *)ctx->scratch, row_loss, row_hit, B);
  KN__TRY(cudaGetLastError());
  KN__TRY(cudaMemcpyAsync(&sums, ctx->scratch, sizeof sums,
                          cudaMemcpyDeviceToHost, ctx->stream));
  KN__TRY(cudaStreamSynchronize(ctx->stream));
done:
  if (loss)
    *loss = B ? (float)(sums.total / B) : 0.0f;
  if (correct)
    *correct = sums.hits;
out:
  return rc;
}

/* The old names, as on the CPU: optim_cuda.cu's kernels without weight
 * decay. */
int kn_sgd_update_cuda(struct kn_cuda *ctx, float *w, const float *g, size_t n,
                       float lr) {
  struct kn_optim_hp hp = {};
  hp.lr = lr;
  return kn_sgd_step_cuda(ctx, w, g, n, &hp);
}

int kn_momentum_update_cuda(struct kn_cuda *ctx, float *w, float *v,
                            const float *g, size_t n, float lr, float mu) {
  struct kn_optim_hp hp = {};
  hp.lr = lr;
  hp.momentum = mu;
  return kn_momentum_step_cuda(ctx, w, v, g, n, &hp);
}
