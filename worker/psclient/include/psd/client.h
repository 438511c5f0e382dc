/* libpsclient: psd's C client library, the public API (man 3 psclient).
 *
 *   #include <psd/client.h>      cc prog.c $(pkg-config --cflags --libs
 * psclient)
 *
 * A psc_client connects to every shard of a job (psd processes) named by a
 * cluster spec file, a TF_CONFIG text, or a list of shard addresses; it
 * declares variables (dense f32 tensors, each held by one shard or split
 * across all) and embedding tables (rows by u64 id), then pulls their values
 * into the caller's buffers and pushes gradients from the caller's buffers;
 * the shards apply the optimizer. Every call sends to all the shards it
 * involves at once, with a deadline, and survives a shard that restarts
 * (retried for the spec's job.retry_s; a push is applied once however often
 * it is retried).
 *
 * Conventions: every fallible function returns 0 (or a count or index >= 0)
 * or a negative PSC_E* code; psc_error says what failed in words, naming the
 * shard and the variable. One condition has one code, whether this client
 * found it or a shard answered it (psc_grpc_status then gives the status).
 * Buffers are the caller's, borrowed for the call: pulled bytes land in them
 * directly and pushes are sent from them. A client is used by one thread at a
 * time; several clients may run at once in one process. Nothing here exposes
 * psd's internal types. */
#ifndef PSD_CLIENT_H
#define PSD_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PSC_VERSION_MAJOR 1
#define PSC_VERSION_MINOR 3

/* Error codes: every code a psc_* call returns (libuv's UV_ERRNO_MAP pattern:
 * XX(name, value)); psc_strerror says each in words. The client's codes and
 * psd's own programs' are one table: the library checks at compile time that
 * each value here is the internal one and that none is missing, so a code
 * cannot reach a caller without a name here.
 *   EINVAL     a bad argument: psc_error says which
 *   ENOMEM     out of memory
 *   EIO        a file could not be read
 *   ENOENT     no such file, variable or table
 *   ESPEC      the spec or TF_CONFIG has mistakes
 *   EPROTO     a shard's answer could not be decoded
 *   ERPC       a shard refused the call, for a reason no other code names
 *              (psc_grpc_status)
 *   ETIMEDOUT  a deadline passed
 *   ESHAPE     a buffer or shape does not fit
 *   EEXIST     declared before with other settings (a shard's ALREADY_EXISTS)
 *   ERANGE     a value out of range (an id past the bound; a shard's
 *              OUT_OF_RANGE)
 *   EADDRINUSE, ENODEV, ECUDA, EFORMAT, ETRUNC
 *              psd's own programs' (binding, devices, files)
 *   EUNAVAIL   a shard stayed unreachable past the budget
 *   ESYS       a system call failed (psc_error names it)
 *   ECANCELED  interrupted (psc_set_interrupt) */
#define PSC_ERRNO_MAP(XX)                                                      \
  XX(EINVAL, -1)                                                               \
  XX(ENOMEM, -2)                                                               \
  XX(EIO, -3)                                                                  \
  XX(ENOENT, -4)                                                               \
  XX(ESPEC, -5)                                                                \
  XX(EPROTO, -6)                                                               \
  XX(ERPC, -7)                                                                 \
  XX(ETIMEDOUT, -8)                                                            \
  XX(ESHAPE, -9)                                                               \
  XX(EEXIST, -10)                                                              \
  XX(ERANGE, -11)                                                              \
  XX(EADDRINUSE, -12)                                                          \
  XX(ENODEV, -13)                                                              \
  XX(ECUDA, -14)                                                               \
  XX(EFORMAT, -15)                                                             \
  XX(ETRUNC, -16)                                                              \
  XX(EUNAVAIL, -17)                                                            \
  XX(ESYS, -18)                                                                \
  XX(ECANCELED, -19)

/* The codes as constants: PSC_EINVAL, PSC_ENOMEM, ... */
enum psc_errno {
#define PSC_ERRNO_ENUM_(name, value) PSC_##name = (value),
  PSC_ERRNO_MAP(PSC_ERRNO_ENUM_)
#undef PSC_ERRNO_ENUM_
};

/* Placement of a declared variable (psc_var_opts.placement). */
#define PSC_PLACE_AUTO                                                          \
  0                          /* split across all shards when >= 256 KiB, else   \
                                whole on the shard its name hashes to: the same \
                                for every client, whatever else it declares, in \
                                any order */
#define PSC_PLACE_SPLIT (-1) /* rows split across all shards */
#define PSC_PLACE_SHARD(k) ((k) + 1) /* whole on shard k */

/* How a shard fills a variable when it creates it. */
#define PSC_INIT_ZEROS 0   /* all zero */
#define PSC_INIT_UNIFORM 1 /* uniform in [-init_scale, init_scale], seeded */

typedef struct psc_client psc_client;

/* Settings of psc_open*; psc_options_init fills the defaults. */
struct psc_options {
  size_t size;      /* sizeof(struct psc_options), set by psc_options_init */
  const char *task; /* "worker:N" this client is, NULL: the spec's "task",
                       else TF_CONFIG's (the environment variable), else none
                       (a client that does not join the job's steps) */
  const char *name; /* identity in the shards' logs, NULL: the task
                       ("worker:0"), else "psc" */
  int timeout_ms;   /* deadline of each call, 0: the spec's
                       job.rpc_timeout_ms (30000) */
  int connect_timeout_ms; /* how long a declare waits for the shards to come
                             up, 0: 60000 */
  double retry_s;  /* how long a shard may stay unreachable while calls to
                      it are retried, 0: the spec's job.retry_s; < 0: never
                      retry */
  const char *job; /* psc_open_addrs only: the shards' job name ("job.name"
                      of their spec), NULL: "psd-job" */
  const char *token_file; /* psc_open_addrs only: a file holding the bearer
                             token the shards require (auth.token_file) */
};

/* Fills o with the defaults (everything from the spec). */
void psc_options_init(struct psc_options *o);

/* Opens a client for the job of the spec file at path (o may be NULL).
 * Nothing is sent until a declare. On failure returns a code and, when
 * err is not NULL, the reason in err (for a spec: every mistake, one per
 * line, with the file and JSON path). */
int psc_open(psc_client **out, const char *spec_path,
             const struct psc_options *o, char *err, size_t errlen);

/* The same from a TF_CONFIG-shaped JSON text (a whole spec, or just
 * "cluster" and "task"); NULL: the TF_CONFIG environment variable. */
int psc_open_tf_config(psc_client **out, const char *tf_config,
                       const struct psc_options *o, char *err, size_t errlen);

/* The same from the shards' addresses addrs[0..n) ("host:port", in the
 * order of their spec's cluster.ps). The shards do not check this client's
 * spec; o->job must name theirs unless it is the default. */
int psc_open_addrs(psc_client **out, const char *const *addrs, int n,
                   const struct psc_options *o, char *err, size_t errlen);

/* Stops the client's heartbeat (after psc_join) and frees it. NULL: no-op. */
void psc_close(psc_client *c);

/* The last error in words, naming the shard and the variable; "" when none.
 * Owned by the client, valid until its next call. */
const char *psc_error(const psc_client *c);

/* The gRPC status code (0: OK) of the last call that a shard answered with
 * a failure, e.g. 6 (ALREADY_EXISTS), 3 (INVALID_ARGUMENT), 14
 * (UNAVAILABLE); 0 when the last call failed before any shard answered. */
int psc_grpc_status(const psc_client *c);

/* A code in words ("invalid argument"); never NULL. */
const char *psc_strerror(int rc);

/* A gRPC status code's name ("ALREADY_EXISTS"); never NULL. */
const char *psc_grpc_status_name(int status);

/* ---- the job, as the spec says */

/* The shards of the job's layout: job.shards (else every address of
 * cluster.ps) at open, then the count the job was resharded to once a
 * call met the new layout. */
int psc_num_shards(const psc_client *c);
int psc_num_workers(const psc_client *c);
/* This client's worker index (psc_options.task), or -1. */
int psc_task_index(const psc_client *c);
/* "async" or "sync" (job.sync.mode). */
const char *psc_mode(const psc_client *c);
/* async: the staleness bound (job.sync.staleness), -1: unbounded. */
int psc_staleness(const psc_client *c);

/* ---- variables */

/* A declared variable's settings; zero fields take the defaults. */
struct psc_var_opts {
  int placement;         /* PSC_PLACE_AUTO (0), PSC_PLACE_SPLIT or
                            PSC_PLACE_SHARD(k) */
  int init;              /* PSC_INIT_* [ZEROS] */
  float init_scale;      /* PSC_INIT_UNIFORM's bound */
  const char *optimizer; /* NULL: the spec's (job.optimizer and its
                            overrides); else a JSON object in job.optimizer's
                            form, {"type": "adam", "lr": 0.001}, which the
                            shards apply to this variable */
};

/* Declares an f32 variable of ndim (1..4) dimensions shape[0..ndim) on the
 * shards that hold it (creating it there, or checking it: a variable that
 * exists with another shape or optimizer is PSC_EEXIST, naming both),
 * waiting for shards that are still starting. o may be NULL. Returns the
 * variable's handle (>= 0) for the calls below; declaring the same name
 * again returns the same handle. */
int psc_declare(psc_client *c, const char *name, int ndim, const int64_t *shape,
                const struct psc_var_opts *o);

/* The same, with the variable's initial values: values[0..numel) floats,
 * row-major (NULL: as psc_declare). The first client to declare the
 * variable supplies its values, instead of o->init (each shard its own rows
 * of a split variable, all from the same client); a shard that holds it
 * already ignores them, and every client then pulls those values. values
 * is read during the call alone. */
int psc_declare_values(psc_client *c, const char *name, int ndim,
                       const int64_t *shape, const struct psc_var_opts *o,
                       const float *values);

/* The handle of a declared variable, or PSC_ENOENT (psc_error is left as
 * it is, as by psc_numel and psc_table_dim). */
int psc_find(const psc_client *c, const char *name);

/* Elements (floats) of variable v, or a negative code. */
int64_t psc_numel(const psc_client *c, int v);

/* Pulls variables vars[0..n) into dst[0..n) (each numel floats), every
 * shard at once. */
int psc_pull(psc_client *c, const int *vars, float *const *dst, int n);

/* Pushes gradients grads[0..n) of vars[0..n); each shard applies its
 * optimizer on arrival. examples (the batch behind the gradient, counted in
 * the job's examples/s) > 0 also marks the start of this worker's step for
 * the job's staleness and step timing: pass it with the step's first push
 * and 0 with the others. */
int psc_push(psc_client *c, const int *vars, const float *const *grads, int n,
             uint32_t examples);

/* Both in one round trip (asynchronous training): the pull may or may not
 * see this push. grads and dst must not overlap. */
int psc_push_pull(psc_client *c, const int *vars, const float *const *grads,
                  float *const *dst, int n, uint32_t examples);

/* The same with a set of its own each way: pushes grads of
 * push_vars[0..npush) and pulls pull_vars[0..npull) into dst, in one round
 * trip (e.g. a step's last gradients, and every variable's new value). */
int psc_push_pull_sets(psc_client *c, const int *push_vars,
                       const float *const *grads, int npush,
                       const int *pull_vars, float *const *dst, int npull,
                       uint32_t examples);

/* ---- synchronous training (job.sync.mode "sync") */

/* Joins the job's steps as worker `worker` (-1: this client's task index)
 * and starts a heartbeat thread; *step is the step now open. */
int psc_join(psc_client *c, int worker, uint64_t *step);

/* Pulls once every shard has committed min_version steps (the step to
 * compute next); *version is the steps committed. */
int psc_pull_at(psc_client *c, const int *vars, float *const *dst, int n,
                uint64_t min_version, uint64_t *version);

/* Stages gradients for `step` (may be called several times per step, each
 * variable once). *closed is 1 when a shard had closed the step already
 * (the gradient is dropped; go on with the next step). */
int psc_push_step(psc_client *c, const int *vars, const float *const *grads,
                  int n, uint32_t examples, uint64_t step, int *closed);

/* Asks to count this worker's staged gradients in `step`; answered once the
 * step's set is decided. *next_step is the step now open. */
int psc_admit(psc_client *c, uint64_t step, int *admitted, uint64_t *next_step);

/* 1 (and *step, the step to go on from) when a call since the last check
 * learned that the job rolled back to a checkpoint or that the coordinator
 * restarted and this worker joined it again; 0 otherwise. */
int psc_restarted(psc_client *c, uint64_t *step);

/* Leaves the job, reporting its training examples, its training time
 * (first step's start to last step's end) and how long ago it ended, for
 * the job's rate (psctl status, pslaunch's job: line). */
int psc_leave(psc_client *c, uint64_t examples, double train_s,
              double ended_s_ago);

/* ---- bounded staleness (async with job.sync.staleness >= 0) */

/* Reports that this worker has pushed `clock` times and waits until the
 * slowest live worker lets it compute its next gradient. Needs psc_join. */
int psc_clock(psc_client *c, uint64_t clock);

/* ---- embedding tables (docs/tables.md) */

/* Declares a table of rows of dim floats (1..1024) on every shard; ids
 * must be < id_bound (0: any u64). The rest of its settings come from the
 * spec's job.tables entry of that name, or the defaults. */
int psc_declare_table(psc_client *c, const char *name, uint32_t dim,
                      uint64_t id_bound);

/* The dim of a table this client declared, or PSC_ENOENT. */
int psc_table_dim(const psc_client *c, const char *table);

/* Pulls the rows of ids[0..n) into rows (n x dim floats, in ids' order);
 * ids may repeat. min_version > 0 (sync): once every shard committed that
 * many steps. */
int psc_pull_rows(psc_client *c, const char *table, const uint64_t *ids,
                  size_t n, float *rows, uint64_t min_version);

/* Pushes row gradients grads (n x dim floats) of ids[0..n) (repeats are
 * summed). In a sync job (psc_mode "sync") they are staged for `step` (0
 * included: a sync job's first step) like psc_push_step, by a client that
 * joined, and *closed is set when closed is not NULL; else step is 0. */
int psc_push_rows(psc_client *c, const char *table, const uint64_t *ids,
                  size_t n, const float *grads, uint64_t step, int *closed);

/* One table's part of a multi-table row call (psc_pull_rows_many,
 * psc_push_rows_many); every buffer is the caller's, borrowed for the
 * call. */
struct psc_rows {
  const char *table;   /* a declared table */
  const uint64_t *ids; /* n ids (may repeat) */
  size_t n;            /* how many */
  float *rows;         /* pull: n x dim floats written, in ids' order */
  const float *grads;  /* push: n x dim floats read, in ids' order */
};

/* psc_pull_rows for r[0..n) at once: every table's and shard's messages go
 * in one run (one round trip for a batch's rows of many tables). An error
 * names the table. */
int psc_pull_rows_many(psc_client *c, struct psc_rows *r, int n,
                       uint64_t min_version);

/* psc_push_rows for r[0..n) at once, in one run; in a sync job staged for
 * `step`, *closed as psc_push_rows. */
int psc_push_rows_many(psc_client *c, const struct psc_rows *r, int n,
                       uint64_t step, int *closed);

/* ---- the rest */

/* While a call waits on the network, interrupted(arg) is polled about every
 * 100 ms; once it returns nonzero, the call's RPCs are cancelled and it
 * returns PSC_ECANCELED. NULL: none. For a binding that must stop on
 * Ctrl-C. */
void psc_set_interrupt(psc_client *c, int (*interrupted)(void *arg), void *arg);

/* Log levels (psc_set_log). */
#define PSC_LOG_DEBUG 0
#define PSC_LOG_INFO 1 /* the default */
#define PSC_LOG_WARN 2
#define PSC_LOG_ERROR 3
#define PSC_LOG_OFF 4 /* nothing */

/* The library's own log lines, process-wide (every client, and a client's
 * heartbeat thread): what it waits for ("ps:0 (...) not reachable: ...;
 * waiting up to 60 s for it"), a shard that is back, a worker rejoining.
 * By default, lines of PSC_LOG_INFO and above go to stderr as
 * "HH:MM:SS.mmm psd warn: <line>" (the PSD_LOG environment variable, debug,
 * info, warn, error or off, sets the first level). Lines below level are
 * dropped (PSC_LOG_OFF: all; < 0: the level stays as it is). cb not NULL
 * gets each line instead, cb(arg, level, line), the line without time,
 * name or newline, from the thread that logs, one call at a time; it must
 * not call the library. NULL: stderr again. Returns 0, or PSC_EINVAL for a
 * level past PSC_LOG_OFF. */
int psc_set_log(int level, void (*cb)(void *arg, int level, const char *line),
                void *arg);

/* Payload bytes this client pulled and pushed so far. */
uint64_t psc_bytes_pulled(const psc_client *c);
uint64_t psc_bytes_pushed(const psc_client *c);

/* ---- serving (docs/serving.md): lookups from the serving tasks */

/* A client of a job's serving tasks (the spec's cluster.serve): task
 * serve:J answers for training shard J % nps, as replica J / nps of it.
 * The client uses one replica per shard, chosen when it opens
 * (psc_serving_options.replica), and moves a shard to its next replica
 * when the one in use cannot be reached (UNAVAILABLE, a deadline), at
 * once; once every replica of a shard failed in a row it backs off and
 * tries again, for the spec's job.retry_s, then fails PSC_EUNAVAIL naming
 * each replica and why. Any other failure is the serving task's answer,
 * its gRPC status mapped to a code as for psc_client (NOT_FOUND:
 * PSC_ENOENT), with psc_serving_error naming the table or variable and the
 * task. Lookups are read-only; every answer of one shard reflects one
 * publication version, which the calls return per shard. A psc_serving is
 * used by one thread at a time. */
typedef struct psc_serving psc_serving;

/* Settings of psc_serving_open; psc_serving_options_init fills the
 * defaults. */
struct psc_serving_options {
  size_t size;      /* sizeof(struct psc_serving_options) */
  int replica;      /* the replica of each shard used first: >= 0 that
                       index (modulo the replicas per shard); -1 (the
                       default): one drawn from the process id, so that
                       processes spread over the replicas */
  const char *name; /* identity in the serving tasks' logs, NULL: "psc" */
  int timeout_ms;   /* deadline of each call, 0: job.rpc_timeout_ms */
  double retry_s;   /* how long a shard with no replica answering is
                       retried, 0: job.retry_s; < 0: one try of each */
};

void psc_serving_options_init(struct psc_serving_options *o);

/* Opens a serving client for the job of the spec file at path (o may be
 * NULL); nothing is sent yet. PSC_EINVAL when the spec has no
 * cluster.serve; err as psc_open's. */
int psc_serving_open(psc_serving **out, const char *spec_path,
                     const struct psc_serving_options *o, char *err,
                     size_t errlen);

/* Frees the client. NULL: no-op. */
void psc_serving_close(psc_serving *s);

/* The last error in words, naming the table or variable and the serving
 * task ("lookup of table 'emb' at serve:1 (10.0.0.2:6000): NOT_FOUND:
 * ..."); "" when none. Valid until the client's next call. */
const char *psc_serving_error(const psc_serving *s);

/* The gRPC status of the last call a serving task answered with a
 * failure; 0 when the last call failed before any answered. */
int psc_serving_grpc_status(const psc_serving *s);

/* Training shards (the spec's nps), and replicas of each. */
int psc_serving_shards(const psc_serving *s);
int psc_serving_replicas(const psc_serving *s);

/* J of the task serve:J that shard's lookups go to now (it changes at a
 * failover), or PSC_EINVAL for a shard out of range. */
int psc_serving_task(const psc_serving *s, int shard);

/* The floats per row of table, as the serving tasks hold it (asked once,
 * then remembered). Returns the dim (>= 1) or a code: PSC_ENOENT when
 * the serving tasks have no such table. */
int psc_lookup_dim(psc_serving *s, const char *table);

/* The rows of ids[0..n) of table into rows (n x psc_lookup_dim floats, in
 * ids' order; ids may repeat). found (n bytes, may be NULL): 1 where the
 * row was trained and published, 0 where the id was never published (or
 * was evicted): its row is then the table's initial row for that id, as
 * a training pull answers. versions (psc_serving_shards entries, may be
 * NULL): the publication version each shard's answer reflects, 0 for a
 * shard none of the ids belongs to. ids go to shards as in training
 * (splitmix64(id) % nps), one message per shard, all at once. Codes:
 * PSC_EINVAL, PSC_ENOMEM, PSC_ENOENT (no such table), PSC_EUNAVAIL,
 * PSC_ETIMEDOUT, PSC_EPROTO, PSC_ERPC, PSC_ECANCELED. */
int psc_lookup(psc_serving *s, const char *table, const uint64_t *ids, size_t n,
               float *rows, uint8_t *found, uint64_t *versions);

/* Dense variable `name`, its rows from every shard assembled in order,
 * into out (count floats, row-major; out NULL: only *numel). numel (may
 * be NULL): its elements. versions as psc_lookup's (0 for a shard holding
 * none of it). Codes: those of psc_lookup, PSC_ENOENT when no shard holds
 * the variable, PSC_ESHAPE when count is not its element count. */
int psc_lookup_dense(psc_serving *s, const char *name, float *out, size_t count,
                     size_t *numel, uint64_t *versions);

/* As psc_set_interrupt, for a serving client's calls. */
void psc_serving_set_interrupt(psc_serving *s, int (*interrupted)(void *arg),
                               void *arg);

#ifdef __cplusplus
}
#endif

#endif
