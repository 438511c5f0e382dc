/* A live layout switch, the step that ends a live move (docs/reshard.md
 * "Live moves (the shard side)"): once every table bucket is on its shard
 * of the new count M, ps:0 sends Admin/SwitchLayout to every shard of both
 * counts, phase by phase (each to every shard before the next):
 *   FREEZE   the dense calls (Declare, Pull, Push) stop: those in flight
 *            finish, new ones are answered UNAVAILABLE, which clients
 *            retry; sparse calls flow (their buckets are final);
 *            checkpoints and publications wait (store.h's switch gate);
 *   PREPARE  this shard plans each variable's new slice among M (the
 *            offline cut's rule, cm_layout_replace and cm_layout_rows,
 *            through reshard_internal.h's gather), reads the catalog of
 *            every old shard and fetches the rows it will hold from those
 *            that hold them (Admin/DenseRows, answered by frozen shards
 *            only, chunked to job.max_message_mb) into a staged store;
 *   COMMIT   the staged variables replace the old ones, the layout steps
 *            (version + 1, M shards, the row map of M, the move state
 *            none), the dense calls flow again; a shard at index >= M
 *            stands by, holding nothing;
 *   ABORT    (before COMMIT) thaws and drops the staging: nothing changed.
 * A phase already done is answered OK again (the driver may retry); a
 * request whose counts or version disagree with the shard's state, or a
 * switch before every move is made, is refused FAILED_PRECONDITION naming
 * both. FREEZE and PREPARE run on a thread of their own (a checkpoint
 * being written is waited for; PREPARE calls the other shards); COMMIT and
 * ABORT on gRPC's. Async jobs with rows by buckets only. */
#ifndef PSD_SWITCH_H
#define PSD_SWITCH_H

#include "psd.h"
#include "rpc_server.h"

struct psd_switch;

/* srv's Admin/SwitchLayout and Admin/DenseRows handlers (srv borrowed,
 * must outlive it). Returns 0 or CM_ENOMEM. */
int psd_switch_new(struct psd_switch **out, struct psd_server *srv);
/* Waits for a phase under way, drops any staging, then frees. */
void psd_switch_free(struct psd_switch *w);

/* The two methods, to serve beside the others. */
const struct cm_rpc_method *psd_switch_methods(struct psd_switch *w, int *n);

/* ---- On disk (switch_disk.c: a switch that survives a kill) ---- */

/* PREPARE: writes the staged store (borrowed) of layout `layout` of `to`
 * shards under this shard's switch-L<layout>/ (nothing without
 * checkpoints). Returns 0 or an error code (err: path and why): PREPARE
 * then fails, and ps:0 aborts the switch. */
struct psd_store;
int psd_switch_stage_write(struct psd_server *srv, struct psd_store *staged,
                           int to, uint64_t layout, char *err, size_t errlen);

/* ps:0, before the first COMMIT: records the decision to commit layout
 * `layout` (from -> to shards) as ps:0's switch-L<layout>.commit, fsynced.
 * Returns 0 or CM_EIO (err): ps:0 then aborts instead. */
int psd_switch_decide(struct psd_server *srv, int from, int to, uint64_t layout,
                      char *err, size_t errlen);

/* (A checkpoint of the layout removes its staging and decision files:
 * ckpt's psd__ckpt_move_prune.) */

/* A switch this shard staged and did not checkpoint, found at start. */
struct psd_switch_found {
  int found;       /* 1: resume into it */
  uint64_t layout; /* its layout */
  int to;          /* of this many shards */
};

/* At start, before the checkpoint is opened (srv->root set, srv->layout
 * the job's by its checkpoints, own_layout this shard's own checkpoint's,
 * 0 when it has none): the newest switch-L<X>/ past own_layout in this
 * shard's directory. Committed (ps:0's decision file, or srv->layout >= X):
 * *f says to resume into it. Else, or staging that does not read, it is
 * removed and logged. Returns 0. */
int psd_switch_startup(struct psd_server *srv, uint64_t own_layout,
                       struct psd_switch_found *f);

/* ABORT (by ps:0's call, or by the shard's own watch): removes this
 * shard's staging of `layout` from disk, if any. */
void psd_switch_stage_drop(struct psd_server *srv, uint64_t layout);

/* ps:0 resumed into a switch at start (srv->switched_layout): on a thread
 * of its own, sends the switch's COMMIT to every other shard of both
 * counts (each answers it done, or commits its staging: one frozen since
 * ps:0's last process decided), asking those that do not answer again for
 * up to 120 s, and logs the outcome. Other shards: nothing. */
void psd_switch_finish(struct psd_server *srv);

/* Loads the variables f stages into a new store (*out, the caller's; NULL
 * when it holds none). Returns 0 or an error code (logged). */
int psd_switch_load(struct psd_server *srv, const struct psd_switch_found *f,
                    struct psd_store **out);

#endif
