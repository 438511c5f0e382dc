/* A dense push's payload (psd__push_dense, service_internal.h): segments of
 * variables, each a range of one variable's elements on this shard, their
 * gradients back to back in the data field (f32, or bf16 widened on
 * arrival). The pipeline they go through is service_push.c's; here each
 * segment is checked against its variable (name, shape, range, overlaps)
 * and the data field's size, a NaN or infinity is named by variable and
 * element, and each segment is applied to its variable (async, store.h) or
 * staged for its step (sync, steps.h). The answer carries each segment's
 * version. A same-host client's gradient may lie in its shared-memory arena
 * instead of the data field (PushRequest.shm, shm_arena.h). */
#include "service_internal.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "bf16.h"
#include "err.h"
#include "finite.h"
#include "shm.h"
#include "shm_arena.h"
#include "steps.h"

/* Answers the push with the version of each segment's variable, or, when
 * the job rolled back from its generation, with the step to go on from and
 * the generation. */
static void answer_versions(struct psd__push *p) {
  Psd__V1__PushResponse resp = PSD__V1__PUSH_RESPONSE__INIT;
  if (p->rolled) {
    resp.rolled_back = 1;
    resp.rollback_step = p->rolled->rollback_step;
    resp.gen = p->rolled->gen;
  } else {
    resp.n_versions = p->dense->n_segments;
    resp.versions = p->versions;
  }
  cm_rpc_reply(p->call, cm_rpc_pack(&resp.base));
}

/* The versions now: the steps committed (sync), else each variable's. */
static void current_versions(struct psd__push *p) {
  for (size_t i = 0; i < p->dense->n_segments; i++) {
    if (p->svc->steps) {
      p->versions[i] = psd_steps_version(p->svc->steps);
      continue;
    }
    pthread_mutex_lock(&p->vars[i]->lock);
    p->versions[i] = p->vars[i]->version;
    pthread_mutex_unlock(&p->vars[i]->lock);
  }
}

/* Refuses a push whose data field is not the size its segments describe,
 * naming the variables (up to 3, in request order), the bytes expected and
 * the bytes received, so the sender can find its mistake. */
static void refuse_length(struct psd__push *p) {
  const Psd__V1__PushRequest *req = p->dense;
  char names[256] = "";
  size_t len = 0, shown = 0, distinct = 0;
  uint64_t elems = p->total / sizeof(float);
  size_t esize = p->bf16 ? CM_BF16_BYTES : sizeof(float);

  for (size_t i = 0; i < req->n_segments; i++) {
    size_t k = 0;
    while (k < i && p->vars[k] != p->vars[i])
      k++;
    if (k < i)
      continue; /* named already */
    distinct++;
    if (shown < 3 && len < sizeof names) {
      len += snprintf(names + len, sizeof names - len, "%s'%s'",
                      shown ? ", " : "", p->vars[i]->name);
      shown++;
    }
  }
  if (distinct > shown && len < sizeof names)
    snprintf(names + len, sizeof names - len, " and %zu more variable%s",
             distinct - shown, distinct - shown == 1 ? "" : "s");
  if (!req->n_segments) {
    psd__fail(p->svc, p->call, GRPC_STATUS_INVALID_ARGUMENT,
              "push on shard %d: no segments, but the data field holds %zu "
              "bytes; name the elements of each variable pushed in a "
              "segment (or send neither)",
              p->svc->shard, p->m.bulk_len);
    return;
  }
  psd__fail(p->svc, p->call, GRPC_STATUS_INVALID_ARGUMENT,
            "push to %s on shard %d: %s %zu segment%s describe%s %llu "
            "element%s, %llu bytes of %s gradient, but the data field "
            "holds %zu bytes%s; send each segment's count x %zu bytes, back "
            "to back in segment order",
            names, p->svc->shard, req->n_segments == 1 ? "its" : "the",
            req->n_segments, req->n_segments == 1 ? "" : "s",
            req->n_segments == 1 ? "s" : "", (unsigned long long)elems,
            elems == 1 ? "" : "s", (unsigned long long)p->wire,
            p->bf16 ? "bf16" : "f32", p->m.bulk_len,
            p->m.bulk_len % esize
                ? (p->bf16 ? " (not whole bf16s)" : " (not whole f32s)")
                : "",
            esize);
}

/* A push whose gradient lies in a shared-memory arena (PushRequest.shm):
 * the range checked against the arena and the segments, then copied out of
 * the arena into p->grad with the NaN scan in the same pass (p->shm_bad),
 * so that what is applied is what was checked, whatever the client writes
 * into its arena meanwhile. Returns 0, or -1 once the call is answered. */
static int read_shm(struct psd__push *p) {
  const Psd__V1__ShmRef *ref = p->dense->shm;
  struct psd_shm_arena *a = NULL;
  uint8_t *src;
  char why[300];
  int rc;

  if (p->bf16 || p->m.bulk_len) {
    psd__fail(p->svc, p->call, GRPC_STATUS_INVALID_ARGUMENT,
              "push on shard %d: shm names the gradient's place, but the "
              "data field holds %zu bytes%s; send one or the other (f32)",
              p->svc->shard, p->m.bulk_len,
              p->bf16 ? " and dtype is BF16" : "");
    return -1;
  }
  rc = psd_shm_range(ref->key_hi, ref->key_lo, ref->offset, ref->length,
                     p->total, &a, &src, why, sizeof why);
  if (rc == CM_ENOENT) {
    psd__fail(p->svc, p->call, GRPC_STATUS_FAILED_PRECONDITION,
              "push on shard %d: shared memory arena unknown (shm.key); "
              "register it again or send the bytes",
              p->svc->shard);
    return -1;
  }
  if (rc) {
    psd__fail(p->svc, p->call, GRPC_STATUS_INVALID_ARGUMENT,
              "push on shard %d: %s", p->svc->shard, why);
    return -1;
  }
  if (!(p->grad = malloc(p->total ? p->total : 1))) {
    psd_shm_put(a);
    psd__fail(p->svc, p->call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    return -1;
  }
  p->shm_bad = cm_copy_first_nonfinite(
      p->grad, (const float *)(const void *)src, p->total / sizeof(float));
  p->from_shm = 1;
  psd_shm_put(a);
  return 0;
}

/* Step 2: every segment's name, shape and range, the gradient's size
 * against the data field, and overlaps; fills p->vars and p->total. A push
 * of no segments and no data is one of nothing. Returns 0, 1 for a push of
 * nothing, or -1 once the call is answered. */
static int check_segments(struct psd__push *p) {
  struct psd_service *svc = p->svc;
  const Psd__V1__PushRequest *req = p->dense;
  char have[128], want[128];

  if (!req->n_segments && !p->m.bulk_len)
    return 1;
  p->vars = calloc(req->n_segments + 1, sizeof *p->vars);
  p->versions = calloc(req->n_segments + 1, sizeof *p->versions);
  if (!p->vars || !p->versions) {
    psd__fail(svc, p->call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    return -1;
  }
  if (!psd__wire_esize(svc, p->call, req->dtype, "push"))
    return -1;
  p->bf16 = req->dtype == PSD__V1__WIRE_DTYPE__BF16;
  /* Check everything before applying anything. */
  for (size_t i = 0; i < req->n_segments; i++) {
    const Psd__V1__Segment *seg = req->segments[i];
    struct psd_var *v;
    int same;
    if (psd__check_name(svc, p->call, seg->name, "push", i))
      return -1;
    v = psd_store_find(svc->store, seg->name);
    same = v && seg->n_shape == (size_t)v->ndim;
    for (size_t d = 0; same && d < seg->n_shape; d++)
      same = seg->shape[d] == v->shape[d];
    if (v && !same) {
      psd_shape_format(v->ndim, v->shape, have, sizeof have);
      psd_shape_format(seg->n_shape > 8 ? 8 : (int)seg->n_shape, seg->shape,
                       want, sizeof want);
      psd__fail(svc, p->call, GRPC_STATUS_INVALID_ARGUMENT,
                "push to '%s': gradient shape %s%s does not match the "
                "variable's shape %s",
                seg->name, want, seg->n_shape > 8 ? " (and more)" : "", have);
      return -1;
    }
    if (!(p->vars[i] = psd__segment_var(svc, p->call, seg, i, "push")))
      return -1;
    /* A checked count lies inside its variable (at most 2^40 elements),
     * so PSD_MAX_SEGMENTS of them cannot wrap the sum. */
    p->total += seg->count * sizeof(float);
  }
  p->wire = p->bf16 ? p->total / sizeof(float) * CM_BF16_BYTES : p->total;
  if (req->shm) {
    if (read_shm(p))
      return -1;
  } else if (p->wire != p->m.bulk_len) {
    refuse_length(p);
    return -1;
  }
  return psd__check_overlap(svc, p->call, req, p->vars);
}

/* Step 4: names element bad of the gradient by its variable, its index
 * there and its segment. */
static void describe(const struct psd__push *p, size_t bad, char *what,
                     size_t len) {
  const Psd__V1__PushRequest *req = p->dense;
  size_t i = 0, k = bad;
  while (k >= req->segments[i]->count)
    k -= req->segments[i++]->count;
  snprintf(what, len, "push to '%s': gradient element %llu (segment %zu) is %s",
           p->vars[i]->name, (unsigned long long)(req->segments[i]->offset + k),
           i,
           isnan(p->grad[bad])   ? "NaN"
           : p->grad[bad] > 0.0f ? "+Inf"
                                 : "-Inf");
}

/* Sync: stages segment i's gradient g for the push's step. Returns 0, or -1
 * once the call is answered. */
static int stage_segment(struct psd__push *p, size_t i, const float *g) {
  struct psd_service *svc = p->svc;
  const Psd__V1__Segment *seg = p->dense->segments[i];
  struct psd_var *v = p->vars[i];
  char err[512];
  int rc = p->skip ? 0
                   : psd_steps_stage(svc->steps, p->worker, p->step, v,
                                     seg->offset - v->elem_begin, g, seg->count,
                                     err, sizeof err);
  if (rc)
    return psd__push_refuse_stage(p, rc, err);
  p->versions[i] = psd_steps_version(svc->steps);
  return 0;
}

/* Step 5: applies (async) or stages (sync) every segment, in order.
 * Returns 0, or -1 once the call is answered. */
static int apply_or_stage(struct psd__push *p) {
  struct psd_service *svc = p->svc;
  size_t off = 0;
  for (size_t i = 0; i < p->dense->n_segments; i++) {
    const Psd__V1__Segment *seg = p->dense->segments[i];
    struct psd_var *v = p->vars[i];
    const float *g = p->grad + off;
    off += seg->count;
    if (svc->steps) {
      if (stage_segment(p, i, g))
        return -1;
      continue;
    }
    pthread_mutex_lock(&v->lock);
    if (!p->skip) {
      psd_store_apply(svc->store, v, seg->offset - v->elem_begin, g,
                      seg->count);
      ++v->version;
    }
    p->versions[i] = v->version;
    pthread_mutex_unlock(&v->lock);
  }
  return 0;
}

const struct psd__push_payload psd__push_dense = {
    .call = "Push",
    .gen_what = "push",
    .reject = "%s; nothing of this push was applied (job.nonfinite is "
              "\"reject\")",
    .check = check_segments,
    .describe = describe,
    .apply = apply_or_stage,
    .current = current_versions,
    .answer = answer_versions,
};
