/* A live move of buckets, the destination's side (docs/reshard.md "Live
 * moves (the shard side)"): this shard takes a set of buckets' table rows
 * from the shard that owns them while the job trains, then owns them.
 *
 * psd_move_buckets drives it through peer.h's calls of the source's
 * Admin/MoveRows (shard/service_move.c): a first copy of every row of the
 * buckets, installed here (psd_move_install); more copies of the rows
 * changed since while they are large (above 1/16 of the first, at most
 * PSD_MOVE_ROUNDS copies); then the hand-over: the source stops owning the
 * buckets (their sparse calls are answered "layout moved" from then on)
 * and answers with the last changes, keeping its rows; they are installed
 * here and this shard owns the buckets (psd_service_own); then MOVE_DONE
 * tells the source, which adopts the move state and drops its rows (asked
 * up to PSD_MOVE_DONE_TRIES times). With checkpoints on, the rows are
 * written as a move file (ckpt.h) in two parts: the copies' before the
 * hand-over, the hand-over's changes after it and before MOVE_DONE, so
 * that a call refused between the two owners waits on disk for the
 * hand-over's changes alone. Only the hand-over pauses the buckets'
 * writes: the pause, measured from its call to the buckets owned here.
 * Failing before the buckets are owned here (the hand-over refused, its
 * answer lost, its rows not installed), the move is cancelled on the
 * source, which owns every bucket again with its rows intact, and the
 * rows copied here are dropped.
 *
 * Admin/MoveBuckets, to the destination, starts one (psd_move_methods):
 * the orchestrator's call (ps:0, psctl reshard), and the tests'. One at a
 * time per destination; it runs on a thread of its own and answers when
 * the buckets are owned here, or with why not. */
#ifndef PSD_MOVE_H
#define PSD_MOVE_H

#include <stddef.h>
#include <stdint.h>

#include "peer.h"
#include "ps.pb-c.h"
#include "psd.h"
#include "rpc_server.h"

struct psd_service;
struct psd_tables;

/* Most copies before the hand-over. */
#define PSD_MOVE_ROUNDS 8
/* Times MOVE_DONE is asked (100 ms apart) before the source is left with
 * the rows, unused. */
#define PSD_MOVE_DONE_TRIES 5

/* What a move carried (MoveBucketsResponse). */
struct psd_move_result {
  uint64_t rows;       /* rows installed, over every copy */
  uint64_t bytes;      /* row bytes received (MoveRowsResponse.bytes) */
  uint32_t rounds;     /* copies before the hand-over */
  uint64_t pause_us;   /* the hand-over: its call to the buckets owned here */
  uint64_t lag_rows;   /* rows of the hand-over's copy (the last changes) */
  int status;          /* CM_ERPC: the source's gRPC status code */
  double file_ms;      /* writing the move file (ckpt.h), 0 without one */
  double hand_file_ms; /* of which its hand-over part, the set put in place */
  double hand_call_ms; /* the hand-over's MoveRows call (of the pause) */
  double copy_ms;      /* the copies' MoveRows calls (the source's snapshot,
                          its answer's packing and transfer) */
  double install_ms;   /* installing every copy, the hand-over's included */
  double done_ms;      /* MOVE_DONE: the source dropping its rows */
  uint64_t undone;     /* the move's id when the buckets are owned here
                          but MOVE_DONE never reached the source (a link
                          cut past its tries): told at the next move;
                          0 otherwise */
};

/* Installs one MoveRows answer r into ts (the destination's tables; a
 * table it lacks is declared from its MoveTable.spec): each table's rows
 * replace (first copy) or update (delta) the rows of the buckets of set
 * (PSD_MOVE_SET_BYTES bytes, service.h). Every field's length is checked
 * against nrows and the table's dim and state first. *rows grows by the
 * rows written. Returns 0, or CM_EPROTO (a field's length), CM_EEXIST (a
 * table here of another dim or id_bound), CM_EINVAL, CM_ENOMEM, with err
 * naming the table and the field. */
int psd_move_install(struct psd_tables *ts, const Psd__V1__MoveRowsResponse *r,
                     const uint8_t *set, uint64_t *rows, char *err,
                     size_t errlen);

/* Takes the buckets of set from shard `from` through peers (borrowed) into
 * svc's tables, then owns them, adopting the move state (move_to shards
 * after `moved` moves; 0, 0: none); with ckpt (borrowed; NULL: checkpoints
 * are off), writes their rows as a move file (psd_ckpt_move_begin before
 * the hand-over, _add and _finish after it) before the source is told to
 * drop them. *res gets what it carried. Returns 0,
 * or a negative code with err saying why: CM_EINVAL (this shard cannot
 * move, or the request is wrong), CM_EEXIST (a bucket is here already),
 * CM_ERPC (the source refused or could not be called: res->status is its
 * gRPC status, err its words), psd_move_install's codes. */
struct psd_ckpt;
int psd_move_buckets(struct psd_service *svc, struct psd_peers *peers, int self,
                     int from, int nps, const uint8_t *set, int move_to,
                     int moved, struct psd_ckpt *ckpt,
                     struct psd_move_result *res, char *err, size_t errlen);

/* At start, after the checkpoint is restored (startup.c): the live move
 * state this shard goes on with (docs/reshard.md "What a kill does to a
 * live move"): the most moves of its checkpoint, its move files and the
 * other shards' Status (asked once; while this shard's own files say a
 * move was under way, those that do not answer are asked again for
 * PSD_MOVE_START_MS). Its move files past its checkpoint are applied, the
 * rows of the buckets it does not own in that move's map are dropped, and
 * srv->self gets the state (the service owns by it). Returns 0, or a
 * negative code, logged. */
#define PSD_MOVE_START_MS 5000
int psd_move_startup(struct psd_server *srv);

/* A standby shard that holds rows a live move gave it (`how`: by a move
 * now, or found at start): its checkpoints take them from now on, as a
 * shard of the layout's do (psd_ckpt_take_rows, srv->holding), logged.
 * Nothing without checkpoints. */
void psd_move_hold(struct psd_server *srv, const char *how);

/* Drops the table rows of every bucket map gives another shard (at
 * start: a shard keeps only what its layout or move state owns); *owned:
 * the buckets it keeps, *dropped: the rows dropped. Returns 0 or
 * CM_ENOMEM (the rows before are dropped). */
struct cm_layout_map;
int psd_move_keep_owned(struct psd_server *srv, const struct cm_layout_map *map,
                        int *owned, uint64_t *dropped);

/* Tells source `from` (MoveRows MOVE_DONE) that the buckets of set, of
 * move `move`, are owned here: it drops its rows and ends the move (one
 * ended already is answered OK). Returns 0, or CM_ERPC with err saying
 * what the source answered. */
int psd_move_done(struct psd_peers *peers, int from, uint64_t move,
                  const uint8_t *set, int move_to, int moved, char *err,
                  size_t errlen);

struct psd_move;

/* srv's Admin/MoveBuckets handler (srv borrowed, must outlive it).
 * Returns 0 or CM_ENOMEM. */
int psd_move_new(struct psd_move **out, struct psd_server *srv);
/* Waits for a move under way, then frees. */
void psd_move_free(struct psd_move *m);

/* The Admin/MoveBuckets method, to serve beside the others. */
const struct cm_rpc_method *psd_move_methods(struct psd_move *m, int *n);

#endif
