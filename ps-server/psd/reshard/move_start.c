/* A live move at start (move.h, psd_move_startup; docs/reshard.md "What a
 * kill does to a live move"): a shard killed during or after a live move
 * finds the move's state again before it serves. Its checkpoint records
 * the moves it had adopted ("move"), its move files the moves whose rows
 * it received since, and the other shards, asked for their Status, the
 * moves they adopted: the most of them all is the job's, K. The move
 * files past the checkpoint are applied, and this shard owns the buckets
 * cm_layout_map_moving gives it after K moves, dropping the rows of the
 * others (a source restarted from a checkpoint taken before it gave them
 * away). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt.h"
#include "clock.h"
#include "err.h"
#include "layout.h"
#include "log.h"
#include "move.h"
#include "peer.h"
#include "rpc.h"
#include "table.h"
#include "tables.h"

/* Each Status call's deadline, and the pause before asking again. */
#define STATUS_MS 1000
#define RETRY_MS 100

/* What the other shards say of the move (those of this layout). */
struct heard {
  int to, moved; /* the most moves any adopted, and their count */
  int missing;   /* shards that did not answer */
  int first;     /* the first of them, -1: none */
};

/* Asks every other shard of the spec for its Status, once, or again for
 * PSD_MOVE_START_MS while some do not answer and `wait`. */
static int ask(struct psd_server *srv, int wait, struct heard *h) {
  int nps = srv->spec->nps, rc = 0, said = 0;
  struct psd_peers *peers = NULL;
  struct cm_unary *calls = calloc((size_t)nps + 1, sizeof *calls);
  int *done = calloc((size_t)nps + 1, sizeof *done);
  char err[600];
  double until = cm_mono_ms() + PSD_MOVE_START_MS;
  *h = (struct heard){.first = -1};
  if (!calls || !done) {
    rc = CM_ENOMEM;
    goto out;
  }
  if ((rc = psd_peers_new(
           &peers, srv->spec,
           &(struct psd_peer_opts){.who = "starting shard", .fresh = 1}, err,
           sizeof err))) {
    cm_warn("live move: cannot call the other shards (%s): going on with "
            "this shard's own files",
            err);
    rc = 0;
    goto out;
  }
  done[srv->shard] = 1;
  Psd__V1__Caller caller = psd_peer_caller(peers);
  Psd__V1__StatusRequest req = PSD__V1__STATUS_REQUEST__INIT;
  req.caller = &caller;
  for (;;) {
    int k = psd_peer_call_all(peers, nps, calls, done, "/psd.v1.Admin/Status",
                              &req.base, STATUS_MS, 0);
    for (int i = 0; i < k; i++) {
      int s = (int)(intptr_t)calls[i].user;
      Psd__V1__StatusResponse *r = NULL;
      if (calls[i].status == GRPC_STATUS_OK)
        r = (Psd__V1__StatusResponse *)cm_rpc_unpack(
            calls[i].response, &psd__v1__status_response__descriptor);
      cm_unary_release(&calls[i]);
      if (!r)
        continue;
      done[s] = 1;
      /* Another layout's state is not this one's move (a switch). */
      if (r->layout == srv->layout && r->move_to && (int)r->moved >= h->moved) {
        h->to = (int)r->move_to;
        h->moved = (int)r->moved;
      }
      protobuf_c_message_free_unpacked(&r->base, NULL);
    }
    h->missing = 0;
    h->first = -1;
    for (int s = 0; s < nps; s++)
      if (!done[s] && !h->missing++)
        h->first = s;
    if (!h->missing || !wait || cm_mono_ms() >= until)
      break;
    if (!said++)
      cm_info("live move: this shard's files say a move was under way; "
              "waiting up to %d ms for ps:%d and %d other shard%s to answer "
              "before serving, to learn the job's moves",
              PSD_MOVE_START_MS, h->first, h->missing - 1,
              h->missing == 2 ? "" : "s");
    usleep(RETRY_MS * 1000);
  }
out:
  psd_peers_free(peers);
  free(calls);
  free(done);
  return rc;
}

/* Tells every other shard that this one started again (MoveRows
 * MOVE_CANCEL of move 0 naming it as destination, with the move its disk
 * holds: `to` shards after k moves): a move of which its last process was
 * the destination, open on a source, is ended there (cancelled, or done
 * when k says a move file holds it: shard/service_move.c), so that no
 * bucket is left without an owner. A source busy with that move's call
 * is asked again for up to TELL_MS; one not reached is left (it started
 * again itself, and its open moves went with its process). */
#define TELL_MS 3000
static void tell_restarted(struct psd_server *srv, int to, int k) {
  int nps = srv->spec->nps;
  struct psd_peers *peers = NULL;
  struct cm_unary *calls = calloc((size_t)nps + 1, sizeof *calls);
  int *done = calloc((size_t)nps + 1, sizeof *done);
  uint8_t none[CM_LAYOUT_BUCKETS / 8] = {0};
  double until = cm_mono_ms() + TELL_MS;
  char err[600];
  if (!calls || !done ||
      psd_peers_new(
          &peers, srv->spec,
          &(struct psd_peer_opts){.who = "starting shard", .fresh = 1}, err,
          sizeof err))
    goto out;
  done[srv->shard] = 1;
  Psd__V1__Caller caller = psd_peer_caller(peers);
  Psd__V1__MoveRowsRequest req = PSD__V1__MOVE_ROWS_REQUEST__INIT;
  req.caller = &caller;
  req.buckets = (ProtobufCBinaryData){sizeof none, none};
  req.phase = PSD__V1__MOVE_PHASE__MOVE_CANCEL;
  req.move = 0;
  req.move_to = (uint32_t)to;
  req.moved = (uint32_t)k;
  req.destination = (uint32_t)srv->shard + 1;
  for (int left = 1; left && cm_mono_ms() < until;) {
    int n = psd_peer_call_all(peers, nps, calls, done, "/psd.v1.Admin/MoveRows",
                              &req.base, STATUS_MS, 0);
    left = 0;
    for (int i = 0; i < n; i++) {
      int s = (int)(intptr_t)calls[i].user;
      if (calls[i].status == GRPC_STATUS_ABORTED)
        left = 1; /* busy with that move's call: again */
      else
        done[s] = 1;
      cm_unary_release(&calls[i]);
    }
    if (left)
      usleep(RETRY_MS * 1000);
  }
out:
  psd_peers_free(peers);
  free(calls);
  free(done);
}

/* A destination killed after its move file and before its MOVE_DONE
 * reached the source left that move open there (handed over, its rows
 * kept), which refuses any other move. The newest move file's source is
 * told now that the buckets are owned here; a move it ended already, or
 * one it does not hold, is no failure (logged). */
static void finish_last(struct psd_server *srv, int to) {
  struct psd_ckpt_move mv;
  struct psd_peers *peers = NULL;
  char err[1200];
  int rc = psd_ckpt_move_last(srv->ckpt, to, &mv, err, sizeof err);
  if (rc == CM_ENOENT)
    return;
  if (rc || !mv.id || mv.from < 0 || mv.from == srv->shard) {
    if (rc)
      cm_warn("live move: %s", err);
    return;
  }
  if (psd_peers_new(
          &peers, srv->spec,
          &(struct psd_peer_opts){.who = "starting shard", .fresh = 1}, err,
          sizeof err)) {
    cm_warn("live move: cannot call ps:%d to end move %016" PRIx64 " (%s)",
            mv.from, mv.id, err);
    return;
  }
  if (psd_move_done(peers, mv.from, mv.id, mv.set, to, mv.moved, err,
                    sizeof err))
    cm_info("live move: ps:%d did not end move %016" PRIx64 " (its buckets "
            "are owned here from this shard's move file): %s",
            mv.from, mv.id, err);
  else
    cm_info("live move: told ps:%d that move %016" PRIx64 "'s buckets are "
            "owned here (its move file): it drops its copy and ends the "
            "move, if it had not",
            mv.from, mv.id);
  psd_peers_free(peers);
}

int psd_move_keep_owned(struct psd_server *srv, const struct cm_layout_map *map,
                        int *owned, uint64_t *dropped) {
  uint8_t gone[PSD_MOVE_SET_BYTES] = {0};
  int any = 0;
  *owned = 0;
  *dropped = 0;
  for (unsigned b = 0; b < CM_LAYOUT_BUCKETS; b++) {
    if (map->shard[b] == srv->shard) {
      (*owned)++;
    } else {
      gone[b >> 3] |= (uint8_t)(1u << (b & 7));
      any = 1;
    }
  }
  for (int i = 0; any && srv->tables && i < psd_tables_count(srv->tables);
       i++) {
    uint64_t d = 0;
    if (psd_table_drop_buckets(psd_tables_at(srv->tables, i), gone, &d))
      return CM_ENOMEM;
    *dropped += d;
  }
  return 0;
}

int psd_move_startup(struct psd_server *srv) {
  struct heard h;
  struct cm_layout_map *map = NULL;
  uint64_t applied_rows = 0, dropped = 0;
  char err[1400];
  int file_k = 0, files = 0, rc = 0, owned = 0, nmoves;
  int own_to = srv->resume.move_to, own_k = srv->resume.moved;

  if (!srv->root[0] || srv->rows == CM_LAYOUT_RULE_MODULO ||
      strcmp(srv->spec->job.mode, "async"))
    return 0;
  if (srv->ckpt && (rc = psd_ckpt_move_newest(srv->ckpt, &file_k)))
    goto out;
  /* Only a job with tables moves (psd_service_movable): a shard that has
   * none (from the spec or its checkpoint) and no move state asks no one,
   * so a dense job starts as it did (no channels made to its peers). */
  if (!own_k && !file_k && (!srv->tables || psd_tables_count(srv->tables) == 0))
    goto out;
  if ((rc = ask(srv, own_k > 0 || file_k > 0, &h)))
    goto out;
  int to = own_to ? own_to : h.to, k = own_k;
  /* Nobody else names the move: a destination killed before its source
   * heard MOVE_DONE (the source adopts the move's state then). Its newest
   * move file says where the move goes. */
  if (!to && file_k) {
    struct psd_ckpt_move mv;
    if (!psd_ckpt_move_last(srv->ckpt, 0, &mv, err, sizeof err))
      to = mv.to;
  }
  if (file_k > k)
    k = file_k;
  if (h.to == to && h.moved > k)
    k = h.moved;
  if (!to && file_k) {
    cm_error("cannot resume: %s holds move files (up to %d moves) but "
             "neither its checkpoint nor any shard that answered names the "
             "move's shard count; start the other shards, then this one",
             psd_ckpt_dir(srv->ckpt), file_k);
    rc = CM_EEXIST;
    goto out;
  }
  if (h.missing && (own_k || file_k))
    cm_warn("live move: ps:%d and %d other shard%s did not answer within "
            "%d ms: going on with %d moves (this shard's files and those "
            "that answered)",
            h.first, h.missing - 1, h.missing == 2 ? "" : "s",
            PSD_MOVE_START_MS, k);
  tell_restarted(srv, to, k);
  if (!to || !k)
    goto out;
  /* The move files past the checkpoint, in order of their moves. */
  if (srv->ckpt && (rc = psd_ckpt_move_apply(srv->ckpt, to, own_k, k, &files,
                                             &applied_rows, err, sizeof err))) {
    cm_error("cannot resume the live move: %s", err);
    goto out;
  }
  if (!(map = malloc(sizeof *map))) {
    rc = CM_ENOMEM;
    goto out;
  }
  nmoves = cm_layout_map_moving(map, srv->nshards, to, k);
  if ((rc = psd_move_keep_owned(srv, map, &owned, &dropped))) {
    cm_error("cannot resume the live move: out of memory dropping rows");
    goto out;
  }
  srv->self.move_to = to;
  srv->self.moved = k;
  /* A standby shard that owns buckets holds their rows (startup.c holds
   * them once a switch resumed into leaves it standing by). */
  srv->holding = srv->standby && owned > 0;
  if (srv->ckpt)
    finish_last(srv, to);
  cm_info("live move: ps:%d goes on with the move from %d to %d shards "
          "after %d of %d moves (its checkpoint %d, its move files %d, the "
          "other shards %d): owns %d buckets; %d move file%s applied (%llu "
          "rows), %llu rows of buckets owned elsewhere dropped",
          srv->shard, srv->nshards, to, k, nmoves, own_k, file_k, h.moved,
          owned, files, files == 1 ? "" : "s", (unsigned long long)applied_rows,
          (unsigned long long)dropped);
out:
  free(map);
  return rc;
}
