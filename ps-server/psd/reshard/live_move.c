/* ps:0's driver of a whole live move (live.h; docs/reshard.md "Live: psctl
 * reshard"): psctl reshard --shards M --moves on an async job whose rows
 * are placed by buckets. ps:0 checks the request (the count, no reshard
 * under way, every shard of both counts answering in ps:0's layout, the
 * buckets each owns as the job's move state says), answers with the plan
 * in words, then on a thread of its own (never gRPC's or the loop's):
 *   - each batch of cm_layout_moves(N, M) not made yet, a run of moves
 *     between one source and one destination of at most `batch` buckets,
 *     is one Admin/MoveBuckets to its destination (reshard/move.c), with
 *     the move state after it (move_to M, moved K); with a rate, ps:0
 *     waits between batches to keep the bytes moved per second under it;
 *   - once every bucket is on its shard of M, the switch: SwitchLayout
 *     FREEZE, PREPARE, COMMIT to every shard of max(N, M) in turn, and
 *     ABORT to each on a failure before COMMIT.
 * A failed batch (its destination cancelled it on the source), a cancel
 * (psctl reshard --cancel, or ps:0 stopping) or a failed switch stops the
 * move: every bucket has one owner, and the job trains partly moved.
 * Asked again, the move resumes from the move state the shards hold (the
 * most moves any of them adopted). The result is the reshard note
 * (Status.reshard, "last: done: ..." or "last: stopped: ..."); the figures
 * are Status.move. */
#include "live_internal.h"

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "err.h"
#include "layout.h"
#include "log.h"
#include "move.h"
#include "rpc.h"
#include "rpc_client.h"
#include "rpc_server.h"
#include "service.h"
#include "spec.h"
#include "switch.h"
#include "tables.h"

#define BATCH_MOST 256 /* buckets a derived batch holds at most */
#define BATCH_ROWS                                                             \
  16384.0                      /* rows a derived batch holds at most (of the   \
                                  fullest source, by its rows per bucket) */
#define BUCKETS_CALL_MS 600000 /* one MoveBuckets's deadline: its copies */
#define SWITCH_CALL_MS 120000  /* one SwitchLayout's (PREPARE fetches) */
#define COMMIT_RETRY_MS 120000 /* a COMMIT is sent again to a shard down */
#define COMMIT_RETRY_EVERY_MS 200
#define RATE_WINDOW 8 /* bytes_per_s: over this many last batches */

/* One move, as its thread runs it. */
struct run {
  struct psd_live *l; /* borrowed */
  int from, to;       /* the shard counts */
  int most;           /* the larger: the shards the switch goes to */
  int start;          /* bucket moves made when it began */
  int total;          /* cm_layout_moves(from, to) */
  int batch;          /* buckets per MoveBuckets at most */
  double rate;        /* MB/s at most, 0: no limit */
  uint64_t layout;    /* the version the switch makes */
};

int psd__live_movable(struct psd_live *l, char *msg, size_t len) {
  struct psd_server *srv = l->srv;
  int rc = psd_service_movable(srv->service, msg, len);
  if (!rc && !psd_tables_count(psd_service_tables(srv->service))) {
    snprintf(msg, len, "the job has no embedding table: no rows to move");
    rc = CM_EINVAL;
  }
  return rc;
}

int psd__live_self_view(struct psd_live *l, struct psd__live_view *v) {
  struct psd_server *srv = l->srv;
  const struct cm_rpc_method *ms, *status = NULL;
  Psd__V1__Caller caller = PSD__V1__CALLER__INIT;
  Psd__V1__StatusRequest req = PSD__V1__STATUS_REQUEST__INIT;
  Psd__V1__StatusResponse *r = NULL;
  struct cm_rpc_answer ans;
  grpc_byte_buffer *bb = NULL;
  int n, rc = CM_EPROTO;
  memset(&ans, 0, sizeof ans);
  ms = psd_service_methods(srv->service, &n);
  for (int i = 0; i < n; i++)
    if (!strcmp(ms[i].path, "/psd.v1.Admin/Status"))
      status = &ms[i];
  if (l->peers)
    caller = psd_peer_caller(l->peers);
  else
    caller.job = srv->spec->job.name;
  req.caller = &caller;
  if (!status || !(bb = cm_rpc_pack(&req.base)) ||
      (rc = cm_rpc_call_local(status, bb, &ans)))
    goto out;
  rc = CM_EPROTO;
  if (ans.answered && ans.status == GRPC_STATUS_OK &&
      (r = (Psd__V1__StatusResponse *)cm_rpc_unpack(
           ans.response, &psd__v1__status_response__descriptor))) {
    psd__live_view_of(r, v);
    rc = 0;
  }
out:
  if (r)
    psd__v1__status_response__free_unpacked(r, NULL);
  cm_rpc_answer_release(&ans);
  if (bb)
    grpc_byte_buffer_destroy(bb);
  return rc;
}

int psd__live_move_state(const struct psd__live_view *views, int n, int *to,
                         int *moved, char *msg, size_t len) {
  int first = -1;
  *to = *moved = 0;
  for (int s = 0; s < n; s++) {
    if (!views[s].move_to)
      continue;
    if (*to && views[s].move_to != *to) {
      snprintf(msg, len,
               "ps:%d holds a live move to %d shards and ps:%d one to %d: the "
               "shards disagree on the job's move; nothing changed",
               first, *to, s, views[s].move_to);
      return -1;
    }
    if (first < 0)
      first = s;
    *to = views[s].move_to;
    if (views[s].moved > *moved)
      *moved = views[s].moved;
  }
  return 0;
}

/* ---- the figures and the note ---- */

int psd_live_move_status(void *live, Psd__V1__MoveStatus *out) {
  struct psd_live *l = live;
  int said;
  pthread_mutex_lock(&l->lock);
  said = l->move_said;
  if (said) {
    *out = l->fig;
    if (l->moving)
      out->elapsed_s = (cm_mono_ms() - l->move_since) / 1000;
  }
  pthread_mutex_unlock(&l->lock);
  return said;
}

/* The move's end: its result as the note (and the log), not running. */
static void finish(struct psd_live *l, int ok, const char *res) {
  if (ok)
    cm_info("live move: %s", res);
  else
    cm_warn("live move: %s", res);
  pthread_mutex_lock(&l->lock);
  snprintf(l->note, sizeof l->note, "last: %s", res);
  l->fig.running = 0;
  l->fig.elapsed_s = (cm_mono_ms() - l->move_since) / 1000;
  l->moving = 0;
  pthread_mutex_unlock(&l->lock);
}

/* Waits ms, or less when the move is cancelled (or psd stops). Returns
 * whether it was. */
static int nap(struct psd_live *l, double ms) {
  struct timespec until;
  int cancel;
  clock_gettime(CLOCK_MONOTONIC, &until);
  until.tv_sec += (time_t)(ms / 1000);
  until.tv_nsec += (long)(fmod(ms, 1000) * 1e6);
  if (until.tv_nsec >= 1000000000L) {
    until.tv_sec++;
    until.tv_nsec -= 1000000000L;
  }
  pthread_mutex_lock(&l->lock);
  while (!l->move_cancel &&
         pthread_cond_timedwait(&l->move_wake, &l->lock, &until) == 0)
    ;
  cancel = l->move_cancel;
  pthread_mutex_unlock(&l->lock);
  return cancel;
}

static int cancelled(struct psd_live *l) {
  int c;
  pthread_mutex_lock(&l->lock);
  c = l->move_cancel;
  pthread_mutex_unlock(&l->lock);
  return c;
}

/* ---- the batches ---- */

/* One batch: MoveBuckets to dst of the buckets of set from src, the move
 * state after it (to shards after moved moves). Returns the answer (free
 * it), or NULL with why said. */
static Psd__V1__MoveBucketsResponse *batch(struct psd_live *l, int src, int dst,
                                           const uint8_t *set, int to,
                                           int moved, char *why, size_t len) {
  Psd__V1__Caller caller = psd_peer_caller(l->peers);
  Psd__V1__MoveBucketsRequest req = PSD__V1__MOVE_BUCKETS_REQUEST__INIT;
  Psd__V1__MoveBucketsResponse *r = NULL;
  struct cm_unary u;
  req.caller = &caller;
  req.from = src;
  req.buckets = (ProtobufCBinaryData){PSD_MOVE_SET_BYTES, (uint8_t *)set};
  req.move_to = (uint32_t)to;
  req.moved = (uint32_t)moved;
  /* Not waiting for a channel: a destination that is down fails the batch
   * now, not after the deadline of its copies. */
  psd_peer_call(l->peers, dst, "/psd.v1.Admin/MoveBuckets", &req.base,
                BUCKETS_CALL_MS, 0, &u);
  if (u.status != GRPC_STATUS_OK)
    snprintf(why, len, "%s: %.400s", cm_rpc_status_name(u.status), u.details);
  else if (!(r = (Psd__V1__MoveBucketsResponse *)cm_rpc_unpack(
                 u.response, &psd__v1__move_buckets_response__descriptor)))
    snprintf(why, len, "the answer is not a MoveBucketsResponse");
  cm_unary_release(&u);
  return r;
}

/* The batches a move of `total` moves makes from move k on, batch buckets
 * at most each (a run of moves between one source and one destination). */
static int count_batches(const uint16_t *mv, int k, int total, int b,
                         const struct cm_layout_map *a,
                         const struct cm_layout_map *z) {
  int n = 0;
  while (k < total) {
    int j = k;
    while (j < total && j - k < b && a->shard[mv[j]] == a->shard[mv[k]] &&
           z->shard[mv[j]] == z->shard[mv[k]])
      j++;
    n++;
    k = j;
  }
  return n;
}

/* ---- the switch ---- */

/* One phase of the switch to every shard of r->most at once (a PREPARE's
 * fetches run side by side, not one shard after another), but those whose
 * done[s] is set (NULL: none); each that answers OK gets done[s] set.
 * Returns -1 with *bad the first shard that failed, why and *status its
 * status, or 0; *pause_us (may be NULL) takes the largest pause
 * answered. */
static int switch_phase(struct run *r, Psd__V1__SwitchPhase ph,
                        uint64_t *pause_us, int *given, int *bad,
                        grpc_status_code *status, char *why, size_t len) {
  Psd__V1__Caller caller = psd_peer_caller(r->l->peers);
  Psd__V1__SwitchLayoutRequest req = PSD__V1__SWITCH_LAYOUT_REQUEST__INIT;
  struct cm_unary *calls = calloc((size_t)r->most, sizeof *calls);
  int *done = given ? given : calloc((size_t)r->most, sizeof *done), rc = 0,
      k = 0;
  if (!calls || !done) {
    snprintf(why, len, "out of memory");
    *bad = 0;
    rc = -1;
    goto out;
  }
  req.caller = &caller;
  req.phase = ph;
  req.from = r->from;
  req.to = r->to;
  req.layout = r->layout;
  k = psd_peer_call_all(r->l->peers, r->most, calls, done,
                        "/psd.v1.Admin/SwitchLayout", &req.base, SWITCH_CALL_MS,
                        0);
  for (int i = 0; i < k; i++) {
    struct cm_unary *u = &calls[i];
    int s = (int)(intptr_t)u->user;
    Psd__V1__SwitchLayoutResponse *a;
    if (u->status != GRPC_STATUS_OK) {
      done[s] = 0; /* psd_peer_call_all marks the shards it called */
      if (!rc || s < *bad) {
        *bad = s;
        *status = u->status;
        snprintf(why, len, "%s: %.300s", cm_rpc_status_name(u->status),
                 u->details);
      }
      rc = -1;
      continue;
    }
    done[s] = 1;
    if (pause_us &&
        (a = (Psd__V1__SwitchLayoutResponse *)cm_rpc_unpack(
             u->response, &psd__v1__switch_layout_response__descriptor))) {
      if (a->pause_us > *pause_us)
        *pause_us = a->pause_us;
      psd__v1__switch_layout_response__free_unpacked(a, NULL);
    }
  }
out:
  for (int i = 0; i < k; i++)
    cm_unary_release(&calls[i]);
  free(calls);
  if (!given)
    free(done);
  return rc;
}

/* FREEZE, PREPARE and COMMIT, each to every shard of r->most before the
 * next; ABORT to all after a failure before COMMIT. Between PREPARE and
 * COMMIT, the decision on ps:0's disk (switch_disk.c): from then on the
 * switch is committed, so a COMMIT that does not reach a shard (down, or
 * starting again: it resumes into the new layout from its staging) is
 * sent again to it for up to COMMIT_RETRY_MS. Returns 0, or -1 with
 * why (*committed set when the switch was decided: its COMMIT failed on a
 * shard). */
static int switch_layout(struct run *r, uint64_t *pause_us, int *committed,
                         char *why, size_t len) {
  static const struct {
    Psd__V1__SwitchPhase ph;
    const char *name;
  } steps[] = {{PSD__V1__SWITCH_PHASE__SWITCH_FREEZE, "FREEZE"},
               {PSD__V1__SWITCH_PHASE__SWITCH_PREPARE, "PREPARE"},
               {PSD__V1__SWITCH_PHASE__SWITCH_COMMIT, "COMMIT"}};
  char e[400], ea[400];
  int bad = 0, abad = 0, done[CM_LAYOUT_MAX_SHARDS] = {0};
  grpc_status_code st = GRPC_STATUS_OK, ast;
  for (int p = 0; p < 3; p++) {
    int commit = steps[p].ph == PSD__V1__SWITCH_PHASE__SWITCH_COMMIT;
    if (commit &&
        psd_switch_decide(r->l->srv, r->from, r->to, r->layout, e, sizeof e)) {
      bad = 0;
      goto abort; /* nothing committed: ABORT as after a failed phase */
    }
    if (commit && getenv("PSD_TEST_KILL_AFTER_DECISION"))
      raise(SIGKILL); /* docs/faults.md: decided, no COMMIT sent */
    double until = cm_mono_ms() + COMMIT_RETRY_MS;
    int failed;
    while (
        (failed = switch_phase(r, steps[p].ph, pause_us, commit ? done : NULL,
                               &bad, &st, e, sizeof e)) &&
        commit &&
        (st == GRPC_STATUS_UNAVAILABLE ||
         st == GRPC_STATUS_DEADLINE_EXCEEDED) &&
        cm_mono_ms() < until) {
      cm_warn("live move: the switch's COMMIT did not reach ps:%d (%s); it "
              "is sent again until it does (a shard started again resumes "
              "into layout %llu from its staging)",
              bad, e, (unsigned long long)r->layout);
      usleep(COMMIT_RETRY_EVERY_MS * 1000);
    }
    if (!failed && p == 0 && getenv("PSD_TEST_KILL_AFTER_FREEZE"))
      raise(SIGKILL); /* docs/faults.md: every shard frozen, no decision */
    if (!failed)
      continue;
    if (commit) {
      *committed = 1;
      snprintf(why, len,
               "its COMMIT failed on ps:%d (%s); the shards that answered it "
               "OK committed layout %llu, and ps:%d resumes into it from its "
               "staging when started again",
               bad, e, (unsigned long long)r->layout, bad);
      return -1;
    }
  abort:
    if (switch_phase(r, PSD__V1__SWITCH_PHASE__SWITCH_ABORT, NULL, NULL, &abad,
                     &ast, ea, sizeof ea))
      cm_warn("live move: the switch's ABORT to ps:%d: %s", abad, ea);
    snprintf(why, len,
             "the switch's %s failed on ps:%d (%s); ABORT was sent to every "
             "shard",
             steps[p].name, bad, e);
    return -1;
  }
  return 0;
}

/* ---- the thread ---- */

static void *move_main(void *arg) {
  struct run *r = arg;
  struct psd_live *l = r->l;
  uint16_t *mv = malloc(CM_LAYOUT_BUCKETS * sizeof *mv);
  struct cm_layout_map *a = malloc(sizeof *a), *z = malloc(sizeof *z);
  double wb[RATE_WINDOW] = {0}, ws[RATE_WINDOW] = {0};
  double t_run = cm_mono_ms(), t_last = t_run;
  uint64_t bytes = 0, pause = 0;
  uint32_t nb = 0;
  int k = r->start, cancel = 0;
  char why[700] = "", res[600];

  if (!mv || !a || !z) {
    snprintf(res, sizeof res,
             "stopped: out of memory on ps:0 before the first batch; %d of "
             "%d bucket moves made",
             k, r->total);
    finish(l, 0, res);
    goto out;
  }
  cm_layout_moves(r->from, r->to, mv);
  cm_layout_map_init(a, CM_LAYOUT_RULE_BUCKETS, r->from);
  cm_layout_map_init(z, CM_LAYOUT_RULE_BUCKETS, r->to);
  while (k < r->total && !(cancel = cancelled(l))) {
    int src = a->shard[mv[k]], dst = z->shard[mv[k]], j = k;
    uint8_t set[PSD_MOVE_SET_BYTES] = {0};
    Psd__V1__MoveBucketsResponse *ans;
    while (j < r->total && j - k < r->batch && a->shard[mv[j]] == src &&
           z->shard[mv[j]] == dst) {
      set[mv[j] >> 3] |= (uint8_t)(1u << (mv[j] & 7));
      j++;
    }
    if (!(ans = batch(l, src, dst, set, r->to, j, why, sizeof why))) {
      snprintf(res, sizeof res,
               "stopped: batch %u (bucket moves %d..%d: %d buckets from ps:%d "
               "to ps:%d) failed: %.300s; %d of %d bucket moves made, every "
               "bucket has one owner and the job trains partly moved to %d "
               "shards; psctl reshard --shards %d --moves resumes",
               nb + 1, k, j - 1, j - k, src, dst, why, k, r->total, r->to,
               r->to);
      finish(l, 0, res);
      goto out;
    }
    double now = cm_mono_ms(), bps = 0, sb = 0, ss = 0;
    wb[nb % RATE_WINDOW] = (double)ans->bytes;
    ws[nb % RATE_WINDOW] = (now - t_last) / 1000;
    t_last = now;
    nb++;
    for (int i = 0; i < RATE_WINDOW && i < (int)nb; i++) {
      sb += wb[i];
      ss += ws[i];
    }
    bps = ss > 0 ? sb / ss : 0;
    bytes += ans->bytes;
    if (ans->pause_us > pause)
      pause = ans->pause_us;
    cm_info("live move: batch %u, %d buckets from ps:%d to ps:%d: %llu rows, "
            "%llu bytes, %u copies, pause %.1f ms, lag %llu rows; %d of %d "
            "bucket moves made",
            nb, j - k, src, dst, (unsigned long long)ans->rows,
            (unsigned long long)ans->bytes, ans->rounds, ans->pause_us / 1e3,
            (unsigned long long)ans->lag_rows, j, r->total);
    pthread_mutex_lock(&l->lock);
    l->fig.moved = (uint32_t)j;
    l->fig.batches = nb;
    l->fig.rows += ans->rows;
    l->fig.bytes = bytes;
    l->fig.bytes_per_s = bps;
    l->fig.lag_rows = ans->lag_rows;
    l->fig.last_rounds = ans->rounds;
    l->fig.last_pause_us = ans->pause_us;
    l->fig.max_pause_us = pause;
    pthread_mutex_unlock(&l->lock);
    psd__v1__move_buckets_response__free_unpacked(ans, NULL);
    k = j;
    if (r->rate > 0 && k < r->total) {
      /* The bytes moved so far, at the rate, are due at t_run + due. */
      double wait = t_run + bytes / (r->rate * 1e6) * 1000 - cm_mono_ms();
      if (wait > 0) {
        cm_info("live move: waiting %.2f s before the next batch to keep to "
                "%.3g MB/s (--rate)",
                wait / 1000, r->rate);
        double t = cm_mono_ms();
        nap(l, wait); /* cut short by a cancel */
        pthread_mutex_lock(&l->lock);
        l->fig.waits++;
        l->fig.waited_s += (cm_mono_ms() - t) / 1000;
        pthread_mutex_unlock(&l->lock);
      }
    }
  }
  if (cancel) {
    snprintf(res, sizeof res,
             "stopped: %s after %u batch%s: %d of %d bucket moves made, every "
             "bucket has one owner and the job trains partly moved to %d "
             "shards; psctl reshard --shards %d --moves resumes",
             cancel == 2 ? "ps:0 stopping"
                         : "cancelled (psctl reshard "
                           "--cancel)",
             nb, nb == 1 ? "" : "es", k, r->total, r->to, r->to);
    finish(l, 0, res);
    goto out;
  }
  uint64_t sw_pause = 0;
  cm_info("live move: every bucket is on its shard of %d (%d bucket moves); "
          "the switch to layout %llu (SwitchLayout to ps:0..ps:%d)",
          r->to, r->total, (unsigned long long)r->layout, r->most - 1);
  int committed = 0;
  if (switch_layout(r, &sw_pause, &committed, why, sizeof why)) {
    if (committed) /* decided: the rest resume into it when started */
      snprintf(res, sizeof res,
               "stopped: every bucket moved (%d of %d bucket moves made), "
               "but %.350s",
               k, r->total, why);
    else
      snprintf(res, sizeof res,
               "stopped: every bucket moved (%d of %d bucket moves made), "
               "but %.350s; the job trains with its rows moved and layout "
               "%llu of %d shards; psctl reshard --shards %d --moves tries "
               "the switch again",
               k, r->total, why, (unsigned long long)(r->layout - 1), r->from,
               r->to);
    finish(l, 0, res);
    goto out;
  }
  snprintf(res, sizeof res,
           "done: layout %llu of %d shards from %d, %d bucket moves (%d in "
           "%u batches now), %.1f MB of rows at %.1f MB/s, hand-overs paused "
           "%.1f ms at most, the switch %.1f ms",
           (unsigned long long)r->layout, r->to, r->from, r->total,
           r->total - r->start, nb, bytes / 1e6,
           bytes / 1e6 / ((cm_mono_ms() - t_run) / 1000 + 1e-9), pause / 1e3,
           sw_pause / 1e3);
  finish(l, 1, res);
out:
  free(mv);
  free(a);
  free(z);
  free(r);
  return NULL;
}

/* ---- the requests ---- */

/* Buckets per batch when psctl gave none: as many as keep the fullest
 * source's batch within BATCH_ROWS rows and one MoveRows answer of it
 * within half of job.max_message_mb (its rows and their bytes per bucket
 * owned, from the views), at least 1, at most BATCH_MOST. A hand-over
 * pauses its batch's writes while the source finds the rows changed
 * since the last copy, a walk of the batch's rows: a batch of a bound
 * number of rows keeps the pause the same whatever the table's size (a
 * batch of 64 buckets paused writes 4-8 ms at 1 M rows on 2 shards and
 * 50-90 ms at 10 M; 6 buckets at 10 M, 8 ms at the median). */
static int derive_batch(const struct psd_server *srv,
                        const struct psd__live_view *views, int most) {
  double per = 0, rows = 0,
         limit = (double)((uint64_t)srv->spec->job.max_message_mb << 20) / 2;
  for (int s = 0; s < most; s++) {
    if (views[s].owned <= 0)
      continue;
    if ((double)views[s].row_bytes / views[s].owned > per)
      per = (double)views[s].row_bytes / views[s].owned;
    if ((double)views[s].rows / views[s].owned > rows)
      rows = (double)views[s].rows / views[s].owned;
  }
  double b = BATCH_MOST;
  if (per > 0 && limit / per < b)
    b = limit / per;
  if (rows > 0 && BATCH_ROWS / rows < b)
    b = BATCH_ROWS / rows;
  return b < 1 ? 1 : (int)b;
}

void psd__live_move_request(struct psd_live *l, struct cm_rpc_call *call,
                            const Psd__V1__ReshardRequest *req) {
  struct psd_server *srv = l->srv;
  Psd__V1__ReshardResponse resp = PSD__V1__RESHARD_RESPONSE__INIT;
  int m = req->shards, n = srv->nshards, most = m > n ? m : n;
  int to = 0, done = 0, total, b, batches;
  struct psd__live_view *views = NULL;
  struct cm_layout_map *map = NULL, *za = NULL;
  uint16_t *mv = NULL;
  struct run *r = NULL;
  char msg[1400] = "", err[512], rate[64] = "";
  grpc_status_code st = GRPC_STATUS_FAILED_PRECONDITION;

  if (psd__live_movable(l, err, sizeof err)) {
    cm_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION,
                "a live move cannot be made: %s; psctl reshard --stop stops "
                "every shard and cuts the checkpoint instead",
                err);
    return;
  }
  if (!isfinite(req->rate_mbps) || req->rate_mbps < 0 ||
      req->batch > CM_LAYOUT_BUCKETS) {
    cm_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT,
                "batch %u, rate_mbps %g: a batch is 0 (ps:0 chooses) to %u "
                "buckets, a rate 0 (no limit) or more MB/s",
                req->batch, req->rate_mbps, CM_LAYOUT_BUCKETS);
    return;
  }
  if (psd__live_claim(l, call))
    return;
  if (!(views = calloc((size_t)most, sizeof *views)) ||
      !(map = malloc(sizeof *map)) || !(za = malloc(sizeof *za)) ||
      !(mv = malloc(CM_LAYOUT_BUCKETS * sizeof *mv)) ||
      !(r = calloc(1, sizeof *r))) {
    snprintf(msg, sizeof msg, "out of memory; nothing changed");
    st = GRPC_STATUS_RESOURCE_EXHAUSTED;
    goto refuse;
  }
  if ((st = psd__live_peers(l, msg, sizeof msg)) != GRPC_STATUS_OK)
    goto refuse;
  /* Every shard of both counts in ps:0's layout, a standby one too: a
   * destination that took rows must answer for them in it. */
  if ((st = psd__live_check(srv, most, 0, views, msg, sizeof msg)) !=
      GRPC_STATUS_OK)
    goto refuse;
  st = GRPC_STATUS_FAILED_PRECONDITION;
  if (psd__live_self_view(l, &views[0])) {
    snprintf(msg, sizeof msg, "ps:0 cannot read its own status");
    st = GRPC_STATUS_INTERNAL;
    goto refuse;
  }
  if (psd__live_move_state(views, most, &to, &done, msg, sizeof msg))
    goto refuse;
  if (to && to != m) {
    if (m == n)
      snprintf(msg, sizeof msg,
               "the job's table rows are partly moved to %d shards (%d bucket "
               "moves made); moving them back to %d needs the shards to take "
               "a move state of fewer moves, which they refuse (a shard never "
               "goes back to fewer moves, and clients follow only more): "
               "finish the move (psctl reshard --shards %d --moves), then "
               "move to %d; nothing changed",
               to, done, m, to, m);
    else
      snprintf(msg, sizeof msg,
               "the job's table rows are partly moved to %d shards (%d bucket "
               "moves made): finish that move (psctl reshard --shards %d "
               "--moves) before one to %d; nothing changed",
               to, done, to, m);
    goto refuse;
  }
  if (m == n) {
    snprintf(msg, sizeof msg,
             "the job has %d shard%s already (layout %llu); nothing to do", n,
             n == 1 ? "" : "s", (unsigned long long)srv->layout);
    goto refuse;
  }
  total = cm_layout_moves(n, m, mv);
  if (done > total) {
    snprintf(msg, sizeof msg,
             "a shard says %d bucket moves to %d shards are made, of %d: its "
             "move state is not this job's; nothing changed",
             done, m, total);
    goto refuse;
  }
  /* Each shard owns the buckets the move state gives it: the job is as
   * the moves made left it (a shard started again mid-move takes its
   * layout's buckets: they live in memory only). */
  cm_layout_map_moving(map, n, m, done);
  for (int s = 0; s < most; s++) {
    int want = 0;
    for (unsigned k = 0; k < CM_LAYOUT_BUCKETS; k++)
      want += map->shard[k] == s;
    if (views[s].owned != want) {
      snprintf(msg, sizeof msg,
               "ps:%d owns %d buckets, and after %d of %d bucket moves to %d "
               "shards it would own %d (a shard started again during a move "
               "takes its layout's buckets: a move's buckets live in memory "
               "only); nothing changed",
               s, views[s].owned, done, total, m, want);
      goto refuse;
    }
  }
  b = req->batch ? (int)req->batch : derive_batch(srv, views, most);
  cm_layout_map_init(map, CM_LAYOUT_RULE_BUCKETS, n);
  cm_layout_map_init(za, CM_LAYOUT_RULE_BUCKETS, m);
  batches = count_batches(mv, done, total, b, map, za);
  *r = (struct run){.l = l,
                    .from = n,
                    .to = m,
                    .most = most,
                    .start = done,
                    .total = total,
                    .batch = b,
                    .rate = req->rate_mbps,
                    .layout = srv->layout + 1};
  if (r->rate > 0)
    snprintf(rate, sizeof rate, ", at most %g MB/s", r->rate);
  pthread_mutex_lock(&l->lock);
  l->fig = (Psd__V1__MoveStatus)PSD__V1__MOVE_STATUS__INIT;
  l->fig.running = 1;
  l->fig.from = n;
  l->fig.to = m;
  l->fig.moves = (uint32_t)total;
  l->fig.moved = (uint32_t)done;
  l->fig.batch = (uint32_t)b;
  l->fig.rate_mbps = r->rate;
  l->move_said = 1;
  l->move_cancel = 0;
  l->move_since = cm_mono_ms();
  l->moving = 1;
  l->pending = 0;
  if (pthread_create(&l->move_thread, NULL, move_main, r)) {
    l->moving = 0;
    l->fig.running = 0;
    pthread_mutex_unlock(&l->lock);
    snprintf(msg, sizeof msg, "cannot start a thread; nothing changed");
    st = GRPC_STATUS_RESOURCE_EXHAUSTED;
    goto refuse_unlocked;
  }
  l->move_joinable = 1;
  r = NULL; /* the thread's */
  pthread_mutex_unlock(&l->lock);
  snprintf(msg, sizeof msg,
           "moving table rows live from %d to %d shards: %d bucket moves%s%d "
           "made), %d batch%s of at most %d buckets, each a MoveBuckets to its "
           "destination while the job trains%s; then the switch to layout "
           "%llu (SwitchLayout to ps:0..ps:%d); psctl reshard --cancel stops "
           "it after the batch under way",
           n, m, total, done ? " (resumed: " : " (", done, batches,
           batches == 1 ? "" : "es", b, rate,
           (unsigned long long)srv->layout + 1, most - 1);
  cm_info("reshard: %s, asked by %s", msg,
          req->caller->worker ? req->caller->worker : "a caller");
  resp.layout = srv->layout + 1;
  resp.from = n;
  resp.to = m;
  resp.message = msg;
  resp.moves = 1;
  cm_rpc_reply(call, cm_rpc_pack(&resp.base));
  goto out;
refuse:
  pthread_mutex_lock(&l->lock);
  l->pending = 0;
  pthread_mutex_unlock(&l->lock);
refuse_unlocked:
  cm_rpc_fail(call, st, "%s", msg);
out:
  free(views);
  free(map);
  free(za);
  free(mv);
  free(r);
}

void psd__live_move_cancel(struct psd_live *l, struct cm_rpc_call *call) {
  Psd__V1__ReshardResponse resp = PSD__V1__RESHARD_RESPONSE__INIT;
  char msg[300], note[600];
  int moving;
  pthread_mutex_lock(&l->lock);
  moving = l->moving;
  if (moving) {
    l->move_cancel = 1;
    l->fig.cancelled = 1;
    pthread_cond_broadcast(&l->move_wake);
    snprintf(msg, sizeof msg,
             "the live move to %d shards stops after its batch under way (%u "
             "of %u bucket moves made so far)",
             l->fig.to, l->fig.moved, l->fig.moves);
    resp.from = l->fig.from;
    resp.to = l->fig.to;
  }
  snprintf(note, sizeof note, "%s", l->note);
  pthread_mutex_unlock(&l->lock);
  if (!moving) {
    cm_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION,
                "no live move is under way; nothing to cancel%s%s%s",
                note[0] ? " (ps:0's last reshard: " : "",
                note + (strncmp(note, "last: ", 6) ? 0 : 6),
                note[0] ? ")" : "");
    return;
  }
  cm_info("live move: %s (psctl reshard --cancel)", msg);
  resp.message = msg;
  resp.moves = 1;
  cm_rpc_reply(call, cm_rpc_pack(&resp.base));
}

void psd_live_stop_move(struct psd_live *l) {
  int join;
  if (!l)
    return;
  pthread_mutex_lock(&l->lock);
  if (l->moving)
    l->move_cancel = 2;
  pthread_cond_broadcast(&l->move_wake);
  join = l->move_joinable;
  l->move_joinable = 0;
  pthread_mutex_unlock(&l->lock);
  if (join)
    pthread_join(l->move_thread, NULL);
}
