/* A live layout switch (switch.h): Admin/SwitchLayout's phases, a shard's
 * place in them and the watch over a frozen shard whose ps:0 was lost.
 * PREPARE's staging and Admin/DenseRows, the rows the new owners fetch
 * from the old, are switch_rows.c's; the switch on disk switch_disk.c's.
 * The swap and the freeze are the service's (service.h) over the store's
 * switch gate (store.h). */
#include "switch_internal.h"

#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"
#include "clock.h"
#include "err.h"
#include "layout.h"
#include "log.h"
#include "peer.h"
#include "request.h"
#include "rpc.h"
#include "rpc_client.h"
#include "saver.h"
#include "service.h"
#include "store.h"
#include "units.h"

static const char *const phase_names[] = {"FREEZE", "PREPARE", "COMMIT",
                                          "ABORT"};

/* Answers a SwitchLayout call. */
static void reply(struct cm_rpc_call *call, uint64_t bytes, uint64_t pause_us,
                  const char *msg) {
  Psd__V1__SwitchLayoutResponse r = PSD__V1__SWITCH_LAYOUT_RESPONSE__INIT;
  r.bytes = bytes;
  r.pause_us = pause_us;
  r.message = (char *)msg;
  cm_rpc_reply(call, cm_rpc_pack(&r.base));
}

/* ---- the watch: a frozen shard whose ps:0 was lost ---- */

/* A shard other than ps:0 frozen for a switch asks ps:0's Status every
 * WATCH_EVERY_MS once it has been frozen WATCH_AFTER_MS: when ps:0 answers
 * in an older layout and runs no live move, the switch was lost with
 * ps:0's last process before its decision (a decided one, ps:0 resumes
 * into at start: switch_disk.c), and the shard aborts it itself. */
#define WATCH_AFTER_MS 3000
#define WATCH_EVERY_MS 1000

/* Under w->lock: the ABORT of the switch under way (frozen or prepared,
 * no phase thread running). */
static void abort_locked(struct psd_switch *w, const char *who) {
  struct psd_server *srv = w->srv;
  psd_store_free(w->staged);
  w->staged = NULL;
  w->state = IDLE;
  psd_service_freeze(srv->service, 0, 0);
  cm_info("layout switch to layout %" PRIu64 " of %d shards: ABORT%s: "
          "staging dropped, dense calls flow again in layout %" PRIu64
          " (frozen %.1f ms)",
          w->layout, w->to, who, srv->self.layout, cm_mono_ms() - w->frozen_at);
}

/* Whether ps:0 answers Status in a layout older than `layout` with no live
 * move running (0 when it does not answer). */
static int ps0_lost_it(struct psd_peers *peers, uint64_t layout) {
  Psd__V1__Caller caller = psd_peer_caller(peers);
  Psd__V1__StatusRequest req = PSD__V1__STATUS_REQUEST__INIT;
  Psd__V1__StatusResponse *r = NULL;
  struct cm_unary u;
  int lost = 0;
  req.caller = &caller;
  psd_peer_call(peers, 0, "/psd.v1.Admin/Status", &req.base, 2000, 0, &u);
  if (u.status == GRPC_STATUS_OK &&
      (r = (Psd__V1__StatusResponse *)cm_rpc_unpack(
           u.response, &psd__v1__status_response__descriptor))) {
    lost = r->layout < layout && !(r->move && r->move->running);
    psd__v1__status_response__free_unpacked(r, NULL);
  }
  cm_unary_release(&u);
  return lost;
}

static void *watch_thread(void *arg) {
  struct psd_switch *w = arg;
  struct psd_peers *peers = NULL;
  char err[600];
  pthread_mutex_lock(&w->lock);
  while (!w->stopping && w->state != IDLE) {
    struct timespec until = cm_abstime_after_ms(WATCH_EVERY_MS);
    pthread_cond_timedwait(&w->wake, &w->lock, &until);
    if (w->stopping || w->state == IDLE || w->busy ||
        cm_mono_ms() - w->frozen_at < WATCH_AFTER_MS)
      continue;
    uint64_t layout = w->layout;
    pthread_mutex_unlock(&w->lock);
    if (!peers && psd_peers_new(&peers, w->srv->spec,
                                &(struct psd_peer_opts){.who = "psd (switch)"},
                                err, sizeof err))
      peers = NULL;
    int lost = peers && ps0_lost_it(peers, layout);
    pthread_mutex_lock(&w->lock);
    if (lost && !w->busy && w->layout == layout &&
        (w->state == FROZEN || w->state == PREPARED)) {
      abort_locked(w, " (by this shard: ps:0 answers in an older layout "
                      "and runs no switch, its last process lost this one)");
      psd_switch_stage_drop(w->srv, layout);
    }
  }
  w->watch_done = 1;
  pthread_mutex_unlock(&w->lock);
  psd_peers_free(peers);
  return NULL;
}

/* Under w->lock, at a FREEZE: the watch, on shards other than ps:0. */
static void watch_start(struct psd_switch *w) {
  if (w->srv->shard == 0 || (w->watching && !w->watch_done))
    return;
  if (w->watching) /* ended, holding no lock after it said so */
    pthread_join(w->watch, NULL);
  w->watching = w->watch_done = 0;
  if (pthread_create(&w->watch, NULL, watch_thread, w) == 0)
    w->watching = 1;
}

/* ---- the phases ---- */

/* FREEZE or PREPARE on their thread. */
static void *phase_thread(void *arg) {
  struct psd_switch *w = arg;
  struct psd_server *srv = w->srv;
  struct cm_rpc_call *call = w->call;
  char err[1200], msg[300];
  double t0 = cm_mono_ms();
  pthread_mutex_lock(&w->lock);
  enum state st = w->state;
  pthread_mutex_unlock(&w->lock);
  if (st == IDLE) { /* FREEZE */
    psd_service_freeze(srv->service, w->layout, w->to);
    pthread_mutex_lock(&w->lock);
    w->state = FROZEN;
    w->frozen_at = cm_mono_ms();
    w->busy = 0;
    watch_start(w);
    pthread_mutex_unlock(&w->lock);
    cm_info("layout switch to layout %" PRIu64 " of %d shards (from %d): "
            "FREEZE: dense calls wait (in flight ones done in %.1f ms)",
            w->layout, w->to, w->from, cm_mono_ms() - t0);
    snprintf(msg, sizeof msg, "ps:%d frozen for layout %" PRIu64, srv->shard,
             w->layout);
    reply(call, 0, 0, msg);
    return NULL;
  }
  int nvars = 0;
  int rc = psd__switch_prepare(w, &nvars, err, sizeof err);
  /* On disk before the answer (switch_disk.c): a kill of this shard from
   * here on finds it at start. A shard the switch takes out stages
   * nothing. */
  if (!rc && srv->shard < w->to &&
      (rc = psd_switch_stage_write(srv, w->staged, w->to, w->layout, err,
                                   sizeof err))) {
    psd_store_free(w->staged);
    w->staged = NULL;
  }
  if (!rc && getenv("PSD_TEST_KILL_AFTER_PREPARE"))
    raise(SIGKILL); /* docs/faults.md: a test's kill at this point */
  pthread_mutex_lock(&w->lock);
  w->state = rc ? FROZEN : PREPARED;
  w->busy = 0;
  uint64_t bytes = w->bytes;
  pthread_mutex_unlock(&w->lock);
  if (rc) {
    cm_warn("layout switch to layout %" PRIu64 ": PREPARE failed: %s",
            w->layout, err);
    cm_rpc_fail(call,
                rc == CM_ENOMEM ? GRPC_STATUS_RESOURCE_EXHAUSTED
                : rc == CM_ERPC ? GRPC_STATUS_UNAVAILABLE
                                : GRPC_STATUS_INTERNAL,
                "SwitchLayout PREPARE on ps:%d: %s", srv->shard, err);
    return NULL;
  }
  char size[32];
  cm_info("layout switch to layout %" PRIu64 " of %d shards: PREPARE: %d "
          "variable%s staged, %s fetched from the other shards in %.1f ms",
          w->layout, w->to, nvars, nvars == 1 ? "" : "s",
          cm_fmt_bytes((double)bytes, size, sizeof size), cm_mono_ms() - t0);
  snprintf(msg, sizeof msg, "ps:%d staged %d variable%s (%s fetched)",
           srv->shard, nvars, nvars == 1 ? "" : "s", size);
  reply(call, bytes, 0, msg);
  return NULL;
}

/* The daemon's own records of the layout, under the store's gate
 * (psd_service_switch's under). */
static void under_gate(void *ctx) {
  struct psd_switch *w = ctx;
  struct psd_server *srv = w->srv;
  srv->nshards = w->to;
  srv->layout = w->layout;
  /* Read by the saver's thread (saver.h): it writes from now on when the
   * switch takes this shard in, and stops when it takes it out. */
  __atomic_store_n(&srv->standby, srv->shard >= w->to, __ATOMIC_RELEASE);
  /* Every move was made before: a shard taken out holds no rows. */
  __atomic_store_n(&srv->holding, 0, __ATOMIC_RELEASE);
  if (srv->ckpt)
    psd_ckpt_set_layout(srv->ckpt, w->to, w->layout, !srv->standby);
}

/* COMMIT (lock held, state PREPARED): the swap. */
static void commit(struct psd_switch *w, struct cm_rpc_call *call) {
  struct psd_server *srv = w->srv;
  struct psd_store *old = w->staged;
  int n = psd_store_count(old);
  char msg[300];
  psd_service_switch(srv->service, old, w->layout, w->to, under_gate, w);
  psd_store_free(old); /* the old slices, swapped into it */
  w->staged = NULL;
  uint64_t pause = (uint64_t)((cm_mono_ms() - w->frozen_at) * 1000);
  w->last_from = w->from;
  w->last_to = w->to;
  w->last_layout = w->layout;
  w->last_pause_us = pause;
  w->state = IDLE;
  if (srv->standby)
    snprintf(msg, sizeof msg,
             "standing by: the job's layout %" PRIu64 " has %d shard%s "
             "(ps:0..ps:%d); ps:%d holds nothing",
             w->layout, w->to, w->to == 1 ? "" : "s", w->to - 1, srv->shard);
  else
    snprintf(msg, sizeof msg,
             "ps:%d serves layout %" PRIu64 " of %d shards: %d variable%s",
             srv->shard, w->layout, w->to, n, n == 1 ? "" : "s");
  cm_info("layout switch to layout %" PRIu64 " of %d shards (from %d): "
          "COMMIT: %s; dense calls waited %.1f ms",
          w->layout, w->to, w->from, msg, pause / 1000.0);
  if (getenv("PSD_TEST_KILL_AFTER_COMMIT"))
    raise(SIGKILL); /* docs/faults.md: swapped, not yet checkpointed */
  /* The new layout on disk soon (docs/reshard.md "What a kill does to a
   * live move"); the call does not wait for it: the staging on disk
   * (switch_disk.c) stands for it meanwhile. */
  if (srv->saver)
    psd_saver_request(srv->saver, "layout switch");
  reply(call, 0, pause, msg);
}

/* Whether the request names the switch under way. */
static int same(const struct psd_switch *w,
                const Psd__V1__SwitchLayoutRequest *r) {
  return r->from == w->from && r->to == w->to && r->layout == w->layout;
}

static void on_switch(struct cm_rpc_call *call, grpc_byte_buffer *bb,
                      void *ctx) {
  struct psd_switch *w = ctx;
  struct psd_server *srv = w->srv;
  char why[600];
  Psd__V1__SwitchLayoutRequest *req =
      (Psd__V1__SwitchLayoutRequest *)cm_request_open(
          &w->host, call, bb, &psd__v1__switch_layout_request__descriptor,
          "SwitchLayout", NULL);
  if (!req)
    return;
  int phase = (int)req->phase;
  if (phase < 0 || phase > 3) {
    cm_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT,
                "SwitchLayout: phase %d is none of SWITCH_FREEZE (0), "
                "SWITCH_PREPARE (1), SWITCH_COMMIT (2), SWITCH_ABORT (3)",
                phase);
    goto out;
  }
  const char *pn = phase_names[phase];
  if (req->from < 1 || req->from > srv->spec->nps || req->to < 1 ||
      req->to > srv->spec->nps || req->from == req->to) {
    cm_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT,
                "SwitchLayout %s: from %d to %d: two different counts of "
                "1..%d shards (the spec's cluster.ps)",
                pn, req->from, req->to, srv->spec->nps);
    goto out;
  }
  if (psd_service_steps(srv->service)) {
    cm_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION,
                "SwitchLayout %s: a live layout switch needs an async job "
                "(job.sync.mode async); psctl reshard stops and cuts sync jobs",
                pn);
    goto out;
  }
  pthread_mutex_lock(&w->lock);
  if (w->busy) {
    pthread_mutex_unlock(&w->lock);
    cm_rpc_fail(call, GRPC_STATUS_ABORTED,
                "SwitchLayout %s: ps:%d is running this switch's %s; call "
                "again once it has answered",
                pn, srv->shard, w->state == IDLE ? "FREEZE" : "PREPARE");
    goto out;
  }
  if (w->joinable) {
    pthread_join(w->thread, NULL);
    w->joinable = 0;
  }
  if (w->state == IDLE) {
    uint64_t have = srv->self.layout;
    int n = srv->self.nshards;
    /* The layout's version names the switch (a shard resumed into it at
     * start from no checkpoint of its own does not know its old count). */
    if (w->last_layout && req->layout == w->last_layout &&
        req->to == w->last_to &&
        (phase == PSD__V1__SWITCH_PHASE__SWITCH_COMMIT ||
         phase == PSD__V1__SWITCH_PHASE__SWITCH_ABORT)) {
      pthread_mutex_unlock(&w->lock);
      if (phase == PSD__V1__SWITCH_PHASE__SWITCH_COMMIT) {
        snprintf(why, sizeof why, "ps:%d committed layout %" PRIu64 " already",
                 srv->shard, req->layout);
        reply(call, 0, w->last_pause_us, why);
      } else {
        cm_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION,
                    "SwitchLayout ABORT of layout %" PRIu64 ": ps:%d committed "
                    "it already; a committed switch is not undone",
                    req->layout, srv->shard);
      }
      goto out;
    }
    if (phase == PSD__V1__SWITCH_PHASE__SWITCH_ABORT) {
      pthread_mutex_unlock(&w->lock);
      reply(call, 0, 0, "no switch under way: nothing to abort");
      goto out;
    }
    if (phase != PSD__V1__SWITCH_PHASE__SWITCH_FREEZE) {
      pthread_mutex_unlock(&w->lock);
      cm_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION,
                  "SwitchLayout %s of layout %" PRIu64 ": ps:%d is not frozen "
                  "for it (it holds layout %" PRIu64 " of %d shards); "
                  "SWITCH_FREEZE comes first",
                  pn, req->layout, srv->shard, have, n);
      goto out;
    }
    if (req->from != n || req->layout != have + 1) {
      pthread_mutex_unlock(&w->lock);
      cm_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION,
                  "SwitchLayout FREEZE from %d shards to layout %" PRIu64
                  ": ps:%d holds layout %" PRIu64 " of %d shards, so a switch "
                  "starts from %d shards and makes layout %" PRIu64,
                  req->from, req->layout, srv->shard, have, n, n, have + 1);
      goto out;
    }
    if (psd_service_switchable(srv->service, req->to, why, sizeof why)) {
      pthread_mutex_unlock(&w->lock);
      cm_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION,
                  "SwitchLayout FREEZE to layout %" PRIu64 " of %d shards: %s",
                  req->layout, req->to, why);
      goto out;
    }
    w->from = req->from;
    w->to = req->to;
    w->layout = req->layout;
  } else if (!same(w, req)) {
    pthread_mutex_unlock(&w->lock);
    cm_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION,
                "SwitchLayout %s from %d to %d shards, layout %" PRIu64
                ": ps:%d is switching from %d to %d shards, layout %" PRIu64
                "; finish or abort that one first",
                pn, req->from, req->to, req->layout, srv->shard, w->from, w->to,
                w->layout);
    goto out;
  }
  switch (phase) {
  case PSD__V1__SWITCH_PHASE__SWITCH_FREEZE:
  case PSD__V1__SWITCH_PHASE__SWITCH_PREPARE:
    if (phase == PSD__V1__SWITCH_PHASE__SWITCH_FREEZE && w->state != IDLE) {
      pthread_mutex_unlock(&w->lock);
      reply(call, 0, 0, "frozen already");
      goto out;
    }
    if (phase == PSD__V1__SWITCH_PHASE__SWITCH_PREPARE &&
        w->state == PREPARED) {
      uint64_t bytes = w->bytes;
      pthread_mutex_unlock(&w->lock);
      reply(call, bytes, 0, "prepared already");
      goto out;
    }
    w->call = call;
    w->busy = 1;
    if (phase == PSD__V1__SWITCH_PHASE__SWITCH_PREPARE)
      w->state = PREPARING;
    if (pthread_create(&w->thread, NULL, phase_thread, w)) {
      w->busy = 0;
      if (w->state == PREPARING)
        w->state = FROZEN;
      pthread_mutex_unlock(&w->lock);
      cm_rpc_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED,
                  "SwitchLayout %s: cannot start a thread", pn);
      goto out;
    }
    w->joinable = 1;
    break;
  case PSD__V1__SWITCH_PHASE__SWITCH_COMMIT:
    if (w->state != PREPARED) {
      pthread_mutex_unlock(&w->lock);
      cm_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION,
                  "SwitchLayout COMMIT of layout %" PRIu64 ": ps:%d is frozen "
                  "but not prepared; SWITCH_PREPARE comes first",
                  req->layout, srv->shard);
      goto out;
    }
    commit(w, call);
    break;
  default: /* ABORT */
    abort_locked(w, "");
    psd_switch_stage_drop(srv, w->layout);
    reply(call, 0, 0, "aborted: nothing changed");
    break;
  }
  pthread_mutex_unlock(&w->lock);
out:
  cm_request_free(&req->base);
}

/* ---- the object ---- */

int psd_switch_new(struct psd_switch **out, struct psd_server *srv) {
  struct psd_switch *w = calloc(1, sizeof *w);
  *out = w;
  if (!w)
    return CM_ENOMEM;
  w->srv = srv;
  cm_request_host_init(&w->host, srv->spec->job.name, "shard", "shard %d",
                       srv->shard);
  w->host.self = &srv->self;
  w->method[0] =
      (struct cm_rpc_method){"/psd.v1.Admin/SwitchLayout", on_switch, w};
  w->method[1] = (struct cm_rpc_method){"/psd.v1.Admin/DenseRows",
                                        psd__switch_dense_rows, w};
  pthread_mutex_init(&w->lock, NULL);
  pthread_cond_init(&w->wake, NULL);
  /* A switch this shard resumed into at start (switch_disk.c): its COMMIT,
   * sent again by ps:0, is answered done. */
  w->last_layout = srv->switched_layout;
  w->last_from = srv->switched_from;
  w->last_to = srv->switched_to;
  return 0;
}

void psd_switch_free(struct psd_switch *w) {
  if (!w)
    return;
  if (w->joinable)
    pthread_join(w->thread, NULL);
  pthread_mutex_lock(&w->lock);
  w->stopping = 1;
  pthread_cond_broadcast(&w->wake);
  pthread_mutex_unlock(&w->lock);
  if (w->watching)
    pthread_join(w->watch, NULL);
  pthread_cond_destroy(&w->wake);
  psd_store_free(w->staged);
  psd_peers_free(w->peers);
  pthread_mutex_destroy(&w->lock);
  free(w);
}

const struct cm_rpc_method *psd_switch_methods(struct psd_switch *w, int *n) {
  *n = 2;
  return w->method;
}
