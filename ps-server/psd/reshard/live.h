/* A live reshard: the job's shard count changed while its workers keep
 * running (psctl reshard --shards M; docs/reshard.md "Live").
 *
 * ps:0 takes Admin/Reshard, checks it (the count, the checkpoint dir, no
 * other reshard under way, every shard of the old and the new layout
 * reachable and of one layout), writes the plan <root>/.live-<job>-L<V>/
 * (V: the new layout's version), tells every other shard of both layouts
 * to stop for it (Reshard with prepare), answers, and stops as SIGTERM
 * would. Every shard stops so: new calls are answered UNAVAILABLE (workers
 * retry them), calls in flight finish, the final checkpoint is written; so
 * it holds every push the shard acknowledged. Each then leaves a mark in
 * the plan (ps-I: stopped, or its final checkpoint failed) and:
 *   - ps:0 waits for the marks of the old layout's shards, cuts their
 *     checkpoints onto M shards (psd --reshard's code, reshard.h: checked,
 *     then swapped in whole, the layout version one more), and writes the
 *     plan's result: done, or aborted with why (the old layout stands);
 *   - the others wait for that result.
 * Then every shard executes itself again (same pid, same command line) and
 * starts as any shard does: from the layout its checkpoint directory
 * holds, standing by when outside it. Workers' calls then reach shards of
 * the new layout, are answered "layout moved", and the client re-plans.
 *
 * Killed at any point (kill -9), a shard restarted finds the plan without a
 * result: ps:0 writes "interrupted" (the directory holds the old layout or
 * the new one, whole), any other shard marks itself restarted and waits for
 * the result; so no shard ever serves a layout the directory does not hold.
 *
 * Or, asked for a live move (ReshardRequest.how, psctl reshard --moves: an
 * async job with rows by buckets and tables), ps:0 moves the table rows
 * while everyone trains (live_move.c): it checks (the count, no reshard
 * under way, every shard of both counts answering in ps:0's layout, the
 * buckets each owns as the move state says), answers with the plan, then
 * on a thread of its own sends each batch of cm_layout_moves's buckets
 * (one source and destination, at most `batch` buckets) to its
 * destination (Admin/MoveBuckets, reshard/move.h), and last the switch
 * (Admin/SwitchLayout: FREEZE, PREPARE, COMMIT to every shard; ABORT on a
 * failure before COMMIT). A failed batch, a --cancel or a failed switch
 * stops it with every bucket on one owner; asked again, it resumes from
 * the move state the shards hold. Its result is the reshard note; its
 * figures Status's move. */
#ifndef PSD_LIVE_H
#define PSD_LIVE_H

#include <stddef.h>
#include <stdint.h>

#include "ps.pb-c.h"
#include "psd.h"
#include "rpc_server.h"

struct psd_live;

/* The environment variable a re-executed ps:0 finds its joined workers in
 * (psd_coord_adopt); set only when the reshard stopped between two steps. */
#define PSD_LIVE_MEMBERS_ENV "PSD_RESHARD_MEMBERS"

/* Creates srv's live-reshard handler (srv borrowed, must outlive it; its
 * loop initialised); last: the last reshard's result (psd_live_startup),
 * for Status. Returns 0 or CM_ENOMEM. */
int psd_live_new(struct psd_live **out, struct psd_server *srv,
                 const char *last);
void psd_live_free(struct psd_live *l);

/* The Admin/Reshard method, to serve beside the others. */
const struct cm_rpc_method *psd_live_methods(struct psd_live *l, int *n);

/* The reshard under way or the last one, in words, into buf ("" when none):
 * StatusResponse.reshard. */
void psd_live_note(void *live, char *buf, size_t len);

/* ps:0's figures of the live move it drives or drove last into *out
 * (StatusResponse.move): 1, or 0 when it has driven none since it started
 * (psd_service_set_move_status's fill). */
int psd_live_move_status(void *live, Psd__V1__MoveStatus *out);

/* Stops ps:0's live move after its batch under way (as psctl reshard
 * --cancel does), and waits for its thread: psd stopping. Nothing when
 * none runs. */
void psd_live_stop_move(struct psd_live *l);

/* At start, before the layout is read from root (the checkpoint root; NULL
 * when checkpoints are off): a plan left without a result is finished
 * (ps:0: "interrupted") or waited for (the others); the last result found
 * goes into last[0..lastlen). Returns 0, or CM_EIO when the plan cannot be
 * written (logged). */
int psd_live_startup(struct psd_server *srv, const char *root, char *last,
                     size_t lastlen);

/* Whether a reshard stopped this shard (then psd_live_finish follows the
 * graceful stop instead of exiting). */
int psd_live_pending(const struct psd_live *l);

/* After the graceful stop (rc: its exit status, the final checkpoint's):
 * marks the plan, cuts (ps:0) or waits, then executes psd again with argv.
 * Returns only when that fails: PSD_EXIT_FAILED (logged). */
enum psd_exit psd_live_finish(struct psd_live *l, enum psd_exit rc,
                              char **argv);

#endif
