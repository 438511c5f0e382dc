/* Room ps-server/psd/serve/, the serving task: this header and its
 * values-only tables (serve_table.h); serve_internal.h is the room's own.
 * psd.c's main runs it (serve_start.c). Rooms it calls: publish/
 * (pubfile.h, the publications it reads), store/ (rows.h, the storage
 * engine its tables are).
 *
 * A serving task (`psd --task serve:J`, docs/serving.md): no training; it
 * holds the values of training shard J % nps as that shard publishes them
 * (pubfile.h) and answers Serve/Lookup from them, read-only.
 *
 * The follower (serve_follow.c) loads the newest full publication of the
 * shard and the deltas after it, then follows new versions as they appear
 * (psd_serve_poll, every PSD_SERVE_POLL_MS), applying each in place
 * (serve.c): the rows into values-only tables (serve_table.h), the dense
 * variables whole. One table-wide rwlock makes every answer come from one
 * version: a Lookup holds it shared, an apply exclusively, and only while
 * it writes (a publication is read and verified before). A damaged
 * publication, or a version missing from the chain, is refused loudly (an
 * error line naming it, ServingStatus.refused and last_refusal) and the
 * task keeps answering from the last good version until the next full
 * publication, which it loads.
 *
 * The handlers (serve_lookup.c): Serve/Lookup, Admin/Status (with its
 * ServingStatus), and every other call of the proto refused
 * FAILED_PRECONDITION naming it ("serve:0 is a serving task (read-only):
 * Data/Push is refused ..."). */
#ifndef PSD_SERVE_H
#define PSD_SERVE_H

#include <stddef.h>
#include <stdint.h>

#include "request.h"
#include "rpc_server.h"
#include "tabconf.h"

/* How often the follower looks for new publications. */
#define PSD_SERVE_POLL_MS 100

struct psd_serve;
struct psd_pub;
struct cm_spec;

/* What a serving task follows, and how it names itself. */
struct psd_serve_conf {
  const char *dir;     /* the training shard's publications: <publish_dir>/
                          <job>/ps-<shard>; copied */
  const char *job;     /* the job's name (every caller must name it); copied */
  int replica;         /* J of serve:J: its index in cluster.serve */
  int shard;           /* the training shard it serves: J % shards */
  int shards;          /* training shards (cluster.ps) */
  int job_shards;      /* the shards a new job starts on (job.shards): the row
                          map until a publication names its layout */
  double keep_left_ms; /* how long the rows of buckets a live move took
                          from the shard are still answered, so that a
                          client goes on finding them while the serving
                          task of their new shard catches up */
  uint64_t seed;       /* the job's: initial rows of ids never published */
  const struct cm_table_conf *tables;   /* the spec's job.tables (copied): an
                                           id never published is answered
                                           with its table's initial row */
  int ntables;                          /* entries in tables */
  const struct cm_table_conf *defaults; /* job.table_defaults (copied): the
                                           settings of any other table */
  uint64_t max_message; /* largest answer, bytes (job.max_message_mb) */
};

/* A serving task's counters and version, for Status and the log. */
struct psd_serve_state {
  uint64_t version;        /* the version answers reflect; 0: none loaded */
  uint64_t base;           /* the full publication its chain starts at */
  uint64_t step;           /* that version's training step */
  int64_t time_unix_ms;    /* its cut */
  uint64_t newest_seen;    /* the newest version found in the directory */
  uint64_t rows;           /* table rows held */
  uint64_t bytes;          /* memory the tables and dense values hold */
  uint64_t applied;        /* publications applied */
  uint64_t refused;        /* publications refused */
  uint64_t lookups;        /* Lookup calls answered */
  uint64_t errors;         /* calls answered with an error */
  uint64_t layout;         /* the version's layout (docs/serving.md) */
  int shards;              /* its shard count; 0: none loaded */
  int move_to, moved;      /* its live move; 0, 0: none */
  char last_refusal[1024]; /* why the last was refused; "" when none */
};

/* A serving task with nothing loaded. Returns 0 or CM_ENOMEM. */
int psd_serve_new(struct psd_serve **out, const struct psd_serve_conf *c);
void psd_serve_free(struct psd_serve *s);

/* Says who the task is, for the checks of every caller (request.h);
 * borrowed, it must outlive the task. */
void psd_serve_set_self(struct psd_serve *s,
                        const struct cm_request_self *self);
/* The server, for Status's count of unauthenticated calls; borrowed. */
void psd_serve_set_server(struct psd_serve *s, struct cm_server *rpc);

/* Applies publication p (read and verified by psd_pub_read) in place,
 * taking its arrays of dense values (p keeps the rest; free it as usual).
 * A full one replaces everything held; a delta must follow the version
 * held (prev == version, the same base). Returns 0; CM_EFORMAT when it
 * cannot follow what is held, or a table's dim differs (err says how;
 * nothing changed); CM_ENOMEM (then the task holds a partial version
 * and waits for the next full publication). */
int psd_serve_apply(struct psd_serve *s, struct psd_pub *p, char *err,
                    size_t errlen);

/* One look at the directory (serve_follow.c): loads what follows the
 * version held, or, with none held or after a refusal, the newest full
 * publication and the deltas after it. Refusals are logged and counted
 * here. Call from one thread (psd's loop). */
void psd_serve_poll(struct psd_serve *s);

/* The methods a serving task serves (every rpc of the proto: Lookup and
 * Status answered, the rest refused); owned by s. */
const struct cm_rpc_method *psd_serve_methods(struct psd_serve *s, int *n);

void psd_serve_state(struct psd_serve *s, struct psd_serve_state *out);

#endif
