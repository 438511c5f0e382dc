/* libpsclient's client object (psclient.h): psc__client_new opens a channel
 * to every shard; after declare the client plans its traffic once: per
 * shard, the declared variables' slices cut into segments and grouped into
 * messages of at most chunk_bytes. A pull or push then sends every planned
 * message, up to `inflight` per shard at once, all shards in parallel
 * (transfer.c). Pushes are sent from the caller's gradient memory without a
 * copy; pulled bytes are copied once, from the received slices into the
 * caller's value buffers.
 *
 * Channels: a shard on this host is dialled on its Unix socket once it has
 * answered a declare, and over TCP again once that socket fails (a Unix
 * socket connection never reconnects). Here too: the accessors, and the
 * helpers every call of the client goes through (client_internal.h). */
#include "client_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "endpoint.h"
#include "err.h"
#include "layout.h"
#include "log.h"
#include "rand.h"
#include "shape.h"
#include "shm_client.h"

#define DEFAULT_CHUNK (2u << 20)
#define MAX_CHUNK (32u << 20)
/* A shard's share below this travels in one message. Each message costs
 * a call's CPU on both ends; measured here (2 cores, loopback), splitting
 * the demo's ~400 KiB per shard into 2 messages cost 15% more CPU for the
 * whole job than 1, and a 1 MiB push and pull ran 25-40% faster as 1
 * message than as 4 (docs/wire.md, "Tensors and chunks"). */
#define MIN_SPLIT (1024u << 10)

void psc__seterr(struct psc__client *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->err, sizeof c->err, fmt, ap);
  va_end(ap);
}

int psc__need_joined(struct psc__client *c, const char *what, uint64_t step) {
  if (c->windex >= 0)
    return 0;
  psc__seterr(c,
              "%s for step %llu: this client has not joined the job's steps; "
              "join first",
              what, (unsigned long long)step);
  return CM_EINVAL;
}

const char *psc__client_error(const struct psc__client *c) { return c->err; }
uint64_t psc__client_bytes_pulled(const struct psc__client *c) {
  return c->pulled;
}
uint64_t psc__client_bytes_pushed(const struct psc__client *c) {
  return c->pushed;
}

uint64_t psc__client_id(const struct psc__client *c) { return c->client_id; }

void psc__client_stats(const struct psc__client *c,
                       struct psc__client_stats *out) {
  *out = c->stats;
}

void psc__client_set_examples(struct psc__client *c, uint32_t examples) {
  c->examples = examples;
}

int psc__client_new(struct psc__client **out, const struct cm_spec *spec,
                    const struct psc__client_opts *opts) {
  struct psc__client *c = calloc(1, sizeof *c);
  int rc = 0;
  if (!c)
    return CM_ENOMEM;
  cm_rpc_global_init(); /* reference-counted: balanced in psc__client_free */
  /* The channels take the job's message limit when made. */
  cm_rpc_set_max_message((long long)spec->job.max_message_mb << 20);
  c->spec = spec;
  c->wire_bf16 = strcmp(spec->job.wire_dtype, "bf16") == 0;
  c->windex = -1;
  if (opts)
    c->o = *opts;
  if (!c->o.timeout_ms)
    c->o.timeout_ms = spec->job.timeout_ms > 0 ? spec->job.timeout_ms : 30000;
  if (!c->o.connect_timeout_ms)
    c->o.connect_timeout_ms = 60000;
  if (!c->o.chunk_bytes)
    c->o.chunk_bytes = DEFAULT_CHUNK;
  if (c->o.chunk_bytes > MAX_CHUNK)
    c->o.chunk_bytes = MAX_CHUNK;
  c->o.chunk_bytes &= ~(size_t)3;
  if (c->o.chunk_bytes < 4)
    c->o.chunk_bytes = 4;
  if (!c->o.inflight)
    c->o.inflight = 4;
  if (!c->o.seed)
    c->o.seed = spec->job.seed;
  if (c->o.retry_s == 0)
    c->o.retry_s = spec->job.retry_s;
  c->retry_ms = c->o.retry_s > 0 ? c->o.retry_s * 1000 : 0;
  c->spec_fp = c->o.no_spec_check ? 0 : cm_spec_fingerprint(spec);
  /* Never 0, which means "no identity" to a shard. */
  c->client_id = cm_random_id(c);
  c->rng = c->client_id;
  snprintf(c->worker, sizeof c->worker, "%s",
           c->o.worker ? c->o.worker : "client");
  c->o.worker = c->worker;
  pthread_mutex_init(&c->lock, NULL);
  pthread_cond_init(&c->cond, NULL);
  /* The layout a new job starts with; a "moved" answer says another
   * (relayout.c). Every per-shard array is sized for the pool of addresses,
   * so that a re-plan to any count needs no new channels. */
  c->nshards = spec->job.shards > 0 && spec->job.shards <= spec->nps
                   ? spec->job.shards
                   : spec->nps;
  cm_layout_map_init(&c->map, CM_LAYOUT_RULE_BUCKETS, c->nshards);
  c->moved_wait_ms = PSC__MOVED_WAIT_MS;
  c->cq = grpc_completion_queue_create_for_next(NULL);
  if ((rc = cm_creds_load(&spec->auth, 0, &c->creds, c->err, sizeof c->err))) {
    /* The caller gets no client to ask, so say it here. */
    cm_error("%s", c->err);
    goto out;
  }
  if (!(c->ch = calloc(spec->nps, sizeof *c->ch)) ||
      !(c->on_unix = calloc(spec->nps, 1)) ||
      !(c->out = calloc(spec->nps, sizeof *c->out)) ||
      !(c->boot = calloc(spec->nps, sizeof *c->boot))) {
    rc = CM_ENOMEM;
    goto out;
  }
  for (int s = 0; s < spec->nps; s++)
    if ((rc = cm_channel_new(&c->ch[s], spec->ps[s].text, &c->creds)))
      goto out;
out:
  if (rc) {
    psc__client_free(c);
    c = NULL;
  }
  *out = c;
  return rc;
}

void psc__client_free(struct psc__client *c) {
  if (!c)
    return;
  if (c->hb_running) {
    pthread_mutex_lock(&c->lock);
    c->hb_stop = 1;
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->lock);
    pthread_join(c->hb_thread, NULL);
  }
  psc__shm_free(c);
  psc__plan_save_free(&c->full);
  for (int s = 0; c->ch && s < c->spec->nps; s++)
    cm_channel_free(c->ch[s]);
  free(c->ch);
  free(c->on_unix);
  free(c->out);
  free(c->boot);
  cm_creds_free(&c->creds);
  free(c->pieces);
  free(c->msgs);
  free(c->calls);
  free(c->call_pair);
  free(c->pending);
  free(c->grad16);
  free(c->grad16_at);
  free(c->tables);
  for (int i = 0; i < c->nvars; i++)
    free(c->var_names[i]);
  free(c->var_names);
  free(c->vars);
  free(c->sel);
  free(c->sel_push);
  cm_queue_free(c->cq);
  pthread_mutex_destroy(&c->lock);
  pthread_cond_destroy(&c->cond);
  free(c);
  cm_rpc_global_shutdown();
}

uint64_t psc__numel(const struct psc__var *v) {
  return cm_numel(v->ndim, v->shape, UINT64_MAX, NULL);
}

/* The identity every request carries (client_internal.h). */
Psd__V1__Caller psc__caller(const struct psc__client *c, int shard) {
  Psd__V1__Caller caller = PSD__V1__CALLER__INIT;
  caller.job = (char *)c->spec->job.name;
  caller.worker = (char *)c->worker;
  caller.spec_fp = c->spec_fp;
  caller.spec_ps = c->spec->nps;
  caller.spec_workers = c->spec->nworker;
  caller.boot = shard >= 0 && shard < c->spec->nps ? c->boot[shard] : 0;
  /* The layout planned for: a shard of another answers "moved". */
  caller.layout = c->layout;
  caller.shards = c->nshards;
  caller.rows = c->map.rule;
  caller.move_to = (uint32_t)c->move_to;
  caller.moved = (uint32_t)c->moves;
  return caller;
}

/* Describes call u's failure into c->err: the shard answered (its status
 * and message), or was not reached (the cause in words first). */
void psc__call_error(struct psc__client *c, const char *what,
                     const struct cm_unary *u) {
  char cause[512];
  int s = 0;
  for (; s < c->spec->nps - 1; s++)
    if (c->ch[s] == u->channel)
      break;
  if (psc__reach_cause(
          u->status, u->details, cm_channel_connected(u->channel),
          (u->timeout_ms > 0 ? u->timeout_ms : c->call_timeout_ms) / 1000.0,
          cause, sizeof cause))
    psc__seterr(c, "%s to ps:%d (%s) failed: %s [%s: %s]", what, s,
                cm_channel_target(u->channel), cause,
                cm_rpc_status_name(u->status),
                u->details[0] ? u->details : "no message");
  else
    psc__seterr(c, "%s to ps:%d (%s) failed: %s: %s", what, s,
                cm_channel_target(u->channel), cm_rpc_status_name(u->status),
                u->details[0] ? u->details : "(no message)");
}

/* Runs calls; on failure names the first failed call. */
/* cm_run_opts.interrupted: the caller's poll, remembered. */
static int run_interrupted(void *ctx) {
  struct psc__client *c = ctx;
  if (!c->interrupted && c->interrupt(c->interrupt_arg))
    c->interrupted = 1;
  return c->interrupted;
}

int psc__check_interrupt(struct psc__client *c) {
  if (!c->interrupted && (!c->interrupt || !c->interrupt(c->interrupt_arg)))
    return 0;
  c->interrupted = 1;
  psc__seterr(c, "interrupted: the calls in flight were cancelled");
  return CM_ECANCELED;
}

void psc__client_set_interrupt(struct psc__client *c,
                               int (*interrupted)(void *), void *arg) {
  c->interrupt = interrupted;
  c->interrupt_arg = arg;
  c->interrupted = 0;
  c->err[0] = 0;
  c->last_status = GRPC_STATUS_OK;
  c->last_details[0] = 0;
}

int psc__client_nvars(const struct psc__client *c) { return c->nvars; }

const struct psc__var *psc__client_var(const struct psc__client *c, int i) {
  return i >= 0 && i < c->nvars ? &c->vars[i] : NULL;
}

int psc__client_find(const struct psc__client *c, const char *name) {
  for (int i = 0; i < c->nvars; i++)
    if (strcmp(c->vars[i].name, name) == 0)
      return i;
  return CM_ENOENT;
}

int psc__client_bind(struct psc__client *c, int i, float *value,
                     const float *grad) {
  if (i < 0 || i >= c->nvars)
    return CM_ENOENT;
  if (value)
    c->vars[i].value = value;
  if (grad)
    c->vars[i].grad = grad;
  return 0;
}

int psc__client_select(struct psc__client *c, const int *idx, int n) {
  if (n < 0) {
    free(c->sel);
    c->sel = NULL;
    c->nsel = c->nvars;
    return 0;
  }
  if (!c->sel && !(c->sel = calloc((size_t)(c->cap_vars ? c->cap_vars : 1), 1)))
    return CM_ENOMEM;
  memset(c->sel, 0, (size_t)c->nvars);
  c->nsel = 0;
  for (int k = 0; k < n; k++) {
    if (idx[k] < 0 || idx[k] >= c->nvars)
      return CM_ENOENT;
    c->nsel += !c->sel[idx[k]];
    c->sel[idx[k]] = 1;
  }
  return 0;
}

int psc__client_select_push(struct psc__client *c, const int *idx, int n) {
  if (n < 0) {
    free(c->sel_push);
    c->sel_push = NULL;
    return 0;
  }
  if (!c->sel_push &&
      !(c->sel_push = calloc((size_t)(c->cap_vars ? c->cap_vars : 1), 1)))
    return CM_ENOMEM;
  memset(c->sel_push, 0, (size_t)c->nvars);
  for (int k = 0; k < n; k++) {
    if (idx[k] < 0 || idx[k] >= c->nvars)
      return CM_ENOENT;
    c->sel_push[idx[k]] = 1;
  }
  return 0;
}

int psc__run(struct psc__client *c, struct cm_unary *calls, int n,
             const char *what, int timeout_ms, int wait_for_ready,
             cm_unary_done done, void *ctx) {
  struct cm_run_opts o = {.interrupted = c->interrupt ? run_interrupted : NULL,
                          .interrupt_ctx = c,
                          .timeout_ms = timeout_ms,
                          .inflight = c->o.inflight,
                          .wait_for_ready = wait_for_ready,
                          .done = done,
                          .ctx = ctx,
                          .cq = c->cq,
                          .tick_ms = 1000,
                          .tick = psc__say_waiting,
                          .tick_ctx = c};
  c->call_timeout_ms = timeout_ms;
  int rc = cm_client_run(calls, n, &o);
  /* After the done callbacks, which may have found an answer unusable. */
  c->last_status = GRPC_STATUS_OK;
  c->last_details[0] = 0;
  for (int i = 0; i < n; i++)
    if (calls[i].status != GRPC_STATUS_OK) {
      c->last_status = calls[i].status;
      snprintf(c->last_details, sizeof c->last_details, "%s", calls[i].details);
      break;
    }
  if (rc) {
    for (int i = 0; i < n; i++)
      if (calls[i].status != GRPC_STATUS_OK) {
        psc__call_error(c, what, &calls[i]);
        break;
      }
  }
  return rc;
}

/* Cuts every variable's slice on every shard into messages. */
int psc__plan(struct psc__client *c) {
  int cap_p = 16, cap_m = 16;
  free(c->pieces);
  free(c->msgs);
  free(c->calls);
  free(c->call_pair);
  free(c->pending);
  c->calls = NULL;
  c->call_pair = NULL;
  c->pending = NULL;
  c->npieces = c->nmsgs = 0;
  c->pieces = malloc(cap_p * sizeof *c->pieces);
  c->msgs = malloc(cap_m * sizeof *c->msgs);
  if (!c->pieces || !c->msgs)
    return CM_ENOMEM;
  for (int s = 0; s < c->nshards; s++) {
    struct psc__msg *cur = NULL;
    uint64_t total = 0, chunk;
    uint32_t nshard = 0; /* messages to shard s so far */
    for (int i = 0; i < c->nvars; i++) {
      int64_t rb, re;
      cm_layout_rows(c->vars[i].shape[0], c->vars[i].placement, c->nshards, s,
                     &rb, &re);
      total += (uint64_t)(re - rb) *
               (psc__numel(&c->vars[i]) / (uint64_t)c->vars[i].shape[0]);
    }
    /* At least `inflight` messages once a shard's share is worth it, so
     * a transfer of a few MiB is pipelined too; never above chunk_bytes. */
    chunk = (total + c->o.inflight - 1) / c->o.inflight;
    if (chunk < MIN_SPLIT / sizeof(float))
      chunk = MIN_SPLIT / sizeof(float);
    if (chunk > c->o.chunk_bytes / sizeof(float))
      chunk = c->o.chunk_bytes / sizeof(float);
    for (int i = 0; i < c->nvars; i++) {
      const struct psc__var *v = &c->vars[i];
      int64_t rb, re;
      uint64_t row = psc__numel(v) / (uint64_t)v->shape[0];
      cm_layout_rows(v->shape[0], v->placement, c->nshards, s, &rb, &re);
      uint64_t off = (uint64_t)rb * row, end = (uint64_t)re * row;
      while (off < end) {
        if (!cur || cur->bytes / sizeof(float) >= chunk) {
          if (c->nmsgs == cap_m) {
            struct psc__msg *m = realloc(c->msgs, (cap_m *= 2) * sizeof *m);
            if (!m)
              return CM_ENOMEM;
            c->msgs = m;
          }
          cur = &c->msgs[c->nmsgs++];
          *cur = (struct psc__msg){s, c->npieces, 0, 0, nshard == 0, nshard};
          cur->kinds = PSC__KIND_PUSH | PSC__KIND_PULL;
          nshard++;
        }
        uint64_t room = chunk - cur->bytes / sizeof(float);
        uint64_t k = end - off < room ? end - off : room;
        if (c->npieces == cap_p) {
          struct psc__piece *p = realloc(c->pieces, (cap_p *= 2) * sizeof *p);
          if (!p)
            return CM_ENOMEM;
          c->pieces = p;
        }
        c->pieces[c->npieces++] = (struct psc__piece){i, off, k};
        cur->npieces++;
        cur->bytes += k * sizeof(float);
        off += k;
      }
    }
  }
  c->calls = calloc(2 * c->nmsgs + 1, sizeof *c->calls);
  c->call_pair = calloc(2 * c->nmsgs + 1, sizeof *c->call_pair);
  c->pending = calloc(2 * c->nmsgs + 1, 1);
  return c->calls && c->call_pair && c->pending ? 0 : CM_ENOMEM;
}

/* Moves the channel of every shard on this host to the shard's Unix socket
 * (common/rpc/endpoint.h). Done once the shards answered a declare, so that a
 * shard that was still starting has created its socket by now. A shard
 * whose socket cannot be used stays on TCP; one that belongs to a user the
 * client does not trust is also reported. */
int psc__use_unix_sockets(struct psc__client *c) {
  char path[200], target[210], why[1024];
  for (int s = 0; s < c->nshards; s++) {
    struct cm_channel *ch;
    int fd, rc;
    if (c->on_unix[s])
      continue; /* moved by an earlier declare */
    /* gRPC runs no TLS over a socket handed to it: TLS jobs stay on TCP. */
    if (!cm_endpoint_unix_candidate(c->spec->job.name, &c->spec->ps[s],
                                    c->spec->job.unix_sockets && !c->creds.tls,
                                    path, sizeof path))
      continue;
    rc = cm_endpoint_unix_connect(path, c->spec->job.socket_owner, &fd, why,
                                  sizeof why);
    if (rc == CM_EEXIST)
      cm_warn("ps:%d (%s): not using its Unix socket: %s; using TCP", s,
              c->spec->ps[s].text, why);
    if (rc)
      continue;
    snprintf(target, sizeof target, "unix:%s", path);
    if (cm_channel_new_fd(&ch, target, fd, &c->creds)) {
      close(fd);
      return CM_ENOMEM;
    }
    cm_channel_free(c->ch[s]);
    c->ch[s] = ch;
    c->on_unix[s] = 1;
  }
  return 0;
}

/* A Unix socket connection never reconnects (cm_channel_new_fd): after a
 * call to shard s failed UNAVAILABLE on one, the shard is dialled over TCP
 * from now on, so that a retry can reach a restarted shard. */
void psc__back_to_tcp(struct psc__client *c, const struct cm_unary *calls,
                      int n) {
  for (int i = 0; i < n; i++) {
    int s = -1;
    for (int k = 0; k < c->spec->nps; k++)
      if (calls[i].channel == c->ch[k])
        s = k;
    if (s < 0 || !c->on_unix[s] || calls[i].status != GRPC_STATUS_UNAVAILABLE)
      continue;
    struct cm_channel *ch;
    if (cm_channel_new(&ch, c->spec->ps[s].text, &c->creds))
      continue;
    cm_channel_free(c->ch[s]);
    c->ch[s] = ch;
    c->on_unix[s] = 0;
  }
}

int psc__client_nshards(const struct psc__client *c) { return c->nshards; }

const char *psc__client_target(const struct psc__client *c, int shard) {
  return cm_channel_target(c->ch[shard]);
}
