/* The embedding tables' admin calls (psclient.h, "tables, for psctl"):
 * Admin/Rows, Admin/Shrink and Admin/Export to one shard each, one call at
 * a time, the answer returned as plain data (Rows as a JSON text, like
 * psc__client_status). */
#include "client_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "err.h"
#include "wire.h"

/* Sends one request to shard s and waits for its answer (u->response). */
static int one_call(struct psc__client *c, int s, const char *method,
                    const ProtobufCMessage *req, struct cm_unary *u,
                    const char *what) {
  memset(u, 0, sizeof *u);
  if (s < 0 || s >= c->spec->nps) {
    psc__seterr(c, "%s: no shard %d; the cluster has %d", what, s,
                c->spec->nps);
    return CM_EINVAL;
  }
  u->channel = c->ch[s];
  u->method = method;
  u->request = cm_rpc_pack(req);
  return psc__run(c, u, 1, what, c->o.timeout_ms, 0, NULL, NULL);
}

static json_t *floats(const float *v, size_t n) {
  json_t *a = json_array();
  for (size_t i = 0; a && i < n; i++)
    json_array_append_new(a, json_real(v[i]));
  return a;
}

int psc__client_rows(struct psc__client *c, int shard, const char *table,
                     const uint64_t *ids, size_t n, uint32_t top, char **json) {
  Psd__V1__Caller caller = psc__caller(c, -1);
  Psd__V1__RowsRequest req = PSD__V1__ROWS_REQUEST__INIT;
  Psd__V1__RowsResponse *r = NULL;
  struct cm_unary u;
  json_t *root = NULL, *rows, *state;
  int rc;
  *json = NULL;
  req.caller = &caller;
  req.table = (char *)table;
  req.n_ids = top ? 0 : n;
  req.ids = (uint64_t *)ids;
  req.top = top;
  if ((rc = one_call(c, shard, "/psd.v1.Admin/Rows", &req.base, &u, "rows")))
    goto out;
  if (!(r = (Psd__V1__RowsResponse *)cm_rpc_unpack(
            u.response, &psd__v1__rows_response__descriptor))) {
    psc__seterr(c, "rows from ps:%d: malformed answer", shard);
    rc = CM_EPROTO;
    goto out;
  }
  rows = json_array();
  state = json_array();
  for (size_t k = 0; state && k < r->n_state; k++)
    json_array_append_new(state, json_string(r->state[k]));
  for (size_t i = 0; rows && i < r->n_rows; i++) {
    const Psd__V1__Row *x = r->rows[i];
    json_array_append_new(
        rows, json_pack("{s:I, s:b, s:o, s:o, s:I, s:I, s:I}", "id",
                        (json_int_t)x->id, "found", x->found, "value",
                        floats(x->value, x->n_value), "state",
                        floats(x->state, x->n_state), "count",
                        (json_int_t)x->count, "t", (json_int_t)x->t,
                        "last_step", (json_int_t)x->last_step));
  }
  root = json_pack("{s:i, s:o, s:o}", "dim", (int)r->dim, "state", state,
                   "rows", rows);
  if (!root || !(*json = json_dumps(root, JSON_COMPACT))) {
    psc__seterr(c, "rows: out of memory");
    rc = CM_ENOMEM;
  }
out:
  if (r)
    psd__v1__rows_response__free_unpacked(r, NULL);
  json_decref(root);
  cm_unary_release(&u);
  return rc;
}

int psc__client_shrink(struct psc__client *c, int shard, const char *table,
                       uint64_t *evicted, uint64_t *rows) {
  Psd__V1__Caller caller = psc__caller(c, -1);
  Psd__V1__ShrinkRequest req = PSD__V1__SHRINK_REQUEST__INIT;
  Psd__V1__ShrinkResponse *r = NULL;
  struct cm_unary u;
  int rc;
  req.caller = &caller;
  req.table = (char *)table;
  if ((rc =
           one_call(c, shard, "/psd.v1.Admin/Shrink", &req.base, &u, "shrink")))
    goto out;
  if (!(r = (Psd__V1__ShrinkResponse *)cm_rpc_unpack(
            u.response, &psd__v1__shrink_response__descriptor))) {
    psc__seterr(c, "shrink from ps:%d: malformed answer", shard);
    rc = CM_EPROTO;
    goto out;
  }
  *evicted = r->evicted;
  *rows = r->rows;
out:
  if (r)
    psd__v1__shrink_response__free_unpacked(r, NULL);
  cm_unary_release(&u);
  return rc;
}

int psc__client_export_page(struct psc__client *c, int shard, const char *table,
                            int has_after, uint64_t after,
                            struct psc__table_page *page) {
  Psd__V1__Caller caller = psc__caller(c, -1);
  Psd__V1__ExportRequest req = PSD__V1__EXPORT_REQUEST__INIT;
  Psd__V1__ExportResponse *r = NULL;
  struct cm_wire_msg w = {0};
  struct cm_unary u;
  int rc, parsed = 0;
  memset(page, 0, sizeof *page);
  req.caller = &caller;
  req.table = (char *)table;
  req.has_after = has_after;
  req.after = after;
  if ((rc =
           one_call(c, shard, "/psd.v1.Admin/Export", &req.base, &u, "export")))
    goto out;
  parsed = 1;
  if (cm_wire_parse(&w, u.response) ||
      !(r = psd__v1__export_response__unpack(NULL, w.head_len, w.head)) ||
      r->ids.len != r->rows * sizeof(uint64_t) ||
      w.bulk_len != r->rows * r->dim * sizeof(float)) {
    psc__seterr(c, "export from ps:%d: malformed answer", shard);
    rc = CM_EPROTO;
    goto out;
  }
  page->dim = r->dim;
  page->n = r->rows;
  page->done = r->done;
  page->ids = malloc(r->ids.len + 1);
  page->values = malloc(w.bulk_len + 1);
  if (!page->ids || !page->values) {
    free(page->ids);
    free(page->values);
    memset(page, 0, sizeof *page);
    psc__seterr(c, "export: out of memory");
    rc = CM_ENOMEM;
    goto out;
  }
  if (r->ids.len) /* an empty page's ids.data is NULL */
    memcpy(page->ids, r->ids.data, r->ids.len);
  cm_wire_bulk_read(&w, 0, page->values, w.bulk_len);
out:
  if (r)
    psd__v1__export_response__free_unpacked(r, NULL);
  if (parsed)
    cm_wire_msg_release(&w);
  cm_unary_release(&u);
  return rc;
}
