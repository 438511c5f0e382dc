/* Pull and push (psclient.h: psc__client_pull, push, push_pull, pull_at,
 * push_step): one transfer sends every message of the client's plan
 * (client.c), each shard's messages up to `inflight` at once and all shards
 * in parallel, and copies pulled bytes into the caller's value buffers.
 *
 * Faults: a call that fails UNAVAILABLE (a shard down or restarting),
 * DEADLINE_EXCEEDED (a shard stopped, a network cut off) or CANCELLED (a
 * shard that stopped before taking it) is sent again, only that call,
 * after an exponential backoff with jitter, until the shard has been
 * unreachable for the retry budget (job.retry_s; retry.c). Every push
 * message carries (client id, seq, chunk), so a shard that had applied a
 * message whose answer was lost acknowledges the retry without applying it
 * again (ps-server/psd/store/dedup.h). The coordinator's calls (coord.c) retry
 * with the same helpers.
 *
 * A call answered "layout moved" (the job was resharded under the client)
 * is neither a failure nor retried: the client re-plans for the new layout
 * and sends what is still pending, re-cut for the new shards (relayout.c):
 * a piece a shard acknowledged is never sent again. An answer that names
 * no newer layout than the client's sends what is pending again after a
 * short wait (psc__follow_moved). */
#include "client_internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bf16.h"
#include "clock.h"
#include "err.h"
#include "finite.h"
#include "shm_client.h"
#include "wire.h"

/* gRPC is done with one gradient slice (psclient.h: the caller's gradient
 * must not change while gRPC may still read it). */
static void release_ref(void *arg) {
  struct psc__client *c = arg;
  pthread_mutex_lock(&c->lock);
  if (--c->refs == 0)
    pthread_cond_broadcast(&c->cond);
  pthread_mutex_unlock(&c->lock);
}

/* Waits until gRPC has let go of every gradient slice; it does so as each
 * call completes, so this wait is short or nothing. */
static void wait_refs(struct psc__client *c) {
  struct timespec until = cm_abstime_after_ms(10000);
  pthread_mutex_lock(&c->lock);
  while (c->refs > 0)
    if (pthread_cond_timedwait(&c->cond, &c->lock, &until) == ETIMEDOUT)
      break;
  pthread_mutex_unlock(&c->lock);
}

/* Bytes of message m's tensor data on the wire (m->bytes counts f32s). */
static uint64_t wire_bytes(const struct psc__client *c,
                           const struct psc__msg *m, int push) {
  uint64_t b = push ? m->push_bytes : m->sel_bytes;
  return c->wire_bf16 ? b / sizeof(float) * CM_BF16_BYTES : b;
}

/* Settles which messages the current transfer sends (those holding a
 * selected piece, psc__client_select), their bytes, and each shard's first. */
static void select_msgs(struct psc__client *c) {
  int last_shard = -1;
  for (int i = 0; i < c->nmsgs; i++) {
    struct psc__msg *m = &c->msgs[i];
    m->sel_bytes = m->push_bytes = 0;
    for (int k = 0; k < m->npieces; k++) {
      const struct psc__piece *p = &c->pieces[m->first + k];
      if ((m->kinds & PSC__KIND_PULL) && psc__selected(c, p->var))
        m->sel_bytes += p->count * sizeof(float);
      if ((m->kinds & PSC__KIND_PUSH) && psc__pushed(c, p->var))
        m->push_bytes += p->count * sizeof(float);
    }
    /* Messages are planned shard by shard. */
    m->sel_lead = m->push_bytes > 0 && m->shard != last_shard;
    if (m->sel_lead)
      last_shard = m->shard;
  }
}

/* job.wire_dtype "bf16": rounds every gradient into c->grad16 (one pass),
 * which the push messages then point into. */
static int round_gradients(struct psc__client *c) {
  if (!c->grad16) {
    uint64_t total = 0;
    if (!(c->grad16_at = calloc((size_t)c->nvars + 1, sizeof *c->grad16_at)))
      return CM_ENOMEM;
    for (int i = 0; i < c->nvars; i++) {
      c->grad16_at[i] = total;
      total += psc__numel(&c->vars[i]);
    }
    if (!(c->grad16 = malloc((total ? total : 1) * sizeof *c->grad16)))
      return CM_ENOMEM;
  }
  for (int i = 0; i < c->nvars; i++)
    if (psc__pushed(c, i))
      cm_bf16_from_f32(c->grad16 + c->grad16_at[i], c->vars[i].grad,
                       psc__numel(&c->vars[i]));
  return 0;
}

/* Packs the caller and segments of message m as a Pull or Push head. */
static grpc_byte_buffer *build_request(struct psc__client *c,
                                       const struct psc__msg *m, int push) {
  int first_of_shard = m->sel_lead;
  Psd__V1__Caller caller = psc__caller(c, m->shard);
  Psd__V1__Segment segs[64], *sp[64], **ptrs = sp, *seg = segs;
  Psd__V1__ShmRef ref = PSD__V1__SHM_REF__INIT;
  int in_shm = c->shm && c->shm[m->shard].using;
  uint8_t stack[4096], *head = stack;
  grpc_byte_buffer *bb = NULL;
  struct cm_wire_piece wp[64], *pieces = wp;
  size_t len;

  int nseg = 0;
  if (m->npieces > 64) {
    seg = calloc(m->npieces, sizeof *seg);
    ptrs = calloc(m->npieces, sizeof *ptrs);
    pieces = calloc(m->npieces, sizeof *pieces);
    if (!seg || !ptrs || !pieces)
      goto out;
  }
  for (int k = 0; k < m->npieces; k++) {
    const struct psc__piece *p = &c->pieces[m->first + k];
    const struct psc__var *v = &c->vars[p->var];
    if (push ? !psc__pushed(c, p->var) : !psc__selected(c, p->var))
      continue;
    int i = nseg++;
    psd__v1__segment__init(&seg[i]);
    seg[i].name = (char *)v->name;
    seg[i].offset = p->offset;
    seg[i].count = p->count;
    if (push) {
      seg[i].n_shape = v->ndim;
      seg[i].shape = (int64_t *)v->shape;
      /* bf16: the rounded copy (round_gradients), else the caller's. */
      pieces[i].ptr =
          c->wire_bf16
              ? (const uint8_t *)(c->grad16 + c->grad16_at[p->var] + p->offset)
              : (const uint8_t *)(v->grad + p->offset);
      pieces[i].len = p->count * (c->wire_bf16 ? CM_BF16_BYTES : sizeof(float));
    }
    ptrs[i] = &seg[i];
  }
  if (push) {
    Psd__V1__PushRequest req = PSD__V1__PUSH_REQUEST__INIT;
    req.caller = &caller;
    req.n_segments = nseg;
    req.segments = ptrs;
    req.examples = first_of_shard ? c->examples : 0;
    if (c->windex >= 0) {
      /* Every push of a joined worker names it; the shard's mode decides
       * whether it is staged (sync) or applied (async), never this. */
      req.worker = c->windex;
      req.has_worker = 1;
      /* A subset's push starts the step only when it carries examples. */
      req.first = first_of_shard && (!c->sel || c->examples > 0);
    }
    if (c->sync_push) {
      req.step = c->push_step;
      req.gen = c->gen;
    }
    /* The same on every retry of this message: a shard applies it once. */
    req.client_id = c->client_id;
    req.seq = c->seq;
    req.chunk = m->chunk;
    req.dtype =
        c->wire_bf16 ? PSD__V1__WIRE_DTYPE__BF16 : PSD__V1__WIRE_DTYPE__F32;
    if (in_shm) {
      /* The gradient waits in the arena (psc__shm_fill). */
      ref.key_hi = c->shm[m->shard].key[0];
      ref.key_lo = c->shm[m->shard].key[1];
      ref.offset = psc__shm_at(c, (int)(m - c->msgs), 0);
      ref.length = m->push_bytes;
      req.shm = &ref;
    }
    len = psd__v1__push_request__get_packed_size(&req);
    if (len > sizeof stack && !(head = malloc(len)))
      goto out;
    psd__v1__push_request__pack(&req, head);
  } else {
    Psd__V1__PullRequest req = PSD__V1__PULL_REQUEST__INIT;
    req.caller = &caller;
    req.n_segments = nseg;
    req.segments = ptrs;
    req.min_version = c->min_version;
    req.gen = c->gen;
    /* Answers up to this client's own receive limit come whole. */
    req.max_answer_bytes = (uint64_t)cm_rpc_max_message();
    req.dtype =
        c->wire_bf16 ? PSD__V1__WIRE_DTYPE__BF16 : PSD__V1__WIRE_DTYPE__F32;
    if (in_shm) {
      /* The shard writes the values into the arena's pull part. */
      ref.key_hi = c->shm[m->shard].key[0];
      ref.key_lo = c->shm[m->shard].key[1];
      ref.offset = psc__shm_at(c, (int)(m - c->msgs), 1);
      ref.length = m->sel_bytes;
      req.shm = &ref;
    }
    len = psd__v1__pull_request__get_packed_size(&req);
    if (len > sizeof stack && !(head = malloc(len)))
      goto out;
    psd__v1__pull_request__pack(&req, head);
  }
  if (push && in_shm) {
    bb = cm_wire_build(head, len, NULL, 0, NULL, NULL);
    goto out;
  }
  if (push) {
    pthread_mutex_lock(&c->lock);
    c->refs += nseg;
    pthread_mutex_unlock(&c->lock);
  }
  bb = push ? cm_wire_build(head, len, pieces, nseg, release_ref, c)
            : cm_wire_build(head, len, NULL, 0, NULL, NULL);
out:
  if (head != stack)
    free(head);
  if (seg != segs) {
    free(seg);
    free(ptrs);
    free(pieces);
  }
  return bb;
}

/* Copies a pull answer's values into the variables: from the arena when
 * the shard wrote them there (in_shm), else from the received bytes. */
static void copy_pulled(struct psc__client *c, const struct psc__msg *m,
                        const struct cm_wire_msg *w, int in_shm) {
  const uint8_t *arena =
      in_shm ? c->shm[m->shard].base + psc__shm_at(c, (int)(m - c->msgs), 1)
             : NULL;
  size_t off = 0;
  for (int i = 0; i < m->npieces; i++) {
    const struct psc__piece *p = &c->pieces[m->first + i];
    if (!psc__selected(c, p->var))
      continue;
    float *dst = c->vars[p->var].value + p->offset;
    if (in_shm) {
      memcpy(dst, arena + off, p->count * sizeof(float));
      off += p->count * sizeof(float);
    } else if (c->wire_bf16) {
      cm_wire_bulk_read_bf16(w, off, dst, p->count);
      off += p->count * CM_BF16_BYTES;
    } else {
      cm_wire_bulk_read(w, off, dst, p->count * sizeof(float));
      off += p->count * sizeof(float);
    }
  }
}

/* Checks a pull answer and copies its values into the variables. */
static void on_pulled(struct cm_unary *u, void *ctx) {
  struct psc__client *c = ctx;
  const struct psc__msg *m = u->user;
  struct cm_wire_msg w;
  Psd__V1__PullResponse *pr = NULL;
  int asked_shm = c->shm && c->shm[m->shard].using;
  if (u->status != GRPC_STATUS_OK)
    return;
  if (cm_wire_parse(&w, u->response) ||
      !(pr = psd__v1__pull_response__unpack(NULL, w.head_len, w.head))) {
    u->status = GRPC_STATUS_INTERNAL;
    snprintf(u->details, sizeof u->details, "malformed pull answer");
  } else if (pr->rolled_back) {
    /* No data: the job rolled back; the caller pulls that step again. */
    psc__saw_rollback(c, pr->gen, pr->rollback_step);
  } else if (pr->in_shm && (!asked_shm || w.bulk_len)) {
    u->status = GRPC_STATUS_INTERNAL;
    snprintf(u->details, sizeof u->details,
             "pull answer says its values are in shared memory, but %s",
             asked_shm ? "it also holds bytes" : "none was named");
  } else if (!pr->in_shm && w.bulk_len != wire_bytes(c, m, 0)) {
    u->status = GRPC_STATUS_INTERNAL;
    snprintf(u->details, sizeof u->details,
             "pull answer holds %zu bytes; expected %llu (%s)", w.bulk_len,
             (unsigned long long)wire_bytes(c, m, 0),
             c->wire_bf16 ? "bf16" : "f32");
  } else {
    if (pr->step < c->pulled_step)
      c->pulled_step = pr->step;
    copy_pulled(c, m, &w, pr->in_shm);
    c->pulled += wire_bytes(c, m, 0);
  }
  if (pr)
    psd__v1__pull_response__free_unpacked(pr, NULL);
  cm_wire_msg_release(&w);
  cm_unary_release(u);
}

/* What one transfer moves. */
enum { XFER_PULL = 1, XFER_PUSH = 2 };
static const char PULL_METHOD[] = "/psd.v1.Data/Pull";
static const char PUSH_METHOD[] = "/psd.v1.Data/Push";

/* on_pulled for the pull calls of a transfer; a sync push's answer may say
 * the job rolled back (async push answers are not read). */
static void on_done(struct cm_unary *u, void *ctx) {
  struct psc__client *c = ctx;
  if (u->method == PULL_METHOD) {
    on_pulled(u, ctx);
  } else if (c->sync_push && u->status == GRPC_STATUS_OK) {
    Psd__V1__PushResponse *r = (Psd__V1__PushResponse *)cm_rpc_unpack(
        u->response, &psd__v1__push_response__descriptor);
    if (r && r->rolled_back)
      psc__saw_rollback(c, r->gen, r->rollback_step);
    if (r)
      psd__v1__push_response__free_unpacked(r, NULL);
  }
}

/* Copies the push's gradient into the arenas of the shards that use one
 * (shm_client.h), and, with job.nonfinite "reject", refuses a gradient
 * holding NaN or an infinity before any message leaves: each shard checks
 * only the messages it gets, so one shard would refuse its part while the
 * others applied theirs. The scan is fused into the arena's copy where
 * there is one (one pass), a scan of its own elsewhere. */
static int fill_and_check(struct psc__client *c) {
  int var;
  uint64_t k;
  psc__shm_fill(c, strcmp(c->spec->job.nonfinite, "reject") == 0, &var, &k);
  if (var < 0)
    return 0;
  const struct psc__var *v = &c->vars[var];
  psc__seterr(c,
              "push: gradient of '%s' element %llu is %s; nothing of this push "
              "was sent (job.nonfinite is \"reject\")",
              v->name, (unsigned long long)k,
              isnan(v->grad[k])   ? "NaN"
              : v->grad[k] > 0.0f ? "+Inf"
                                  : "-Inf");
  return CM_EINVAL;
}

/* Whether a failed call was refused for an arena the shard no longer
 * knows (it restarted, or dropped the hello's connection). */
static int arena_unknown(const struct cm_unary *u) {
  return u->status == GRPC_STATUS_FAILED_PRECONDITION &&
         strstr(u->details, "shared memory arena unknown");
}

/* Pushes, pulls, or both at once (each shard's push and pull in flight
 * together), every planned message in one cm_client_run; then only the
 * calls that failed retryably, again, until all are answered or a shard
 * stays unreachable past the retry budget. A push is one logical push
 * (one seq) however often its messages are sent. */
static int transfer(struct psc__client *c, int what) {
  const char *name = what == XFER_PUSH   ? "push"
                     : what == XFER_PULL ? "pull"
                                         : "push and pull";
  /* per shard, for any count a layout may reach, a re-plan's too */
  unsigned char down[CM_LAYOUT_MAX_SHARDS],
      shm_dead[CM_LAYOUT_MAX_SHARDS] = {0};
  int rc = 0, left = 0, rolled_before = c->rolled_back;
  struct psc__follow follow = {0};
  if (!c->vars) {
    psc__seterr(c, "%s: declare the variables first", name);
    return CM_EINVAL;
  }
  for (int i = 0; i < c->nvars; i++)
    if (((what & XFER_PULL) && psc__selected(c, i) && !c->vars[i].value) ||
        ((what & XFER_PUSH) && psc__pushed(c, i) && !c->vars[i].grad)) {
      psc__seterr(c, "%s: variable '%s' has no %s buffer", name,
                  c->vars[i].name,
                  (what & XFER_PULL) && psc__selected(c, i) && !c->vars[i].value
                      ? "value"
                      : "gradient");
      return CM_EINVAL;
    }
  select_msgs(c);
  psc__shm_begin(c);
  if ((what & XFER_PUSH) && (rc = fill_and_check(c)))
    goto out;
  if ((what & XFER_PUSH) && c->wire_bf16 && round_gradients(c)) {
    psc__seterr(c, "%s: out of memory", name);
    rc = CM_ENOMEM;
    goto out;
  }
  if (what & XFER_PUSH)
    c->seq++;
  c->chunk_next = (uint32_t)c->nmsgs; /* past this plan's chunk indexes */
  for (int i = 0; i < c->nmsgs; i++) {
    c->pending[2 * i] = c->msgs[i].push_bytes > 0 && (what & XFER_PUSH);
    c->pending[2 * i + 1] = c->msgs[i].sel_bytes > 0 && (what & XFER_PULL);
    left += c->pending[2 * i] + c->pending[2 * i + 1];
  }
  for (int attempt = 0; left > 0; attempt++) {
    int n = 0, fatal = 0, shm_again = 0, moved = 0;
    for (int p = 0; p < 2 * c->nmsgs; p++) {
      if (!c->pending[p])
        continue;
      const struct psc__msg *m = &c->msgs[p / 2];
      int push = p % 2 == 0;
      struct cm_unary *u = &c->calls[n];
      memset(u, 0, sizeof *u);
      u->channel = c->ch[m->shard];
      u->method = push ? PUSH_METHOD : PULL_METHOD;
      u->user = (void *)m;
      u->request = build_request(c, m, push);
      c->call_pair[n++] = p;
      if (!u->request) {
        psc__seterr(c, "%s: out of memory", name);
        for (int k = 0; k < n - 1; k++)
          cm_unary_release(&c->calls[k]);
        rc = CM_ENOMEM;
        goto out;
      }
    }
    if (attempt > 0)
      c->stats.retries += (uint64_t)n;
    rc = psc__run(c, c->calls, n, name, c->o.timeout_ms, 0,
                  (what & XFER_PULL) || c->sync_push ? on_done : NULL, c);
    memset(down, 0, (size_t)c->nshards);
    /* A shard with any call to retry is still out, whatever else it
     * answered. */
    for (int k = 0; k < n; k++)
      if (psc__retryable(c->calls[k].status))
        down[((const struct psc__msg *)c->calls[k].user)->shard] = 1;
    /* on_pulled may have turned an OK into a failure: statuses decide. */
    for (int k = 0; k < n; k++) {
      const struct cm_unary *u = &c->calls[k];
      const struct psc__msg *m = u->user;
      int p = c->call_pair[k], push = p % 2 == 0;
      c->stats.calls++;
      if (u->status != GRPC_STATUS_OK && c->shm && c->shm[m->shard].using) {
        /* Retired after this loop; the retry goes as bytes. An arena the
         * shard forgot is no failure of the call's own. */
        shm_dead[m->shard] = 1;
        if (arena_unknown(u)) {
          shm_again = 1;
          continue;
        }
      }
      if (u->status == GRPC_STATUS_OK) {
        if (push)
          c->pushed += wire_bytes(c, m, 1);
        if (!down[m->shard])
          psc__shard_up(c, m->shard);
      } else if (push && c->sync_push && u->status == GRPC_STATUS_ABORTED) {
        c->closed = 1; /* the step closed without us: not an error */
      } else if (psc__is_moved(u)) {
        /* No outage, no retry: the pair stays pending for the re-plan. */
        psc__note_moved(c, &moved, u->details);
        if (!down[m->shard])
          psc__shard_up(c, m->shard);
        continue;
      } else {
        c->stats.failed++;
        if (!psc__retryable(u->status)) {
          if (!fatal)
            psc__call_error(c, push ? "push" : "pull", u);
          fatal = 1;
          continue;
        }
        psc__shard_down(c, m->shard, u);
        continue;
      }
      c->pending[p] = 0;
      left--;
    }
    for (int s = 0; s < c->nshards; s++)
      if (shm_dead[s]) {
        psc__shm_retire(c, s);
        shm_dead[s] = 0;
      }
    /* A Unix socket never reconnects: the retry goes over TCP. */
    psc__back_to_tcp(c, c->calls, n);
    for (int k = 0; k < n; k++)
      cm_unary_release(&c->calls[k]);
    /* Sync: a shard answered that the job rolled back. The calls left to
     * send are of the old generation's step; resent, they would carry the
     * new generation with that step, which a shard refuses. The caller
     * goes back to the step rolled to (psc__client_rolled_back) instead. */
    if (c->rolled_back && !rolled_before) {
      rc = 0;
      break;
    }
    if (moved) {
      /* The layout moved: what is pending goes to the new shards (or,
       * the answer naming no newer layout, again after a short wait). A
       * failure beside it may be the move's too; if not, it comes again. */
      psc__shm_end(c);
      if ((rc = psc__follow_moved(c, &follow, name, 1)))
        break;
      select_msgs(c);
      left = 0;
      for (int p = 0; p < 2 * c->nmsgs; p++)
        left += c->pending[p];
      attempt = -1;
      continue;
    }
    if (fatal) {
      rc = CM_ERPC;
      break;
    }
    rc = 0;
    if (left > 0 && !shm_again &&
        (rc = psc__retry_wait(c, down, c->nshards, attempt + 1, name)))
      break;
  }
out:
  if (what & XFER_PUSH)
    wait_refs(c);
  psc__shm_end(c);
  psc__plan_restore(c); /* a remainder re-cut after a move is done */
  return rc;
}

int psc__client_pull(struct psc__client *c) { return transfer(c, XFER_PULL); }

int psc__client_push(struct psc__client *c) { return transfer(c, XFER_PUSH); }

int psc__client_push_pull(struct psc__client *c) {
  return transfer(c, XFER_PUSH | XFER_PULL);
}

int psc__client_pull_at(struct psc__client *c, uint64_t min_version,
                        uint64_t *version) {
  c->min_version = min_version;
  c->pulled_step = UINT64_MAX;
  int rc = transfer(c, XFER_PULL);
  c->min_version = 0;
  *version = c->pulled_step == UINT64_MAX ? 0 : c->pulled_step;
  return rc;
}

int psc__client_push_step(struct psc__client *c, uint64_t step, int *closed) {
  int rc = psc__need_joined(c, "push", step);
  if (rc)
    return rc;
  c->sync_push = 1;
  c->push_step = step;
  c->closed = 0;
  rc = transfer(c, XFER_PUSH);
  c->sync_push = 0;
  *closed = c->closed;
  return rc;
}
