/* CPU twins of the ops in conv.h: convolution as im2col + OpenBLAS sgemm,
 * one GEMM for the whole batch (but the input's gradient, made a few
 * examples at a time), and max pooling as plain loops. The oracle for
 * conv_cuda.cu. */
#include "conv.h"

#include <cblas.h>
#include <string.h>

int kn_conv_oh(const struct kn_conv_shape *s) {
  return s->H + 2 * s->pad - s->K + 1;
}

int kn_conv_ow(const struct kn_conv_shape *s) {
  return s->W + 2 * s->pad - s->K + 1;
}

size_t kn_conv_col_floats(const struct kn_conv_shape *s) {
  int oh = kn_conv_oh(s), ow = kn_conv_ow(s);

  if (s->B <= 0 || oh <= 0 || ow <= 0)
    return 0;
  return (size_t)s->B * oh * ow * ((size_t)s->C * s->K * s->K + s->OC);
}

/* The output columns [*j0, *j1) whose input column j + kw - pad lies inside
 * the image; the others read zero padding. */
static void inside(const struct kn_conv_shape *s, int kw, int ow, int *j0,
                   int *j1) {
  *j0 = s->pad - kw > 0 ? s->pad - kw : 0;
  *j1 = s->W + s->pad - kw < ow ? s->W + s->pad - kw : ow;
  if (*j1 < *j0)
    *j1 = *j0;
}

/* Rows of 10 to 28 floats (the demo CNN's) are copied, zeroed and summed
 * by loops of our own: memcpy and memset cost more per call than the row
 * does, and im2col made three calls a row (the unfolding and its adjoint
 * took half of a CNN worker's time). conv_cpu.c is built on its own at -O3
 * without loop-to-call rewriting (kernels/meson.build), so these loops are
 * vectorized in place; the values are the same copies and the same sums in
 * the same order. */
static inline void zero_run(float *restrict d, size_t n) {
  for (size_t j = 0; j < n; j++)
    d[j] = 0.0f;
}

/* x is (C, H, W) of one example; col holds C*K*K rows ld floats apart, and
 * this example's OH*OW columns of row (c, kh, kw) are
 * x[c, oh + kh - pad, ow + kw - pad] for every output pixel. */
static void im2col(const struct kn_conv_shape *s, float *restrict col,
                   size_t ld, const float *restrict x) {
  int oh = kn_conv_oh(s), ow = kn_conv_ow(s), K = s->K, j0, j1;

  for (int c = 0; c < s->C; c++)
    for (int kh = 0; kh < K; kh++)
      for (int kw = 0; kw < K; kw++) {
        float *row = col + (size_t)((c * K + kh) * K + kw) * ld;
        int shift = kw - s->pad;
        inside(s, kw, ow, &j0, &j1);
        for (int i = 0; i < oh; i++) {
          int h = i + kh - s->pad;
          float *restrict dst = row + (size_t)i * ow;
          if (h < 0 || h >= s->H) {
            zero_run(dst, ow);
            continue;
          }
          const float *restrict src = x + ((size_t)c * s->H + h) * s->W;
          zero_run(dst, j0);
          for (int j = j0; j < j1; j++)
            dst[j] = src[j + shift];
          zero_run(dst + j1, ow - j1);
        }
      }
}

/* The adjoint of im2col: dx (C, H, W) = the sum of every col entry that was
 * read from each pixel. dx is overwritten. */
static void col2im(const struct kn_conv_shape *s, float *restrict dx,
                   const float *restrict col, size_t ld) {
  int oh = kn_conv_oh(s), ow = kn_conv_ow(s), K = s->K, j0, j1;

  zero_run(dx, (size_t)s->C * s->H * s->W);
  for (int c = 0; c < s->C; c++)
    for (int kh = 0; kh < K; kh++)
      for (int kw = 0; kw < K; kw++) {
        const float *row = col + (size_t)((c * K + kh) * K + kw) * ld;
        int shift = kw - s->pad;
        inside(s, kw, ow, &j0, &j1);
        for (int i = 0; i < oh; i++) {
          int h = i + kh - s->pad;
          if (h < 0 || h >= s->H)
            continue;
          float *restrict d = dx + ((size_t)c * s->H + h) * s->W;
          const float *restrict r = row + (size_t)i * ow;
          for (int j = j0; j < j1; j++)
            d[j + shift] += r[j];
        }
      }
}

/* The whole batch is one GEMM: col is (C*K*K, B*OH*OW), example n's columns
 * at n*OH*OW, followed by t (OC, B*OH*OW), the output in GEMM order, which
 * is then scattered to NCHW with the bias. One big GEMM runs several times
 * faster than B small ones at these shapes. */
void kn_conv2d_forward(const struct kn_conv_shape *s, float *y, const float *x,
                       const float *w, const float *b, float *col) {
  int P = kn_conv_oh(s) * kn_conv_ow(s), ckk = s->C * s->K * s->K;
  size_t NP = (size_t)(s->B > 0 ? s->B : 0) * (P > 0 ? P : 0);
  size_t nx = (size_t)s->C * s->H * s->W;
  float *t = col + (size_t)(ckk > 0 ? ckk : 0) * NP;

  if (!NP || s->OC <= 0)
    return;
  if (ckk <= 0) {
    for (size_t i = 0; i < (size_t)s->B * s->OC * P; i++)
      y[i] = b ? b[i / P % s->OC] : 0.0f;
    return;
  }
  for (int n = 0; n < s->B; n++)
    im2col(s, col + (size_t)n * P, NP, x + n * nx);
  /* t (OC, NP) = w (OC, ckk) col (ckk, NP) */
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s->OC, (int)NP, ckk,
              1.0f, w, ckk, col, (int)NP, 0.0f, t, (int)NP);
  for (int n = 0; n < s->B; n++)
    for (int o = 0; o < s->OC; o++) {
      float *yo = y + ((size_t)n * s->OC + o) * P, bo = b ? b[o] : 0.0f;
      const float *to = t + (size_t)o * NP + (size_t)n * P;
      for (int p = 0; p < P; p++)
        yo[p] = to[p] + bo;
    }
}

/* The same layout as the forward pass: t holds dy in GEMM order, col the
 * unfolded input and then its gradient. */
void kn_conv2d_backward(const struct kn_conv_shape *s, float *dx, float *dw,
                        float *db, const float *dy, const float *x,
                        const float *w, float *col) {
  int P = kn_conv_oh(s) * kn_conv_ow(s), ckk = s->C * s->K * s->K;
  size_t NP = (size_t)(s->B > 0 ? s->B : 0) * (P > 0 ? P : 0);
  size_t nx = (size_t)s->C * s->H * s->W;

  if (NP && s->OC > 0 && ckk > 0)
    for (int n = 0; n < s->B; n++)
      im2col(s, col + (size_t)n * P, NP, x + n * nx);
  kn_conv2d_backward_unfolded(s, dx, dw, db, dy, w, col);
}

/* Copies the n floats of src to dst and returns their sum, taken in a
 * fixed order: 16 running sums (sum k adds src[k], src[k + 16], ...), added
 * pairwise, then the tail. One running sum was a chain of dependent adds,
 * 4 cycles a float: the first layer's 16 x 50,176 took a millisecond. */
static float copy_sum(float *restrict dst, const float *restrict src,
                      size_t n) {
  float lane[16] = {0.0f}, sum;
  size_t i = 0;

  for (; i + 16 <= n; i += 16)
    for (int k = 0; k < 16; k++) {
      dst[i + k] = src[i + k];
      lane[k] += src[i + k];
    }
  for (int h = 8; h > 0; h /= 2)
    for (int k = 0; k < h; k++)
      lane[k] += lane[k + h];
  sum = lane[0];
  for (; i < n; i++) {
    dst[i] = src[i];
    sum += src[i];
  }
  return sum;
}

/* Floats of the input's gradient in GEMM order (dcol) made and folded back
 * (col2im) at a time, E examples' worth: 256 KB stays in cache from the
 * GEMM that writes it to the col2im that reads it. The whole batch's dcol
 * at once, 10 MB in the CNN's second layer, went to memory and back (the
 * step took 11.9 ms, 10.6 chunked; 64 KB to 2 MB chunks ran the same). */
#define KN__DCOL_FLOATS ((size_t)64 * 1024)

void kn_conv2d_backward_unfolded(const struct kn_conv_shape *s, float *dx,
                                 float *dw, float *db, const float *dy,
                                 const float *w, float *col) {
  int P = kn_conv_oh(s) * kn_conv_ow(s), ckk = s->C * s->K * s->K;
  size_t NP = (size_t)(s->B > 0 ? s->B : 0) * (P > 0 ? P : 0);
  size_t nx = (size_t)s->C * s->H * s->W;
  float *t = col + (size_t)(ckk > 0 ? ckk : 0) * NP;

  if (!NP || s->OC <= 0 || ckk <= 0) {
    memset(dw, 0,
           sizeof(float) * (size_t)(s->OC > 0 ? s->OC : 0) *
               (ckk > 0 ? ckk : 0));
    memset(db, 0, sizeof(float) * (size_t)(s->OC > 0 ? s->OC : 0));
    if (dx && s->B > 0)
      memset(dx, 0, sizeof(float) * nx * s->B);
    return;
  }
  /* t (OC, NP) = dy in GEMM order; db[o] the sum of its plane sums, in
   * order of n. */
  for (int o = 0; o < s->OC; o++)
    db[o] = 0.0f;
  for (int n = 0; n < s->B; n++)
    for (int o = 0; o < s->OC; o++)
      db[o] += copy_sum(t + (size_t)o * NP + (size_t)n * P,
                        dy + ((size_t)n * s->OC + o) * P, P);
  /* dw (OC, ckk) = t (OC, NP) col^T (NP, ckk) */
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s->OC, ckk, (int)NP,
              1.0f, t, (int)NP, col, (int)NP, 0.0f, dw, ckk);
  if (!dx)
    return;
  /* dcol (ckk, E*P) = w^T (ckk, OC) t (OC, E*P) for E examples at a time,
   * into the start of col (done with), and col2im from there while it is
   * still in cache. */
  int E = (int)(KN__DCOL_FLOATS / ((size_t)ckk * P));
  E = E < 1 ? 1 : E > s->B ? s->B : E;
  for (int n0 = 0; n0 < s->B; n0 += E) {
    int e = s->B - n0 < E ? s->B - n0 : E;
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, ckk, e * P, s->OC,
                1.0f, w, ckk, t + (size_t)n0 * P, (int)NP, 0.0f, col, e * P);
    for (int n = 0; n < e; n++)
      col2im(s, dx + (n0 + n) * nx, col + (size_t)n * P, (size_t)e * P);
  }
}

/* A 2 x 2 window's maximum and its position, the first on ties, as the
 * general loop below finds them (2 x 2 is the demo CNN's pooling). */
static void maxpool2(float *y, int32_t *idx, const float *x, int planes, int H,
                     int W) {
  int oh = H / 2, ow = W / 2;

  for (int c = 0; c < planes; c++) {
    const float *xc = x + (size_t)c * H * W;
    float *yc = y + (size_t)c * oh * ow;
    int32_t *ic = idx + (size_t)c * oh * ow;
    for (int i = 0; i < oh; i++) {
      const float *r0 = xc + (size_t)(2 * i) * W, *r1 = r0 + W;
      for (int j = 0; j < ow; j++) {
        int at = 2 * i * W + 2 * j;
        float m = r0[2 * j];
        if (r0[2 * j + 1] > m)
          m = r0[2 * j + 1], at = 2 * i * W + 2 * j + 1;
        if (r1[2 * j] > m)
          m = r1[2 * j], at = (2 * i + 1) * W + 2 * j;
        if (r1[2 * j + 1] > m)
          m = r1[2 * j + 1], at = (2 * i + 1) * W + 2 * j + 1;
        yc[i * ow + j] = m;
        ic[i * ow + j] = at;
      }
    }
  }
}

void kn_maxpool2d_forward(float *y, int32_t *idx, const float *x, int planes,
                          int H, int W, int P) {
  int oh = H / P, ow = W / P;

  if (P == 2) {
    maxpool2(y, idx, x, planes, H, W);
    return;
  }
  for (int c = 0; c < planes; c++) {
    const float *xc = x + (size_t)c * H * W;
    for (int i = 0; i < oh; i++)
      for (int j = 0; j < ow; j++) {
        int best = i * P * W + j * P;
        for (int a = 0; a < P; a++)
          for (int b = 0; b < P; b++) {
            int at = (i * P + a) * W + j * P + b;
            if (xc[at] > xc[best])
              best = at;
          }
        size_t o = ((size_t)c * oh + i) * ow + j;
        y[o] = xc[best];
        idx[o] = best;
      }
  }
}

void kn_maxpool2d_backward(float *dx, const float *dy, const int32_t *idx,
                           int planes, int H, int W, int P) {
  int oh = H / P, ow = W / P;

  memset(dx, 0, sizeof(float) * (size_t)planes * H * W);
  for (int c = 0; c < planes; c++)
    for (int o = 0; o < oh * ow; o++)
      dx[(size_t)c * H * W + idx[(size_t)c * oh * ow + o]] +=
          dy[(size_t)c * oh * ow + o];
}
