/* A live layout switch (switch.h): Admin/SwitchLayout's phases and
 * Admin/DenseRows, which a preparing shard calls on the frozen holders of
 * its new rows. The rule of each new slice is the offline cut's
 * (reshard_internal.h's gather); the swap and the freeze are the
 * service's (service.h) over the store's switch gate (store.h). */
#include "switch.h"

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
#include "optjson.h"
#include "peer.h"
#include "publish.h"
#include "request.h"
#include "reshard_internal.h"
#include "rpc.h"
#include "rpc_client.h"
#include "saver.h"
#include "service.h"
#include "store.h"
#include "units.h"

/* Each DenseRows call's deadline. */
#define ROWS_CALL_MS 60000
/* Room an answer keeps for its fields besides the rows. */
#define ANSWER_SLACK (64u << 10)

/* Where a shard is in a switch. */
enum state {
  IDLE = 0,  /* none under way */
  FROZEN,    /* FREEZE done */
  PREPARING, /* PREPARE's thread runs */
  PREPARED,  /* staging ready for COMMIT */
};

static const char *const phase_names[] = {"FREEZE", "PREPARE", "COMMIT",
                                          "ABORT"};

struct psd_switch {
  struct psd_server *srv;         /* borrowed */
  struct cm_request_host host;    /* how its requests are taken */
  struct cm_rpc_method method[2]; /* SwitchLayout, DenseRows */
  struct psd_peers *peers;        /* owned, made at the first PREPARE */
  pthread_mutex_t lock;           /* guards everything below */
  enum state state;               /* where this shard is */
  int busy;                       /* a FREEZE or PREPARE thread runs */
  pthread_t thread;               /* that thread, joined by the next */
  int joinable;                   /* thread is to be joined */
  struct cm_rpc_call *call;       /* the call the thread answers */
  int from, to;                   /* the switch under way: its counts */
  uint64_t layout;                /* and the layout it makes */
  double frozen_at;               /* cm_mono_ms() at its FREEZE */
  struct psd_store *staged;       /* PREPARE's new slices (owned) */
  uint64_t bytes;                 /* bytes PREPARE fetched */
  int last_from, last_to;         /* the last switch committed here */
  uint64_t last_layout;           /* its layout (0: none) */
  uint64_t last_pause_us;         /* its pause */
  pthread_t watch;                /* the watch over a frozen shard */
  int watching;                   /* watch was started (joined by the
                                     next, and by psd_switch_free) */
  int watch_done;                 /* and has ended */
  int stopping;                   /* psd_switch_free: the watch ends */
  pthread_cond_t wake;            /* wakes the watch early */
};

/* Answers a SwitchLayout call. */
static void reply(struct cm_rpc_call *call, uint64_t bytes, uint64_t pause_us,
                  const char *msg) {
  Psd__V1__SwitchLayoutResponse r = PSD__V1__SWITCH_LAYOUT_RESPONSE__INIT;
  r.bytes = bytes;
  r.pause_us = pause_us;
  r.message = (char *)msg;
  cm_rpc_reply(call, cm_rpc_pack(&r.base));
}

/* ---- PREPARE: the catalog, the rows, the staged store ---- */

/* One old shard's catalog: what it holds of each variable. */
struct catalog {
  Psd__V1__DenseRowsResponse *r; /* owned (NULL: this shard's own store) */
};

/* One DenseRows call to shard k. Returns the answer, or NULL with err. */
static Psd__V1__DenseRowsResponse *dense_rows(struct psd_switch *w, int k,
                                              const char *name, int64_t b,
                                              int64_t e, char *err,
                                              size_t errlen) {
  Psd__V1__Caller caller = psd_peer_caller(w->peers);
  Psd__V1__DenseRowsRequest req = PSD__V1__DENSE_ROWS_REQUEST__INIT;
  Psd__V1__DenseRowsResponse *r = NULL;
  struct cm_unary u;
  req.caller = &caller;
  req.name = (char *)name;
  req.row_begin = b;
  req.row_end = e;
  req.layout = w->layout;
  psd_peer_call(w->peers, k, "/psd.v1.Admin/DenseRows", &req.base, ROWS_CALL_MS,
                1, &u);
  if (u.status != GRPC_STATUS_OK)
    snprintf(err, errlen, "DenseRows%s%s to ps:%d: %s: %s",
             name[0] ? " of " : "", name, k, cm_rpc_status_name(u.status),
             u.details);
  else if (!(r = (Psd__V1__DenseRowsResponse *)cm_rpc_unpack(
                 u.response, &psd__v1__dense_rows_response__descriptor)))
    snprintf(err, errlen,
             "DenseRows to ps:%d: the answer is not a "
             "DenseRowsResponse",
             k);
  cm_unary_release(&u);
  return r;
}

/* The optimizer of a slice: its own (JSON), else the spec's pick. */
static int slice_optim(struct psd_store *store, const Psd__V1__DenseSlice *d,
                       struct cm_optim *opt, int *own, char *err,
                       size_t errlen) {
  char why[300];
  *own = d->optimizer && d->optimizer[0];
  if (!*own) {
    *opt = *psd_store_want(store, d->name, NULL, NULL);
    return 0;
  }
  if (cm_optim_from_json(d->optimizer, strlen(d->optimizer), opt, why,
                         sizeof why)) {
    snprintf(err, errlen, "variable '%s': its optimizer %s: %s", d->name,
             d->optimizer, why);
    return CM_EPROTO;
  }
  return 0;
}

/* Fetches rows [b, e) of variable g from shard k (which holds them) into
 * g, in answers of at most the message limit. */
static int fetch(struct psd_switch *w, struct psd__gather *g, int k, int64_t b,
                 int64_t e, char *err, size_t errlen) {
  uint64_t row_bytes = g->row * sizeof(float) * (uint64_t)(1 + g->nslots);
  uint64_t room = (uint64_t)cm_rpc_max_message();
  int64_t per = room > ANSWER_SLACK + row_bytes
                    ? (int64_t)((room - ANSWER_SLACK) / row_bytes)
                    : 1;
  for (int64_t at = b; at < e; at += per) {
    int64_t to = at + per < e ? at + per : e;
    Psd__V1__DenseRowsResponse *r =
        dense_rows(w, k, g->name, at, to, err, errlen);
    if (!r)
      return CM_ERPC;
    const Psd__V1__DenseSlice *d = r->n_vars == 1 ? r->vars[0] : NULL;
    size_t want = (size_t)(to - at) * g->row * sizeof(float);
    int ok = d && d->row_begin == at && d->row_end == to &&
             d->values.len == want && (int)d->n_slots == g->nslots;
    for (size_t s = 0; ok && s < d->n_slots; s++)
      ok = d->slots[s].len == want;
    if (!ok) {
      snprintf(err, errlen,
               "DenseRows of '%s' rows [%lld, %lld) to ps:%d: the answer "
               "holds other rows, sizes or slots than asked",
               g->name, (long long)at, (long long)to, k);
      psd__v1__dense_rows_response__free_unpacked(r, NULL);
      return CM_EPROTO;
    }
    struct psd__piece p = {.row_begin = at,
                           .row_end = to,
                           .value = (const float *)(void *)d->values.data,
                           .version = d->version,
                           .steps = d->steps};
    for (size_t s = 0; s < d->n_slots; s++)
      p.slots[s] = (const float *)(void *)d->slots[s].data;
    psd__gather_add(g, &p);
    w->bytes += want * (1 + d->n_slots);
    psd__v1__dense_rows_response__free_unpacked(r, NULL);
  }
  return 0;
}

/* The entry of a catalog that names the variable called name, or NULL. */
static const Psd__V1__DenseSlice *listed(const Psd__V1__DenseRowsResponse *r,
                                         const char *name) {
  for (size_t x = 0; x < r->n_vars; x++)
    if (!strcmp(r->vars[x]->name, name))
      return r->vars[x];
  return NULL;
}

/* The local slice of a catalog entry: this shard's own variable. */
static void local_slice(struct psd_var *v, Psd__V1__DenseSlice *d, char *optbuf,
                        size_t optlen) {
  psd__v1__dense_slice__init(d);
  d->name = v->name;
  d->n_shape = (size_t)v->ndim;
  d->shape = v->shape;
  d->placement = v->placement;
  d->asked = cm_layout_asked_to_wire(v->asked);
  optbuf[0] = 0;
  if (v->own)
    cm_optim_to_json(&v->opt, optbuf, optlen);
  d->optimizer = optbuf;
  d->row_begin = v->row_begin;
  d->row_end = v->row_end;
  d->version = v->version;
  d->steps = psd_var_steps(v);
}

/* Builds the staged store of this shard's new slices: every variable of
 * the old shards' catalogs that lands here among w->to, its rows from
 * this shard's own store or fetched. Returns 0 or a code with err. */
static int prepare(struct psd_switch *w, int *nvars, char *err, size_t errlen) {
  struct psd_server *srv = w->srv;
  int me = srv->shard, from = w->from, to = w->to, rc = 0;
  struct catalog *cat = calloc((size_t)from + 1, sizeof *cat);
  struct psd__gather g;
  struct psd_store *staged = NULL;
  memset(&g, 0, sizeof g);
  *nvars = 0;
  w->bytes = 0;
  if (!cat || psd_store_new(&staged, me, to, psd_store_optims(srv->store))) {
    rc = CM_ENOMEM;
    goto out;
  }
  if (!w->peers &&
      (rc = psd_peers_new(&w->peers, srv->spec,
                          &(struct psd_peer_opts){.who = "psd (switch)"}, err,
                          errlen)))
    goto out;
  for (int k = 0; k < from; k++)
    if (k != me && !(cat[k].r = dense_rows(w, k, "", 0, 0, err, errlen))) {
      rc = CM_ERPC;
      goto out;
    }
  /* Each variable once: the first old shard that lists it says what it
   * is; every old shard that holds rows of it gives them. The dense calls
   * are frozen here too: the own store holds still (the gate read-held
   * against a COMMIT all the same). */
  psd_store_hold(srv->store);
  for (int k = 0; k < from && !rc; k++) {
    int n = k == me ? psd_store_count(srv->store) : (int)cat[k].r->n_vars;
    for (int i = 0; i < n && !rc; i++) {
      Psd__V1__DenseSlice mine, *d;
      char optbuf[CM_OPTIM_JSON_MAX];
      if (k == me) {
        local_slice(psd_store_at(srv->store, i), &mine, optbuf, sizeof optbuf);
        d = &mine;
      } else {
        d = cat[k].r->vars[i];
      }
      /* Met before, on an earlier old shard? */
      int seen = 0;
      for (int j = 0; j < k && !seen; j++)
        seen = j == me ? psd_store_find(srv->store, d->name) != NULL
                       : listed(cat[j].r, d->name) != NULL;
      if (seen || me >= to)
        continue;
      uint64_t numel = 1;
      for (size_t x = 0; x < d->n_shape; x++)
        numel *= (uint64_t)d->shape[x];
      int asked = cm_layout_asked_from_wire(d->asked);
      int p = cm_layout_replace(asked, d->placement, from, d->name,
                                numel * sizeof(float), to);
      if (p != CM_LAYOUT_SPLIT && p != me)
        continue;
      struct cm_optim opt;
      int own;
      if ((rc = slice_optim(srv->store, d, &opt, &own, err, errlen)) ||
          (rc = psd__gather_init(&g, d->name, (int)d->n_shape, d->shape, p,
                                 asked, own, &opt, to, me)))
        break;
      /* Its rows from every old shard that holds some of them. */
      for (int j = k; j < from && !rc; j++) {
        const Psd__V1__DenseSlice *h = NULL;
        struct psd_var *v = NULL;
        if (j == me) {
          if (!(v = psd_store_find(srv->store, d->name)))
            continue;
        } else if (!(h = listed(cat[j].r, d->name))) {
          continue;
        }
        int64_t hb = v ? v->row_begin : h->row_begin;
        int64_t he = v ? v->row_end : h->row_end;
        int64_t b = hb > g.begin ? hb : g.begin, e = he < g.end ? he : g.end;
        if (e <= b)
          continue;
        if (v) {
          struct psd__piece pc;
          psd__piece_of(v, &pc);
          psd__gather_add(&g, &pc);
        } else {
          rc = fetch(w, &g, j, b, e, err, errlen);
        }
      }
      if (!rc && !(rc = psd__gather_make(&g, staged, me, "layout switch", err,
                                         errlen)))
        (*nvars)++;
      psd__gather_free(&g);
    }
  }
  psd_store_release(srv->store);
out:
  psd__gather_free(&g);
  for (int k = 0; cat && k < from; k++)
    if (cat[k].r)
      psd__v1__dense_rows_response__free_unpacked(cat[k].r, NULL);
  free(cat);
  if (rc == CM_ENOMEM)
    snprintf(err, errlen, "out of memory staging the new slices");
  if (rc)
    psd_store_free(staged);
  else
    w->staged = staged;
  return rc;
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
  int rc = prepare(w, &nvars, err, sizeof err);
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
  if (srv->ckpt)
    psd_ckpt_set_layout(srv->ckpt, w->to, w->layout, !srv->standby);
  if (srv->publisher)
    psd_publisher_set_shards(srv->publisher, w->to);
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

/* ---- Admin/DenseRows: a frozen shard's slices, to a preparing one ---- */

static void on_dense_rows(struct cm_rpc_call *call, grpc_byte_buffer *bb,
                          void *ctx) {
  struct psd_switch *w = ctx;
  struct psd_server *srv = w->srv;
  struct psd_store *store = srv->store;
  Psd__V1__DenseSlice *vs = NULL, **ptrs = NULL;
  ProtobufCBinaryData *slots = NULL;
  char(*opts)[CM_OPTIM_JSON_MAX] = NULL;
  int to, n = 0, held = 0;
  Psd__V1__DenseRowsRequest *req = (Psd__V1__DenseRowsRequest *)cm_request_open(
      &w->host, call, bb, &psd__v1__dense_rows_request__descriptor, "DenseRows",
      NULL);
  if (!req)
    return;
  uint64_t frozen = psd_service_frozen(srv->service, &to);
  if (!req->layout || frozen != req->layout) {
    cm_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION,
                "DenseRows for layout %" PRIu64 ": ps:%d is %s; it answers "
                "during a switch's PREPARE only, frozen for that switch",
                req->layout, srv->shard,
                frozen ? "frozen for another layout" : "not frozen");
    goto out;
  }
  psd_store_hold(store);
  held = 1;
  Psd__V1__DenseRowsResponse r = PSD__V1__DENSE_ROWS_RESPONSE__INIT;
  if (!req->name || !req->name[0]) {
    n = psd_store_count(store);
    vs = calloc((size_t)n + 1, sizeof *vs);
    ptrs = calloc((size_t)n + 1, sizeof *ptrs);
    opts = calloc((size_t)n + 1, sizeof *opts);
    if (!vs || !ptrs || !opts) {
      cm_rpc_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
      goto out;
    }
    for (int i = 0; i < n; i++) {
      local_slice(psd_store_at(store, i), &vs[i], opts[i], sizeof opts[i]);
      ptrs[i] = &vs[i];
    }
  } else {
    struct psd_var *v = psd_store_find(store, req->name);
    if (!v) {
      cm_rpc_fail(call, GRPC_STATUS_NOT_FOUND,
                  "DenseRows: ps:%d holds no variable '%.200s'", srv->shard,
                  req->name);
      goto out;
    }
    if (req->row_begin < v->row_begin || req->row_end > v->row_end ||
        req->row_begin >= req->row_end) {
      cm_rpc_fail(call, GRPC_STATUS_OUT_OF_RANGE,
                  "DenseRows: rows [%lld, %lld) of '%s': ps:%d holds [%lld, "
                  "%lld)",
                  (long long)req->row_begin, (long long)req->row_end, v->name,
                  srv->shard, (long long)v->row_begin, (long long)v->row_end);
      goto out;
    }
    uint64_t row = v->numel / (uint64_t)v->shape[0];
    size_t off = (size_t)(req->row_begin - v->row_begin) * row;
    size_t len = (size_t)(req->row_end - req->row_begin) * row * sizeof(float);
    if ((uint64_t)len * (uint64_t)(1 + v->nslots) + ANSWER_SLACK >
        (uint64_t)cm_rpc_max_message()) {
      cm_rpc_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED,
                  "DenseRows: rows [%lld, %lld) of '%s' make %zu bytes; ps:%d "
                  "answers at most %d (job.max_message_mb): ask fewer rows",
                  (long long)req->row_begin, (long long)req->row_end, v->name,
                  len * (size_t)(1 + v->nslots), srv->shard,
                  cm_rpc_max_message());
      goto out;
    }
    n = 1;
    vs = calloc(1, sizeof *vs);
    ptrs = calloc(1, sizeof *ptrs);
    opts = calloc(1, sizeof *opts);
    slots = calloc(CM_OPTIM_MAX_SLOTS, sizeof *slots);
    if (!vs || !ptrs || !opts || !slots) {
      cm_rpc_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
      goto out;
    }
    local_slice(v, vs, opts[0], sizeof opts[0]);
    vs->row_begin = req->row_begin;
    vs->row_end = req->row_end;
    vs->values = (ProtobufCBinaryData){len, (uint8_t *)(v->value + off)};
    for (int s = 0; s < v->nslots; s++)
      slots[s] = (ProtobufCBinaryData){len, (uint8_t *)(v->slots[s] + off)};
    vs->n_slots = (size_t)v->nslots;
    vs->slots = slots;
    ptrs[0] = vs;
  }
  r.n_vars = (size_t)n;
  r.vars = ptrs;
  cm_rpc_reply(call, cm_rpc_pack(&r.base));
out:
  if (held)
    psd_store_release(store);
  free(vs);
  free(ptrs);
  free(opts);
  free(slots);
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
  w->method[1] =
      (struct cm_rpc_method){"/psd.v1.Admin/DenseRows", on_dense_rows, w};
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
