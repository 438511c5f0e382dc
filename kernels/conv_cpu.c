/* CPU twins of the ops in conv.h: convolution as im2col + OpenBLAS sgemm,
 * one GEMM per example, and max pooling as plain loops. The oracle for
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
  return (size_t)s->B * s->C * s->K * s->K * oh * ow;
}

/* x is (C, H, W) of one example, col is (C*K*K, OH*OW): row (c, kh, kw)
 * holds x[c, oh + kh - pad, ow + kw - pad] for every output pixel. */
static void im2col(const struct kn_conv_shape *s, float *col, const float *x) {
  int oh = kn_conv_oh(s), ow = kn_conv_ow(s), K = s->K;

  for (int c = 0; c < s->C; c++)
    for (int kh = 0; kh < K; kh++)
      for (int kw = 0; kw < K; kw++) {
        float *row = col + ((size_t)(c * K + kh) * K + kw) * oh * ow;
        for (int i = 0; i < oh; i++) {
          int h = i + kh - s->pad;
          for (int j = 0; j < ow; j++) {
            int w = j + kw - s->pad;
            row[i * ow + j] = h >= 0 && h < s->H && w >= 0 && w < s->W
                                  ? x[((size_t)c * s->H + h) * s->W + w]
                                  : 0.0f;
          }
        }
      }
}

/* The adjoint of im2col: dx (C, H, W) = the sum of every col entry that was
 * read from each pixel. dx is overwritten. */
static void col2im(const struct kn_conv_shape *s, float *dx, const float *col) {
  int oh = kn_conv_oh(s), ow = kn_conv_ow(s), K = s->K;

  memset(dx, 0, sizeof(float) * s->C * s->H * s->W);
  for (int c = 0; c < s->C; c++)
    for (int kh = 0; kh < K; kh++)
      for (int kw = 0; kw < K; kw++) {
        const float *row = col + ((size_t)(c * K + kh) * K + kw) * oh * ow;
        for (int i = 0; i < oh; i++) {
          int h = i + kh - s->pad;
          if (h < 0 || h >= s->H)
            continue;
          for (int j = 0; j < ow; j++) {
            int w = j + kw - s->pad;
            if (w >= 0 && w < s->W)
              dx[((size_t)c * s->H + h) * s->W + w] += row[i * ow + j];
          }
        }
      }
}

void kn_conv2d_forward(const struct kn_conv_shape *s, float *y, const float *x,
                       const float *w, const float *b, float *col) {
  int P = kn_conv_oh(s) * kn_conv_ow(s), ckk = s->C * s->K * s->K;

  if (s->B <= 0 || P <= 0 || s->OC <= 0)
    return;
  for (int n = 0; n < s->B; n++) {
    float *yn = y + (size_t)n * s->OC * P;
    float *cn = col + (size_t)n * ckk * P;

    for (int o = 0; o < s->OC; o++)
      for (int p = 0; p < P; p++)
        yn[(size_t)o * P + p] = b ? b[o] : 0.0f;
    if (ckk <= 0)
      continue;
    im2col(s, cn, x + (size_t)n * s->C * s->H * s->W);
    /* yn (OC, P) += w (OC, ckk) cn (ckk, P) */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s->OC, P, ckk, 1.0f,
                w, ckk, cn, P, 1.0f, yn, P);
  }
}

void kn_conv2d_backward(const struct kn_conv_shape *s, float *dx, float *dw,
                        float *db, const float *dy, const float *x,
                        const float *w, float *col) {
  int P = kn_conv_oh(s) * kn_conv_ow(s), ckk = s->C * s->K * s->K;
  size_t nx = (size_t)s->C * s->H * s->W;

  memset(dw, 0,
         sizeof(float) * (size_t)(s->OC > 0 ? s->OC : 0) * (ckk > 0 ? ckk : 0));
  memset(db, 0, sizeof(float) * (size_t)(s->OC > 0 ? s->OC : 0));
  if (s->B <= 0 || s->OC <= 0 || P <= 0 || ckk <= 0) {
    if (dx && s->B > 0)
      memset(dx, 0, sizeof(float) * nx * s->B);
    return;
  }
  for (int n = 0; n < s->B; n++) {
    const float *dyn = dy + (size_t)n * s->OC * P;
    float *cn = col + (size_t)n * ckk * P;

    for (int o = 0; o < s->OC; o++)
      for (int p = 0; p < P; p++)
        db[o] += dyn[(size_t)o * P + p];
    im2col(s, cn, x + (size_t)n * nx);
    /* dw (OC, ckk) += dyn (OC, P) cn^T (P, ckk) */
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, s->OC, ckk, P, 1.0f,
                dyn, P, cn, P, 1.0f, dw, ckk);
    if (!dx)
      continue;
    /* dcol (ckk, P) = w^T (ckk, OC) dyn (OC, P), into cn: its columns are
     * no longer needed. */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, ckk, P, s->OC, 1.0f, w,
                ckk, dyn, P, 0.0f, cn, P);
    col2im(s, dx + (size_t)n * nx, cn);
  }
}

void kn_maxpool2d_forward(float *y, int32_t *idx, const float *x, int planes,
                          int H, int W, int P) {
  int oh = H / P, ow = W / P;

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
