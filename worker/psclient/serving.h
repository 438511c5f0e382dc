/* libpsclient's serving client (internal; the public psc_serving of
 * psd/client.h is api_lookup.c over it, psctl's `serving` uses it too):
 * channels to a job's serving tasks (the spec's cluster.serve; task serve:J
 * follows training shard J % nps and is replica J / nps of it), one replica
 * per shard in use at a time, and the Serve/Lookup calls that read rows of
 * a table by id and dense variables by name from them.
 *
 *   serving.c        the object, the calls with failover, Admin/Status
 *   serving_lookup.c rows by id and dense variables on top of it
 *
 * A call sends one message per shard involved, all shards at once. A
 * replica that cannot be reached (UNAVAILABLE, a deadline, a cancelled
 * call) is left for the next replica of its shard at once, and that one
 * stays in use; once every replica of a shard failed in a row the client
 * backs off (100 ms doubling to 2 s) and tries again until job.retry_s has
 * passed since the shard's first failure of the call (PSC_EUNAVAIL then,
 * naming every replica and why it failed). Any other failure is the
 * serving task's answer and ends the call with its code
 * (cm_rpc_status_rc), naming the table or variable and the task. */
#ifndef PSC__SERVING_H
#define PSC__SERVING_H

#include <stddef.h>
#include <stdint.h>

#include <grpc/grpc.h>

#include "layout.h"
#include "spec.h"

struct psc__serving;

/* Settings of psc__serving_new; zero fields take the defaults. */
struct psc__serving_opts {
  const char *worker; /* identity in the serving tasks' logs, NULL: "psc" */
  int timeout_ms;     /* deadline of each call, 0: job.rpc_timeout_ms */
  double retry_s;     /* 0: job.retry_s; < 0: one try of each replica */
  int replica;        /* the replica of each shard used first: >= 0 that
                         index (modulo the replicas per shard), < 0: one
                         drawn from the process id */
};

/* Opens channels to every task of spec->serve (borrowed; it must outlive
 * the client). Fails with CM_EINVAL (the reason in err) when the spec has
 * no cluster.serve. */
int psc__serving_new(struct psc__serving **out, const struct cm_spec *spec,
                     const struct psc__serving_opts *o, char *err,
                     size_t errlen);
void psc__serving_free(struct psc__serving *s);

/* The last error in words ("" when none), and the gRPC status of the last
 * failed answer (0: the last call failed before any task answered). */
const char *psc__serving_error(const struct psc__serving *s);
grpc_status_code psc__serving_last_status(const struct psc__serving *s);

/* Training shards (nps) and replicas of each (nserve / nps). */
int psc__serving_shards(const struct psc__serving *s);
int psc__serving_replicas(const struct psc__serving *s);

/* The serving task (J of serve:J) shard's calls go to now. */
int psc__serving_task(const struct psc__serving *s, int shard);

/* serve:task's address ("host:port"). */
const char *psc__serving_addr(const struct psc__serving *s, int task);

/* Failovers so far: calls moved to another replica. */
uint64_t psc__serving_failovers(const struct psc__serving *s);

/* While a call waits, interrupted(arg) is polled about every 100 ms; once
 * nonzero the call ends CM_ECANCELED. NULL: none. */
void psc__serving_set_interrupt(struct psc__serving *s,
                                int (*interrupted)(void *), void *arg);

/* Sets the error text; returns rc (serving_lookup.c's checks). */
int psc__serving_fail(struct psc__serving *s, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- serving_lookup.c */

/* The floats per row of table, as the serving tasks answer it (asked once
 * per table, then remembered). */
int psc__serving_dim(struct psc__serving *s, const char *table, uint32_t *dim);

/* The rows of ids[0..n) of table into rows (n x dim floats, in ids'
 * order, dim as psc__serving_dim says), found[i] 1 when id i's row was
 * trained and published, 0 when it is the table's initial row (found may
 * be NULL), and versions[shard] the publication version that shard's
 * answer reflects, 0 for shards not asked (versions may be NULL). ids are
 * routed by the layout the serving tasks' publications name, and follow a
 * reshard (psc__serving_route). */
int psc__serving_lookup(struct psc__serving *s, const char *table,
                        const uint64_t *ids, size_t n, float *rows,
                        uint8_t *found, uint64_t *versions);

/* Dense variable `name` assembled from every shard's rows into out
 * (count floats; out NULL: only *numel is set), *numel its elements
 * (numel may be NULL), versions[shard] as psc__serving_lookup (0 for a
 * shard that holds none of it). CM_ENOENT when no shard holds it,
 * CM_ESHAPE when count is not numel. */
int psc__serving_dense(struct psc__serving *s, const char *name, float *out,
                       size_t count, size_t *numel, uint64_t *versions);

/* ---- one serving task's Status, for psctl serving */

/* A serving task's state (ServingStatus of its Admin/Status answer). */
struct psc__serve_status {
  int serving;            /* 1: the answer had a serving block */
  int replica;            /* its index in cluster.serve */
  int shard;              /* the training shard it follows */
  char dir[1024];         /* the publication directory it follows */
  uint64_t version;       /* the version its answers reflect (0: none) */
  uint64_t step;          /* that version's training step */
  int64_t time_unix_ms;   /* that version's cut, Unix ms */
  uint64_t newest_seen;   /* the newest version found in dir */
  uint64_t rows;          /* table rows held */
  uint64_t bytes;         /* memory its tables and dense values hold */
  uint64_t applied;       /* publications applied since start */
  uint64_t refused;       /* publications refused */
  char last_refusal[512]; /* why the last one was refused, "" */
  uint64_t lookups;       /* Lookup calls answered */
  uint64_t layout;        /* the version's layout, its shard count (0:
                             none loaded, or an older task) and live move
                             (0, 0: none) */
  int shards, move_to, moved;
};

/* Asks serve:task itself (no failover, no retry) for its Admin/Status.
 * Returns 0, or the call's code with the reason in psc__serving_error. */
int psc__serving_status(struct psc__serving *s, int task,
                        struct psc__serve_status *out);

/* ---- what serving.c lends serving_lookup.c */

/* Once, when the last call ended on a task's "rows moved" answer and the
 * map took its rule, or on its "layout moved" answer: 1 when that was
 * news (the caller groups its ids again and calls again), 2 when not (the
 * task that takes the bucket lags: probe, wait, and call again). 0
 * otherwise. */
int psc__serving_rows_moved(struct psc__serving *s);

/* The shard an id is asked of, by what each shard's serving task last said
 * of its layout (serving.c, "Following a reshard"). */
int psc__serving_route(struct psc__serving *s, uint64_t id);

/* The shard count of the latest layout a task named (or job.shards):
 * the shards a dense variable is asked of. */
int psc__serving_layout_shards(struct psc__serving *s);

/* Whether one of shards 0..n-1's tasks has not said it holds the latest
 * layout a task named (not heard from, or an older one): a dense lookup
 * whose slices do not fit is asked again then. */
int psc__serving_lagging(struct psc__serving *s, int n);

/* Keeps what shard's task said of its layout (LookupResponse's layout,
 * shards, rows, move_to, moved; shards 0: nothing said). Returns 1 when it
 * was news. */
int psc__serving_learn(struct psc__serving *s, int shard, uint64_t layout,
                       int nshards, int rule, int move_to, int moved);

/* Sets c's layout fields to what the client knows of shard's task (none
 * known: left as they are). */
struct Psd__V1__Caller;
void psc__serving_belief(const struct psc__serving *s, int shard,
                         struct Psd__V1__Caller *c);

/* Asks every shard's task in use once (an empty Lookup, no retry) what it
 * holds; at most every 100 ms. Returns 1 when a word was news. */
int psc__serving_probe(struct psc__serving *s);

/* Builds shard's request of a call, or NULL when out of memory. */
typedef grpc_byte_buffer *(*psc__sv_build)(int shard, void *ctx);
/* Reads shard's OK answer u->response (borrowed); returns 0, or a code
 * with the error set (psc__serving_fail): the call then ends with it. */
typedef int (*psc__sv_read)(int shard, grpc_byte_buffer *response, void *ctx);

/* One call of a client-level operation (named `what` in errors, e.g.
 * "lookup of table 'emb'") to the shards flagged in want[0..nshards):
 * each shard's message built by build and its answer read by read, with
 * failover and retries as the top of this file says. NOT_FOUND answers
 * count as answered when not_found is not NULL (not_found[shard] = 1),
 * else they end the call. */
int psc__serving_call(struct psc__serving *s, const unsigned char *want,
                      const char *what, const char *method, psc__sv_build build,
                      psc__sv_read read, void *ctx, unsigned char *not_found);

/* The dim remembered for table (0: not known yet), and remembering one. */
uint32_t psc__serving_dim_known(const struct psc__serving *s,
                                const char *table);
int psc__serving_dim_keep(struct psc__serving *s, const char *table,
                          uint32_t dim);

/* The Caller every request carries (points into s). */
struct Psd__V1__Caller;
void psc__serving_caller(const struct psc__serving *s,
                         struct Psd__V1__Caller *out);

#endif
