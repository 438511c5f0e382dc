/* A shard's synchronous steps. In sync mode a push does not touch the
 * variables: it stages the worker's gradient for step t. The coordinator
 * decides which workers make step t and sends Commit(t, set) to every shard;
 * each shard then averages exactly those workers' staged gradients, summed
 * in ascending worker order (so the result does not depend on arrival
 * order), applies the optimizer once per variable and moves to version
 * t + 1. Staged gradients of workers left out are dropped. */
#ifndef PSD_STEPS_H
#define PSD_STEPS_H

#include <stddef.h>
#include <stdint.h>

#include "store.h"

/* How many commits the history keeps for status. */
#define PSD_STEPS_HISTORY 4096
#define PSD_STEPS_MAX_WORKERS 256

/* Staging slots of more bytes than this in all (every worker's, every
 * variable's: what a step's commit reads) no longer stay in the caches from
 * a worker's stage to the commit, which comes after every other worker's
 * (with 64 workers of the demo MLP, 30 MB a shard). Past it a gradient is
 * staged with non-temporal stores (no read of the slot's old contents) and
 * the commit fetches each block of the sum ahead of its add: the same
 * arithmetic in the same order, at about 0.7x the CPU per push at 64 workers
 * (tests/bench/steps_bench.c); below it both would cost more than they save,
 * the slots being in the caches. */
#define PSD_STEPS_STREAM_BYTES (16u << 20)

/* One committed step, as status reports it. */
struct psd_step_record {
  uint64_t step;                          /* the step */
  int napplied;                           /* entries in applied */
  int ndropped;                           /* entries in dropped */
  int16_t applied[PSD_STEPS_MAX_WORKERS]; /* worker indices, ascending */
  int16_t dropped[PSD_STEPS_MAX_WORKERS]; /* worker indices, ascending */
};

struct psd_steps;

/* Borrows store. nworkers bounds worker indices. */
int psd_steps_new(struct psd_steps **out, struct psd_store *store,
                  int nworkers);
void psd_steps_free(struct psd_steps *s);

/* Steps committed so far (the shard's version). */
uint64_t psd_steps_version(struct psd_steps *s);

/* Continues a job restored from a checkpoint: `version` steps are already
 * committed. Call before any push or commit. Gradients staged for step
 * `version` before the restart are gone: a commit of that step whose set
 * holds a worker that has staged nothing here since is refused (CM_EINVAL),
 * since the other shards would apply that worker's gradient and this one
 * could not. */
void psd_steps_resume(struct psd_steps *s, uint64_t version);

/* Stages worker's gradient for elements [off, off + n) of v's slice (local
 * numbering) for `step`. Returns 0; CM_ERANGE when step is already
 * committed (the gradient is too late and dropped); CM_EINVAL for a step
 * beyond the open one or a bad worker index (err says which). */
int psd_steps_stage(struct psd_steps *s, int worker, uint64_t step,
                    struct psd_var *v, uint64_t off, const float *g, size_t n,
                    char *err, size_t errlen);

/* Commits `step` with the staged gradients of applied[0..napplied).
 * A commit of the last step committed is acknowledged without effect (the
 * coordinator may retry). Returns 0, or CM_EINVAL for a step beyond the
 * open one or before the last (err says why). */
int psd_steps_commit(struct psd_steps *s, uint64_t step, const int *applied,
                     int napplied, const int *dropped, int ndropped, char *err,
                     size_t errlen);

/* Rolls the steps back to `step` (the job's newest common checkpoint, which
 * the caller has just reloaded into the store): `step` steps are committed,
 * every staged gradient is dropped, the history forgets the commits of
 * `step` and later, and the job's generation becomes gen (the coordinator's
 * count of rollbacks). Clears the resumed state (psd_steps_state). */
void psd_steps_rollback(struct psd_steps *s, uint64_t step, uint64_t gen);

/* The steps' position, read at one instant (a rollback moves all of it at
 * once), for handlers that decide on several fields together. */
struct psd_steps_state {
  uint64_t version;       /* steps committed */
  uint64_t gen;           /* the job's generation: rollbacks so far, as the
                             last Rollback said */
  uint64_t rollback_step; /* the step of the last rollback (0: none) */
  int resumed; /* 1 while this shard runs from a checkpoint it resumed from
                  at start and has not been rolled back since */
};

void psd_steps_state(struct psd_steps *s, struct psd_steps_state *out);

/* The shard's values at one committed step, shared by every sync pull
 * answer that sends them: a step's n pulls send one copy of the values,
 * not one copy each (with many workers those copies outgrow the caches).
 * Reference counted; the answers' slices hold references while gRPC sends
 * them. */
struct psd_steps_snap;

/* A new reference to the snapshot of the shard as it is now (steps
 * committed, generation, every variable declared), made by the first call
 * after a commit, rollback or declaration: one copy of every variable's
 * values, taken under the steps' lock and each variable's. NULL when out
 * of memory (the caller copies for itself). Release it with
 * psd_steps_snap_release. */
struct psd_steps_snap *psd_steps_snap_get(struct psd_steps *s);

/* v's values in the snapshot (v's slice, local numbering; borrowed from
 * sn), and in *version its version there; NULL when v is not in it. */
const float *psd_steps_snap_values(const struct psd_steps_snap *sn,
                                   const struct psd_var *v, uint64_t *version);

/* Adds n references to sn (one per slice that will release one). */
void psd_steps_snap_hold(struct psd_steps_snap *sn, int n);

/* Drops a reference taken by psd_steps_snap_get or _hold; the last frees it. A
 * void * so that it can be a slice's release callback. */
void psd_steps_snap_release(void *sn);

/* How many records psd_steps_history has to give now (at most
 * PSD_STEPS_HISTORY), so that a caller allocates what it copies. */
int psd_steps_recorded(struct psd_steps *s);

/* Copies up to max of the most recent records, oldest first; returns how
 * many. */
int psd_steps_history(struct psd_steps *s, struct psd_step_record *out,
                      int max);

#endif
