/* A multi-layer perceptron with ReLU hidden layers and a softmax
 * cross-entropy head, on the CPU kernels. All parameters live in one flat
 * buffer and all gradients in another, laid out layer by layer as
 * w0 (sizes[1], sizes[0]), b0 (sizes[1]), w1, b1, ...; tensors are views into
 * them, so a pull fills `params` and a push sends `grads` in one block each. */
#ifndef DW_MLP_H
#define DW_MLP_H

#include <stddef.h>
#include <stdint.h>

#define DW_MLP_MAX_LAYERS 16

struct dw_mlp {
  int nlayers;                      /* dense layers (sizes has nlayers + 1) */
  int sizes[DW_MLP_MAX_LAYERS + 1]; /* widths: input, hidden..., classes */
  int max_batch;                    /* largest batch the buffers hold */
  size_t nparams;                   /* floats in params and in grads */
  float *params;                    /* owned flat parameter buffer */
  float *grads;                     /* owned flat gradient buffer */
  float *w[DW_MLP_MAX_LAYERS];      /* views: layer l weights (out, in) */
  float *b[DW_MLP_MAX_LAYERS];      /* views: layer l biases (out) */
  float *gw[DW_MLP_MAX_LAYERS];     /* views into grads, like w */
  float *gb[DW_MLP_MAX_LAYERS];     /* views into grads, like b */
  float *act[DW_MLP_MAX_LAYERS +
             1]; /* owned: act[0] unused, act[l+1] (max_batch, sizes[l+1]) */
  float *dact[DW_MLP_MAX_LAYERS +
              1]; /* owned: gradients w.r.t. act, same shapes */
};

/* sizes[0..nsizes) are the layer widths, e.g. {784, 256, 128, 10}. */
int dw_mlp_new(struct dw_mlp **out, const int *sizes, int nsizes,
               int max_batch);
void dw_mlp_free(struct dw_mlp *m);

/* The parameter server's name of layer l's kernel (bias = 0) or bias
 * (bias = 1): "dense<l>/kernel", "dense<l>/bias". */
void dw_mlp_var_name(char *buf, size_t len, int layer, int bias);

/* The Glorot-uniform bound of layer l's kernel: sqrt(6 / (in + out)). */
float dw_mlp_glorot(const struct dw_mlp *m, int layer);

/* Fills params with the values psd gives the same variables
 * (common/vars/init.h: Glorot-uniform kernels keyed by seed and name, zero
 * biases), so the single-process baseline starts from the distributed job's
 * model. */
void dw_mlp_init(struct dw_mlp *m, uint64_t seed);

/* x is (B, sizes[0]), y is (B). Forward and backward: overwrites grads with
 * the gradient of the mean loss, returns the mean loss and stores the number
 * of correct predictions in *correct (may be NULL). B <= max_batch. */
float dw_mlp_train_step(struct dw_mlp *m, const float *x, const uint8_t *y,
                        int B, int *correct);

/* Forward only over n examples, in batches of max_batch; returns the number
 * predicted correctly and the mean loss in *loss (may be NULL). */
int dw_mlp_evaluate(struct dw_mlp *m, const float *x, const uint8_t *y, int n,
                    float *loss);

#endif
