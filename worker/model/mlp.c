/* The worker's model: a multi-layer perceptron with ReLU hidden layers and a
 * softmax cross-entropy head, built on the CPU kernels in kernels/dense.h.
 *
 * Parameters and gradients each live in one flat buffer (see mlp.h for the
 * layout) so the parameter server moves each in one contiguous block; the
 * per-layer w/b/gw/gb pointers are views into them. Activations are kept
 * after the ReLU (in place), which is all the backward pass needs: the ReLU
 * derivative is read off the output (y > 0). */
#include "mlp.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dense.h"
#include "err.h"
#include "init.h"

int dw_mlp_new(struct dw_mlp **out, const int *sizes, int nsizes,
               int max_batch) {
  struct dw_mlp *m = NULL;
  size_t nparams = 0, off = 0;
  int rc = 0;
  int l;

  *out = NULL;
  if (nsizes < 2 || nsizes > DW_MLP_MAX_LAYERS + 1 || max_batch < 1) {
    rc = CM_EINVAL;
    goto out;
  }
  for (l = 0; l < nsizes; l++) {
    if (sizes[l] < 1) {
      rc = CM_EINVAL;
      goto out;
    }
  }
  for (l = 0; l + 1 < nsizes; l++) {
    size_t in = (size_t)sizes[l], outw = (size_t)sizes[l + 1];

    /* widths are ints, so in * out + out cannot overflow a 64-bit size_t */
    nparams += in * outw + outw;
  }

  m = calloc(1, sizeof *m);
  if (m == NULL) {
    rc = CM_ENOMEM;
    goto out;
  }
  m->nlayers = nsizes - 1;
  memcpy(m->sizes, sizes, (size_t)nsizes * sizeof *sizes);
  m->max_batch = max_batch;
  m->nparams = nparams;
  m->params = calloc(nparams, sizeof *m->params);
  m->grads = calloc(nparams, sizeof *m->grads);
  if (m->params == NULL || m->grads == NULL) {
    rc = CM_ENOMEM;
    goto out;
  }
  for (l = 0; l < m->nlayers; l++) {
    size_t in = (size_t)sizes[l], outw = (size_t)sizes[l + 1];

    m->w[l] = m->params + off;
    m->gw[l] = m->grads + off;
    off += in * outw;
    m->b[l] = m->params + off;
    m->gb[l] = m->grads + off;
    off += outw;
    m->act[l + 1] = calloc((size_t)max_batch * outw, sizeof(float));
    m->dact[l + 1] = calloc((size_t)max_batch * outw, sizeof(float));
    if (m->act[l + 1] == NULL || m->dact[l + 1] == NULL) {
      rc = CM_ENOMEM;
      goto out;
    }
  }
  *out = m;
  m = NULL;
out:
  dw_mlp_free(m);
  return rc;
}

void dw_mlp_free(struct dw_mlp *m) {
  int l;

  if (m == NULL)
    return;
  for (l = 0; l <= DW_MLP_MAX_LAYERS; l++) {
    free(m->act[l]);
    free(m->dact[l]);
  }
  free(m->params);
  free(m->grads);
  free(m);
}

void dw_mlp_var_name(char *buf, size_t len, int layer, int bias) {
  snprintf(buf, len, bias ? "dense%d/bias" : "dense%d/kernel", layer);
}

float dw_mlp_glorot(const struct dw_mlp *m, int layer) {
  return sqrtf(6.0f / (float)(m->sizes[layer] + m->sizes[layer + 1]));
}

void dw_mlp_init(struct dw_mlp *m, uint64_t seed) {
  char name[32];
  int l;

  for (l = 0; l < m->nlayers; l++) {
    uint64_t in = (uint64_t)m->sizes[l], outw = (uint64_t)m->sizes[l + 1];

    dw_mlp_var_name(name, sizeof name, l, 0);
    cm_init_fill(m->w[l], 0, in * outw, CM_INIT_UNIFORM, dw_mlp_glorot(m, l),
                 seed, name);
    dw_mlp_var_name(name, sizeof name, l, 1);
    cm_init_fill(m->b[l], 0, outw, CM_INIT_ZEROS, 0.0f, seed, name);
  }
}

/* x is (B, sizes[0]); leaves act[l+1] (B, sizes[l+1]) for every layer, with
 * the ReLU applied to all but the last (the logits). */
static void forward(struct dw_mlp *m, const float *x, int B) {
  int l;

  for (l = 0; l < m->nlayers; l++) {
    const float *in = l == 0 ? x : m->act[l];
    int outw = m->sizes[l + 1];

    kn_dense_forward(m->act[l + 1], in, m->w[l], m->b[l], B, m->sizes[l], outw);
    if (l + 1 < m->nlayers)
      kn_relu_forward(m->act[l + 1], m->act[l + 1], (size_t)B * outw);
  }
}

float dw_mlp_train_step(struct dw_mlp *m, const float *x, const uint8_t *y,
                        int B, int *correct) {
  int L = m->nlayers;
  float loss;
  int l;

  /* A caller bug, not bad input; report it without touching memory. */
  if (B < 1 || B > m->max_batch) {
    if (correct != NULL)
      *correct = 0;
    return NAN;
  }
  forward(m, x, B);
  loss = kn_softmax_xent(m->dact[L], correct, m->act[L], y, B, m->sizes[L]);
  for (l = L - 1; l >= 0; l--) {
    const float *in = l == 0 ? x : m->act[l];
    int outw = m->sizes[l + 1];

    /* dact[l+1] holds d loss / d (layer l's output); through the ReLU it
     * becomes the gradient of its pre-activation. */
    if (l + 1 < L)
      kn_relu_backward(m->dact[l + 1], m->dact[l + 1], m->act[l + 1],
                       (size_t)B * outw);
    kn_dense_backward(l == 0 ? NULL : m->dact[l], m->gw[l], m->gb[l],
                      m->dact[l + 1], in, m->w[l], B, m->sizes[l], outw);
  }
  return loss;
}

int dw_mlp_evaluate(struct dw_mlp *m, const float *x, const uint8_t *y, int n,
                    float *loss) {
  int L = m->nlayers, in = m->sizes[0];
  double total = 0.0;
  int ncorrect = 0;
  int start;

  for (start = 0; start < n; start += m->max_batch) {
    int B = n - start < m->max_batch ? n - start : m->max_batch;
    int c = 0;
    float l;

    forward(m, x + (size_t)start * in, B);
    l = kn_softmax_xent(NULL, &c, m->act[L], y + start, B, m->sizes[L]);
    total += (double)l * B;
    ncorrect += c;
  }
  if (loss != NULL)
    *loss = n > 0 ? (float)(total / n) : 0.0f;
  return ncorrect;
}
