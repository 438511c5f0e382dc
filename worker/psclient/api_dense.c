/* Variables through the public API (psd/client.h): declare, and pulls and
 * pushes of any subset of them from and into the caller's buffers, async,
 * sync and with bounded staleness. Each call binds the caller's buffers to
 * the internal client's variables and selects them (psc__client_select), so
 * the bytes move between the wire and the caller's memory with no copy of
 * ours in between. */
#include "api_internal.h"

#include <stdlib.h>
#include <string.h>

#include "err.h"

/* Handles in one call at most (a job's variables). */
#define MAX_BATCH 4096

int psc__bind(psc_client *c, const int *vars, float *const *dst,
              const float *const *grads, int n, const char *what) {
  int nv = psc__client_nvars(c->cl);
  if (n < 0 || n > MAX_BATCH || (n > 0 && !vars))
    return psc__fail(c, PSC_EINVAL, "%s: %d variables; expected 0..%d", what, n,
                     MAX_BATCH);
  for (int k = 0; k < n; k++) {
    if (vars[k] < 0 || vars[k] >= nv)
      return psc__fail(c, PSC_ENOENT,
                       "%s: variable handle %d; this client declared %d", what,
                       vars[k], nv);
    if ((dst && !dst[k]) || (grads && !grads[k]))
      return psc__fail(c, PSC_EINVAL, "%s: variable '%s' has a NULL buffer",
                       what, psc__client_var(c->cl, vars[k])->name);
    psc__client_bind(c->cl, vars[k], dst ? dst[k] : NULL,
                     grads ? grads[k] : NULL);
  }
  if (psc__client_select(c->cl, vars, n) ||
      psc__client_select_push(c->cl, NULL, -1))
    return psc__fail(c, PSC_ENOMEM, "%s: out of memory", what);
  return 0;
}

/* psc_declare and psc_declare_values (values may be NULL). */
static int declare(psc_client *c, const char *name, int ndim,
                   const int64_t *shape, const struct psc_var_opts *o,
                   const float *values) {
  struct psc__var v = {0};
  int rc;
  psc__begin(c);
  if (!name || !shape || ndim < 1 || ndim > PSC__VAR_MAX_DIMS)
    return psc__fail(c, PSC_EINVAL,
                     "declare: variable '%s': %d dimensions; expected 1..%d",
                     name ? name : "(null)", ndim, PSC__VAR_MAX_DIMS);
  v.name = name;
  v.ndim = ndim;
  memcpy(v.shape, shape, (size_t)ndim * sizeof *shape);
  v.placement = PSC__PLACE_NAME;
  if (o && o->placement == PSC_PLACE_SPLIT)
    v.placement = PSC__PLACE_SPLIT;
  else if (o && o->placement > 0 && o->placement <= c->spec->nps)
    v.placement = o->placement - 1; /* PSC_PLACE_SHARD(k) */
  else if (o && o->placement > 0)
    return psc__fail(c, PSC_EINVAL,
                     "declare: variable '%s': PSC_PLACE_SHARD(%d), but the "
                     "job has %d shards (0..%d)",
                     name, o->placement - 1, c->spec->nps, c->spec->nps - 1);
  else if (o && o->placement != PSC_PLACE_AUTO)
    return psc__fail(c, PSC_EINVAL,
                     "declare: variable '%s': placement %d; expected "
                     "PSC_PLACE_AUTO, PSC_PLACE_SPLIT or PSC_PLACE_SHARD(k)",
                     name, o->placement);
  v.init =
      o && o->init == PSC_INIT_UNIFORM ? PSC__INIT_UNIFORM : PSC__INIT_ZEROS;
  v.init_scale = o ? o->init_scale : 0;
  v.optimizer = o ? o->optimizer : NULL;
  v.given = values;
  if ((rc = psc__client_declare(c->cl, &v, 1)))
    return rc;
  return psc__client_find(c->cl, name);
}

int psc_declare(psc_client *c, const char *name, int ndim, const int64_t *shape,
                const struct psc_var_opts *o) {
  return declare(c, name, ndim, shape, o, NULL);
}

int psc_declare_values(psc_client *c, const char *name, int ndim,
                       const int64_t *shape, const struct psc_var_opts *o,
                       const float *values) {
  return declare(c, name, ndim, shape, o, values);
}

int psc_find(const psc_client *c, const char *name) {
  return name ? psc__client_find(c->cl, name) : PSC_ENOENT;
}

int64_t psc_numel(const psc_client *c, int v) {
  const struct psc__var *var = psc__client_var(c->cl, v);
  if (!var)
    return PSC_ENOENT;
  return (int64_t)psc__numel(var);
}

/* Starts a pull (psc_pull, psc_pull_at) into dst[0..n): 0 or the error. */
static int begin_pull(psc_client *c, const int *vars, float *const *dst,
                      int n) {
  psc__begin(c);
  if (!dst && n > 0)
    return psc__fail(c, PSC_EINVAL, "pull: no destination buffers");
  return psc__bind(c, vars, dst, NULL, n, "pull");
}

/* Starts a push (psc_push, psc_push_step) of grads[0..n) counting examples:
 * 0 or the error. */
static int begin_push(psc_client *c, const int *vars, const float *const *grads,
                      int n, uint32_t examples) {
  int rc;
  psc__begin(c);
  if (!grads && n > 0)
    return psc__fail(c, PSC_EINVAL, "push: no gradient buffers");
  if ((rc = psc__bind(c, vars, NULL, grads, n, "push")))
    return rc;
  psc__client_set_examples(c->cl, examples);
  return 0;
}

int psc_pull(psc_client *c, const int *vars, float *const *dst, int n) {
  int rc = begin_pull(c, vars, dst, n);
  if (rc)
    return rc;
  return n ? psc__client_pull(c->cl) : 0;
}

int psc_push(psc_client *c, const int *vars, const float *const *grads, int n,
             uint32_t examples) {
  int rc = begin_push(c, vars, grads, n, examples);
  if (rc)
    return rc;
  return n ? psc__client_push(c->cl) : 0;
}

int psc_push_pull(psc_client *c, const int *vars, const float *const *grads,
                  float *const *dst, int n, uint32_t examples) {
  int rc;
  psc__begin(c);
  if ((!grads || !dst) && n > 0)
    return psc__fail(c, PSC_EINVAL, "push_pull: no buffers");
  if ((rc = psc__bind(c, vars, dst, grads, n, "push_pull")))
    return rc;
  psc__client_set_examples(c->cl, examples);
  return n ? psc__client_push_pull(c->cl) : 0;
}

int psc_push_pull_sets(psc_client *c, const int *push_vars,
                       const float *const *grads, int npush,
                       const int *pull_vars, float *const *dst, int npull,
                       uint32_t examples) {
  int rc;
  psc__begin(c);
  if ((!grads && npush > 0) || (!dst && npull > 0))
    return psc__fail(c, PSC_EINVAL, "push_pull: no buffers");
  if ((rc = psc__bind(c, push_vars, NULL, grads, npush, "push_pull")))
    return rc;
  if ((rc = psc__bind(c, pull_vars, dst, NULL, npull, "push_pull")))
    return rc;
  /* psc__bind made the pushes follow the pulls' selection again. */
  if (psc__client_select_push(c->cl, push_vars, npush))
    return psc__fail(c, PSC_ENOMEM, "push_pull: out of memory");
  psc__client_set_examples(c->cl, examples);
  if (npush == 0 && npull == 0)
    return 0;
  return npush == 0 ? psc__client_pull(c->cl) : psc__client_push_pull(c->cl);
}

/* The worker index a coordinator call uses, or a failure. */
static int need_worker(psc_client *c, const char *what) {
  if (c->task >= 0)
    return 0;
  return psc__fail(c, PSC_EINVAL,
                   "%s: this client is no worker task (give "
                   "psc_options.task \"worker:N\", the spec's \"task\" or "
                   "TF_CONFIG's)",
                   what);
}

int psc_join(psc_client *c, int worker, uint64_t *step) {
  uint64_t s = 0;
  psc__begin(c);
  if (worker < 0) {
    int rc = need_worker(c, "join");
    if (rc)
      return rc;
    worker = c->task;
  }
  if (worker >= c->spec->nworker)
    return psc__fail(c, PSC_EINVAL,
                     "join: worker %d; the job has %d workers (0..%d)", worker,
                     c->spec->nworker, c->spec->nworker - 1);
  int rc = psc__client_join(c->cl, worker, c->spec->job.heartbeat_ms, &s);
  if (step)
    *step = s;
  return rc;
}

int psc_pull_at(psc_client *c, const int *vars, float *const *dst, int n,
                uint64_t min_version, uint64_t *version) {
  uint64_t v = 0;
  int rc = begin_pull(c, vars, dst, n);
  if (rc)
    return rc;
  rc = n ? psc__client_pull_at(c->cl, min_version, &v) : 0;
  if (version)
    *version = v;
  return rc;
}

int psc_push_step(psc_client *c, const int *vars, const float *const *grads,
                  int n, uint32_t examples, uint64_t step, int *closed) {
  int cl = 0;
  int rc = begin_push(c, vars, grads, n, examples);
  if (rc)
    return rc;
  rc = n ? psc__client_push_step(c->cl, step, &cl) : 0;
  if (closed)
    *closed = cl;
  return rc;
}

int psc_admit(psc_client *c, uint64_t step, int *admitted,
              uint64_t *next_step) {
  int a = 0;
  uint64_t next = 0;
  psc__begin(c);
  int rc = psc__client_admit(c->cl, step, &a, &next);
  if (admitted)
    *admitted = a;
  if (next_step)
    *next_step = next;
  return rc;
}

int psc_restarted(psc_client *c, uint64_t *step) {
  uint64_t s = 0;
  int r = psc__client_rolled_back(c->cl, &s) || psc__client_rejoined(c->cl, &s);
  if (r && step)
    *step = s;
  return r;
}

int psc_leave(psc_client *c, uint64_t examples, double train_s,
              double ended_s_ago) {
  psc__begin(c);
  return psc__client_leave(c->cl, examples, train_s, ended_s_ago);
}

int psc_clock(psc_client *c, uint64_t clock) {
  psc__begin(c);
  return psc__client_clock(c->cl, clock);
}
