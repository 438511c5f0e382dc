/* A live move of buckets, the destination's side (move.h): the copies
 * installed, the hand-over, and Admin/MoveBuckets. */
#include "move.h"

#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt.h"
#include "clock.h"
#include "err.h"
#include "layout.h"
#include "log.h"
#include "rand.h"
#include "request.h"
#include "rpc.h"
#include "rpc_client.h"
#include "service.h"
#include "table.h"
#include "tables.h"

/* Each MoveRows call's deadline: a copy of many rows takes a while. */
#define MOVE_CALL_MS 120000

/* Bytes of one row's statistics in MoveTable.stats (ps.proto). */
#define STATS_BYTES 16

/* Checks one MoveTable's lengths against its nrows and t's dim and state,
 * and unpacks it into s (pointing into mt, statistics into *stats, owned
 * by the caller). Returns 0 or CM_EPROTO / CM_ENOMEM with err. */
static int unpack_table(const Psd__V1__MoveTable *mt, struct psd_table *t,
                        struct psd_table_snap *s, struct psd_row_stats **stats,
                        char *err, size_t errlen) {
  const struct cm_table_conf *c = psd_table_conf(t);
  uint64_t n = mt->nrows;
  uint32_t ns = psd_table_nstate(t);
  struct {
    const char *field;
    size_t len, want;
  } f[] = {{"ids", mt->ids.len, n * 8},
           {"values", mt->values.len, n * c->dim * sizeof(float)},
           {"state", mt->state.len, n * ns * sizeof(float)},
           {"stats", mt->stats.len, n * STATS_BYTES}};
  for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
    if (f[i].len != f[i].want || n > (SIZE_MAX >> 6)) {
      snprintf(err, errlen,
               "table '%s': MoveTable.%s holds %zu bytes; %" PRIu64
               " rows of dim %u (%u state floats) need %zu",
               c->name, f[i].field, f[i].len, n, c->dim, ns, f[i].want);
      return CM_EPROTO;
    }
  if (mt->evicted.len % 8) {
    snprintf(err, errlen,
             "table '%s': MoveTable.evicted holds %zu bytes, not a whole "
             "number of 8-byte ids",
             c->name, mt->evicted.len);
    return CM_EPROTO;
  }
  if (!(*stats = malloc(n * sizeof **stats + 1))) {
    snprintf(err, errlen, "out of memory");
    return CM_ENOMEM;
  }
  for (uint64_t r = 0; r < n; r++) {
    const uint8_t *p = mt->stats.data + r * STATS_BYTES;
    memcpy(&(*stats)[r].count, p, 4); /* little-endian, as the sender's */
    memcpy(&(*stats)[r].t, p + 4, 4);
    memcpy(&(*stats)[r].last_step, p + 8, 8);
  }
  *s = (struct psd_table_snap){.dim = c->dim,
                               .nstate = ns,
                               .delta = mt->delta,
                               .nrows = n,
                               .ids = (uint64_t *)(void *)mt->ids.data,
                               .stats = *stats,
                               .values = (float *)(void *)mt->values.data,
                               .state = (float *)(void *)mt->state.data,
                               .nevicted = mt->evicted.len / 8,
                               .evicted = (uint64_t *)(void *)mt->evicted.data};
  return 0;
}

/* psd_move_install (file NULL), or each table's copy added to move file
 * `file` instead (the hand-over's, once installed). */
static int install(struct psd_tables *ts, const Psd__V1__MoveRowsResponse *r,
                   const uint8_t *set, uint64_t *rows,
                   struct psd_ckpt_move_file *file, char *err, size_t errlen) {
  int rc = 0;
  for (size_t i = 0; i < r->n_tables && !rc; i++) {
    const Psd__V1__MoveTable *mt = r->tables[i];
    struct psd_table *t = NULL;
    struct psd_row_stats *stats = NULL;
    struct psd_table_snap s;
    uint64_t n = 0;
    int created = 0;
    char why[300];
    if (!mt->spec || !mt->spec->name) {
      snprintf(err, errlen, "MoveTable %zu has no spec", i);
      return CM_EPROTO;
    }
    if (!(t = psd_tables_find(ts, mt->spec->name)) &&
        (rc = psd_tables_declare(ts, mt->spec->name, mt->spec->dim,
                                 mt->spec->id_bound, &t, &created, why,
                                 sizeof why))) {
      snprintf(err, errlen, "table '%.200s': %s", mt->spec->name, why);
      return rc;
    }
    if ((rc = unpack_table(mt, t, &s, &stats, err, errlen)))
      ;
    else if (!file && (rc = psd_table_move_install(t, &s, set, &n)))
      snprintf(err, errlen, "table '%.200s': %s installing its rows",
               mt->spec->name, cm_strerror(rc));
    else if (file && (rc = psd_ckpt_move_add(file, psd_table_conf(t), &s, why,
                                             sizeof why)))
      snprintf(err, errlen, "table '%.200s': %s", mt->spec->name, why);
    *rows += n;
    free(stats);
  }
  return rc;
}

int psd_move_install(struct psd_tables *ts, const Psd__V1__MoveRowsResponse *r,
                     const uint8_t *set, uint64_t *rows, char *err,
                     size_t errlen) {
  return install(ts, r, set, rows, NULL, err, errlen);
}

/* One MoveRows call of phase to the source. Returns the answer (free it
 * with psd__v1__move_rows_response__free_unpacked), or NULL with err and
 * *status said. */
static Psd__V1__MoveRowsResponse *move_rows(struct psd_peers *peers, int self,
                                            int from, Psd__V1__MovePhase phase,
                                            uint64_t move, const uint8_t *set,
                                            int move_to, int moved, int *status,
                                            char *err, size_t errlen) {
  Psd__V1__Caller caller = psd_peer_caller(peers);
  Psd__V1__MoveRowsRequest req = PSD__V1__MOVE_ROWS_REQUEST__INIT;
  Psd__V1__MoveRowsResponse *r = NULL;
  static const char *const names[] = {"MOVE_COPY", "MOVE_HANDOVER",
                                      "MOVE_CANCEL", "MOVE_DONE"};
  struct cm_unary u;
  req.caller = &caller;
  req.buckets = (ProtobufCBinaryData){PSD_MOVE_SET_BYTES, (uint8_t *)set};
  req.phase = phase;
  req.move = move;
  req.move_to = (uint32_t)move_to;
  req.moved = (uint32_t)moved;
  req.destination = self >= 0 ? (uint32_t)self + 1 : 0;
  psd_peer_call(peers, from, "/psd.v1.Admin/MoveRows", &req.base, MOVE_CALL_MS,
                1, &u);
  *status = u.status;
  if (u.status != GRPC_STATUS_OK)
    snprintf(err, errlen, "MoveRows %s to ps:%d: %s: %s", names[phase], from,
             cm_rpc_status_name(u.status), u.details);
  else if (!(r = (Psd__V1__MoveRowsResponse *)cm_rpc_unpack(
                 u.response, &psd__v1__move_rows_response__descriptor))) {
    *status = GRPC_STATUS_INTERNAL;
    snprintf(err, errlen,
             "MoveRows %s to ps:%d: the answer is not a MoveRowsResponse",
             names[phase], from);
  }
  cm_unary_release(&u);
  return r;
}

int psd_move_done(struct psd_peers *peers, int from, uint64_t move,
                  const uint8_t *set, int move_to, int moved, char *err,
                  size_t errlen) {
  int st;
  Psd__V1__MoveRowsResponse *r =
      move_rows(peers, -1, from, PSD__V1__MOVE_PHASE__MOVE_DONE, move, set,
                move_to, moved, &st, err, errlen);
  if (!r)
    return CM_ERPC;
  psd__v1__move_rows_response__free_unpacked(r, NULL);
  return 0;
}

int psd_move_buckets(struct psd_service *svc, struct psd_peers *peers, int self,
                     int from, int nps, const uint8_t *set, int move_to,
                     int moved, struct psd_ckpt *ckpt,
                     struct psd_move_result *res, char *err, size_t errlen) {
  struct psd_tables *ts = psd_service_tables(svc);
  Psd__V1__MoveRowsResponse *r = NULL;
  struct psd_ckpt_move_file *file = NULL;
  uint64_t move = cm_random_id(res) | 1, first = 0;
  int rc, b, copied = 0;
  double t0;
  *res = (struct psd_move_result){0};
  if ((rc = psd_service_movable(svc, err, errlen)))
    return rc;
  if (from < 0 || from >= nps || from == self) {
    snprintf(err, errlen,
             "from %d: the source is another shard of the spec's %d (0..%d, "
             "not this ps:%d)",
             from, nps, nps - 1, self);
    return CM_EINVAL;
  }
  if ((b = psd_service_owns_any(svc, set)) >= 0) {
    snprintf(err, errlen,
             "ps:%d owns bucket %d already; move only buckets "
             "it lacks",
             self, b);
    return CM_EEXIST;
  }
  psd_service_relocating(svc);
  /* Copies while what changed since is large. */
  for (;;) {
    double tc = cm_mono_ms();
    r = move_rows(peers, self, from, PSD__V1__MOVE_PHASE__MOVE_COPY, move, set,
                  move_to, moved, &res->status, err, errlen);
    res->copy_ms += cm_mono_ms() - tc;
    if (!r) {
      rc = CM_ERPC;
      goto cancel;
    }
    copied = 1;
    res->rounds++;
    res->bytes += r->bytes;
    tc = cm_mono_ms();
    rc = psd_move_install(ts, r, set, &res->rows, err, errlen);
    res->install_ms += cm_mono_ms() - tc;
    if (rc)
      goto cancel;
    if (res->rounds == 1)
      first = r->bytes;
    uint64_t got = r->bytes;
    psd__v1__move_rows_response__free_unpacked(r, NULL);
    r = NULL;
    if (res->rounds == 1 ? !got
                         : got * 16 <= first || res->rounds >= PSD_MOVE_ROUNDS)
      break;
  }
  /* The copies' rows on disk (ckpt.h's move file, its first part) while
   * the buckets' writes still go to the source: the hand-over then waits
   * on disk for its own changes alone. Failing, the move is cancelled. */
  if (ckpt && move_to > 0) {
    double tw = cm_mono_ms();
    char what[1200];
    if ((rc =
             psd_ckpt_move_begin(ckpt, set, moved, &file, what, sizeof what))) {
      snprintf(err, errlen,
               "the rows copied could not be written to a move file (%s); "
               "ps:%d keeps the buckets",
               what, from);
      goto cancel;
    }
    res->file_ms = cm_mono_ms() - tw;
  }
  /* The hand-over: the buckets' writes pause from here to owned here. */
  t0 = cm_mono_ms();
  r = move_rows(peers, self, from, PSD__V1__MOVE_PHASE__MOVE_HANDOVER, move,
                set, move_to, moved, &res->status, err, errlen);
  res->hand_call_ms = cm_mono_ms() - t0;
  if (!r) {
    /* Refused before the flip, never reached, or its answer lost after
     * it: the source keeps the rows until MOVE_DONE, so a cancel gives it
     * the buckets back whole. */
    rc = CM_ERPC;
    goto cancel;
  }
  res->bytes += r->bytes;
  res->lag_rows = res->rows;
  double ti = cm_mono_ms();
  rc = psd_move_install(ts, r, set, &res->rows, err, errlen);
  res->install_ms += cm_mono_ms() - ti;
  if (rc)
    goto cancel; /* the source still holds every row: it takes them back */
  res->lag_rows = res->rows - res->lag_rows;
  psd_service_own(svc, set, move_to, moved);
  res->pause_us = (uint64_t)((cm_mono_ms() - t0) * 1000);
  /* Durable here before the source drops them (the move file's second
   * part, and the set in place): a kill of this shard from now on finds
   * them at start. Failing, the move stays open on the source, which
   * keeps the rows; it fails. */
  if (file) {
    double tw = cm_mono_ms();
    uint64_t n = 0;
    char what[1200];
    if (!(rc = install(ts, r, set, &n, file, what, sizeof what))) {
      rc = psd_ckpt_move_finish(file, from, move, move_to, what, sizeof what);
      file = NULL; /* freed by it */
    }
    if (rc) {
      snprintf(err, errlen,
               "the buckets are owned here but their rows could not be "
               "written to a move file (%s); ps:%d keeps its copy until "
               "asked again",
               what, from);
      cm_error("move %" PRIx64 ": %s", move, err);
      goto out;
    }
    res->hand_file_ms = cm_mono_ms() - tw;
    res->file_ms += res->hand_file_ms;
    /* Test only (docs/faults.md): a kill -9 between the move file and
     * MOVE_DONE, which leaves the source's move open. */
    if (getenv("PSD_TEST_KILL_AFTER_MOVE_FILE"))
      raise(SIGKILL);
  }
  psd__v1__move_rows_response__free_unpacked(r, NULL);
  r = NULL;
  /* Owned here: the source drops its rows and adopts the move state.
   * Asked again when the answer is lost (the move just ended is answered
   * OK); failing, the source keeps them, unused, and says so no more. */
  double td = cm_mono_ms();
  /* Test only (docs/reshard.md): the first MOVE_DONE of the process lost,
   * as past its tries across a cut link. */
  static atomic_int lost;
  int lose = getenv("PSD_TEST_LOSE_MOVE_DONE") && !atomic_exchange(&lost, 1);
  for (int k = 0; k < PSD_MOVE_DONE_TRIES && !lose; k++) {
    char why[300];
    int st;
    r = move_rows(peers, self, from, PSD__V1__MOVE_PHASE__MOVE_DONE, move, set,
                  move_to, moved, &st, why, sizeof why);
    if (r)
      break;
    cm_warn("move %" PRIx64 ": %s", move, why);
    usleep(100 * 1000);
  }
  if (!r) {
    cm_warn("move %" PRIx64 ": ps:%d was not told that the buckets are "
            "owned here: it keeps their rows, unused, and its move open, "
            "refusing other moves, until told at this shard's next move",
            move, from);
    res->undone = move;
  }
  res->done_ms = cm_mono_ms() - td;
  rc = 0;
  goto out;
cancel:
  if (copied) {
    char why[300];
    int st;
    Psd__V1__MoveRowsResponse *c =
        move_rows(peers, self, from, PSD__V1__MOVE_PHASE__MOVE_CANCEL, move,
                  set, move_to, moved, &st, why, sizeof why);
    if (c)
      psd__v1__move_rows_response__free_unpacked(c, NULL);
    else
      cm_warn("move %" PRIx64 ": %s", move, why);
    /* Its copies here are no one's: dropped. */
    for (int i = 0; i < psd_tables_count(ts); i++) {
      uint64_t d;
      psd_table_drop_buckets(psd_tables_at(ts, i), set, &d);
    }
  }
out:
  psd_ckpt_move_abandon(file); /* a move file not put in place */
  if (r)
    psd__v1__move_rows_response__free_unpacked(r, NULL);
  return rc;
}

void psd_move_hold(struct psd_server *srv, const char *how) {
  if (!srv->ckpt)
    return;
  psd_ckpt_take_rows(srv->ckpt);
  __atomic_store_n(&srv->holding, 1, __ATOMIC_RELEASE);
  cm_info("standing by with rows moved here (%s): ps:%d checkpoints them "
          "from now on, in %s",
          how, srv->shard, psd_ckpt_dir(srv->ckpt));
}

/* ---- Admin/MoveBuckets ---- */

/* One MoveBuckets' batch, as ps:0 asked for it. */
struct batch {
  int from;                        /* its source */
  uint8_t set[PSD_MOVE_SET_BYTES]; /* its buckets */
  int move_to, moved;              /* the move state it adopts */
};

struct psd_move {
  struct psd_server *srv;      /* borrowed */
  struct cm_request_host host; /* how its requests are taken */
  struct cm_rpc_method method; /* Admin/MoveBuckets */
  struct psd_peers *peers;     /* owned, made at the first move */
  pthread_mutex_t lock;        /* guards busy */
  int busy;                    /* a move runs (its thread) */
  pthread_t thread;            /* that move's, joined by the next or by
                                  psd_move_free */
  int joinable;                /* thread is to be joined */
  struct cm_rpc_call *call;    /* the call the thread answers */
  struct batch now;            /* its batch */
  struct batch undone;         /* the last batch whose MOVE_DONE never reached
                                  its source (its buckets owned here): told
                                  before the next move (the move thread's
                                  alone) */
  uint64_t undone_id;          /* that move's id; 0: none */
};

/* Tells the source of m's undone move that its buckets are owned here,
 * before the next move (a source holding that move open refuses every
 * other). Failing, it is told at the move after. */
static void tell_undone(struct psd_move *m) {
  char err[600];
  const struct batch *u = &m->undone;
  if (!m->undone_id)
    return;
  if (psd_move_done(m->peers, u->from, m->undone_id, u->set, u->move_to,
                    u->moved, err, sizeof err)) {
    cm_warn("move %" PRIx64 ": ps:%d still not told that its buckets are "
            "owned here (%s); told at the next move",
            m->undone_id, u->from, err);
    return;
  }
  cm_info("move %" PRIx64 ": told ps:%d that its buckets are owned here "
          "(its MOVE_DONE had not reached it): it drops their rows and ends "
          "the move",
          m->undone_id, u->from);
  m->undone_id = 0;
}

static void *move_thread(void *arg) {
  struct psd_move *m = arg;
  struct psd_server *srv = m->srv;
  struct psd_move_result res;
  char err[1200];
  double t0 = cm_mono_ms();
  tell_undone(m);
  int rc = psd_move_buckets(srv->service, m->peers, srv->shard, m->now.from,
                            srv->spec->nps, m->now.set, m->now.move_to,
                            m->now.moved, srv->ckpt, &res, err, sizeof err);
  if (!rc && res.undone) {
    m->undone_id = res.undone;
    m->undone = m->now;
  }
  struct cm_rpc_call *call = m->call;
  int from = m->now.from;
  /* A standby shard holds rows now (a move cancelled part way leaves
   * them here while the job trains). */
  if (!rc && __atomic_load_n(&srv->standby, __ATOMIC_ACQUIRE) &&
      !__atomic_load_n(&srv->holding, __ATOMIC_ACQUIRE))
    psd_move_hold(srv, "by this move");
  /* Not busy before the answer leaves: the orchestrator's next call, made
   * once it has the answer, is taken (it joins this thread first, so
   * nothing of m is touched after this). */
  pthread_mutex_lock(&m->lock);
  m->busy = 0;
  pthread_mutex_unlock(&m->lock);
  if (rc) {
    grpc_status_code code = rc == CM_ERPC && res.status != GRPC_STATUS_OK
                                ? (grpc_status_code)res.status
                            : rc == CM_ENOMEM ? GRPC_STATUS_RESOURCE_EXHAUSTED
                            : rc == CM_EPROTO ? GRPC_STATUS_INTERNAL
                                              : GRPC_STATUS_FAILED_PRECONDITION;
    cm_warn("MoveBuckets from ps:%d: %s", from, err);
    cm_rpc_fail(call, code, "MoveBuckets from ps:%d to ps:%d: %s", from,
                srv->shard, err);
  } else {
    Psd__V1__MoveBucketsResponse r = PSD__V1__MOVE_BUCKETS_RESPONSE__INIT;
    r.rows = res.rows;
    r.bytes = res.bytes;
    r.rounds = res.rounds;
    r.pause_us = res.pause_us;
    r.lag_rows = res.lag_rows;
    cm_info("moved buckets from ps:%d: %" PRIu64 " rows, %" PRIu64
            " bytes in %u copies and the hand-over (%.1f ms: copies %.1f, "
            "installs %.1f, move file %.1f, the source's drop %.1f; the "
            "pause %.1f ms, its call %.1f; then the hand-over's part of the "
            "move file %.1f)",
            from, res.rows, res.bytes, res.rounds, cm_mono_ms() - t0,
            res.copy_ms, res.install_ms, res.file_ms, res.done_ms,
            res.pause_us / 1e3, res.hand_call_ms, res.hand_file_ms);
    cm_rpc_reply(call, cm_rpc_pack(&r.base));
  }
  return NULL;
}

static void on_move_buckets(struct cm_rpc_call *call, grpc_byte_buffer *bb,
                            void *ctx) {
  struct psd_move *m = ctx;
  struct psd_server *srv = m->srv;
  char err[512];
  Psd__V1__MoveBucketsRequest *req =
      (Psd__V1__MoveBucketsRequest *)cm_request_open(
          &m->host, call, bb, &psd__v1__move_buckets_request__descriptor,
          "MoveBuckets", NULL);
  if (!req)
    return;
  if (req->buckets.len != PSD_MOVE_SET_BYTES) {
    cm_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT,
                "MoveBuckets: buckets holds %zu bytes; a set of %u buckets is "
                "%d bytes (bucket b at bit b %% 8 of byte b / 8)",
                req->buckets.len, CM_LAYOUT_BUCKETS, PSD_MOVE_SET_BYTES);
    goto out;
  }
  if (psd_service_movable(srv->service, err, sizeof err)) {
    cm_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION, "MoveBuckets: %s", err);
    goto out;
  }
  if (req->from < 0 || req->from >= srv->spec->nps || req->from == srv->shard) {
    cm_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT,
                "MoveBuckets: from %d: the source is another shard of the "
                "spec's %d (0..%d), not this ps:%d",
                req->from, srv->spec->nps, srv->spec->nps - 1, srv->shard);
    goto out;
  }
  int b = psd_service_owns_any(srv->service, req->buckets.data);
  if (b >= 0) {
    cm_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION,
                "MoveBuckets: ps:%d owns bucket %d already; move only "
                "buckets it lacks",
                srv->shard, b);
    goto out;
  }
  pthread_mutex_lock(&m->lock);
  if (m->busy) {
    pthread_mutex_unlock(&m->lock);
    cm_rpc_fail(call, GRPC_STATUS_ABORTED,
                "MoveBuckets: ps:%d is taking buckets from ps:%d already; "
                "one move at a time",
                srv->shard, m->now.from);
    goto out;
  }
  if (m->joinable) {
    pthread_join(m->thread, NULL); /* done: busy is 0 */
    m->joinable = 0;
  }
  if (!m->peers && psd_peers_new(&m->peers, srv->spec,
                                 &(struct psd_peer_opts){.who = "psd (move)"},
                                 err, sizeof err)) {
    pthread_mutex_unlock(&m->lock);
    cm_rpc_fail(call, GRPC_STATUS_INTERNAL,
                "MoveBuckets: cannot call the shards: %s", err);
    goto out;
  }
  m->call = call;
  m->now.from = req->from;
  memcpy(m->now.set, req->buckets.data, PSD_MOVE_SET_BYTES);
  m->now.move_to = (int)req->move_to;
  m->now.moved = (int)req->moved;
  m->busy = 1;
  if (pthread_create(&m->thread, NULL, move_thread, m)) {
    m->busy = 0;
    pthread_mutex_unlock(&m->lock);
    cm_rpc_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED,
                "MoveBuckets: cannot start a thread");
    goto out;
  }
  m->joinable = 1;
  pthread_mutex_unlock(&m->lock);
out:
  cm_request_free(&req->base);
}

int psd_move_new(struct psd_move **out, struct psd_server *srv) {
  struct psd_move *m = calloc(1, sizeof *m);
  *out = m;
  if (!m)
    return CM_ENOMEM;
  m->srv = srv;
  cm_request_host_init(&m->host, srv->spec->job.name, "shard", "shard %d",
                       srv->shard);
  m->host.self = &srv->self;
  m->method =
      (struct cm_rpc_method){"/psd.v1.Admin/MoveBuckets", on_move_buckets, m};
  pthread_mutex_init(&m->lock, NULL);
  return 0;
}

void psd_move_free(struct psd_move *m) {
  if (!m)
    return;
  if (m->joinable)
    pthread_join(m->thread, NULL);
  psd_peers_free(m->peers);
  pthread_mutex_destroy(&m->lock);
  free(m);
}

const struct cm_rpc_method *psd_move_methods(struct psd_move *m, int *n) {
  *n = 1;
  return &m->method;
}
