/* The batch feeder: where each of the worker's training batches comes from.
 *
 * Batches are gathered ahead: while step t computes, libuv's thread pool
 * copies the shuffled examples of step t+1 into the other half of a double
 * buffer (uv_queue_work); the main thread runs the feeder's loop only to
 * wait for that work. At most one gather is ever in flight, so the shuffled
 * order it reads is never touched by two threads at once.
 *
 * Each epoch visits the examples of one share in a fresh order, reproducible
 * from (job seed, epoch, worker) alone. The caller owns the struct dw_feeder
 * (dw_feeder_init fills it, dw_feeder_free empties it) and the data set it
 * borrows, which must outlive it. */
#ifndef DW_FEEDER_H
#define DW_FEEDER_H

#include <stdint.h>
#include <uv.h>

#include "idx.h"

struct dw_feeder;

/* One half of the read-ahead double buffer. */
struct dw_slot {
  uv_work_t req;          /* the gather; req.data points at this slot */
  struct dw_feeder *feed; /* the feeder this slot belongs to */
  float *x;               /* owned, (batch, dim): the gathered pixels */
  uint8_t *y;             /* owned, (batch): the gathered labels */
  long step;              /* global step whose batch this slot holds */
  int n;                  /* examples in it; fewer at an epoch's end */
  int busy;               /* queued; completion not yet seen */
};

/* Prepares batches on libuv's thread pool, one step ahead of the trainer. */
struct dw_feeder {
  uv_loop_t loop;              /* runs only while waiting for a gather */
  int loop_ready;              /* loop initialised (so it must be closed) */
  const struct dw_dataset *ds; /* borrowed: this worker's examples */
  uint32_t *order;             /* owned, (ds->n): this epoch's shuffled order */
  long order_epoch;            /* epoch order was shuffled for; -1 = none */
  int batch;                   /* examples per full batch */
  long steps_per_epoch;        /* ceil(ds->n / batch) */
  uint64_t seed;               /* job.seed */
  int worker;                  /* worker index, mixed into the shuffle */
  struct dw_slot slot[2];      /* the double buffer; step t uses slot t % 2 */
};

/* Sets up *feed to serve batches of `batch` examples of ds (borrowed), in
 * the orders that seed and worker give. Returns 0, CM_ENOMEM or CM_ESYS;
 * dw_feeder_free is safe after a failure, and on a zeroed feeder. */
int dw_feeder_init(struct dw_feeder *feed, const struct dw_dataset *ds,
                   int batch, uint64_t seed, int worker);

/* Starts gathering step `step` into its slot (step % 2). Returns 0, or
 * CM_ESYS (logged) when the thread pool refused the work. */
int dw_feeder_queue(struct dw_feeder *feed, long step);

/* Waits for step `step`'s gather and returns its slot (owned by feed). */
struct dw_slot *dw_feeder_wait(struct dw_feeder *feed, long step);

/* Waits for any gather still in flight, then frees everything. */
void dw_feeder_free(struct dw_feeder *feed);

#endif
