/* The coordinator's internals (coord.h), shared by the files it is made of:
 *   coord.c           creating, starting and stopping it; step timing and
 *                     what status reads of the workers
 *   coord_barrier.c   the calls it answers: membership (Join, Heartbeat),
 *                     admission to a sync step and where that step closes
 *                     (Admit, the deadline), SSP clocks (Clock), and
 *                     psd_coord_tick, which acts on time
 *   coord_commit.c    the commit thread: sends each closed step to every
 *                     shard (Data/Commit), a call retried until every
 *                     shard answers (as a rollback is), through peer.h
 *   coord_rollback.c  the shards' steps checked at the start and watched
 *                     while idle, and the job rolled back (Data/Rollback)
 * All state is guarded by one mutex: calls arrive on the gRPC queue thread,
 * deadlines and heartbeats are checked by psd's loop (psd_coord_tick), and
 * commits are sent by a thread of their own so that no handler ever waits on
 * the network. Nothing here is for other modules: they use coord.h. */
#ifndef PSD_COORD_INTERNAL_H
#define PSD_COORD_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include "coord.h"
#include "hist.h"
#include "peer.h"
#include "ps.pb-c.h"
#include "request.h"
#include "rpc_client.h"
#include "rpc_server.h"
#include "spec.h"
#include "steps.h"

/* The wait before a commit or rollback is sent again to the shards that
 * missed it, ms. */
#define PSD__COORD_RETRY_MS 100

/* Step times kept for the median that sets the admission deadline. */
#define PSD__COORD_RECENT_STEPS 21

/* A call waiting for a decision. */
struct psd__coord_parked {
  struct cm_rpc_call *call; /* answered exactly once */
  int worker;               /* who asked */
  uint64_t value;           /* Admit: the step; Clock: the clock */
  int rejoin; /* Admit of a worker this coordinator has not seen join, parked
                 until the shards' steps are checked: answered "join again"
                 (or told of the rollback the check decides) */
  struct psd__coord_parked *next; /* list link */
};

/* A decided step, waiting to be sent to every shard. */
struct psd__coord_commit {
  uint64_t step;                      /* the step */
  int napplied, ndropped;             /* entries used below */
  int applied[PSD_STEPS_MAX_WORKERS]; /* its set */
  int dropped[PSD_STEPS_MAX_WORKERS]; /* live workers left out */
  int checkpoint;                     /* every shard checkpoints it (a cut) */
  struct psd__coord_commit *next;     /* queue link */
};

/* What the coordinator knows of one worker. */
struct psd__coord_worker {
  int live;         /* counted in n */
  int joined;       /* has joined at least once */
  unsigned joins;   /* joins, rejoins included */
  double last_seen; /* ms, monotonic */
  uint64_t applied; /* gradients applied */
  uint64_t dropped; /* gradients dropped */
  uint64_t clock;   /* async: pushes completed, as last reported */
  int arrived;      /* sync: in the open step's arrivals */
  int left;         /* said it finished (Join with leave) */
  /* What it reported when it last left, for the job's rate: its examples
   * and its first step's start and last step's end, in this coordinator's
   * monotonic ms (0, 0, 0 until it has left). */
  uint64_t examples;
  double first_ms, last_ms;
  uint64_t windows; /* on a stream: windows scored, as its heartbeats say */
  double window_auc, window_logloss; /* the last one's scores */
  int must_rejoin; /* declared dead since its last Join: its heartbeats are
                      answered "join again" until it does (a heartbeat's
                      answer may be lost, as when it was cut off) */

  /* Step timing (status, psctl workers). */
  double step_mark;   /* ms of its last timed event (Admit or push); 0: none
                         since it joined, so a rejoin's gap is no step */
  uint64_t last_step; /* sync: the step of its last Admit */
  uint64_t pushes;    /* async: pushes timed */
  float steps[PSD_COORD_STEP_RING]; /* step times, ms; ring */
  float lags[PSD_COORD_STEP_RING];  /* sync: step opening to Admit, ms; ring */
  uint64_t nsteps, nlags;           /* written ever; next slot is n % ring */
  struct psd_hist step_hist;        /* every step time, seconds */
};

struct psd_coord {
  const struct cm_spec *spec; /* borrowed */
  int nshards;                /* shards of the job's layout: the ones
                                 commits and rollbacks go to (peers reach
                                 every spec address) */
  struct psd_peers *peers;    /* owned: how it calls the shards (peer.h) */
  int n;                      /* workers in the job */
  int sync;                   /* 1: sync mode */
  int k, m;                   /* replicas_to_aggregate, min_replicas */
  int deterministic;          /* no deadline closing */
  int staleness;              /* async SSP bound, -1 none */
  double dead_after;          /* ms of silence that kill */
  double started; /* ms: the first join (0: none yet), for the start barrier */
  struct cm_rpc_method methods[4];     /* Join, Heartbeat, Admit, Clock */
  struct cm_request_host host;         /* how requests are taken, refused */
  pthread_mutex_t lock;                /* guards everything below */
  struct psd__coord_worker *w;         /* owned, n entries */
  uint64_t open;                       /* the step open for admission */
  int arrivals[PSD_STEPS_MAX_WORKERS]; /* open step's arrivals, in order */
  int narrivals;                       /* entries used */
  double first_arrival;                /* ms of the open step's first Admit */
  double last_close;                   /* ms of the last close */
  double recent[PSD__COORD_RECENT_STEPS];  /* step durations, ms (ring) */
  int nrecent;                             /* durations recorded, capped */
  int warned_below_m;                      /* said once that live < m */
  struct psd__coord_parked *admits;        /* parked Admit calls */
  struct psd__coord_parked *clocks;        /* parked Clock calls */
  uint64_t max_spread;                     /* widest granted clock spread */
  struct psd__coord_commit *queue, **tail; /* commits not yet sent */
  pthread_cond_t wake;                     /* commit thread: queue or stop */
  int stopping;                            /* stop requested */
  pthread_t thread;                        /* the commit thread */
  int thread_started;                      /* thread must be joined */
  int checked;        /* sync: every shard was found at step `open` (or not) */
  char bad[1024];     /* sync: why the shards' steps disagree, "" when fine */
  uint64_t committed; /* sync: steps every shard has committed */
  uint64_t gen;       /* sync: rollbacks so far (the job's generation) */
  uint64_t rollback_step; /* sync: the step of the last rollback */
  int rolling;            /* sync: a rollback is being sent to the shards:
                             no step closes, Admit calls are parked */
  int cut_armed;          /* sync: the step cut_step closes as a cut */
  uint64_t cut_step;      /* sync: the step whose commit carries checkpoint */
  double publish_due;     /* sync, job.publish: cm_mono_ms when the next
                             commit sent carries publish (commit thread) */
};

/* ---- coord.c */

/* Records one step time of w, ending now. Caller holds the lock. */
void psd__coord_time_step(struct psd__coord_worker *w, double now);

/* ---- coord_barrier.c */

/* Fills c->methods with the four calls the coordinator answers. */
void psd__coord_init_methods(struct psd_coord *c);

/* Closes the open step if its rule is met. Caller holds the lock. */
void psd__coord_maybe_close(struct psd_coord *c, double now);

/* Answers an Admit whose gradient is not counted because the worker must
 * go elsewhere first: rejoin 0, the job rolled back (it goes on from the
 * step rolled back to); rejoin 1, this coordinator has not seen it join (it
 * restarted since), so it joins again and the Join answers the step and
 * generation to go on from. Caller holds the lock. */
void psd__coord_reply_redirect(struct psd_coord *c, struct cm_rpc_call *call,
                               uint64_t step, int rejoin);

/* ---- coord_commit.c */

/* The commit thread (psd_coord_start): arg is the coordinator. */
void *psd__coord_commit_thread(void *arg);

/* Between rounds of calls: waits up to ms (0: not at all) unless psd is
 * stopping, woken early by a stop. Returns whether psd is stopping. Called
 * without the lock. */
int psd__coord_pause(struct psd_coord *c, int ms);

/* How a commit or a rollback is sent until every shard of the job has it
 * (psd_peer_call_until_all over the job's nshards): each call within the
 * job's timeout, again every PSD__COORD_RETRY_MS, judge (with arg) on an
 * answer that is not OK, the pause psd__coord_pause's; what names the
 * call in the log ("commit of step 7 to"). */
struct psd_peer_rounds psd__coord_rounds(struct psd_coord *c, const char *what,
                                         psd_peer_judge judge, void *arg);

/* ---- coord_rollback.c: on the commit thread, without the lock; calls and
 * done have an entry per shard (the commit thread's, reused). */

/* Sync, before the first commit: asks every shard for its step and decides
 * (psd__coord_plan) whether the job goes on, stops, or rolls back. */
void psd__coord_check_steps(struct psd_coord *c, struct cm_unary *calls,
                            int *done);

/* Sync, while no commit is being sent: rolls the job back when a shard
 * restarted from a checkpoint. */
void psd__coord_watch_shards(struct psd_coord *c, struct cm_unary *calls,
                             int *done);

/* Asks shard s for its step and generation, waiting up to timeout_ms.
 * Returns 0, or -1 when it did not answer. */
int psd__coord_shard_step(struct psd_coord *c, struct cm_unary *call, int s,
                          int timeout_ms, uint64_t *step, uint64_t *gen);

/* Rolls the whole job back to `step` (coord_rollback.c says how). from:
 * the highest step any shard had reached, if known beyond the
 * coordinator's own; who: what happened, for the log. */
void psd__coord_rollback(struct psd_coord *c, struct cm_unary *calls, int *done,
                         uint64_t step, uint64_t from, const char *who);

/* One shard as its Status answered a starting coordinator. */
struct psd_coord_shard {
  uint64_t step; /* steps committed */
  uint64_t gen;  /* rollbacks it knows of (StatusResponse.rollbacks) */
  int resumed;   /* it resumed from a checkpoint at its start and has not
                    been rolled back since */
  int ncommits;  /* commits in its history (made since it started) */
};

/* How a starting coordinator goes on (psd__coord_plan). */
enum psd_coord_start {
  PSD_COORD_AGREE = 0, /* every shard is at the step it opens */
  PSD_COORD_DIFFER,    /* shards differ and each of them just started (a
                          cluster restarted from different checkpoints):
                          stop, asking for --resume-step as before */
  PSD_COORD_ROLLBACK   /* another shard ran on without this coordinator
                          (shard 0 restarted alone): roll every shard back */
};

/* The decision of a sync coordinator starting at step `open` with the
 * nps shards' states s[0..nps) (s[0] is its own): other shards that ran
 * on (they committed steps since they started, or reached a step other
 * than 0 without resuming) mean shard 0 restarted while they served, and
 * the job rolls back to the lowest step of any shard, *step, held by
 * shard *culprit (0 when the coordinator's own), the highest being *from.
 * *gen is the highest generation any shard knows of in every case, so
 * that a rollback's generation (*gen + 1) is above all of them. Pure: the
 * caller asks the shards (tests/unit/test-coord.c checks it). */
enum psd_coord_start psd__coord_plan(const struct psd_coord_shard *s, int nps,
                                     uint64_t open, uint64_t *step,
                                     int *culprit, uint64_t *from,
                                     uint64_t *gen);

#endif
