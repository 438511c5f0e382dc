/* psd.v1.Data and psd.v1.Admin handlers (service.h). Each handler checks
 * the whole request before changing anything, so a rejected push applies
 * nothing. Bulk bytes are read in place from the received slices (wire.h):
 * one copy into a scratch buffer on push, one copy out of the variable on
 * pull. */
#include "service.h"

#include <pthread.h>

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "coord.h"
#include "dedup.h"
#include "err.h"
#include "hist.h"
#include "log.h"
#include "ps.pb-c.h"
#include "saver.h"
#include "steps.h"
#include "wire.h"

/* Errors logged in full before the log only samples them. */
#define LOGGED_ERRORS 50

struct psd_service {
  struct psd_store *store;         /* borrowed */
  int shard;                       /* this shard's index */
  int nshards;                     /* shards in the job */
  char job[64];                    /* job name callers must use */
  char mode[16];                   /* "async" */
  char optim[96];                  /* optimizer, described */
  struct timespec started;         /* for uptime */
  struct cm_rpc_method methods[5]; /* what psd serves */
  struct psd_steps *steps;         /* owned, sync mode */
  struct psd_coord *coord;         /* borrowed, shard 0 only (status) */
  struct psd_saver *saver;         /* borrowed: step counts, commit gate */
  pthread_mutex_t park_lock;       /* guards parked */
  struct parked_pull *parked;      /* pulls waiting for a version */
  atomic_uint_fast64_t pulls;      /* pull calls answered */
  atomic_uint_fast64_t pushes;     /* push calls applied */
  atomic_uint_fast64_t examples;   /* examples behind applied pushes */
  atomic_uint_fast64_t bytes_in;   /* gradient bytes applied */
  atomic_uint_fast64_t bytes_out;  /* value bytes sent */
  atomic_uint_fast64_t errors;     /* calls answered with an error */
  atomic_uint_fast64_t updates;    /* async: worker steps applied (pushes
                                      carrying a batch's examples) */
  struct psd_hist push_time;       /* push handling, decode to reply */
  struct psd_hist pull_time;       /* pull handling, a parked wait excluded */
  struct psd_dedup *dedup;         /* owned: push messages applied, per
                                      client (retries are not applied twice) */
};

/* A pull waiting for the shard to commit min_version steps. */
struct parked_pull {
  struct cm_rpc_call *call;  /* answered once the version exists */
  Psd__V1__PullRequest *req; /* owned, unpacked request */
  struct parked_pull *next;  /* list link */
};

static void fail(struct psd_service *svc, struct cm_rpc_call *call,
                 grpc_status_code code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void fail(struct psd_service *svc, struct cm_rpc_call *call,
                 grpc_status_code code, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (code == GRPC_STATUS_ABORTED) {
    /* A sync gradient that came after its step closed: routine, not an
     * error (the coordinator counts the drop). */
    cm_debug("%s from %s: %s", cm_rpc_status_name(code), cm_rpc_peer(call),
             msg);
    cm_rpc_fail(call, code, "%s", msg);
    return;
  }
  uint64_t n = atomic_fetch_add(&svc->errors, 1) + 1;
  if (n <= LOGGED_ERRORS || n % 1000 == 0)
    cm_warn("%s from %s: %s%s", cm_rpc_status_name(code), cm_rpc_peer(call),
            msg, n == LOGGED_ERRORS ? " (further errors are sampled)" : "");
  cm_rpc_fail(call, code, "%s", msg);
}

/* Checks the caller's job; returns 0 or answers the call and returns -1. */
static int check_caller(struct psd_service *svc, struct cm_rpc_call *call,
                        const Psd__V1__Caller *caller, const char *what) {
  if (caller && caller->job && caller->job[0] &&
      strcmp(caller->job, svc->job) != 0) {
    fail(svc, call, GRPC_STATUS_FAILED_PRECONDITION,
         "%s for job '%s' reached shard %d of job '%s'", what, caller->job,
         svc->shard, svc->job);
    return -1;
  }
  return 0;
}

/* Splits and unpacks a request; answers INVALID_ARGUMENT and returns NULL
 * when it is not valid protobuf of the expected type. */
static ProtobufCMessage *decode(struct psd_service *svc,
                                struct cm_rpc_call *call, grpc_byte_buffer *bb,
                                const ProtobufCMessageDescriptor *desc,
                                struct cm_wire_msg *m) {
  ProtobufCMessage *msg = NULL;
  if (cm_wire_parse(m, bb) == 0)
    msg = protobuf_c_message_unpack(desc, NULL, m->head_len, m->head);
  if (!msg)
    fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
         "request is not a valid %s message (malformed protobuf)", desc->name);
  return msg;
}

/* Finds a segment's variable and checks its element range against this
 * shard's rows. Returns the variable or answers the call and returns NULL. */
static struct psd_var *segment_var(struct psd_service *svc,
                                   struct cm_rpc_call *call,
                                   const Psd__V1__Segment *seg,
                                   const char *what) {
  struct psd_var *v = psd_store_find(svc->store, seg->name);
  if (!v) {
    fail(svc, call, GRPC_STATUS_NOT_FOUND,
         "%s: no variable '%s' on shard %d (declare it first)", what, seg->name,
         svc->shard);
    return NULL;
  }
  if (seg->count == 0 || seg->offset < v->elem_begin ||
      seg->offset > v->elem_end || seg->count > v->elem_end - seg->offset) {
    fail(svc, call, GRPC_STATUS_OUT_OF_RANGE,
         "%s of '%s' elements [%llu, %llu) is outside shard %d's slice, "
         "elements [%llu, %llu) (rows [%lld, %lld))",
         what, v->name, (unsigned long long)seg->offset,
         (unsigned long long)(seg->offset + seg->count), svc->shard,
         (unsigned long long)v->elem_begin, (unsigned long long)v->elem_end,
         (long long)v->row_begin, (long long)v->row_end);
    return NULL;
  }
  return v;
}

static void on_declare(struct cm_rpc_call *call, grpc_byte_buffer *bb,
                       void *ctx) {
  struct psd_service *svc = ctx;
  struct cm_wire_msg m;
  Psd__V1__DeclareRequest *req = NULL;
  Psd__V1__DeclareResponse resp = PSD__V1__DECLARE_RESPONSE__INIT;
  Psd__V1__VarSlice *slices = NULL, **ptrs = NULL;
  char err[512];

  req = (Psd__V1__DeclareRequest *)decode(
      svc, call, bb, &psd__v1__declare_request__descriptor, &m);
  if (!req || check_caller(svc, call, req->caller, "Declare"))
    goto out;
  slices = calloc(req->n_vars + 1, sizeof *slices);
  ptrs = calloc(req->n_vars + 1, sizeof *ptrs);
  if (!slices || !ptrs) {
    fail(svc, call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    goto out;
  }
  for (size_t i = 0; i < req->n_vars; i++) {
    const Psd__V1__VarSpec *vs = req->vars[i];
    struct psd_var *v;
    int created = 0, rc;
    rc = psd_store_declare(
        svc->store, vs->name, (int)vs->n_shape, vs->shape, vs->placement,
        vs->init == PSD__V1__INIT__INIT_UNIFORM ? PSD_INIT_UNIFORM
                                                : PSD_INIT_ZEROS,
        vs->init_scale, vs->seed, &v, &created, err, sizeof err);
    if (rc) {
      fail(svc, call,
           rc == CM_EEXIST   ? GRPC_STATUS_ALREADY_EXISTS
           : rc == CM_ENOMEM ? GRPC_STATUS_RESOURCE_EXHAUSTED
                             : GRPC_STATUS_INVALID_ARGUMENT,
           "%s", err);
      goto out;
    }
    if (created) {
      char shape[128];
      const char *who =
          req->caller && req->caller->worker ? req->caller->worker : "?";
      psd_shape_format(v->ndim, v->shape, shape, sizeof shape);
      if (v->row_end > v->row_begin)
        cm_info("created '%s' %s: rows [%lld, %lld) here (declared by %s)",
                v->name, shape, (long long)v->row_begin, (long long)v->row_end,
                who);
      else
        cm_info("created '%s' %s: no rows here, %s (declared by %s)", v->name,
                shape,
                v->placement >= 0 ? "placed whole on another shard"
                                  : "more shards than rows",
                who);
    }
    psd__v1__var_slice__init(&slices[i]);
    slices[i].name = v->name;
    slices[i].row_begin = v->row_begin;
    slices[i].row_end = v->row_end;
    slices[i].created = created;
    ptrs[i] = &slices[i];
  }
  resp.n_slices = req->n_vars;
  resp.slices = ptrs;
  cm_rpc_reply(call, cm_rpc_pack(&resp.base));
out:
  free(slices);
  free(ptrs);
  if (req)
    protobuf_c_message_free_unpacked(&req->base, NULL);
  cm_wire_msg_release(&m);
}

static void release_free(void *p) { free(p); }

/* Answers a pull whose version exists; `start` (cm_mono_ms) is when its
 * handling began, for the pull histogram. */
static void answer_pull(struct psd_service *svc, struct cm_rpc_call *call,
                        const Psd__V1__PullRequest *req, double start) {
  Psd__V1__PullResponse resp = PSD__V1__PULL_RESPONSE__INIT;
  struct psd_var **vars = NULL;
  struct cm_wire_piece *pieces = NULL;
  uint64_t *versions = NULL, total = 0;
  uint8_t *data = NULL, *head = NULL;
  size_t head_len;

  vars = calloc(req->n_segments + 1, sizeof *vars);
  versions = calloc(req->n_segments + 1, sizeof *versions);
  if (!vars || !versions)
    goto nomem;
  for (size_t i = 0; i < req->n_segments; i++) {
    if (!(vars[i] = segment_var(svc, call, req->segments[i], "pull")))
      goto out;
    if (req->slots && !vars[i]->slot) {
      fail(svc, call, GRPC_STATUS_FAILED_PRECONDITION,
           "pull of '%s' slots: the optimizer %s keeps none", vars[i]->name,
           svc->optim);
      goto out;
    }
    total += req->segments[i]->count * sizeof(float);
    if (total > CM_RPC_MAX_MESSAGE - 4096) {
      fail(svc, call, GRPC_STATUS_RESOURCE_EXHAUSTED,
           "pull asks for more than %d bytes in one message; split it into "
           "chunks",
           CM_RPC_MAX_MESSAGE - 4096);
      goto out;
    }
  }
  if (svc->steps)
    resp.step = psd_steps_version(svc->steps);
  if (!svc->steps) {
    /* Async: send straight from the variables' memory, no copy. A push
     * may land while gRPC writes it, as it could between two pulls: async
     * training reads whatever values are current (floats are never torn).
     * Variables live until the server has stopped. */
    if (!(pieces = calloc(req->n_segments + 1, sizeof *pieces)))
      goto nomem;
    for (size_t i = 0; i < req->n_segments; i++) {
      const Psd__V1__Segment *seg = req->segments[i];
      struct psd_var *v = vars[i];
      pthread_mutex_lock(&v->lock);
      versions[i] = v->version;
      pthread_mutex_unlock(&v->lock);
      pieces[i].ptr = (const uint8_t *)((req->slots ? v->slot : v->value) +
                                        (seg->offset - v->elem_begin));
      pieces[i].len = seg->count * sizeof(float);
    }
  } else {
    /* Sync: one copy, so a chunk is exactly the version it says. */
    if (!(data = malloc(total ? total : 1)) ||
        !(pieces = calloc(1, sizeof *pieces)))
      goto nomem;
    uint8_t *p = data;
    for (size_t i = 0; i < req->n_segments; i++) {
      const Psd__V1__Segment *seg = req->segments[i];
      struct psd_var *v = vars[i];
      pthread_mutex_lock(&v->lock);
      memcpy(p,
             (req->slots ? v->slot : v->value) + (seg->offset - v->elem_begin),
             seg->count * sizeof(float));
      versions[i] = v->version;
      pthread_mutex_unlock(&v->lock);
      p += seg->count * sizeof(float);
    }
    pieces[0] = (struct cm_wire_piece){data, total};
  }
  resp.n_versions = req->n_segments;
  resp.versions = versions;
  head_len = protobuf_c_message_get_packed_size(&resp.base);
  if (!(head = malloc(head_len + 1)))
    goto nomem;
  protobuf_c_message_pack(&resp.base, head);
  {
    grpc_byte_buffer *out =
        data ? cm_wire_build(head, head_len, pieces, 1, release_free, data)
             : cm_wire_build(head, head_len, pieces, (int)req->n_segments, NULL,
                             NULL);
    data = NULL; /* the slice owns it now */
    atomic_fetch_add(&svc->pulls, 1);
    atomic_fetch_add(&svc->bytes_out, total);
    cm_rpc_reply(call, out);
    psd_hist_observe(&svc->pull_time, (cm_mono_ms() - start) / 1e3);
  }
  goto out;
nomem:
  fail(svc, call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
out:
  free(head);
  free(data);
  free(pieces);
  free(vars);
  free(versions);
}

static void on_pull(struct cm_rpc_call *call, grpc_byte_buffer *bb, void *ctx) {
  struct psd_service *svc = ctx;
  double start = cm_mono_ms();
  struct cm_wire_msg m;
  Psd__V1__PullRequest *req = (Psd__V1__PullRequest *)decode(
      svc, call, bb, &psd__v1__pull_request__descriptor, &m);
  cm_wire_msg_release(&m);
  if (!req || check_caller(svc, call, req->caller, "Pull"))
    goto out;
  if (req->min_version > 0 && svc->steps) {
    /* Park it under the lock that commits drain, so none is missed. */
    pthread_mutex_lock(&svc->park_lock);
    if (psd_steps_version(svc->steps) < req->min_version) {
      struct parked_pull *p = calloc(1, sizeof *p);
      if (p) {
        *p = (struct parked_pull){call, req, svc->parked};
        svc->parked = p;
        req = NULL;
        call = NULL;
      }
    }
    pthread_mutex_unlock(&svc->park_lock);
    if (!call)
      goto out;
  }
  answer_pull(svc, call, req, start);
out:
  if (req)
    protobuf_c_message_free_unpacked(&req->base, NULL);
}

/* Answers the parked pulls whose version now exists (or all of them, with
 * UNAVAILABLE, when psd stops). */
static void release_parked(struct psd_service *svc, int stopping) {
  struct parked_pull *ready = NULL;
  pthread_mutex_lock(&svc->park_lock);
  uint64_t version = svc->steps ? psd_steps_version(svc->steps) : 0;
  for (struct parked_pull **pp = &svc->parked; *pp;) {
    struct parked_pull *p = *pp;
    if (stopping || p->req->min_version <= version) {
      *pp = p->next;
      p->next = ready;
      ready = p;
    } else {
      pp = &p->next;
    }
  }
  pthread_mutex_unlock(&svc->park_lock);
  while (ready) {
    struct parked_pull *p = ready;
    ready = p->next;
    if (stopping)
      cm_rpc_fail(p->call, GRPC_STATUS_UNAVAILABLE, "psd is shutting down");
    else
      answer_pull(svc, p->call, p->req, cm_mono_ms());
    protobuf_c_message_free_unpacked(&p->req->base, NULL);
    free(p);
  }
}

static void on_commit(struct cm_rpc_call *call, grpc_byte_buffer *bb,
                      void *ctx) {
  struct psd_service *svc = ctx;
  struct cm_wire_msg m;
  Psd__V1__CommitRequest *req = (Psd__V1__CommitRequest *)decode(
      svc, call, bb, &psd__v1__commit_request__descriptor, &m);
  int applied[PSD_STEPS_MAX_WORKERS], dropped[PSD_STEPS_MAX_WORKERS];
  char err[256];
  cm_wire_msg_release(&m);
  if (!req || check_caller(svc, call, req->caller, "Commit"))
    goto out;
  if (!svc->steps) {
    fail(svc, call, GRPC_STATUS_FAILED_PRECONDITION,
         "Commit: shard %d runs an asynchronous job", svc->shard);
    goto out;
  }
  if (req->n_applied > PSD_STEPS_MAX_WORKERS ||
      req->n_dropped > PSD_STEPS_MAX_WORKERS) {
    fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT, "Commit: too many workers");
    goto out;
  }
  for (size_t i = 0; i < req->n_applied; i++)
    applied[i] = req->applied[i];
  for (size_t i = 0; i < req->n_dropped; i++)
    dropped[i] = req->dropped[i];
  /* A checkpoint being written holds the commit (saver.h). */
  if (svc->saver)
    psd_saver_commit_begin(svc->saver);
  int rc = psd_steps_commit(svc->steps, req->step, applied, (int)req->n_applied,
                            dropped, (int)req->n_dropped, err, sizeof err);
  if (svc->saver)
    psd_saver_commit_end(svc->saver, psd_steps_version(svc->steps));
  if (rc) {
    /* Shards resumed from different checkpoints cannot go on together. */
    fail(svc, call, GRPC_STATUS_FAILED_PRECONDITION, "%s%s", err,
         req->step != psd_steps_version(svc->steps)
             ? "; did the shards resume from different checkpoints? restart "
               "every shard with --resume-step N, N the newest step all of "
               "them have"
             : "");
    goto out;
  }
  {
    Psd__V1__CommitResponse r = PSD__V1__COMMIT_RESPONSE__INIT;
    r.version = psd_steps_version(svc->steps);
    cm_rpc_reply(call, cm_rpc_pack(&r.base));
  }
  release_parked(svc, 0);
out:
  if (req)
    protobuf_c_message_free_unpacked(&req->base, NULL);
}

void psd_service_stop(struct psd_service *svc) { release_parked(svc, 1); }

static void on_push(struct cm_rpc_call *call, grpc_byte_buffer *bb, void *ctx) {
  struct psd_service *svc = ctx;
  double start = cm_mono_ms();
  struct cm_wire_msg m;
  Psd__V1__PushRequest *req = NULL;
  Psd__V1__PushResponse resp = PSD__V1__PUSH_RESPONSE__INIT;
  struct psd_var **vars = NULL;
  uint64_t *versions = NULL, total = 0, largest = 0;
  float *scratch = NULL;
  char have[128], want[128];
  int claimed = 0; /* this message's dedup claim is ours to give back */

  req = (Psd__V1__PushRequest *)decode(svc, call, bb,
                                       &psd__v1__push_request__descriptor, &m);
  if (!req || check_caller(svc, call, req->caller, "Push"))
    goto out;
  vars = calloc(req->n_segments + 1, sizeof *vars);
  versions = calloc(req->n_segments + 1, sizeof *versions);
  if (!vars || !versions)
    goto nomem;
  /* Check everything before applying anything. */
  for (size_t i = 0; i < req->n_segments; i++) {
    const Psd__V1__Segment *seg = req->segments[i];
    struct psd_var *v = psd_store_find(svc->store, seg->name);
    int same = v && (int)seg->n_shape == v->ndim;
    for (size_t d = 0; same && d < seg->n_shape; d++)
      same = seg->shape[d] == v->shape[d];
    if (v && !same) {
      psd_shape_format(v->ndim, v->shape, have, sizeof have);
      psd_shape_format((int)seg->n_shape, seg->shape, want, sizeof want);
      fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
           "push to '%s': gradient shape %s does not match the variable's "
           "shape %s",
           seg->name, want, have);
      goto out;
    }
    if (!(vars[i] = segment_var(svc, call, seg, "push")))
      goto out;
    total += seg->count * sizeof(float);
    if (seg->count > largest)
      largest = seg->count;
  }
  if (total != m.bulk_len) {
    fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
         "push: segments describe %llu bytes of gradient but the data field "
         "holds %zu",
         (unsigned long long)total, m.bulk_len);
    goto out;
  }
  /* Nothing to apply, and not counted as a push: gRPC hands a call that
   * the client cancelled before its message arrived (its deadline passed
   * while this shard was stopped) to the handler as an empty message. */
  if (req->n_segments == 0) {
    cm_rpc_reply(call, cm_rpc_pack(&resp.base));
    goto out;
  }
  /* A retry of a message applied already (its answer was lost) is
   * acknowledged and changes nothing. Claimed only once the message is known
   * good, and given back if staging refuses it. */
  if (req->client_id) {
    int d = psd_dedup_claim(svc->dedup, req->client_id, req->seq, req->chunk);
    if (d == 1) {
      cm_debug("duplicate push from %s (client %016llx, seq %llu, chunk %u): "
               "acknowledged without effect",
               cm_rpc_peer(call), (unsigned long long)req->client_id,
               (unsigned long long)req->seq, req->chunk);
      for (size_t i = 0; i < req->n_segments; i++) {
        if (svc->steps) {
          versions[i] = psd_steps_version(svc->steps);
          continue;
        }
        pthread_mutex_lock(&vars[i]->lock);
        versions[i] = vars[i]->version;
        pthread_mutex_unlock(&vars[i]->lock);
      }
      resp.n_versions = req->n_segments;
      resp.versions = versions;
      cm_rpc_reply(call, cm_rpc_pack(&resp.base));
      goto out;
    }
    claimed = d == 0;
  }
  if (!(scratch = malloc((largest ? largest : 1) * sizeof(float))))
    goto nomem;
  {
    size_t off = 0;
    for (size_t i = 0; i < req->n_segments; i++) {
      const Psd__V1__Segment *seg = req->segments[i];
      struct psd_var *v = vars[i];
      size_t bytes = seg->count * sizeof(float);
      cm_wire_bulk_read(&m, off, scratch, bytes);
      off += bytes;
      if (svc->steps) {
        char err[256];
        int rc = psd_steps_stage(svc->steps, req->worker, req->step, v,
                                 seg->offset - v->elem_begin, scratch,
                                 seg->count, err, sizeof err);
        if (rc) {
          if (claimed)
            psd_dedup_unclaim(svc->dedup, req->client_id, req->seq, req->chunk);
          /* A late gradient is ABORTED: the worker drops it and moves on. */
          fail(svc, call,
               rc == CM_ERANGE ? GRPC_STATUS_ABORTED
                               : GRPC_STATUS_FAILED_PRECONDITION,
               "%s", err);
          goto out;
        }
        versions[i] = psd_steps_version(svc->steps);
        continue;
      }
      pthread_mutex_lock(&v->lock);
      psd_store_apply(svc->store, v, seg->offset - v->elem_begin, scratch,
                      seg->count);
      versions[i] = ++v->version;
      pthread_mutex_unlock(&v->lock);
    }
  }
  atomic_fetch_add(&svc->pushes, 1);
  /* A worker's step sends its examples in its first message to a shard
   * only, so this counts steps however the gradient was chunked. */
  if (!svc->steps && req->examples > 0)
    atomic_fetch_add(&svc->updates, 1);
  if (svc->saver && !svc->steps)
    psd_saver_pushed(svc->saver);
  atomic_fetch_add(&svc->examples, req->examples);
  atomic_fetch_add(&svc->bytes_in, total);
  resp.n_versions = req->n_segments;
  resp.versions = versions;
  cm_rpc_reply(call, cm_rpc_pack(&resp.base));
  /* Async steps are timed at shard 0 by the pushes' first messages; sync
   * steps by their admissions (coord.c). svc->steps alone decides staging. */
  if (svc->coord && !svc->steps && req->has_worker && req->first)
    psd_coord_pushed(svc->coord, req->worker);
  psd_hist_observe(&svc->push_time, (cm_mono_ms() - start) / 1e3);
  goto out;
nomem:
  fail(svc, call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
out:
  free(scratch);
  free(vars);
  free(versions);
  if (req)
    protobuf_c_message_free_unpacked(&req->base, NULL);
  cm_wire_msg_release(&m);
}

/* Points h at counts (PSD_HIST_BOUNDS + 1 entries, borrowed until the
 * message is packed) and the shared bounds. */
static void fill_hist(Psd__V1__Histogram *h, const char *name, uint64_t *counts,
                      double sum) {
  psd__v1__histogram__init(h);
  h->name = (char *)name;
  h->n_bounds = PSD_HIST_BOUNDS;
  h->bounds = (double *)psd_hist_bounds(); /* protobuf-c only reads it */
  h->n_counts = PSD_HIST_BOUNDS + 1;
  h->counts = counts;
  h->sum = sum;
  h->count = 0;
  for (int i = 0; i <= PSD_HIST_BOUNDS; i++)
    h->count += counts[i];
}

static void on_status(struct cm_rpc_call *call, grpc_byte_buffer *bb,
                      void *ctx) {
  struct psd_service *svc = ctx;
  struct cm_wire_msg m;
  Psd__V1__StatusRequest *req = NULL;
  Psd__V1__StatusResponse resp = PSD__V1__STATUS_RESPONSE__INIT;
  Psd__V1__VarStatus *vs = NULL, **ptrs = NULL;
  struct psd_step_record *hist = NULL;
  Psd__V1__StepRecord *recs = NULL, **recp = NULL;
  int32_t *ids = NULL;
  struct psd_worker_info *winfo = NULL;
  Psd__V1__WorkerStatus *ws = NULL, **wsp = NULL;
  Psd__V1__CheckpointStatus ck = PSD__V1__CHECKPOINT_STATUS__INIT;
  struct psd_saver_state *sst = NULL;
  Psd__V1__Histogram *wh = NULL, sh[2], *shp[2] = {&sh[0], &sh[1]};
  uint64_t counts[2][PSD_HIST_BOUNDS + 1];
  double sums[2];
  struct timespec now;
  int n;

  req = (Psd__V1__StatusRequest *)decode(
      svc, call, bb, &psd__v1__status_request__descriptor, &m);
  if (!req || check_caller(svc, call, req->caller, "Status"))
    goto out;
  n = psd_store_count(svc->store);
  vs = calloc(n + 1, sizeof *vs);
  ptrs = calloc(n + 1, sizeof *ptrs);
  if (!vs || !ptrs) {
    fail(svc, call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    goto out;
  }
  for (int i = 0; i < n; i++) {
    struct psd_var *v = psd_store_at(svc->store, i);
    psd__v1__var_status__init(&vs[i]);
    vs[i].name = v->name;
    vs[i].n_shape = v->ndim;
    vs[i].shape = v->shape;
    vs[i].row_begin = v->row_begin;
    vs[i].row_end = v->row_end;
    pthread_mutex_lock(&v->lock);
    vs[i].version = v->version;
    pthread_mutex_unlock(&v->lock);
    vs[i].bytes = psd_var_bytes(svc->store, v);
    vs[i].optimizer = svc->optim;
    vs[i].placement = v->placement;
    ptrs[i] = &vs[i];
  }
  clock_gettime(CLOCK_MONOTONIC, &now);
  resp.shard = svc->shard;
  resp.num_shards = svc->nshards;
  resp.job = svc->job;
  resp.mode = svc->mode;
  resp.pulls = atomic_load(&svc->pulls);
  resp.pushes = atomic_load(&svc->pushes);
  resp.examples = atomic_load(&svc->examples);
  resp.bytes_in = atomic_load(&svc->bytes_in);
  resp.bytes_out = atomic_load(&svc->bytes_out);
  resp.errors = atomic_load(&svc->errors);
  resp.uptime_s = (now.tv_sec - svc->started.tv_sec) +
                  (now.tv_nsec - svc->started.tv_nsec) / 1e9;
  resp.n_vars = n;
  resp.vars = ptrs;
  psd_hist_read(&svc->push_time, counts[0], &sums[0]);
  psd_hist_read(&svc->pull_time, counts[1], &sums[1]);
  fill_hist(&sh[0], "push_seconds", counts[0], sums[0]);
  fill_hist(&sh[1], "pull_seconds", counts[1], sums[1]);
  resp.n_histograms = 2;
  resp.histograms = shp;
  {
    struct psd_dedup_stats ds;
    psd_dedup_stats(svc->dedup, &ds);
    resp.duplicates = ds.duplicates;
    resp.dedup_clients = ds.clients;
    resp.dedup_evicted = ds.evicted;
  }
  if (svc->steps) {
    resp.step = psd_steps_version(svc->steps);
    if (!(hist = malloc(PSD_STEPS_HISTORY * sizeof *hist)) ||
        !(recs = calloc(PSD_STEPS_HISTORY, sizeof *recs)) ||
        !(recp = calloc(PSD_STEPS_HISTORY, sizeof *recp)) ||
        !(ids = calloc(PSD_STEPS_HISTORY * 2 * PSD_STEPS_MAX_WORKERS,
                       sizeof *ids))) {
      fail(svc, call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
      goto out;
    }
    int nh = psd_steps_history(svc->steps, hist, PSD_STEPS_HISTORY);
    int32_t *id = ids;
    for (int i = 0; i < nh; i++) {
      psd__v1__step_record__init(&recs[i]);
      recs[i].step = hist[i].step;
      recs[i].n_applied = hist[i].napplied;
      recs[i].applied = id;
      for (int k = 0; k < hist[i].napplied; k++)
        *id++ = hist[i].applied[k];
      recs[i].n_dropped = hist[i].ndropped;
      recs[i].dropped = id;
      for (int k = 0; k < hist[i].ndropped; k++)
        *id++ = hist[i].dropped[k];
      recp[i] = &recs[i];
    }
    resp.n_steps = nh;
    resp.steps = recp;
  }
  if (svc->coord) {
    int nw = psd_coord_workers(svc->coord, NULL, 0);
    if (!(winfo = calloc(nw + 1, sizeof *winfo)) ||
        !(ws = calloc(nw + 1, sizeof *ws)) ||
        !(wsp = calloc(nw + 1, sizeof *wsp)) ||
        !(wh = calloc(nw + 1, sizeof *wh))) {
      fail(svc, call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
      goto out;
    }
    psd_coord_workers(svc->coord, winfo, nw);
    for (int i = 0; i < nw; i++) {
      psd__v1__worker_status__init(&ws[i]);
      ws[i].worker = winfo[i].worker;
      ws[i].live = winfo[i].live;
      ws[i].joined = winfo[i].joined;
      ws[i].applied = winfo[i].applied;
      ws[i].dropped = winfo[i].dropped;
      ws[i].clock = winfo[i].clock;
      ws[i].last_seen_ms = winfo[i].last_seen_ms;
      ws[i].joins = winfo[i].joins;
      ws[i].last_step = winfo[i].last_step;
      ws[i].pushes = winfo[i].pushes;
      ws[i].step_samples = winfo[i].step_samples;
      ws[i].step_p50_ms = winfo[i].step_p50_ms;
      ws[i].step_p95_ms = winfo[i].step_p95_ms;
      ws[i].lag_p50_ms = winfo[i].lag_p50_ms;
      ws[i].lag_p95_ms = winfo[i].lag_p95_ms;
      fill_hist(&wh[i], "step_seconds", winfo[i].step_counts,
                winfo[i].step_sum);
      ws[i].step_time = &wh[i];
      wsp[i] = &ws[i];
    }
    resp.n_workers = nw;
    resp.workers = wsp;
    resp.max_clock_spread = psd_coord_max_spread(svc->coord);
    resp.coordinator = 1;
  }
  if (svc->saver && (sst = malloc(sizeof *sst))) {
    psd_saver_state(svc->saver, sst);
    ck.dir = sst->dir;
    ck.written = sst->written;
    ck.failed = sst->failed;
    ck.step = sst->step;
    ck.path = sst->path;
    ck.bytes = sst->bytes;
    ck.ms = sst->ms;
    ck.error = sst->error;
    resp.checkpoint = &ck;
  }
  cm_rpc_reply(call, cm_rpc_pack(&resp.base));
out:
  free(sst);
  free(hist);
  free(recs);
  free(recp);
  free(ids);
  free(winfo);
  free(ws);
  free(wsp);
  free(wh);
  free(vs);
  free(ptrs);
  if (req)
    protobuf_c_message_free_unpacked(&req->base, NULL);
  cm_wire_msg_release(&m);
}

int psd_service_new(struct psd_service **out, struct psd_store *store,
                    int shard, int nshards, int nworkers, const char *job,
                    const char *mode, const struct psd_optim *opt) {
  struct psd_service *svc = calloc(1, sizeof *svc);
  if (!svc)
    return CM_ENOMEM;
  svc->store = store;
  svc->shard = shard;
  svc->nshards = nshards;
  snprintf(svc->job, sizeof svc->job, "%s", job);
  snprintf(svc->mode, sizeof svc->mode, "%s", mode);
  psd_optim_describe(opt, svc->optim, sizeof svc->optim);
  clock_gettime(CLOCK_MONOTONIC, &svc->started);
  svc->methods[0] =
      (struct cm_rpc_method){"/psd.v1.Data/Declare", on_declare, svc};
  svc->methods[1] = (struct cm_rpc_method){"/psd.v1.Data/Pull", on_pull, svc};
  svc->methods[2] = (struct cm_rpc_method){"/psd.v1.Data/Push", on_push, svc};
  svc->methods[3] =
      (struct cm_rpc_method){"/psd.v1.Admin/Status", on_status, svc};
  svc->methods[4] =
      (struct cm_rpc_method){"/psd.v1.Data/Commit", on_commit, svc};
  pthread_mutex_init(&svc->park_lock, NULL);
  /* Sync mode stages pushes for steps; svc->steps != NULL says so. */
  if (psd_dedup_new(&svc->dedup, PSD_DEDUP_CLIENTS) ||
      (strcmp(mode, "sync") == 0 &&
       psd_steps_new(&svc->steps, store, nworkers))) {
    psd_service_free(svc);
    return CM_ENOMEM;
  }
  *out = svc;
  return 0;
}

void psd_service_set_coord(struct psd_service *svc, struct psd_coord *coord) {
  svc->coord = coord;
}

void psd_service_set_saver(struct psd_service *svc, struct psd_saver *saver) {
  svc->saver = saver;
}

struct psd_steps *psd_service_steps(struct psd_service *svc) {
  return svc->steps;
}

void psd_service_free(struct psd_service *svc) {
  if (!svc)
    return;
  release_parked(svc, 1);
  psd_steps_free(svc->steps);
  psd_dedup_free(svc->dedup);
  pthread_mutex_destroy(&svc->park_lock);
  free(svc);
}

const struct cm_rpc_method *psd_service_methods(struct psd_service *svc,
                                                int *n) {
  *n = 5;
  return svc->methods;
}

void psd_service_counters(struct psd_service *svc, struct psd_counters *c) {
  c->pulls = atomic_load(&svc->pulls);
  c->pushes = atomic_load(&svc->pushes);
  c->examples = atomic_load(&svc->examples);
  c->bytes_in = atomic_load(&svc->bytes_in);
  c->bytes_out = atomic_load(&svc->bytes_out);
  c->errors = atomic_load(&svc->errors);
  c->step =
      svc->steps ? psd_steps_version(svc->steps) : atomic_load(&svc->updates);
}
