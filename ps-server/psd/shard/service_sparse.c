/* psd.v1.Data/SparsePull, and Data/SparsePush's payload (psd__push_sparse;
 * the push's pipeline is service_push.c's, as a dense push's): rows of an
 * embedding table (tables.h, table.h) by id. Ids arrive as the bulk field
 * (a pull) or a field of the head (a push), raw u64 little-endian, read
 * once; a pull's rows leave as the answer's bulk field from one buffer; a
 * push's gradients (field 15) are read once into a buffer and applied, or
 * staged for a sync step (sstage.h). Every id is checked first, against
 * the table's bound and this shard's share of the ids (the layout's,
 * cm_layout_map_id_shard), and a push's width against the table's dim, so a
 * refused call changes nothing. A sync pull for the step after the last
 * one closed is parked like a dense one (service_pull.c). The version
 * either answer carries is, in sync mode, the steps committed; in async
 * mode, the pushes applied to the table on this shard (table.h: a push is
 * one SparsePush message, however many rows it names). */
#include "service_internal.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "err.h"
#include "layout.h"
#include "steps.h"
#include "wire.h"

/* gRPC's default receive limit, for a caller that names none. */
#define STOCK_ANSWER (4u << 20)
/* Room for an answer's head (its small fields and the bulk key). */
#define HEAD_ROOM 64

struct psd__sparse_pull {
  struct psd_table *t; /* borrowed: tables live as long as psd */
  uint64_t *ids;       /* owned, n */
  size_t n;            /* ids asked for */
  unsigned epoch;      /* svc->owned_epoch when its ids were checked */
};

void psd__sparse_pull_free(struct psd__sparse_pull *sp) {
  if (!sp)
    return;
  free(sp->ids);
  free(sp);
}

static void release_free(void *p) { free(p); }

/* An async table's version: the pushes applied to it on this shard. */
static uint64_t table_pushes(struct psd_table *t) {
  struct psd_table_stats st;
  psd_table_stats(t, &st);
  return st.pushes;
}

struct psd_table *psd__find_table(struct psd_service *svc,
                                  struct cm_rpc_call *call, const char *name,
                                  const char *what) {
  struct psd_table *t = svc->tables ? psd_tables_find(svc->tables, name) : NULL;
  if (!name || !name[0])
    psd__fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
              "%s: the request names no table (its table field is empty)",
              what);
  else if (!t)
    psd__fail(svc, call, GRPC_STATUS_NOT_FOUND,
              "%s: shard %d has no table '%.200s'; declare it (Declare's "
              "tables) or name it in the spec's job.tables",
              what, svc->shard, name ? name : "");
  return t;
}

/* Checks ids[from..to) (positions in the call): each inside the table's
 * bound and held by this shard: in a bucket it owns (the bucket rule), or
 * its shard by the map (the modulo rule). An id of a bucket it does not
 * own is misplaced (INVALID_ARGUMENT) unless a live move has touched this
 * shard or the map gives it this shard (then its bucket moved:
 * psd__refuse_moved). Returns 0, or -1 once the call is answered. */
static int check_ids(struct psd_service *svc, struct cm_rpc_call *call,
                     const struct cm_table_conf *c, const uint64_t *ids,
                     size_t from, size_t to, const char *what) {
  for (size_t i = from; i < to; i++) {
    if (c->id_bound && ids[i] >= c->id_bound) {
      psd__fail(svc, call, GRPC_STATUS_OUT_OF_RANGE,
                "%s '%s': id %llu (position %zu) is beyond the table's bound; "
                "ids must be below id_bound %llu",
                what, c->name, (unsigned long long)ids[i], i,
                (unsigned long long)c->id_bound);
      return -1;
    }
    if (svc->gate && psd__owns(svc, ids[i]))
      continue;
    int owner = cm_layout_map_id_shard(&svc->map, ids[i]);
    if (svc->gate && (owner == svc->shard || atomic_load(&svc->relocating))) {
      psd__refuse_moved(svc, call, c->name, ids[i]);
      return -1;
    }
    if (owner != svc->shard) {
      char rule[96];
      psd__fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
                "%s '%s': id %llu (position %zu) belongs to shard %d, not "
                "shard %d (%s)",
                what, c->name, (unsigned long long)ids[i], i, owner, svc->shard,
                cm_layout_map_text(&svc->map, rule, sizeof rule));
      return -1;
    }
  }
  return 0;
}

/* Async, with owned_gate held for reading: checks again the ids of a call
 * whose gate check saw another epoch (a hand-over flipped the owned set
 * since). Returns 0, or -1 once the call is answered "layout moved". */
static int recheck_ids(struct psd_service *svc, struct cm_rpc_call *call,
                       struct psd_table *t, const uint64_t *ids, size_t n,
                       unsigned epoch) {
  if (!svc->gate || atomic_load(&svc->owned_epoch) == epoch)
    return 0;
  for (size_t i = 0; i < n; i++)
    if (!psd__owns(svc, ids[i])) {
      psd__refuse_moved(svc, call, psd_table_conf(t)->name, ids[i]);
      return -1;
    }
  return 0;
}

/* Reads and checks the ids of a call: *n of them, every one inside the
 * table's bound and held by this shard. A pull's ids (the bulk field, m)
 * are read straight out of the received slices, each slice's checked while
 * it is in cache (an id split between two slices is joined); a push's are
 * a field of the head (whole; NULL when empty). *epoch: the owned set's
 * epoch they were checked against. Returns the ids (the caller frees
 * them) or NULL once the call is answered. */
static uint64_t *take_ids(struct psd_service *svc, struct cm_rpc_call *call,
                          struct psd_table *t, const uint8_t *whole,
                          const struct cm_wire_msg *m, size_t len, size_t *n,
                          unsigned *epoch, const char *what) {
  const struct cm_table_conf *c = psd_table_conf(t);
  uint64_t *ids;
  size_t k = 0;
  /* Before the bits are read: a flip after this changes it. */
  *epoch = atomic_load(&svc->owned_epoch);
  if (len % sizeof(uint64_t)) {
    psd__fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
              "%s '%s': ids hold %zu bytes, not a whole number of 8-byte "
              "ids",
              what, c->name, len);
    return NULL;
  }
  *n = len / sizeof(uint64_t);
  if (!(ids = malloc(len + 1))) {
    psd__fail(svc, call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    return NULL;
  }
  if (!m) {
    if (len)
      memcpy(ids, whole, len);
    k = *n;
    if (check_ids(svc, call, c, ids, 0, k, what))
      goto bad;
    return ids;
  }
  uint8_t *dst = (uint8_t *)ids;
  size_t have = 0; /* bytes of an id split between slices, in dst */
  for (int i = 0; i < m->nbulk; i++) {
    const uint8_t *p = m->bulk[i].ptr;
    size_t left = m->bulk[i].len, from = k;
    if (have) {
      size_t take =
          sizeof(uint64_t) - have < left ? sizeof(uint64_t) - have : left;
      memcpy(dst + k * sizeof(uint64_t) + have, p, take);
      p += take;
      left -= take;
      if ((have += take) < sizeof(uint64_t))
        continue;
      have = 0;
      k++;
    }
    size_t whole_ids = left / sizeof(uint64_t);
    memcpy(dst + k * sizeof(uint64_t), p, whole_ids * sizeof(uint64_t));
    k += whole_ids;
    if ((have = left % sizeof(uint64_t)))
      memcpy(dst + k * sizeof(uint64_t), p + whole_ids * sizeof(uint64_t),
             have);
    if (check_ids(svc, call, c, ids, from, k, what))
      goto bad;
  }
  return ids;
bad:
  free(ids);
  return NULL;
}

void psd__sparse_answer_rolled_back(struct psd_service *svc,
                                    struct cm_rpc_call *call) {
  Psd__V1__SparsePullResponse r = PSD__V1__SPARSE_PULL_RESPONSE__INIT;
  struct psd_steps_state st;
  psd_steps_state(svc->steps, &st);
  r.rolled_back = 1;
  r.rollback_step = st.rollback_step;
  r.gen = st.gen;
  r.version = st.version;
  cm_rpc_reply(call, cm_rpc_pack(&r.base));
}

void psd__sparse_answer(struct psd_service *svc, struct cm_rpc_call *call,
                        struct psd__sparse_pull *sp, double start) {
  Psd__V1__SparsePullResponse resp = PSD__V1__SPARSE_PULL_RESPONSE__INIT;
  const struct cm_table_conf *c = psd_table_conf(sp->t);
  size_t bytes = sp->n * c->dim * sizeof(float);
  uint8_t head[HEAD_ROOM];
  float *rows = malloc(bytes + 1);
  int rc;
  if (!rows) {
    psd__fail(svc, call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  if (svc->steps) {
    pthread_rwlock_rdlock(&svc->tables_gate);
    resp.version = psd_steps_version(svc->steps);
    rc = psd_table_pull(sp->t, sp->ids, sp->n, rows);
    pthread_rwlock_unlock(&svc->tables_gate);
  } else {
    /* The gate to the pull (which stores rows too), as a push's. */
    pthread_rwlock_rdlock(&svc->owned_gate);
    if (recheck_ids(svc, call, sp->t, sp->ids, sp->n, sp->epoch)) {
      pthread_rwlock_unlock(&svc->owned_gate);
      free(rows);
      return;
    }
    rc = psd_table_pull(sp->t, sp->ids, sp->n, rows);
    pthread_rwlock_unlock(&svc->owned_gate);
    resp.version = table_pushes(sp->t);
  }
  if (rc) {
    free(rows);
    psd__fail(svc, call, GRPC_STATUS_RESOURCE_EXHAUSTED,
              "SparsePull '%s': out of memory creating rows on shard %d",
              c->name, svc->shard);
    return;
  }
  resp.dim = c->dim;
  size_t head_len = protobuf_c_message_pack(&resp.base, head);
  struct cm_wire_piece piece = {(const uint8_t *)rows, bytes};
  atomic_fetch_add(&svc->sparse_pulls, 1);
  atomic_fetch_add(&svc->bytes_out, bytes);
  cm_rpc_reply(call,
               cm_wire_build(head, head_len, &piece, 1, release_free, rows));
  psd_hist_observe(&svc->pull_time, (cm_mono_ms() - start) / 1e3);
}

void psd__on_sparse_pull(struct cm_rpc_call *call, grpc_byte_buffer *bb,
                         void *ctx) {
  struct psd_service *svc = ctx;
  double start = cm_mono_ms();
  struct cm_wire_msg m;
  struct psd__sparse_pull *sp = NULL;
  Psd__V1__SparsePullRequest *req =
      (Psd__V1__SparsePullRequest *)cm_request_open(
          &svc->host, call, bb, &psd__v1__sparse_pull_request__descriptor,
          "SparsePull", &m);
  if (!req)
    goto out;
  struct psd_table *t = psd__find_table(svc, call, req->table, "SparsePull");
  if (!t)
    goto out;
  const struct cm_table_conf *c = psd_table_conf(t);
  uint64_t accept =
      req->max_answer_bytes ? req->max_answer_bytes : STOCK_ANSWER;
  uint64_t cap =
      accept < svc->limits.max_message ? accept : svc->limits.max_message;
  uint64_t nids = m.bulk_len / sizeof(uint64_t);
  if (nids * c->dim * sizeof(float) + HEAD_ROOM > cap) {
    psd__fail(svc, call, GRPC_STATUS_RESOURCE_EXHAUSTED,
              "SparsePull '%s': %llu ids of dim %u make an answer of %llu "
              "bytes; shard %d answers at most %llu (the smaller of the "
              "caller's max_answer_bytes, 0 meaning 4 MiB, and "
              "job.max_message_mb): ask for at most %llu ids at once",
              c->name, (unsigned long long)nids, c->dim,
              (unsigned long long)(nids * c->dim * sizeof(float)), svc->shard,
              (unsigned long long)cap,
              (unsigned long long)((cap - HEAD_ROOM) / (c->dim * 4)));
    goto out;
  }
  if (!(sp = calloc(1, sizeof *sp))) {
    psd__fail(svc, call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    goto out;
  }
  sp->t = t;
  if (!(sp->ids = take_ids(svc, call, t, NULL, &m, m.bulk_len, &sp->n,
                           &sp->epoch, "SparsePull")))
    goto out;
  if (req->min_version > 0 && svc->steps) {
    int go = psd__park(svc, call, req->min_version, req->gen, NULL, sp);
    if (go == 0)
      sp = NULL; /* parked: the list owns it */
    if (go != 1)
      goto out;
  }
  psd__sparse_answer(svc, call, sp, start);
out:
  psd__sparse_pull_free(sp);
  cm_wire_msg_release(&m);
  cm_request_free((ProtobufCMessage *)req);
}

/* ---- a sparse push's payload (psd__push_sparse): rows of a table by
 * id; the pipeline is service_push.c's ---- */

/* The table's version now: the steps committed (sync), or the pushes
 * applied to it (async). */
static void current_version(struct psd__push *p) {
  p->version =
      p->svc->steps ? psd_steps_version(p->svc->steps) : table_pushes(p->table);
}

/* Answers a sparse push with the version recorded, or, when the job
 * rolled back from its generation, with the steps' state. */
static void answer_push(struct psd__push *p) {
  Psd__V1__SparsePushResponse r = PSD__V1__SPARSE_PUSH_RESPONSE__INIT;
  r.version = p->rolled ? p->rolled->version : p->version;
  if (p->rolled) {
    r.rolled_back = 1;
    r.rollback_step = p->rolled->rollback_step;
    r.gen = p->rolled->gen;
  }
  cm_rpc_reply(p->call, cm_rpc_pack(&r.base));
}

/* Step 2: the table, every id (take_ids) and the rows' width against the
 * data field; sets p->table, p->ids, p->total. Returns 0, 1 for a push of
 * no ids and no data, or -1 once the call is answered. */
static int check_rows(struct psd__push *p) {
  struct psd_service *svc = p->svc;
  const Psd__V1__SparsePushRequest *req = p->rows;
  struct cm_rpc_call *call = p->call;
  size_t n, bulk = p->m.bulk_len;
  if (!(p->table = psd__find_table(svc, call, req->table, "SparsePush")))
    return -1;
  const struct cm_table_conf *c = psd_table_conf(p->table);
  if (!(p->ids = take_ids(svc, call, p->table, req->ids.data, NULL,
                          req->ids.len, &p->nids, &p->epoch, "SparsePush")))
    return -1;
  n = p->nids;
  if (bulk != n * c->dim * sizeof(float)) {
    uint64_t width = n ? bulk / sizeof(float) / n : 0;
    if (!n)
      psd__fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
                "SparsePush '%s': no ids, but data holds %zu bytes of "
                "gradient; send one row of %u floats per id, or neither",
                c->name, bulk, c->dim);
    else if (bulk && bulk % (n * sizeof(float)) == 0)
      psd__fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
                "SparsePush '%s': row gradients of width %llu; the table's "
                "rows have width %u (dim)",
                c->name, (unsigned long long)width, c->dim);
    else
      psd__fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
                "SparsePush '%s': %zu ids need %zu bytes of gradient (dim "
                "%u); data holds %zu",
                c->name, n, n * c->dim * sizeof(float), c->dim, bulk);
    return -1;
  }
  if (!n)
    return 1;
  p->total = p->wire = bulk;
  return 0;
}

/* Step 4: names element bad of the gradient by the table and its row's
 * id. */
static void describe_row(const struct psd__push *p, size_t bad, char *what,
                         size_t len) {
  const struct cm_table_conf *c = psd_table_conf(p->table);
  snprintf(what, len, "SparsePush '%s': the gradient of id %llu holds %s",
           c->name, (unsigned long long)p->ids[bad / c->dim],
           isnan(p->grad[bad]) ? "NaN" : "an infinity");
}

/* Step 5: applies the rows (async) or stages them for the push's step
 * (sync). Returns 0, or -1 once the call is answered. */
static int apply_rows(struct psd__push *p) {
  struct psd_service *svc = p->svc;
  const char *name = psd_table_conf(p->table)->name;
  if (p->skip) {
    current_version(p);
    return 0;
  }
  if (!svc->steps) {
    /* Held from the gate's check to the apply: a hand-over's flip waits
     * for it, so the rows are in its last copy, or refused here. */
    pthread_rwlock_rdlock(&svc->owned_gate);
    if (recheck_ids(svc, p->call, p->table, p->ids, p->nids, p->epoch)) {
      pthread_rwlock_unlock(&svc->owned_gate);
      psd__push_give_back(p);
      return -1;
    }
    int rc = psd_table_push(p->table, p->ids, p->nids, p->grad, 1.0f,
                            psd__shard_step(svc));
    pthread_rwlock_unlock(&svc->owned_gate);
    if (rc) {
      psd__push_give_back(p);
      psd__fail(svc, p->call, GRPC_STATUS_RESOURCE_EXHAUSTED,
                "SparsePush '%s': out of memory on shard %d; nothing applied",
                name, svc->shard);
      return -1;
    }
    p->version = table_pushes(p->table);
    return 0;
  }
  pthread_rwlock_rdlock(&svc->tables_gate);
  uint64_t version = psd_steps_version(svc->steps);
  int rc = 0;
  if (p->step < version)
    rc = CM_ERANGE;
  else if (p->step > version)
    rc = CM_EINVAL;
  else
    rc = psd_sstage_put(svc->sstage, p->worker, p->step, p->table, p->ids,
                        p->nids, p->grad);
  pthread_rwlock_unlock(&svc->tables_gate);
  if (rc) {
    char msg[512];
    if (rc == CM_ENOMEM)
      snprintf(msg, sizeof msg,
               "SparsePush '%s': out of memory staging %zu rows", name,
               p->nids);
    else
      snprintf(msg, sizeof msg,
               rc == CM_ERANGE
                   ? "SparsePush '%s': step %llu is closed on shard %d (it "
                     "has committed %llu steps); the gradient is dropped"
                   : "SparsePush '%s': step %llu is not open on shard %d (it "
                     "has committed %llu steps)",
               name, (unsigned long long)p->step, svc->shard,
               (unsigned long long)version);
    return psd__push_refuse_stage(p, rc, msg);
  }
  p->version = version;
  return 0;
}

const struct psd__push_payload psd__push_sparse = {
    .call = "SparsePush",
    .gen_what = "SparsePush",
    .reject = "%s (job.nonfinite is \"reject\": nothing applied)",
    .check = check_rows,
    .describe = describe_row,
    .apply = apply_rows,
    .current = current_version,
    .answer = answer_push,
};

int psd__sparse_commit(struct psd_service *svc, uint64_t step,
                       const int *applied, int napplied) {
  return svc->sstage ? psd_sstage_commit(svc->sstage, step, applied, napplied)
                     : 0;
}
