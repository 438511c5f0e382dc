/* The coordinator (coord.h): creating, starting and stopping it, and the
 * step timing status reads of each worker. The rest is in the files
 * coord_internal.h lists: the calls it answers and where a sync step
 * closes (coord_barrier.c), the commit thread (coord_commit.c), rolling the
 * job back (coord_rollback.c). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "coord_internal.h"
#include "err.h"
#include "log.h"

void psd__coord_time_step(struct psd__coord_worker *w, double now) {
  if (w->step_mark > 0) {
    double ms = now - w->step_mark;
    w->steps[w->nsteps++ % PSD_COORD_STEP_RING] = (float)ms;
    psd_hist_observe(&w->step_hist, ms / 1e3);
  }
  w->step_mark = now;
}

static int cmp_float(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return x < y ? -1 : x > y;
}

/* The p50 and p95 (nearest rank) of the newest entries of a ring that has
 * had n written. */
static void ring_quantiles(const float *ring, uint64_t n, double *p50,
                           double *p95) {
  float t[PSD_COORD_STEP_RING];
  int k = n < PSD_COORD_STEP_RING ? (int)n : PSD_COORD_STEP_RING;
  *p50 = *p95 = 0;
  if (k == 0)
    return;
  memcpy(t, ring, k * sizeof *t);
  qsort(t, k, sizeof *t, cmp_float);
  *p50 = t[(int)(0.50 * (k - 1) + 0.5)];
  *p95 = t[(int)(0.95 * (k - 1) + 0.5)];
}

int psd_coord_new(struct psd_coord **out, const struct cm_spec *spec,
                  int nshards) {
  struct psd_coord *c = calloc(1, sizeof *c);
  const struct cm_job *job = &spec->job;
  char err[1024];
  int rc = 0;
  if (!c)
    return CM_ENOMEM;
  c->spec = spec;
  c->nshards = nshards;
  c->n = spec->nworker;
  c->sync = strcmp(job->mode, "sync") == 0;
  c->k = job->replicas_to_aggregate > 0 ? job->replicas_to_aggregate : c->n;
  c->m = job->min_replicas > 0 ? job->min_replicas : c->k;
  c->deterministic = job->deterministic;
  c->staleness = job->staleness;
  c->dead_after = job->dead_after_ms > 0 ? job->dead_after_ms : 5000;
  c->tail = &c->queue;
  cm_request_host_init(&c->host, job->name, "coordinator", "the coordinator");
  pthread_mutex_init(&c->lock, NULL);
  pthread_cond_init(&c->wake, NULL);
  psd__coord_init_methods(c);
  if (c->n > PSD_STEPS_MAX_WORKERS) {
    cm_error("coordinator: %d workers; at most %d are supported", c->n,
             PSD_STEPS_MAX_WORKERS);
    rc = CM_EINVAL;
    goto out;
  }
  if (!(c->w = calloc(c->n, sizeof *c->w))) {
    rc = CM_ENOMEM;
    goto out;
  }
  /* The coordinator calls the shards as a client does (peer.h): the token,
   * and with TLS the CA (and with mutual TLS the client certificate). */
  if ((rc = psd_peers_new(&c->peers, spec,
                          &(struct psd_peer_opts){.who = "coordinator"}, err,
                          sizeof err))) {
    cm_error("coordinator: %s", err);
    goto out;
  }
out:
  if (rc) {
    psd_coord_free(c);
    c = NULL;
  }
  *out = c;
  return rc;
}

void psd_coord_resume(struct psd_coord *c, uint64_t step) {
  pthread_mutex_lock(&c->lock);
  c->open = step;
  pthread_mutex_unlock(&c->lock);
}

void psd_coord_set_self(struct psd_coord *c,
                        const struct cm_request_self *self) {
  c->host.self = self;
}

int psd_coord_start(struct psd_coord *c) {
  if (pthread_create(&c->thread, NULL, psd__coord_commit_thread, c) != 0)
    return CM_ESYS;
  c->thread_started = 1;
  return 0;
}

void psd_coord_stop(struct psd_coord *c) {
  pthread_mutex_lock(&c->lock);
  c->stopping = 1;
  struct psd__coord_parked *lists[2] = {c->admits, c->clocks};
  c->admits = c->clocks = NULL;
  for (int i = 0; i < 2; i++)
    while (lists[i]) {
      struct psd__coord_parked *p = lists[i];
      lists[i] = p->next;
      cm_rpc_fail(p->call, GRPC_STATUS_UNAVAILABLE, "psd is shutting down");
      free(p);
    }
  pthread_cond_broadcast(&c->wake);
  pthread_mutex_unlock(&c->lock);
  if (c->thread_started) {
    pthread_join(c->thread, NULL);
    c->thread_started = 0;
  }
}

void psd_coord_free(struct psd_coord *c) {
  if (!c)
    return;
  psd_coord_stop(c);
  while (c->queue) {
    struct psd__coord_commit *cm = c->queue;
    c->queue = cm->next;
    free(cm);
  }
  psd_peers_free(c->peers);
  free(c->w);
  pthread_mutex_destroy(&c->lock);
  pthread_cond_destroy(&c->wake);
  free(c);
}

const struct cm_rpc_method *psd_coord_methods(struct psd_coord *c, int *n) {
  *n = 4;
  return c->methods;
}

void psd_coord_pushed(struct psd_coord *c, int worker) {
  if (worker < 0 || worker >= c->n)
    return;
  double now = cm_mono_ms();
  pthread_mutex_lock(&c->lock);
  c->w[worker].pushes++;
  psd__coord_time_step(&c->w[worker], now);
  pthread_mutex_unlock(&c->lock);
}

int psd_coord_workers(struct psd_coord *c, struct psd_worker_info *out,
                      int max) {
  double now = cm_mono_ms();
  pthread_mutex_lock(&c->lock);
  for (int i = 0; i < c->n && i < max; i++) {
    const struct psd__coord_worker *w = &c->w[i];
    struct psd_worker_info *o = &out[i];
    *o = (struct psd_worker_info){i,
                                  w->live,
                                  w->joined,
                                  w->applied,
                                  w->dropped,
                                  w->clock,
                                  w->joined ? now - w->last_seen : -1,
                                  w->joins};
    o->left = w->left;
    o->examples = w->examples;
    o->train_s = (w->last_ms - w->first_ms) / 1000.0;
    o->windows = w->windows;
    o->window_auc = w->window_auc;
    o->window_logloss = w->window_logloss;
    o->last_step = w->last_step;
    o->pushes = w->pushes;
    o->step_samples = w->nsteps < PSD_COORD_STEP_RING ? (unsigned)w->nsteps
                                                      : PSD_COORD_STEP_RING;
    ring_quantiles(w->steps, w->nsteps, &o->step_p50_ms, &o->step_p95_ms);
    ring_quantiles(w->lags, w->nlags, &o->lag_p50_ms, &o->lag_p95_ms);
    psd_hist_read(&w->step_hist, o->step_counts, &o->step_sum);
  }
  pthread_mutex_unlock(&c->lock);
  return c->n;
}

void psd_coord_job_rate(struct psd_coord *c, struct psd_job_rate *out) {
  double first = 0, last = 0;
  memset(out, 0, sizeof *out);
  pthread_mutex_lock(&c->lock);
  for (int i = 0; i < c->n; i++) {
    const struct psd__coord_worker *w = &c->w[i];
    if (w->last_ms <= 0)
      continue;
    if (!out->workers || w->first_ms < first)
      first = w->first_ms;
    if (!out->workers || w->last_ms > last)
      last = w->last_ms;
    out->workers++;
    out->examples += w->examples;
  }
  pthread_mutex_unlock(&c->lock);
  out->wall_s = (last - first) / 1000.0;
  if (out->wall_s > 0)
    out->examples_per_s = (double)out->examples / out->wall_s;
}

uint64_t psd_coord_max_spread(struct psd_coord *c) {
  pthread_mutex_lock(&c->lock);
  uint64_t s = c->max_spread;
  pthread_mutex_unlock(&c->lock);
  return s;
}
