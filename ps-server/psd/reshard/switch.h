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

#endif
