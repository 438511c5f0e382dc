/* A live move of buckets, the shard's side (docs/reshard.md "Live moves
 * (the shard side)"): the buckets this shard owns, which gate its sparse
 * calls (service_sparse.c asks psd__owns and refuses the others "layout
 * moved: ..."), and Admin/MoveRows, which a move's destination calls on
 * its source:
 *   MOVE_COPY      the rows of the buckets (table.h's move snapshot: every
 *                  row the first time, then those changed since and the ids
 *                  evicted since), every table;
 *   MOVE_HANDOVER  the buckets stop being owned here (the owned set flips
 *                  under owned_gate's write lock, so a call that passed the
 *                  gate has applied and none lands after), the last
 *                  changes; the rows stay until the destination says
 *                  what became of them:
 *   MOVE_DONE      it owns them: the rows are dropped here, the move state
 *                  adopted, the move ended (asked again, the move just
 *                  ended is answered OK: an answer lost is asked again);
 *   MOVE_CANCEL    the move is forgotten; this shard owns every bucket of
 *                  it again, after a hand-over too (nothing was dropped).
 * One move at a time, named by the destination's id; copies and the
 * hand-over run on a thread of their own (a copy holds every stripe of a
 * table while it copies, and the answer can be large), never on gRPC's.
 * Async jobs with rows by buckets only: a sync job's steps and the modulo
 * rule's rows move by psctl reshard's stop and cut. */
#include "service_internal.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "layout.h"
#include "log.h"
#include "table.h"
#include "tables.h"

/* Bytes of one row's statistics in MoveTable.stats (ps.proto): count
 * (u32), t (u32), last_step (u64), little-endian. */
#define STATS_BYTES 16

/* Whether bucket b is in a wire set (bucket b at bit b % 8 of byte b / 8). */
static int in_set(const uint8_t *set, unsigned b) {
  return set[b >> 3] >> (b & 7) & 1;
}

void psd__owned_init(struct psd_service *svc) {
  uint64_t w[PSD__BUCKET_WORDS] = {0};
  svc->gate = svc->map.rule != CM_LAYOUT_RULE_MODULO;
  for (unsigned b = 0; b < CM_LAYOUT_BUCKETS; b++)
    if (svc->map.shard[b] == svc->shard)
      w[b >> 6] |= (uint64_t)1 << (b & 63);
  for (int i = 0; i < PSD__BUCKET_WORDS; i++)
    __atomic_store_n(&svc->owned[i], w[i], __ATOMIC_RELAXED);
  atomic_fetch_add(&svc->owned_epoch, 1);
}

void psd__owned_moving(struct psd_service *svc, int to, int moved) {
  struct cm_layout_map *m = malloc(sizeof *m);
  uint64_t w[PSD__BUCKET_WORDS] = {0};
  if (!m || !svc->gate) { /* without memory: the layout's own set */
    free(m);
    return;
  }
  cm_layout_map_moving(m, svc->nshards, to, moved);
  for (unsigned b = 0; b < CM_LAYOUT_BUCKETS; b++)
    if (m->shard[b] == svc->shard)
      w[b >> 6] |= (uint64_t)1 << (b & 63);
  for (int i = 0; i < PSD__BUCKET_WORDS; i++)
    __atomic_store_n(&svc->owned[i], w[i], __ATOMIC_RELAXED);
  atomic_fetch_add(&svc->owned_epoch, 1);
  free(m);
}

int psd__owned_count(struct psd_service *svc) {
  int n = 0;
  if (!svc->gate)
    return 0;
  for (int i = 0; i < PSD__BUCKET_WORDS; i++)
    n +=
        __builtin_popcountll(__atomic_load_n(&svc->owned[i], __ATOMIC_RELAXED));
  return n;
}

/* Adopts the move state (move_to shards after `moved` moves; 0 move_to:
 * none given); a shard never goes back to fewer moves. */
static void adopt(struct psd_service *svc, int move_to, int moved) {
  struct cm_request_self *me = svc->self_rw;
  if (move_to > 0 && me &&
      moved >= __atomic_load_n(&me->moved, __ATOMIC_ACQUIRE)) {
    __atomic_store_n(&me->move_to, move_to, __ATOMIC_RELEASE);
    __atomic_store_n(&me->moved, moved, __ATOMIC_RELEASE);
  }
}

/* Adds (own 1) or removes (own 0) the buckets of set, and adopts the move
 * state, with owned_gate held for writing: every sparse call that passed
 * the gate before has applied, and every later one checks again. */
static void flip(struct psd_service *svc, const uint8_t *set, int own,
                 int move_to, int moved) {
  pthread_rwlock_wrlock(&svc->owned_gate);
  for (unsigned b = 0; b < CM_LAYOUT_BUCKETS; b++) {
    if (!in_set(set, b))
      continue;
    uint64_t bit = (uint64_t)1 << (b & 63);
    uint64_t w = __atomic_load_n(&svc->owned[b >> 6], __ATOMIC_RELAXED);
    __atomic_store_n(&svc->owned[b >> 6], own ? w | bit : w & ~bit,
                     __ATOMIC_RELAXED);
  }
  adopt(svc, move_to, moved);
  atomic_fetch_add(&svc->owned_epoch, 1); /* after the bits: release */
  pthread_rwlock_unlock(&svc->owned_gate);
}

void psd_service_layout_hold(struct psd_service *svc, uint64_t *layout,
                             int *shards, int *move_to, int *moved) {
  const struct cm_request_self *me = svc->self_rw;
  pthread_rwlock_rdlock(&svc->owned_gate);
  *layout = me ? __atomic_load_n(&me->layout, __ATOMIC_ACQUIRE) : 0;
  *shards = me ? __atomic_load_n(&me->nshards, __ATOMIC_ACQUIRE) : 0;
  if (*shards < 1)
    *shards = svc->nshards;
  *move_to = me ? __atomic_load_n(&me->move_to, __ATOMIC_ACQUIRE) : 0;
  *moved = me ? __atomic_load_n(&me->moved, __ATOMIC_ACQUIRE) : 0;
  if (*move_to < 1)
    *move_to = *moved = 0;
}

void psd_service_layout_release(struct psd_service *svc) {
  pthread_rwlock_unlock(&svc->owned_gate);
}

int psd_service_movable(struct psd_service *svc, char *msg, size_t len) {
  if (svc->steps) {
    snprintf(msg, len,
             "live bucket moves need an async job (job.sync.mode async); "
             "psctl reshard stops and cuts sync jobs");
    return CM_EINVAL;
  }
  if (!svc->gate) {
    snprintf(msg, len,
             "live bucket moves need rows placed by buckets, and ps:%d places "
             "them by splitmix64(id) %% %d (a checkpoint written before "
             "buckets); psctl reshard cuts it into buckets",
             svc->shard, svc->nshards);
    return CM_EINVAL;
  }
  if (!svc->tables) {
    snprintf(msg, len, "ps:%d serves no tables: it has no rows to move",
             svc->shard);
    return CM_EINVAL;
  }
  return 0;
}

int psd_service_owns_any(struct psd_service *svc, const uint8_t *set) {
  for (unsigned b = 0; b < CM_LAYOUT_BUCKETS; b++)
    if (in_set(set, b) &&
        (__atomic_load_n(&svc->owned[b >> 6], __ATOMIC_RELAXED) >> (b & 63) &
         1))
      return (int)b;
  return -1;
}

void psd_service_own(struct psd_service *svc, const uint8_t *set, int move_to,
                     int moved) {
  flip(svc, set, 1, move_to, moved);
}

void psd_service_relocating(struct psd_service *svc) {
  atomic_store(&svc->relocating, 1);
}

void psd__move_wait(struct psd_service *svc) {
  pthread_mutex_lock(&svc->move_lock);
  while (svc->move_threads > 0)
    pthread_cond_wait(&svc->move_idle, &svc->move_lock);
  pthread_mutex_unlock(&svc->move_lock);
}

/* ---- Admin/MoveRows ---- */

/* One MoveRows call on its thread. */
struct move_call {
  struct psd_service *svc;  /* the source's service */
  struct cm_rpc_call *call; /* answered by the thread */
  Psd__V1__MovePhase phase; /* MOVE_COPY, MOVE_HANDOVER or MOVE_DONE */
  uint64_t move;            /* the move's id */
  int move_to, moved;       /* the move state the hand-over adopts */
};

/* An answer's tables: the snapshots and the packed statistics they point
 * into. */
struct answer {
  int n;                          /* tables */
  struct psd_table_snap **snaps;  /* n, owned */
  uint8_t **stats;                /* n packed statistics, owned */
  Psd__V1__MoveTable *tables;     /* n */
  Psd__V1__MoveTable **ptrs;      /* n: tables[i] */
  Psd__V1__TableSpec *specs;      /* n */
  Psd__V1__MoveRowsResponse resp; /* the answer, over the above */
};

static void answer_free(struct answer *a) {
  for (int i = 0; i < a->n; i++) {
    if (a->snaps)
      psd_table_snap_free(a->snaps[i]);
    if (a->stats)
      free(a->stats[i]);
  }
  free(a->snaps);
  free(a->stats);
  free(a->tables);
  free(a->ptrs);
  free(a->specs);
}

/* Takes every table's move snapshot of the set into a and fills its answer.
 * Returns 0 or CM_ENOMEM. */
static int take(struct psd_service *svc, const uint8_t *set, struct answer *a) {
  int n = psd_tables_count(svc->tables);
  uint64_t bytes = 0;
  *a = (struct answer){.n = n};
  a->resp = (Psd__V1__MoveRowsResponse)PSD__V1__MOVE_ROWS_RESPONSE__INIT;
  a->snaps = calloc((size_t)n + 1, sizeof *a->snaps);
  a->stats = calloc((size_t)n + 1, sizeof *a->stats);
  a->tables = calloc((size_t)n + 1, sizeof *a->tables);
  a->ptrs = calloc((size_t)n + 1, sizeof *a->ptrs);
  a->specs = calloc((size_t)n + 1, sizeof *a->specs);
  if (!a->snaps || !a->stats || !a->tables || !a->ptrs || !a->specs)
    return CM_ENOMEM;
  for (int i = 0; i < n; i++) {
    struct psd_table *t = psd_tables_at(svc->tables, i);
    const struct cm_table_conf *c = psd_table_conf(t);
    struct psd_table_snap *s;
    if (psd_table_move_snapshot(t, set, 1, &a->snaps[i]))
      return CM_ENOMEM;
    s = a->snaps[i];
    if (!(a->stats[i] = malloc(s->nrows * STATS_BYTES + 1)))
      return CM_ENOMEM;
    for (size_t r = 0; r < s->nrows; r++) {
      uint8_t *p = a->stats[i] + r * STATS_BYTES;
      memcpy(p, &s->stats[r].count, 4); /* little-endian hosts only, as */
      memcpy(p + 4, &s->stats[r].t, 4); /* the wire's ids and floats */
      memcpy(p + 8, &s->stats[r].last_step, 8);
    }
    Psd__V1__TableSpec *sp = &a->specs[i];
    psd__v1__table_spec__init(sp);
    sp->name = (char *)c->name;
    sp->dim = c->dim;
    sp->id_bound = c->id_bound;
    Psd__V1__MoveTable *m = &a->tables[i];
    psd__v1__move_table__init(m);
    m->spec = sp;
    m->delta = s->delta;
    m->nrows = s->nrows;
    m->ids = (ProtobufCBinaryData){s->nrows * 8, (uint8_t *)s->ids};
    m->values = (ProtobufCBinaryData){s->nrows * s->dim * sizeof(float),
                                      (uint8_t *)s->values};
    m->state = (ProtobufCBinaryData){s->nrows * s->nstate * sizeof(float),
                                     (uint8_t *)s->state};
    m->stats = (ProtobufCBinaryData){s->nrows * STATS_BYTES, a->stats[i]};
    m->evicted = (ProtobufCBinaryData){s->delta ? s->nevicted * 8 : 0,
                                       (uint8_t *)s->evicted};
    a->ptrs[i] = m;
    bytes += m->ids.len + m->values.len + m->state.len + m->stats.len;
  }
  a->resp.n_tables = (size_t)n;
  a->resp.tables = a->ptrs;
  a->resp.bytes = bytes;
  return 0;
}

/* Ends the move on every table and here. */
static void end_move(struct psd_service *svc) {
  for (int i = 0; i < psd_tables_count(svc->tables); i++)
    psd_table_move_end(psd_tables_at(svc->tables, i));
  pthread_mutex_lock(&svc->move_lock);
  svc->move_id = 0;
  svc->move_handed = 0;
  pthread_mutex_unlock(&svc->move_lock);
}

/* The move's call has done its work: another may start (before its
 * answer leaves, so that the destination's next call, made once it has
 * the answer, is not refused as one running). */
static void not_busy(struct psd_service *svc) {
  pthread_mutex_lock(&svc->move_lock);
  svc->move_busy = 0;
  pthread_mutex_unlock(&svc->move_lock);
}

/* Fails a move's call, ending the move: its copies start over. */
static void fail_move(struct move_call *mc, grpc_status_code code,
                      const char *msg) {
  end_move(mc->svc);
  not_busy(mc->svc);
  psd__fail(mc->svc, mc->call, code, "MoveRows of move %llu: %s",
            (unsigned long long)mc->move, msg);
}

/* The move of set ends without its hand-over: its buckets are this
 * shard's again, after a hand-over too (handed: nothing was dropped). */
static void cancel_move(struct psd_service *svc, const uint8_t *set,
                        int handed) {
  if (handed)
    flip(svc, set, 1, 0, 0);
  end_move(svc);
}

/* The destination owns the buckets of set (move `move`, handed over):
 * the move state first, so that a call this shard refuses from now on
 * sends its client there (the rows left here until the drop are owned by
 * no one here; a checkpoint that holds them with the state, a start
 * drops); then their rows go, as evictions, and the move ends. Returns the
 * buckets; *dropped: the rows. */
static int hand_over(struct psd_service *svc, const uint8_t *set, uint64_t move,
                     int move_to, int moved, uint64_t *dropped) {
  uint64_t d;
  int nb = 0;
  *dropped = 0;
  adopt(svc, move_to, moved); /* no bit changes: no gate */
  for (unsigned b = 0; b < CM_LAYOUT_BUCKETS; b++)
    nb += in_set(set, b);
  for (int i = 0; i < psd_tables_count(svc->tables); i++) {
    struct psd_table *t = psd_tables_at(svc->tables, i);
    if (psd_table_drop_buckets(t, set, &d))
      cm_warn("move %llu: out of memory dropping the rows of table '%s' "
              "handed over; they stay here, unused",
              (unsigned long long)move, psd_table_conf(t)->name);
    *dropped += d;
  }
  end_move(svc);
  pthread_mutex_lock(&svc->move_lock);
  svc->move_last = move;
  pthread_mutex_unlock(&svc->move_lock);
  return nb;
}

/* A shard started again tells the others (MOVE_CANCEL of move 0 naming
 * itself as destination, with the moves its checkpoint and move files
 * hold; reshard/move_start.c): a move of which it was the destination,
 * open here, was lost with its last process, unless its move file holds
 * it. Not handed over: cancelled. Handed over: ended as MOVE_DONE ends
 * it when its moves say the file holds it, else cancelled, the buckets
 * owned here again (that process owned them in memory alone). Called with
 * move_lock held; releases it and answers the call. */
static void restarted(struct psd_service *svc, struct cm_rpc_call *call,
                      const Psd__V1__MoveRowsRequest *req) {
  Psd__V1__MoveRowsResponse r = PSD__V1__MOVE_ROWS_RESPONSE__INIT;
  uint8_t set[PSD__BUCKET_BYTES];
  uint64_t id = svc->move_id, dropped;
  int mine = id && req->destination && req->destination == svc->move_dest;
  if (mine && svc->move_busy) {
    pthread_mutex_unlock(&svc->move_lock);
    psd__fail(svc, call, GRPC_STATUS_ABORTED,
              "MoveRows: a call of move %llu is running on ps:%d; call again "
              "once it has answered",
              (unsigned long long)id, svc->shard);
    return;
  }
  int handed = svc->move_handed, to = svc->move_after_to,
      moved = svc->move_after_moved;
  int held =
      handed && to > 0 && (int)req->move_to == to && (int)req->moved >= moved;
  memcpy(set, svc->move_set, sizeof set);
  pthread_mutex_unlock(&svc->move_lock);
  if (!mine) {
    cm_rpc_reply(call, cm_rpc_pack(&r.base));
    return;
  }
  if (held) {
    int nb = hand_over(svc, set, id, to, moved, &dropped);
    cm_warn("move %llu: its destination ps:%u started again, and its move "
            "files hold the move (%u moves): handed over %d buckets (%llu "
            "rows) to it",
            (unsigned long long)id, req->destination - 1, req->moved, nb,
            (unsigned long long)dropped);
  } else {
    cancel_move(svc, set, handed);
    cm_warn("move %llu: its destination ps:%u started again without it (%u "
            "moves on its disk, the move makes %d): cancelled, ps:%d owns "
            "its buckets%s",
            (unsigned long long)id, req->destination - 1, req->moved, moved,
            svc->shard, handed ? " again (they were handed over)" : "");
  }
  cm_rpc_reply(call, cm_rpc_pack(&r.base));
}

static void *move_thread(void *arg) {
  struct move_call *mc = arg;
  struct psd_service *svc = mc->svc;
  struct answer a = {0};
  uint8_t set[PSD__BUCKET_BYTES];
  char msg[300];
  int rc;
  pthread_mutex_lock(&svc->move_lock);
  memcpy(set, svc->move_set, sizeof set);
  pthread_mutex_unlock(&svc->move_lock);
  if (mc->phase == PSD__V1__MOVE_PHASE__MOVE_DONE) {
    uint64_t dropped;
    int nb = hand_over(svc, set, mc->move, mc->move_to, mc->moved, &dropped);
    cm_info("move %llu: handed over %d buckets (%llu rows) to the "
            "destination",
            (unsigned long long)mc->move, nb, (unsigned long long)dropped);
    Psd__V1__MoveRowsResponse done = PSD__V1__MOVE_ROWS_RESPONSE__INIT;
    not_busy(svc);
    cm_rpc_reply(mc->call, cm_rpc_pack(&done.base));
    goto out;
  }
  int handover = mc->phase == PSD__V1__MOVE_PHASE__MOVE_HANDOVER;
  if (handover)
    flip(svc, set, 0, 0, 0);
  rc = take(svc, set, &a);
  size_t size = rc ? 0 : protobuf_c_message_get_packed_size(&a.resp.base);
  if (rc || size > svc->limits.max_message) {
    if (handover) /* nothing handed over: this shard keeps them */
      flip(svc, set, 1, 0, 0);
    if (rc)
      snprintf(msg, sizeof msg, "out of memory copying the rows on ps:%d",
               svc->shard);
    else
      snprintf(msg, sizeof msg,
               "the rows make an answer of %zu bytes; ps:%d answers at most "
               "%llu (job.max_message_mb): move fewer buckets at once",
               size, svc->shard, (unsigned long long)svc->limits.max_message);
    fail_move(mc, GRPC_STATUS_RESOURCE_EXHAUSTED, msg);
    goto out;
  }
  if (handover) {
    pthread_mutex_lock(&svc->move_lock);
    svc->move_handed = 1;
    pthread_mutex_unlock(&svc->move_lock);
  }
  atomic_fetch_add(&svc->move_bytes, a.resp.bytes);
  not_busy(svc);
  cm_rpc_reply(mc->call, cm_rpc_pack(&a.resp.base));
out:
  answer_free(&a);
  pthread_mutex_lock(&svc->move_lock);
  svc->move_threads--;
  pthread_cond_broadcast(&svc->move_idle);
  pthread_mutex_unlock(&svc->move_lock);
  free(mc);
  return NULL;
}

/* Checks a MoveRows request against the move under way and starts its
 * work (a copy, a hand-over on a thread; a cancel here). The call is
 * answered, now or by the thread. */
static void start(struct psd_service *svc, struct cm_rpc_call *call,
                  const Psd__V1__MoveRowsRequest *req) {
  const uint8_t *set = req->buckets.data;
  struct move_call *mc = NULL;
  pthread_t th;
  int first = -1;
  pthread_mutex_lock(&svc->move_lock);
  if (req->phase == PSD__V1__MOVE_PHASE__MOVE_CANCEL && !req->move) {
    restarted(svc, call, req);
    return;
  }
  if (svc->move_busy) {
    pthread_mutex_unlock(&svc->move_lock);
    psd__fail(svc, call, GRPC_STATUS_ABORTED,
              "MoveRows: a call of move %llu is running on ps:%d; call again "
              "once it has answered",
              (unsigned long long)svc->move_id, svc->shard);
    return;
  }
  if (svc->move_id && svc->move_id != req->move) {
    uint64_t other = svc->move_id;
    /* Its destination asks for another move: it runs one at a time, so
     * the open one was lost with its process. Cancelled when none of its
     * buckets can be owned there: not handed over, or the same buckets
     * asked for again (a destination asks only for buckets it lacks). */
    int lost =
        req->phase == PSD__V1__MOVE_PHASE__MOVE_COPY && req->destination &&
        req->destination == svc->move_dest &&
        (!svc->move_handed || !memcmp(svc->move_set, set, PSD__BUCKET_BYTES));
    if (!lost) {
      pthread_mutex_unlock(&svc->move_lock);
      psd__fail(svc, call, GRPC_STATUS_ABORTED,
                "MoveRows: ps:%d is the source of move %llu; move %llu waits "
                "until that one is handed over or cancelled",
                svc->shard, (unsigned long long)other,
                (unsigned long long)req->move);
      return;
    }
    int handed = svc->move_handed;
    uint8_t was[PSD__BUCKET_BYTES];
    memcpy(was, svc->move_set, sizeof was);
    pthread_mutex_unlock(&svc->move_lock);
    cancel_move(svc, was, handed);
    cm_warn("move %llu: its destination ps:%u asks for move %llu instead: "
            "the first was lost with that shard's process; cancelled, ps:%d "
            "owns its buckets%s",
            (unsigned long long)other, req->destination - 1,
            (unsigned long long)req->move, svc->shard,
            handed ? " again (they were handed over)" : "");
    pthread_mutex_lock(&svc->move_lock);
    if (svc->move_busy || svc->move_id) { /* another call came in between */
      pthread_mutex_unlock(&svc->move_lock);
      psd__fail(svc, call, GRPC_STATUS_ABORTED,
                "MoveRows: another move started on ps:%d; move %llu waits",
                svc->shard, (unsigned long long)req->move);
      return;
    }
  }
  if (req->phase == PSD__V1__MOVE_PHASE__MOVE_CANCEL) {
    int had = svc->move_id != 0, handed = svc->move_handed;
    uint8_t was[PSD__BUCKET_BYTES];
    memcpy(was, svc->move_set, sizeof was);
    pthread_mutex_unlock(&svc->move_lock);
    if (had) {
      cancel_move(svc, was, handed);
      cm_info("move %llu: cancelled by the destination; ps:%d keeps its "
              "buckets",
              (unsigned long long)req->move, svc->shard);
    }
    Psd__V1__MoveRowsResponse r = PSD__V1__MOVE_ROWS_RESPONSE__INIT;
    cm_rpc_reply(call, cm_rpc_pack(&r.base));
    return;
  }
  if (req->phase == PSD__V1__MOVE_PHASE__MOVE_DONE &&
      (!svc->move_id || !svc->move_handed)) {
    /* The move just ended, asked again (its answer was lost): done. */
    int again = !svc->move_id && svc->move_last == req->move;
    pthread_mutex_unlock(&svc->move_lock);
    if (again) {
      Psd__V1__MoveRowsResponse r = PSD__V1__MOVE_ROWS_RESPONSE__INIT;
      cm_rpc_reply(call, cm_rpc_pack(&r.base));
    } else {
      psd__fail(svc, call, GRPC_STATUS_FAILED_PRECONDITION,
                "MoveRows: ps:%d has no hand-over of move %llu to finish: "
                "MOVE_DONE follows the move's MOVE_HANDOVER",
                svc->shard, (unsigned long long)req->move);
    }
    return;
  }
  if (svc->move_handed && req->phase != PSD__V1__MOVE_PHASE__MOVE_DONE) {
    pthread_mutex_unlock(&svc->move_lock);
    psd__fail(svc, call, GRPC_STATUS_FAILED_PRECONDITION,
              "MoveRows: move %llu is handed over on ps:%d; what follows is "
              "MOVE_DONE (the destination owns the buckets) or MOVE_CANCEL",
              (unsigned long long)req->move, svc->shard);
    return;
  }
  if (!svc->move_id) {
    if (req->phase == PSD__V1__MOVE_PHASE__MOVE_HANDOVER) {
      pthread_mutex_unlock(&svc->move_lock);
      psd__fail(svc, call, GRPC_STATUS_FAILED_PRECONDITION,
                "MoveRows: ps:%d serves no move %llu: a hand-over follows "
                "the move's MOVE_COPY",
                svc->shard, (unsigned long long)req->move);
      return;
    }
    /* The first copy: every bucket of the set must be here. */
    int any = 0;
    for (unsigned b = 0; b < CM_LAYOUT_BUCKETS && first < 0; b++) {
      if (!in_set(set, b))
        continue;
      any = 1;
      if (!(__atomic_load_n(&svc->owned[b >> 6], __ATOMIC_RELAXED) >> (b & 63) &
            1))
        first = (int)b;
    }
    if (!any || first >= 0) {
      pthread_mutex_unlock(&svc->move_lock);
      if (!any)
        psd__fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
                  "MoveRows: buckets names no bucket; set bit b %% 8 of byte "
                  "b / 8 for each bucket b to move");
      else
        psd__fail(svc, call, GRPC_STATUS_FAILED_PRECONDITION,
                  "MoveRows: ps:%d does not own bucket %d (of the buckets "
                  "asked for, the first it lacks); a move takes buckets from "
                  "the shard that owns them",
                  svc->shard, first);
      return;
    }
    svc->move_id = req->move;
    svc->move_dest = req->destination;
    svc->move_after_to = (int)req->move_to;
    svc->move_after_moved = (int)req->moved;
    memcpy(svc->move_set, set, PSD__BUCKET_BYTES);
  } else if (memcmp(svc->move_set, set, PSD__BUCKET_BYTES)) {
    pthread_mutex_unlock(&svc->move_lock);
    psd__fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
              "MoveRows: move %llu's buckets differ from those of its first "
              "copy; one move keeps one set of buckets",
              (unsigned long long)req->move);
    return;
  }
  if (!(mc = calloc(1, sizeof *mc))) {
    pthread_mutex_unlock(&svc->move_lock);
    psd__fail(svc, call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  *mc = (struct move_call){.svc = svc,
                           .call = call,
                           .phase = req->phase,
                           .move = req->move,
                           .move_to = (int)req->move_to,
                           .moved = (int)req->moved};
  svc->move_busy = 1;
  svc->move_threads++;
  atomic_store(&svc->relocating, 1);
  if (pthread_create(&th, NULL, move_thread, mc)) {
    svc->move_busy = 0;
    svc->move_threads--;
    pthread_mutex_unlock(&svc->move_lock);
    free(mc);
    psd__fail(svc, call, GRPC_STATUS_RESOURCE_EXHAUSTED,
              "MoveRows: cannot start a thread on ps:%d", svc->shard);
    return;
  }
  pthread_detach(th);
  pthread_mutex_unlock(&svc->move_lock);
}

void psd__on_move_rows(struct cm_rpc_call *call, grpc_byte_buffer *bb,
                       void *ctx) {
  struct psd_service *svc = ctx;
  char msg[300];
  Psd__V1__MoveRowsRequest *req = (Psd__V1__MoveRowsRequest *)cm_request_open(
      &svc->host, call, bb, &psd__v1__move_rows_request__descriptor, "MoveRows",
      NULL);
  if (!req)
    return;
  if (psd_service_movable(svc, msg, sizeof msg))
    psd__fail(svc, call, GRPC_STATUS_FAILED_PRECONDITION, "MoveRows: %s", msg);
  else if (req->buckets.len != PSD__BUCKET_BYTES)
    psd__fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
              "MoveRows: buckets holds %zu bytes; a set of %u buckets is %u "
              "bytes (bucket b at bit b %% 8 of byte b / 8)",
              req->buckets.len, CM_LAYOUT_BUCKETS, PSD__BUCKET_BYTES);
  else if (req->phase != PSD__V1__MOVE_PHASE__MOVE_COPY &&
           req->phase != PSD__V1__MOVE_PHASE__MOVE_HANDOVER &&
           req->phase != PSD__V1__MOVE_PHASE__MOVE_CANCEL &&
           req->phase != PSD__V1__MOVE_PHASE__MOVE_DONE)
    psd__fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
              "MoveRows: phase %d is none of MOVE_COPY (0), MOVE_HANDOVER (1), "
              "MOVE_CANCEL (2), MOVE_DONE (3)",
              (int)req->phase);
  else if (!req->move && (req->phase != PSD__V1__MOVE_PHASE__MOVE_CANCEL ||
                          !req->destination))
    psd__fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
              "MoveRows: move is 0; the destination names each move with an "
              "id other than 0 (0 only in a MOVE_CANCEL naming the "
              "destination: it started again)");
  else
    start(svc, call, req);
  cm_request_free(&req->base);
}

void psd__refuse_moved(struct psd_service *svc, struct cm_rpc_call *call,
                       const char *table, uint64_t id) {
  const struct cm_request_self *me = svc->host.self;
  struct cm_request_self here = {
      .shard = svc->shard, .nshards = svc->nshards, .rows = svc->map.rule};
  char holds[200];
  if (!me)
    me = &here;
  psd__fail(svc, call, GRPC_STATUS_FAILED_PRECONDITION,
            "layout moved: %s; bucket %u (table '%s' row %llu) is no longer "
            "here; the client re-plans and calls again",
            cm_request_holds(me, holds, sizeof holds),
            cm_layout_bucket(cm_layout_id_hash(id)), table,
            (unsigned long long)id);
}
