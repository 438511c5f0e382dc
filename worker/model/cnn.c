/* The demo CNN (see cnn.h) on the CPU kernels. The forward pass keeps every
 * activation the backward pass reads: the ReLU outputs (whose sign is the
 * ReLU's derivative), the pooled maps and the pooling argmaxes, and each
 * convolution's im2col workspace, which holds its input unfolded from the
 * forward pass to the backward pass (kn_conv2d_backward_unfolded): the
 * unfolding is then done once a step, not twice. */
#include "cnn.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dense.h"
#include "err.h"

/* Allocates n elements of size bytes into *p; 0 or CM_ENOMEM. */
static int grab(void *p, size_t n, size_t size) {
  void **pp = p;

  *pp = calloc(n ? n : 1, size);
  return *pp ? 0 : CM_ENOMEM;
}

int dw_cnn_new(struct dw_cnn **out, int H, int W, int c1, int c2, int classes,
               int max_batch) {
  struct dw_cnn *c = NULL;
  size_t off = 0, col1, col2;
  int rc = 0;

  *out = NULL;
  if (c1 < 1 || c2 < 1 || classes < 1 || max_batch < 1 || H < 1 || W < 1) {
    rc = CM_EINVAL;
    goto out;
  }
  c = calloc(1, sizeof *c);
  if (!c) {
    rc = CM_ENOMEM;
    goto out;
  }
  c->H = H, c->W = W, c->c1 = c1, c->c2 = c2, c->classes = classes;
  c->max_batch = max_batch;
  c->h1 = H + 2 * DW_CNN_PAD1 - DW_CNN_K + 1;
  c->w1 = W + 2 * DW_CNN_PAD1 - DW_CNN_K + 1;
  c->ph1 = c->h1 / DW_CNN_POOL, c->pw1 = c->w1 / DW_CNN_POOL;
  c->h2 = c->ph1 - DW_CNN_K + 1, c->w2 = c->pw1 - DW_CNN_K + 1;
  c->ph2 = c->h2 / DW_CNN_POOL, c->pw2 = c->w2 / DW_CNN_POOL;
  if (c->ph2 < 1 || c->pw2 < 1) {
    rc = CM_EINVAL; /* the image is too small for two blocks */
    goto out;
  }
  c->flat = c2 * c->ph2 * c->pw2;
  c->s1 = (struct kn_conv_shape){max_batch, 1, H, W, c1, DW_CNN_K, DW_CNN_PAD1};
  c->s2 =
      (struct kn_conv_shape){max_batch, c1, c->ph1, c->pw1, c2, DW_CNN_K, 0};
  c->count[0] = (size_t)c1 * DW_CNN_K * DW_CNN_K;
  c->count[1] = (size_t)c1;
  c->count[2] = (size_t)c2 * c1 * DW_CNN_K * DW_CNN_K;
  c->count[3] = (size_t)c2;
  c->count[4] = (size_t)DW_CNN_HIDDEN * c->flat;
  c->count[5] = DW_CNN_HIDDEN;
  c->count[6] = (size_t)classes * DW_CNN_HIDDEN;
  c->count[7] = (size_t)classes;
  for (int i = 0; i < DW_CNN_NVARS; i++)
    c->nparams += c->count[i];
  if ((rc = grab(&c->params, c->nparams, sizeof(float))) < 0 ||
      (rc = grab(&c->grads, c->nparams, sizeof(float))) < 0)
    goto out;
  for (int i = 0; i < DW_CNN_NVARS; i++) {
    c->var[i] = c->params + off;
    c->gvar[i] = c->grads + off;
    off += c->count[i];
  }
  col1 = kn_conv_col_floats(&c->s1);
  col2 = kn_conv_col_floats(&c->s2);
  size_t B = (size_t)max_batch;
  size_t na1 = B * c1 * c->h1 * c->w1, np1 = B * c1 * c->ph1 * c->pw1;
  size_t na2 = B * c2 * c->h2 * c->w2, np2 = B * c->flat;
  if ((rc = grab(&c->a1, na1, sizeof(float))) < 0 ||
      (rc = grab(&c->da1, na1, sizeof(float))) < 0 ||
      (rc = grab(&c->p1, np1, sizeof(float))) < 0 ||
      (rc = grab(&c->dp1, np1, sizeof(float))) < 0 ||
      (rc = grab(&c->i1, np1, sizeof(int32_t))) < 0 ||
      (rc = grab(&c->a2, na2, sizeof(float))) < 0 ||
      (rc = grab(&c->da2, na2, sizeof(float))) < 0 ||
      (rc = grab(&c->p2, np2, sizeof(float))) < 0 ||
      (rc = grab(&c->dp2, np2, sizeof(float))) < 0 ||
      (rc = grab(&c->i2, np2, sizeof(int32_t))) < 0 ||
      (rc = grab(&c->hid, B * DW_CNN_HIDDEN, sizeof(float))) < 0 ||
      (rc = grab(&c->dhid, B * DW_CNN_HIDDEN, sizeof(float))) < 0 ||
      (rc = grab(&c->logits, B * classes, sizeof(float))) < 0 ||
      (rc = grab(&c->dlogits, B * classes, sizeof(float))) < 0 ||
      (rc = grab(&c->col1, col1, sizeof(float))) < 0 ||
      (rc = grab(&c->col2, col2, sizeof(float))) < 0)
    goto out;
  *out = c;
  c = NULL;
out:
  dw_cnn_free(c);
  return rc;
}

void dw_cnn_free(struct dw_cnn *c) {
  if (!c)
    return;
  free(c->params), free(c->grads);
  free(c->a1), free(c->da1), free(c->p1), free(c->dp1), free(c->i1);
  free(c->a2), free(c->da2), free(c->p2), free(c->dp2), free(c->i2);
  free(c->hid), free(c->dhid), free(c->logits), free(c->dlogits);
  free(c->col1), free(c->col2);
  free(c);
}

void dw_cnn_var(const struct dw_cnn *c, int i, char *name, size_t len,
                int *ndim, int64_t shape[4], float *scale) {
  static const char *const names[DW_CNN_NVARS] = {
      "conv0/kernel",  "conv0/bias",  "conv1/kernel",  "conv1/bias",
      "dense0/kernel", "dense0/bias", "dense1/kernel", "dense1/bias"};
  /* Each layer's inputs (fan-in) and outputs. */
  const int ins[] = {1 * DW_CNN_K * DW_CNN_K, c->c1 * DW_CNN_K * DW_CNN_K,
                     c->flat, DW_CNN_HIDDEN};
  const int outs[] = {c->c1, c->c2, DW_CNN_HIDDEN, c->classes};
  int l = i / 2;

  snprintf(name, len, "%s", names[i]);
  *scale = 0.0f;
  if (i % 2) {
    *ndim = 1;
    shape[0] = outs[l];
  } else if (l < 2) {
    *ndim = 4;
    shape[0] = outs[l];
    shape[1] = l == 0 ? 1 : c->c1;
    shape[2] = shape[3] = DW_CNN_K;
    *scale = sqrtf(6.0f / (float)ins[l]);
  } else {
    *ndim = 2;
    shape[0] = outs[l];
    shape[1] = ins[l];
    *scale = l == 2 ? sqrtf(6.0f / (float)ins[l])
                    : sqrtf(6.0f / (float)(ins[l] + outs[l]));
  }
}

/* x is (B, H * W): leaves a1, p1, a2, p2 and the logits of B examples. */
static void forward(struct dw_cnn *c, const float *x, int B) {
  size_t n1 = (size_t)B * c->c1 * c->h1 * c->w1;
  size_t n2 = (size_t)B * c->c2 * c->h2 * c->w2;

  c->s1.B = c->s2.B = B;
  kn_conv2d_forward(&c->s1, c->a1, x, c->var[0], c->var[1], c->col1);
  kn_relu_forward(c->a1, c->a1, n1);
  kn_maxpool2d_forward(c->p1, c->i1, c->a1, B * c->c1, c->h1, c->w1,
                       DW_CNN_POOL);
  kn_conv2d_forward(&c->s2, c->a2, c->p1, c->var[2], c->var[3], c->col2);
  kn_relu_forward(c->a2, c->a2, n2);
  kn_maxpool2d_forward(c->p2, c->i2, c->a2, B * c->c2, c->h2, c->w2,
                       DW_CNN_POOL);
  kn_dense_forward(c->hid, c->p2, c->var[4], c->var[5], B, c->flat,
                   DW_CNN_HIDDEN);
  kn_relu_forward(c->hid, c->hid, (size_t)B * DW_CNN_HIDDEN);
  kn_dense_forward(c->logits, c->hid, c->var[6], c->var[7], B, DW_CNN_HIDDEN,
                   c->classes);
}

float dw_cnn_train_step(struct dw_cnn *c, const float *x, const uint8_t *y,
                        int B, int *correct) {
  size_t n1 = (size_t)B * c->c1 * c->h1 * c->w1;
  size_t n2 = (size_t)B * c->c2 * c->h2 * c->w2;
  float loss;

  /* A caller bug, not bad input; report it without touching memory. */
  if (B < 1 || B > c->max_batch) {
    if (correct)
      *correct = 0;
    return NAN;
  }
  forward(c, x, B);
  loss = kn_softmax_xent(c->dlogits, correct, c->logits, y, B, c->classes);
  kn_dense_backward(c->dhid, c->gvar[6], c->gvar[7], c->dlogits, c->hid,
                    c->var[6], B, DW_CNN_HIDDEN, c->classes);
  kn_relu_backward(c->dhid, c->dhid, c->hid, (size_t)B * DW_CNN_HIDDEN);
  kn_dense_backward(c->dp2, c->gvar[4], c->gvar[5], c->dhid, c->p2, c->var[4],
                    B, c->flat, DW_CNN_HIDDEN);
  kn_maxpool2d_backward(c->da2, c->dp2, c->i2, B * c->c2, c->h2, c->w2,
                        DW_CNN_POOL);
  kn_relu_backward(c->da2, c->da2, c->a2, n2);
  kn_conv2d_backward_unfolded(&c->s2, c->dp1, c->gvar[2], c->gvar[3], c->da2,
                              c->var[2], c->col2);
  kn_maxpool2d_backward(c->da1, c->dp1, c->i1, B * c->c1, c->h1, c->w1,
                        DW_CNN_POOL);
  kn_relu_backward(c->da1, c->da1, c->a1, n1);
  /* The input needs no gradient. */
  kn_conv2d_backward_unfolded(&c->s1, NULL, c->gvar[0], c->gvar[1], c->da1,
                              c->var[0], c->col1);
  return loss;
}

int dw_cnn_evaluate(struct dw_cnn *c, const float *x, const uint8_t *y, int n,
                    float *loss) {
  double total = 0.0;
  int ncorrect = 0;

  for (int start = 0; start < n; start += c->max_batch) {
    int B = n - start < c->max_batch ? n - start : c->max_batch, k = 0;
    float l;

    forward(c, x + (size_t)start * c->H * c->W, B);
    l = kn_softmax_xent(NULL, &k, c->logits, y + start, B, c->classes);
    total += (double)l * B;
    ncorrect += k;
  }
  if (loss)
    *loss = n > 0 ? (float)(total / n) : 0.0f;
  return ncorrect;
}
