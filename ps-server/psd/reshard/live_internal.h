/* live.c, live_plan.c and live_move.c's shared insides (live.h is their
 * API): the handler's state, the shards' status as ps:0 surveys it, the
 * plan directory's files and the live move's driver. */
#ifndef PSD_LIVE_INTERNAL_H
#define PSD_LIVE_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "live.h"
#include "peer.h"
#include "ps.pb-c.h"
#include "request.h"

#define LIVE_CALL_MS 3000    /* each check and prepare call's deadline */
#define LIVE_RETRY_MS 100    /* a starting shard's check asked again after */
#define LIVE_MARK_WAIT_S 120 /* ps:0 waits this long for the old shards */
#define LIVE_POLL_MS 50      /* how often a waiting shard looks */
#define LIVE_SAY_EVERY_S 10  /* a wait is said again this often */
#define INTERRUPTED                                                            \
  "interrupted: ps:0 restarted before the reshard finished; the job goes on "  \
  "in the layout its checkpoints hold"

struct psd_live {
  struct psd_server *srv;      /* borrowed */
  struct cm_request_host host; /* how Admin/Reshard checks its callers */
  struct cm_rpc_method method; /* Admin/Reshard */
  struct psd_peers *peers;     /* owned: ps:0's calls to the shards (fresh
                                  channels), made by the first reshard
                                  asked for; NULL before */
  uv_async_t wake;             /* stops srv's loop from a gRPC thread */
  int wake_ready;              /* wake is initialised (and must be closed) */
  pthread_mutex_t lock;        /* guards the fields below */
  int pending;                 /* 1: a reshard stops this shard */
  uint64_t target;             /* the layout version it makes */
  int to;                      /* its shard count */
  int from;                    /* the count before it */
  double since;                /* cm_mono_ms() when it was asked for */
  char plan[1200];             /* its plan directory */
  char note[600];              /* the last reshard's result, for Status */
  int clean; /* ps:0: the shards stop between two steps (async: always), so
                the workers stay joined across the re-execution */
  /* ps:0's live move (live_move.c), under lock like the above: */
  int moving;               /* its thread runs (batches, then the switch) */
  int move_cancel;          /* psctl reshard --cancel, or psd stopping:
                               stop after the batch under way */
  int move_said;            /* fig holds a move's figures (Status's move) */
  Psd__V1__MoveStatus fig;  /* those figures (no strings in it) */
  pthread_cond_t move_wake; /* wakes the thread's wait between batches */
  pthread_t move_thread;    /* the thread, joined by the next move or by
                               psd_live_stop_move */
  int move_joinable;        /* move_thread is to be joined */
  double move_since;        /* cm_mono_ms() when the move was asked for */
};

/* Claims the reshard handler for one request (a stop and cut's or a live
 * move's): 0 with l->pending set to -1 (checking), or -1 once the call is
 * answered FAILED_PRECONDITION because a reshard or a move is under way.
 * A move's thread that ended is joined. */
int psd__live_claim(struct psd_live *l, struct cm_rpc_call *call);

/* ps:0's channels to the shards (l->peers), made at the first request:
 * GRPC_STATUS_OK, or another status with msg saying why. */
grpc_status_code psd__live_peers(struct psd_live *l, char *msg, size_t len);

/* A shard's Status as ps:0's checks read it (psd__live_check). */
struct psd__live_view {
  uint64_t layout;    /* the layout version it holds */
  int nshards;        /* that layout's count */
  int standby;        /* it stands by outside it */
  int move_to, moved; /* the live move it has adopted (0, 0: none) */
  int owned;          /* buckets whose rows it holds */
  uint64_t row_bytes; /* its tables' rows as a move carries them: values,
                         state, ids and statistics */
  uint64_t rows;      /* its tables' rows */
};

/* Checks that shards 1..n-1 answer Status (each asked again for up to
 * LIVE_CALL_MS while it refuses the connection or holds another layout:
 * one starting again is waited for) and hold ps:0's layout; with loose, a
 * shard past ps:0's count that stands by may hold an older one. Fills
 * views[1..n-1] when views is not NULL. Returns 0 or a gRPC status with
 * msg saying which shard and why, ending "; nothing changed". */
grpc_status_code psd__live_check(struct psd_server *srv, int n, int loose,
                                 struct psd__live_view *views, char *msg,
                                 size_t len);

/* Reads a view from a Status answer r. */
void psd__live_view_of(const Psd__V1__StatusResponse *r,
                       struct psd__live_view *v);

/* ---- ps:0's live move (live_move.c) ---- */

/* Admin/Reshard with how RESHARD_MOVES (or _OR_STOP, the job able to
 * move), to m shards: the checks, the plan in words as the answer, the
 * batches and the switch on a thread of its own. Answers call. */
void psd__live_move_request(struct psd_live *l, struct cm_rpc_call *call,
                            const Psd__V1__ReshardRequest *req);

/* Admin/Reshard with cancel: the move under way stops after its batch
 * under way. Answers call. */
void psd__live_move_cancel(struct psd_live *l, struct cm_rpc_call *call);

/* Whether the job can move rows live (0), or CM_EINVAL with msg saying
 * why not: psd_service_movable's reasons, or no table declared. */
int psd__live_movable(struct psd_live *l, char *msg, size_t len);

/* The move state (moving to *to shards, *moved bucket moves made) that the
 * views of shards 0..n-1 hold, the largest `moved` of a move to one count;
 * *to 0 when none. Returns 0, or -1 when two shards hold moves to two
 * counts (msg says which). */
int psd__live_move_state(const struct psd__live_view *views, int n, int *to,
                         int *moved, char *msg, size_t len);

/* Fills ps:0's view (its own Status, run as a local call). Returns 0 or a
 * negative code. */
int psd__live_self_view(struct psd_live *l, struct psd__live_view *v);

/* <root>/.live-<job>-L<version> into buf. */
void psd__live_plan_dir(const char *root, const char *job, uint64_t v,
                        char *buf, size_t len);

/* Writes text (one line) to dir/name whole: a temporary file, fsync,
 * rename. Returns 0 or CM_EIO (errno kept). */
int psd__live_put(const char *dir, const char *name, const char *text);

/* Reads dir/name's line into buf (its newline dropped). Returns 0, or
 * CM_ENOENT when it is not there. */
int psd__live_get(const char *dir, const char *name, char *buf, size_t len);

int psd__live_is_dir(const char *path);

/* Removes a finished plan directory and its files (best effort). */
void psd__live_remove_plan(const char *dir);

#endif
