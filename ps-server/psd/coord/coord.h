/* Room ps-server/psd/coord/, the coordinator of the training shard (shard
 * 0's second role): this header; coord_internal.h is the room's own.
 * Rooms it calls: shard/ (steps.h's bound on workers, hist.h), peer/ (its
 * calls to the shards).
 *
 * The coordinator, served by shard 0: worker membership and heartbeats,
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
 * decision, never by a sleeping thread. coord_internal.h lists the files
 * that make it. */
#ifndef PSD_COORD_H
#define PSD_COORD_H

#include <stdint.h>

#include "hist.h"
#include "rpc_server.h"
#include "spec.h"

/* Step times each worker keeps for its quantiles (a ring of the newest). */
#define PSD_COORD_STEP_RING 128

/* The largest clock a worker may report (Clock): far beyond any real count
 * of pushes, small enough that clock arithmetic never wraps. */
#define PSD_COORD_MAX_CLOCK (1ULL << 48)

struct psd_coord;

/* What status reports per worker. */
struct psd_worker_info {
  int worker;            /* index */
  int live;              /* counted in n */
  int joined;            /* has ever joined */
  uint64_t applied;      /* gradients applied */
  uint64_t dropped;      /* gradients dropped */
  uint64_t clock;        /* async: pushes completed as last reported */
  double last_seen_ms;   /* since last heard from */
  unsigned joins;        /* joins, rejoins included */
  int left;              /* said it finished (Join with leave) */
  uint64_t examples;     /* examples it reported when it left, else 0 */
  double train_s;        /* its training time as reported then, else 0 */
  uint64_t windows;      /* on a stream: windows scored (heartbeats) */
  double window_auc;     /* the last one's AUC, scored before training */
  double window_logloss; /* and its log loss */

  /* Step timing, kept by the coordinator (psd_coord_pushed, Admit). */
  uint64_t last_step;    /* sync: the step of its last Admit */
  uint64_t pushes;       /* async: pushes timed (psd_coord_pushed) */
  unsigned step_samples; /* step times in the ring, at most the ring size */
  double step_p50_ms;    /* median of the ring's step times, 0 when empty */
  double step_p95_ms;    /* 95th percentile of the same */
  double lag_p50_ms;     /* sync: median ms from step opening to its Admit */
  double lag_p95_ms;     /* sync: 95th percentile of the same */
  uint64_t step_counts[PSD_HIST_BOUNDS + 1]; /* every step time, bucketed */
  double step_sum;                           /* their sum, seconds */
};

/* Sync, a live reshard's step boundary (live.h): the step open now (0-based:
 * its commit makes the job's version one more), and how many workers are
 * live. */
uint64_t psd_coord_open_step(struct psd_coord *c, int *live);

/* Waits until every shard has committed `version` steps, up to ms. Returns
 * 1 when they have, 0 when not (time out, or psd stops). */
int psd_coord_wait_committed(struct psd_coord *c, uint64_t version, int ms);

/* A live reshard re-executes ps:0 (live.h): the workers joined and live
 * now, as "0,2,5" into buf (returns how many), and, in the new process
 * before it serves, the same list adopted as joined and live, so that
 * their next Admit or heartbeat is not answered "join again" (which would
 * redo the step they are at with their next batch). */
int psd_coord_members(struct psd_coord *c, char *buf, size_t len);
void psd_coord_adopt(struct psd_coord *c, const char *list);

/* Borrows spec (which must outlive it); nshards is the layout's shard count
 * (1..spec->nps). Opens channels to every address of the spec but sends
 * nothing yet. */
int psd_coord_new(struct psd_coord **out, const struct cm_spec *spec,
                  int nshards);

/* Continues a job restored from a checkpoint: the first step opened for
 * admission is `step` (shard 0's steps committed). Call before serving. */
void psd_coord_resume(struct psd_coord *c, uint64_t step);

/* Checks every caller against self (request.h: the spec's fingerprint, the
 * boot id); borrowed, it must outlive c. Call before serving. */
struct cm_request_self;
void psd_coord_set_self(struct psd_coord *c,
                        const struct cm_request_self *self);

/* Starts the commit thread. */
int psd_coord_start(struct psd_coord *c);

/* Answers every parked call with UNAVAILABLE, stops the commit thread. */
void psd_coord_stop(struct psd_coord *c);

/* Sync: names the step of an operator's checkpoint cut. The step open now
 * closes as a cut: its commit tells every shard to checkpoint it, so every
 * shard writes the same step. *step is the step the checkpoints will hold
 * (the open step + 1, as versions count); with no live worker, the steps
 * every shard has committed (nothing is armed: the shards write now).
 * Returns 0, or CM_EINVAL (async job) or CM_EUNAVAIL (a rollback is under
 * way, or the shards disagree) with the reason in err. */
int psd_coord_cut(struct psd_coord *c, uint64_t *step, char *err, size_t len);
void psd_coord_free(struct psd_coord *c);

/* The coordinator's methods (owned by c). */
const struct cm_rpc_method *psd_coord_methods(struct psd_coord *c, int *n);

/* Acts on time: closes steps at their deadline, declares silent workers
 * dead. psd's loop calls it every few milliseconds. */
void psd_coord_tick(struct psd_coord *c);

/* Async: worker `worker` sent the first message of a push to this shard
 * (PushRequest.has_worker and first). Records the gap since its previous
 * one as a step time; ignores an index out of range. No allocation. */
void psd_coord_pushed(struct psd_coord *c, int worker);

/* Fills up to max entries; returns the number of workers. */
int psd_coord_workers(struct psd_coord *c, struct psd_worker_info *out,
                      int max);

/* The widest clock spread granted so far (async with staleness). */
/* The job's measured rate: every worker that left reported its examples
 * and when its first and last steps were (coord_barrier.c, Join); the rate
 * is their sum over the span from the earliest first step to the latest
 * last step. */
struct psd_job_rate {
  unsigned workers;      /* workers that reported */
  uint64_t examples;     /* their examples, summed */
  double wall_s;         /* earliest first step to latest last step */
  double examples_per_s; /* examples / wall_s, 0 when nothing reported */
};

/* Fills *out with the job's rate so far. */
void psd_coord_job_rate(struct psd_coord *c, struct psd_job_rate *out);

uint64_t psd_coord_max_spread(struct psd_coord *c);

#endif
