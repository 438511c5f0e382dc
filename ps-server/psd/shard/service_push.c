/* psd.v1.Data/Push and Data/SparsePush (service_internal.h): the one
 * pipeline where a worker's gradient is applied to this shard's variables
 * or table rows (async, with each one's optimizer, store.h and table.h) or
 * staged for its step (sync, steps.h and sstage.h; Commit in
 * service_commit.c applies it). Its payload is one of two cases, each with
 * its own file (struct psd__push_payload): a dense push's segments of
 * variables (service_push_dense.c), a sparse push's rows of a table
 * (service_sparse.c). A push goes through its steps in order, and each step
 * that stops it has answered the call:
 *   1. check the worker and, in sync mode, the generation;
 *   2. check the payload against its variables or table and the data
 *      field; a push of nothing is answered OK here, changing nothing;
 *   3. take the apply gate (async) and claim the message's identity, so a
 *      retry of an applied message is acknowledged without effect;
 *   4. read the gradient out of the received slices and judge its NaN and
 *      infinities (job.nonfinite), logging what was done with them;
 *   5. apply or stage the payload;
 *   6. count it and answer with the versions.
 * Nothing is changed before step 5, so a refused push applies nothing. */
#include "service_internal.h"

#include <stdint.h>
#include <stdlib.h>

#include "clock.h"
#include "coord.h"
#include "dedup.h"
#include "err.h"
#include "finite.h"
#include "log.h"
#include "saver.h"
#include "steps.h"
#include "wire.h"

void psd__push_give_back(struct psd__push *p) {
  if (p->claimed)
    psd_dedup_unclaim(p->svc->dedup, p->client_id, p->seq, p->chunk);
  p->claimed = 0;
}

void psd__push_answer_rolled_back(struct psd__push *p,
                                  const struct psd_steps_state *st) {
  p->rolled = st;
  p->kind->answer(p);
  p->rolled = NULL;
}

int psd__push_refuse_stage(struct psd__push *p, int rc, const char *msg) {
  struct psd_steps_state st;
  psd_steps_state(p->svc->steps, &st);
  psd__push_give_back(p);
  if (st.gen > p->gen) {
    /* A rollback came in since the generation's check. */
    psd__push_answer_rolled_back(p, &st);
    return -1;
  }
  /* A late gradient is ABORTED: the worker drops it and moves on. A step
   * beyond this shard's, after it restarted from an older checkpoint, is
   * retried until the coordinator rolls back. */
  psd__fail(p->svc, p->call,
            rc == CM_ERANGE   ? GRPC_STATUS_ABORTED
            : rc == CM_ENOMEM ? GRPC_STATUS_RESOURCE_EXHAUSTED
            : st.resumed      ? GRPC_STATUS_UNAVAILABLE
                              : GRPC_STATUS_FAILED_PRECONDITION,
            "%s", msg);
  return -1;
}

static void refuse_nomem(struct psd__push *p) {
  psd__push_give_back(p);
  psd__fail(p->svc, p->call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
}

/* Step 1. Returns 0, or -1 once the call is answered. */
static int check_worker_and_gen(struct psd__push *p) {
  struct psd_service *svc = p->svc;
  /* The worker index is used in sync mode (staging) and when named. */
  if ((svc->steps || p->has_worker) &&
      (p->worker < 0 || p->worker >= svc->nworkers)) {
    psd__fail(svc, p->call, GRPC_STATUS_INVALID_ARGUMENT,
              "%s: worker %d out of range; cluster.worker has %d entries",
              p->kind->call, p->worker, svc->nworkers);
    return -1;
  }
  /* Sync: a push of an older generation is for a step the job rolled back
   * (told so, nothing staged); one of a newer generation waits, retried,
   * until this shard has rolled back too. */
  if (svc->steps) {
    struct psd_steps_state st;
    psd_steps_state(svc->steps, &st);
    if (p->gen < st.gen) {
      psd__push_answer_rolled_back(p, &st);
      return -1;
    }
    if (p->gen > st.gen) {
      psd__fail(svc, p->call, GRPC_STATUS_UNAVAILABLE,
                "%s for step %llu of generation %llu: shard %d has not "
                "rolled back to it yet (it is at generation %llu); retry",
                p->kind->gen_what, (unsigned long long)p->step,
                (unsigned long long)p->gen, svc->shard,
                (unsigned long long)st.gen);
      return -1;
    }
  }
  return 0;
}

/* Step 3. Returns 0 to go on, or 1 when the message was applied already:
 * the retry has been acknowledged with the current versions. */
static int claim(struct psd__push *p) {
  struct psd_service *svc = p->svc;
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
  if (!p->client_id)
    return 0;
  int d = psd_dedup_claim(svc->dedup, p->client_id, p->seq, p->chunk);
  if (d == 1) {
    if (p->gated) {
      psd_dedup_apply_end(svc->dedup);
      p->gated = 0;
    }
    cm_debug("duplicate push from %s (client %016llx, seq %llu, chunk %u): "
             "acknowledged without effect",
             cm_rpc_peer(p->call), (unsigned long long)p->client_id,
             (unsigned long long)p->seq, p->chunk);
    p->kind->current(p);
    p->kind->answer(p);
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
static int read_gradient(struct psd__push *p) {
  struct psd_service *svc = p->svc;

  size_t n = p->total / sizeof(float), bad;
  if (p->from_shm) {
    bad = p->shm_bad; /* copied out of the arena and scanned in one pass */
  } else {
    if (!(p->grad = malloc(p->total ? p->total : 1))) {
      refuse_nomem(p);
      return -1;
    }
    if (p->bf16)
      cm_wire_bulk_read_bf16(&p->m, 0, p->grad, n);
    else
      cm_wire_bulk_read(&p->m, 0, p->grad, p->total);
    bad = cm_first_nonfinite(p->grad, n);
  }
  if (bad >= n)
    return 0;
  char what[512];
  uint64_t n_bad = atomic_fetch_add(&svc->nonfinite, 1) + 1;
  p->kind->describe(p, bad, what, sizeof what);
  if (svc->limits.nonfinite == PSD_NONFINITE_REJECT) {
    psd__push_give_back(p);
    psd__fail(svc, p->call, GRPC_STATUS_INVALID_ARGUMENT, p->kind->reject,
              what);
    return -1;
  }
  log_nonfinite(svc, p->call, what, n_bad);
  p->skip = svc->limits.nonfinite == PSD_NONFINITE_SKIP;
  return 0;
}

/* Step 6: lets a checkpoint in again, counts the push and answers it. */
static void answer(struct psd__push *p) {
  struct psd_service *svc = p->svc;
  int dense = p->kind == &psd__push_dense;
  if (p->gated) {
    psd_dedup_apply_end(svc->dedup);
    p->gated = 0;
  }
  if (!p->skip) {
    atomic_fetch_add(dense ? &svc->pushes : &svc->sparse_pushes, 1);
    /* A worker's step sends its examples in its first dense message to a
     * shard only, so this counts steps however the gradient was chunked. */
    if (dense && !svc->steps && p->examples > 0)
      atomic_fetch_add(&svc->updates, 1);
    /* Async: the saver counts applied pushes, sparse ones too, as the
     * shard's step (saver.h). */
    if (svc->saver && !svc->steps)
      psd_saver_pushed(svc->saver);
    atomic_fetch_add(&svc->examples, p->examples);
    atomic_fetch_add(&svc->bytes_in, p->wire);
  }
  p->kind->answer(p);
  /* Async steps are timed at shard 0 by the dense pushes' first messages;
   * sync steps by their admissions (coord_barrier.c). svc->steps alone
   * decides staging. */
  if (svc->coord && !svc->steps && p->has_worker && p->first)
    psd_coord_pushed(svc->coord, p->worker);
  psd_hist_observe(&svc->push_time, (cm_mono_ms() - p->start) / 1e3);
}

/* Takes p (its request opened, p->kind and the shared fields set) through
 * the steps; every way out has answered the call. */
static void run(struct psd__push *p) {
  int rc = check_worker_and_gen(p);
  if (!rc)
    rc = p->kind->check(p);
  if (rc == 1) {
    /* A push of nothing: nothing to apply, stage, count or remember
     * (docs/wire.md, "Bad input"). */
    p->kind->current(p);
    p->kind->answer(p);
  }
  if (rc || claim(p) || read_gradient(p) || p->kind->apply(p))
    return;
  answer(p);
}

/* Sets the fields of p that both requests carry, named alike (ps.proto),
 * from req. */
#define TAKE_SHARED(p, req)                                                    \
  do {                                                                         \
    (p)->worker = (req)->worker;                                               \
    (p)->has_worker = (req)->has_worker;                                       \
    (p)->step = (req)->step;                                                   \
    (p)->gen = (req)->gen;                                                     \
    (p)->client_id = (req)->client_id;                                         \
    (p)->seq = (req)->seq;                                                     \
    (p)->chunk = (req)->chunk;                                                 \
    (p)->examples = (req)->examples;                                           \
  } while (0)

/* Frees what p owns, the request too. */
static void push_free(struct psd__push *p) {
  if (p->gated)
    psd_dedup_apply_end(p->svc->dedup);
  free(p->grad);
  free(p->vars);
  free(p->versions);
  free(p->ids);
  cm_request_free(p->msg);
  cm_wire_msg_release(&p->m);
}

void psd__on_push(struct cm_rpc_call *call, grpc_byte_buffer *bb, void *ctx) {
  struct psd__push p = {.svc = ctx,
                        .call = call,
                        .kind = &psd__push_dense,
                        .start = cm_mono_ms()};
  const Psd__V1__PushRequest *req;

  p.msg = cm_request_open(&p.svc->host, call, bb,
                          &psd__v1__push_request__descriptor, "Push", &p.m);
  p.dense = req = (const Psd__V1__PushRequest *)p.msg;
  /* A call the client cancelled before its message arrived (its deadline
   * passed while this shard was stopped) reaches here as an empty message
   * and is refused for its missing caller like any other: the client has
   * gone, so only the errors counter sees it. */
  if (req && !psd__check_segment_count(p.svc, call, req->n_segments, "Push")) {
    TAKE_SHARED(&p, req);
    p.first = req->first;
    run(&p);
  }
  push_free(&p);
}

void psd__on_sparse_push(struct cm_rpc_call *call, grpc_byte_buffer *bb,
                         void *ctx) {
  struct psd__push p = {.svc = ctx,
                        .call = call,
                        .kind = &psd__push_sparse,
                        .start = cm_mono_ms()};
  const Psd__V1__SparsePushRequest *req;

  p.msg = cm_request_open(&p.svc->host, call, bb,
                          &psd__v1__sparse_push_request__descriptor,
                          "SparsePush", &p.m);
  p.rows = req = (const Psd__V1__SparsePushRequest *)p.msg;
  if (req) {
    TAKE_SHARED(&p, req);
    run(&p);
  }
  push_free(&p);
}
