/* The model interface over the MLP and the CNN, and the replicas (see
 * model.h). Each replica is a whole model (parameters, gradients,
 * activations); before a step the other replicas copy replica 0's
 * parameters, which is where a pull lands, and after it their gradients are
 * folded into replica 0's, which is what a push sends. Threads are started
 * per step: a step is milliseconds, a thread start microseconds. */
#include "model.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cnn.h"
#include "device.h"
#include "err.h"
#include "init.h"
#include "log.h"
#include "model_gpu.h"

struct dw_model_replica {
  struct dw_mlp *mlp; /* owned: this copy, when the model is an MLP */
  struct dw_cnn *cnn; /* owned: this copy, when the model is the CNN */
  struct dw_gpu *gpu; /* owned: device copies when it runs on a GPU */
  int dev;            /* that GPU's CUDA device */
  int failed;         /* its last GPU call's error, 0 if none */
  float *params;      /* view: this copy's flat parameters */
  float *grads;       /* view: this copy's flat gradients */
  pthread_t thread;   /* runs the step of replicas 1..R-1 */
  const float *x;     /* borrowed: this replica's part of the batch */
  const uint8_t *y;   /* borrowed: its labels */
  int n;              /* examples in the part (0: sits the step out) */
  float loss;         /* the part's mean loss, after the step */
  int correct;        /* the part's correct predictions, after the step */
};

static float replica_step(struct dw_model_replica *r) {
  float loss = NAN;

  if (!r->gpu)
    return r->mlp ? dw_mlp_train_step(r->mlp, r->x, r->y, r->n, &r->correct)
                  : dw_cnn_train_step(r->cnn, r->x, r->y, r->n, &r->correct);
  /* The device is per thread: the step may run on a new one. */
  r->failed = kn_cuda_use_device(r->dev);
  if (!r->failed)
    r->failed = dw_gpu_train_step(r->gpu, r->x, r->y, r->n, &loss, &r->correct);
  if (r->failed) {
    cm_error("GPU %d: training step: %s", r->dev, cm_strerror(r->failed));
    loss = NAN;
  }
  return loss;
}

static void *replica_main(void *arg) {
  struct dw_model_replica *r = arg;

  r->loss = replica_step(r);
  return NULL;
}

static int replica_host(struct dw_model_replica *r, const struct cm_job *job,
                        int dim, int classes, int max_batch, char *err,
                        size_t len);

/* Builds one copy of the model into r: on the host, and with dev >= 0 also
 * on that CUDA device. */
static int replica_new(struct dw_model_replica *r, const struct cm_job *job,
                       int dim, int classes, int max_batch, int dev, char *err,
                       size_t len) {
  int rc = replica_host(r, job, dim, classes, max_batch, err, len);

  if (rc < 0 || dev < 0)
    return rc;
  r->dev = dev;
  rc = dw_gpu_new(&r->gpu, dev, r->mlp, r->cnn);
  if (rc < 0)
    snprintf(err, len, "cannot set the model up on CUDA device %d: %s", dev,
             cm_strerror(rc));
  return rc;
}

/* Builds one host copy of the model into r. */
static int replica_host(struct dw_model_replica *r, const struct cm_job *job,
                        int dim, int classes, int max_batch, char *err,
                        size_t len) {
  int sizes[DW_MLP_MAX_LAYERS + 1], n = 0, side, rc;

  if (!strcmp(job->model, "cnn")) {
    for (side = 1; side * side < dim; side++)
      ;
    if (side * side != dim) {
      snprintf(err, len, "the cnn needs square images; these have %d pixels",
               dim);
      return CM_EINVAL;
    }
    rc = dw_cnn_new(&r->cnn, side, side, job->channels[0], job->channels[1],
                    classes, max_batch);
    if (rc < 0) {
      snprintf(err, len, "cannot build the cnn for %dx%d images: %s", side,
               side, cm_strerror(rc));
      return rc;
    }
    r->params = r->cnn->params;
    r->grads = r->cnn->grads;
    return 0;
  }
  sizes[n++] = dim;
  if (!strcmp(job->model, "mlp")) {
    if (job->nhidden + 2 > DW_MLP_MAX_LAYERS + 1) {
      snprintf(err, len, "job.hidden has %d layers; at most %d are supported",
               job->nhidden, DW_MLP_MAX_LAYERS - 1);
      return CM_EINVAL;
    }
    for (int l = 0; l < job->nhidden; l++)
      sizes[n++] = job->hidden[l];
  }
  sizes[n++] = classes;
  rc = dw_mlp_new(&r->mlp, sizes, n, max_batch);
  if (rc < 0) {
    snprintf(err, len, "cannot build the %s: %s", job->model, cm_strerror(rc));
    return rc;
  }
  r->params = r->mlp->params;
  r->grads = r->mlp->grads;
  return 0;
}

/* Fills m->vars from replica 0's layout. */
static void list_vars(struct dw_model *m) {
  struct dw_model_replica *r = &m->rep[0];
  size_t off = 0;

  if (r->cnn) {
    m->nvars = DW_CNN_NVARS;
    for (int i = 0; i < DW_CNN_NVARS; i++) {
      struct dw_model_var *v = &m->vars[i];
      dw_cnn_var(r->cnn, i, v->name, sizeof v->name, &v->ndim, v->shape,
                 &v->scale);
    }
  } else {
    m->nvars = 2 * r->mlp->nlayers;
    for (int l = 0; l < r->mlp->nlayers; l++) {
      struct dw_model_var *k = &m->vars[2 * l], *b = &m->vars[2 * l + 1];
      dw_mlp_var_name(k->name, sizeof k->name, l, 0);
      k->ndim = 2;
      k->shape[0] = r->mlp->sizes[l + 1];
      k->shape[1] = r->mlp->sizes[l];
      k->scale = dw_mlp_glorot(r->mlp, l);
      dw_mlp_var_name(b->name, sizeof b->name, l, 1);
      b->ndim = 1;
      b->shape[0] = r->mlp->sizes[l + 1];
      b->scale = 0.0f;
    }
  }
  for (int i = 0; i < m->nvars; i++) {
    struct dw_model_var *v = &m->vars[i];
    v->count = 1;
    for (int d = 0; d < v->ndim; d++)
      v->count *= (size_t)v->shape[d];
    v->value = m->params + off;
    v->grad = m->grads + off;
    off += v->count;
  }
}

int dw_model_new(struct dw_model **out, const struct cm_job *job, int dim,
                 int classes, int max_batch, int replicas, int first_gpu,
                 char *err, size_t len) {
  struct dw_model *m = NULL;
  int per, rc = 0;

  *out = NULL;
  if (replicas < 1 || replicas > DW_MODEL_MAX_REPLICAS || max_batch < 1) {
    snprintf(err, len, "replicas %d: expected 1..%d", replicas,
             DW_MODEL_MAX_REPLICAS);
    rc = CM_EINVAL;
    goto out;
  }
  m = calloc(1, sizeof *m);
  if (!m || !(m->rep = calloc((size_t)replicas, sizeof *m->rep))) {
    snprintf(err, len, "out of memory");
    rc = CM_ENOMEM;
    goto out;
  }
  snprintf(m->kind, sizeof m->kind, "%s", job->model);
  m->replicas = replicas;
  /* Each replica gets at most ceil(max_batch / R) examples of a step; the
   * first also evaluates, in batches of whatever it holds. */
  per = (max_batch + replicas - 1) / replicas;
  for (int i = 0; i < replicas; i++)
    if ((rc = replica_new(&m->rep[i], job, dim, classes, per,
                          first_gpu < 0 ? -1 : first_gpu + i, err, len)) < 0)
      goto out;
  m->params = m->rep[0].params;
  m->grads = m->rep[0].grads;
  m->nparams = m->rep[0].mlp ? m->rep[0].mlp->nparams : m->rep[0].cnn->nparams;
  list_vars(m);
  *out = m;
  m = NULL;
out:
  dw_model_free(m);
  return rc;
}

void dw_model_free(struct dw_model *m) {
  if (!m)
    return;
  for (int i = 0; m->rep && i < m->replicas; i++) {
    dw_gpu_free(m->rep[i].gpu);
    dw_mlp_free(m->rep[i].mlp);
    dw_cnn_free(m->rep[i].cnn);
  }
  free(m->rep);
  free(m);
}

void dw_model_init(struct dw_model *m, uint64_t seed) {
  for (int i = 0; i < m->nvars; i++) {
    struct dw_model_var *v = &m->vars[i];
    cm_init_fill(v->value, 0, v->count,
                 v->scale > 0 ? CM_INIT_UNIFORM : CM_INIT_ZEROS, v->scale, seed,
                 v->name);
  }
}

float dw_model_train_step(struct dw_model *m, const float *x, const uint8_t *y,
                          int B, int *correct) {
  int R = m->replicas, dim, started[DW_MODEL_MAX_REPLICAS] = {0};
  size_t at = 0;
  double loss = 0.0;
  int hits = 0;

  if (R == 1 || B < 1) {
    struct dw_model_replica *r = &m->rep[0];
    float l;

    r->x = x, r->y = y, r->n = B;
    l = replica_step(r);
    if (correct)
      *correct = r->correct;
    return l;
  }
  dim = m->rep[0].mlp ? m->rep[0].mlp->sizes[0]
                      : m->rep[0].cnn->H * m->rep[0].cnn->W;
  for (int i = 0; i < R; i++) {
    struct dw_model_replica *r = &m->rep[i];
    r->n = B / R + (i < B % R);
    r->x = x + at * dim;
    r->y = y + at;
    at += (size_t)r->n;
    r->loss = 0.0f;
    r->correct = 0;
    if (i == 0 || r->n == 0)
      continue;
    memcpy(r->params, m->params, m->nparams * sizeof *m->params);
    /* Should a thread not start, the replica runs here instead. */
    started[i] = pthread_create(&r->thread, NULL, replica_main, r) == 0;
  }
  m->rep[0].loss = replica_step(&m->rep[0]);
  for (int i = 1; i < R; i++) {
    struct dw_model_replica *r = &m->rep[i];
    if (started[i])
      pthread_join(r->thread, NULL);
    else if (r->n > 0)
      r->loss = replica_step(r);
  }
  /* grads = sum over replicas of (n_i / B) g_i, replica 0 in place. */
  for (int i = 0; i < R; i++) {
    struct dw_model_replica *r = &m->rep[i];
    float w = (float)r->n / (float)B;
    if (i == 0) {
      for (size_t k = 0; k < m->nparams; k++)
        m->grads[k] *= w;
    } else if (r->n > 0) {
      for (size_t k = 0; k < m->nparams; k++)
        m->grads[k] += w * r->grads[k];
    }
    loss += (double)r->loss * r->n / B;
    hits += r->correct;
  }
  if (correct)
    *correct = hits;
  return (float)loss;
}

int dw_model_evaluate(struct dw_model *m, const float *x, const uint8_t *y,
                      int n, float *loss) {
  struct dw_model_replica *r = &m->rep[0];
  int correct = 0, rc;

  if (!r->gpu)
    return r->mlp ? dw_mlp_evaluate(r->mlp, x, y, n, loss)
                  : dw_cnn_evaluate(r->cnn, x, y, n, loss);
  if ((rc = kn_cuda_use_device(r->dev)) < 0 ||
      (rc = dw_gpu_evaluate(r->gpu, x, y, n, &correct, loss)) < 0) {
    cm_error("GPU %d: evaluation: %s", r->dev, cm_strerror(rc));
    if (loss)
      *loss = NAN;
    return 0;
  }
  return correct;
}
