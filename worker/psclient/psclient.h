/* libpsclient's own API (psc__*), the one client of psd that every program
 * in this tree links: dworker, psctl, pslaunch, psd (done.c), the test
 * tools; the public API (include/psd/client.h, psc_*) is a layer over it.
 * Connects to every shard of a cluster
 * spec, declares variables (idempotently), and pulls and pushes them with
 * the calls to all shards in flight at once, each call with a deadline.
 * Large variables travel in chunks (docs/wire.md), so no gRPC message
 * limit is ever hit. One psc__client is used by one thread at a time.
 *
 * Pulls, pushes and the coordinator calls (join, leave, admit, clock)
 * survive a shard that restarts, stops or is cut off: a call that fails
 * UNAVAILABLE, DEADLINE_EXCEEDED or CANCELLED is retried with backoff for up
 * to the retry budget (retry_s), and each outage is logged with its cause,
 * again every 10 s, and its end. A push is applied once however often it is
 * retried (docs/faults.md). Every call carries the spec's fingerprint and
 * the boot id of the shard's process: a shard started from another spec, or
 * restarted without a checkpoint, refuses it (FAILED_PRECONDITION, not
 * retried). */
#ifndef PSC__PSCLIENT_H
#define PSC__PSCLIENT_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "spec.h"

#define PSC__VAR_MAX_DIMS 4

/* Where a variable lives. */
enum psc__placement {
  PSC__PLACE_NAME = -3, /* split when large, else whole on the shard the name
                         hashes to: the same whatever else is declared, in
                         any order (cm_layout_by_name) */
  PSC__PLACE_AUTO =
      -2, /* split when large, else whole on the least-loaded shard
           after the variables before it in the same declare (a
           list every worker declares whole, in the same order) */
  PSC__PLACE_SPLIT =
      -1, /* contiguous row ranges on every shard, balanced by bytes */
  /* >= 0: whole on that shard */
};

/* How psd fills a variable when it first creates it. */
enum psc__init {
  PSC__INIT_ZEROS = 0,   /* all zero */
  PSC__INIT_UNIFORM = 1, /* uniform in [-init_scale, init_scale], seeded */
};

/* One variable as the worker sees it. psc__client_declare copies the array
 * (and the names); the buffers `value` and `grad` point to stay the
 * caller's, alive and unmoved until psc__client_free or psc__client_bind
 * points elsewhere. */
struct psc__var {
  const char *name;                 /* unique in the job, at most 200 bytes */
  int ndim;                         /* 1..PSC__VAR_MAX_DIMS */
  int64_t shape[PSC__VAR_MAX_DIMS]; /* rows are shape[0]; f32 elements */
  int placement; /* enum psc__placement or a shard index; AUTO is resolved in
                    place by declare */
  enum psc__init init;   /* initializer psd uses on creation */
  float init_scale;      /* bound of PSC__INIT_UNIFORM */
  float *value;          /* caller-owned pull destination, numel floats */
  const float *grad;     /* caller-owned push source, numel floats */
  const char *optimizer; /* NULL or "": the spec's optimizer for it; else a
                            JSON object in job.optimizer's form, which the
                            shards apply to this variable (VarSpec.optimizer) */
  const float *given;    /* NULL: init fills it; else its initial values,
                            numel floats row-major, the caller's (borrowed by
                            psc__client_declare alone, not kept): the shards
                            that create it take their rows of them, and every
                            other client pulls those (docs/wire.md, "Initial
                            values") */
  int asked; /* set by declare (the caller's is ignored): placement as the
                caller gave it, before AUTO and NAME are resolved; sent to
                the shards (VarSpec.asked), and a moved layout re-places by
                it (cm_layout_replace) */
};

/* Elements of v: the product of its shape. */
uint64_t psc__numel(const struct psc__var *v);

/* Client settings; zero fields take the defaults in brackets. */
struct psc__client_opts {
  const char *worker;     /* identity sent with each call ["client"] */
  int timeout_ms;         /* deadline of each call [spec job.rpc_timeout_ms] */
  int connect_timeout_ms; /* how long declare waits for shards to come up
                             [60000] */
  size_t chunk_bytes;     /* largest tensor payload per message [2 MiB] */
  int inflight;           /* calls in flight per shard [4] */
  uint64_t seed;     /* initializer seed sent with declare [spec job.seed] */
  double retry_s;    /* how long a shard may stay unreachable (UNAVAILABLE,
                        DEADLINE_EXCEEDED or CANCELLED) while calls to it are
                        retried before the call fails [spec job.retry_s]; < 0:
                        never retry */
  int no_spec_check; /* 1: send no spec fingerprint, so the shards do not
                        check that this client's spec is theirs (a client
                        that knows only their addresses) */
};

/* What a client's calls met so far (psc__client_stats). */
struct psc__client_stats {
  uint64_t calls;   /* calls completed, each attempt counted */
  uint64_t failed;  /* of them, those that did not end OK (a sync push to a
                       closed step, ABORTED, is not a failure) */
  uint64_t retries; /* calls sent again after UNAVAILABLE, DEADLINE_EXCEEDED
                       or CANCELLED */
  uint64_t outages; /* times a shard became unreachable */
  uint64_t replans; /* newer layouts followed after "layout moved" answers */
  uint64_t moved_waits; /* "layout moved" answers that named no newer
                           layout (a shard behind the client, a bucket
                           between owners): sent again after a backoff */
};

struct psc__client;

/* Opens channels to every shard in spec (nothing is sent yet). spec must
 * outlive the client. */
int psc__client_new(struct psc__client **out, const struct cm_spec *spec,
                    const struct psc__client_opts *opts);
void psc__client_free(struct psc__client *c);

/* Declares vars[0..n) on the shards that hold them, waiting for the shards
 * to come up (connect_timeout_ms; a shard not reached is logged with the
 * cause after a second and every 10 s), then moves to the Unix socket of
 * each shard on this host. May be called again with more variables (they
 * join the earlier ones; one declared again with the same shape is left
 * as it is). Placements AUTO and NAME are resolved in vars. Returns 0, or
 * CM_EEXIST when a shard (or this client) holds a variable of that name
 * with another shape, or CM_ERPC/CM_ETIMEDOUT; psc__client_error says which
 * variable and shard. */
int psc__client_declare(struct psc__client *c, struct psc__var *vars, int n);

/* Variables declared so far, and the i-th of them (declaration order;
 * owned by the client). */
int psc__client_nvars(const struct psc__client *c);
const struct psc__var *psc__client_var(const struct psc__client *c, int i);

/* The index of the declared variable called name, or CM_ENOENT. */
int psc__client_find(const struct psc__client *c, const char *name);

/* Points variable i's pull destination (value) and push source (grad) at
 * the caller's buffers of numel floats; NULL leaves one as it is. */
int psc__client_bind(struct psc__client *c, int i, float *value,
                     const float *grad);

/* Limits the pulls and pushes that follow (every transfer call, sync ones
 * included) to the variables idx[0..n); n < 0: every variable again. A
 * push of a subset carries the examples (psc__client_set_examples) when they
 * are nonzero, and marks the start of the worker's step only then. */
int psc__client_select(struct psc__client *c, const int *idx, int n);

/* Pushes of the transfers that follow move the variables idx[0..n)
 * instead of those psc__client_select chose (which the pulls keep moving):
 * psc__client_push_pull can push some variables and pull others in one round
 * trip. n < 0: pushes move what psc__client_select chose again. */
int psc__client_select_push(struct psc__client *c, const int *idx, int n);

/* While a call waits on the network, interrupted(arg) is polled about every
 * 100 ms; once it returns nonzero the call's RPCs are cancelled and it
 * returns CM_ECANCELED ("interrupted"), retrying nothing. NULL: none.
 * Also clears the last error (psc__client_error, psc__client_last_status): a
 * binding calls it before each call. */
void psc__client_set_interrupt(struct psc__client *c,
                               int (*interrupted)(void *), void *arg);

/* The shards of the job's layout the client plans for: job.shards (else
 * every address of cluster.ps) at open, then the count a "layout moved"
 * answer named (docs/faults.md, "A reshard under running workers"). */
int psc__client_nshards(const struct psc__client *c);

/* Plans for layout `layout` of nshards shards from now on, as a "layout
 * moved" answer would, when a caller read it first from shard's status
 * (psctl does, so that it asks each id of its home shard from its first
 * call), placing rows by rows (CM_LAYOUT_RULE_*, the status's "rows"),
 * and while a live move goes to move_to shards (0: none), after `moves`
 * bucket moves (the status's "move_to" and "moved"). Nothing unless it is
 * newer than the layout the client plans for (relayout.c's rule: each
 * shard's status may be offered in turn, and the newest stays). Returns
 * 0, or CM_ERANGE when nshards or
 * move_to is outside 1..the spec's ps addresses, CM_EPROTO when the move
 * is not one of buckets to another count with at most its moves made
 * (psc__client_error says so). */
int psc__client_take_layout(struct psc__client *c, int shard, uint64_t layout,
                            int nshards, int rows, int move_to, int moves);

/* What the client dials for shard: the spec's "host:port", or after
 * declare, "unix:/path" when the shard runs on this host and serves its Unix
 * socket (common/rpc/endpoint.h; job.unix_sockets). Owned by the client. */
const char *psc__client_target(const struct psc__client *c, int shard);

/* The bytes of the shared-memory arena through which pulls and pushes to
 * shard move (registering it now when it can be: a shard on this host, with
 * job.shared_memory; docs/wire.md), or 0 when they travel as bytes. */
uint64_t psc__client_shm_bytes(struct psc__client *c, int shard);

/* Pulls every declared variable's current value into its `value` buffer. */
int psc__client_pull(struct psc__client *c);

/* Pushes every declared variable's `grad`; each shard applies its
 * optimizer on arrival. */
int psc__client_push(struct psc__client *c);

/* Both at once, for asynchronous training: each shard gets this push and
 * the next pull together, so the pull may or may not see this push (at
 * most one step of the worker's own staleness) and a step pays one round
 * trip instead of two. `grad` and `value` must not overlap. */
int psc__client_push_pull(struct psc__client *c);

/* Sets the number of examples reported with each later push (psd counts
 * them for its status and the job's examples/s). */
void psc__client_set_examples(struct psc__client *c, uint32_t examples);

/* ---- embedding tables (docs/tables.md) ---- */

/* A table as a client declares it; the rest of its settings (optimizer,
 * initializer, admission, eviction) come from the spec's job.tables entry of
 * that name, or the defaults. */
struct psc__table {
  const char *name;  /* unique among tables and variables, <= 200 bytes */
  uint32_t dim;      /* floats per row, 1..1024 */
  uint64_t id_bound; /* 0: any u64 id; else ids must be < id_bound */
};

/* Declares tables[0..n) on every shard (each holds the ids that hash to it,
 * psc__client_shard_of), waiting for the shards like psc__client_declare.
 * May be called before or after psc__client_declare; the client copies what
 * it needs. Returns 0, CM_EEXIST when a shard holds the table with another
 * dim or bound (psc__client_error names both), CM_ERPC, CM_ETIMEDOUT. */
int psc__client_declare_tables(struct psc__client *c,
                               const struct psc__table *tables, int n);

/* The dim of a table this client declared, or CM_ENOENT. */
int psc__client_table_dim(const struct psc__client *c, const char *table);

/* The shard that holds id in the client's layout: its row map
 * (cm_layout_map_id_shard, the one psd uses). */
int psc__client_shard_of(const struct psc__client *c, uint64_t id);

/* One table's part of a sparse call: ids in, rows out (pull) or row
 * gradients in (push). Ids may repeat: a pull answers each occurrence, a
 * push sums them. All buffers are the caller's, borrowed for the call. */
struct psc__rows {
  const char *table;   /* a declared table */
  const uint64_t *ids; /* n ids */
  size_t n;            /* ids in this call */
  float *rows;         /* pull: n x dim floats written, in ids' order */
  const float *grads;  /* push: n x dim floats read, in ids' order */
};

/* Pulls the rows of r[0..nr) (each table's ids split by shard, cut into
 * messages that fit job.max_message_mb, every shard's first message in
 * flight at once, one per shard and table at a time). Retries like
 * psc__client_pull. Returns 0 or an error (psc__client_error names the shard
 * and table: a bound exceeded, a wrong dim). */
int psc__client_pull_rows(struct psc__client *c, struct psc__rows *r, int nr);

/* Pushes the row gradients of r[0..nr); each shard applies its table's
 * per-row optimizer on arrival to the rows touched. Sparse pushes carry no
 * examples (SparsePushRequest.examples 0): a step's dense push counts them,
 * so they are not counted twice. */
int psc__client_push_rows(struct psc__client *c, const struct psc__rows *r,
                          int nr);

/* Sync: pulls once every shard has committed min_version steps. */
int psc__client_pull_rows_at(struct psc__client *c, struct psc__rows *r, int nr,
                             uint64_t min_version);

/* Sync: stages the row gradients for `step` (applied at the step's commit
 * with the dense gradients of the same workers: call it before
 * psc__client_admit). *closed as psc__client_push_step. */
int psc__client_push_rows_step(struct psc__client *c, const struct psc__rows *r,
                               int nr, uint64_t step, int *closed);

/* ---- embedding tables, for psctl (admin_tables.c) ---- */

/* Admin/Rows to shard `shard`: the stored rows of ids[0..n) of table, or
 * with top > 0 its `top` rows with the most pushes. *json (caller frees
 * with free()) gets {"dim", "state": [part names], "rows": [{"id",
 * "found", "value": [...], "state": [...], "count", "t", "last_step"}]}. */
int psc__client_rows(struct psc__client *c, int shard, const char *table,
                     const uint64_t *ids, size_t n, uint32_t top, char **json);

/* Admin/Shrink to shard `shard`: evicts by the table's rules; *evicted
 * and *rows (left) are set. */
int psc__client_shrink(struct psc__client *c, int shard, const char *table,
                       uint64_t *evicted, uint64_t *rows);

/* One page of a table's rows from one shard (psc__client_export_page). */
struct psc__table_page {
  uint32_t dim;  /* floats per row */
  size_t n;      /* rows in the page */
  int done;      /* 1: no rows follow */
  uint64_t *ids; /* owned (free()), n ids ascending */
  float *values; /* owned (free()), n x dim */
};

/* Admin/Export to shard `shard`: its stored rows with ids above `after`
 * (every id without has_after), the smallest first, as many as fit a
 * message. */
int psc__client_export_page(struct psc__client *c, int shard, const char *table,
                            int has_after, uint64_t after,
                            struct psc__table_page *page);

/* ---- synchronous steps and clocks (DESIGN.md, "One synchronous step t") */

/* Tells the coordinator (shard 0) that worker `worker` takes part, and
 * starts a thread that sends it a heartbeat every heartbeat_ms until
 * psc__client_free. *step is the step now open. */
/* A worker on a stream: its progressive validation so far (windows
 * scored, the last one's AUC and log loss), sent with every heartbeat so
 * that the coordinator's Status and /metrics show it. Thread-safe. */
void psc__client_set_window(struct psc__client *c, uint64_t windows, double auc,
                            double logloss);

int psc__client_join(struct psc__client *c, int worker, int heartbeat_ms,
                     uint64_t *step);

/* Tells the coordinator the worker has finished (it no longer counts), and
 * what it did, for the job's rate (psctl status, pslaunch's job: line):
 * its training examples, its training time from its first step's start to
 * its last step's end (train_s), and how long ago that end was
 * (ended_s_ago). train_s 0 reports nothing. */
int psc__client_leave(struct psc__client *c, uint64_t examples, double train_s,
                      double ended_s_ago);

/* Pulls every variable once every shard has committed min_version steps;
 * a shard parks the pull until then. *version is the lowest number of
 * steps committed among the answers. */
int psc__client_pull_at(struct psc__client *c, uint64_t min_version,
                        uint64_t *version);

/* Stages this worker's gradients for `step` on every shard. *closed is
 * set to 1 when a shard has already committed the step (the gradient is
 * dropped; go on with the next step), else 0. */
int psc__client_push_step(struct psc__client *c, uint64_t step, int *closed);

/* Asks the coordinator to count the staged gradient in `step`; answered
 * when the step's set is decided. *admitted says whether it was counted,
 * *next_step is the step now open. */
int psc__client_admit(struct psc__client *c, uint64_t step, int *admitted,
                      uint64_t *next_step);

/* Sync: 1 when an answer since the last call said the job rolled back to a
 * common checkpoint (a shard restarted from it), with *step the step to go
 * on from (pull it, then compute and push it again); 0 otherwise. The call
 * that got such an answer returned 0: a pull's values are then not usable,
 * a push's gradient was dropped, an Admit did not count it. */
int psc__client_rolled_back(struct psc__client *c, uint64_t *step);

/* Sync: 1 when an Admit since the last call said the coordinator had
 * restarted since this worker joined, and the client has joined it again
 * (psc__client_admit did, learning the generation), with *step the step to
 * go on from (the Admit did not count the gradient); 0 otherwise. */
int psc__client_rejoined(struct psc__client *c, uint64_t *step);

/* Sync: the rollbacks this client knows of (the job's generation). */
uint64_t psc__client_gen(const struct psc__client *c);

/* Async with a staleness bound: reports that the worker has pushed
 * `clock` times and waits until the slowest live worker allows it to
 * compute its next gradient. */
int psc__client_clock(struct psc__client *c, uint64_t clock);

/* A worker as the coordinator's status (psc__client_status of ps:0) sees it. */
enum psc__worker_state {
  PSC__W_NOT_JOINED = 1, /* not joined yet: not started, or still loading */
  PSC__W_TRAINING,       /* joined and live */
  PSC__W_FINISHING,      /* left (Join leave) but still heard from: worker 0
                          pulls the final parameters after leaving */
  PSC__W_FINISHED,       /* left and silent: its process let go of the job */
  PSC__W_DEAD,           /* declared dead (silent for job.dead_after_ms, not
                          left) */
};

/* Judges worker `worker` from status, ps:0's status parsed (its "workers"
 * entries), with the job's heartbeat_ms (workers.c). */
enum psc__worker_state psc__worker_judge(json_t *status, int worker,
                                         int heartbeat_ms);

/* Fetches shard `shard`'s status as a JSON text (caller frees with free()):
 * StatusResponse's fields by their proto names ("vars", "workers",
 * "histograms" with bounds, per-bucket counts, sum and count, ...). */
int psc__client_status(struct psc__client *c, int shard, char **json);

/* One run of a variable's elements to read from one shard (psc__client_read).
 * The caller fills the first block; psc__client_read fills rc and err. */
struct psc__read {
  int shard;        /* the shard that holds the run */
  const char *name; /* the variable; borrowed for the call */
  uint64_t offset;  /* first element, in the variable's global numbering */
  uint64_t count;   /* elements; the run must lie inside the shard's rows */
  float *dst;       /* caller-owned destination of count floats */
  int slots;        /* 1: read the optimizer's slot `slot`, not the values */
  uint32_t slot;    /* with slots: which, in the order of VarStatus.slots */
  int rc;           /* out: 0, or the error of the run's first failed message */
  char err[1024];   /* out: that error in words, naming shard and variable */
};

/* Reads the runs reads[0..n) with Data.Pull, no declare needed (an admin
 * tool reads variables it did not declare): each run is cut into messages
 * of at most chunk_bytes, up to `inflight` in flight per shard and every
 * shard at once. Returns 0 when every run arrived whole, else the first
 * failed run's code; each run's rc and err say how it went, so the caller
 * can use the runs that did arrive. */
int psc__client_read(struct psc__client *c, struct psc__read *reads, int n);

/* Counters of the client's calls so far. */
void psc__client_stats(const struct psc__client *c,
                       struct psc__client_stats *out);

/* The random id this client's pushes carry (PushRequest.client_id). */
uint64_t psc__client_id(const struct psc__client *c);

/* The last error in words, naming the shard and variable; "" when none. */
const char *psc__client_error(const struct psc__client *c);

/* Bytes moved by this client so far (payload only), for progress lines. */
uint64_t psc__client_bytes_pulled(const struct psc__client *c);
uint64_t psc__client_bytes_pushed(const struct psc__client *c);

/* ---- admin calls (psctl) ---- */

/* What one shard answered Admin.Checkpoint (psc__client_checkpoint). The
 * fields after details are set only when status is 0 (it answered). */
struct psc__checkpoint {
  int status;        /* the call's gRPC status (grpc_status_code), 0: OK;
                        INTERNAL "malformed answer" when it was unreadable */
  char details[512]; /* the status message, "" when none */
  char cause[512];   /* when the shard was not reached or refused this
                        client (a wrong token): why, in words ("connection
                        refused (nothing listens there?)"); else "" */
  int written;       /* 1: written before the answer (wait); 0: queued */
  uint64_t step;     /* the step the checkpoint holds */
  uint64_t bytes;    /* written: its size */
  double ms;         /* written: how long the write took */
  char path[4096];   /* written: its directory */
  int standby;       /* 1: a shard past the layout's count that writes
                        none (it holds nothing) or was not reached: not a
                        failure (status 0, details say which) */
};

/* Asks every shard at once to write a checkpoint now (Admin.Checkpoint),
 * each of its own rows, in parallel; with wait, each answers once its
 * checkpoint is written, else once it is queued. In a sync job the
 * coordinator (ps:0) first names one step (the next to close) and every
 * shard writes that step when it commits it: a consistent cut of the job.
 * In an async job each shard writes its own state now. Fills out[s] for every
 * shard s of the spec (out is caller-owned, one entry per shard), so the
 * caller sees each shard's outcome: a shard past the layout's count is
 * asked too (a standby one holding rows a live move gave it writes them),
 * and one that writes none or is not reached is marked standby. Returns 0 when
 * every shard answered; CM_ENOMEM when nothing was sent (out is then all zero);
 * else the code of a shard that did not, with psc__client_error naming that
 * shard. */
int psc__client_checkpoint(struct psc__client *c, int wait,
                           struct psc__checkpoint *out);

/* Waits up to ms for shard's channel to connect when it is not connected
 * (a shard starting again), its reconnect backoff reset every 50 ms, so
 * that the next call does not wait out gRPC's growing backoff. Returns 1
 * when it is connected, 0 when not. */
int psc__client_await(struct psc__client *c, int shard, int ms);

/* What psctl reshard asks ps:0 for (ReshardRequest). */
struct psc__reshard_ask {
  int shards;       /* the new shard count (not read with cancel) */
  int how;          /* ReshardRequest.how: 0 stop and cut, 1 a live move,
                       2 a live move where the job can make one */
  unsigned batch;   /* a live move's buckets per batch, 0: ps:0 chooses */
  double rate_mbps; /* its MB/s at most, 0: no limit */
  int cancel;       /* 1: stop the live move under way instead */
};

/* What ps:0 answered Admin.Reshard (psc__client_reshard). */
struct psc__reshard {
  int status;         /* the call's gRPC status, 0: OK */
  char details[1024]; /* its message, "" when none */
  uint64_t layout;    /* OK: the layout version the reshard makes */
  int from, to;       /* OK: the shard counts before and after */
  char message[1024]; /* OK: what happens now, in words */
  int moves;          /* OK: a live move (follow ps:0's Status: move,
                         reshard), not the stop and cut */
};

/* Asks the coordinator (ps:0) to change the job's shard count while it
 * runs (a live reshard, docs/reshard.md "Live"), or to stop the live move
 * under way (ask->cancel); the answer comes once ps:0 has checked the
 * request and started it, before it is done (follow the stop and cut with
 * each shard's Status: layout, standby, reshard; a live move with ps:0's
 * move and reshard). Returns 0, or the call's code with out and
 * psc__client_error saying why. */
int psc__client_reshard(struct psc__client *c,
                        const struct psc__reshard_ask *ask,
                        struct psc__reshard *out);

/* The gRPC status (grpc_status_code) of the client's last batch of calls:
 * that of its first call that failed, in the order the calls were made,
 * or 0 (OK) when none did. A pull answer of the wrong size fails its call
 * (INTERNAL); an answer found unreadable after the batch (a malformed
 * Status) leaves 0. *details (when details is not NULL) gets that call's
 * status message, "" when none; owned by the client, valid until its next
 * call. For a caller that words an error itself (psc__client_error says it
 * in a sentence). */
int psc__client_last_status(const struct psc__client *c, const char **details);

#endif
