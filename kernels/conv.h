/* 2-D convolution and max pooling, the layers of the demo CNN. Tensors are
 * NCHW, row-major f32: x (B, C, H, W) holds example n's channel c at
 * x + ((n * C + c) * H + h) * W + w. Convolution is stride 1 with zero
 * padding `pad` on every side, done as im2col + GEMM: each example's input
 * is unfolded into C*K*K rows of OH*OW columns and y[n] (OC, OH*OW) =
 * w (OC, C*K*K) col[n]. The CPU twins (conv_cpu.c, OpenBLAS) are the oracle;
 * the CUDA twins (conv_cuda.h) take the same shapes on device pointers. */
#ifndef KN_CONV_H
#define KN_CONV_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The shape of one convolution layer over a batch. */
struct kn_conv_shape {
  int B;   /* examples */
  int C;   /* input channels */
  int H;   /* input height */
  int W;   /* input width */
  int OC;  /* output channels */
  int K;   /* square kernel size */
  int pad; /* zero padding on each side */
};

/* Output height and width: H + 2 pad - K + 1 (and likewise for W). */
int kn_conv_oh(const struct kn_conv_shape *s);
int kn_conv_ow(const struct kn_conv_shape *s);

/* Floats of the workspace both twins take: B * OH*OW * (C*K*K + OC), the
 * unfolded input and the output in GEMM order. */
size_t kn_conv_col_floats(const struct kn_conv_shape *s);

/* x is (B, C, H, W), w is (OC, C, K, K), b is (OC) or NULL,
 * y is (B, OC, OH, OW), col is workspace of kn_conv_col_floats floats, left
 * holding x unfolded for kn_conv2d_backward_unfolded:
 * y[n, o] = b[o] + sum over c, kh, kw of w[o, c, kh, kw] *
 *           x[n, c, oh + kh - pad, ow + kw - pad] (0 outside x). */
void kn_conv2d_forward(const struct kn_conv_shape *s, float *y, const float *x,
                       const float *w, const float *b, float *col);

/* dy is (B, OC, OH, OW), x and w as in the forward pass, col workspace as
 * there (its contents are overwritten). dw (OC, C, K, K) and db (OC) are the
 * gradients of the loss summed over the batch, overwritten; dx (B, C, H, W)
 * is overwritten unless NULL (the first layer needs none). */
void kn_conv2d_backward(const struct kn_conv_shape *s, float *dx, float *dw,
                        float *db, const float *dy, const float *x,
                        const float *w, float *col);

/* kn_conv2d_backward without unfolding x again: col is the workspace that
 * kn_conv2d_forward of the same s and x left (the forward pass leaves x
 * unfolded in it), untouched since; the results are the same bit for bit.
 * col is overwritten as in kn_conv2d_backward. A model that keeps one col
 * per layer from its forward pass to its backward pass skips an unfolding
 * per layer and step. */
void kn_conv2d_backward_unfolded(const struct kn_conv_shape *s, float *dx,
                                 float *dw, float *db, const float *dy,
                                 const float *w, float *col);

/* x is (planes, H, W), y and idx are (planes, H/P, W/P) (rounded down):
 * non-overlapping P x P windows, y = the window's maximum and idx its
 * position h * W + w within the plane (the first one on ties). */
void kn_maxpool2d_forward(float *y, int32_t *idx, const float *x, int planes,
                          int H, int W, int P);

/* dy and idx are (planes, H/P, W/P), dx is (planes, H, W), overwritten:
 * each dy goes to the position its window's maximum came from, the rest of
 * dx is 0. */
void kn_maxpool2d_backward(float *dx, const float *dy, const int32_t *idx,
                           int planes, int H, int W, int P);

#ifdef __cplusplus
}
#endif

#endif
