/* CUDA twins of optim_cpu.c (optim_cuda.h). One grid-stride kernel per
 * update, each thread doing its elements' float operations in the CPU
 * version's order with explicitly rounded intrinsics (__fmul_rn, __fadd_rn,
 * __fdiv_rn, __fsqrt_rn), so that nvcc fuses nothing and the results are
 * the oracle's bit for bit. The per-update constants of Adam come from the
 * same host function as on the CPU (kn_adam_consts). */
#include "optim_cuda.h"

#include "cuda_ctx.cuh"

/* Most blocks of the norm's first pass: its partial sums fit the scratch. */
#define KN__SUM_BLOCKS 1024

// g + wd*w when L2, else g
template <bool L2> __device__ float kn__l2(float g, float w, float wd) {
  return L2 ? __fadd_rn(g, __fmul_rn(wd, w)) : g;
}

// w, g are (n): w = w - lr*g'
template <bool L2>
__global__ void kn__sgd_step(float *w, const float *g, size_t n, float lr,
                             float wd) {
  KN__FOR(i, n) {
    float gi = kn__l2<L2>(g[i], w[i], wd);
    w[i] = __fsub_rn(w[i], __fmul_rn(lr, gi));
  }
}

// w, v, g are (n): v = mu*v + g'; w = w - lr*v (nesterov: lr*(g' + mu*v))
template <bool L2, bool NAG>
__global__ void kn__mom_step(float *w, float *v, const float *g, size_t n,
                             float lr, float mu, float wd) {
  KN__FOR(i, n) {
    float gi = kn__l2<L2>(g[i], w[i], wd);
    float vi = __fadd_rn(__fmul_rn(mu, v[i]), gi);
    v[i] = vi;
    float d = NAG ? __fadd_rn(gi, __fmul_rn(mu, vi)) : vi;
    w[i] = __fsub_rn(w[i], __fmul_rn(lr, d));
  }
}

// w, a, g are (n): a = a + g'*g'; w = w - lr*(g' / (sqrt(a) + eps))
template <bool L2>
__global__ void kn__adagrad_step(float *w, float *a, const float *g, size_t n,
                                 float lr, float eps, float wd) {
  KN__FOR(i, n) {
    float gi = kn__l2<L2>(g[i], w[i], wd);
    float ai = __fadd_rn(a[i], __fmul_rn(gi, gi));
    a[i] = ai;
    float q = __fdiv_rn(gi, __fadd_rn(__fsqrt_rn(ai), eps));
    w[i] = __fsub_rn(w[i], __fmul_rn(lr, q));
  }
}

// w, m, v, g are (n): adam (L2 or not) or adamw (DECOUPLED), as
// kn__adam_i in optim_cpu.c
template <bool L2, bool DECOUPLED>
__global__ void kn__adam_step(float *w, float *m, float *v, const float *g,
                              size_t n, struct kn_adam_consts c, float eps,
                              float wd) {
  KN__FOR(i, n) {
    float wi = DECOUPLED ? __fmul_rn(w[i], c.decay) : w[i];
    float gi = kn__l2<L2>(g[i], wi, wd);
    float mi = __fadd_rn(__fmul_rn(c.b1, m[i]), __fmul_rn(c.omb1, gi));
    float vi =
        __fadd_rn(__fmul_rn(c.b2, v[i]), __fmul_rn(c.omb2, __fmul_rn(gi, gi)));
    m[i] = mi;
    v[i] = vi;
    float den = __fadd_rn(__fmul_rn(__fsqrt_rn(vi), c.rbc2), eps);
    w[i] = __fsub_rn(wi, __fmul_rn(c.step, __fdiv_rn(mi, den)));
  }
}

int kn_sgd_step_cuda(struct kn_cuda *ctx, float *w, const float *g, size_t n,
                     const struct kn_optim_hp *hp) {
  if (!n)
    return 0;
  if (hp->weight_decay != 0.0f)
    kn__sgd_step<true><<<kn__blocks(n), KN__THREADS, 0, ctx->stream>>>(
        w, g, n, hp->lr, hp->weight_decay);
  else
    kn__sgd_step<false>
        <<<kn__blocks(n), KN__THREADS, 0, ctx->stream>>>(w, g, n, hp->lr, 0.0f);
  return KN__CHECK(cudaGetLastError());
}

/* Momentum or Nesterov, with or without L2. */
static int kn__mom(struct kn_cuda *ctx, float *w, float *v, const float *g,
                   size_t n, const struct kn_optim_hp *hp, bool nag) {
  unsigned b = kn__blocks(n);
  float lr = hp->lr, mu = hp->momentum, wd = hp->weight_decay;

  if (!n)
    return 0;
  if (wd != 0.0f && nag)
    kn__mom_step<true, true>
        <<<b, KN__THREADS, 0, ctx->stream>>>(w, v, g, n, lr, mu, wd);
  else if (wd != 0.0f)
    kn__mom_step<true, false>
        <<<b, KN__THREADS, 0, ctx->stream>>>(w, v, g, n, lr, mu, wd);
  else if (nag)
    kn__mom_step<false, true>
        <<<b, KN__THREADS, 0, ctx->stream>>>(w, v, g, n, lr, mu, 0.0f);
  else
    kn__mom_step<false, false>
        <<<b, KN__THREADS, 0, ctx->stream>>>(w, v, g, n, lr, mu, 0.0f);
  return KN__CHECK(cudaGetLastError());
}

int kn_momentum_step_cuda(struct kn_cuda *ctx, float *w, float *v,
                          const float *g, size_t n,
                          const struct kn_optim_hp *hp) {
  return kn__mom(ctx, w, v, g, n, hp, false);
}

int kn_nesterov_step_cuda(struct kn_cuda *ctx, float *w, float *v,
                          const float *g, size_t n,
                          const struct kn_optim_hp *hp) {
  return kn__mom(ctx, w, v, g, n, hp, true);
}

int kn_adagrad_step_cuda(struct kn_cuda *ctx, float *w, float *a,
                         const float *g, size_t n,
                         const struct kn_optim_hp *hp) {
  unsigned b = kn__blocks(n);

  if (!n)
    return 0;
  if (hp->weight_decay != 0.0f)
    kn__adagrad_step<true><<<b, KN__THREADS, 0, ctx->stream>>>(
        w, a, g, n, hp->lr, hp->eps, hp->weight_decay);
  else
    kn__adagrad_step<false>
        <<<b, KN__THREADS, 0, ctx->stream>>>(w, a, g, n, hp->lr, hp->eps, 0.0f);
  return KN__CHECK(cudaGetLastError());
}

/* Adam with or without L2, or AdamW. */
static int kn__adam(struct kn_cuda *ctx, float *w, float *m, float *v,
                    const float *g, size_t n, const struct kn_optim_hp *hp,
                    bool adamw) {
  struct kn_adam_consts c;
  unsigned b = kn__blocks(n);

  if (!n)
    return 0;
  kn_adam_consts(&c, hp, adamw);
  if (adamw)
    kn__adam_step<false, true>
        <<<b, KN__THREADS, 0, ctx->stream>>>(w, m, v, g, n, c, hp->eps, 0.0f);
  else if (hp->weight_decay != 0.0f)
    kn__adam_step<true, false><<<b, KN__THREADS, 0, ctx->stream>>>(
        w, m, v, g, n, c, hp->eps, hp->weight_decay);
  else
    kn__adam_step<false, false>
        <<<b, KN__THREADS, 0, ctx->stream>>>(w, m, v, g, n, c, hp->eps, 0.0f);
  return KN__CHECK(cudaGetLastError());
}

int kn_adam_step_cuda(struct kn_cuda *ctx, float *w, float *m, float *v,
                      const float *g, size_t n, const struct kn_optim_hp *hp) {
  return kn__adam(ctx, w, m, v, g, n, hp, false);
}

int kn_adamw_step_cuda(struct kn_cuda *ctx, float *w, float *m, float *v,
                       const float *g, size_t n, const struct kn_optim_hp *hp) {
  return kn__adam(ctx, w, m, v, g, n, hp, true);
}

// x is (n), part is (gridDim.x): part[b] = block b's share of sum x[i]^2,
// in double (each thread's grid-stride elements, then a tree in the block)
__global__ void kn__sumsq_part(double *part, const float *x, size_t n) {
  __shared__ double s[KN__THREADS];
  unsigned t = threadIdx.x;
  double acc = 0.0;

  KN__FOR(i, n) { acc += (double)x[i] * (double)x[i]; }
  s[t] = acc;
  __syncthreads();
  for (unsigned k = KN__THREADS / 2; k > 0; k >>= 1) {
    if (t < k)
      s[t] += s[t + k];
    __syncthreads();
  }
  if (t == 0)
    part[blockIdx.x] = s[0];
}

// part is (nparts): part[0] = their sum; one block
__global__ void kn__sum_parts(double *part, unsigned nparts) {
  __shared__ double s[KN__THREADS];
  unsigned t = threadIdx.x;
  double acc = 0.0;

  for (unsigned i = t; i < nparts; i += KN__THREADS)
    acc += part[i];
  s[t] = acc;
  __syncthreads();
  for (unsigned k = KN__THREADS / 2; k > 0; k >>= 1) {
    if (t < k)
      s[t] += s[t + k];
    __syncthreads();
  }
  if (t == 0)
    part[0] = s[0];
}

int kn_sumsq_cuda(struct kn_cuda *ctx, double *out, const float *x, size_t n) {
  unsigned blocks = kn__blocks(n);
  double *part;
  int rc = 0;

  *out = 0.0;
  if (!n)
    goto out;
  if (blocks > KN__SUM_BLOCKS)
    blocks = KN__SUM_BLOCKS;
  if ((rc = kn__cuda_scratch(ctx, blocks * sizeof(double))) < 0)
    goto out;
  part = (double *)ctx->scratch;
  kn__sumsq_part<<<blocks, KN__THREADS, 0, ctx->stream>>>(part, x, n);
  KN__TRY(cudaGetLastError());
  kn__sum_parts<<<1, KN__THREADS, 0, ctx->stream>>>(part, blocks);
  KN__TRY(cudaGetLastError());
  KN__TRY(cudaMemcpyAsync(out, part, sizeof *out, cudaMemcpyDeviceToHost,
                          ctx->stream));
  KN__TRY(cudaStreamSynchronize(ctx->stream));
out:
  return rc;
}

// x is (n): x = x * s
__global__ void kn__scale(float *x, size_t n, float s) {
  KN__FOR(i, n) { x[i] = __fmul_rn(x[i], s); }
}

int kn_scale_cuda(struct kn_cuda *ctx, float *x, size_t n, float s) {
  if (!n)
    return 0;
  kn__scale<<<kn__blocks(n), KN__THREADS, 0, ctx->stream>>>(x, n, s);
  return KN__CHECK(cudaGetLastError());
}

int kn_clip_global_norm_cuda(struct kn_cuda *ctx, double *norm, float *g,
                             size_t n, double max_norm) {
  double ss = 0.0, nrm;
  int rc;

  if ((rc = kn_sumsq_cuda(ctx, &ss, g, n)) < 0)
    return rc;
  nrm = sqrt(ss);
  if (norm)
    *norm = nrm;
  if (max_norm > 0 && nrm > max_norm)
    rc = kn_scale_cuda(ctx, g, n, (float)(max_norm / nrm));
  return rc;
}
