/* dworker's click-through-rate job (job.model "ctr", docs/ctr.md): the
 * data set (ctrdata.h: psd's generated data or the user's files in
 * job.data_dir; generated there when it is new or psd's), the model
 * (worker/model/ctr.h), and its side of the one training loop (struct
 * dw_trainer; train.c runs it): per batch, the batch's unique ids are the
 * rows of the embedding and wide tables the loop pulls with the dense MLP
 * and pushes the gradients of, in async, bounded-staleness or sync mode
 * (in sync mode the rows are staged for the step with the dense gradients
 * before the worker asks to be admitted). Worker 0 then scores the
 * held-out set: the final: line's test_auc and test_logloss, beside the
 * true model's (finish.c prints the line). With job.ctr.stream the
 * training set is the stream's windows instead (ctr_stream.c), each scored
 * before it is trained on, and no held-out set is read. */
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "criteo.h"
#include "ctr.h"
#include "ctrdata.h"
#include "ctrgen.h"
#include "dworker_internal.h"
#include "err.h"
#include "libsvm.h"
#include "log.h"
#include "rand.h"

/* Predictions kept for the progress lines' AUC. */
#define RECENT 8192
/* Examples per evaluation batch. */
#define EVAL_BATCH 2048

/* What the run holds. */
struct run {
  struct dw_worker *w;         /* the worker */
  const struct cm_ctr_conf *c; /* job.ctr */
  char dir[1024];              /* the data's directory */
  int criteo;                  /* job.ctr.format "criteo" */
  struct dw_ctrdata data; /* the files read, whose, the true model's scores */
  struct dw_svm train, test; /* this worker's share; the test set */
  struct dw_ctr *m;          /* the model */
  int dim;                   /* the embedding table's dim */
  struct psc__var vars[2 * DW_CTR_MAX_LAYERS]; /* the MLP's variables */
  char names[2 * DW_CTR_MAX_LAYERS][32];       /* their names */
  int nvars;                                   /* entries in vars */
  int cap; /* examples per batch (scratch size) */
  /* One batch's scratch, sized for cap examples. */
  struct dw_ctr_batch b;            /* the current training batch */
  size_t *start;                    /* per example: its first feature */
  uint8_t *y;                       /* per example: its label */
  float *val;                       /* per feature: its value */
  int *field;                       /* per feature */
  uint32_t *row;                    /* per feature: its unique row */
  uint64_t *uniq;                   /* unique ids */
  int64_t *slot;                    /* hash slots: index into uniq, -1 empty */
  size_t nslot;                     /* slots (a power of two) */
  float *emb, *wide, *gemb, *gwide; /* rows and their gradients */
  float *logit;                     /* per example */
  float recent[RECENT];             /* the last predictions */
  uint8_t recent_y[RECENT];         /* their labels */
  size_t nrecent;                   /* predictions seen */
  double loss_sum;                  /* since the last progress line */
  long loss_n;                      /* batches in loss_sum */
  struct dw_ctr_stream *cs;         /* job.ctr.stream, or NULL; then train
                                       is the current window's share */
  size_t pos;                       /* stream: the window's next example */
  char window[256];                 /* stream: the window's name */
};

static void say_progress(const char *file, double done) {
  cm_info("generating %s: %.0f%%", file, 100.0 * done);
}

/* The data (ctrdata.h, docs/ctr.md "Whose data"): in job.data_dir,
 * relative to the spec file's directory when relative; psd's generation of
 * the job's settings, the user's files read as they are, or generated
 * there when the directory is new or psd's of other settings, under the
 * directory's lock (dw_ctrdata_lock): the job's other workers wait, then
 * find psd's set. Says which files the run trains and tests on. */
static int prepare_data(struct run *r) {
  const struct cm_job *job = &r->w->spec->job;
  char spec_dir[1024], err[2048];
  struct dw_ctrgen_opts o = {r->c->fields, (uint64_t)r->c->train,
                             (uint64_t)r->c->test, r->c->data_seed, r->c->zipf};
  struct dw_ctrgen_criteo_opts co = {(uint64_t)r->c->train,
                                     (uint64_t)r->c->test, r->c->data_seed, 0};
  int rc, lock;
  snprintf(spec_dir, sizeof spec_dir, "%s", r->w->args.cluster);
  if (job->data_dir[0] == '/')
    snprintf(r->dir, sizeof r->dir, "%s", job->data_dir);
  else
    snprintf(r->dir, sizeof r->dir, "%s/%s", dirname(spec_dir), job->data_dir);
  r->criteo = !strcmp(r->c->format, "criteo");
  if ((lock = dw_ctrdata_lock(r->dir, err, sizeof err)) < 0) {
    cm_error("%s", err);
    return lock;
  }
  rc = r->criteo ? dw_ctrgen_criteo_find(r->dir, &co, &r->data, err, sizeof err)
                 : dw_ctrgen_find(r->dir, &o, &r->data, err, sizeof err);
  if (rc) {
    cm_error("%s", err);
    goto out;
  }
  if (r->data.source == DW_CTRDATA_GENERATE) {
    cm_info("generating the CTR data set in %s (%s): %llu training and %llu "
            "held-out examples, %d fields, seed %llu",
            r->dir, r->c->format, (unsigned long long)o.train,
            (unsigned long long)o.test, r->criteo ? 39 : o.fields,
            (unsigned long long)o.seed);
    double t0 = cm_mono_s();
    rc = r->criteo ? dw_ctrgen_criteo_write(r->dir, &co, &r->data.truth,
                                            say_progress, err, sizeof err)
                   : dw_ctrgen_write(r->dir, &o, &r->data.truth, say_progress,
                                     err, sizeof err);
    if (rc) {
      cm_error("generating the data set: %s", err);
      goto out;
    }
    cm_info("generated in %.1f s: the true model's held-out AUC is %.4f, log "
            "loss %.4f",
            cm_mono_s() - t0, r->data.truth.auc, r->data.truth.logloss);
  }
  cm_info("data: training on %s, testing on %s (%s)", r->data.train,
          r->data.test,
          r->data.source == DW_CTRDATA_USER
              ? "the user's files, read as they are: no true model to compare "
                "with"
              : "psd's generated data set");
out:
  dw_ctrdata_unlock(lock);
  return rc;
}

/* Loads a set and checks its features' fields. */
static int load_set(struct run *r, const char *path, int share, int nshares,
                    struct dw_svm *out) {
  char err[1200];
  int rc = r->criteo
               ? dw_criteo_load_svm(path, share, nshares, out, err, sizeof err)
               : dw_svm_load(path, share, nshares, out, err, sizeof err);
  if (rc) {
    cm_error("%s", err);
    return rc;
  }
  for (size_t j = 0; j < out->nnz; j++)
    if (out->idx[j] / DW_CTR_SPAN >= (uint64_t)r->c->fields) {
      cm_error("%s: feature %llu is in field %llu (id / 10^9); job.ctr.fields "
               "is %d",
               path, (unsigned long long)out->idx[j],
               (unsigned long long)(out->idx[j] / DW_CTR_SPAN), r->c->fields);
      return CM_EFORMAT;
    }
  return 0;
}

/* A table's dim from the spec's job.tables, or 0. */
static int table_dim(const struct cm_job *job, const char *name) {
  for (int i = 0; i < job->ntables; i++)
    if (!strcmp(job->tables[i].name, name))
      return (int)job->tables[i].dim;
  return 0;
}

/* The model and its scratch. */
static int build(struct run *r) {
  const struct cm_job *job = &r->w->spec->job;
  r->dim = table_dim(job, r->c->emb_table);
  if (!r->dim || table_dim(job, r->c->wide_table) != 1) {
    cm_error("job.model \"ctr\" needs job.tables entries '%s' (the "
             "embeddings) and '%s' of dim 1 (the wide weights)",
             r->c->emb_table, r->c->wide_table);
    return CM_EINVAL;
  }
  r->cap = job->batch_size > EVAL_BATCH ? job->batch_size : EVAL_BATCH;
  int rc = dw_ctr_new(&r->m, r->c->fields, r->dim, job->hidden, job->nhidden,
                      !strcmp(r->c->pooling, "mean"), r->cap);
  if (rc)
    return rc;
  size_t feats = (size_t)r->cap * 64 + 1;
  r->nslot = 1;
  while (r->nslot < 2 * feats)
    r->nslot *= 2;
  r->field = malloc(feats * sizeof *r->field);
  r->row = malloc(feats * sizeof *r->row);
  r->uniq = malloc(feats * sizeof *r->uniq);
  r->slot = malloc(r->nslot * sizeof *r->slot);
  r->emb = malloc(feats * r->dim * sizeof *r->emb);
  r->gemb = malloc(feats * r->dim * sizeof *r->gemb);
  r->wide = malloc(feats * sizeof *r->wide);
  r->gwide = malloc(feats * sizeof *r->gwide);
  r->logit = malloc((size_t)r->cap * sizeof *r->logit);
  r->start = malloc(((size_t)r->cap + 1) * sizeof *r->start);
  r->y = malloc((size_t)r->cap + 1);
  r->val = malloc(feats * sizeof *r->val);
  if (!r->field || !r->row || !r->uniq || !r->slot || !r->emb || !r->gemb ||
      !r->wide || !r->gwide || !r->logit || !r->start || !r->y || !r->val)
    return CM_ENOMEM;
  for (int l = 0; l < r->m->nlayers; l++) {
    struct psc__var *w = &r->vars[r->nvars], *b = &r->vars[r->nvars + 1];
    snprintf(r->names[r->nvars], sizeof r->names[0], "ctr/w%d", l);
    snprintf(r->names[r->nvars + 1], sizeof r->names[0], "ctr/b%d", l);
    *w = (struct psc__var){.name = r->names[r->nvars],
                           .ndim = 2,
                           .shape = {r->m->width[l], r->m->width[l + 1]},
                           .placement = PSC__PLACE_NAME,
                           .init = PSC__INIT_UNIFORM,
                           .init_scale = dw_ctr_init_scale(r->m, l),
                           .value = r->m->w[l],
                           .grad = r->m->gw[l]};
    *b = (struct psc__var){.name = r->names[r->nvars + 1],
                           .ndim = 1,
                           .shape = {r->m->width[l + 1]},
                           .placement = PSC__PLACE_NAME,
                           .init = PSC__INIT_ZEROS,
                           .value = r->m->b[l],
                           .grad = r->m->gb[l]};
    r->nvars += 2;
  }
  return 0;
}

/* Fills the batch of examples [from, from + n) of set d (wrapping): each
 * feature's field and unique row, the unique ids in r->uniq. */
static void gather(struct run *r, const struct dw_svm *d, size_t from, int n,
                   struct dw_ctr_batch *b, size_t *start, uint8_t *y,
                   float *val) {
  size_t k = 0;
  int nu = 0;
  for (size_t i = 0; i < r->nslot; i++)
    r->slot[i] = -1;
  for (int i = 0; i < n; i++) {
    size_t e = (from + (size_t)i) % d->n;
    start[i] = k;
    y[i] = d->y[e];
    for (size_t j = d->start[e]; j < d->start[e + 1] && j - d->start[e] < 64;
         j++, k++) {
      uint64_t id = d->idx[j];
      size_t h = (size_t)cm_mix64(id) & (r->nslot - 1);
      while (r->slot[h] >= 0 && r->uniq[r->slot[h]] != id)
        h = (h + 1) & (r->nslot - 1);
      if (r->slot[h] < 0) {
        r->slot[h] = nu;
        r->uniq[nu++] = id;
      }
      r->field[k] = (int)(id / DW_CTR_SPAN);
      r->row[k] = (uint32_t)r->slot[h];
      val[k] = d->val[j];
    }
  }
  start[n] = k;
  *b = (struct dw_ctr_batch){n, start, r->field, val, r->row, nu, y};
}

/* Rows of the current batch's unique ids, both tables: where the pull
 * writes, and the gradients the push sends. */
static int ctr_tables(struct dw_worker *w, struct psc__rows *q, int max) {
  struct run *r = w->mctx;
  size_t nu = (size_t)r->b.nrows;

  if (max < 2) {
    cm_error("job.model \"ctr\" pulls 2 tables a step; the loop takes %d", max);
    return CM_EINVAL;
  }
  q[0] = (struct psc__rows){r->c->emb_table, r->uniq, nu, r->emb, r->gemb};
  q[1] = (struct psc__rows){r->c->wide_table, r->uniq, nu, r->wide, r->gwide};
  return 2;
}

/* Steps in one pass over this worker's share. */
static int ctr_start(struct dw_worker *w) {
  struct run *r = w->mctx;
  size_t bsz = (size_t)w->spec->job.batch_size;

  w->steps_per_epoch = r->cs ? 0 : (long)((r->train.n + bsz - 1) / bsz);
  return 0;
}

static void ctr_say_plan(struct dw_worker *w) {
  struct run *r = w->mctx;

  if (r->cs) {
    cm_info("training on a stream: each window scored before it is trained "
            "on, in steps of %d, %d fields, tables '%s' (dim %d) and '%s'",
            w->spec->job.batch_size, r->c->fields, r->c->emb_table, r->dim,
            r->c->wide_table);
    return;
  }

  cm_info("training: %zu examples here, %ld steps of %d, %d fields, tables "
          "'%s' (dim %d) and '%s'; the true model's held-out AUC is %.4f",
          r->train.n, w->total_steps, w->spec->job.batch_size, r->c->fields,
          r->c->emb_table, r->dim, r->c->wide_table, r->data.truth.auc);
}

static int evaluate(struct run *r, const struct dw_svm *d, double *auc,
                    double *logloss);

/* A stream: the current window's next batch; past its end, the next
 * window's share, scored with the current model before the first batch of
 * it is trained on (progressive validation). 0 when the stream ended. */
static int stream_batch(struct run *r) {
  struct dw_worker *w = r->w;
  int bsz = w->spec->job.batch_size, rc, n;
  char *name = r->window;

  while (r->pos >= r->train.n) {
    double auc = 0, ll = 0;
    dw_svm_free(&r->train);
    r->pos = 0;
    rc = dw_ctrs_next(r->cs, w->index, w->nworkers, &r->train, name,
                      sizeof r->window);
    if (rc <= 0)
      return rc;
    if (r->train.n) {
      if ((rc = psc__client_pull(w->client)) ||
          (rc = evaluate(r, &r->train, &auc, &ll))) {
        cm_error("scoring window %llu (%s): %s", dw_ctrs_windows(r->cs), name,
                 psc__client_error(w->client));
        return rc < 0 ? rc : CM_EIO;
      }
    }
    dw_ctrs_scored(w, r->cs, name, r->train.n, ll, auc);
  }
  if (dw_ctrs_stop(r->cs, r->window, r->pos, r->train.n))
    return 0;
  n = (size_t)bsz < r->train.n - r->pos ? bsz : (int)(r->train.n - r->pos);
  gather(r, &r->train, r->pos, n, &r->b, r->start, r->y, r->val);
  r->pos += (size_t)n;
  return n;
}

/* Gathers step t's batch from the share; in sync mode the batch of the
 * job's step, so a run is reproducible. */
static int ctr_batch(struct dw_worker *w, long t) {
  struct run *r = w->mctx;
  int bsz = w->spec->job.batch_size;
  if (r->cs)
    return stream_batch(r);
  long k = w->sync ? (long)w->step : t;
  size_t from = (size_t)(k % w->steps_per_epoch) * (size_t)bsz;
  int n = (size_t)bsz < r->train.n - from ? bsz : (int)(r->train.n - from);

  gather(r, &r->train, from, n, &r->b, r->start, r->y, r->val);
  return n;
}

/* Forward and backward over the current batch with the pulled rows; keeps
 * its predictions for the progress lines' AUC. */
static int ctr_compute(struct dw_worker *w, float *loss) {
  struct run *r = w->mctx;
  int rc;

  *loss = 0;
  rc = dw_ctr_step(r->m, &r->b, r->emb, r->wide, r->logit, loss, r->gemb,
                   r->gwide);
  if (rc < 0) {
    cm_error("step %ld: the CTR model: %s", w->steps_done, cm_strerror(rc));
    goto out;
  }
  for (int i = 0; i < r->b.n; i++) {
    size_t at = r->nrecent++ % RECENT;
    r->recent[at] = r->logit[i];
    r->recent_y[at] = r->y[i];
  }
out:
  return rc;
}

/* Every job.log_every steps and after the last: the mean log loss since
 * the last line, the AUC of the last predictions, and the rate. */
static void ctr_progress(struct dw_worker *w, long t, float loss, int n) {
  const struct cm_job *job = &w->spec->job;
  struct run *r = w->mctx;
  size_t m = r->nrecent < RECENT ? r->nrecent : RECENT;
  double rate, auc_recent;

  (void)n;
  r->loss_sum += loss;
  r->loss_n++;
  if (!((job->log_every > 0 && (t + 1) % job->log_every == 0) ||
        t + 1 == w->total_steps))
    return;
  rate = (double)w->examples_done / (cm_mono_s() - w->train_start);
  auc_recent = dw_auc(r->recent, r->recent_y, m);
  if (r->cs)
    printf("step %ld (window %llu): ", t + 1, dw_ctrs_windows(r->cs));
  else
    printf("step %ld/%ld: ", t + 1, w->total_steps);
  printf("logloss=%.4f auc=%.4f (last %zu examples) "
         "examples=%llu worker_examples_per_s=%.0f\n",
         r->loss_sum / (double)r->loss_n, auc_recent, m,
         (unsigned long long)w->examples_done, rate);
  dw_tb_ctr(w, t + 1, "train", r->loss_sum / (double)r->loss_n, auc_recent,
            rate);
  fflush(stdout);
  r->loss_sum = 0;
  r->loss_n = 0;
}

/* Scores set d with the shards' current values. */
static int evaluate(struct run *r, const struct dw_svm *d, double *auc,
                    double *logloss) {
  size_t n = d->n;
  float *score = calloc(n + 1, sizeof *score);
  double ll = 0;
  int rc = CM_ENOMEM;
  if (!score)
    goto out;
  for (size_t at = 0; at < n; at += EVAL_BATCH) {
    int k = n - at < EVAL_BATCH ? (int)(n - at) : EVAL_BATCH;
    struct dw_ctr_batch b;
    /* The training batch's scratch: training is over. */
    gather(r, d, at, k, &b, r->start, r->y, r->val);
    struct psc__rows q[2] = {
        {r->c->emb_table, r->uniq, (size_t)b.nrows, r->emb, NULL},
        {r->c->wide_table, r->uniq, (size_t)b.nrows, r->wide, NULL}};
    if ((rc = psc__client_pull_rows(r->w->client, q, 2)))
      goto out;
    b.y = NULL;
    dw_ctr_step(r->m, &b, r->emb, r->wide, score + at, NULL, NULL, NULL);
  }
  for (size_t i = 0; i < n; i++) {
    double z = score[i];
    ll += (z > 0 ? z + log1p(exp(-z)) : log1p(exp(z))) - d->y[i] * z;
  }
  *auc = dw_auc(score, d->y, n);
  *logloss = ll / (double)(n ? n : 1);
  rc = 0;
out:
  free(score);
  return rc;
}

/* Worker 0, the final parameters pulled: scores the held-out set. */
static int ctr_evaluate(struct dw_worker *w, char *figures, size_t size) {
  struct run *r = w->mctx;
  char train[3400], test[3400];
  double auc = 0, ll = 0;
  int rc;

  if (r->cs) { /* a stream: the windows' figures; no held-out set */
    dw_ctrs_figures(r->cs, figures, size);
    return 0;
  }
  rc = evaluate(r, &r->test, &auc, &ll);
  if (rc) {
    cm_error("evaluation: %s", psc__client_error(w->client));
    goto out;
  }
  dw_tb_ctr(w, w->steps_done, "test", ll, auc, 0);
  dw_ctrdata_token(r->data.train, train, sizeof train);
  dw_ctrdata_token(r->data.test, test, sizeof test);
  snprintf(figures, size,
           "test_auc=%.4f test_logloss=%.4f true_auc=%.4f true_logloss=%.4f "
           "train=%s test=%s data=%s",
           auc, ll, r->data.truth.auc, r->data.truth.logloss, train, test,
           r->data.source == DW_CTRDATA_USER ? "user" : "generated");
out:
  return rc;
}

/* Workers other than 0: a stream's figures for the done: line. */
static void ctr_report(struct dw_worker *w, char *figures, size_t size) {
  struct run *r = w->mctx;

  if (r && r->cs)
    dw_ctrs_figures(r->cs, figures, size);
}

/* Frees the run (safe on a partly built one, and on none). */
static void ctr_free(struct dw_worker *w) {
  struct run *r = w->mctx;

  if (!r)
    return;
  dw_svm_free(&r->train);
  dw_svm_free(&r->test);
  dw_ctrs_free(r->cs);
  dw_ctr_free(r->m);
  free(r->field);
  free(r->row);
  free(r->uniq);
  free(r->slot);
  free(r->emb);
  free(r->gemb);
  free(r->wide);
  free(r->gwide);
  free(r->logit);
  free(r->start);
  free(r->y);
  free(r->val);
  free(r);
  w->mctx = NULL;
}

static const struct dw_trainer ctr_trainer = {
    .start = ctr_start,
    .say_plan = ctr_say_plan,
    .queue = NULL,
    .batch = ctr_batch,
    .tables = ctr_tables,
    .compute = ctr_compute,
    .progress = ctr_progress,
    .evaluate = ctr_evaluate,
    .report = ctr_report,
    .free = ctr_free,
};

int dw_ctr_setup(struct dw_worker *w) {
  const struct cm_job *job = &w->spec->job;
  struct psc__client_opts o = {
      .worker = w->name, .connect_timeout_ms = w->args.connect_timeout_ms};
  struct run *r;
  uint64_t step = 0;
  int rc;

  if (w->args.standalone) {
    cm_error("job.model \"ctr\" trains against shards only: its tables live "
             "there (drop --standalone)");
    rc = CM_EINVAL;
    goto out;
  }
  if (!(r = calloc(1, sizeof *r))) {
    rc = CM_ENOMEM;
    cm_error("job.model \"ctr\": %s", cm_strerror(rc));
    goto out;
  }
  *r = (struct run){.w = w, .c = &job->ctr};
  w->mctx = r;
  w->trainer = &ctr_trainer;
  if (r->c->stream_dir[0] || r->c->stream_file[0]) {
    /* A stream: its windows are the data; nothing generated, no held-out
     * set. */
    if ((rc = build(r)) || (rc = dw_ctrs_open(w, &r->cs)))
      goto out;
    w->stream = 1;
  } else if ((rc = prepare_data(r)) || (rc = build(r)) ||
             (rc = load_set(r, r->data.train, w->index, w->nworkers,
                            &r->train)) ||
             (w->index == 0 &&
              (rc = load_set(r, r->data.test, 0, 1, &r->test))))
    goto out;
  if (!r->cs && !r->train.n) {
    cm_error("%s: no examples for worker %d of %d", r->data.train, w->index,
             w->nworkers);
    rc = CM_EFORMAT;
    goto out;
  }
  struct psc__table tables[2] = {{r->c->emb_table, (uint32_t)r->dim, 0},
                                 {r->c->wide_table, 1, 0}};
  if ((rc = psc__client_new(&w->client, w->spec, &o)) ||
      (rc = psc__client_declare(w->client, r->vars, r->nvars)) ||
      (rc = psc__client_declare_tables(w->client, tables, 2)) ||
      (rc = psc__client_join(w->client, w->index, job->heartbeat_ms, &step))) {
    cm_error("%s", w->client ? psc__client_error(w->client) : "no client");
    goto out;
  }
  w->step = step;
out:
  return rc;
}
