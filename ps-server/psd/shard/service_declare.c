/* psd.v1.Data/Declare (service_internal.h): the workers name the job's
 * variables, and this shard creates its slice of each (store.h). The whole
 * request is checked first, name, shape, placement, init, the variable's
 * own optimizer (VarSpec.optimizer, JSON in job.optimizer's form) and
 * whether it agrees with an existing variable's, a name given twice, and
 * the memory the new variables need, so a refused Declare creates nothing;
 * a variable declared again with the same settings is the one that
 * exists. A variable is filled by its initializer, or from values the
 * request carries (VarSpec.source, service_values.c), or waits for another
 * client's Declare to create it. */
#include "service_internal.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "err.h"
#include "layout.h"
#include "log.h"
#include "meminfo.h"
#include "optjson.h"
#include "shape.h"
#include "units.h"

/* Orders positions in a Declare's vars by name (qsort_r context). */
static int cmp_spec_name(const void *a, const void *b, void *ctx) {
  Psd__V1__VarSpec **vars = ctx;
  return strcmp(vars[*(const size_t *)a]->name, vars[*(const size_t *)b]->name);
}

/* A Declare's variables' own optimizers, parsed by check_declare: own[i]
 * points into opts for a VarSpec with an optimizer, NULL for the spec's. */
struct declare_optims {
  struct cm_optim *opts;       /* owned, one per VarSpec */
  const struct cm_optim **own; /* owned, one per VarSpec, into opts */
};

/* Whether two declarations of one name agree (ox, oy: their optimizers,
 * the spec's for both when NULL). */
static int same_spec(const Psd__V1__VarSpec *a, const Psd__V1__VarSpec *b,
                     const struct cm_optim *oa, const struct cm_optim *ob) {
  if (a->n_shape != b->n_shape || a->placement != b->placement ||
      a->source != b->source)
    return 0;
  if ((oa == NULL) != (ob == NULL) || (oa && !cm_optim_same(oa, ob)))
    return 0;
  for (size_t d = 0; d < a->n_shape; d++)
    if (a->shape[d] != b->shape[d])
      return 0;
  return 1;
}

/* Parses vs's own optimizer into *opt and sets *own to it; leaves *own
 * NULL for "" (the spec's). Returns 0, or answers the call with
 * INVALID_ARGUMENT naming the variable and every mistake and returns -1. */
static int parse_own(struct psd_service *svc, struct cm_rpc_call *call,
                     const Psd__V1__VarSpec *vs, struct cm_optim *opt,
                     const struct cm_optim **own) {
  char err[1024];
  int rc;

  *own = NULL;
  if (!vs->optimizer || !vs->optimizer[0])
    return 0;
  rc = cm_optim_from_json(vs->optimizer, strlen(vs->optimizer), opt, err,
                          sizeof err);
  if (rc == CM_ENOMEM) {
    psd__fail(svc, call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    return -1;
  }
  if (rc) {
    /* One line per mistake in the spec; one status message here. */
    for (char *p = err; (p = strchr(p, '\n'));)
      *p = ';';
    psd__fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
              "Declare '%s': %s (VarSpec.optimizer takes a JSON object like "
              "job.optimizer's, e.g. {\"type\": \"sgd\", \"lr\": 0.1})",
              vs->name, err);
    return -1;
  }
  *own = opt;
  return 0;
}

/* Checks every variable of a Declare before any is created: name, shape,
 * placement, init, its own optimizer (parsed into *o) against an existing
 * variable's, a name given twice with different settings, and the memory
 * the new ones need here. Returns 0 or answers the call and returns -1, so
 * a refused Declare creates nothing. */
static int check_declare(struct psd_service *svc, struct cm_rpc_call *call,
                         const Psd__V1__DeclareRequest *req,
                         struct declare_optims *o, struct psd__runs *runs) {
  char shape[128], a[32], b[32], c[32];
  uint64_t need = 0, held = 0;
  size_t *order = NULL;
  int nnew = 0, rc = -1;

  if (req->n_vars > PSD_MAX_VARS) {
    psd__fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
              "Declare: %zu variables in one request; at most %d", req->n_vars,
              PSD_MAX_VARS);
    return -1;
  }
  for (size_t i = 0; i < req->n_vars; i++) {
    const Psd__V1__VarSpec *vs = req->vars[i];
    const struct psd_var *v;
    uint64_t numel, row_elems;
    int64_t rb, re;
    int bad;
    if (psd__check_name(svc, call, vs->name, "Declare", i))
      goto out;
    if (vs->n_shape < 1 || vs->n_shape > PSD_VAR_MAX_DIMS) {
      psd__fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
                "Declare '%s': the shape has %zu dimensions; expected 1..%d",
                vs->name, vs->n_shape, PSD_VAR_MAX_DIMS);
      goto out;
    }
    psd_shape_format((int)vs->n_shape, vs->shape, shape, sizeof shape);
    numel = cm_numel((int)vs->n_shape, vs->shape, PSD_VAR_MAX_ELEMS, &bad);
    if (!numel && vs->shape[bad] <= 0) {
      psd__fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
                "Declare '%s': shape %s: dimension %d is %lld; expected a "
                "positive size",
                vs->name, shape, bad, (long long)vs->shape[bad]);
      goto out;
    }
    if (!numel) {
      psd__fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
                "Declare '%s': shape %s has more than 2^40 elements, the most "
                "a variable may have",
                vs->name, shape);
      goto out;
    }
    row_elems = cm_numel((int)vs->n_shape - 1, vs->shape + 1, UINT64_MAX, NULL);
    if (vs->placement < -1 || vs->placement >= svc->nshards) {
      psd__fail(
          svc, call, GRPC_STATUS_INVALID_ARGUMENT,
          "Declare '%s': placement %d; expected -1 (split) or a shard index "
          "0..%d",
          vs->name, vs->placement, svc->nshards - 1);
      goto out;
    }
    if (vs->asked < CM_LAYOUT_NAME) {
      psd__fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
                "Declare '%s': asked %d; expected 0 (not said), -1 (split), "
                "-2 (auto), -3 (by name) or a shard index plus one",
                vs->name, vs->asked);
      goto out;
    }
    if (vs->init != PSD__V1__INIT__INIT_ZEROS &&
        vs->init != PSD__V1__INIT__INIT_UNIFORM) {
      psd__fail(
          svc, call, GRPC_STATUS_INVALID_ARGUMENT,
          "Declare '%s': init %d is not an Init value (0 zeros, 1 uniform)",
          vs->name, (int)vs->init);
      goto out;
    }
    if (!isfinite(vs->init_scale) || vs->init_scale < 0) {
      psd__fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
                "Declare '%s': init_scale %g; expected a finite number >= 0",
                vs->name, vs->init_scale);
      goto out;
    }
    if (vs->source != PSD__V1__SOURCE__SOURCE_INIT &&
        vs->source != PSD__V1__SOURCE__SOURCE_VALUES &&
        vs->source != PSD__V1__SOURCE__SOURCE_AWAIT) {
      psd__fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
                "Declare '%s': source %d is not a Source value (0 init, 1 "
                "values, 2 await)",
                vs->name, (int)vs->source);
      goto out;
    }
    if (parse_own(svc, call, vs, &o->opts[i], &o->own[i]))
      goto out;
    if ((v = psd_store_find(svc->store, vs->name))) {
      /* psd_store_declare compares the shape with what exists again, and
       * the optimizer (a Declare may have created it meanwhile); here, so
       * that nothing of the request (a variable before it, its tables) is
       * created when this one is refused. */
      int same = v->ndim == (int)vs->n_shape && v->placement == vs->placement;
      for (size_t d = 0; same && d < vs->n_shape; d++)
        same = v->shape[d] == vs->shape[d];
      if (!same) {
        char have[128];
        psd_shape_format(v->ndim, v->shape, have, sizeof have);
        psd__fail(svc, call, GRPC_STATUS_ALREADY_EXISTS,
                  "variable '%s' already exists with shape %s placement %d; "
                  "this declaration asks for shape %s placement %d",
                  vs->name, have, v->placement, shape, vs->placement);
        goto out;
      }
      const struct cm_optim *want =
          psd_store_want(svc->store, vs->name, o->own[i], NULL);
      if (!cm_optim_same(&v->opt, want)) {
        char err[768];
        psd_store_optim_clash(v, want, o->own[i] != NULL, err, sizeof err);
        psd__fail(svc, call, GRPC_STATUS_ALREADY_EXISTS, "Declare: %s", err);
        goto out;
      }
      continue;
    }
    cm_layout_rows(vs->shape[0], vs->placement, svc->nshards, svc->shard, &rb,
                   &re);
    need += (uint64_t)(re - rb) * row_elems *
            psd_store_elem_bytes(svc->store, vs->name, o->own[i]);
    nnew++;
  }
  /* A name given twice must mean the same variable. */
  if (req->n_vars > 1) {
    if (!(order = malloc(req->n_vars * sizeof *order))) {
      psd__fail(svc, call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
      goto out;
    }
    for (size_t i = 0; i < req->n_vars; i++)
      order[i] = i;
    qsort_r(order, req->n_vars, sizeof *order, cmp_spec_name, req->vars);
    for (size_t i = 1; i < req->n_vars; i++) {
      size_t ix = order[i - 1], iy = order[i];
      const Psd__V1__VarSpec *x = req->vars[ix], *y = req->vars[iy];
      if (strcmp(x->name, y->name) == 0 &&
          !same_spec(x, y, o->own[ix], o->own[iy])) {
        psd__fail(
            svc, call, GRPC_STATUS_INVALID_ARGUMENT,
            "Declare: '%s' is declared twice in one request with different "
            "shapes, placements, optimizers or sources",
            x->name);
        goto out;
      }
    }
  }
  if (psd__values_check(svc, call, req, runs))
    goto out;
  need += runs->stage_bytes;
  held += psd_vstage_bytes(svc->vstage);
  int nvars = psd_store_count(svc->store);
  if (nnew > PSD_MAX_VARS - nvars) {
    psd__fail(
        svc, call, GRPC_STATUS_RESOURCE_EXHAUSTED,
        "Declare: shard %d holds %d variables; %d more would pass the limit "
        "of %d",
        svc->shard, nvars, nnew, PSD_MAX_VARS);
    goto out;
  }
  for (int i = 0; i < nvars; i++)
    held += psd_var_bytes(svc->store, psd_store_at(svc->store, i));
  if (need > svc->limits.max_held || held > svc->limits.max_held - need) {
    psd__fail(svc, call, GRPC_STATUS_RESOURCE_EXHAUSTED,
              "Declare: the new variables need %s on shard %d (values and "
              "optimizer slots), which holds %s already; its limit is %s%s",
              cm_fmt_bytes((double)need, a, sizeof a), svc->shard,
              cm_fmt_bytes((double)held, b, sizeof b),
              cm_fmt_bytes((double)svc->limits.max_held, c, sizeof c),
              svc->held_is_memory ? " (this machine's memory)" : "");
    goto out;
  }
  /* Memory is taken lazily and touched by the initial values: a variable
   * that fits the machine but not what is free now would be killed, not
   * refused. */
  uint64_t avail = cm_mem_available();
  if (need > avail) {
    psd__fail(svc, call, GRPC_STATUS_RESOURCE_EXHAUSTED,
              "Declare: the new variables need %s on shard %d (values and "
              "optimizer slots), but this machine has %s of memory available",
              cm_fmt_bytes((double)need, a, sizeof a), svc->shard,
              cm_fmt_bytes((double)avail, b, sizeof b));
    goto out;
  }
  rc = 0;
out:
  free(order);
  return rc;
}

/* Creates or checks vs (the request's i-th VarSpec, own optimizer own),
 * into *v, or leaves *v NULL for one that waits for its values or for
 * another client. Returns 0 or answers the call and returns -1. */
static int declare_one(struct psd_service *svc, struct cm_rpc_call *call,
                       const Psd__V1__DeclareRequest *req,
                       const struct psd__runs *runs, const Psd__V1__VarSpec *vs,
                       const struct cm_optim *own, struct psd_var **v,
                       int *created) {
  char err[768];
  float *buf = NULL;
  const float *values = NULL;
  uint64_t begin, end;
  int rc, exists = psd_store_find(svc->store, vs->name) != NULL;

  *v = NULL;
  *created = 0;
  if (!exists && vs->source == PSD__V1__SOURCE__SOURCE_AWAIT)
    return 0;
  psd__values_rows(svc, vs, &begin, &end);
  if (!exists && vs->source == PSD__V1__SOURCE__SOURCE_VALUES && begin < end) {
    if (psd__values_for(svc, call, req, runs, vs, &buf, &values))
      return -1;
    if (!values)
      return 0; /* staged: the request that completes them creates it */
    rc = psd_store_declare_values(svc->store, vs->name, (int)vs->n_shape,
                                  vs->shape, vs->placement, values, own, v,
                                  created, err, sizeof err);
  } else {
    rc = psd_store_declare(
        svc->store, vs->name, (int)vs->n_shape, vs->shape, vs->placement,
        vs->init == PSD__V1__INIT__INIT_UNIFORM ? PSD_INIT_UNIFORM
                                                : PSD_INIT_ZEROS,
        vs->init_scale, vs->seed, own, v, created, err, sizeof err);
  }
  free(buf);
  /* How the declaration placed it, kept for a reshard (cm_layout_replace),
   * and which client created it. */
  if (!rc && *created)
    psd_store_set_asked(*v, cm_layout_asked_from_wire(vs->asked), req->client);
  /* It exists now: no stage of it can create it any more. */
  if (!rc)
    psd_vstage_drop_name(svc->vstage, vs->name);
  if (rc) {
    psd__fail(svc, call,
              rc == CM_EEXIST   ? GRPC_STATUS_ALREADY_EXISTS
              : rc == CM_ENOMEM ? GRPC_STATUS_RESOURCE_EXHAUSTED
                                : GRPC_STATUS_INVALID_ARGUMENT,
              "%s", err);
    return -1;
  }
  return 0;
}

/* Logs the creation of v by req's caller (values: from its declared
 * values). */
static void log_created(const Psd__V1__DeclareRequest *req,
                        const struct psd_var *v, int values) {
  char shape[128];
  const char *who =
      req->caller && req->caller->worker ? req->caller->worker : "?";
  psd_shape_format(v->ndim, v->shape, shape, sizeof shape);
  if (v->row_end > v->row_begin)
    cm_info("created '%s' %s: rows [%lld, %lld) here (declared by %.64s%s)",
            v->name, shape, (long long)v->row_begin, (long long)v->row_end, who,
            values ? ", with its values" : "");
  else
    cm_info("created '%s' %s: no rows here, %s (declared by %.64s)", v->name,
            shape,
            v->placement >= 0 ? "placed whole on another shard"
                              : "more shards than rows",
            who);
}

void psd__on_declare(struct cm_rpc_call *call, grpc_byte_buffer *bb,
                     void *ctx) {
  struct psd_service *svc = ctx;
  struct cm_wire_msg m;
  Psd__V1__DeclareRequest *req = NULL;
  Psd__V1__DeclareResponse resp = PSD__V1__DECLARE_RESPONSE__INIT;
  Psd__V1__VarSlice *slices = NULL, **ptrs = NULL;
  struct declare_optims o = {NULL, NULL};
  struct psd__runs runs = {0};
  size_t n = 0;

  /* Stages whose client went away. */
  psd_vstage_expire(svc->vstage, cm_mono_s());
  req = (Psd__V1__DeclareRequest *)cm_request_open(
      &svc->host, call, bb, &psd__v1__declare_request__descriptor, "Declare",
      &m);
  if (!req)
    goto out;
  o.opts = calloc(req->n_vars + 1, sizeof *o.opts);
  o.own = calloc(req->n_vars + 1, sizeof *o.own);
  if (!o.opts || !o.own) {
    psd__fail(svc, call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    goto out;
  }
  if (check_declare(svc, call, req, &o, &runs) ||
      psd__declare_tables(svc, call, req))
    goto out;
  slices = calloc(req->n_vars + 1, sizeof *slices);
  ptrs = calloc(req->n_vars + 1, sizeof *ptrs);
  if (!slices || !ptrs) {
    psd__fail(svc, call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    goto out;
  }
  for (size_t i = 0; i < req->n_vars; i++) {
    const Psd__V1__VarSpec *vs = req->vars[i];
    struct psd_var *v;
    int created;
    if (declare_one(svc, call, req, &runs, vs, o.own[i], &v, &created))
      goto out;
    if (!v)
      continue; /* not yet: no slice */
    if (created)
      log_created(req, v, vs->source == PSD__V1__SOURCE__SOURCE_VALUES);
    psd__v1__var_slice__init(&slices[n]);
    slices[n].name = v->name;
    slices[n].row_begin = v->row_begin;
    slices[n].row_end = v->row_end;
    /* Created by this request, or by this client's own earlier Declare
     * whose answer it missed (it sent the Declare again): either way the
     * client that created it puts it on its other shards. */
    slices[n].created = created || psd_store_created_by(v, req->client);
    ptrs[n] = &slices[n];
    n++;
  }
  resp.n_slices = n;
  resp.slices = ptrs;
  /* The caller sends it back with every call (request.h, check_boot). */
  resp.boot = svc->host.self ? svc->host.self->boot : 0;
  cm_rpc_reply(call, cm_rpc_pack(&resp.base));
out:
  psd__values_free(&runs);
  free(o.opts);
  free(o.own);
  free(slices);
  free(ptrs);
  cm_request_free((ProtobufCMessage *)req);
  cm_wire_msg_release(&m);
}
