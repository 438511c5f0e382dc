/* libpsclient's insides, shared by its files and by nothing else (their API is
 * psclient.h): struct psc__client, the plan of its traffic, and the psc__
 * helpers one file lends another.
 *
 *   client.c     the client object: channels (and the move to a shard's Unix
 *                socket, and back to TCP), the plan, accessors
 *   declare.c    psc__client_declare: the variables checked, declared, then
 *                the plan and the Unix sockets
 *   declare_rounds.c  the variables' Declare in two rounds, with their
 *                values
 *   declare_calls.c   Declare calls, waiting for the shards to start
 *   transfer.c   pull and push with retries
 *   retry.c      which failures are retried, outages, the backoff, and the
 *                lines that say what a wait is waiting for
 *   read.c       psc__client_read: an admin tool's chunked reads
 *   coord.c      the coordinator's calls and the heartbeat thread
 *   status.c     Admin/Status as JSON
 *   admin.c      Admin/Checkpoint, and the last call's status for a tool
 *   sparse.c     embedding tables: their declare, sparse pulls and pushes
 *   shm_client.c same-host shared-memory arenas for pulls and pushes
 *   relayout.c   the job's shard layout moved: the "moved" answer read,
 *                placements and the plan redone, what was not acknowledged
 *                re-cut for the new shards
 *
 * Each file's own block says how its part works: client.c the plan of
 * the traffic, transfer.c and retry.c the retries. */
#ifndef PSC__CLIENT_INTERNAL_H
#define PSC__CLIENT_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include "auth.h"
#include "layout.h"
#include "ps.pb-c.h"
#include "psclient.h"
#include "rpc.h"
#include "rpc_client.h"

/* A run of one variable's elements inside one message. */
struct psc__piece {
  int var;         /* index into vars */
  uint64_t offset; /* first element, global numbering */
  uint64_t count;  /* elements */
};

/* What the client knows of one shard's reachability (retry.c). */
struct psc__outage {
  double since;            /* cm_mono_ms() when it became unreachable, 0
                              while it answers */
  double said;             /* cm_mono_ms() when the wait was last said, 0:
                              not yet */
  grpc_status_code status; /* its last failure's status */
  char details[512];       /* that failure's message from gRPC */
  char cause[512];         /* that failure in words (psc__reach_cause) */
};

/* One planned message to one shard. */
struct psc__msg {
  int shard;      /* destination */
  int first;      /* index of its first piece */
  int npieces;    /* pieces in it */
  uint64_t bytes; /* payload bytes */
  int lead;       /* 1: the first message to its shard (carries examples) */
  uint32_t chunk; /* its index among the messages to its shard (dedup) */
  /* Of the current transfer (psc__client_select): */
  uint64_t sel_bytes;  /* pull: payload bytes of its selected pieces (0:
                          none pulled) */
  uint64_t push_bytes; /* push: the same for the pieces pushed */
  int sel_lead;        /* 1: the first message pushed to its shard */
  uint64_t shm_at;     /* its place in its shard's arena parts
                          (shm_client.h) */
  unsigned char kinds; /* what it may carry: PSC__KIND_PUSH | PSC__KIND_PULL
                          (a planned message both; a re-cut one, relayout.c,
                          the one its pieces wait for) */
};

/* psc__msg.kinds. */
#define PSC__KIND_PUSH 1
#define PSC__KIND_PULL 2

/* A plan's arrays (client.c, psc__plan), as a transfer re-cut after a
 * layout moved puts them aside while it sends what is left (relayout.c). */
struct psc__plan_save {
  struct psc__piece *pieces; /* owned: c->pieces */
  int npieces;               /* entries in pieces */
  struct psc__msg *msgs;     /* owned: c->msgs */
  int nmsgs;                 /* entries in msgs */
  struct cm_unary *calls;    /* owned: c->calls */
  int *call_pair;            /* owned: c->call_pair */
  unsigned char *pending;    /* owned: c->pending */
  int held;                  /* 1: the arrays are here, not in the client */
};

struct psc__client {
  const struct cm_spec *spec; /* borrowed */
  struct psc__client_opts o;  /* settings with defaults filled in */
  char worker[64];            /* caller identity */
  uint64_t spec_fp;           /* cm_spec_fingerprint(spec), sent with every
                                 call */
  uint64_t *boot;             /* owned, per shard: its process's boot id from
                                 Declare (0 until then), sent with every call
                                 to it */
  struct cm_channel **ch;     /* owned, one per address of the pool
                                 (spec->nps), like every per-shard array */
  unsigned char *on_unix;     /* owned: 1 where ch[s] is a Unix socket */
  struct cm_creds creds;      /* owned: token and TLS from the spec's auth */
  int nshards;                /* shards of the layout planned for (1..nps):
                                 job.shards at open, then what a "moved"
                                 answer said (relayout.c) */
  uint64_t layout;            /* the layout's version planned for (0 at
                                 open), sent with every call */
  int move_to;                /* a live move of table rows in that
                                 layout: the count it goes to (0: none);
                                 variables stay placed among nshards */
  int moves;                  /* its bucket moves made (cm_layout_moves) */
  struct cm_layout_map map;   /* that layout's row map: where each table
                                 row lives (a fresh job's buckets at open,
                                 then what a "moved" answer said; during a
                                 move cm_layout_map_moving's, of
                                 max(nshards, move_to) shards); its rule
                                 is sent with every call */
  double moved_wait_ms;       /* how long one call sends again a bucket
                                 refused by "moved" answers that name no
                                 newer layout (relayout.c); 30 s, a test's
                                 less */
  char moved[512];            /* the last "layout moved" answer's message
                                 (declare_calls.c), "" when none */
  struct psc__plan_save full; /* while a transfer sends a re-cut remainder:
                                 the full plan, put back at its end */
  uint32_t chunk_next;        /* the next dedup chunk index for a re-cut
                                 push message (past every planned one) */
  struct psc__var *vars;      /* owned copies of the declared variables, in
                               declaration order (names in var_names) */
  char **var_names;           /* owned: each variable's name (vars[i].name) */
  int nvars;                  /* entries in vars */
  int cap_vars;               /* entries allocated in vars and var_names */
  unsigned char *sel;         /* owned, per variable: 1 when the next
                                 transfers move it; NULL: every variable */
  int nsel;                   /* variables with sel set (all when !sel) */
  unsigned char *sel_push;    /* owned, per variable: 1 when the next
                                 transfers push it; NULL: as sel says */
  int (*interrupt)(void *);   /* psc__client_set_interrupt's poll, or NULL */
  void *interrupt_arg;        /* passed to interrupt */
  int interrupted;            /* interrupt said so during the current call */
  struct psc__piece *pieces;  /* owned plan: all pieces, grouped by msg */
  int npieces;                /* entries in pieces */
  struct psc__msg *msgs;      /* owned plan: the messages */
  int nmsgs;                  /* entries in msgs */
  struct cm_unary *calls; /* owned, 2 * nmsgs call slots reused per transfer */
  uint32_t examples;      /* examples reported with each push */
  int windex;             /* worker index after join, else -1 */
  uint64_t min_version;   /* pull: version to wait for (0: none) */
  uint64_t pulled_step;   /* pull: lowest step among the answers */
  int sync_push;          /* push: stage for push_step */
  uint64_t push_step;     /* push: the step staged for */
  int closed;             /* push: a shard said the step is closed */
  pthread_t hb_thread;    /* heartbeat thread, after join */
  int hb_running;         /* hb_thread must be joined */
  int hb_stop;            /* asks hb_thread to stop (under lock) */
  int hb_ms;              /* heartbeat period */
  uint64_t win_n;         /* on a stream: windows scored (under lock; sent
                             with each heartbeat) */
  double win_auc, win_ll; /* the last one's AUC and log loss (under lock) */
  double hb_heard;        /* cm_mono_ms when the last Admit answered was sent
                             (under lock): the coordinator heard from this
                             worker then, so no heartbeat is due until hb_ms
                             after it (coord.c) */
  grpc_completion_queue *cq; /* reused by every call from the client's thread */
  uint64_t pulled, pushed;   /* payload bytes moved */
  pthread_mutex_t lock;      /* guards refs, hb_stop and left */
  pthread_cond_t cond;       /* signalled when refs drops to 0 */
  int refs;                  /* gradient slices gRPC still holds */
  char err[1024];            /* last error */
  grpc_status_code last_status; /* psc__client_last_status: of the last run */
  char last_details[512];       /* its status message */

  /* Faults: retries and idempotent pushes. */
  int *call_pair;          /* owned, 2 * nmsgs: the pair each call carries,
                              2 * message + (0 push, 1 pull) */
  unsigned char *pending;  /* owned, 2 * nmsgs: 1 while a pair awaits an OK */
  uint64_t client_id;      /* random, nonzero: names this client's pushes */
  uint64_t seq;            /* logical pushes so far; the current one's number */
  double retry_ms;         /* retry budget per outage, ms; <= 0: no retries */
  struct psc__outage *out; /* owned, per shard: its outage, if any */
  int starting;            /* 1 while declare waits for the shards to come up
                              (budget connect_timeout_ms, not retry_ms) */
  double wait_from;        /* starting: cm_mono_ms() when declare began */
  int call_timeout_ms;     /* the deadline of psc__run's calls under way */
  uint64_t rng;            /* jitter generator state */
  struct psc__client_stats stats; /* calls, failures, retries, outages */
  int left; /* psc__client_leave was called: no rejoining (under lock) */

  /* Sync rollbacks (the coordinator's generation). */
  uint64_t gen;           /* rollbacks this client knows of, sent with every
                             sync pull, push and Admit */
  int rolled_back;        /* an answer said the job rolled back (cleared by
                             psc__client_rolled_back) */
  uint64_t rollback_step; /* the step it rolled back to */
  int rejoined;           /* sync: an Admit said the coordinator restarted
                             and this client joined it again (cleared by
                             psc__client_rejoined) */
  uint64_t rejoin_step;   /* the step that Join answered */

  /* job.wire_dtype "bf16": tensors travel as bfloat16 (common/base/bf16.h). */
  int wire_bf16;       /* 1: pulls and pushes ask for and send bf16 */
  uint16_t *grad16;    /* owned: every variable's gradient rounded to bf16,
                          back to back (made by the first push), which the
                          push messages point into */
  uint64_t *grad16_at; /* owned, per variable: its first element in grad16 */

  /* Same-host shared memory (shm_client.h). */
  struct psc__shm *shm; /* owned, per shard, made by the first transfer;
                           NULL until then */

  /* Embedding tables (sparse.c). */
  struct psc__table_state *tables; /* owned, declared tables */
  int ntables;                     /* entries in tables */
  uint64_t sparse_seq;             /* sparse pushes so far (their dedup seq) */
};

/* A declared table, as the client knows it. */
struct psc__table_state {
  char name[201];    /* its name */
  uint32_t dim;      /* floats per row */
  uint64_t id_bound; /* 0: any id */
};

/* ---- client.c */

/* Sets c->err, the text psc__client_error returns. */
void psc__seterr(struct psc__client *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* 0 when c has joined the job's steps; else CM_EINVAL with an error saying
 * that what ("push", "push rows") for step needs a join first. */
int psc__need_joined(struct psc__client *c, const char *what, uint64_t step);

/* The identity every request carries: the job, this worker, the spec's
 * fingerprint and counts, and, for a call to shard `shard` (-1: none in
 * particular), the boot id that shard's Declare answered. Points into c, so
 * it lives as long as the client. */
Psd__V1__Caller psc__caller(const struct psc__client *c, int shard);

/* Describes call u's failure into c->err, with its cause in words when it
 * is about reaching the shard (psc__reach_cause). */
void psc__call_error(struct psc__client *c, const char *what,
                     const struct cm_unary *u);

/* Runs calls[0..n) (borrowed) on c's queue, up to `inflight` at once;
 * done(u, ctx) sees each answer. On failure names the first failed call in
 * c->err. Returns cm_client_run's code. */
int psc__run(struct psc__client *c, struct cm_unary *calls, int n,
             const char *what, int timeout_ms, int wait_for_ready,
             cm_unary_done done, void *ctx);

/* Cuts every declared variable's slice on every shard into messages
 * (c->pieces, c->msgs) and allocates the call slots a transfer reuses;
 * an earlier plan is dropped first. */
int psc__plan(struct psc__client *c);

/* Whether the current transfer moves variable i (psc__client_select). */
static inline int psc__selected(const struct psc__client *c, int i) {
  return !c->sel || c->sel[i];
}

/* Whether the current transfer pushes variable i (psc__client_select_push). */
static inline int psc__pushed(const struct psc__client *c, int i) {
  return c->sel_push ? c->sel_push[i] : psc__selected(c, i);
}

/* Whether the client was interrupted during its current call; then c->err
 * says so and CM_ECANCELED is its result. */
int psc__check_interrupt(struct psc__client *c);

/* ---- declare_calls.c, declare_rounds.c */

/* One Declare call to one shard (psc__declare_calls). */
struct psc__decl_call {
  int shard;                          /* destination */
  const Psd__V1__DeclareRequest *req; /* borrowed */
  Psd__V1__DeclareResponse *resp;     /* its answer once it came (owned:
                                         psc__decl_calls_free), else NULL */
};

/* Sends the calls dc[0..n) (any number per shard), again to shards that
 * cannot be reached yet, until each is answered (the shard's boot id
 * recorded) or connect_timeout_ms has passed. Returns 0 or an error in
 * c->err; the answers that came are in dc either way. */
int psc__declare_calls(struct psc__client *c, struct psc__decl_call *dc, int n);
void psc__decl_calls_free(struct psc__decl_call *dc, int n);

/* Declares req (tables) on every shard that holds table rows, those of the
 * layout and during a live move its destinations (psc__declare_calls). */
int psc__declare_everywhere(struct psc__client *c,
                            const Psd__V1__DeclareRequest *req);

/* Declares vars[0..n) but those flagged in skip (placements resolved) on
 * their shards, with their values (psc__var.given): every shard holding rows
 * of one has it when this returns 0. Else an error in c->err. */
int psc__declare_vars(struct psc__client *c, const struct psc__var *vars, int n,
                      const unsigned char *skip);

/* Moves every shard on this host to its Unix socket, where it serves one. */
int psc__use_unix_sockets(struct psc__client *c);

/* Dials over TCP again every shard whose call in calls[0..n) failed
 * UNAVAILABLE on a Unix socket. */
void psc__back_to_tcp(struct psc__client *c, const struct cm_unary *calls,
                      int n);

/* ---- retry.c: retries, shared by every call that waits for a shard */

/* Whether a call that ended with st may succeed when sent again
 * (UNAVAILABLE, DEADLINE_EXCEEDED, CANCELLED). */
int psc__retryable(grpc_status_code st);

/* A failure of status st with gRPC's message details in words, into
 * buf[0..len): "connection refused (nothing listens there?)", "TLS
 * handshake failed (...)", "wrong token: ...", "no connection within 1.5
 * s (...)". connected says whether the call's channel is connected now,
 * timeout_s is its deadline. Returns 1 when the failure is about reaching
 * the shard, 0 when the shard answered (buf is then untouched). */
int psc__reach_cause(grpc_status_code st, const char *details, int connected,
                     double timeout_s, char *buf, size_t len);

/* A call to shard s failed retryably (u says how): an outage begins, said
 * at once, or goes on with u's cause. */
void psc__shard_down(struct psc__client *c, int s, const struct cm_unary *u);

/* A call to shard s succeeded: an outage ends. */
void psc__shard_up(struct psc__client *c, int s);

/* Says again, every 10 s, each outage still under way (ctx is the client;
 * cm_run_opts.tick while calls are in flight, and before each backoff). */
void psc__say_waiting(void *ctx);

/* The backoff before attempt number `attempt` at the shards flagged in
 * down[0..ndown) (borrowed); 0, or the error once one is past its budget
 * (connect_timeout_ms while starting, else the retry budget). */
int psc__retry_wait(struct psc__client *c, const unsigned char *down, int ndown,
                    int attempt, const char *what);

/* ---- relayout.c: the job's shard layout moved */

/* The re-plans one call may make before it gives up (a layout that keeps
 * moving). Each re-plan follows a strictly newer layout (psc__moved_newer),
 * the newest any answer of the round named, and sends what was refused
 * where that layout puts it. A live move hands each bucket over once, and
 * a refused bucket was handed over by the move the refusing source names,
 * so the pieces a re-plan sends again reach their bucket's owner for the
 * rest of the move: a call re-plans once when a move starts or gains
 * moves under it, perhaps once more for a bucket whose source knew fewer
 * moves than another shard of the round, and once at the move's end (the
 * version's step, dense variables re-cut). A bucket between owners, or a
 * shard that knows fewer moves than the client, names no newer layout and
 * is waited for apart (moved_wait_ms), not counted here, and neither are
 * more moves of the move the client follows already (each strictly later,
 * at most CM_LAYOUT_BUCKETS of them: small batches made ms apart moved one
 * test's calls 9 times). 8 allows twice what else a call needs (a move
 * starting, its end), and still stops layouts that keep changing under one
 * call within a few round trips. */
#define PSC__MAX_REPLANS 8

/* How long one call sends again what a "moved" answer refused when that
 * answer names no newer layout than the client's (a shard that has not
 * learnt the move's latest step, or a bucket in the few ms between its
 * source giving it up and its destination taking it): a backoff of 1 ms,
 * doubling to 8 ms, for up to moved_wait_ms (this by default). */
#define PSC__MOVED_WAIT_MS 30000.0

/* A "layout moved" message read (psc__moved_parse). */
struct psc__moved {
  int shard;       /* S, the shard that answered */
  uint64_t layout; /* V, the layout's version it holds */
  int nshards;     /* N, its shard count */
  int rows;        /* its row rule, CM_LAYOUT_RULE_* (no rule said:
                      modulo, a shard before rules) */
  int move_to;     /* M, the count a live move goes to; 0: none said */
  int moves;       /* K, that move's bucket moves the shard knows made */
  int bucket;      /* B, the bucket it refused; -1: none named */
};

/* One call's following of "layout moved" answers (psc__follow_moved);
 * zero at the start of the call. */
struct psc__follow {
  int replans;       /* newer layouts taken during the call, but for more
                        moves of a move followed already (the cap's) */
  int taken;         /* newer layouts taken during the call, all of them */
  double wait_from;  /* cm_mono_ms() when answers naming no newer layout
                        began, 0: none since the last re-plan */
  double backoff_ms; /* the wait before sending again after the next */
};

/* Whether u was answered "layout moved" (FAILED_PRECONDITION, details
 * beginning "layout moved: "). */
int psc__is_moved(const struct cm_unary *u);

/* Reads a "layout moved" message: "layout moved: ps:S holds layout V of N
 * shards, rows by RULE[, moving to M shards after K moves]; ...[bucket B
 * ...]" ("1 shard" too; without the rule, from a shard before rules:
 * modulo). A move is by buckets, to another count M in
 * 1..CM_LAYOUT_MAX_SHARDS, with K at most its moves (cm_layout_moves).
 * Returns 0 with *m filled, or CM_EPROTO (m untouched) when details is not
 * such a message. */
int psc__moved_parse(const char *details, struct psc__moved *m);

/* Whether a names a later layout than b: a larger version, or the same
 * version and a move b does not name, or the same move with more moves
 * made. */
int psc__moved_later(const struct psc__moved *a, const struct psc__moved *b);

/* Whether m names a layout newer than the one c plans for: a larger
 * version; or the same version and a move c does not know of, or the same
 * move (same M) with more moves made; or, neither side moving, the same
 * version of another count or rule (the job's layout corrects the count
 * a client opened with). Equal or older is not: a shard that lags. */
int psc__moved_newer(const struct psc__client *c, const struct psc__moved *m);

/* Keeps in c->moved the answer of one round of calls to follow: the first
 * "moved" message (details) of the round (*seen 0, then set), or a later
 * one that names a newer layout than the one kept. */
void psc__note_moved(struct psc__client *c, int *seen, const char *details);

/* A call `what` (followed by f) got the "moved" answer in c->moved. A newer
 * layout is taken, as psc__relayout (psc__relayout_transfer when transfer)
 * does, at most PSC__MAX_REPLANS times in the call; the caller then sends
 * what is pending as the new plan says. An answer naming no newer layout
 * waits a backoff (1 ms doubling to MOVED_BACKOFF_MS, 8); the caller sends what
 * is pending again, unchanged, until such answers have lasted c->moved_wait_ms:
 * then the error names the shard, the bucket and the last answer. Returns 0, or
 * an error in c->err (CM_ERPC past the limits, or psc__relayout's, or
 * CM_ECANCELED when interrupted). */
int psc__follow_moved(struct psc__client *c, struct psc__follow *f,
                      const char *what, int transfer);

/* Where v (placed v->placement among `from` shards, declared v->asked)
 * goes among `to`: cm_layout_replace, the one rule psd's reshard cut uses
 * too, so that the client agrees with the shards that restored it. */
int psc__replace(const struct psc__var *v, int from, int to);

/* Splits pending pieces in[0..nin) of vars at the row ranges of `nshards`
 * shards and packs them, shard by shard, into messages of at most `chunk`
 * elements: *pieces and *msgs (owned by the caller; msgs[].first indexes
 * *pieces; lead set on each shard's first; kinds, chunk and the transfer's
 * fields left 0). Returns 0 or CM_ENOMEM. */
int psc__recut(const struct psc__var *vars, const struct psc__piece *in,
               int nin, int nshards, uint64_t chunk, struct psc__piece **pieces,
               int *npieces, struct psc__msg **msgs, int *nmsgs);

/* Follows the layout a "moved" answer (its details) names, which must be
 * newer (psc__moved_newer; else CM_EPROTO): the counts checked against the
 * pool, the layout, count and move taken, and on a new version or count,
 * every boot id forgotten and the arenas dropped (new processes), the
 * variables re-placed; the plan made again, the Unix sockets taken again,
 * and one line said. A move's steps leave the variables where they are.
 * `what` names the call in an error. Returns 0 or an error in c->err. */
int psc__relayout(struct psc__client *c, const char *details, const char *what);

/* The same for a transfer under way: what is pending in the plan (the
 * pairs flagged in c->pending) is re-cut for the new layout and becomes
 * the plan until psc__plan_restore, so that nothing acknowledged is sent
 * again. */
int psc__relayout_transfer(struct psc__client *c, const char *details,
                           const char *what);

/* The end of a transfer: a full plan put aside by psc__relayout_transfer
 * comes back. */
void psc__plan_restore(struct psc__client *c);

/* Frees a plan put aside (psc__client_free). */
void psc__plan_save_free(struct psc__plan_save *p);

/* ---- coord.c: sync rollbacks, shared with the transfers */

/* An answer said the job rolled back to `step`, generation gen. */
void psc__saw_rollback(struct psc__client *c, uint64_t gen, uint64_t step);

#endif
