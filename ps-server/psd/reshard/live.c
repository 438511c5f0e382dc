/* A live reshard (live.h), the part that serves: Admin/Reshard at ps:0
 * (the checks, the plan, the step boundary of a sync job, the shards told
 * to stop; its calls to them go through peer.h) and at the shards it
 * tells; live_plan.c has what a stopped shard does next, and the plan's
 * files. */
#include "live_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "clock.h"
#include "coord.h"
#include "err.h"
#include "log.h"
#include "ps.pb-c.h"
#include "request.h"
#include "reshard.h"
#include "rpc.h"
#include "rpc_client.h"
#include "service.h"
#include "spec.h"

/* Stops srv's loop, as a stop signal would, on the loop's thread. */
static void on_wake(uv_async_t *a) {
  struct psd_server *srv = a->data;
  if (!srv->stop_signal) {
    srv->stop_signal = SIGTERM;
    uv_stop(&srv->loop);
  }
}

/* One call to shard s through ps:0's peers (peer.h: made by on_request
 * before its first call; a channel of its own per call, credentials as a
 * client's). Not the coordinator's long-lived channels: after a shard was
 * killed and started again, one may still wait out gRPC's reconnect
 * backoff, and the check would call the shard unreachable
 * (integration-relayout's kill rounds under ASan saw it).
 * Returns the response (owned: cm_rpc_unpack'd by the caller) in u. */
static void call_shard(struct psd_server *srv, int s, const char *method,
                       const ProtobufCMessage *msg, struct cm_unary *u) {
  psd_peer_call(srv->live->peers, s, method, msg, LIVE_CALL_MS, 0, u);
}

void psd__live_view_of(const Psd__V1__StatusResponse *r,
                       struct psd__live_view *v) {
  *v = (struct psd__live_view){.layout = r->layout,
                               .nshards = r->num_shards,
                               .standby = r->standby,
                               .move_to = (int)r->move_to,
                               .moved = (int)r->moved,
                               .owned = (int)r->buckets_owned};
  for (size_t i = 0; i < r->n_tables; i++) {
    v->row_bytes += r->tables[i]->raw_bytes + r->tables[i]->rows * (8 + 16);
    v->rows += r->tables[i]->rows;
  }
}

/* A shard that refuses the connection or holds another layout is asked
 * again every LIVE_RETRY_MS for LIVE_CALL_MS: one that is starting again
 * (executing itself after an interrupted reshard, restarted by its
 * supervisor) is waited for, as the docs promise ("does not answer within
 * 3 s"), rather than refused at once (integration-relayout's kill rounds
 * asked again while ps:2 re-executed). */
grpc_status_code psd__live_check(struct psd_server *srv, int n, int loose,
                                 struct psd__live_view *views, char *msg,
                                 size_t len) {
  Psd__V1__Caller caller = psd_peer_caller(srv->live->peers);
  Psd__V1__StatusRequest req = PSD__V1__STATUS_REQUEST__INIT;
  req.caller = &caller;
  for (int s = 1; s < n; s++) {
    struct cm_unary u;
    Psd__V1__StatusResponse *r;
    double until = cm_mono_s() + LIVE_CALL_MS / 1000.0;
  again:
    call_shard(srv, s, "/psd.v1.Admin/Status", &req.base, &u);
    if (u.status == GRPC_STATUS_UNAVAILABLE && cm_mono_s() < until) {
      cm_unary_release(&u);
      usleep(LIVE_RETRY_MS * 1000);
      goto again;
    }
    if (u.status != GRPC_STATUS_OK) {
      snprintf(msg, len,
               "ps:%d (%s) is not reachable (%s: %s): start it (psd --cluster "
               "SPEC --task ps:%d) and ask again; nothing changed",
               s, srv->spec->ps[s].text, cm_rpc_status_name(u.status),
               u.details, s);
      cm_unary_release(&u);
      return GRPC_STATUS_UNAVAILABLE;
    }
    r = (Psd__V1__StatusResponse *)cm_rpc_unpack(
        u.response, &psd__v1__status_response__descriptor);
    cm_unary_release(&u);
    int other =
        r && (r->layout != srv->layout || r->num_shards != srv->nshards) &&
        !(loose && s >= srv->nshards && r->standby && r->layout < srv->layout);
    if (other && cm_mono_s() < until) {
      protobuf_c_message_free_unpacked(&r->base, NULL);
      usleep(LIVE_RETRY_MS * 1000);
      goto again;
    }
    if (!r || other) {
      snprintf(msg, len,
               "ps:%d holds layout %llu of %d shards, ps:0 layout %llu of %d: "
               "it is starting again after a reshard; ask again once it "
               "serves layout %llu (psctl status); nothing changed",
               s, r ? (unsigned long long)r->layout : 0ULL,
               r ? r->num_shards : 0, (unsigned long long)srv->layout,
               srv->nshards, (unsigned long long)srv->layout);
      if (r)
        protobuf_c_message_free_unpacked(&r->base, NULL);
      return GRPC_STATUS_FAILED_PRECONDITION;
    }
    if (views)
      psd__live_view_of(r, &views[s]);
    protobuf_c_message_free_unpacked(&r->base, NULL);
  }
  return GRPC_STATUS_OK;
}

/* Tells shards 1..n-1 to stop for layout v of m shards, and the standby
 * shards past them (every other address of the spec), so that they start
 * again in layout v too; one of those not answering changes nothing (it
 * reads the job's layout when it starts). Returns 0, or the first refusal
 * of shards 1..n-1 with msg saying it. */
static grpc_status_code prepare_shards(struct psd_server *srv, int n,
                                       uint64_t v, int m, char *msg,
                                       size_t len) {
  Psd__V1__Caller caller = psd_peer_caller(srv->live->peers);
  Psd__V1__ReshardRequest req = PSD__V1__RESHARD_REQUEST__INIT;
  req.caller = &caller;
  req.prepare = 1;
  req.layout = v;
  req.shards = m;
  grpc_status_code first = GRPC_STATUS_OK;
  /* Every shard is told, past a failure: one told stops and comes back,
   * even when the reshard is aborted. */
  for (int s = 1; s < srv->spec->nps; s++) {
    struct cm_unary u;
    call_shard(srv, s, "/psd.v1.Admin/Reshard", &req.base, &u);
    if (u.status != GRPC_STATUS_OK && s >= n)
      cm_info("reshard: ps:%d, standing by outside both layouts, was not "
              "told (%s: %s); it takes layout %llu when it starts again",
              s, cm_rpc_status_name(u.status), u.details,
              (unsigned long long)v);
    else if (u.status != GRPC_STATUS_OK && first == GRPC_STATUS_OK) {
      first = u.status;
      snprintf(msg, len, "ps:%d (%s) did not take the reshard (%s: %s)", s,
               srv->spec->ps[s].text, cm_rpc_status_name(u.status), u.details);
    }
    cm_unary_release(&u);
  }
  return first;
}

/* Marks this shard as stopping for layout v of m shards, and stops it. */
static void arm(struct psd_live *l, const char *plan, uint64_t v, int m) {
  pthread_mutex_lock(&l->lock);
  l->pending = 1;
  l->target = v;
  l->to = m;
  l->from = l->srv->nshards;
  l->since = cm_mono_ms();
  snprintf(l->plan, sizeof l->plan, "%s", plan);
  snprintf(l->note, sizeof l->note,
           "under way: layout %llu of %d shards to layout %llu of %d",
           (unsigned long long)l->srv->layout, l->srv->nshards,
           (unsigned long long)v, m);
  pthread_mutex_unlock(&l->lock);
  uv_async_send(&l->wake);
}

/* A reshard ps:0 has accepted, carried out on a thread of its own (a
 * handler must not wait for the step it holds). */
struct go {
  struct psd_live *l; /* borrowed */
  char plan[1200];    /* its plan directory */
  uint64_t v;         /* the layout version it makes */
  int m, n, most;     /* shards after, before, and the larger */
};

/* Sync: holds every old shard's pulls of the open step's version and later
 * (hold), then waits for that step's commit, so that the shards stop
 * between two steps with every worker waiting for a pull, its next batch
 * unread. Returns 0, or -1 with msg. */
static int hold_step(struct psd_server *srv, const struct go *g, char *msg,
                     size_t len) {
  Psd__V1__Caller caller = psd_peer_caller(srv->live->peers);
  Psd__V1__ReshardRequest req = PSD__V1__RESHARD_REQUEST__INIT;
  int live;
  /* Step `open` (0-based) is the one workers push now; its commit makes
   * the job's version open + 1, and the pulls of that version are the next
   * step's: those are held. */
  uint64_t open = psd_coord_open_step(srv->coord, &live), hold = open + 1;
  req.caller = &caller;
  req.hold = hold;
  req.layout = g->v;
  for (int s = 1; s < g->n; s++) {
    struct cm_unary u;
    call_shard(srv, s, "/psd.v1.Admin/Reshard", &req.base, &u);
    if (u.status != GRPC_STATUS_OK) {
      snprintf(msg, len, "ps:%d (%s) did not hold version %llu (%s: %s)", s,
               srv->spec->ps[s].text, (unsigned long long)hold,
               cm_rpc_status_name(u.status), u.details);
      cm_unary_release(&u);
      return -1;
    }
    cm_unary_release(&u);
  }
  psd_service_hold(srv->service, hold);
  if (!live)
    return 0;
  cm_info("reshard: pulls of version %llu are held; waiting for the commit of "
          "step %llu, which makes it",
          (unsigned long long)hold, (unsigned long long)open);
  if (psd_coord_wait_committed(srv->coord, hold, LIVE_MARK_WAIT_S * 1000))
    return 0;
  srv->live->clean = 0; /* a step cut in two: the workers join again */
  cm_warn("reshard: step %llu did not commit within %d s: the shards stop "
          "anyway, and the job rolls back to the step they checkpoint",
          (unsigned long long)open, LIVE_MARK_WAIT_S);
  return 0;
}

static void *go_thread(void *arg) {
  struct go *g = arg;
  struct psd_live *l = g->l;
  struct psd_server *srv = l->srv;
  char msg[1400] = "", res[1600];
  int ok = 1;
  l->clean = 1; /* async: no step to cut in two; sync: hold_step says */
  if (srv->coord && psd_service_steps(srv->service) &&
      hold_step(srv, g, msg, sizeof msg))
    ok = 0;
  if (ok && prepare_shards(srv, g->most, g->v, g->m, msg, sizeof msg) !=
                GRPC_STATUS_OK)
    ok = 0;
  if (!ok) {
    snprintf(res, sizeof res,
             "aborted: %s; the job stays in layout %llu of %d shards", msg,
             (unsigned long long)srv->layout, g->n);
    cm_error("reshard: %s", res);
    if (psd__live_put(g->plan, "result", res))
      cm_error("reshard: cannot write %s/result: %s", g->plan, strerror(errno));
    /* Shards told to hold or stop must stop and come back. */
    prepare_shards(srv, g->most, g->v, g->m, msg, sizeof msg);
  }
  /* ps:0 stops and comes back too, aborted or not, as the others do. */
  arm(l, g->plan, g->v, g->m);
  free(g);
  return NULL;
}

/* ps:0: a reshard asked for by psctl. */
static void on_request(struct psd_live *l, struct cm_rpc_call *call,
                       const Psd__V1__ReshardRequest *req) {
  struct psd_server *srv = l->srv;
  Psd__V1__ReshardResponse resp = PSD__V1__RESHARD_RESPONSE__INIT;
  int m = req->shards, n = srv->nshards, to = 0, done = 0;
  int most = m > n ? m : n;
  uint64_t v = srv->layout + 1;
  char plan[1200], msg[1400] = "", text[200];
  struct psd__live_view *views = NULL;
  grpc_status_code st;

  if (req->cancel) {
    psd__live_move_cancel(l, call);
    return;
  }
  if (m < 1 || m > srv->spec->nps) {
    cm_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT,
                "shards %d: the spec's cluster.ps lists %d address%s; "
                "expected 1..%d",
                m, srv->spec->nps, srv->spec->nps == 1 ? "" : "es",
                srv->spec->nps);
    return;
  }
  if (req->how == PSD__V1__RESHARD_HOW__RESHARD_MOVES ||
      (req->how == PSD__V1__RESHARD_HOW__RESHARD_MOVES_OR_STOP &&
       !psd__live_movable(l, msg, sizeof msg))) {
    psd__live_move_request(l, call, req);
    return;
  }
  if (req->how != PSD__V1__RESHARD_HOW__RESHARD_STOP &&
      req->how != PSD__V1__RESHARD_HOW__RESHARD_MOVES_OR_STOP) {
    cm_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT,
                "how %d is none of RESHARD_STOP (0), RESHARD_MOVES (1), "
                "RESHARD_MOVES_OR_STOP (2)",
                (int)req->how);
    return;
  }
  if (req->how != PSD__V1__RESHARD_HOW__RESHARD_STOP)
    cm_info("reshard: no live move (%s): the shards stop and ps:0 cuts", msg);
  msg[0] = '\0';
  if (m == n) {
    cm_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION,
                "the job has %d shard%s already (layout %llu); nothing to do",
                n, n == 1 ? "" : "s", (unsigned long long)srv->layout);
    return;
  }
  if (!srv->root[0]) {
    cm_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION,
                "a live reshard goes through the job's checkpoints, and this "
                "job writes none: set job.checkpoint.dir (a directory every "
                "shard shares) and restart the shards");
    return;
  }
  if (psd__live_claim(l, call))
    return;
  if (!(views = calloc((size_t)most, sizeof *views))) {
    snprintf(msg, sizeof msg, "out of memory; nothing changed");
    st = GRPC_STATUS_RESOURCE_EXHAUSTED;
    goto refuse;
  }
  if ((st = psd__live_peers(l, msg, sizeof msg)) != GRPC_STATUS_OK)
    goto refuse;
  if ((st = psd__live_check(srv, most, 1, views, msg, sizeof msg)) !=
      GRPC_STATUS_OK)
    goto refuse;
  /* Rows moved live sit on shards whose checkpoints the cut would not
   * read as theirs (a destination standing by writes none): the move is
   * finished first. */
  if (psd__live_self_view(l, &views[0]) ||
      psd__live_move_state(views, most, &to, &done, msg, sizeof msg)) {
    if (!msg[0])
      snprintf(msg, sizeof msg, "ps:0 cannot read its own status");
    st = GRPC_STATUS_FAILED_PRECONDITION;
    goto refuse;
  }
  if (to) {
    snprintf(msg, sizeof msg,
             "the job's table rows are partly moved live to %d shards (%d "
             "bucket moves made): the stop and cut would not find the rows "
             "moved; finish the move (psctl reshard --shards %d --moves) "
             "first; nothing changed",
             to, done, to);
    st = GRPC_STATUS_FAILED_PRECONDITION;
    goto refuse;
  }
  psd__live_plan_dir(srv->root, srv->spec->job.name, v, plan, sizeof plan);
  if (psd__live_is_dir(plan))
    psd__live_remove_plan(
        plan); /* an earlier attempt at v, finished (aborted) */
  snprintf(text, sizeof text, "from %d to %d shards, layout %llu to %llu", n, m,
           (unsigned long long)srv->layout, (unsigned long long)v);
  if (mkdir(plan, 0755) || psd__live_put(plan, "plan", text)) {
    snprintf(msg, sizeof msg, "cannot write the plan %s: %s; nothing changed",
             plan, strerror(errno));
    st = GRPC_STATUS_INTERNAL;
    goto refuse;
  }
  struct go *g = calloc(1, sizeof *g);
  pthread_t t;
  if (!g) {
    snprintf(msg, sizeof msg, "out of memory; nothing changed");
    st = GRPC_STATUS_RESOURCE_EXHAUSTED;
    psd__live_remove_plan(plan);
    goto refuse;
  }
  *g = (struct go){.l = l, .v = v, .m = m, .n = n, .most = most};
  snprintf(g->plan, sizeof g->plan, "%s", plan);
  if (pthread_create(&t, NULL, go_thread, g)) {
    free(g);
    psd__live_remove_plan(plan);
    snprintf(msg, sizeof msg, "cannot start a thread; nothing changed");
    st = GRPC_STATUS_RESOURCE_EXHAUSTED;
    goto refuse;
  }
  pthread_detach(t);
  /* Said before the answer: psctl's first Status must not read the last
   * reshard's result as this one's. */
  pthread_mutex_lock(&l->lock);
  snprintf(l->note, sizeof l->note,
           "under way: layout %llu of %d shards to layout %llu of %d",
           (unsigned long long)srv->layout, n, (unsigned long long)v, m);
  pthread_mutex_unlock(&l->lock);
  cm_info("reshard: %s, asked by %s: every shard of both layouts stops "
          "(final checkpoints), this shard cuts the checkpoint onto %d "
          "shards, and each starts again in layout %llu",
          text, req->caller->worker ? req->caller->worker : "a caller", m,
          (unsigned long long)v);
  resp.layout = v;
  resp.from = n;
  resp.to = m;
  snprintf(msg, sizeof msg,
           "resharding from %d to %d shards (layout %llu): the shards stop "
           "(final checkpoints), ps:0 cuts the checkpoint, and every shard "
           "starts again in the new layout; workers wait, then re-plan",
           n, m, (unsigned long long)v);
  resp.message = msg;
  cm_rpc_reply(call, cm_rpc_pack(&resp.base));
  free(views);
  return;
refuse:
  pthread_mutex_lock(&l->lock);
  l->pending = 0;
  pthread_mutex_unlock(&l->lock);
  cm_rpc_fail(call, st, "%s", msg);
  free(views);
}

static void on_reshard(struct cm_rpc_call *call, grpc_byte_buffer *bb,
                       void *ctx) {
  struct psd_live *l = ctx;
  struct psd_server *srv = l->srv;
  char plan[1200];
  Psd__V1__ReshardRequest *req = (Psd__V1__ReshardRequest *)cm_request_open(
      &l->host, call, bb, &psd__v1__reshard_request__descriptor, "Reshard",
      NULL);
  if (!req)
    return;
  if (!req->prepare && !req->hold && srv->shard != 0) {
    cm_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION,
                "Reshard goes to ps:0 (%s), the coordinator; this is ps:%d",
                srv->spec->ps[0].text, srv->shard);
  } else if (!req->prepare && !req->hold) {
    on_request(l, call, req);
  } else if (req->hold && srv->shard != 0 && req->layout == srv->layout + 1) {
    Psd__V1__ReshardResponse resp = PSD__V1__RESHARD_RESPONSE__INIT;
    psd_service_hold(srv->service, req->hold);
    cm_info("reshard: pulls of version %llu and later are held (ps:0 stops "
            "the job between two steps)",
            (unsigned long long)req->hold);
    resp.layout = req->layout;
    resp.message = "held";
    cm_rpc_reply(call, cm_rpc_pack(&resp.base));
  } else if (srv->shard == 0 || !srv->root[0] ||
             (srv->standby ? req->layout <= srv->layout
                           : req->layout != srv->layout + 1) ||
             req->shards < 1 || req->shards > srv->spec->nps) {
    cm_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION,
                "ps:%d cannot stop for layout %llu of %d shards: it holds "
                "layout %llu%s",
                srv->shard, (unsigned long long)req->layout, req->shards,
                (unsigned long long)srv->layout,
                srv->root[0] ? "" : " and writes no checkpoints");
  } else {
    Psd__V1__ReshardResponse resp = PSD__V1__RESHARD_RESPONSE__INIT;
    psd__live_plan_dir(srv->root, srv->spec->job.name, req->layout, plan,
                       sizeof plan);
    cm_info("reshard: ps:0 asks this shard to stop for layout %llu of %d "
            "shards",
            (unsigned long long)req->layout, req->shards);
    resp.layout = req->layout;
    resp.from = srv->nshards;
    resp.to = req->shards;
    resp.message = "stopping for the reshard";
    cm_rpc_reply(call, cm_rpc_pack(&resp.base));
    arm(l, plan, req->layout, req->shards); /* after the answer */
  }
  cm_request_free(&req->base);
}

int psd_live_new(struct psd_live **out, struct psd_server *srv,
                 const char *last) {
  struct psd_live *l = calloc(1, sizeof *l);
  *out = l;
  if (!l)
    return CM_ENOMEM;
  l->srv = srv;
  cm_request_host_init(&l->host, srv->spec->job.name, "shard", "shard %d",
                       srv->shard);
  l->host.self = &srv->self;
  l->method = (struct cm_rpc_method){"/psd.v1.Admin/Reshard", on_reshard, l};
  pthread_mutex_init(&l->lock, NULL);
  {
    pthread_condattr_t ca; /* nap's waits are on the monotonic clock */
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&l->move_wake, &ca);
    pthread_condattr_destroy(&ca);
  }
  if (last && last[0])
    snprintf(l->note, sizeof l->note, "last: %s", last);
  if (uv_async_init(&srv->loop, &l->wake, on_wake)) {
    psd_live_free(l);
    *out = NULL;
    return CM_ENOMEM;
  }
  l->wake.data = srv;
  l->wake_ready = 1;
  return 0;
}

void psd_live_free(struct psd_live *l) {
  if (!l)
    return;
  psd_live_stop_move(l);
  psd_peers_free(l->peers);
  pthread_cond_destroy(&l->move_wake);
  pthread_mutex_destroy(&l->lock);
  free(l);
}

const struct cm_rpc_method *psd_live_methods(struct psd_live *l, int *n) {
  *n = 1;
  return &l->method;
}

void psd_live_note(void *live, char *buf, size_t len) {
  struct psd_live *l = live;
  pthread_mutex_lock(&l->lock);
  if (l->moving)
    snprintf(buf, len,
             "under way: a live move of table rows from %d to %d shards, %u "
             "of %u bucket moves made%s",
             l->fig.from, l->fig.to, l->fig.moved, l->fig.moves,
             l->move_cancel ? "; stopping after the batch under way" : "");
  else
    snprintf(buf, len, "%s", l->note);
  pthread_mutex_unlock(&l->lock);
}

int psd_live_pending(const struct psd_live *l) { return l && l->pending > 0; }

int psd__live_claim(struct psd_live *l, struct cm_rpc_call *call) {
  int busy, to;
  pthread_mutex_lock(&l->lock);
  busy = l->pending ? 1 : l->moving ? 2 : 0;
  if (!busy) {
    l->pending = -1; /* checking: a second request is refused */
    if (l->move_joinable) {
      pthread_join(l->move_thread, NULL); /* ended: moving is 0 */
      l->move_joinable = 0;
    }
  }
  to = l->fig.to;
  pthread_mutex_unlock(&l->lock);
  if (busy == 2)
    cm_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION,
                "a live move to %d shards is under way: wait for it or stop "
                "it (psctl reshard --cancel), then ask again",
                to);
  else if (busy)
    cm_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION,
                "a reshard to %d shards (layout %llu) is under way: wait for "
                "it (psctl status) and ask again",
                l->to, (unsigned long long)l->target);
  return busy ? -1 : 0;
}

grpc_status_code psd__live_peers(struct psd_live *l, char *msg, size_t len) {
  char err[1024];
  if (l->peers || !psd_peers_new(&l->peers, l->srv->spec,
                                 &(struct psd_peer_opts){
                                     .who = "ps:0 (reshard)", .fresh = 1},
                                 err, sizeof err))
    return GRPC_STATUS_OK;
  snprintf(msg, len, "cannot call the shards: %s; nothing changed", err);
  return GRPC_STATUS_INTERNAL;
}
