/* The dense rows of a live layout switch (switch_internal.h): PREPARE's
 * staging, each new owner reading the catalog of every old shard and
 * fetching the rows it will hold from their holders, and Admin/DenseRows,
 * which a frozen holder answers with them. The rule of each new slice is
 * the offline cut's (reshard_internal.h's gather). */
#include "switch_internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "layout.h"
#include "log.h"
#include "optjson.h"
#include "peer.h"
#include "request.h"
#include "reshard_internal.h"
#include "rpc.h"
#include "rpc_client.h"
#include "service.h"
#include "store.h"

/* Each DenseRows call's deadline. */
#define ROWS_CALL_MS 60000
/* Room an answer keeps for its fields besides the rows. */
#define ANSWER_SLACK (64u << 10)

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
int psd__switch_prepare(struct psd_switch *w, int *nvars, char *err,
                        size_t errlen) {
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

/* ---- Admin/DenseRows: a frozen shard's slices, to a preparing one ---- */

void psd__switch_dense_rows(struct cm_rpc_call *call, grpc_byte_buffer *bb,
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
