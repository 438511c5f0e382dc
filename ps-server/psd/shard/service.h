/* Room ps-server/psd/shard/, the training shard: the data and admin
 * services (service.h; one file per call, service_internal.h the room's
 * own), sync mode's staged gradients and commits (steps.h, sstage.h), a
 * Declare's staged initial values (vstage.h), when it checkpoints
 * (saver.h), same-host clients' shared-memory arenas (shm_arena.h) and
 * latency histograms (hist.h). Rooms it calls: store/, ckpt/, coord/,
 * publish/.
 *
 * psd's gRPC services: psd.v1.Data (Declare, Pull, Push, Commit) and
 * psd.v1.Admin (Status) over a store. Every request is checked field by field;
 * a bad one gets a gRPC status and a message naming the variable, shape or
 * field, and the shard goes on serving. */
#ifndef PSD_SERVICE_H
#define PSD_SERVICE_H

#include <stddef.h>
#include <stdint.h>

#include "ps.pb-c.h"
#include "rpc_server.h"
#include "store.h"

struct psd_service;

/* The service borrows store (which must outlive it). job is the job's name
 * that callers must name; mode "sync" stages pushes for steps (steps.h),
 * anything else applies them on arrival. Each variable's optimizer is the
 * store's (store.h). */
int psd_service_new(struct psd_service **out, struct psd_store *store,
                    int shard, int nshards, int nworkers, const char *job,
                    const char *mode);

/* Most segments in one pull or push, and most variables on one shard (and
 * in one Declare): far beyond any model's, low enough that no request can
 * make the shard work for long. */
#define PSD_MAX_SEGMENTS 65536
#define PSD_MAX_VARS 65536
/* Most pulls parked at once, waiting for a sync step to commit. */
#define PSD_MAX_PARKED 65536

/* What a shard does with a push whose gradient holds NaN or an infinity
 * (job.nonfinite); each is counted whatever the policy. */
enum psd_nonfinite {
  PSD_NONFINITE_REJECT = 0, /* INVALID_ARGUMENT, nothing of the push applied */
  PSD_NONFINITE_SKIP,       /* acknowledged, nothing of it applied */
  PSD_NONFINITE_APPLY,      /* applied as it is (a diverging job shows it) */
};

/* The policy named by the spec's job.nonfinite ("reject", "skip", "apply"),
 * and its name. */
enum psd_nonfinite psd_nonfinite_parse(const char *name);
const char *psd_nonfinite_name(enum psd_nonfinite n);

/* What a request may ask of a shard, beyond the checks every field gets. */
struct psd_limits {
  uint64_t max_message; /* bytes: the largest message (job.max_message_mb);
                           a pull whose answer would not fit is refused */
  enum psd_nonfinite nonfinite; /* job.nonfinite */
  uint64_t max_held; /* bytes of values and slots the shard may hold; a
                        Declare needing more is RESOURCE_EXHAUSTED; 0:
                        this machine's physical memory */
};

/* Sets the limits (copied; NULL: the defaults, 64 MiB, reject, memory). */
void psd_service_set_limits(struct psd_service *svc,
                            const struct psd_limits *l);

/* Checks every caller against self (request.h: the spec's fingerprint, the
 * boot id), which Declare and Status also report. self is borrowed and must
 * outlive svc, which writes its move state (move_to, moved: atomically)
 * when it adopts a live move's; NULL (the default): only the job is checked. */
struct cm_request_self;
void psd_service_set_self(struct psd_service *svc,
                          struct cm_request_self *self);

/* Sync, a live reshard's step boundary (live.h): from now on every pull of
 * version >= at stays parked until psd stops (then it is answered
 * UNAVAILABLE, and retried). */
void psd_service_hold(struct psd_service *svc, uint64_t at);

/* Status's `reshard` text comes from note(ctx, buf, len) (live.h); NULL:
 * none. */
void psd_service_set_reshard_note(struct psd_service *svc,
                                  void (*note)(void *ctx, char *buf,
                                               size_t len),
                                  void *ctx);

/* Status's `move` (ps:0's figures of a live move it drives, live.h) comes
 * from fill(ctx, out), which fills *out (its strings none) and returns 1,
 * or returns 0 when there is none to say; NULL: none. */
void psd_service_set_move_status(struct psd_service *svc,
                                 int (*fill)(void *ctx,
                                             Psd__V1__MoveStatus *out),
                                 void *ctx);

/* Serves the embedding tables ts (borrowed; must outlive svc): sparse
 * pulls and pushes, Declare's tables, Status, Rows, Shrink, Export. Without
 * it, those calls are answered NOT_FOUND / FAILED_PRECONDITION. */
struct psd_tables;
void psd_service_set_tables(struct psd_service *svc, struct psd_tables *ts);
struct psd_tables *psd_service_tables(struct psd_service *svc);

/* ---- A live move of buckets (docs/reshard.md "Live moves (the shard
 * side)"): the buckets this shard owns gate its sparse calls; the source
 * serves Admin/MoveRows (service_move.c); the destination's driver
 * (reshard/move.h) installs the rows through table.h and then calls
 * psd_service_own. ---- */

/* Whether this shard can take part in a live move: 0, or CM_EINVAL with
 * msg saying why not (a sync job; rows placed by the modulo rule; no
 * tables). */
int psd_service_movable(struct psd_service *svc, char *msg, size_t len);

/* The first bucket of set (PSD_MOVE_SET_BYTES bytes, bucket b at bit b % 8
 * of byte b / 8) this shard owns, or -1 when it owns none of them. */
#define PSD_MOVE_SET_BYTES 512
int psd_service_owns_any(struct psd_service *svc, const uint8_t *set);

/* The destination at the end of a move: owns the buckets of set from now
 * on, and adopts the move state (move_to shards after `moved` moves; a
 * smaller `moved` is kept as it is). */
void psd_service_own(struct psd_service *svc, const uint8_t *set, int move_to,
                     int moved);

/* The layout a publication is cut in (docs/serving.md "Following a
 * reshard"): holds the buckets this shard owns as they are (no hand-over
 * and no switch changes them) until psd_service_layout_release, and says
 * which they are: the layout's version and count, and the live move (to
 * *move_to shards after *moved moves; 0, 0: none). A destination owns its
 * buckets only once their rows are installed, and a source drops rows only
 * after it gave their buckets away, so a cut taken meanwhile holds the rows
 * of every bucket it names. */
void psd_service_layout_hold(struct psd_service *svc, uint64_t *layout,
                             int *shards, int *move_to, int *moved);
void psd_service_layout_release(struct psd_service *svc);

/* Marks that a move touches this shard: from now on an id of a bucket it
 * does not own is answered "layout moved". */
void psd_service_relocating(struct psd_service *svc);

/* ---- A live layout switch, the step that ends a live move
 * (reshard/switch.h drives it; docs/reshard.md "Live moves (the shard
 * side)"): the dense calls frozen, the variables replaced by their new
 * slices, the layout stepped. Async jobs only (a sync job never moves).
 * ---- */

/* Freezes (or, layout 0, thaws) the dense calls for the switch to layout
 * `layout` of `to` shards: from the return on, no dense call runs (those
 * in flight have answered) and new ones (Declare, Pull, Push) are answered
 * UNAVAILABLE "layout switching to layout V of M shards on ps:S; retried",
 * which clients retry; sparse calls flow; checkpoints and publications
 * wait (store.h). Status says "switching". */
void psd_service_freeze(struct psd_service *svc, uint64_t layout, int to);

/* The switch the store is frozen for: its layout (0: not frozen), and
 * *to its shard count. */
uint64_t psd_service_frozen(struct psd_service *svc, int *to);

/* Whether the buckets this shard owns are exactly its share of the map of
 * `to` shards (every move made): 0, or CM_EINVAL with msg saying what
 * differs. */
int psd_service_switchable(struct psd_service *svc, int to, char *msg,
                           size_t len);

/* COMMIT: with the store's gate held for writing, replaces the store's
 * variables with staged's (staged keeps the old ones: the caller frees
 * it), sets the layout `layout` of `to` shards (self's version and count,
 * the row map of `to`, the owned buckets its share, the move state none),
 * calls under(ctx) (the daemon's own records), and thaws. */
void psd_service_switch(struct psd_service *svc, struct psd_store *staged,
                        uint64_t layout, int to, void (*under)(void *ctx),
                        void *ctx);

/* Lets Status report the coordinator's view (shard 0). */
struct psd_coord;
void psd_service_set_coord(struct psd_service *svc, struct psd_coord *coord);

/* Lets pushes and commits tell the checkpoint saver (saver.h) about steps,
 * and Status report its last checkpoint. */
struct psd_saver;
void psd_service_set_saver(struct psd_service *svc, struct psd_saver *saver);

/* Lets a sync commit marked publish cut a publication (publish.h), and
 * Status report the last one. */
struct psd_publisher;
void psd_service_set_publisher(struct psd_service *svc,
                               struct psd_publisher *pub);

/* Lets Status report the calls the gRPC server refused for their token. */
struct cm_server;
void psd_service_set_server(struct psd_service *svc, struct cm_server *rpc);

/* The sync steps (owned by svc), NULL in async mode. */
struct psd_steps;
struct psd_steps *psd_service_steps(struct psd_service *svc);

/* The table of applied push messages (dedup.h; owned by svc): async
 * checkpoints save it with the values (saver.h). */
struct psd_dedup;
struct psd_dedup *psd_service_dedup(struct psd_service *svc);

/* Replaces that table with d, restored from a checkpoint (psd_ckpt_load):
 * svc takes d (it must not be NULL) and frees the table it had. Call
 * before serving. */
void psd_service_set_dedup(struct psd_service *svc, struct psd_dedup *d);

/* Answers every parked pull with UNAVAILABLE (psd is stopping). */
void psd_service_stop(struct psd_service *svc);
void psd_service_free(struct psd_service *svc);

/* The methods to serve, owned by svc. */
const struct cm_rpc_method *psd_service_methods(struct psd_service *svc,
                                                int *n);

/* Counters for the periodic log line and systemd's STATUS=. */
struct psd_counters {
  uint64_t pulls;     /* pull calls answered */
  uint64_t pushes;    /* push calls applied */
  uint64_t examples;  /* examples behind applied pushes */
  uint64_t bytes_in;  /* gradient payload bytes applied */
  uint64_t bytes_out; /* value payload bytes sent */
  uint64_t errors;    /* calls answered with an error */
  uint64_t nonfinite; /* pushes with NaN or Inf, whatever the policy */
  uint64_t step;      /* sync: steps committed; async: worker steps applied
                         here (one per worker step whatever the chunking) */
};
void psd_service_counters(struct psd_service *svc, struct psd_counters *c);

#endif
