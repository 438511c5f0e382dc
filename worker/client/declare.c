/* dw_client_declare (psclient.h): checks the caller's variables, resolves
 * DW_PLACE_AUTO, and declares them on every shard with Data/Declare, waiting
 * for shards that are still starting. Once every shard has answered, the
 * client plans its traffic and moves to the Unix sockets of the shards on
 * this host (client.c). */
#include "client_internal.h"

#include <stdlib.h>

#include "err.h"
#include "shard.h"

/* Variables at least this large are split across shards under AUTO. */
#define AUTO_SPLIT_BYTES (256u << 10)

int dw_client_declare(struct dw_client *c, struct dw_var *vars, int n) {
  Psd__V1__Caller caller = dw__caller(c);
  Psd__V1__DeclareRequest req = PSD__V1__DECLARE_REQUEST__INIT;
  Psd__V1__VarSpec *specs = NULL, **ptrs = NULL;
  struct cm_unary *calls = NULL;
  uint64_t *bytes = NULL;
  int *place = NULL, rc = 0;

  if (c->vars) {
    dw__seterr(c, "declare: this client already declared its variables");
    return CM_EINVAL;
  }
  specs = calloc(n + 1, sizeof *specs);
  ptrs = calloc(n + 1, sizeof *ptrs);
  calls = calloc(c->nshards, sizeof *calls);
  bytes = calloc(n + 1, sizeof *bytes);
  place = calloc(n + 1, sizeof *place);
  if (!specs || !ptrs || !calls || !bytes || !place) {
    rc = CM_ENOMEM;
    goto out;
  }
  for (int i = 0; i < n; i++) {
    if (vars[i].ndim < 1 || vars[i].ndim > DW_VAR_MAX_DIMS) {
      dw__seterr(c, "declare: variable '%s' has %d dimensions; expected 1..%d",
                 vars[i].name, vars[i].ndim, DW_VAR_MAX_DIMS);
      rc = CM_EINVAL;
      goto out;
    }
    for (int d = 0; d < vars[i].ndim; d++)
      if (vars[i].shape[d] <= 0) {
        dw__seterr(c,
                   "declare: variable '%s' dimension %d is %lld; expected > 0",
                   vars[i].name, d, (long long)vars[i].shape[d]);
        rc = CM_EINVAL;
        goto out;
      }
    bytes[i] = dw__numel(&vars[i]) * sizeof(float);
  }
  cm_shard_auto(bytes, n, c->nshards, AUTO_SPLIT_BYTES, place);
  for (int i = 0; i < n; i++) {
    if (vars[i].placement == DW_PLACE_AUTO)
      vars[i].placement = place[i];
    psd__v1__var_spec__init(&specs[i]);
    specs[i].name = (char *)vars[i].name;
    specs[i].n_shape = vars[i].ndim;
    specs[i].shape = vars[i].shape;
    specs[i].placement = vars[i].placement;
    specs[i].init = vars[i].init == DW_INIT_UNIFORM
                        ? PSD__V1__INIT__INIT_UNIFORM
                        : PSD__V1__INIT__INIT_ZEROS;
    specs[i].init_scale = vars[i].init_scale;
    specs[i].seed = c->o.seed;
    ptrs[i] = &specs[i];
  }
  req.caller = &caller;
  req.n_vars = n;
  req.vars = ptrs;
  for (int s = 0; s < c->nshards; s++) {
    calls[s].channel = c->ch[s];
    calls[s].method = "/psd.v1.Data/Declare";
    calls[s].request = cm_rpc_pack(&req.base);
  }
  /* Shards may still be starting: wait for them, within the deadline. */
  rc = dw__run(c, calls, c->nshards, "declare", c->o.connect_timeout_ms, 1,
               NULL, NULL);
  if (rc)
    goto out;
  c->vars = vars;
  c->nvars = n;
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
  if (rc && !c->err[0])
    dw__seterr(c, "declare: %s", cm_strerror(rc));
  return rc;
}
