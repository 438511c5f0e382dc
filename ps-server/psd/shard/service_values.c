/* Declare's initial values (service_internal.h; docs/wire.md, "Initial
 * values"): the runs of a DeclareRequest checked with the rest of it
 * (each names a variable the request declares with SOURCE_VALUES, holds
 * whole f32 elements and lies inside this shard's rows of it; without a
 * stage, those of a variable it creates cover its rows), then, for each
 * such variable it creates, the values to create it from: the runs
 * gathered into one buffer, or added to the stage of (stage, name)
 * (vstage.h), which yields them once complete. */
#include "service_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "layout.h"
#include "shape.h"

/* Most value runs in one Declare. */
#define MAX_RUNS 65536

/* Orders run positions by name, then offset (qsort_r context: the runs). */
static int cmp_run(const void *a, const void *b, void *ctx) {
  Psd__V1__ValueRun **runs = ctx;
  const Psd__V1__ValueRun *x = runs[*(const size_t *)a],
                          *y = runs[*(const size_t *)b];
  int c = strcmp(x->name, y->name);
  if (c)
    return c;
  return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Orders VarSpec positions by name (qsort_r context: the VarSpecs). */
static int cmp_var(const void *a, const void *b, void *ctx) {
  Psd__V1__VarSpec **vars = ctx;
  return strcmp(vars[*(const size_t *)a]->name, vars[*(const size_t *)b]->name);
}

/* A VarSpec of req called name (by r->vorder), or NULL. */
static const Psd__V1__VarSpec *spec_named(const Psd__V1__DeclareRequest *req,
                                          const struct psd__runs *r,
                                          const char *name) {
  size_t lo = 0, hi = req->n_vars;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = strcmp(req->vars[r->vorder[mid]]->name, name);
    if (!c)
      return req->vars[r->vorder[mid]];
    if (c < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return NULL;
}

void psd__values_rows(const struct psd_service *svc, const Psd__V1__VarSpec *vs,
                      uint64_t *begin, uint64_t *end) {
  uint64_t row =
      cm_numel((int)vs->n_shape - 1, vs->shape + 1, UINT64_MAX, NULL);
  int64_t rb, re;
  cm_layout_rows(vs->shape[0], vs->placement, svc->nshards, svc->shard, &rb,
                 &re);
  *begin = (uint64_t)rb * row;
  *end = (uint64_t)re * row;
}

/* The position in r->order of the first run of name (r->n when none). */
static size_t first_run(const Psd__V1__DeclareRequest *req,
                        const struct psd__runs *r, const char *name) {
  size_t lo = 0, hi = r->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (strcmp(req->values[r->order[mid]]->name, name) < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/* Elements of [begin, end) that the runs of name cover (the runs lie
 * inside it, checked). */
static uint64_t covered(const Psd__V1__DeclareRequest *req,
                        const struct psd__runs *r, const char *name) {
  uint64_t sum = 0, reach = 0;
  for (size_t k = first_run(req, r, name);
       k < r->n && !strcmp(req->values[r->order[k]]->name, name); k++) {
    const Psd__V1__ValueRun *run = req->values[r->order[k]];
    uint64_t a = run->offset, b = run->offset + run->data.len / 4;
    if (a < reach)
      a = reach;
    if (b > a)
      sum += b - a;
    if (b > reach)
      reach = b;
  }
  return sum;
}

int psd__values_check(struct psd_service *svc, struct cm_rpc_call *call,
                      const Psd__V1__DeclareRequest *req, struct psd__runs *r) {
  memset(r, 0, sizeof *r);
  if (req->n_values > MAX_RUNS) {
    psd__fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
              "Declare: %zu value runs in one request; at most %d",
              req->n_values, MAX_RUNS);
    return -1;
  }
  r->n = req->n_values;
  r->order = malloc((r->n + 1) * sizeof *r->order);
  r->vorder = malloc((req->n_vars + 1) * sizeof *r->vorder);
  if (!r->order || !r->vorder) {
    psd__fail(svc, call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    return -1;
  }
  for (size_t i = 0; i < req->n_vars; i++)
    r->vorder[i] = i;
  qsort_r(r->vorder, req->n_vars, sizeof *r->vorder, cmp_var, req->vars);
  for (size_t k = 0; k < req->n_values; k++) {
    const Psd__V1__ValueRun *run = req->values[k];
    const Psd__V1__VarSpec *vs;
    uint64_t begin, end, count = run->data.len / 4;
    if (psd__check_name(svc, call, run->name, "Declare values", k))
      return -1;
    if (!(vs = spec_named(req, r, run->name)) ||
        vs->source != PSD__V1__SOURCE__SOURCE_VALUES) {
      psd__fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
                "Declare: value run %zu is of '%s', which this request does "
                "not declare with source SOURCE_VALUES",
                k, run->name);
      return -1;
    }
    if (run->data.len == 0 || run->data.len % 4) {
      psd__fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
                "Declare '%s': value run %zu holds %zu bytes; expected a "
                "positive multiple of 4 (f32 elements)",
                run->name, k, run->data.len);
      return -1;
    }
    psd__values_rows(svc, vs, &begin, &end);
    if (run->offset < begin || run->offset > end || count > end - run->offset) {
      psd__fail(svc, call, GRPC_STATUS_OUT_OF_RANGE,
                "Declare '%s': value run %zu, elements [%llu, +%llu), is "
                "outside shard %d's rows of it, elements [%llu, %llu)",
                run->name, k, (unsigned long long)run->offset,
                (unsigned long long)count, svc->shard,
                (unsigned long long)begin, (unsigned long long)end);
      return -1;
    }
  }
  for (size_t k = 0; k < r->n; k++)
    r->order[k] = k;
  qsort_r(r->order, r->n, sizeof *r->order, cmp_run, req->values);
  /* Each variable this request would create from values, once (a name
   * given twice is one variable, checked by the caller). */
  for (size_t i = 0; i < req->n_vars; i++) {
    const Psd__V1__VarSpec *vs = req->vars[r->vorder[i]];
    struct psd_vstage_entry *e;
    uint64_t begin, end, have;
    if (vs->source != PSD__V1__SOURCE__SOURCE_VALUES ||
        (i > 0 && !strcmp(req->vars[r->vorder[i - 1]]->name, vs->name)) ||
        psd_store_find(svc->store, vs->name))
      continue;
    psd__values_rows(svc, vs, &begin, &end);
    if (begin == end)
      continue;
    if (!req->stage) {
      if ((have = covered(req, r, vs->name)) == end - begin)
        continue;
      psd__fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
                "Declare '%s': the values cover %llu of the %llu elements "
                "shard %d holds, [%llu, %llu); send them all, or over several "
                "requests with a DeclareRequest.stage",
                vs->name, (unsigned long long)have,
                (unsigned long long)(end - begin), svc->shard,
                (unsigned long long)begin, (unsigned long long)end);
      return -1;
    }
    if (!(e = psd_vstage_find(svc->vstage, req->stage, vs->name))) {
      r->stage_bytes += (end - begin) * sizeof(float);
      continue;
    }
    uint64_t eb, ee;
    psd_vstage_range(e, &eb, &ee);
    if (eb != begin || ee != end) {
      psd__fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
                "Declare '%s': stage %016llx holds elements [%llu, %llu) of "
                "it, but this request's shape and placement put [%llu, %llu) "
                "on shard %d",
                vs->name, (unsigned long long)req->stage,
                (unsigned long long)eb, (unsigned long long)ee,
                (unsigned long long)begin, (unsigned long long)end, svc->shard);
      return -1;
    }
  }
  return 0;
}

int psd__values_for(struct psd_service *svc, struct cm_rpc_call *call,
                    const Psd__V1__DeclareRequest *req,
                    const struct psd__runs *r, const Psd__V1__VarSpec *vs,
                    float **buf, const float **values) {
  struct psd_vstage_entry *e = NULL;
  uint64_t begin, end;
  size_t k = first_run(req, r, vs->name);

  *buf = NULL;
  *values = NULL;
  psd__values_rows(svc, vs, &begin, &end);
  if (!req->stage) {
    if (!(*buf = malloc((end - begin) * sizeof(float)))) {
      psd__fail(svc, call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
      return -1;
    }
    for (; k < r->n && !strcmp(req->values[r->order[k]]->name, vs->name); k++) {
      const Psd__V1__ValueRun *run = req->values[r->order[k]];
      memcpy(*buf + (run->offset - begin), run->data.data, run->data.len);
    }
    *values = *buf;
    return 0;
  }
  if (!(e = psd_vstage_find(svc->vstage, req->stage, vs->name)) &&
      psd_vstage_add(svc->vstage, req->stage, vs->name, begin, end, &e)) {
    psd__fail(svc, call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    return -1;
  }
  for (; k < r->n && !strcmp(req->values[r->order[k]]->name, vs->name); k++) {
    const Psd__V1__ValueRun *run = req->values[r->order[k]];
    psd_vstage_put(e, run->offset, run->data.data, run->data.len / 4);
  }
  psd_vstage_touch(e, cm_mono_s());
  if (psd_vstage_filled(e) == end - begin)
    *values = psd_vstage_values(e);
  return 0;
}

void psd__values_free(struct psd__runs *r) {
  free(r->order);
  free(r->vorder);
  r->order = NULL;
  r->vorder = NULL;
}
