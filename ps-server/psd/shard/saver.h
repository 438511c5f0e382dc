/* When a shard checkpoints (ckpt.h says how): every N steps or seconds from
 * the spec, on demand (Admin.Checkpoint, served here), and once more at
 * exit. One thread of its own writes, so no gRPC handler waits on the disk.
 *
 * A shard's step: in sync mode the steps committed (steps.h), in async mode
 * the pushes this shard has applied since the job began (restored from the
 * checkpoint, counted here).
 *
 * Consistency. Sync: a checkpoint is taken between two commits and holds
 * every variable at exactly that step; commits wait while it is written
 * (psd_saver_commit_begin), while pulls, staged pushes and admissions go
 * on. A periodic one is taken right after the commit that makes the step a
 * multiple of every_steps, so every shard writes the same step. The table
 * of applied pushes is not saved (ckpt.h says why). Async: the variables
 * and the table of applied pushes (dedup.h) are taken with the table's
 * apply gate frozen, so the checkpoint is one instant of the whole shard:
 * each push message is in it entirely, with its record in the table, or
 * not at all. Pushes wait while the variables are copied or written into
 * the page cache, not while the file is fsynced. */
#ifndef PSD_SAVER_H
#define PSD_SAVER_H

#include <stdint.h>

#include "ckpt.h"
#include "rpc_server.h"
#include "steps.h"
#include "store.h"

/* What the saver works on (all borrowed; they must outlive it). */
struct cm_request_self; /* request.h */

struct psd_saver_opts {
  struct psd_ckpt *ckpt;   /* NULL: checkpoints are off (the RPC says so) */
  const int *standby;      /* 1 while the shard stands by: it writes none
                              and says checkpoints are off (read
                              atomically; a layout switch changes it), or
                              NULL */
  const int *holding;      /* 1 while a standby shard holds rows a live
                              move gave it: it writes (read atomically),
                              or NULL */
  struct psd_store *store; /* the shard's variables */
  struct psd_steps *steps; /* sync mode's steps, NULL in async mode */
  struct psd_dedup *dedup; /* async: the service's table of applied pushes,
                              saved with the values; ignored in sync mode */
  const char *job;         /* the job callers must name (copied) */
  int every_steps;         /* checkpoint every N steps, 0 = never */
  double every_s;          /* checkpoint every S seconds, 0 = never */
  uint64_t step;           /* async: pushes applied before (restored) */
  const struct psd_ckpt_result *resumed; /* the checkpoint restored, or NULL;
                                            status shows it until the next */
  const struct cm_request_self *self;    /* checked against every caller
                                            (request.h), or NULL; borrowed */
};

/* How many checkpoint steps status lists. */
#define PSD_SAVER_LISTED 32

/* The last checkpoint written or attempted, for status. */
struct psd_saver_state {
  int on;           /* checkpoints are on */
  char dir[1024];   /* the shard's checkpoint directory, "" when off */
  uint64_t written; /* checkpoints written since start */
  uint64_t failed;  /* writes that failed since start */
  uint64_t step;    /* step of the last one written (or resumed from) */
  char path[1100];  /* its directory, "" when none yet */
  uint64_t bytes;   /* its size */
  double ms;        /* how long it took */
  char error[512];  /* the last failure, "" when the last write worked */
  uint64_t steps[PSD_SAVER_LISTED]; /* checkpoints on disk, newest first */
  int nsteps;                       /* entries in steps */
};

struct psd_saver;

int psd_saver_new(struct psd_saver **out, const struct psd_saver_opts *o);

/* Starts the writing thread (nothing to start when checkpoints are off). */
int psd_saver_start(struct psd_saver *s);

/* The methods it serves: /psd.v1.Admin/Checkpoint (owned by s). */
const struct cm_rpc_method *psd_saver_methods(struct psd_saver *s, int *n);

/* Async: one push was applied. Starts a checkpoint every every_steps. */
void psd_saver_pushed(struct psd_saver *s);

/* Asks for a checkpoint now, not waiting for it (a layout switch's
 * COMMIT: the new layout on disk soon); nothing when checkpoints are off
 * or the shard stands by. `why` (a literal) is logged. */
void psd_saver_request(struct psd_saver *s, const char *why);

/* Sync: brackets a commit. begin waits while a checkpoint is being written;
 * end (given the steps committed now) starts a periodic one when due and
 * holds later commits until it is written. */
void psd_saver_commit_begin(struct psd_saver *s);
void psd_saver_commit_end(struct psd_saver *s, uint64_t version, int cut);

/* Sync, on the coordinator's shard: how a Checkpoint call with `job` set
 * names the step of a cut (psd_coord_cut, ctx the coordinator; borrowed).
 * A cut: the commit of that step carries `checkpoint` (commit_end's cut),
 * so every shard writes the same step. */
void psd_saver_set_cut(struct psd_saver *s,
                       int (*cut)(void *ctx, uint64_t *step, char *err,
                                  size_t len),
                       void *ctx);

/* Sync: rolls this shard back to `step`, generation gen (the coordinator's
 * Rollback): reloads its checkpoint of that step into the store in place
 * (psd_ckpt_restore) and rolls the steps back (psd_steps_rollback), with
 * commits and checkpoint writes held. Returns 0, or CM_ENOENT when
 * checkpoints are off or there is no checkpoint of that step, another code
 * when it does not load; err says why, and nothing changed. */
int psd_saver_rollback(struct psd_saver *s, uint64_t step, uint64_t gen,
                       char *err, size_t errlen);

/* The shard's step now. */
uint64_t psd_saver_step(struct psd_saver *s);

void psd_saver_state(struct psd_saver *s, struct psd_saver_state *st);

/* Lets the write in progress finish, answers every Checkpoint call still
 * waiting (UNAVAILABLE for those whose write had not started) and refuses
 * new ones; joins the thread. Call before stopping the gRPC server. */
void psd_saver_stop(struct psd_saver *s);

/* The checkpoint at exit, written on the caller's thread once nothing else
 * runs (after the gRPC server stopped). Returns 0 with *res filled, 1 when
 * checkpoints are off (nothing written), or the error (err says what). */
int psd_saver_final(struct psd_saver *s, struct psd_ckpt_result *res, char *err,
                    size_t errlen);

void psd_saver_free(struct psd_saver *s);

#endif
