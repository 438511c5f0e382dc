/* The GPU replica (model_gpu.h): mlp.c's and cnn.c's passes with the CUDA
 * twins. Device buffers mirror the host model's: one flat parameter and one
 * flat gradient block at the host layout's offsets, and one buffer per
 * activation. Every call here runs on the context's stream; the uploads and
 * downloads synchronize. */
#include "model_gpu.h"

#include <stdlib.h>
#include <string.h>

#include "conv_cuda.h"
#include "dense_cuda.h"
#include "device.h"
#include "err.h"

struct dw_gpu {
  int dev;                            /* CUDA device */
  struct kn_cuda *ctx;                /* owned: stream and cuBLAS handle */
  struct dw_mlp *mlp;                 /* borrowed host MLP, or NULL */
  struct dw_cnn *cnn;                 /* borrowed host CNN, or NULL */
  size_t nparams;                     /* floats in params and grads */
  int dim;                            /* floats per example */
  int max_batch;                      /* examples per step at most */
  float *params;                      /* device: the parameters, host layout */
  float *grads;                       /* device: the gradients, host layout */
  float *x;                           /* device: (max_batch, dim) */
  uint8_t *y;                         /* device: (max_batch) labels */
  float *act[DW_MLP_MAX_LAYERS + 1];  /* device, MLP: as dw_mlp's act */
  float *dact[DW_MLP_MAX_LAYERS + 1]; /* device, MLP: as dw_mlp's dact */
  float *a1, *p1, *a2, *p2, *hid, *logits; /* device, CNN: as dw_cnn's */
  float *col1, *col2; /* device, CNN: as dw_cnn's, kept forward to backward */
  float *da1, *dp1, *da2, *dp2, *dhid, *dlogits; /* device, CNN: gradients */
  int32_t *i1, *i2; /* device, CNN: pooling argmaxes */
};

/* Device memory for n elements of size bytes into *p (NULL on failure). */
static int dalloc(void *p, size_t n, size_t size) {
  return kn_cuda_alloc((void **)p, (n ? n : 1) * size);
}

/* The device address of host view v of the host block base. */
static float *at(float *dev_base, const float *base, const float *v) {
  return dev_base + (v - base);
}

int dw_gpu_new(struct dw_gpu **out, int dev, struct dw_mlp *mlp,
               struct dw_cnn *cnn) {
  struct dw_gpu *g = calloc(1, sizeof *g);
  int rc = 0;

  if (!g) {
    rc = CM_ENOMEM;
    goto out;
  }
  g->dev = dev, g->mlp = mlp, g->cnn = cnn;
  if ((rc = kn_cuda_use_device(dev)) < 0 || (rc = kn_cuda_create(&g->ctx)) < 0)
    goto out;
  g->nparams = mlp ? mlp->nparams : cnn->nparams;
  g->dim = mlp ? mlp->sizes[0] : cnn->H * cnn->W;
  g->max_batch = mlp ? mlp->max_batch : cnn->max_batch;
  size_t B = (size_t)g->max_batch;
  if ((rc = dalloc(&g->params, g->nparams, sizeof(float))) < 0 ||
      (rc = dalloc(&g->grads, g->nparams, sizeof(float))) < 0 ||
      (rc = dalloc(&g->x, B * g->dim, sizeof(float))) < 0 ||
      (rc = dalloc(&g->y, B, 1)) < 0)
    goto out;
  if (mlp) {
    for (int l = 1; l <= mlp->nlayers; l++)
      if ((rc = dalloc(&g->act[l], B * mlp->sizes[l], sizeof(float))) < 0 ||
          (rc = dalloc(&g->dact[l], B * mlp->sizes[l], sizeof(float))) < 0)
        goto out;
  } else {
    size_t na1 = B * cnn->c1 * cnn->h1 * cnn->w1;
    size_t np1 = B * cnn->c1 * cnn->ph1 * cnn->pw1;
    size_t na2 = B * cnn->c2 * cnn->h2 * cnn->w2, np2 = B * cnn->flat;
    size_t c1 = kn_conv_col_floats(&cnn->s1), c2 = kn_conv_col_floats(&cnn->s2);
    if ((rc = dalloc(&g->a1, na1, 4)) < 0 ||
        (rc = dalloc(&g->da1, na1, 4)) < 0 ||
        (rc = dalloc(&g->p1, np1, 4)) < 0 ||
        (rc = dalloc(&g->dp1, np1, 4)) < 0 ||
        (rc = dalloc(&g->i1, np1, 4)) < 0 ||
        (rc = dalloc(&g->a2, na2, 4)) < 0 ||
        (rc = dalloc(&g->da2, na2, 4)) < 0 ||
        (rc = dalloc(&g->p2, np2, 4)) < 0 ||
        (rc = dalloc(&g->dp2, np2, 4)) < 0 ||
        (rc = dalloc(&g->i2, np2, 4)) < 0 ||
        (rc = dalloc(&g->hid, B * DW_CNN_HIDDEN, 4)) < 0 ||
        (rc = dalloc(&g->dhid, B * DW_CNN_HIDDEN, 4)) < 0 ||
        (rc = dalloc(&g->logits, B * cnn->classes, 4)) < 0 ||
        (rc = dalloc(&g->dlogits, B * cnn->classes, 4)) < 0 ||
        (rc = dalloc(&g->col1, c1, 4)) < 0 ||
        (rc = dalloc(&g->col2, c2, 4)) < 0)
      goto out;
  }
  *out = g;
  g = NULL;
out:
  dw_gpu_free(g);
  return rc;
}

void dw_gpu_free(struct dw_gpu *g) {
  if (!g)
    return;
  kn_cuda_destroy(g->ctx);
  kn_cuda_free(g->params), kn_cuda_free(g->grads);
  kn_cuda_free(g->x), kn_cuda_free(g->y);
  for (int l = 0; l <= DW_MLP_MAX_LAYERS; l++)
    kn_cuda_free(g->act[l]), kn_cuda_free(g->dact[l]);
  kn_cuda_free(g->a1), kn_cuda_free(g->p1), kn_cuda_free(g->a2);
  kn_cuda_free(g->p2), kn_cuda_free(g->hid), kn_cuda_free(g->logits);
  kn_cuda_free(g->col1), kn_cuda_free(g->col2);
  kn_cuda_free(g->da1), kn_cuda_free(g->dp1);
  kn_cuda_free(g->da2), kn_cuda_free(g->dp2), kn_cuda_free(g->dhid);
  kn_cuda_free(g->dlogits), kn_cuda_free(g->i1), kn_cuda_free(g->i2);
  free(g);
}

/* The MLP forward pass on x (B, dim) already on the device: leaves act[L]
 * holding the logits. */
static int mlp_forward(struct dw_gpu *g, const float *x, int B) {
  struct dw_mlp *m = g->mlp;
  int rc = 0;

  for (int l = 0; !rc && l < m->nlayers; l++) {
    rc = kn_dense_forward_cuda(g->ctx, g->act[l + 1], l ? g->act[l] : x,
                               at(g->params, m->params, m->w[l]),
                               at(g->params, m->params, m->b[l]), B,
                               m->sizes[l], m->sizes[l + 1]);
    if (!rc && l + 1 < m->nlayers)
      rc = kn_relu_forward_cuda(g->ctx, g->act[l + 1], g->act[l + 1],
                                (size_t)B * m->sizes[l + 1]);
  }
  return rc;
}

static int mlp_backward(struct dw_gpu *g, int B) {
  struct dw_mlp *m = g->mlp;
  int rc = 0;

  for (int l = m->nlayers - 1; !rc && l >= 0; l--) {
    size_t n = (size_t)B * m->sizes[l + 1];
    if (l + 1 < m->nlayers)
      rc = kn_relu_backward_cuda(g->ctx, g->dact[l + 1], g->dact[l + 1],
                                 g->act[l + 1], n);
    if (!rc)
      rc = kn_dense_backward_cuda(
          g->ctx, l ? g->dact[l] : NULL, at(g->grads, m->grads, m->gw[l]),
          at(g->grads, m->grads, m->gb[l]), g->dact[l + 1],
          l ? g->act[l] : g->x, at(g->params, m->params, m->w[l]), B,
          m->sizes[l], m->sizes[l + 1]);
  }
  return rc;
}

/* In the two CNN passes: the device address of the CNN's variable i (P)
 * and of its gradient (G), given the host views v and gv. */
#define P(i) at(g->params, c->params, v[i])
#define G(i) at(g->grads, c->grads, gv[i])

/* cnn.c's forward pass: leaves the logits in g->logits. */
static int cnn_forward(struct dw_gpu *g, const float *x, int B) {
  struct dw_cnn *c = g->cnn;
  struct kn_conv_shape s1 = c->s1, s2 = c->s2;
  float *const *v = c->var;
  int rc;

  s1.B = s2.B = B;
  if ((rc = kn_conv2d_forward_cuda(g->ctx, &s1, g->a1, x, P(0), P(1),
                                   g->col1)) < 0 ||
      (rc = kn_relu_forward_cuda(g->ctx, g->a1, g->a1,
                                 (size_t)B * c->c1 * c->h1 * c->w1)) < 0 ||
      (rc = kn_maxpool2d_forward_cuda(g->ctx, g->p1, g->i1, g->a1, B * c->c1,
                                      c->h1, c->w1, DW_CNN_POOL)) < 0 ||
      (rc = kn_conv2d_forward_cuda(g->ctx, &s2, g->a2, g->p1, P(2), P(3),
                                   g->col2)) < 0 ||
      (rc = kn_relu_forward_cuda(g->ctx, g->a2, g->a2,
                                 (size_t)B * c->c2 * c->h2 * c->w2)) < 0 ||
      (rc = kn_maxpool2d_forward_cuda(g->ctx, g->p2, g->i2, g->a2, B * c->c2,
                                      c->h2, c->w2, DW_CNN_POOL)) < 0 ||
      (rc = kn_dense_forward_cuda(g->ctx, g->hid, g->p2, P(4), P(5), B, c->flat,
                                  DW_CNN_HIDDEN)) < 0 ||
      (rc = kn_relu_forward_cuda(g->ctx, g->hid, g->hid,
                                 (size_t)B * DW_CNN_HIDDEN)) < 0)
    return rc;
  return kn_dense_forward_cuda(g->ctx, g->logits, g->hid, P(6), P(7), B,
                               DW_CNN_HIDDEN, c->classes);
}

/* cnn.c's backward pass, right after cnn_forward: the convolutions start
 * from the unfoldings it left in col1 and col2. */
static int cnn_backward(struct dw_gpu *g, int B) {
  struct dw_cnn *c = g->cnn;
  struct kn_conv_shape s1 = c->s1, s2 = c->s2;
  float *const *v = c->var, *const *gv = c->gvar;
  int rc;

  s1.B = s2.B = B;
  if ((rc = kn_dense_backward_cuda(g->ctx, g->dhid, G(6), G(7), g->dlogits,
                                   g->hid, P(6), B, DW_CNN_HIDDEN,
                                   c->classes)) < 0 ||
      (rc = kn_relu_backward_cuda(g->ctx, g->dhid, g->dhid, g->hid,
                                  (size_t)B * DW_CNN_HIDDEN)) < 0 ||
      (rc = kn_dense_backward_cuda(g->ctx, g->dp2, G(4), G(5), g->dhid, g->p2,
                                   P(4), B, c->flat, DW_CNN_HIDDEN)) < 0 ||
      (rc = kn_maxpool2d_backward_cuda(g->ctx, g->da2, g->dp2, g->i2, B * c->c2,
                                       c->h2, c->w2, DW_CNN_POOL)) < 0 ||
      (rc = kn_relu_backward_cuda(g->ctx, g->da2, g->da2, g->a2,
                                  (size_t)B * c->c2 * c->h2 * c->w2)) < 0 ||
      (rc = kn_conv2d_backward_unfolded_cuda(g->ctx, &s2, g->dp1, G(2), G(3),
                                             g->da2, P(2), g->col2)) < 0 ||
      (rc = kn_maxpool2d_backward_cuda(g->ctx, g->da1, g->dp1, g->i1, B * c->c1,
                                       c->h1, c->w1, DW_CNN_POOL)) < 0 ||
      (rc = kn_relu_backward_cuda(g->ctx, g->da1, g->da1, g->a1,
                                  (size_t)B * c->c1 * c->h1 * c->w1)) < 0)
    return rc;
  return kn_conv2d_backward_unfolded_cuda(g->ctx, &s1, NULL, G(0), G(1), g->da1,
                                          P(0), g->col1);
#undef G
#undef P
}

/* Uploads B examples and runs the forward pass; the logits and their
 * gradient buffer for the loss. */
static int forward(struct dw_gpu *g, const float *x, const uint8_t *y, int B,
                   float **logits, float **dlogits, int *classes) {
  int rc;

  if ((rc = kn_cuda_upload(g->ctx, g->x, x, (size_t)B * g->dim * 4)) < 0 ||
      (rc = kn_cuda_upload(g->ctx, g->y, y, (size_t)B)) < 0)
    return rc;
  if (g->mlp) {
    *logits = g->act[g->mlp->nlayers];
    *dlogits = g->dact[g->mlp->nlayers];
    *classes = g->mlp->sizes[g->mlp->nlayers];
    return mlp_forward(g, g->x, B);
  }
  *logits = g->logits, *dlogits = g->dlogits, *classes = g->cnn->classes;
  return cnn_forward(g, g->x, B);
}

int dw_gpu_train_step(struct dw_gpu *g, const float *x, const uint8_t *y, int B,
                      float *loss, int *correct) {
  const float *host = g->mlp ? g->mlp->params : g->cnn->params;
  float *hgrads = g->mlp ? g->mlp->grads : g->cnn->grads, *logits, *dlogits;
  int rc, classes;

  if (B < 1 || B > g->max_batch)
    return CM_EINVAL;
  if ((rc = kn_cuda_upload(g->ctx, g->params, host, g->nparams * 4)) < 0 ||
      (rc = forward(g, x, y, B, &logits, &dlogits, &classes)) < 0 ||
      (rc = kn_softmax_xent_cuda(g->ctx, loss, dlogits, correct, logits, g->y,
                                 B, classes)) < 0 ||
      (rc = g->mlp ? mlp_backward(g, B) : cnn_backward(g, B)) < 0)
    return rc;
  return kn_cuda_download(g->ctx, hgrads, g->grads, g->nparams * 4);
}

int dw_gpu_evaluate(struct dw_gpu *g, const float *x, const uint8_t *y, int n,
                    int *correct, float *loss) {
  const float *host = g->mlp ? g->mlp->params : g->cnn->params;
  double total = 0.0;
  int rc, hits = 0;

  if ((rc = kn_cuda_upload(g->ctx, g->params, host, g->nparams * 4)) < 0)
    return rc;
  for (int start = 0; start < n; start += g->max_batch) {
    int B = n - start < g->max_batch ? n - start : g->max_batch, k = 0, C;
    float l = 0.0f, *logits, *dlogits;

    if ((rc = forward(g, x + (size_t)start * g->dim, y + start, B, &logits,
                      &dlogits, &C)) < 0 ||
        (rc = kn_softmax_xent_cuda(g->ctx, &l, NULL, &k, logits, g->y, B, C)) <
            0)
      return rc;
    total += (double)l * B;
    hits += k;
  }
  *correct = hits;
  if (loss)
    *loss = n > 0 ? (float)(total / n) : 0.0f;
  return 0;
}
