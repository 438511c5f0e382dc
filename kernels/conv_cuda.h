/* CUDA twins of the ops in conv.h, with the same names plus _cuda, the same
 * shapes (NCHW) and the same col workspace, all on device pointers, queued
 * on the context's stream (see dense_cuda.h for the context and the error
 * rules). Each returns 0 or CM_ECUDA. Includable from C. */
#ifndef KN_CONV_CUDA_H
#define KN_CONV_CUDA_H

#include "conv.h"
#include "dense_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* As kn_conv2d_forward; x, w, b (or NULL), y and col on the device. */
int kn_conv2d_forward_cuda(struct kn_cuda *ctx, const struct kn_conv_shape *s,
                           float *y, const float *x, const float *w,
                           const float *b, float *col);

/* As kn_conv2d_backward; dx may be NULL. */
int kn_conv2d_backward_cuda(struct kn_cuda *ctx, const struct kn_conv_shape *s,
                            float *dx, float *dw, float *db, const float *dy,
                            const float *x, const float *w, float *col);

/* As kn_conv2d_backward_unfolded: col as kn_conv2d_forward_cuda of the same
 * s and x left it (this twin's own layout); dx may be NULL. */
int kn_conv2d_backward_unfolded_cuda(struct kn_cuda *ctx,
                                     const struct kn_conv_shape *s, float *dx,
                                     float *dw, float *db, const float *dy,
                                     const float *w, float *col);

/* As kn_maxpool2d_forward. */
int kn_maxpool2d_forward_cuda(struct kn_cuda *ctx, float *y, int32_t *idx,
                              const float *x, int planes, int H, int W, int P);

/* As kn_maxpool2d_backward. */
int kn_maxpool2d_backward_cuda(struct kn_cuda *ctx, float *dx, const float *dy,
                               const int32_t *idx, int planes, int H, int W,
                               int P);

#ifdef __cplusplus
}
#endif

#endif
