/* The demo CNN: conv 5x5 -> ReLU -> maxpool 2 -> conv 5x5 -> ReLU ->
 * maxpool 2 -> dense -> ReLU -> dense -> softmax cross-entropy, on the CPU
 * kernels (kernels/conv.h, kernels/dense.h). The first convolution is
 * padded to keep the image's size ("same"), the second is not ("valid"), so
 * a 28x28 image becomes c1 planes of 28x28, 14x14 after pooling, c2 planes
 * of 10x10, 5x5 after pooling, and c2 * 25 features for the dense head (a
 * hidden layer of DW_CNN_HIDDEN ReLU units, then the classes).
 * Tensors are NCHW. All parameters live in one flat buffer and all
 * gradients in another, laid out conv0/kernel (c1, 1, 5, 5), conv0/bias
 * (c1), conv1/kernel (c2, c1, 5, 5), conv1/bias (c2), dense0/kernel
 * (hidden, c2 * 25), dense0/bias (hidden), dense1/kernel (classes, hidden),
 * dense1/bias (classes); the pointers below are views. With the default
 * 16 and 32 channels that is 65,162 parameters. */
#ifndef DW_CNN_H
#define DW_CNN_H

#include <stddef.h>
#include <stdint.h>

#include "conv.h"

/* Convolution kernel size and pooling window of both blocks. */
#define DW_CNN_K 5
#define DW_CNN_POOL 2
/* Zero padding of the first convolution ("same": its output is the image's
 * size); the second is unpadded. */
#define DW_CNN_PAD1 2
/* Width of the head's hidden layer. */
#define DW_CNN_HIDDEN 64
/* Variables: a kernel and a bias for each of the four layers. */
#define DW_CNN_NVARS 8

struct dw_cnn {
  int H, W;                   /* input image height and width */
  int c1, c2;                 /* output channels of the two convolutions */
  int classes;                /* width of the head */
  int max_batch;              /* largest batch the buffers hold */
  struct kn_conv_shape s1;    /* first convolution (B set per call) */
  struct kn_conv_shape s2;    /* second convolution (B set per call) */
  int h1, w1;                 /* first convolution's output size */
  int ph1, pw1;               /* after the first pooling */
  int h2, w2;                 /* second convolution's output size */
  int ph2, pw2;               /* after the second pooling */
  int flat;                   /* c2 * ph2 * pw2: the head's input width */
  size_t nparams;             /* floats in params and in grads */
  float *params;              /* owned flat parameter buffer */
  float *grads;               /* owned flat gradient buffer */
  float *var[DW_CNN_NVARS];   /* views into params, in the layout above */
  float *gvar[DW_CNN_NVARS];  /* views into grads, like var */
  size_t count[DW_CNN_NVARS]; /* floats in each variable */
  float *a1;      /* owned: (max_batch, c1, h1, w1), after the ReLU */
  float *p1;      /* owned: (max_batch, c1, ph1, pw1), pooled */
  int32_t *i1;    /* owned: argmax indices of the first pooling */
  float *a2;      /* owned: (max_batch, c2, h2, w2), after the ReLU */
  float *p2;      /* owned: (max_batch, flat), pooled (the head's input) */
  int32_t *i2;    /* owned: argmax indices of the second pooling */
  float *hid;     /* owned: (max_batch, DW_CNN_HIDDEN), after the ReLU */
  float *dhid;    /* owned: gradient w.r.t. hid (then its pre-activation) */
  float *logits;  /* owned: (max_batch, classes) */
  float *col1;    /* owned: s1's im2col workspace (the batch unfolded) */
  float *col2;    /* owned: s2's im2col workspace (p1 unfolded) */
  float *dlogits; /* owned: gradient w.r.t. logits */
  float *dp2;     /* owned: gradient w.r.t. p2 */
  float *da2;     /* owned: gradient w.r.t. a2 (then its pre-activation) */
  float *dp1;     /* owned: gradient w.r.t. p1 */
  float *da1;     /* owned: gradient w.r.t. a1 (then its pre-activation) */
};

/* A CNN for H x W single-channel images with c1, c2 channels and `classes`
 * outputs, for batches up to max_batch; CM_EINVAL when the image is too
 * small for two conv + pool blocks. *out is set on success only. */
int dw_cnn_new(struct dw_cnn **out, int H, int W, int c1, int c2, int classes,
               int max_batch);
void dw_cnn_free(struct dw_cnn *c);

/* Variable i's parameter-server name ("conv0/kernel", ..., "dense1/bias"),
 * its shape (ndim entries of shape) and its initial values: uniform in
 * [-scale, scale] for kernels (He-uniform, sqrt(6 / fan_in), for the layers
 * that feed ReLUs; Glorot for the last), zero (scale 0) for biases. */
void dw_cnn_var(const struct dw_cnn *c, int i, char *name, size_t len,
                int *ndim, int64_t shape[4], float *scale);

/* x is (B, H * W), y is (B). Forward and backward: overwrites grads with the
 * gradient of the mean loss, returns the mean loss and stores the number of
 * correct predictions in *correct (may be NULL). B <= max_batch, else NAN. */
float dw_cnn_train_step(struct dw_cnn *c, const float *x, const uint8_t *y,
                        int B, int *correct);

/* Forward only over n examples, in batches of max_batch; returns the number
 * predicted correctly and the mean loss in *loss (may be NULL). */
int dw_cnn_evaluate(struct dw_cnn *c, const float *x, const uint8_t *y, int n,
                    float *loss);

#endif
