/* The worker's model, whichever the spec names (job.model): "softmax"
 * (softmax regression, an MLP with no hidden layer), "mlp" (worker/model/mlp.h,
 * widths job.hidden) or "cnn" (worker/model/cnn.h, channels job.channels). It
 * lists the variables to declare on the parameter servers (name, shape,
 * initial values) as views into one flat parameter buffer and one flat
 * gradient buffer, and runs a training step or an evaluation.
 *
 * Replicas: with R > 1 the model is held R times, and a training step
 * splits its batch into R contiguous parts (sizes differing by at most one)
 * that R threads run at once, each on its own copy; the parts' gradients of
 * their mean losses are then summed weighted by part size / batch, which is
 * the gradient of the mean loss over the whole batch, so the learning rate
 * means the same with any R. One push sends the sum. Replicas are CPU
 * threads, or one GPU each. */
#ifndef DW_MODEL_H
#define DW_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "mlp.h"
#include "spec.h"

/* Most variables of any model: an MLP's kernel and bias per layer. */
#define DW_MODEL_MAX_VARS (2 * DW_MLP_MAX_LAYERS)
/* Most replicas in one worker. */
#define DW_MODEL_MAX_REPLICAS 64

/* One variable of the model, as the parameter servers hold it. */
struct dw_model_var {
  char name[32];    /* "dense0/kernel", "conv1/bias", ... */
  int ndim;         /* entries used in shape */
  int64_t shape[4]; /* its shape, row-major */
  float scale;      /* initial values uniform in [-scale, scale]; 0: zeros */
  size_t count;     /* floats in it: the product of shape */
  float *value;     /* view into params */
  float *grad;      /* view into grads */
};

/* One copy of the model and the part of the batch it computes; model.c. */
struct dw_model_replica;

struct dw_model {
  char kind[32];                               /* "softmax", "mlp" or "cnn" */
  int replicas;                                /* copies computing each step */
  size_t nparams;                              /* floats in params and grads */
  float *params;                               /* view: replica 0's parameters;
                                                  a pull writes here */
  float *grads;                                /* view: replica 0's gradients,
                                                  the sum over replicas after a
                                                  step; a push reads here */
  int nvars;                                   /* entries used in vars */
  struct dw_model_var vars[DW_MODEL_MAX_VARS]; /* in declaration order */
  struct dw_model_replica *rep;                /* owned: the replicas */
};

/* Builds job->model for examples of dim pixels (square images for the
 * CNN) and `classes` classes, for batches up to max_batch, held `replicas`
 * times: on the CPU when first_gpu < 0, else replica i on CUDA device
 * first_gpu + i (model_gpu.h; the host copy stays the pull and push
 * buffer). On failure returns CM_EINVAL (or CM_ENOMEM) and says why in err
 * (len bytes); *out is set on success only. */
int dw_model_new(struct dw_model **out, const struct cm_job *job, int dim,
                 int classes, int max_batch, int replicas, int first_gpu,
                 char *err, size_t len);
void dw_model_free(struct dw_model *m);

/* Fills params with the values psd gives the same variables
 * (common/vars/init.h, keyed by seed and name), so the single-process baseline
 * starts from the distributed job's model. */
void dw_model_init(struct dw_model *m, uint64_t seed);

/* x is (B, dim), y is (B), B <= max_batch: overwrites grads with the
 * gradient of the mean loss over the batch, returns the mean loss and the
 * number predicted correctly in *correct (may be NULL). NAN for a bad B. */
float dw_model_train_step(struct dw_model *m, const float *x, const uint8_t *y,
                          int B, int *correct);

/* Forward only over n examples with the current params (replica 0); returns
 * the number predicted correctly and the mean loss in *loss (may be NULL). */
int dw_model_evaluate(struct dw_model *m, const float *x, const uint8_t *y,
                      int n, float *loss);

#endif
