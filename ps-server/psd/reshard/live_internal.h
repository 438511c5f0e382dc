/* live.c and live_plan.c's shared insides (live.h is their API): the
 * handler's state and the plan directory's files. */
#ifndef PSD_LIVE_INTERNAL_H
#define PSD_LIVE_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "live.h"
#include "peer.h"
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
};

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
