/* psd.v1.Data/Pull (service_internal.h): a worker reads its variables'
 * values. A pull whose version exists is answered at once; a sync pull for
 * the step after the last one closed is parked on a list, not held by a
 * sleeping thread, and answered when Commit or Rollback (service_commit.c)
 * releases it, or with UNAVAILABLE when psd stops. Async answers are sent
 * straight from the variables' memory; sync answers are one copy, so a
 * chunk is exactly the version it says. No answer exceeds the caller's
 * receive limit (PullRequest.max_answer_bytes, else gRPC's default 4 MiB)
 * or this shard's (job.max_message_mb): one that would is cut short and
 * marked partial, and the caller asks again for the rest. A same-host
 * caller may name a range of its shared-memory arena instead (answer_shm). */
#include "service_internal.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "clock.h"
#include "err.h"
#include "shm_arena.h"
#include "steps.h"
#include "wire.h"

/* A pull waiting for the shard to commit min_version steps: a dense one
 * (req) or a sparse one (sp, service_sparse.c). */
struct psd__parked_pull {
  struct cm_rpc_call *call;      /* answered once the version exists */
  uint64_t min_version;          /* the version it waits for */
  uint64_t gen;                  /* the generation it names */
  Psd__V1__PullRequest *req;     /* owned, unpacked request; or NULL */
  struct psd__sparse_pull *sp;   /* owned sparse pull; or NULL */
  struct psd__parked_pull *next; /* list link */
};

static void release_free(void *p) { free(p); }

/* gRPC's default receive limit: what a caller that names no limit of its
 * own accepts (PullRequest.max_answer_bytes 0, as a stock client sends). */
#define STOCK_ANSWER (4u << 20)

/* Most bytes that introduce the data field after the head (wire.h: a tag
 * and a varint length). */
#define BULK_KEY_MAX 11

/* The largest answer message, in bytes: the caller's limit
 * (PullRequest.max_answer_bytes, else gRPC's default) or this shard's
 * (job.max_message_mb), whichever is smaller. */
static uint64_t answer_cap(const struct psd_service *svc,
                           const Psd__V1__PullRequest *req) {
  uint64_t accept =
      req->max_answer_bytes ? req->max_answer_bytes : STOCK_ANSWER;
  return accept < svc->limits.max_message ? accept : svc->limits.max_message;
}

/* The bytes of data an answer of `total` data bytes may carry in a message
 * of at most cap bytes: all of them when it fits, else as many whole
 * elements as do (a partial answer); 0 when not even one does. The head is
 * measured with resp's versions all at their widest (versions holds n
 * entries, overwritten here and filled in later) and partial set, so the
 * real head, never larger, fits too. */
static uint64_t answer_room(Psd__V1__PullResponse *resp, uint64_t *versions,
                            size_t n, uint64_t total, uint64_t cap,
                            size_t esize) {
  uint64_t head;
  for (size_t i = 0; i < n; i++)
    versions[i] = UINT64_MAX;
  resp->n_versions = n;
  resp->versions = versions;
  resp->partial = 1;
  resp->elements = total / esize;
  head = protobuf_c_message_get_packed_size(&resp->base) + BULK_KEY_MAX;
  if (head >= cap)
    return 0;
  if (total <= cap - head)
    return total;
  return (cap - head) / esize * esize;
}

/* Copies n elements of a variable (or slot) into an answer: as they are,
 * or rounded to bfloat16 (PullRequest.dtype BF16). */
static void copy_out(uint8_t *dst, const float *src, uint64_t n, int bf16) {
  if (bf16)
    cm_bf16_from_f32((uint16_t *)(void *)dst, src, n); /* 2-aligned */
  else
    memcpy(dst, src, n * sizeof(float));
}

/* Answers a pull whose caller named a range of its shared-memory arena
 * (PullRequest.shm, shm_arena.h): the values are written there, whole (the
 * range must hold them all), and the answer carries only the versions and
 * in_shm. Async values are copied as they are, as the byte path sends
 * them; sync ones from the step's snapshot (or under each variable's lock),
 * so the range holds exactly the version the answer says. */
static void answer_shm(struct psd_service *svc, struct cm_rpc_call *call,
                       const Psd__V1__PullRequest *req, struct psd_var **vars,
                       uint64_t *versions, uint64_t total,
                       Psd__V1__PullResponse *resp, double start) {
  const Psd__V1__ShmRef *ref = req->shm;
  struct psd_steps_snap *snap = NULL;
  struct psd_shm_arena *a = NULL;
  uint8_t *dst;
  char why[300];
  int rc;

  if (req->dtype != PSD__V1__WIRE_DTYPE__F32) {
    psd__fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
              "pull from shard %d: shm answers are f32; ask for BF16 without "
              "shm",
              svc->shard);
    return;
  }
  rc = psd_shm_range(ref->key_hi, ref->key_lo, ref->offset, ref->length, total,
                     &a, &dst, why, sizeof why);
  if (rc == CM_ENOENT) {
    psd__fail(svc, call, GRPC_STATUS_FAILED_PRECONDITION,
              "pull from shard %d: shared memory arena unknown (shm.key); "
              "register it again or ask for the bytes",
              svc->shard);
    return;
  }
  if (rc) {
    psd__fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT, "pull from shard %d: %s",
              svc->shard, why);
    return;
  }
  if (svc->steps && !req->slots)
    snap = psd_steps_snap_get(svc->steps);
  for (size_t i = 0; i < req->n_segments; i++) {
    const Psd__V1__Segment *seg = req->segments[i];
    struct psd_var *v = vars[i];
    uint64_t len = seg->count * sizeof(float), at = seg->offset - v->elem_begin;
    if (snap) {
      const float *val = psd_steps_snap_values(snap, v, &versions[i]);
      memcpy(dst, val + at, len);
    } else {
      const float *src = req->slots ? v->slots[req->slot] : v->value;
      /* Async without the lock, as the byte path reads (floats are never
       * torn); sync under it, so the range is one version. */
      if (svc->steps)
        pthread_mutex_lock(&v->lock);
      memcpy(dst, src + at, len);
      if (!svc->steps)
        pthread_mutex_lock(&v->lock);
      versions[i] = v->version;
      pthread_mutex_unlock(&v->lock);
    }
    dst += len;
  }
  psd_steps_snap_release(snap);
  psd_shm_put(a);
  resp->n_versions = req->n_segments;
  resp->versions = versions;
  resp->elements = total / sizeof(float);
  resp->in_shm = 1;
  atomic_fetch_add(&svc->pulls, 1);
  atomic_fetch_add(&svc->bytes_out, total);
  cm_rpc_reply(call, cm_rpc_pack(&resp->base));
  psd_hist_observe(&svc->pull_time, (cm_mono_ms() - start) / 1e3);
}

/* Answers a pull whose version exists; `start` (cm_mono_ms) is when its
 * handling began, for the pull histogram. An answer that would not fit in
 * one message carries the first elements only (PullResponse.partial). */
static void answer_pull(struct psd_service *svc, struct cm_rpc_call *call,
                        const Psd__V1__PullRequest *req, double start) {
  Psd__V1__PullResponse resp = PSD__V1__PULL_RESPONSE__INIT;
  struct psd_var **vars = NULL;
  struct cm_wire_piece *pieces = NULL;
  uint64_t *versions = NULL, total = 0, send, left;
  uint8_t *data = NULL, *head = NULL;
  struct psd_steps_snap *snap = NULL; /* sync: a reference, the answer's */
  size_t head_len;
  int npieces = 0, bf16 = req->dtype == PSD__V1__WIRE_DTYPE__BF16;
  size_t esize = psd__wire_esize(svc, call, req->dtype, "pull");

  if (!esize)
    goto out;
  vars = calloc(req->n_segments + 1, sizeof *vars);
  versions = calloc(req->n_segments + 1, sizeof *versions);
  if (!vars || !versions)
    goto nomem;
  for (size_t i = 0; i < req->n_segments; i++) {
    if (!(vars[i] = psd__segment_var(svc, call, req->segments[i], i, "pull")))
      goto out;
    if (req->slots && req->slot >= (uint32_t)vars[i]->nslots) {
      psd__fail(svc, call, GRPC_STATUS_FAILED_PRECONDITION,
                "pull of '%s' slot %u: its optimizer %s keeps %d",
                vars[i]->name, req->slot, vars[i]->optim_desc, vars[i]->nslots);
      goto out;
    }
    /* A checked count lies inside its variable (at most 2^40 elements),
     * so PSD_MAX_SEGMENTS of them cannot wrap the sum. */
    total += req->segments[i]->count * esize;
  }
  if (svc->steps)
    resp.step = psd_steps_version(svc->steps);
  if (req->shm) {
    answer_shm(svc, call, req, vars, versions, total, &resp, start);
    goto out;
  }
  resp.dtype = req->dtype;
  send = answer_room(&resp, versions, req->n_segments, total,
                     answer_cap(svc, req), esize);
  if (send == 0 && total > 0) {
    psd__fail(svc, call, GRPC_STATUS_RESOURCE_EXHAUSTED,
              "pull of %zu segment%s from shard %d: not one element fits "
              "in an answer of %llu bytes, the smaller of the caller's "
              "limit (max_answer_bytes; 0 means 4 MiB) and the shard's "
              "(job.max_message_mb); raise max_answer_bytes or ask for "
              "fewer segments at once",
              req->n_segments, req->n_segments == 1 ? "" : "s", svc->shard,
              (unsigned long long)answer_cap(svc, req));
    goto out;
  }
  left = send;
  if (!(pieces = calloc(req->n_segments + 1, sizeof *pieces)))
    goto nomem;
  if (!svc->steps && !bf16) {
    /* Async: send straight from the variables' memory, no copy. A push
     * may land while gRPC writes it, as it could between two pulls: async
     * training reads whatever values are current (floats are never torn).
     * Variables live until the server has stopped. */
    for (size_t i = 0; i < req->n_segments; i++) {
      const Psd__V1__Segment *seg = req->segments[i];
      struct psd_var *v = vars[i];
      uint64_t len = seg->count * sizeof(float);
      pthread_mutex_lock(&v->lock);
      versions[i] = v->version;
      pthread_mutex_unlock(&v->lock);
      if (left == 0)
        continue; /* past the end of a partial answer */
      len = len < left ? len : left;
      pieces[npieces++] = (struct cm_wire_piece){
          (const uint8_t *)((req->slots ? v->slots[req->slot] : v->value) +
                            (seg->offset - v->elem_begin)),
          len};
      left -= len;
    }
  } else if (!bf16 && !req->slots && (snap = psd_steps_snap_get(svc->steps))) {
    /* Sync: the step's values as one snapshot that every answer of the
     * step sends (steps.h), so a chunk is exactly the version it says. */
    for (size_t i = 0; i < req->n_segments; i++) {
      const Psd__V1__Segment *seg = req->segments[i];
      const float *val = psd_steps_snap_values(snap, vars[i], &versions[i]);
      uint64_t len = seg->count * sizeof(float);
      if (left == 0)
        continue; /* past the end of a partial answer */
      len = len < left ? len : left;
      pieces[npieces++] = (struct cm_wire_piece){
          (const uint8_t *)(val + (seg->offset - vars[i]->elem_begin)), len};
      left -= len;
    }
  } else {
    /* Sync: one copy, so a chunk is exactly the version it says; bf16:
     * the rounding is that copy. */
    if (!(data = malloc(send ? send : 1)))
      goto nomem;
    uint8_t *p = data;
    for (size_t i = 0; i < req->n_segments; i++) {
      const Psd__V1__Segment *seg = req->segments[i];
      struct psd_var *v = vars[i];
      uint64_t len = seg->count * esize;
      len = len < left ? len : left;
      pthread_mutex_lock(&v->lock);
      if (len)
        copy_out(p,
                 (req->slots ? v->slots[req->slot] : v->value) +
                     (seg->offset - v->elem_begin),
                 len / esize, bf16);
      versions[i] = v->version;
      pthread_mutex_unlock(&v->lock);
      p += len;
      left -= len;
    }
    pieces[0] = (struct cm_wire_piece){data, send};
    npieces = 1;
  }
  resp.partial = send < total;
  resp.elements = send / esize;
  head_len = protobuf_c_message_get_packed_size(&resp.base);
  if (!(head = malloc(head_len + 1)))
    goto nomem;
  protobuf_c_message_pack(&resp.base, head);
  {
    grpc_byte_buffer *out;
    if (snap && npieces > 0) {
      /* Each piece's slice releases one reference. */
      psd_steps_snap_hold(snap, npieces - 1);
      out = cm_wire_build(head, head_len, pieces, npieces,
                          psd_steps_snap_release, snap);
      snap = NULL;
    } else {
      out = data ? cm_wire_build(head, head_len, pieces, 1, release_free, data)
                 : cm_wire_build(head, head_len, pieces, npieces, NULL, NULL);
    }
    data = NULL; /* the slice owns it now */
    atomic_fetch_add(&svc->pulls, 1);
    atomic_fetch_add(&svc->bytes_out, send);
    cm_rpc_reply(call, out);
    psd_hist_observe(&svc->pull_time, (cm_mono_ms() - start) / 1e3);
  }
  goto out;
nomem:
  psd__fail(svc, call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
out:
  free(head);
  free(data);
  psd_steps_snap_release(snap);
  free(pieces);
  free(vars);
  free(versions);
}

/* Answers a sync pull of a generation the job has rolled back from: no
 * data, the step to pull again and the generation. */
static void answer_rolled_back(struct psd_service *svc,
                               struct cm_rpc_call *call) {
  Psd__V1__PullResponse r = PSD__V1__PULL_RESPONSE__INIT;
  struct psd_steps_state st;
  psd_steps_state(svc->steps, &st);
  r.gen = st.gen;
  r.rollback_step = st.rollback_step;
  r.rolled_back = 1;
  r.step = st.version;
  cm_rpc_reply(call, cm_rpc_pack(&r.base));
}

/* Answers a rolled-back pull of either kind. */
static void rolled_back(struct psd_service *svc, struct cm_rpc_call *call,
                        int sparse) {
  if (sparse)
    psd__sparse_answer_rolled_back(svc, call);
  else
    answer_rolled_back(svc, call);
}

int psd__park(struct psd_service *svc, struct cm_rpc_call *call,
              uint64_t min_version, uint64_t want_gen,
              Psd__V1__PullRequest *req, struct psd__sparse_pull *sp) {
  const char *what = sp ? "SparsePull" : "Pull";
  {
    /* Park it under the lock that commits drain, so none is missed. */
    struct psd_steps_state st;
    uint64_t version, gen;
    int full = 0, resumed, parked = 0;
    pthread_mutex_lock(&svc->park_lock);
    psd_steps_state(svc->steps, &st);
    version = st.version;
    gen = st.gen;
    resumed = st.resumed;
    /* A pull of an older generation asks for steps the job rolled back:
     * it is told so, without data. */
    if (want_gen < gen) {
      pthread_mutex_unlock(&svc->park_lock);
      rolled_back(svc, call, sp != NULL);
      return -1;
    }
    /* A worker pulls for the step after the last one closed, whose commit
     * may still be on its way here: one ahead at most. Further ahead would
     * wait for steps that cannot close without this shard; one that
     * restarted from an older checkpoint waits for the coordinator's
     * rollback (the pull is retried). A newer generation's pull waits for
     * this shard's rollback, parked. */
    if (version + 1 < min_version && want_gen == gen) {
      pthread_mutex_unlock(&svc->park_lock);
      psd__fail(svc, call,
                resumed ? GRPC_STATUS_UNAVAILABLE
                        : GRPC_STATUS_FAILED_PRECONDITION,
                "%s: version %llu asked for, but shard %d has committed %llu "
                "steps; a worker pulls at most one step ahead (did this shard "
                "restart alone, or the worker come from another run?)",
                what, (unsigned long long)min_version, svc->shard,
                (unsigned long long)version);
      return -1;
    }
    if (svc->stopped) {
      /* Stopping: the parked pulls were answered; none parks now. */
      pthread_mutex_unlock(&svc->park_lock);
      psd__fail(svc, call, GRPC_STATUS_UNAVAILABLE, "psd is shutting down");
      return -1;
    }
    if (version < min_version || want_gen > gen ||
        (svc->hold_at && min_version >= svc->hold_at)) {
      struct psd__parked_pull *p = NULL;
      if (svc->nparked >= PSD_MAX_PARKED)
        full = 1;
      else if (!(p = calloc(1, sizeof *p)))
        full = 2;
      if (p) {
        *p = (struct psd__parked_pull){call, min_version, want_gen,
                                       req,  sp,          svc->parked};
        svc->parked = p;
        svc->nparked++;
        parked = 1;
      }
    }
    pthread_mutex_unlock(&svc->park_lock);
    if (full) {
      if (full == 2)
        psd__fail(svc, call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
      else
        psd__fail(svc, call, GRPC_STATUS_RESOURCE_EXHAUSTED,
                  "%s: %d pulls already wait for a step on shard %d; no more "
                  "are parked",
                  what, PSD_MAX_PARKED, svc->shard);
      return -1;
    }
    return parked ? 0 : 1;
  }
}

void psd__on_pull(struct cm_rpc_call *call, grpc_byte_buffer *bb, void *ctx) {
  struct psd_service *svc = ctx;
  double start = cm_mono_ms();
  struct cm_wire_msg m;
  Psd__V1__PullRequest *req = (Psd__V1__PullRequest *)cm_request_open(
      &svc->host, call, bb, &psd__v1__pull_request__descriptor, "Pull", &m);
  cm_wire_msg_release(&m);
  if (!req || psd__check_segment_count(svc, call, req->n_segments, "Pull"))
    goto out;
  if (req->min_version > 0 && svc->steps) {
    int go = psd__park(svc, call, req->min_version, req->gen, req, NULL);
    if (go == 0)
      req = NULL; /* parked: the list owns it */
    if (go != 1)
      goto out;
  }
  answer_pull(svc, call, req, start);
out:
  cm_request_free((ProtobufCMessage *)req);
}

void psd__pull_release_parked(struct psd_service *svc, int stopping) {
  struct psd__parked_pull *ready = NULL;
  pthread_mutex_lock(&svc->park_lock);
  struct psd_steps_state st = {0};
  if (svc->steps)
    psd_steps_state(svc->steps, &st);
  uint64_t version = st.version, gen = st.gen;
  if (stopping)
    svc->stopped = 1;
  for (struct psd__parked_pull **pp = &svc->parked; *pp;) {
    struct psd__parked_pull *p = *pp;
    if (stopping || p->gen < gen ||
        (p->gen == gen && p->min_version <= version &&
         !(svc->hold_at && p->min_version >= svc->hold_at))) {
      *pp = p->next;
      p->next = ready;
      ready = p;
      svc->nparked--;
    } else {
      pp = &p->next;
    }
  }
  pthread_mutex_unlock(&svc->park_lock);
  while (ready) {
    struct psd__parked_pull *p = ready;
    ready = p->next;
    if (stopping)
      cm_rpc_fail(p->call, GRPC_STATUS_UNAVAILABLE, "psd is shutting down");
    else if (p->gen < gen)
      rolled_back(svc, p->call, p->sp != NULL);
    else if (p->sp)
      psd__sparse_answer(svc, p->call, p->sp, cm_mono_ms());
    else
      answer_pull(svc, p->call, p->req, cm_mono_ms());
    if (p->req)
      cm_request_free(&p->req->base);
    psd__sparse_pull_free(p->sp);
    free(p);
  }
}
