/* The click-through-rate model (docs/ctr.md), wide & deep over embedding
 * tables: each example's features (id, val) belong to fields (id / 10^9);
 * a field's embedding rows (dim D, the table's) times their values are
 * summed, or averaged, into the field's vector; the F vectors concatenated
 * feed an MLP (ReLU hidden layers, one output), and the wide part, the sum
 * of the features' wide weights (a table of dim 1) times their values, is
 * added to its output: the logit. Logistic loss, averaged over the batch.
 * The dense parameters live here; the rows are the caller's, pulled for
 * the batch's unique ids, and the caller pushes the rows' gradients. */
#ifndef DW_CTR_H
#define DW_CTR_H

#include <stddef.h>
#include <stdint.h>

#define DW_CTR_MAX_LAYERS 8

/* A batch as the model reads it; every array is the caller's. */
struct dw_ctr_batch {
  int n;               /* examples */
  const size_t *start; /* n + 1: example i's features are [start[i],
                          start[i+1]) */
  const int *field;    /* per feature: its field, 0..F-1 */
  const float *val;    /* per feature: its value */
  const uint32_t *row; /* per feature: its unique id's row in the pulled
                          rows */
  int nrows;           /* unique ids (rows) in the batch */
  const uint8_t *y;    /* n labels, 0 or 1 (NULL: forward only) */
};

struct dw_ctr {
  int fields;  /* F */
  int dim;     /* D, the embedding rows' width */
  int mean;    /* 1: a field's vector is the mean, else the sum */
  int nlayers; /* dense layers, hidden ones and the output */
  int width[DW_CTR_MAX_LAYERS + 1]; /* width[0] = F D, ..., width[L] = 1 */
  size_t nparams;                   /* dense parameters */
  float *params; /* owned: W_0, b_0, W_1, b_1, ... (W_l is width[l] x
                    width[l+1], row-major) */
  float *grads;  /* owned, like params */
  float *w[DW_CTR_MAX_LAYERS];  /* views into params */
  float *b[DW_CTR_MAX_LAYERS];  /* views into params */
  float *gw[DW_CTR_MAX_LAYERS]; /* views into grads */
  float *gb[DW_CTR_MAX_LAYERS]; /* views into grads */
  int cap;                      /* examples the scratch below holds */
  float *act;   /* owned scratch: every layer's input, per example */
  float *dact;  /* owned scratch: their gradients */
  float *count; /* owned scratch: features per (example, field) */
};

/* A model of F fields, rows of dim D, hidden layer widths hidden[0..nh),
 * for batches of up to cap examples. Returns 0, CM_EINVAL, CM_ENOMEM. */
int dw_ctr_new(struct dw_ctr **out, int fields, int dim, const int *hidden,
               int nh, int mean, int cap);
void dw_ctr_free(struct dw_ctr *m);

/* The uniform bound of layer l's weights at initialisation (Glorot). */
float dw_ctr_init_scale(const struct dw_ctr *m, int l);

/* Forward (and with b->y, backward): logits into logit[0..n) (may be
 * NULL); with b->y, *loss gets the mean log loss, grads the dense
 * gradients (overwritten), emb_grad (nrows x D) and wide_grad (nrows) the
 * rows' gradients (overwritten). emb (nrows x D) and wide (nrows) are the
 * pulled rows. */
int dw_ctr_step(struct dw_ctr *m, const struct dw_ctr_batch *b,
                const float *emb, const float *wide, float *logit, float *loss,
                float *emb_grad, float *wide_grad);

#endif
