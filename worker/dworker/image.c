/* The image models' side of the training loop (struct dw_trainer, which
 * train.c runs and finish.c reports): softmax, MLP and CNN over
 * Fashion-MNIST (w->model, built by setup.c). Their batches come from the
 * feeders (feeder.c), gathered on the thread pool a step ahead; their
 * progress line is the epoch/step line --help documents; their test-set
 * figure is the accuracy, after --save-params wrote the final parameters
 * out. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "dworker_internal.h"
#include "err.h"
#include "log.h"

/* The image models' state beside w->model: the current batch and the
 * running sums behind one progress line. */
struct image {
  const float *x;   /* the current batch's images (owned by the feeders) */
  const uint8_t *y; /* their labels */
  int n;            /* its examples */
  int correct;      /* the current batch's correct predictions */
  double loss_sum;  /* sum of step losses since the last line */
  long sum_correct; /* correct predictions since the last line */
  long examples;    /* examples since the last line */
  long steps;       /* steps since the last line */
  double since;     /* cm_mono_s() of the last line; 0: the loop's start */
};

/* Sets up the read-ahead, and the model's one buffer of gradients for
 * job.optimizer.clip_norm. */
static int image_start(struct dw_worker *w) {
  int rc;

  if (!(w->mctx = calloc(1, sizeof(struct image)))) {
    rc = CM_ENOMEM;
    cm_error("cannot set up the batch read-ahead: %s", cm_strerror(rc));
    goto out;
  }
  rc = dw_batches_init(w);
  if (rc < 0) {
    cm_error("cannot set up the batch read-ahead: %s", cm_strerror(rc));
    goto out;
  }
  w->steps_per_epoch = w->feed.steps_per_epoch;
  w->grads = w->model->grads;
  w->ngrads = w->model->nparams;
out:
  return rc;
}

static void image_say_plan(struct dw_worker *w) {
  const struct cm_job *job = &w->spec->job;

  cm_info("training: %d epochs of %ld steps of %d examples, %ld steps in all",
          job->epochs, w->steps_per_epoch, job->batch_size, w->total_steps);
}

/* Waits for step t's batch from the feeders. */
static int image_batch(struct dw_worker *w, long t) {
  struct image *im = w->mctx;

  im->n = dw_batches_wait(w, t, &im->x, &im->y);
  return im->n;
}

static int image_compute(struct dw_worker *w, float *loss) {
  struct image *im = w->mctx;

  im->correct = 0;
  *loss = dw_model_train_step(w->model, im->x, im->y, im->n, &im->correct);
  return 0;
}

/* Prints one progress line after step `step` and starts the next
 * interval. */
static void report_progress(struct dw_worker *w, struct image *p, long step) {
  long spe = w->steps_per_epoch;
  long epochs = (w->total_steps + spe - 1) / spe;
  double since = p->since > 0 ? p->since : w->train_start;
  double now = cm_mono_s(), dt = now - since;
  double per_step = (now - w->train_start) / (double)(step - w->first_step + 1);
  double loss = p->loss_sum / (double)p->steps;
  double acc = (double)p->sum_correct / (double)p->examples;
  double rate = dt > 0 ? (double)p->examples / dt : 0.0;

  printf("epoch %ld/%ld step %ld/%ld loss %.4f acc %.4f ex/s %.0f eta %.1fs\n",
         step / spe + 1, epochs, step % spe + 1, spe, loss, acc, rate,
         per_step * (double)(w->total_steps - step - 1));
  fflush(stdout);
  dw_tb_progress(w, step + 1, loss, acc, rate, dt * 1e3 / (double)p->steps);
  p->loss_sum = 0;
  p->sum_correct = 0;
  p->examples = 0;
  p->steps = 0;
  p->since = now;
}

static void image_progress(struct dw_worker *w, long t, float loss, int n) {
  const struct cm_job *job = &w->spec->job;
  struct image *im = w->mctx;

  im->loss_sum += loss;
  im->sum_correct += im->correct;
  im->examples += n;
  im->steps++;
  if (job->log_every > 0 && (t + 1) % job->log_every == 0)
    report_progress(w, im, t);
}

/* Writes the final parameters to --save-params FILE, when given. */
static int save_params(struct dw_worker *w) {
  FILE *f = NULL;
  int rc = 0;

  if (!w->args.save_params)
    goto out;
  f = fopen(w->args.save_params, "wb");
  if (!f || fwrite(w->model->params, sizeof(float), w->model->nparams, f) !=
                w->model->nparams) {
    cm_error("%s: cannot write the parameters: %s", w->args.save_params,
             strerror(errno));
    rc = CM_EIO;
    goto out;
  }
  if (fclose(f) != 0) {
    f = NULL;
    cm_error("%s: %s", w->args.save_params, strerror(errno));
    rc = CM_EIO;
    goto out;
  }
  f = NULL;
out:
  if (f)
    fclose(f);
  return rc;
}

/* Writes the parameters out with --save-params, then scores them on the
 * test set: the final: line's test_accuracy. */
static int image_evaluate(struct dw_worker *w, char *figures, size_t size) {
  float loss = 0.0f;
  int correct, rc;

  rc = save_params(w);
  if (rc < 0)
    goto out;
  correct = dw_model_evaluate(w->model, w->test.x, w->test.y, w->test.n, &loss);
  cm_info("test set: %d of %d correct, mean loss %.4f", correct, w->test.n,
          loss);
  dw_tb_final(w, w->total_steps, (double)correct / (double)w->test.n, loss);
  snprintf(figures, size, "test_accuracy=%.4f",
           (double)correct / (double)w->test.n);
out:
  return rc;
}

/* The feeders, the data and the model stay main's to free. */
static void image_free(struct dw_worker *w) {
  free(w->mctx);
  w->mctx = NULL;
}

const struct dw_trainer dw_image_trainer = {
    .start = image_start,
    .say_plan = image_say_plan,
    .queue = dw_batches_queue,
    .batch = image_batch,
    .tables = NULL,
    .compute = image_compute,
    .progress = image_progress,
    .evaluate = image_evaluate,
    .free = image_free,
};
