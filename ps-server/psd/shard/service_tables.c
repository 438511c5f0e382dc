/* The embedding tables' admin side (service_internal.h): their part of
 * Declare and Status, and Admin/Rows (psctl get and top), Admin/Shrink
 * (psctl shrink) and Admin/Export (psctl export, a page of rows sorted by
 * id at a time). Each reads a table through table.h's thread-safe calls;
 * only Shrink changes one. */
#include "service_internal.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "log.h"
#include "saver.h"
#include "steps.h"
#include "wire.h"

/* Most ids or top rows one Rows call answers. */
#define MAX_ROWS 4096
/* Largest Export page: within gRPC's default receive limit (4 MiB), which
 * any caller accepts. */
#define STOCK_PAGE ((4u << 20) - 4096)

static void release_snap(void *p) { psd_table_snap_free(p); }

int psd__declare_tables(struct psd_service *svc, struct cm_rpc_call *call,
                        const Psd__V1__DeclareRequest *req) {
  char err[512];
  if (!req->n_tables)
    return 0;
  if (!svc->tables) {
    psd__fail(svc, call, GRPC_STATUS_FAILED_PRECONDITION,
              "Declare: shard %d serves no embedding tables", svc->shard);
    return -1;
  }
  if (req->n_tables > CM_TABLE_MAX) {
    psd__fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
              "Declare: %zu tables in one request; at most %d", req->n_tables,
              CM_TABLE_MAX);
    return -1;
  }
  /* Every table is checked before any is created. */
  for (size_t i = 0; i < req->n_tables; i++) {
    const Psd__V1__TableSpec *ts = req->tables[i];
    if (psd__check_name(svc, call, ts->name, "Declare table", i))
      return -1;
    if (ts->dim < 1 || ts->dim > CM_TABLE_MAX_DIM) {
      psd__fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
                "Declare table '%s': dim %u; expected 1..%d", ts->name, ts->dim,
                CM_TABLE_MAX_DIM);
      return -1;
    }
    if (psd_store_find(svc->store, ts->name)) {
      psd__fail(svc, call, GRPC_STATUS_ALREADY_EXISTS,
                "Declare table '%s': a variable of that name exists on shard "
                "%d",
                ts->name, svc->shard);
      return -1;
    }
    struct psd_table *t = psd_tables_find(svc->tables, ts->name);
    if (t) {
      const struct cm_table_conf *c = psd_table_conf(t);
      if (c->dim != ts->dim || c->id_bound != ts->id_bound) {
        psd__fail(svc, call, GRPC_STATUS_ALREADY_EXISTS,
                  "Declare table '%s': it exists on shard %d with dim %u and "
                  "id_bound %llu; declared with dim %u and id_bound %llu",
                  ts->name, svc->shard, c->dim, (unsigned long long)c->id_bound,
                  ts->dim, (unsigned long long)ts->id_bound);
        return -1;
      }
    }
  }
  for (size_t i = 0; i < req->n_tables; i++) {
    const Psd__V1__TableSpec *ts = req->tables[i];
    struct psd_table *t;
    int created = 0;
    int rc = psd_tables_declare(svc->tables, ts->name, ts->dim, ts->id_bound,
                                &t, &created, err, sizeof err);
    if (rc) {
      psd__fail(svc, call,
                rc == CM_EEXIST   ? GRPC_STATUS_ALREADY_EXISTS
                : rc == CM_ENOMEM ? GRPC_STATUS_RESOURCE_EXHAUSTED
                                  : GRPC_STATUS_INVALID_ARGUMENT,
                "Declare: %s", err);
      return -1;
    }
    if (created) {
      char opt[256];
      cm_rowopt_describe(&psd_table_conf(t)->opt, opt, sizeof opt);
      cm_info("created table '%s' dim %u, %s (declared by %.64s)", ts->name,
              ts->dim, opt,
              req->caller && req->caller->worker ? req->caller->worker : "?");
    }
  }
  return 0;
}

/* What Status's tables point at, freed in one go. */
struct status_mem {
  int n;                       /* tables */
  Psd__V1__TableStatus *ts;    /* n */
  Psd__V1__TableStatus **ptrs; /* n */
  char (*opt)[256];            /* n descriptions */
  char (*admit)[64];           /* n */
  char (*evict)[96];           /* n */
  char *(*state)[2];           /* n: the state's part names */
};

void psd__status_tables_free(void *mem) {
  struct status_mem *sm = mem;
  if (!sm)
    return;
  free(sm->ts);
  free(sm->ptrs);
  free(sm->opt);
  free(sm->admit);
  free(sm->evict);
  free(sm->state);
  free(sm);
}

int psd__status_tables(struct psd_service *svc, Psd__V1__StatusResponse *resp,
                       void **mem) {
  int n = svc->tables ? psd_tables_count(svc->tables) : 0;
  struct status_mem *sm;
  *mem = NULL;
  if (!n)
    return 0;
  if (!(sm = calloc(1, sizeof *sm)))
    return CM_ENOMEM;
  *mem = sm;
  sm->n = n;
  sm->ts = calloc((size_t)n, sizeof *sm->ts);
  sm->ptrs = calloc((size_t)n, sizeof *sm->ptrs);
  sm->opt = calloc((size_t)n, sizeof *sm->opt);
  sm->admit = calloc((size_t)n, sizeof *sm->admit);
  sm->evict = calloc((size_t)n, sizeof *sm->evict);
  sm->state = calloc((size_t)n, sizeof *sm->state);
  if (!sm->ts || !sm->ptrs || !sm->opt || !sm->admit || !sm->evict ||
      !sm->state)
    return CM_ENOMEM;
  for (int i = 0; i < n; i++) {
    struct psd_table *t = psd_tables_at(svc->tables, i);
    const struct cm_table_conf *c = psd_table_conf(t);
    struct psd_table_stats st;
    Psd__V1__TableStatus *x = &sm->ts[i];
    psd_table_stats(t, &st);
    psd__v1__table_status__init(x);
    x->name = (char *)c->name;
    x->dim = c->dim;
    x->id_bound = c->id_bound;
    cm_rowopt_describe(&c->opt, sm->opt[i], sizeof sm->opt[i]);
    x->optimizer = sm->opt[i];
    psd_tables_describe_admission(c, sm->admit[i], sizeof sm->admit[i]);
    x->admission = sm->admit[i];
    psd_tables_describe_eviction(c, sm->evict[i], sizeof sm->evict[i]);
    x->eviction = sm->evict[i];
    x->rows = st.rows;
    x->bytes = st.bytes;
    x->raw_bytes = st.raw_bytes;
    x->admitted = st.admitted;
    x->not_admitted = st.not_admitted;
    x->evicted = st.evicted;
    x->pending = st.pending;
    x->rows_pulled = st.rows_pulled;
    x->rows_pushed = st.rows_pushed;
    for (int k = 0; k < 2; k++) {
      const char *nm = cm_rowopt_state_name(c->opt.type, k);
      if (!nm)
        break;
      sm->state[i][k] = (char *)nm;
      x->n_state = (size_t)k + 1;
    }
    x->state = sm->state[i];
    sm->ptrs[i] = x;
  }
  resp->n_tables = (size_t)n;
  resp->tables = sm->ptrs;
  return 0;
}

/* Opens an admin request on a table: the request (caller frees) and the
 * table, or NULL once the call is answered. */
#define OPEN_ADMIN(type, desc, what)                                           \
  (type *)cm_request_open(&svc->host, call, bb, &desc, what, &m)

void psd__on_rows(struct cm_rpc_call *call, grpc_byte_buffer *bb, void *ctx) {
  struct psd_service *svc = ctx;
  struct cm_wire_msg m;
  Psd__V1__RowsResponse resp = PSD__V1__ROWS_RESPONSE__INIT;
  Psd__V1__Row *rows = NULL, **ptrs = NULL;
  float *vals = NULL, *state = NULL;
  uint64_t *ids = NULL;
  struct psd_row_stats *stats = NULL;
  char *parts[2];
  size_t n = 0;
  Psd__V1__RowsRequest *req = OPEN_ADMIN(
      Psd__V1__RowsRequest, psd__v1__rows_request__descriptor, "Rows");
  cm_wire_msg_release(&m);
  if (!req)
    goto out;
  struct psd_table *t = psd__find_table(svc, call, req->table, "Rows");
  if (!t)
    goto out;
  const struct cm_table_conf *c = psd_table_conf(t);
  uint32_t ns = psd_table_nstate(t);
  size_t want = req->top ? req->top : req->n_ids;
  if (want > MAX_ROWS) {
    psd__fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
              "Rows '%s': %zu rows asked for; at most %d at once", c->name,
              want, MAX_ROWS);
    goto out;
  }
  ids = calloc(want + 1, sizeof *ids);
  stats = calloc(want + 1, sizeof *stats);
  rows = calloc(want + 1, sizeof *rows);
  ptrs = calloc(want + 1, sizeof *ptrs);
  vals = calloc((want + 1) * c->dim, sizeof *vals);
  state = calloc((want + 1) * (ns + 1), sizeof *state);
  if (!ids || !stats || !rows || !ptrs || !vals || !state) {
    psd__fail(svc, call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    goto out;
  }
  if (req->top) {
    psd_table_top(t, want, ids, stats, &n);
  } else {
    if (want) /* req->ids is NULL when it has none */
      memcpy(ids, req->ids, want * sizeof *ids);
    n = want;
  }
  for (size_t i = 0; i < n; i++) {
    Psd__V1__Row *r = &rows[i];
    psd__v1__row__init(r);
    r->id = ids[i];
    r->found = psd_table_get(t, ids[i], vals + i * c->dim, state + i * ns,
                             &stats[i]) == 0;
    if (r->found) {
      r->n_value = c->dim;
      r->value = vals + i * c->dim;
      r->n_state = ns;
      r->state = state + i * ns;
      r->count = stats[i].count;
      r->t = stats[i].t;
      r->last_step = stats[i].last_step;
    }
    ptrs[i] = r;
  }
  resp.dim = c->dim;
  for (int k = 0; k < 2 && cm_rowopt_state_name(c->opt.type, k); k++) {
    parts[k] = (char *)cm_rowopt_state_name(c->opt.type, k);
    resp.n_state = (size_t)k + 1;
  }
  resp.state = parts;
  resp.n_rows = n;
  resp.rows = ptrs;
  cm_rpc_reply(call, cm_rpc_pack(&resp.base));
out:
  free(ids);
  free(stats);
  free(rows);
  free(ptrs);
  free(vals);
  free(state);
  cm_request_free((ProtobufCMessage *)req);
}

uint64_t psd__shard_step(struct psd_service *svc) {
  return svc->steps   ? psd_steps_version(svc->steps)
         : svc->saver ? psd_saver_step(svc->saver)
                      : atomic_load(&svc->updates);
}

void psd__on_shrink(struct cm_rpc_call *call, grpc_byte_buffer *bb, void *ctx) {
  struct psd_service *svc = ctx;
  struct cm_wire_msg m;
  Psd__V1__ShrinkResponse resp = PSD__V1__SHRINK_RESPONSE__INIT;
  Psd__V1__ShrinkRequest *req = OPEN_ADMIN(
      Psd__V1__ShrinkRequest, psd__v1__shrink_request__descriptor, "Shrink");
  cm_wire_msg_release(&m);
  if (!req)
    goto out;
  struct psd_table *t = psd__find_table(svc, call, req->table, "Shrink");
  if (!t)
    goto out;
  struct psd_table_stats st;
  uint64_t evicted = 0;
  psd_table_shrink(t, psd__shard_step(svc), &evicted);
  psd_table_stats(t, &st);
  cm_info("shrink of table '%s' (asked by %.64s): %llu rows evicted, %llu "
          "left",
          req->table,
          req->caller && req->caller->worker ? req->caller->worker : "?",
          (unsigned long long)evicted, (unsigned long long)st.rows);
  resp.evicted = evicted;
  resp.rows = st.rows;
  cm_rpc_reply(call, cm_rpc_pack(&resp.base));
out:
  cm_request_free((ProtobufCMessage *)req);
}

void psd__on_export(struct cm_rpc_call *call, grpc_byte_buffer *bb, void *ctx) {
  struct psd_service *svc = ctx;
  struct cm_wire_msg m;
  Psd__V1__ExportResponse resp = PSD__V1__EXPORT_RESPONSE__INIT;
  struct psd_table_snap *snap = NULL;
  uint8_t *head = NULL;
  Psd__V1__ExportRequest *req = OPEN_ADMIN(
      Psd__V1__ExportRequest, psd__v1__export_request__descriptor, "Export");
  cm_wire_msg_release(&m);
  if (!req)
    goto out;
  struct psd_table *t = psd__find_table(svc, call, req->table, "Export");
  if (!t)
    goto out;
  const struct cm_table_conf *c = psd_table_conf(t);
  /* The next page of rows, sorted by id: a page is one instant of the
   * rows it holds; a table trained meanwhile changes between pages. */
  size_t row = c->dim * sizeof(float) + sizeof(uint64_t);
  size_t fit = (svc->limits.max_message - 256) / row;
  if (fit > STOCK_PAGE / row)
    fit = STOCK_PAGE / row;
  if (req->max_rows && req->max_rows < fit)
    fit = req->max_rows;
  if (psd_table_page(t, req->has_after, req->after, fit + 1, &snap)) {
    psd__fail(svc, call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    goto out;
  }
  size_t k = snap->nrows < fit ? snap->nrows : fit;
  resp.dim = c->dim;
  resp.rows = k;
  resp.done = k == snap->nrows; /* fit + 1 asked: more rows follow */
  resp.ids.data = (uint8_t *)snap->ids;
  resp.ids.len = k * sizeof(uint64_t);
  size_t head_len = protobuf_c_message_get_packed_size(&resp.base);
  if (!(head = malloc(head_len + 1))) {
    psd__fail(svc, call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    goto out;
  }
  protobuf_c_message_pack(&resp.base, head);
  struct cm_wire_piece piece = {(const uint8_t *)snap->values,
                                k * c->dim * sizeof(float)};
  cm_rpc_reply(call,
               cm_wire_build(head, head_len, &piece, 1, release_snap, snap));
  snap = NULL; /* the slice owns it now */
out:
  free(head);
  psd_table_snap_free(snap);
  cm_request_free((ProtobufCMessage *)req);
}
