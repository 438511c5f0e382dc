/* dw_client_declare (psclient.h): checks the caller's variables, resolves
 * DW_PLACE_AUTO, and declares them on every shard with Data/Declare, waiting
 * for shards that are still starting. Once every shard has answered, the
 * client plans its traffic and moves to the Unix sockets of the shards on
 * this host (client.c).
 *
 * The wait is visible (retry.c): a Declare goes without wait_for_ready, so
 * a shard that cannot be reached fails it at once with gRPC's reason
 * (connection refused, no route, a TLS handshake), and one whose channel is
 * not connected yet gets PROBE_MS to answer, so that a host that drops the
 * packets is said within 2 s too. Each is said after a second (a shard
 * started beside its workers, as pslaunch does, is usually up by then) and
 * every 10 s, and sent again until it answers or connect_timeout_ms has
 * passed. A shard's
 * answer carries its process's boot id, sent back with every later call to
 * it (a shard that restarted without a checkpoint refuses the old one). */
#include "client_internal.h"

#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "err.h"
#include "shard.h"

/* Variables at least this large are split across shards under AUTO. */
#define AUTO_SPLIT_BYTES (256u << 10)
/* The deadline of a Declare on a channel not connected yet, ms. */
#define PROBE_MS 1500

int dw__declare_everywhere(struct dw_client *c,
                           const Psd__V1__DeclareRequest *req,
                           struct cm_unary *calls) {
  unsigned char *pending = calloc(c->nshards, 1);
  unsigned char *down = calloc(c->nshards, 1);
  int rc = 0, left = c->nshards;
  if (!pending || !down) {
    rc = CM_ENOMEM;
    goto out;
  }
  memset(pending, 1, c->nshards);
  c->starting = 1;
  c->wait_from = cm_mono_ms();
  for (int attempt = 0; left > 0; attempt++) {
    int n = 0, fatal = 0;
    for (int s = 0; s < c->nshards; s++) {
      if (!pending[s])
        continue;
      memset(&calls[n], 0, sizeof calls[n]);
      calls[n].channel = c->ch[s];
      calls[n].method = "/psd.v1.Data/Declare";
      calls[n].request = cm_rpc_pack(&req->base);
      calls[n].user = (void *)(intptr_t)s;
      /* A connected shard gets the whole wait, however long creating its
       * variables takes; the others PROBE_MS to connect and answer. */
      if (!cm_channel_connected(c->ch[s]) && c->o.connect_timeout_ms > PROBE_MS)
        calls[n].timeout_ms = PROBE_MS;
      n++;
    }
    dw__run(c, calls, n, "declare", c->o.connect_timeout_ms, 0, NULL, NULL);
    memset(down, 0, c->nshards);
    for (int k = 0; k < n; k++) {
      struct cm_unary *u = &calls[k];
      int s = (int)(intptr_t)u->user;
      if (u->status == GRPC_STATUS_OK) {
        Psd__V1__DeclareResponse *r = (Psd__V1__DeclareResponse *)cm_rpc_unpack(
            u->response, &psd__v1__declare_response__descriptor);
        c->boot[s] = r ? r->boot : 0;
        if (r)
          psd__v1__declare_response__free_unpacked(r, NULL);
        dw__shard_up(c, s);
        pending[s] = 0;
        left--;
      } else if (!dw__retryable(u->status)) {
        if (!fatal) {
          dw__call_error(c, "declare", u);
          fatal = cm_rpc_status_rc(u->status);
        }
      } else if (u->status == GRPC_STATUS_DEADLINE_EXCEEDED &&
                 u->timeout_ms > 0 && cm_channel_connected(u->channel)) {
        /* It connected, and is creating variables: no outage, the next
         * Declare (idempotent) gets the whole wait. */
      } else {
        dw__shard_down(c, s, u);
        down[s] = 1;
      }
      cm_unary_release(u);
    }
    if ((rc = fatal))
      break;
    if (left > 0 &&
        (rc = dw__retry_wait(c, down, c->nshards, attempt + 1, "declare")))
      break;
  }
out:
  c->starting = 0;
  free(pending);
  free(down);
  return rc;
}

/* Whether a and b have the same shape. */
static int same_shape(const struct dw_var *a, const struct dw_var *b) {
  if (a->ndim != b->ndim)
    return 0;
  for (int d = 0; d < a->ndim; d++)
    if (a->shape[d] != b->shape[d])
      return 0;
  return 1;
}

/* Checks vars[0..n) and resolves their placements into vars. skip[i] is set
 * for a variable this client declared already (same shape; a different one
 * is CM_EEXIST). */
static int check_vars(struct dw_client *c, struct dw_var *vars, int n,
                      unsigned char *skip, uint64_t *bytes, int *place) {
  for (int i = 0; i < n; i++) {
    if (!vars[i].name || !vars[i].name[0] || strlen(vars[i].name) > 200) {
      dw__seterr(c, "declare: variable %d has %s name; expected 1..200 bytes",
                 i, vars[i].name && vars[i].name[0] ? "a too long" : "no");
      return CM_EINVAL;
    }
    if (vars[i].ndim < 1 || vars[i].ndim > DW_VAR_MAX_DIMS) {
      dw__seterr(c, "declare: variable '%s' has %d dimensions; expected 1..%d",
                 vars[i].name, vars[i].ndim, DW_VAR_MAX_DIMS);
      return CM_EINVAL;
    }
    for (int d = 0; d < vars[i].ndim; d++)
      if (vars[i].shape[d] <= 0) {
        dw__seterr(c,
                   "declare: variable '%s' dimension %d is %lld; expected > 0",
                   vars[i].name, d, (long long)vars[i].shape[d]);
        return CM_EINVAL;
      }
    if (vars[i].placement >= c->nshards || vars[i].placement < DW_PLACE_NAME) {
      dw__seterr(c,
                 "declare: variable '%s' placement %d; expected a shard "
                 "0..%d or AUTO, NAME or SPLIT",
                 vars[i].name, vars[i].placement, c->nshards - 1);
      return CM_EINVAL;
    }
    bytes[i] = dw__numel(&vars[i]) * sizeof(float);
    int k = dw_client_find(c, vars[i].name);
    if (k >= 0) {
      if (!same_shape(&c->vars[k], &vars[i])) {
        dw__seterr(c,
                   "declare: variable '%s' was declared by this client with "
                   "%d dimensions [%lld, ...], now with %d [%lld, ...]",
                   vars[i].name, c->vars[k].ndim,
                   (long long)c->vars[k].shape[0], vars[i].ndim,
                   (long long)vars[i].shape[0]);
        return CM_EEXIST;
      }
      skip[i] = 1;
      vars[i].placement = c->vars[k].placement;
    }
  }
  cm_shard_auto(bytes, n, c->nshards, AUTO_SPLIT_BYTES, place);
  for (int i = 0; i < n; i++) {
    if (vars[i].placement == DW_PLACE_AUTO)
      vars[i].placement = place[i];
    else if (vars[i].placement == DW_PLACE_NAME)
      vars[i].placement = cm_shard_by_name(vars[i].name, bytes[i], c->nshards,
                                           AUTO_SPLIT_BYTES);
  }
  return 0;
}

/* Appends copies of the variables of vars[0..n) not in skip to c->vars. */
static int keep_vars(struct dw_client *c, const struct dw_var *vars, int n,
                     const unsigned char *skip) {
  if (c->nvars + n > c->cap_vars) {
    int cap = c->cap_vars ? c->cap_vars : 8;
    while (cap < c->nvars + n)
      cap *= 2;
    struct dw_var *v = realloc(c->vars, (size_t)cap * sizeof *v);
    if (!v)
      return CM_ENOMEM;
    c->vars = v;
    char **names = realloc(c->var_names, (size_t)cap * sizeof *names);
    if (!names)
      return CM_ENOMEM;
    c->var_names = names;
    unsigned char *sel = c->sel ? realloc(c->sel, (size_t)cap) : NULL;
    if (c->sel && !sel)
      return CM_ENOMEM;
    if (sel)
      c->sel = sel;
    unsigned char *sp = c->sel_push ? realloc(c->sel_push, (size_t)cap) : NULL;
    if (c->sel_push && !sp)
      return CM_ENOMEM;
    if (sp)
      c->sel_push = sp;
    c->cap_vars = cap;
  }
  for (int i = 0; i < n; i++) {
    if (skip[i])
      continue;
    char *name = strdup(vars[i].name);
    if (!name)
      return CM_ENOMEM;
    c->var_names[c->nvars] = name;
    c->vars[c->nvars] = vars[i];
    c->vars[c->nvars].name = name;
    if (c->sel)
      c->sel[c->nvars] = 0;
    if (c->sel_push)
      c->sel_push[c->nvars] = 0;
    c->nvars++;
  }
  /* The bf16 staging buffer is sized for the variables: made again. */
  free(c->grad16);
  free(c->grad16_at);
  c->grad16 = NULL;
  c->grad16_at = NULL;
  return 0;
}

int dw_client_declare(struct dw_client *c, struct dw_var *vars, int n) {
  Psd__V1__Caller caller = dw__caller(c, -1);
  Psd__V1__DeclareRequest req = PSD__V1__DECLARE_REQUEST__INIT;
  Psd__V1__VarSpec *specs = NULL, **ptrs = NULL;
  struct cm_unary *calls = NULL;
  uint64_t *bytes = NULL;
  unsigned char *skip = NULL;
  int *place = NULL, rc = 0, nreq = 0;

  c->err[0] = 0;
  if (n < 0 || (n > 0 && !vars)) {
    dw__seterr(c, "declare: no variables");
    return CM_EINVAL;
  }
  specs = calloc(n + 1, sizeof *specs);
  ptrs = calloc(n + 1, sizeof *ptrs);
  calls = calloc(c->nshards, sizeof *calls);
  bytes = calloc(n + 1, sizeof *bytes);
  place = calloc(n + 1, sizeof *place);
  skip = calloc(n + 1, 1);
  if (!specs || !ptrs || !calls || !bytes || !place || !skip) {
    rc = CM_ENOMEM;
    goto out;
  }
  if ((rc = check_vars(c, vars, n, skip, bytes, place)))
    goto out;
  for (int i = 0; i < n; i++) {
    if (skip[i])
      continue;
    Psd__V1__VarSpec *sp = &specs[nreq];
    psd__v1__var_spec__init(sp);
    sp->name = (char *)vars[i].name;
    sp->n_shape = vars[i].ndim;
    sp->shape = vars[i].shape;
    sp->placement = vars[i].placement;
    sp->init = vars[i].init == DW_INIT_UNIFORM ? PSD__V1__INIT__INIT_UNIFORM
                                               : PSD__V1__INIT__INIT_ZEROS;
    sp->init_scale = vars[i].init_scale;
    sp->seed = c->o.seed;
    if (vars[i].optimizer)
      sp->optimizer = (char *)vars[i].optimizer;
    ptrs[nreq++] = sp;
  }
  if (nreq == 0)
    goto out;
  req.caller = &caller;
  req.n_vars = nreq;
  req.vars = ptrs;
  /* Shards may still be starting: wait for them, within the deadline. */
  if ((rc = dw__declare_everywhere(c, &req, calls)))
    goto out;
  if ((rc = keep_vars(c, vars, n, skip)))
    goto out;
  rc = dw__plan(c);
  if (!rc)
    rc = dw__use_unix_sockets(c);
out:
  for (int s = 0; calls && s < c->nshards; s++)
    cm_unary_release(&calls[s]);
  free(calls);
  free(specs);
  free(ptrs);
  free(bytes);
  free(place);
  free(skip);
  if (rc && !c->err[0])
    dw__seterr(c, "declare: %s", cm_strerror(rc));
  return rc;
}
