/* psd.v1.Data/Push (service_internal.h): where a worker's gradient is
 * applied to this shard's variables (async, with each variable's
 * optimizer, store.h) or staged for its step (sync, steps.h; Commit in
 * service_commit.c applies it). A push goes through its steps in order, and
 * each step that stops it has answered the call:
 *   1. check the worker and, in sync mode, the generation; a push of no
 *      segments and no data is answered OK here, changing nothing;
 *   2. check every segment against its variable and the data field;
 *   3. take the apply gate (async) and claim the message's identity, so a
 *      retry of an applied message is acknowledged without effect;
 *   4. read the gradient out of the received slices and judge its NaN and
 *      infinities (job.nonfinite);
 *   5. apply or stage each segment;
 *   6. count it and answer with the versions.
 * Nothing is changed before step 5, so a refused push applies nothing. */
#include "service_internal.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "bf16.h"
#include "clock.h"
#include "coord.h"
#include "dedup.h"
#include "err.h"
#include "finite.h"
#include "log.h"
#include "saver.h"
#include "steps.h"
#include "wire.h"

/* One push in progress: what its steps share. */
struct push {
  struct psd_service *svc;   /* the service (ctx) */
  struct cm_rpc_call *call;  /* answered once, by the step that stops */
  Psd__V1__PushRequest *req; /* owned, unpacked request */
  struct cm_wire_msg m;      /* the message; its bulk field is the gradient */
  struct psd_var **vars;     /* owned: segment i's variable (the store's) */
  uint64_t *versions;        /* owned: segment i's version, for the answer */
  uint64_t total;            /* gradient bytes the segments describe, f32 */
  uint64_t wire;             /* bytes the data field must hold: total, or
                                half of it when the push is bf16 */
  int bf16;                  /* the data field holds bfloat16s (dtype) */
  float *grad;               /* owned copy of the gradient */
  double start;              /* cm_mono_ms() when handling began */
  int skip;    /* NaN or Inf under job.nonfinite "skip": acknowledged only */
  int claimed; /* this message's dedup claim is ours to give back */
  int gated;   /* async: we hold the dedup table's apply gate */
};

/* Answers a sync push of a generation the job has rolled back from: nothing
 * was staged; the step to go on from and the generation. */
static void answer_push_rolled_back(struct cm_rpc_call *call,
                                    const struct psd_steps_state *st) {
  Psd__V1__PushResponse r = PSD__V1__PUSH_RESPONSE__INIT;
  r.rolled_back = 1;
  r.rollback_step = st->rollback_step;
  r.gen = st->gen;
  cm_rpc_reply(call, cm_rpc_pack(&r.base));
}

/* Answers the push with the version of each segment's variable. */
static void answer_versions(struct push *p) {
  Psd__V1__PushResponse resp = PSD__V1__PUSH_RESPONSE__INIT;
  resp.n_versions = p->req->n_segments;
  resp.versions = p->versions;
  cm_rpc_reply(p->call, cm_rpc_pack(&resp.base));
}

/* Gives back this message's dedup claim when the push is refused after it:
 * not applied, so neither a retry nor a checkpoint may take it for applied
 * (a retry is judged again). */
static void give_back_claim(struct push *p) {
  if (p->claimed)
    psd_dedup_unclaim(p->svc->dedup, p->req->client_id, p->req->seq,
                      p->req->chunk);
  p->claimed = 0;
}

static void refuse_nomem(struct push *p) {
  give_back_claim(p);
  psd__fail(p->svc, p->call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
}

/* Step 1. Returns 0, or -1 once the call is answered. */
static int check_worker_and_gen(struct push *p) {
  struct psd_service *svc = p->svc;
  const Psd__V1__PushRequest *req = p->req;
  /* The worker index is used in sync mode (staging) and when named. */
  if ((svc->steps || req->has_worker) &&
      (req->worker < 0 || req->worker >= svc->nworkers)) {
    psd__fail(svc, p->call, GRPC_STATUS_INVALID_ARGUMENT,
              "Push: worker %d out of range; cluster.worker has %d entries",
              req->worker, svc->nworkers);
    return -1;
  }
  /* Sync: a push of an older generation is for a step the job rolled back
   * (told so, nothing staged); one of a newer generation waits, retried,
   * until this shard has rolled back too. */
  if (svc->steps) {
    struct psd_steps_state st;
    psd_steps_state(svc->steps, &st);
    uint64_t gen = st.gen;
    if (req->gen < gen) {
      answer_push_rolled_back(p->call, &st);
      return -1;
    }
    if (req->gen > gen) {
      psd__fail(svc, p->call, GRPC_STATUS_UNAVAILABLE,
                "push for step %llu of generation %llu: shard %d has not "
                "rolled back to it yet (it is at generation %llu); retry",
                (unsigned long long)req->step, (unsigned long long)req->gen,
                svc->shard, (unsigned long long)gen);
      return -1;
    }
  }
  return 0;
}

/* Refuses a push whose data field is not the size its segments describe,
 * naming the variables (up to 3, in request order), the bytes expected and
 * the bytes received, so the sender can find its mistake. */
static void refuse_length(struct push *p) {
  const Psd__V1__PushRequest *req = p->req;
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

/* Step 2: every segment's name, shape and range, the gradient's size
 * against the data field, and overlaps; fills p->vars and p->total.
 * Returns 0, or -1 once the call is answered. */
static int check_segments(struct push *p) {
  struct psd_service *svc = p->svc;
  const Psd__V1__PushRequest *req = p->req;
  char have[128], want[128];

  p->vars = calloc(req->n_segments + 1, sizeof *p->vars);
  p->versions = calloc(req->n_segments + 1, sizeof *p->versions);
  if (!p->vars || !p->versions) {
    refuse_nomem(p);
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
  if (p->wire != p->m.bulk_len) {
    refuse_length(p);
    return -1;
  }
  return psd__check_overlap(svc, p->call, req, p->vars);
}

/* Step 3. Returns 0 to go on, or 1 when the message was applied already:
 * the retry has been acknowledged with the current versions. */
static int claim(struct push *p) {
  struct psd_service *svc = p->svc;
  const Psd__V1__PushRequest *req = p->req;
  /* Async: from the claim until the values are changed, a checkpoint waits
   * (dedup.h, the apply gate), so the table it saves names exactly the
   * messages its values hold. Every push takes it, with an identity or
   * without, so that the checkpoint is one instant of the shard. */
  if (!svc->steps) {
    psd_dedup_apply_begin(svc->dedup);
    p->gated = 1;
  }
  /* A retry of a message applied already (its answer was lost) is
   * acknowledged and changes nothing. Claimed only once the message is known
   * good, and given back if staging refuses it. */
  if (!req->client_id)
    return 0;
  int d = psd_dedup_claim(svc->dedup, req->client_id, req->seq, req->chunk);
  if (d == 1) {
    if (p->gated) {
      psd_dedup_apply_end(svc->dedup);
      p->gated = 0;
    }
    cm_debug("duplicate push from %s (client %016llx, seq %llu, chunk %u): "
             "acknowledged without effect",
             cm_rpc_peer(p->call), (unsigned long long)req->client_id,
             (unsigned long long)req->seq, req->chunk);
    for (size_t i = 0; i < req->n_segments; i++) {
      if (svc->steps) {
        p->versions[i] = psd_steps_version(svc->steps);
        continue;
      }
      pthread_mutex_lock(&p->vars[i]->lock);
      p->versions[i] = p->vars[i]->version;
      pthread_mutex_unlock(&p->vars[i]->lock);
    }
    answer_versions(p);
    return 1;
  }
  p->claimed = d == 0;
  return 0;
}

/* Logs a push with NaN or Inf that was skipped or applied, sampled as
 * errors are. */
static void log_nonfinite(struct psd_service *svc, struct cm_rpc_call *call,
                          const char *what, uint64_t n) {
  if (n <= PSD__LOGGED_ERRORS || n % 1000 == 0)
    cm_warn("%s a push from %s: %s; job.nonfinite is \"%s\" (%llu such "
            "pushes so far)%s",
            svc->limits.nonfinite == PSD_NONFINITE_SKIP ? "skipped" : "applied",
            cm_rpc_peer(call), what, psd_nonfinite_name(svc->limits.nonfinite),
            (unsigned long long)n,
            n == PSD__LOGGED_ERRORS ? " (further ones are sampled)" : "");
}

/* Step 4: one copy of the whole gradient out of the received slices, then
 * one pass over it for NaN and infinities, before anything is applied; sets
 * p->skip. Returns 0, or -1 once the call is answered. */
static int read_gradient(struct push *p) {
  struct psd_service *svc = p->svc;
  const Psd__V1__PushRequest *req = p->req;

  if (!(p->grad = malloc(p->total ? p->total : 1))) {
    refuse_nomem(p);
    return -1;
  }
  if (p->bf16)
    cm_wire_bulk_read_bf16(&p->m, 0, p->grad, p->total / sizeof(float));
  else
    cm_wire_bulk_read(&p->m, 0, p->grad, p->total);
  size_t n = p->total / sizeof(float), bad = cm_first_nonfinite(p->grad, n);
  if (bad >= n)
    return 0;
  char what[512];
  size_t i = 0, k = bad;
  while (k >= req->segments[i]->count)
    k -= req->segments[i++]->count;
  uint64_t n_bad = atomic_fetch_add(&svc->nonfinite, 1) + 1;
  snprintf(what, sizeof what,
           "push to '%s': gradient element %llu (segment %zu) is %s",
           p->vars[i]->name, (unsigned long long)(req->segments[i]->offset + k),
           i,
           isnan(p->grad[bad])   ? "NaN"
           : p->grad[bad] > 0.0f ? "+Inf"
                                 : "-Inf");
  if (svc->limits.nonfinite == PSD_NONFINITE_REJECT) {
    give_back_claim(p);
    psd__fail(svc, p->call, GRPC_STATUS_INVALID_ARGUMENT,
              "%s; nothing of this push was applied (job.nonfinite is "
              "\"reject\")",
              what);
    return -1;
  }
  log_nonfinite(svc, p->call, what, n_bad);
  p->skip = svc->limits.nonfinite == PSD_NONFINITE_SKIP;
  return 0;
}

/* Sync: stages segment i's gradient g for the push's step. Returns 0, or -1
 * once the call is answered. */
static int stage_segment(struct push *p, size_t i, const float *g) {
  struct psd_service *svc = p->svc;
  const Psd__V1__PushRequest *req = p->req;
  const Psd__V1__Segment *seg = req->segments[i];
  struct psd_var *v = p->vars[i];
  char err[512];
  int rc = p->skip ? 0
                   : psd_steps_stage(svc->steps, req->worker, req->step, v,
                                     seg->offset - v->elem_begin, g, seg->count,
                                     err, sizeof err);
  if (rc) {
    struct psd_steps_state st;
    psd_steps_state(svc->steps, &st);
    give_back_claim(p);
    if (st.gen > req->gen) {
      /* A rollback came in since the check above. */
      answer_push_rolled_back(p->call, &st);
      return -1;
    }
    /* A late gradient is ABORTED: the worker drops it and moves on. A
     * step beyond this shard's, after it restarted from an older
     * checkpoint, is retried until the coordinator rolls back. */
    psd__fail(svc, p->call,
              rc == CM_ERANGE ? GRPC_STATUS_ABORTED
              : st.resumed    ? GRPC_STATUS_UNAVAILABLE
                              : GRPC_STATUS_FAILED_PRECONDITION,
              "%s", err);
    return -1;
  }
  p->versions[i] = psd_steps_version(svc->steps);
  return 0;
}

/* Step 5: applies (async) or stages (sync) every segment, in order.
 * Returns 0, or -1 once the call is answered. */
static int apply_or_stage(struct push *p) {
  struct psd_service *svc = p->svc;
  size_t off = 0;
  for (size_t i = 0; i < p->req->n_segments; i++) {
    const Psd__V1__Segment *seg = p->req->segments[i];
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

/* Step 6: lets a checkpoint in again, counts the push and answers it. */
static void answer(struct push *p) {
  struct psd_service *svc = p->svc;
  const Psd__V1__PushRequest *req = p->req;
  if (p->gated) {
    psd_dedup_apply_end(svc->dedup);
    p->gated = 0;
  }
  if (!p->skip) {
    atomic_fetch_add(&svc->pushes, 1);
    /* A worker's step sends its examples in its first message to a shard
     * only, so this counts steps however the gradient was chunked. */
    if (!svc->steps && req->examples > 0)
      atomic_fetch_add(&svc->updates, 1);
    if (svc->saver && !svc->steps)
      psd_saver_pushed(svc->saver);
    atomic_fetch_add(&svc->examples, req->examples);
    atomic_fetch_add(&svc->bytes_in, p->wire);
  }
  answer_versions(p);
  /* Async steps are timed at shard 0 by the pushes' first messages; sync
   * steps by their admissions (coord_barrier.c). svc->steps alone decides
   * staging. */
  if (svc->coord && !svc->steps && req->has_worker && req->first)
    psd_coord_pushed(svc->coord, req->worker);
  psd_hist_observe(&svc->push_time, (cm_mono_ms() - p->start) / 1e3);
}

void psd__on_push(struct cm_rpc_call *call, grpc_byte_buffer *bb, void *ctx) {
  struct push p = {.svc = ctx, .call = call, .start = cm_mono_ms()};

  p.req = (Psd__V1__PushRequest *)cm_request_open(
      &p.svc->host, call, bb, &psd__v1__push_request__descriptor, "Push", &p.m);
  /* A call the client cancelled before its message arrived (its deadline
   * passed while this shard was stopped) reaches here as an empty message
   * and is refused for its missing caller like any other: the client has
   * gone, so only the errors counter sees it. */
  if (!p.req ||
      psd__check_segment_count(p.svc, call, p.req->n_segments, "Push"))
    goto out;
  if (check_worker_and_gen(&p))
    goto out;
  if (!p.req->n_segments && !p.m.bulk_len) {
    /* An empty push: nothing to apply, stage, count or remember
     * (docs/wire.md, "Bad input"). */
    answer_versions(&p);
    goto out;
  }
  if (check_segments(&p) || claim(&p) || read_gradient(&p) ||
      apply_or_stage(&p))
    goto out;
  answer(&p);
out:
  if (p.gated)
    psd_dedup_apply_end(p.svc->dedup);
  free(p.grad);
  free(p.vars);
  free(p.versions);
  cm_request_free((ProtobufCMessage *)p.req);
  cm_wire_msg_release(&p.m);
}
