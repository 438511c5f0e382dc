/* The coordinator, served by shard 0: worker membership and heartbeats,
 * admission to synchronous steps, and SSP clocks for async jobs.
 *
 * Sync step t: a worker stages its gradient on every shard (Push with
 * step t), then asks admission (Admit). The first k of the live workers
 * make the step; it also closes at a deadline (a multiple of the median
 * recent step time, never under a floor) once at least m are in, unless
 * the job is deterministic. The set is sent to every shard in Commit(t);
 * workers left out are told their gradient was dropped. A worker silent
 * for dead_after_ms is declared dead and stops counting; Join brings it
 * back at the open step. Every parked call (Admit, Clock) is answered by a
 * decision, never by a sleeping thread. */
#ifndef PSD_COORD_H
#define PSD_COORD_H

#include <stdint.h>

#include "rpc.h"
#include "spec.h"

struct psd_coord;

/* What status reports per worker. */
struct psd_worker_info {
  int worker;          /* index */
  int live;            /* counted in n */
  int joined;          /* has ever joined */
  uint64_t applied;    /* gradients applied */
  uint64_t dropped;    /* gradients dropped */
  uint64_t clock;      /* async: pushes completed as last reported */
  double last_seen_ms; /* since last heard from */
  unsigned joins;      /* joins, rejoins included */
};

/* Borrows spec (which must outlive it). Opens channels to every shard for
 * the commits but sends nothing yet. */
int psd_coord_new(struct psd_coord **out, const struct cm_spec *spec);

/* Continues a job restored from a checkpoint: the first step opened for
 * admission is `step` (shard 0's steps committed). Call before serving. */
void psd_coord_resume(struct psd_coord *c, uint64_t step);

/* Starts the commit thread. */
int psd_coord_start(struct psd_coord *c);

/* Answers every parked call with UNAVAILABLE, stops the commit thread. */
void psd_coord_stop(struct psd_coord *c);
void psd_coord_free(struct psd_coord *c);

/* The coordinator's methods (owned by c). */
const struct cm_rpc_method *psd_coord_methods(struct psd_coord *c, int *n);

/* Acts on time: closes steps at their deadline, declares silent workers
 * dead. psd's loop calls it every few milliseconds. */
void psd_coord_tick(struct psd_coord *c);

/* Fills up to max entries; returns the number of workers. */
int psd_coord_workers(struct psd_coord *c, struct psd_worker_info *out,
                      int max);

/* The widest clock spread granted so far (async with staleness). */
uint64_t psd_coord_max_spread(struct psd_coord *c);

#endif
