/* Where the worker's training batches come from: a feeder (feeder.h) per
 * share of the training set, which gathers each step's shuffled examples
 * on libuv's thread pool one step ahead of the trainer, and the worker's
 * view of its feeders: one, or with --emulate-workers N the N workers'
 * batches of a step joined into one. */
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "dworker_internal.h"
#include "err.h"
#include "feeder.h"
#include "log.h"
#include "rand.h"

/* Puts feed->order into the order of epoch `epoch`: a Fisher-Yates shuffle
 * of the identity seeded by (job seed, epoch, worker), so every epoch's
 * order is reproducible on its own. */
static void shuffle_epoch(struct dw_feeder *feed, long epoch) {
  uint64_t s = feed->seed * 0x9e3779b97f4a7c15ull +
               (uint64_t)epoch * 0xbf58476d1ce4e5b9ull +
               (uint64_t)feed->worker * 0x94d049bb133111ebull;
  uint32_t i, n = (uint32_t)feed->ds->n;

  for (i = 0; i < n; i++)
    feed->order[i] = i;
  for (i = n; i > 1; i--) {
    /* multiply-shift maps 32 random bits onto [0, i) */
    uint32_t j = (uint32_t)(((cm_splitmix64(&s) >> 32) * (uint64_t)i) >> 32);
    uint32_t t = feed->order[i - 1];

    feed->order[i - 1] = feed->order[j];
    feed->order[j] = t;
  }
  feed->order_epoch = epoch;
}

/* Runs on libuv's thread pool: copies step slot->step's examples into the
 * slot, shuffling first when the step opens a new epoch. */
static void gather_work(uv_work_t *req) {
  struct dw_slot *slot = req->data;
  struct dw_feeder *feed = slot->feed;
  const struct dw_dataset *ds = feed->ds;
  long epoch = slot->step / feed->steps_per_epoch;
  long first = (slot->step % feed->steps_per_epoch) * feed->batch;
  int k;

  if (epoch != feed->order_epoch)
    shuffle_epoch(feed, epoch);
  slot->n = ds->n - first < feed->batch ? (int)(ds->n - first) : feed->batch;
  for (k = 0; k < slot->n; k++) {
    uint32_t e = feed->order[first + k];

    memcpy(slot->x + (size_t)k * ds->dim, ds->x + (size_t)e * ds->dim,
           (size_t)ds->dim * sizeof *slot->x);
    slot->y[k] = ds->y[e];
  }
}

/* Runs on the loop (main) thread once the gather is done. */
static void gather_done(uv_work_t *req, int status) {
  struct dw_slot *slot = req->data;

  (void)status; /* gathers are never cancelled */
  slot->busy = 0;
}

int dw_feeder_init(struct dw_feeder *feed, const struct dw_dataset *ds,
                   int batch, uint64_t seed, int worker) {
  int rc = 0;
  int i;

  memset(feed, 0, sizeof *feed);
  feed->ds = ds;
  feed->batch = batch;
  feed->steps_per_epoch = (ds->n + batch - 1) / batch;
  feed->seed = seed;
  feed->worker = worker;
  feed->order_epoch = -1;
  feed->order = malloc((size_t)ds->n * sizeof *feed->order);
  if (feed->order == NULL) {
    rc = CM_ENOMEM;
    goto out;
  }
  for (i = 0; i < 2; i++) {
    feed->slot[i].feed = feed;
    feed->slot[i].req.data = &feed->slot[i];
    feed->slot[i].x = malloc((size_t)batch * ds->dim * sizeof(float));
    feed->slot[i].y = malloc((size_t)batch);
    if (feed->slot[i].x == NULL || feed->slot[i].y == NULL) {
      rc = CM_ENOMEM;
      goto out;
    }
  }
  if (uv_loop_init(&feed->loop) != 0) {
    rc = CM_ESYS;
    goto out;
  }
  feed->loop_ready = 1;
out:
  return rc;
}

/* Starts gathering step `step` into its slot (step % 2). */
int dw_feeder_queue(struct dw_feeder *feed, long step) {
  struct dw_slot *slot = &feed->slot[step % 2];
  int rc;

  slot->step = step;
  slot->busy = 1;
  rc = uv_queue_work(&feed->loop, &slot->req, gather_work, gather_done);
  if (rc != 0) {
    slot->busy = 0;
    cm_error("cannot queue a batch on the thread pool: %s", uv_strerror(rc));
    return CM_ESYS;
  }
  return 0;
}

/* Waits for step `step`'s gather and returns its slot. */
struct dw_slot *dw_feeder_wait(struct dw_feeder *feed, long step) {
  struct dw_slot *slot = &feed->slot[step % 2];

  while (slot->busy)
    uv_run(&feed->loop, UV_RUN_ONCE);
  return slot;
}

/* Waits for any gather still in flight, then frees everything. */
void dw_feeder_free(struct dw_feeder *feed) {
  int i;

  if (feed->loop_ready) {
    uv_run(&feed->loop, UV_RUN_DEFAULT);
    uv_loop_close(&feed->loop);
    feed->loop_ready = 0;
  }
  for (i = 0; i < 2; i++) {
    free(feed->slot[i].x);
    free(feed->slot[i].y);
  }
  free(feed->order);
  memset(feed, 0, sizeof *feed);
}

/* ---- The worker's batches ---- */

int dw_batches_init(struct dw_worker *w) {
  const struct cm_job *job = &w->spec->job;
  int rc;

  rc =
      dw_feeder_init(&w->feed, &w->train, job->batch_size, job->seed, w->index);
  for (int i = 1; rc == 0 && i < w->nfeeds; i++)
    rc = dw_feeder_init(&w->emu_feed[i], &w->emu_ds[i], job->batch_size,
                        job->seed, i);
  if (rc == 0 && w->nfeeds > 1) {
    size_t max = (size_t)job->batch_size * w->nfeeds;
    w->batch_x = malloc(max * w->train.dim * sizeof *w->batch_x);
    w->batch_y = malloc(max);
    if (!w->batch_x || !w->batch_y)
      rc = CM_ENOMEM;
  }
  return rc;
}

/* Starts gathering step `step`'s batches: this worker's and, with
 * --emulate-workers, the emulated ones'. */
int dw_batches_queue(struct dw_worker *w, long step) {
  int rc = dw_feeder_queue(&w->feed, step);
  for (int i = 1; rc == 0 && i < w->nfeeds; i++)
    rc = dw_feeder_queue(&w->emu_feed[i], step);
  return rc;
}

int dw_batches_wait(struct dw_worker *w, long t, const float **x,
                    const uint8_t **y) {
  struct dw_slot *slot = dw_feeder_wait(&w->feed, t);
  int n = slot->n;

  *x = slot->x;
  *y = slot->y;
  if (w->nfeeds > 1) {
    /* The emulated workers' batches of step t, back to back. */
    size_t dim = (size_t)w->train.dim;
    for (int i = 0; i < w->nfeeds; i++) {
      const struct dw_slot *s =
          i == 0 ? slot : dw_feeder_wait(&w->emu_feed[i], t);
      size_t at = (size_t)(i == 0 ? 0 : n);
      memcpy(w->batch_x + at * dim, s->x, (size_t)s->n * dim * sizeof **x);
      memcpy(w->batch_y + at, s->y, (size_t)s->n);
      if (i > 0)
        n += s->n;
    }
    *x = w->batch_x;
    *y = w->batch_y;
  }
  return n;
}

void dw_batches_free(struct dw_worker *w) {
  dw_feeder_free(&w->feed);
  for (int i = 1; i < w->nfeeds; i++)
    dw_feeder_free(&w->emu_feed[i]);
  free(w->batch_x);
  free(w->batch_y);
  w->batch_x = NULL;
  w->batch_y = NULL;
}
