/* dworker's click-through-rate job (job.model "ctr", docs/ctr.md): the
 * data set (generated into job.data_dir when missing), the model
 * (worker/model/ctr.h), and its loop over the shards: per batch, the batch's
 * unique ids' rows of the embedding and wide tables and the dense MLP are
 * pulled, the gradients computed, and the rows' and the MLP's gradients
 * pushed, in async, bounded-staleness or sync mode (in sync mode the rows
 * are staged for the step with the dense gradients before the worker asks
 * to be admitted). Worker 0 then scores the held-out set: the final: line's
 * test_auc and test_logloss, beside the true model's. */
#include <errno.h>
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "clock.h"
#include "ctr.h"
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
  struct dw_worker *w;          /* the worker */
  const struct cm_ctr_conf *c;  /* job.ctr */
  char dir[1024];               /* the data's directory */
  struct dw_ctrgen_truth truth; /* the true model's scores */
  struct dw_svm train, test;    /* this worker's share; the test set */
  struct dw_ctr *m;             /* the model */
  int dim;                      /* the embedding table's dim */
  struct psc__var vars[2 * DW_CTR_MAX_LAYERS]; /* the MLP's variables */
  char names[2 * DW_CTR_MAX_LAYERS][32];       /* their names */
  int nvars;                                   /* entries in vars */
  int cap; /* examples per batch (scratch size) */
  /* One batch's scratch, sized for cap examples. */
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
};

static void say_progress(const char *file, double done) {
  cm_info("generating %s: %.0f%%", file, 100.0 * done);
}

/* The data directory: job.data_dir, relative to the spec file's directory
 * when relative; generated there when missing or made with other settings.
 */
static int prepare_data(struct run *r) {
  const struct cm_job *job = &r->w->spec->job;
  char spec_dir[1024], err[1024];
  struct dw_ctrgen_opts o = {r->c->fields, (uint64_t)r->c->train,
                             (uint64_t)r->c->test, r->c->data_seed, r->c->zipf};
  snprintf(spec_dir, sizeof spec_dir, "%s", r->w->args.cluster);
  if (job->data_dir[0] == '/')
    snprintf(r->dir, sizeof r->dir, "%s", job->data_dir);
  else
    snprintf(r->dir, sizeof r->dir, "%s/%s", dirname(spec_dir), job->data_dir);
  if (dw_ctrgen_present(r->dir, &o, &r->truth))
    return 0;
  char p[1100];
  for (char *s = r->dir + 1;; s++) { /* mkdir -p */
    if (*s == '/' || !*s) {
      snprintf(p, sizeof p, "%.*s", (int)(s - r->dir), r->dir);
      if (mkdir(p, 0755) != 0 && errno != EEXIST) {
        cm_error("cannot create %s: %s", p, strerror(errno));
        return CM_EIO;
      }
    }
    if (!*s)
      break;
  }
  cm_info("generating the CTR data set in %s: %llu training and %llu "
          "held-out examples, %d fields, seed %llu",
          r->dir, (unsigned long long)o.train, (unsigned long long)o.test,
          o.fields, (unsigned long long)o.seed);
  double t0 = cm_mono_s();
  int rc =
      dw_ctrgen_write(r->dir, &o, &r->truth, say_progress, err, sizeof err);
  if (rc)
    cm_error("generating the data set: %s", err);
  else
    cm_info("generated in %.1f s: the true model's held-out AUC is %.4f, log "
            "loss %.4f",
            cm_mono_s() - t0, r->truth.auc, r->truth.logloss);
  return rc;
}

/* Loads a set and checks its features' fields. */
static int load_set(struct run *r, const char *name, int share, int nshares,
                    struct dw_svm *out) {
  char path[1100], err[1200];
  snprintf(path, sizeof path, "%s/%s", r->dir, name);
  int rc = dw_svm_load(path, share, nshares, out, err, sizeof err);
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
  if (!r->field || !r->row || !r->uniq || !r->slot || !r->emb || !r->gemb ||
      !r->wide || !r->gwide || !r->logit)
    return CM_ENOMEM;
  for (int l = 0; l < r->m->nlayers; l++) {
    struct psc__var *w = &r->vars[r->nvars], *b = &r->vars[r->nvars + 1];
    snprintf(r->names[r->nvars], sizeof r->names[0], "ctr/w%d", l);
    snprintf(r->names[r->nvars + 1], sizeof r->names[0], "ctr/b%d", l);
    *w = (struct psc__var){.name = r->names[r->nvars],
                           .ndim = 2,
                           .shape = {r->m->width[l], r->m->width[l + 1]},
                           .placement = PSC__PLACE_AUTO,
                           .init = PSC__INIT_UNIFORM,
                           .init_scale = dw_ctr_init_scale(r->m, l),
                           .value = r->m->w[l],
                           .grad = r->m->gw[l]};
    *b = (struct psc__var){.name = r->names[r->nvars + 1],
                           .ndim = 1,
                           .shape = {r->m->width[l + 1]},
                           .placement = PSC__PLACE_AUTO,
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

/* Rows of the batch's unique ids, both tables, in one call. */
static int pull_rows(struct run *r, int nu, int sync) {
  struct psc__rows q[2] = {
      {r->c->emb_table, r->uniq, (size_t)nu, r->emb, NULL},
      {r->c->wide_table, r->uniq, (size_t)nu, r->wide, NULL}};
  return sync ? psc__client_pull_rows_at(r->w->client, q, 2, r->w->step)
              : psc__client_pull_rows(r->w->client, q, 2);
}

/* Sync: goes on from the step a rollback or a rejoin named. */
static int moved(struct run *r) {
  uint64_t step;
  if (psc__client_rolled_back(r->w->client, &step) ||
      psc__client_rejoined(r->w->client, &step)) {
    cm_warn("the job went back to step %llu; going on from there",
            (unsigned long long)step);
    r->w->step = step;
    return 1;
  }
  return 0;
}

/* One training step on examples [from, from + n) of the share. */
static int train_step(struct run *r, size_t from, int n, size_t *start,
                      uint8_t *y, float *val) {
  struct dw_worker *w = r->w;
  struct dw_ctr_batch b;
  float loss = 0;
  int rc;
  gather(r, &r->train, from, n, &b, start, y, val);
  if (w->ssp && (rc = psc__client_clock(w->client, w->clock)))
    return rc;
  if (w->sync) {
    uint64_t version;
    do
      rc = psc__client_pull_at(w->client, w->step, &version);
    while (rc == 0 && moved(r));
    if (rc == 0)
      rc = pull_rows(r, b.nrows, 1);
  } else {
    rc = psc__client_pull(w->client);
    if (rc == 0)
      rc = pull_rows(r, b.nrows, 0);
  }
  if (rc)
    return rc;
  if ((rc = dw_ctr_step(r->m, &b, r->emb, r->wide, r->logit, &loss, r->gemb,
                        r->gwide)))
    return rc;
  for (int i = 0; i < n; i++) {
    size_t at = r->nrecent++ % RECENT;
    r->recent[at] = r->logit[i];
    r->recent_y[at] = y[i];
  }
  r->loss_sum += loss;
  r->loss_n++;
  struct psc__rows q[2] = {
      {r->c->emb_table, r->uniq, (size_t)b.nrows, NULL, r->gemb},
      {r->c->wide_table, r->uniq, (size_t)b.nrows, NULL, r->gwide}};
  psc__client_set_examples(w->client, (uint32_t)n);
  if (w->sync) {
    int closed = 0, admitted = 0;
    uint64_t next = w->step + 1;
    rc = psc__client_push_rows_step(w->client, q, 2, w->step, &closed);
    if (rc == 0 && !closed && !moved(r))
      rc = psc__client_push_step(w->client, w->step, &closed);
    if (rc == 0 && !closed && !moved(r))
      rc = psc__client_admit(w->client, w->step, &admitted, &next);
    if (rc == 0 && moved(r))
      return 0;
    if (rc == 0 && !admitted)
      w->dropped++;
    w->step = next > w->step ? next : w->step + 1;
  } else {
    rc = psc__client_push_rows(w->client, q, 2);
    if (rc == 0)
      rc = psc__client_push(w->client);
    w->clock++;
  }
  return rc;
}

/* Scores the test set with the shards' current values. */
static int evaluate(struct run *r, double *auc, double *logloss) {
  size_t n = r->test.n, feats = (size_t)r->cap * 64 + 1;
  float *score = malloc((n + 1) * sizeof *score), *val = malloc(feats * 4);
  size_t *start = malloc(((size_t)r->cap + 1) * sizeof *start);
  uint8_t *y = malloc((size_t)r->cap + 1);
  double ll = 0;
  int rc = CM_ENOMEM;
  if (!score || !val || !start || !y)
    goto out;
  for (size_t at = 0; at < n; at += EVAL_BATCH) {
    int k = n - at < EVAL_BATCH ? (int)(n - at) : EVAL_BATCH;
    struct dw_ctr_batch b;
    gather(r, &r->test, at, k, &b, start, y, val);
    if ((rc = pull_rows(r, b.nrows, 0)))
      goto out;
    b.y = NULL;
    dw_ctr_step(r->m, &b, r->emb, r->wide, score + at, NULL, NULL, NULL);
  }
  for (size_t i = 0; i < n; i++) {
    double z = score[i];
    ll += (z > 0 ? z + log1p(exp(-z)) : log1p(exp(z))) - r->test.y[i] * z;
  }
  *auc = dw_auc(score, r->test.y, n);
  *logloss = ll / (double)(n ? n : 1);
  rc = 0;
out:
  free(score);
  free(val);
  free(start);
  free(y);
  return rc;
}

static void free_run(struct run *r) {
  dw_svm_free(&r->train);
  dw_svm_free(&r->test);
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
}

int dw_ctr_run(struct dw_worker *w) {
  const struct cm_job *job = &w->spec->job;
  struct run r = {.w = w, .c = &job->ctr};
  struct psc__client_opts o = {
      .worker = w->name, .connect_timeout_ms = w->args.connect_timeout_ms};
  size_t *start = NULL;
  uint8_t *y = NULL;
  float *val = NULL;
  int rc;
  if (w->args.standalone) {
    cm_error("job.model \"ctr\" trains against shards only: its tables live "
             "there (drop --standalone)");
    return CM_EINVAL;
  }
  if ((rc = prepare_data(&r)) || (rc = build(&r)) ||
      (rc = load_set(&r, "train.svm", w->index, w->nworkers, &r.train)) ||
      (w->index == 0 && (rc = load_set(&r, "test.svm", 0, 1, &r.test))))
    goto out;
  if (!r.train.n) {
    cm_error("%s/train.svm: no examples for worker %d of %d", r.dir, w->index,
             w->nworkers);
    rc = CM_EFORMAT;
    goto out;
  }
  struct psc__table tables[2] = {{r.c->emb_table, (uint32_t)r.dim, 0},
                                 {r.c->wide_table, 1, 0}};
  uint64_t step = 0;
  if ((rc = psc__client_new(&w->client, w->spec, &o)) ||
      (rc = psc__client_declare(w->client, r.vars, r.nvars)) ||
      (rc = psc__client_declare_tables(w->client, tables, 2)) ||
      (rc = psc__client_join(w->client, w->index, job->heartbeat_ms, &step))) {
    cm_error("%s", w->client ? psc__client_error(w->client) : "no client");
    goto out;
  }
  w->step = step;
  dw_notify_ready(w);
  int bsz = job->batch_size;
  long per_epoch = (long)((r.train.n + (size_t)bsz - 1) / (size_t)bsz);
  long total = per_epoch * job->epochs;
  if (job->max_steps > 0 && job->max_steps < total)
    total = job->max_steps;
  start = malloc(((size_t)r.cap + 1) * sizeof *start);
  y = malloc((size_t)r.cap + 1);
  val = malloc(((size_t)r.cap * 64 + 1) * sizeof *val);
  if (!start || !y || !val) {
    rc = CM_ENOMEM;
    goto out;
  }
  cm_info("training: %zu examples here, %ld steps of %d, %d fields, tables "
          "'%s' (dim %d) and '%s'; the true model's held-out AUC is %.4f",
          r.train.n, total, bsz, r.c->fields, r.c->emb_table, r.dim,
          r.c->wide_table, r.truth.auc);
  double t0 = cm_mono_s();
  for (long t = 0; t < total; t++) {
    /* Sync: the batch of the job's step, so a run is reproducible. */
    long k = w->sync ? (long)w->step : t;
    size_t from = (size_t)(k % per_epoch) * (size_t)bsz;
    int n = (size_t)bsz < r.train.n - from ? bsz : (int)(r.train.n - from);
    if ((rc = train_step(&r, from, n, start, y, val))) {
      cm_error("step %ld: %s", t, psc__client_error(w->client));
      goto out;
    }
    w->steps_done++;
    w->examples_done += (uint64_t)n;
    dw_notify_step(w, t);
    if ((t + 1) % job->log_every == 0 || t + 1 == total) {
      size_t m = r.nrecent < RECENT ? r.nrecent : RECENT;
      double rate = (double)w->examples_done / (cm_mono_s() - t0);
      double auc_recent = dw_auc(r.recent, r.recent_y, m);
      printf("step %ld/%ld: logloss=%.4f auc=%.4f (last %zu examples) "
             "examples=%llu worker_examples_per_s=%.0f\n",
             t + 1, total, r.loss_sum / (double)r.loss_n, auc_recent, m,
             (unsigned long long)w->examples_done, rate);
      dw_tb_ctr(w, t + 1, "train", r.loss_sum / (double)r.loss_n, auc_recent,
                rate);
      fflush(stdout);
      r.loss_sum = 0;
      r.loss_n = 0;
    }
  }
  w->train_end = cm_mono_s();
  w->train_s = w->train_end - t0;
  double rate = w->train_s > 0 ? (double)w->examples_done / w->train_s : 0;
  if (psc__client_leave(w->client, w->examples_done, w->train_s, 0.0) < 0)
    cm_warn("leave: %s", psc__client_error(w->client));
  if (w->index != 0) {
    printf("done: steps=%ld examples=%llu worker_examples_per_s=%.0f "
           "wall_s=%.1f dropped=%ld\n",
           w->steps_done, (unsigned long long)w->examples_done, rate,
           w->train_s, w->dropped);
    fflush(stdout);
    goto out;
  }
  double auc = 0, ll = 0;
  uint64_t version;
  if ((rc = w->sync ? psc__client_pull_at(w->client, w->step, &version)
                    : psc__client_pull(w->client)) ||
      (rc = evaluate(&r, &auc, &ll))) {
    cm_error("evaluation: %s", psc__client_error(w->client));
    goto out;
  }
  dw_tb_ctr(w, w->steps_done, "test", ll, auc, 0);
  printf("final: test_auc=%.4f test_logloss=%.4f true_auc=%.4f "
         "true_logloss=%.4f epochs=%ld examples=%llu "
         "worker_examples_per_s=%.0f wall_s=%.1f steps=%ld dropped=%ld\n",
         auc, ll, r.truth.auc, r.truth.logloss,
         (w->steps_done + per_epoch - 1) / per_epoch,
         (unsigned long long)w->examples_done, rate, w->train_s, w->steps_done,
         w->dropped);
  fflush(stdout);
out:
  free(start);
  free(y);
  free(val);
  free_run(&r);
  return rc;
}
