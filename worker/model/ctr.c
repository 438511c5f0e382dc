/* The click-through-rate model (ctr.h): dense layers by cblas_sgemm, the
 * embedding gather and scatter by loops over the features. */
#include "ctr.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"

/* Offset of layer l's input activations in the scratch. */
static size_t act_off(const struct dw_ctr *m, int l) {
  size_t off = 0;
  for (int k = 0; k < l; k++)
    off += (size_t)m->cap * (size_t)m->width[k];
  return off;
}

int dw_ctr_new(struct dw_ctr **out, int fields, int dim, const int *hidden,
               int nh, int mean, int cap) {
  if (fields < 1 || dim < 1 || nh < 0 || nh >= DW_CTR_MAX_LAYERS || cap < 1)
    return CM_EINVAL;
  struct dw_ctr *m = calloc(1, sizeof *m);
  if (!m)
    return CM_ENOMEM;
  m->fields = fields;
  m->dim = dim;
  m->mean = mean;
  m->cap = cap;
  m->nlayers = nh + 1;
  m->width[0] = fields * dim;
  for (int i = 0; i < nh; i++)
    m->width[i + 1] = hidden[i];
  m->width[nh + 1] = 1;
  size_t acts = 0;
  for (int l = 0; l < m->nlayers; l++) {
    m->nparams += (size_t)m->width[l] * m->width[l + 1] + m->width[l + 1];
    acts += (size_t)cap * m->width[l];
  }
  m->params = calloc(m->nparams, sizeof *m->params);
  m->grads = calloc(m->nparams, sizeof *m->grads);
  m->act = calloc(acts + (size_t)cap, sizeof *m->act);
  m->dact = calloc(acts + (size_t)cap, sizeof *m->dact);
  m->count = calloc((size_t)cap * fields, sizeof *m->count);
  if (!m->params || !m->grads || !m->act || !m->dact || !m->count) {
    dw_ctr_free(m);
    return CM_ENOMEM;
  }
  size_t at = 0;
  for (int l = 0; l < m->nlayers; l++) {
    size_t nw = (size_t)m->width[l] * m->width[l + 1];
    m->w[l] = m->params + at;
    m->gw[l] = m->grads + at;
    at += nw;
    m->b[l] = m->params + at;
    m->gb[l] = m->grads + at;
    at += (size_t)m->width[l + 1];
  }
  *out = m;
  return 0;
}

void dw_ctr_free(struct dw_ctr *m) {
  if (!m)
    return;
  free(m->params);
  free(m->grads);
  free(m->act);
  free(m->dact);
  free(m->count);
  free(m);
}

float dw_ctr_init_scale(const struct dw_ctr *m, int l) {
  return sqrtf(6.0f / (float)(m->width[l] + m->width[l + 1]));
}

int dw_ctr_step(struct dw_ctr *m, const struct dw_ctr_batch *b,
                const float *emb, const float *wide, float *logit, float *loss,
                float *emb_grad, float *wide_grad) {
  const int n = b->n, F = m->fields, D = m->dim, L = m->nlayers;
  if (n > m->cap)
    return CM_EINVAL;
  float *x0 = m->act, *out = m->act + act_off(m, L); /* n logits */
  /* Each field's vector: the sum (or mean) of its features' rows. */
  memset(x0, 0, (size_t)n * F * D * sizeof *x0);
  memset(m->count, 0, (size_t)n * F * sizeof *m->count);
  for (int i = 0; i < n; i++)
    for (size_t j = b->start[i]; j < b->start[i + 1]; j++) {
      float *dst = x0 + ((size_t)i * F + b->field[j]) * D;
      const float *r = emb + (size_t)b->row[j] * D;
      for (int d = 0; d < D; d++)
        dst[d] += b->val[j] * r[d];
      m->count[(size_t)i * F + b->field[j]] += 1;
    }
  if (m->mean)
    for (int i = 0; i < n * F; i++)
      if (m->count[i] > 1)
        for (int d = 0; d < D; d++)
          x0[(size_t)i * D + d] /= m->count[i];
  for (int l = 0; l < L; l++) {
    float *in = m->act + act_off(m, l), *o = m->act + act_off(m, l + 1);
    int k = m->width[l], w = m->width[l + 1];
    for (int i = 0; i < n; i++)
      memcpy(o + (size_t)i * w, m->b[l], (size_t)w * sizeof *o);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, w, k, 1.0f, in, k,
                m->w[l], w, 1.0f, o, w);
    if (l + 1 < L)
      for (size_t i = 0; i < (size_t)n * w; i++)
        o[i] = o[i] > 0 ? o[i] : 0;
  }
  /* The wide part. */
  for (int i = 0; i < n; i++)
    for (size_t j = b->start[i]; j < b->start[i + 1]; j++)
      out[i] += b->val[j] * wide[b->row[j]];
  if (logit)
    memcpy(logit, out, (size_t)n * sizeof *logit);
  if (!b->y)
    return 0;
  /* Backward: d loss / d logit = (sigmoid - y) / n. */
  double ll = 0;
  float *dout = m->dact + act_off(m, L);
  for (int i = 0; i < n; i++) {
    float z = out[i], y = b->y[i];
    /* log(1 + e^z) - y z, computed stably */
    ll += (z > 0 ? z + log1p(exp(-z)) : log1p(exp(z))) - y * z;
    dout[i] = (1.0f / (1.0f + expf(-z)) - y) / (float)n;
  }
  *loss = (float)(ll / n);
  memset(wide_grad, 0, (size_t)b->nrows * sizeof *wide_grad);
  for (int i = 0; i < n; i++)
    for (size_t j = b->start[i]; j < b->start[i + 1]; j++)
      wide_grad[b->row[j]] += b->val[j] * dout[i];
  for (int l = L - 1; l >= 0; l--) {
    float *in = m->act + act_off(m, l), *din = m->dact + act_off(m, l);
    float *dout_l = m->dact + act_off(m, l + 1);
    int k = m->width[l], w = m->width[l + 1];
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, k, w, n, 1.0f, in, k,
                dout_l, w, 0.0f, m->gw[l], w);
    for (int c = 0; c < w; c++) {
      float s = 0;
      for (int i = 0; i < n; i++)
        s += dout_l[(size_t)i * w + c];
      m->gb[l][c] = s;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, k, w, 1.0f, dout_l,
                w, m->w[l], w, 0.0f, din, k);
    if (l > 0) /* through the ReLU that made this layer's input */
      for (size_t i = 0; i < (size_t)n * k; i++)
        if (in[i] <= 0)
          din[i] = 0;
  }
  float *dx0 = m->dact;
  memset(emb_grad, 0, (size_t)b->nrows * D * sizeof *emb_grad);
  for (int i = 0; i < n; i++)
    for (size_t j = b->start[i]; j < b->start[i + 1]; j++) {
      size_t cell = (size_t)i * F + b->field[j];
      const float *src = dx0 + cell * D;
      float s =
          b->val[j] / (m->mean && m->count[cell] > 1 ? m->count[cell] : 1);
      float *g = emb_grad + (size_t)b->row[j] * D;
      for (int d = 0; d < D; d++)
        g[d] += s * src[d];
    }
  return 0;
}
