/* CUDA twins of conv_cpu.c. im2col unfolds the whole batch at once (one
 * thread per col entry), one strided-batched cuBLAS sgemm makes every
 * example's output, and the backward pass's col2im gathers (one thread per
 * input pixel, no atomics) where the CPU twin scatters, so sums come in a
 * different order: the tests allow for it. Pooling windows do not overlap,
 * so the pooling backward pass writes each input gradient at most once. */
#include "conv_cuda.h"

#include "cuda_ctx.cuh"

/* The sizes every conv kernel needs, computed once on the host. */
struct kn__geom {
  int C, H, W, K, pad; /* as in kn_conv_shape */
  int oh, ow;          /* output height and width */
  int ckk;             /* C * K * K: rows of col */
  int P;               /* oh * ow: columns of col */
};

static struct kn__geom kn__geom_of(const struct kn_conv_shape *s) {
  struct kn__geom g;

  g.C = s->C;
  g.H = s->H;
  g.W = s->W;
  g.K = s->K;
  g.pad = s->pad;
  g.oh = kn_conv_oh(s);
  g.ow = kn_conv_ow(s);
  g.ckk = s->C * s->K * s->K;
  g.P = g.oh * g.ow;
  return g;
}

// x is (B, C, H, W), col is (B, C*K*K, OH*OW)
__global__ void kn__im2col(float *col, const float *x, struct kn__geom g,
                           size_t n) {
  KN__FOR(i, n) {
    size_t p = i % g.P, r = (i / g.P) % g.ckk, b = i / ((size_t)g.P * g.ckk);
    int kw = r % g.K, kh = (r / g.K) % g.K, c = r / (g.K * g.K);
    int h = (int)(p / g.ow) + kh - g.pad, w = (int)(p % g.ow) + kw - g.pad;
    col[i] = h >= 0 && h < g.H && w >= 0 && w < g.W
                 ? x[((b * g.C + c) * g.H + h) * g.W + w]
                 : 0.0f;
  }
}

// col is (B, C*K*K, OH*OW), dx is (B, C, H, W): the sum of the col entries
// read from each pixel, in (kh, kw) order
__global__ void kn__col2im(float *dx, const float *col, struct kn__geom g,
                           size_t n) {
  KN__FOR(i, n) {
    int w = i % g.W, h = (i / g.W) % g.H, c = (i / ((size_t)g.W * g.H)) % g.C;
    size_t b = i / ((size_t)g.W * g.H * g.C);
    const float *cb = col + b * g.ckk * g.P;
    float s = 0.0f;
    for (int kh = 0; kh < g.K; kh++) {
      int oi = h - kh + g.pad;
      if (oi < 0 || oi >= g.oh)
        continue;
      for (int kw = 0; kw < g.K; kw++) {
        int oj = w - kw + g.pad;
        if (oj >= 0 && oj < g.ow)
          s += cb[((size_t)(c * g.K + kh) * g.K + kw) * g.P + oi * g.ow + oj];
      }
    }
    dx[i] = s;
  }
}

// y is (B, OC, P), b is (OC) or NULL: y[n, o, :] = b[o] (or 0)
__global__ void kn__bias_planes(float *y, const float *b, int OC, int P,
                                size_t n) {
  KN__FOR(i, n) { y[i] = b ? b[(i / P) % OC] : 0.0f; }
}

// dy is (B, OC, P), db is (OC): db[o] = sum over n and p. One block per o
// (KN__THREADS threads, a power of two): each thread sums a stride of every
// plane n (reads of neighbouring threads are neighbours), then the block adds
// its threads' sums as a tree in shared memory: the same order on every run.
// (One thread per o read the B*P values of its plane one by one: 16 threads
// for the CNN's first layer, 2% of its sgemm's speed on an H200.)
__global__ void kn__plane_sums(float *db, const float *dy, int B, int OC,
                               int P) {
  __shared__ float part[KN__THREADS];
  int o = blockIdx.x;
  float s = 0.0f;

  for (int n = 0; n < B; n++)
    for (int p = threadIdx.x; p < P; p += blockDim.x)
      s += dy[((size_t)n * OC + o) * P + p];
  part[threadIdx.x] = s;
  __syncthreads();
  for (int h = blockDim.x / 2; h > 0; h >>= 1) {
    if (threadIdx.x < h)
      part[threadIdx.x] += part[threadIdx.x + h];
    __syncthreads();
  }
  if (threadIdx.x == 0)
    db[o] = part[0];
}

// part is (B, n): dw[i] = the sum of part[b][i] over b, in order of b.
__global__ void kn__sum_batches(float *dw, const float *part, int B, size_t n) {
  KN__FOR(i, n) {
    float s = 0.0f;
    for (int b = 0; b < B; b++)
      s += part[(size_t)b * n + i];
    dw[i] = s;
  }
}

int kn_conv2d_forward_cuda(struct kn_cuda *ctx, const struct kn_conv_shape *s,
                           float *y, const float *x, const float *w,
                           const float *b, float *col) {
  struct kn__geom g = kn__geom_of(s);
  size_t ny = (size_t)(s->B > 0 ? s->B : 0) * (s->OC > 0 ? s->OC : 0) *
              (g.P > 0 ? g.P : 0);
  size_t ncol = kn_conv_col_floats(s);
  const float one = 1.0f;
  int rc = 0;

  if (!ny)
    goto out;
  kn__bias_planes<<<kn__blocks(ny), KN__THREADS, 0, ctx->stream>>>(y, b, s->OC,
                                                                   g.P, ny);
  KN__TRY(cudaGetLastError());
  if (!ncol)
    goto out;
  kn__im2col<<<kn__blocks(ncol), KN__THREADS, 0, ctx->stream>>>(col, x, g,
                                                                ncol);
  KN__TRY(cudaGetLastError());
  /* Row-major y[n] (OC, P) += w (OC, ckk) col[n] (ckk, P), asked of
   * column-major cuBLAS as y[n]^T = col[n]^T w^T. */
  KN__TRY(cublasSgemmStridedBatched(ctx->blas, CUBLAS_OP_N, CUBLAS_OP_N, g.P,
                                    s->OC, g.ckk, &one, col, g.P,
                                    (long long)g.ckk * g.P, w, g.ckk, 0, &one,
                                    y, g.P, (long long)s->OC * g.P, s->B));
out:
  return rc;
}

int kn_conv2d_backward_cuda(struct kn_cuda *ctx, const struct kn_conv_shape *s,
                            float *dx, float *dw, float *db, const float *dy,
                            const float *x, const float *w, float *col) {
  struct kn__geom g = kn__geom_of(s);
  size_t ncol = kn_conv_col_floats(s);
  int rc = 0;

  if (s->OC > 0 && ncol && g.ckk > 0) {
    kn__im2col<<<kn__blocks(ncol), KN__THREADS, 0, ctx->stream>>>(col, x, g,
                                                                  ncol);
    KN__TRY(cudaGetLastError());
  }
  rc = kn_conv2d_backward_unfolded_cuda(ctx, s, dx, dw, db, dy, w, col);
out:
  return rc;
}

int kn_conv2d_backward_unfolded_cuda(struct kn_cuda *ctx,
                                     const struct kn_conv_shape *s, float *dx,
                                     float *dw, float *db, const float *dy,
                                     const float *w, float *col) {
  struct kn__geom g = kn__geom_of(s);
  size_t ncol = kn_conv_col_floats(s);
  size_t nx = (size_t)(s->B > 0 ? s->B : 0) * s->C * s->H * s->W;
  size_t ndw = (size_t)(s->OC > 0 ? s->OC : 0) * (g.ckk > 0 ? g.ckk : 0);
  const float one = 1.0f, zero = 0.0f;
  int rc = 0;

  if (s->OC <= 0)
    goto out;
  if (!ncol || g.ckk <= 0) {
    KN__TRY(cudaMemsetAsync(
        dw, 0, sizeof(float) * s->OC * (g.ckk > 0 ? g.ckk : 0), ctx->stream));
    KN__TRY(cudaMemsetAsync(db, 0, sizeof(float) * s->OC, ctx->stream));
    if (dx && nx)
      KN__TRY(cudaMemsetAsync(dx, 0, sizeof(float) * nx, ctx->stream));
    goto out;
  }
  kn__plane_sums<<<s->OC, KN__THREADS, 0, ctx->stream>>>(db, dy, s->B, s->OC,
                                                         g.P);
  KN__TRY(cudaGetLastError());
  /* dw (OC, ckk) = sum over n of dy[n] (OC, P) col[n]^T (P, ckk): every
   * example's product in one batched call, into scratch part (B, OC, ckk),
   * then summed over n in order (one small cuBLAS call per example cost
   * 64 launches a step). Row-major part[n] = dy[n] col[n]^T, asked of
   * column-major cuBLAS as part[n]^T = col[n] dy[n]^T. */
  if ((rc = kn__cuda_scratch(ctx, sizeof(float) * ndw * s->B)) < 0)
    goto out;
  KN__TRY(cublasSgemmStridedBatched(
      ctx->blas, CUBLAS_OP_T, CUBLAS_OP_N, g.ckk, s->OC, g.P, &one, col, g.P,
      (long long)g.ckk * g.P, dy, g.P, (long long)s->OC * g.P, &zero,
      (float *)ctx->scratch, g.ckk, (long long)ndw, s->B));
  kn__sum_batches<<<kn__blocks(ndw), KN__THREADS, 0, ctx->stream>>>(
      dw, (const float *)ctx->scratch, s->B, ndw);
  KN__TRY(cudaGetLastError());
  if (!dx)
    goto out;
  /* Row-major dcol[n] (ckk, P) = w^T (ckk, OC) dy[n] (OC, P), into col;
   * column-major: dcol[n]^T = dy[n]^T w. */
  KN__TRY(cublasSgemmStridedBatched(ctx->blas, CUBLAS_OP_N, CUBLAS_OP_T, g.P,
                                    g.ckk, s->OC, &one, dy, g.P,
                                    (long long)s->OC * g.P, w, g.ckk, 0, &zero,
                                    col, g.P, (long long)g.ckk * g.P, s->B));
  kn__col2im<<<kn__blocks(nx), KN__THREADS, 0, ctx->stream>>>(dx, col, g, nx);
  KN__TRY(cudaGetLastError());
out:
  return rc;
}

// x is (planes, H, W), y and idx are (planes, H/P, W/P)
__global__ void kn__pool_fwd(float *y, int32_t *idx, const float *x, int H,
                             int W, int P, size_t n) {
  int oh = H / P, ow = W / P;

  KN__FOR(o, n) {
    int j = o % ow, i = (o / ow) % oh;
    const float *xc = x + (o / ((size_t)oh * ow)) * H * W;
    int best = i * P * W + j * P;
    for (int a = 0; a < P; a++)
      for (int b = 0; b < P; b++) {
        int at = (i * P + a) * W + j * P + b;
        if (xc[at] > xc[best])
          best = at;
      }
    y[o] = xc[best];
    idx[o] = best;
  }
}

int kn_maxpool2d_forward_cuda(struct kn_cuda *ctx, float *y, int32_t *idx,
                              const float *x, int planes, int H, int W, int P) {
  size_t n = (size_t)(planes > 0 ? planes : 0) * (H / P) * (W / P);

  if (!n)
    return 0;
  kn__pool_fwd<<<kn__blocks(n), KN__THREADS, 0, ctx->stream>>>(y, idx, x, H, W,
                                                               P, n);
  return KN__CHECK(cudaGetLastError());
}

// dy and idx are (planes, H/P, W/P), dx is (planes, H, W), zeroed before
__global__ void kn__pool_bwd(float *dx, const float *dy, const int32_t *idx,
                             int H, int W, int P, size_t n) {
  size_t per = (size_t)(H / P) * (W / P);

  KN__FOR(o, n) { dx[(o / per) * H * W + idx[o]] = dy[o]; }
}

int kn_maxpool2d_backward_cuda(struct kn_cuda *ctx, float *dx, const float *dy,
                               const int32_t *idx, int planes, int H, int W,
                               int P) {
  size_t n = (size_t)(planes > 0 ? planes : 0) * (H / P) * (W / P);
  size_t nx = (size_t)(planes > 0 ? planes : 0) * H * W;
  int rc = 0;

  if (!nx)
    goto out;
  KN__TRY(cudaMemsetAsync(dx, 0, sizeof(float) * nx, ctx->stream));
  if (!n)
    goto out;
  kn__pool_bwd<<<kn__blocks(n), KN__THREADS, 0, ctx->stream>>>(dx, dy, idx, H,
                                                               W, P, n);
  KN__TRY(cudaGetLastError());
out:
  return rc;
}
