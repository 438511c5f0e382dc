/* What the files of psd's data service share, and nothing else includes:
 * the service object and the functions one file calls in another. The
 * service is split by the call it answers:
 *   service.c          the object: new/free, the methods, setters, counters,
 *                      and the refuse hook that logs and counts refusals
 *   service_checks.c   the field checks every handler shares (names,
 *                      segments)
 *   service_declare.c  Data/Declare: variables created on this shard
 *   service_values.c   Declare's initial values: runs checked, gathered or
 *                      staged (vstage.h)
 *   service_pull.c     Data/Pull: a pull answered, or parked until its step
 *                      commits
 *   service_push.c     Data/Push and Data/SparsePush: the one push
 *                      pipeline, a gradient applied (async) or staged
 *                      (sync); its payload is a dense push's segments
 *                      (service_push_dense.c) or a sparse push's rows
 *                      (service_sparse.c)
 *   service_push_dense.c  the dense payload: segments of variables
 *                      (store.h), staged in sync mode (steps.h)
 *   service_commit.c   Data/Commit and Data/Rollback: the step the
 *                      coordinator closed (coord_barrier.c) is applied here
 *   service_status.c   Admin/Status: what the shard reports to psctl
 *   service_sparse.c   Data/SparsePull, and a SparsePush's payload: rows
 *                      of the embedding tables (tables.h), staged in sync
 *                      mode (sstage.h)
 *   service_tables.c   the tables' part of Declare and Status, and
 *                      Admin/Rows, Admin/Shrink, Admin/Export
 * The public interface is service.h. Each handler checks the whole request
 * before changing anything, so a rejected push applies nothing. Bulk bytes
 * are read in place from the received slices (wire.h): one copy into a
 * scratch buffer on push, one copy out of the variable on pull. */
#ifndef PSD_SERVICE_INTERNAL_H
#define PSD_SERVICE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <time.h>

#include "hist.h"
#include "layout.h"
#include "ps.pb-c.h"
#include "request.h"
#include "rpc_server.h"
#include "service.h"
#include "sstage.h"
#include "steps.h"
#include "store.h"
#include "tables.h"
#include "vstage.h"

/* Methods psd serves (service.c). */
#define PSD__NMETHODS 12

/* Bytes of a set of buckets (MoveRowsRequest.buckets: bucket b at bit
 * b % 8 of byte b / 8), and 64-bit words of the owned set. */
#define PSD__BUCKET_BYTES ((int)CM_LAYOUT_BUCKETS / 8)
#define PSD__BUCKET_WORDS ((int)CM_LAYOUT_BUCKETS / 64)

/* Errors logged in full before the log only samples them. */
#define PSD__LOGGED_ERRORS 50

struct psd__parked_pull; /* service_pull.c */

struct psd_service {
  struct psd_store *store;     /* borrowed */
  int shard;                   /* this shard's index */
  int nshards;                 /* shards in the job */
  struct cm_layout_map map;    /* the layout's row map: which rows are this
                                  shard's (the self's rule, else a fresh
                                  job's buckets) */
  int nworkers;                /* workers in the job: valid indices */
  struct psd_limits limits;    /* what requests may ask (service.h) */
  int held_is_memory;          /* limits.max_held is the machine's RAM */
  char job[64];                /* job name callers must use */
  struct cm_request_host host; /* how requests are taken and refused */
  char mode[16];               /* "async" */
  struct timespec started;     /* for uptime */
  struct cm_rpc_method methods[PSD__NMETHODS]; /* what psd serves */
  struct psd_steps *steps;                     /* owned, sync mode */
  struct psd_coord *coord;         /* borrowed, shard 0 only (status) */
  struct cm_server *rpc;           /* borrowed: its refusal count (status) */
  struct psd_saver *saver;         /* borrowed: step counts, commit gate */
  struct psd_publisher *publisher; /* borrowed, NULL when not publishing */
  void (*reshard_note)(void *ctx, char *buf, size_t len); /* Status's
                                    reshard text (live.h), or NULL */
  void *reshard_ctx; /* passed to reshard_note */
  int (*move_status)(void *ctx, Psd__V1__MoveStatus *out); /* Status's
                                    move (live.h), or NULL */
  void *move_status_ctx;           /* passed to move_status */
  uint64_t hold_at;                /* sync, a reshard's step boundary: pulls
                                      of version >= hold_at stay parked
                                      (0: none); under park_lock */
  pthread_mutex_t park_lock;       /* guards parked, nparked and stopped */
  int stopped;                     /* psd_service_stop: no pull parks now */
  struct psd__parked_pull *parked; /* pulls waiting for a version */
  int nparked;                     /* entries in parked */
  atomic_uint_fast64_t pulls;      /* pull calls answered */
  atomic_uint_fast64_t pushes;     /* push calls applied */
  atomic_uint_fast64_t examples;   /* examples behind applied pushes */
  atomic_uint_fast64_t bytes_in;   /* gradient bytes applied */
  atomic_uint_fast64_t bytes_out;  /* value bytes sent */
  atomic_uint_fast64_t errors;     /* calls answered with an error */
  atomic_uint_fast64_t updates;    /* async: worker steps applied (pushes
                                      carrying a batch's examples) */
  atomic_uint_fast64_t nonfinite;  /* pushes with NaN or Inf, whatever
                                      job.nonfinite did with them */
  struct psd_hist push_time;       /* push handling, decode to reply */
  struct psd_hist pull_time;       /* pull handling, a parked wait excluded */
  struct psd_dedup *dedup;         /* owned: push messages applied, per
                                      client (retries are not applied twice) */
  struct psd_tables *tables;       /* borrowed: the embedding tables; NULL
                                      until psd_service_set_tables */
  struct psd_sstage *sstage;       /* owned, sync mode: staged sparse rows */
  /* Sync: sparse pulls hold it shared while they read rows and the
   * version; a commit holds it exclusively while it applies a step, dense
   * and sparse, so a pull never sees half a step. */
  pthread_rwlock_t tables_gate;
  atomic_uint_fast64_t sparse_pulls;  /* SparsePull calls answered */
  atomic_uint_fast64_t sparse_pushes; /* SparsePush calls applied or staged */
  struct psd_vstage *vstage; /* owned: initial values staged by Declare */
  /* The buckets whose table rows this shard holds (rows by buckets; a
   * live move's gate, service_move.c). */
  int gate; /* 1: the bucket rule: owned decides which ids are here; 0:
               the modulo rule, the map alone (no live moves) */
  uint64_t owned[PSD__BUCKET_WORDS]; /* bucket b at bit b % 64 of word
                                        b / 64; read with __atomic loads,
                                        written under owned_gate */
  /* Async sparse calls read-hold it from their gate check to their rows'
   * apply (a pull creates rows too); a hand-over write-holds it only to
   * flip owned, so no call that passed the check lands after it. */
  pthread_rwlock_t owned_gate;
  atomic_uint owned_epoch; /* grows at every change of owned: a call whose
                              check saw another epoch checks again */
  atomic_int relocating;   /* a live move has touched this shard: an id of a
                              bucket not here is answered "layout moved", not
                              refused as misplaced */
  struct cm_request_self *self_rw; /* host.self, writable: the move state
                                      adopted at a hand-over; or NULL */
  /* The live move this shard is the source of (service_move.c). */
  pthread_mutex_t move_lock;           /* guards the fields below */
  pthread_cond_t move_idle;            /* move_threads fell to 0 */
  uint64_t move_id;                    /* the move under way (0: none) */
  uint8_t move_set[PSD__BUCKET_BYTES]; /* its buckets */
  int move_busy;                       /* one of its MoveRows calls runs */
  int move_handed;                     /* its hand-over is made: the set is
                                          not owned, its rows wait for
                                          MOVE_DONE or MOVE_CANCEL */
  uint32_t move_dest;                  /* its destination's index + 1 (0:
                                          not said) */
  int move_after_to, move_after_moved; /* the move state after it (its
                                          requests' move_to, moved) */
  uint64_t move_last;                  /* the last move MOVE_DONE ended */
  int move_threads;                    /* MoveRows threads not yet done */
  atomic_uint_fast64_t move_bytes;     /* row bytes MoveRows sent */
  /* A live layout switch (service_switch.c): while the store is frozen
   * (store.h's switch gate), the switch it is frozen for. */
  _Atomic uint64_t switch_layout; /* the layout it makes (0: none) */
  atomic_int switch_to;           /* of this many shards */
};

/* Refuses a call with a formatted message, logged and counted (through the
 * host's refuse hook, service.c). */
#define psd__fail(svc, call, code, ...)                                        \
  cm_request_refuse(&(svc)->host, call, code, __VA_ARGS__)

/* ---- service_checks.c: every check answers the call when it fails ---- */

/* Checks a variable name sent in a request: 1..PSD_VAR_MAX_NAME bytes, no
 * control characters (names end up in logs, tables and checkpoint files).
 * `what` is the call ("Declare", "push"; "Declare table" for a table's
 * name), i the name's position in it.
 * Returns 0 or answers the call and returns -1. */
int psd__check_name(struct psd_service *svc, struct cm_rpc_call *call,
                    const char *name, const char *what, size_t i);

/* The bytes per element of a pull's or push's data for its dtype (4 for
 * F32, 2 for BF16), or 0 once the call is answered INVALID_ARGUMENT for a
 * dtype that is none of them. what: "pull" or "push". */
size_t psd__wire_esize(struct psd_service *svc, struct cm_rpc_call *call,
                       Psd__V1__WireDtype dtype, const char *what);

/* Checks the number of segments of a pull or push; returns 0 or answers the
 * call and returns -1. */
int psd__check_segment_count(struct psd_service *svc, struct cm_rpc_call *call,
                             size_t n, const char *what);

/* Finds a segment's variable and checks its element range against this
 * shard's rows. Returns the variable (the store's) or answers the call and
 * returns NULL. */
struct psd_var *psd__segment_var(struct psd_service *svc,
                                 struct cm_rpc_call *call,
                                 const Psd__V1__Segment *seg, size_t i,
                                 const char *what);

/* Refuses a push whose segments overlap (the same elements twice in one
 * gradient: applied twice, or one silently winning); vars[i] is segment i's
 * variable. Returns 0 or answers the call and returns -1. */
int psd__check_overlap(struct psd_service *svc, struct cm_rpc_call *call,
                       const Psd__V1__PushRequest *req,
                       struct psd_var *const *vars);

/* ---- service_values.c: Declare's initial values ---- */

/* A Declare's value runs, checked by psd__values_check. */
struct psd__runs {
  size_t *order;        /* owned: the runs' positions by name, then offset */
  size_t n;             /* runs */
  size_t *vorder;       /* owned: the VarSpecs' positions by name */
  uint64_t stage_bytes; /* bytes the stages this request starts will take */
};

/* Checks req's value runs against its VarSpecs (sources checked before)
 * and this shard's rows, and, without a stage, that those of each
 * variable it creates cover its rows here. Returns 0 (r to be freed with
 * psd__values_free) or answers the call and returns -1. */
int psd__values_check(struct psd_service *svc, struct cm_rpc_call *call,
                      const Psd__V1__DeclareRequest *req, struct psd__runs *r);

/* The values of vs (SOURCE_VALUES, not held here yet, rows here) to create
 * it from: *values points to this shard's rows of it, gathered into *buf
 * (the caller frees it), or into its stage, where they stay until the
 * caller drops the stage; NULL while the stage is incomplete. Returns 0, or
 * answers the call and returns -1. */
int psd__values_for(struct psd_service *svc, struct cm_rpc_call *call,
                    const Psd__V1__DeclareRequest *req,
                    const struct psd__runs *r, const Psd__V1__VarSpec *vs,
                    float **buf, const float **values);
void psd__values_free(struct psd__runs *r);

/* This shard's elements [*begin, *end) of the variable vs declares. */
void psd__values_rows(const struct psd_service *svc, const Psd__V1__VarSpec *vs,
                      uint64_t *begin, uint64_t *end);

/* ---- service_push.c: one push, dense or sparse, through six steps ---- */

struct psd__push;

/* What a push's payload does at the pipeline's steps (service_push.c says
 * them): a dense push's segments of variables (psd__push_dense,
 * service_push_dense.c) or a sparse push's rows of a table
 * (psd__push_sparse, service_sparse.c). Each function that answers the
 * call says so; one that refuses a claimed push gives the claim back
 * (psd__push_give_back). */
struct psd__push_payload {
  const char *call; /* the call, as messages name it: "Push", "SparsePush" */
  const char *gen_what; /* a push of a newer generation, as its refusal
                           names it: "push", "SparsePush" */
  const char *reject;   /* job.nonfinite "reject": the refusal, a format
                           taking the element's description */
  /* Step 2: checks the payload against this shard's variables or table and
   * the data field, and sets total and wire. Returns 0 to go on, 1 for a
   * push of nothing (answered with the current versions, changing
   * nothing), -1 once the call is answered. */
  int (*check)(struct psd__push *p);
  /* Step 4: describes the gradient's element bad, NaN or an infinity
   * ("push to 'w': gradient element 3 (segment 0) is NaN"). */
  void (*describe)(const struct psd__push *p, size_t bad, char *what,
                   size_t len);
  /* Step 5: applies (async) or stages (sync) the gradient, nothing when
   * skip is set, and records the versions the answer carries. Returns 0,
   * or -1 once the call is answered. */
  int (*apply)(struct psd__push *p);
  /* Records the current versions without changing anything (a push of
   * nothing, a retry of an applied message). */
  void (*current)(struct psd__push *p);
  /* Answers the call with the versions recorded, or, when p->rolled is
   * set, that the job rolled back. */
  void (*answer)(struct psd__push *p);
};

extern const struct psd__push_payload psd__push_dense;  /* Data/Push */
extern const struct psd__push_payload psd__push_sparse; /* Data/SparsePush */

/* One push in progress, dense or sparse: what its steps share. */
struct psd__push {
  struct psd_service *svc;                /* the service (ctx) */
  struct cm_rpc_call *call;               /* answered once, by the step that
                                             stops */
  const struct psd__push_payload *kind;   /* its payload's steps */
  ProtobufCMessage *msg;                  /* owned: the unpacked request */
  const Psd__V1__PushRequest *dense;      /* msg of a dense push, or NULL */
  const Psd__V1__SparsePushRequest *rows; /* msg of a sparse one, or NULL */
  struct cm_wire_msg m; /* the message; its bulk field is the gradient */
  /* What both requests carry, named alike (ps.proto). */
  int32_t worker;     /* the pushing worker's index */
  int has_worker;     /* async: worker is set */
  uint64_t step, gen; /* sync: the step and the rollbacks the worker knows */
  uint64_t client_id; /* idempotent pushes: the client (0: none), */
  uint64_t seq;       /* its logical push */
  uint32_t chunk;     /* and this message of it */
  uint32_t examples;  /* examples behind this gradient */
  int first;          /* dense: the first message of one push to this shard */
  /* A dense push's segments. */
  struct psd_var **vars; /* owned: segment i's variable (the store's) */
  uint64_t *versions;    /* owned: segment i's version, for the answer */
  /* A sparse push's rows. */
  struct psd_table *table; /* borrowed: tables live as long as psd */
  uint64_t *ids;           /* owned: the rows' ids, nids of them */
  size_t nids;             /* ids pushed */
  uint64_t version;        /* the table's version, for the answer */
  /* Both. */
  uint64_t total; /* gradient bytes the payload describes, f32 */
  uint64_t wire;  /* bytes the data field holds: total, or half of it when
                     the push is bf16 */
  int bf16;       /* the data field holds bfloat16s (a dense push's dtype) */
  float *grad;    /* owned copy of the gradient */
  int from_shm;   /* grad was copied out of a shared-memory arena, scanned
                     in the same pass (service_push_dense.c) */
  size_t shm_bad; /* from_shm: grad's first NaN or infinity (n: none) */
  double start;   /* cm_mono_ms() when handling began */
  int skip;       /* NaN or Inf under job.nonfinite "skip": acknowledged */
  int claimed;    /* this message's dedup claim is ours to give back */
  int gated;      /* async: we hold the dedup table's apply gate */
  unsigned epoch; /* sparse: svc->owned_epoch when its ids were checked */
  /* Sync: the steps' state when the push's generation is one the job has
   * rolled back from (nothing was staged; the answer says so), else NULL. */
  const struct psd_steps_state *rolled;
};

/* Gives back this message's dedup claim when the push is refused after it:
 * not applied, so neither a retry nor a checkpoint may take it for applied
 * (a retry is judged again). */
void psd__push_give_back(struct psd__push *p);

/* Sync: answers a push of a generation the job has rolled back from (st:
 * the steps' state now): nothing was staged. */
void psd__push_answer_rolled_back(struct psd__push *p,
                                  const struct psd_steps_state *st);

/* Sync: refuses a push whose gradient could not be staged (rc, the stage's
 * code; msg, its words), dense or sparse alike: that the job rolled back,
 * when a rollback came in since the generation's check; else ABORTED for a
 * step already closed (CM_ERANGE), RESOURCE_EXHAUSTED for CM_ENOMEM, and for
 * a step not open here UNAVAILABLE when this shard resumed from a checkpoint
 * (retried until the coordinator rolls back), else FAILED_PRECONDITION. Gives
 * the push's claim back. Returns -1: the call is answered. */
int psd__push_refuse_stage(struct psd__push *p, int rc, const char *msg);

/* ---- the handlers (cm_rpc_handler; ctx is the service) ---- */

void psd__on_declare(struct cm_rpc_call *call, grpc_byte_buffer *bb,
                     void *ctx); /* service_declare.c */
void psd__on_pull(struct cm_rpc_call *call, grpc_byte_buffer *bb,
                  void *ctx); /* service_pull.c */
void psd__on_push(struct cm_rpc_call *call, grpc_byte_buffer *bb,
                  void *ctx); /* service_push.c */
void psd__on_sparse_push(struct cm_rpc_call *call, grpc_byte_buffer *bb,
                         void *ctx); /* service_push.c */
void psd__on_commit(struct cm_rpc_call *call, grpc_byte_buffer *bb,
                    void *ctx); /* service_commit.c */
void psd__on_rollback(struct cm_rpc_call *call, grpc_byte_buffer *bb,
                      void *ctx); /* service_commit.c */
void psd__on_status(struct cm_rpc_call *call, grpc_byte_buffer *bb,
                    void *ctx); /* service_status.c */
void psd__on_move_rows(struct cm_rpc_call *call, grpc_byte_buffer *bb,
                       void *ctx); /* service_move.c */

/* ---- service_switch.c: a live layout switch's gate over the calls ---- */

/* The handlers as served: each holds the store's switch gate (store.h)
 * for reading around the call (from its layout check to its answer), so
 * that a COMMIT never lands inside one; the dense calls (Declare, Pull,
 * Push) are answered UNAVAILABLE while the store is frozen. */
void psd__gated_declare(struct cm_rpc_call *call, grpc_byte_buffer *bb,
                        void *ctx);
void psd__gated_pull(struct cm_rpc_call *call, grpc_byte_buffer *bb, void *ctx);
void psd__gated_push(struct cm_rpc_call *call, grpc_byte_buffer *bb, void *ctx);
void psd__gated_sparse_pull(struct cm_rpc_call *call, grpc_byte_buffer *bb,
                            void *ctx);
void psd__gated_sparse_push(struct cm_rpc_call *call, grpc_byte_buffer *bb,
                            void *ctx);
void psd__gated_status(struct cm_rpc_call *call, grpc_byte_buffer *bb,
                       void *ctx);

/* ---- service_move.c: the buckets this shard owns ---- */

/* Sets owned from the map (every bucket it gives this shard; the gate is
 * off for the modulo rule). */
void psd__owned_init(struct psd_service *svc);
/* The owned set of the live move from nshards to `to` shards after `moved`
 * moves (cm_layout_map_moving), at start. */
void psd__owned_moving(struct psd_service *svc, int to, int moved);

/* Buckets owned now. */
int psd__owned_count(struct psd_service *svc);

/* Refuses a sparse call naming id of table, whose bucket this shard does
 * not own (now): FAILED_PRECONDITION "layout moved: ps:S holds layout V of
 * N shards, rows by buckets[, moving to M shards after K moves]; bucket B
 * (table 'T' row ID) is no longer here; the client re-plans and calls
 * again" (the client parses these words). */
void psd__refuse_moved(struct psd_service *svc, struct cm_rpc_call *call,
                       const char *table, uint64_t id);

/* Waits until no MoveRows thread runs (psd stops, or frees the service). */
void psd__move_wait(struct psd_service *svc);

/* ---- service_sparse.c ---- */

/* Whether this shard holds id's bucket (svc->gate set). */
static inline int psd__owns(struct psd_service *svc, uint64_t id) {
  unsigned b = cm_layout_bucket(cm_layout_id_hash(id));
  return (int)(__atomic_load_n(&svc->owned[b >> 6], __ATOMIC_RELAXED) >>
                   (b & 63) &
               1);
}

void psd__on_sparse_pull(struct cm_rpc_call *call, grpc_byte_buffer *bb,
                         void *ctx);

/* A sparse pull waiting for its version (parked, service_pull.c). */
struct psd__sparse_pull;

/* Answers a parked sparse pull whose version now exists. */
void psd__sparse_answer(struct psd_service *svc, struct cm_rpc_call *call,
                        struct psd__sparse_pull *sp, double start);
/* Answers a sparse pull of a generation the job rolled back from. */
void psd__sparse_answer_rolled_back(struct psd_service *svc,
                                    struct cm_rpc_call *call);
void psd__sparse_pull_free(struct psd__sparse_pull *sp);

/* Sync: applies step's staged sparse rows of applied[0..napplied) (the
 * commit holds tables_gate exclusively). Returns 0 or a CM_E code. */
int psd__sparse_commit(struct psd_service *svc, uint64_t step,
                       const int *applied, int napplied);

/* ---- service_tables.c ---- */

void psd__on_rows(struct cm_rpc_call *call, grpc_byte_buffer *bb, void *ctx);
void psd__on_shrink(struct cm_rpc_call *call, grpc_byte_buffer *bb, void *ctx);
void psd__on_export(struct cm_rpc_call *call, grpc_byte_buffer *bb, void *ctx);

/* Declare's tables: checks them all, then creates or checks each. Returns
 * 0 or answers the call and returns -1. */
int psd__declare_tables(struct psd_service *svc, struct cm_rpc_call *call,
                        const Psd__V1__DeclareRequest *req);

/* Status's tables: fills resp->tables (owned by *mem, freed by
 * psd__status_tables_free). Returns 0 or CM_ENOMEM. */
int psd__status_tables(struct psd_service *svc, Psd__V1__StatusResponse *resp,
                       void **mem);
void psd__status_tables_free(void *mem);

/* The shard's step, the clock of a table row's last touch and of
 * eviction: sync, the steps committed; async, the pushes applied as the
 * checkpoint saver counts them (saver.h), so that the step a checkpoint
 * evicts at is on the same clock. */
uint64_t psd__shard_step(struct psd_service *svc);

/* The table a call names, or NULL once the call is answered NOT_FOUND
 * naming it. */
struct psd_table *psd__find_table(struct psd_service *svc,
                                  struct cm_rpc_call *call, const char *name,
                                  const char *what);

/* ---- service_pull.c ---- */

/* Sync: parks a pull (dense req, or sparse sp) that waits for min_version
 * in generation gen. Returns 1 when it can be answered now (the caller
 * still owns req/sp), 0 when parked (the park list owns them now), -1 when
 * the call was answered (an error, or rolled back; the caller owns them). */
int psd__park(struct psd_service *svc, struct cm_rpc_call *call,
              uint64_t min_version, uint64_t gen, Psd__V1__PullRequest *req,
              struct psd__sparse_pull *sp);

/* Answers the parked pulls whose version now exists (after a commit or a
 * rollback), or all of them, with UNAVAILABLE, when stopping (psd stops). */
void psd__pull_release_parked(struct psd_service *svc, int stopping);

#endif
