/* libpsclient (psclient.h). After declare, the client plans its traffic
 * once: per shard, the declared variables' slices cut into segments and
 * grouped into messages of at most chunk_bytes. A pull or push then sends
 * every planned message, up to `inflight` per shard at once, all shards in
 * parallel. Pushes are sent from the caller's gradient memory without a
 * copy; pulled bytes are copied once, from the received slices into the
 * caller's value buffers.
 *
 * Faults: a call that fails UNAVAILABLE (a shard down or restarting) or
 * DEADLINE_EXCEEDED (a shard stopped, a network cut off) is sent again,
 * only that call, after an exponential backoff with jitter, until the
 * shard has been unreachable for the retry budget (job.retry_s). Every push
 * message carries (client id, seq, chunk), so a shard that had applied a
 * message whose answer was lost acknowledges the retry without applying it
 * again (ps-server/psd/dedup.h). */
#include "psclient.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "auth.h"
#include "clock.h"
#include "endpoint.h"
#include "err.h"
#include "finite.h"
#include "log.h"
#include "ps.pb-c.h"
#include "rand.h"
#include "rpc.h"
#include "shard.h"
#include "wire.h"

#define DEFAULT_CHUNK (2u << 20)
#define MAX_CHUNK (32u << 20)
/* A shard's share below this travels in one message. */
#define MIN_SPLIT (256u << 10)
/* Variables at least this large are split across shards under AUTO. */
#define AUTO_SPLIT_BYTES (256u << 10)
/* Retries wait BACKOFF_MS, doubling per attempt up to BACKOFF_MAX_MS, each
 * wait drawn uniformly from its upper half (jitter, so that the workers
 * of a job do not all come back at the same instant). */
#define BACKOFF_MS 100
#define BACKOFF_MAX_MS 2000

/* A run of one variable's elements inside one message. */
struct piece {
  int var;         /* index into vars */
  uint64_t offset; /* first element, global numbering */
  uint64_t count;  /* elements */
};

/* One planned message to one shard. */
struct msg {
  int shard;      /* destination */
  int first;      /* index of its first piece */
  int npieces;    /* pieces in it */
  uint64_t bytes; /* payload bytes */
  int lead;       /* 1: the first message to its shard (carries examples) */
  uint32_t chunk; /* its index among the messages to its shard (dedup) */
};

struct dw_client {
  const struct cm_spec *spec; /* borrowed */
  struct dw_client_opts o;    /* settings with defaults filled in */
  char worker[64];            /* caller identity */
  struct cm_channel **ch;     /* owned, one per shard */
  unsigned char *on_unix;     /* owned: 1 where ch[s] is a Unix socket */
  struct cm_creds creds;      /* owned: token and TLS from the spec's auth */
  int nshards;                /* entries in ch */
  struct dw_var *vars;        /* caller's array, from declare */
  int nvars;                  /* entries in vars */
  struct piece *pieces;       /* owned plan: all pieces, grouped by msg */
  int npieces;                /* entries in pieces */
  struct msg *msgs;           /* owned plan: the messages */
  int nmsgs;                  /* entries in msgs */
  struct cm_unary *calls; /* owned, 2 * nmsgs call slots reused per transfer */
  uint32_t examples;      /* examples reported with each push */
  int windex;             /* worker index after join, else -1 */
  uint64_t min_version;   /* pull: version to wait for (0: none) */
  uint64_t pulled_step;   /* pull: lowest step among the answers */
  int sync_push;          /* push: stage for push_step */
  uint64_t push_step;     /* push: the step staged for */
  int closed;             /* push: a shard said the step is closed */
  pthread_t hb_thread;    /* heartbeat thread, after join */
  int hb_running;         /* hb_thread must be joined */
  int hb_stop;            /* asks hb_thread to stop (under lock) */
  int hb_ms;              /* heartbeat period */
  grpc_completion_queue *cq; /* reused by every call from the client's thread */
  uint64_t pulled, pushed;   /* payload bytes moved */
  pthread_mutex_t lock;      /* guards refs, hb_stop and left */
  pthread_cond_t cond;       /* signalled when refs drops to 0 */
  int refs;                  /* gradient slices gRPC still holds */
  char err[1024];            /* last error */
  grpc_status_code last_status; /* dw_client_last_status: of the last run */
  char last_details[512];       /* its status message */

  /* Faults: retries and idempotent pushes. */
  int *call_pair;         /* owned, 2 * nmsgs: the pair each call carries,
                             2 * message + (0 push, 1 pull) */
  unsigned char *pending; /* owned, 2 * nmsgs: 1 while a pair awaits an OK */
  uint64_t client_id;     /* random, nonzero: names this client's pushes */
  uint64_t seq;           /* logical pushes so far; the current one's number */
  double retry_ms;        /* retry budget per outage, ms; <= 0: no retries */
  double *down_since;     /* owned, per shard: cm_mono_ms() when it became
                             unreachable, 0 while it answers */
  uint64_t rng;           /* jitter generator state */
  struct dw_client_stats stats; /* calls, failures, retries, outages */
  int left; /* dw_client_leave was called: no rejoining (under lock) */

  /* Sync rollbacks (the coordinator's generation). */
  uint64_t gen;           /* rollbacks this client knows of, sent with every
                             sync pull, push and Admit */
  int rolled_back;        /* an answer said the job rolled back (cleared by
                             dw_client_rolled_back) */
  uint64_t rollback_step; /* the step it rolled back to */
  int rejoined;           /* sync: an Admit said the coordinator restarted
                             and this client joined it again (cleared by
                             dw_client_rejoined) */
  uint64_t rejoin_step;   /* the step that Join answered */
};

static void seterr(struct dw_client *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void seterr(struct dw_client *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->err, sizeof c->err, fmt, ap);
  va_end(ap);
}

const char *dw_client_error(const struct dw_client *c) { return c->err; }
uint64_t dw_client_bytes_pulled(const struct dw_client *c) { return c->pulled; }
uint64_t dw_client_bytes_pushed(const struct dw_client *c) { return c->pushed; }

uint64_t dw_client_id(const struct dw_client *c) { return c->client_id; }

void dw_client_stats(const struct dw_client *c, struct dw_client_stats *out) {
  *out = c->stats;
}

/* A random id for this client's pushes: the kernel's random bytes, or the
 * time, the process and the client's address mixed when those fail. Never 0,
 * which means "no identity" to a shard. */
static uint64_t new_client_id(const struct dw_client *c) {
  uint64_t id = 0;
  if (getrandom(&id, sizeof id, GRND_NONBLOCK) != (ssize_t)sizeof id) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t st = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    st ^= (uint64_t)getpid() << 32 ^ (uint64_t)(uintptr_t)c;
    id = cm_splitmix64(&st);
  }
  return id ? id : 1;
}

void dw_client_set_examples(struct dw_client *c, uint32_t examples) {
  c->examples = examples;
}

int dw_client_new(struct dw_client **out, const struct cm_spec *spec,
                  const struct dw_client_opts *opts) {
  struct dw_client *c = calloc(1, sizeof *c);
  int rc = 0;
  if (!c)
    return CM_ENOMEM;
  cm_rpc_global_init(); /* reference-counted: balanced in dw_client_free */
  /* The channels take the job's message limit when made. */
  cm_rpc_set_max_message((long long)spec->job.max_message_mb << 20);
  c->spec = spec;
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
  c->client_id = new_client_id(c);
  c->rng = c->client_id;
  snprintf(c->worker, sizeof c->worker, "%s",
           c->o.worker ? c->o.worker : "client");
  c->o.worker = c->worker;
  pthread_mutex_init(&c->lock, NULL);
  pthread_cond_init(&c->cond, NULL);
  c->nshards = spec->nps;
  c->cq = grpc_completion_queue_create_for_next(NULL);
  if ((rc = cm_creds_load(&spec->auth, 0, &c->creds, c->err, sizeof c->err))) {
    /* The caller gets no client to ask, so say it here. */
    cm_error("%s", c->err);
    goto out;
  }
  if (!(c->ch = calloc(c->nshards, sizeof *c->ch)) ||
      !(c->on_unix = calloc(c->nshards, 1)) ||
      !(c->down_since = calloc(c->nshards, sizeof *c->down_since))) {
    rc = CM_ENOMEM;
    goto out;
  }
  for (int s = 0; s < c->nshards; s++)
    if ((rc = cm_channel_new(&c->ch[s], spec->ps[s].text, &c->creds)))
      goto out;
out:
  if (rc) {
    dw_client_free(c);
    c = NULL;
  }
  *out = c;
  return rc;
}

void dw_client_free(struct dw_client *c) {
  if (!c)
    return;
  if (c->hb_running) {
    pthread_mutex_lock(&c->lock);
    c->hb_stop = 1;
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->lock);
    pthread_join(c->hb_thread, NULL);
  }
  for (int s = 0; c->ch && s < c->nshards; s++)
    cm_channel_free(c->ch[s]);
  free(c->ch);
  free(c->on_unix);
  free(c->down_since);
  cm_creds_free(&c->creds);
  free(c->pieces);
  free(c->msgs);
  free(c->calls);
  free(c->call_pair);
  free(c->pending);
  cm_queue_free(c->cq);
  pthread_mutex_destroy(&c->lock);
  pthread_cond_destroy(&c->cond);
  free(c);
  cm_rpc_global_shutdown();
}

static uint64_t numel(const struct dw_var *v) {
  uint64_t n = 1;
  for (int d = 0; d < v->ndim; d++)
    n *= (uint64_t)v->shape[d];
  return n;
}

/* The identity every request carries: the job and this worker. Points into
 * c, so it lives as long as the client. */
static Psd__V1__Caller caller_of(const struct dw_client *c) {
  Psd__V1__Caller caller = PSD__V1__CALLER__INIT;
  caller.job = (char *)c->spec->job.name;
  caller.worker = (char *)c->worker;
  return caller;
}

/* Describes call u's failure into c->err. */
static void call_error(struct dw_client *c, const char *what,
                       const struct cm_unary *u) {
  int s = 0;
  for (; s < c->nshards; s++)
    if (c->ch[s] == u->channel)
      break;
  seterr(c, "%s to ps:%d (%s) failed: %s: %s", what, s,
         cm_channel_target(u->channel), cm_rpc_status_name(u->status),
         u->details[0] ? u->details : "(no message)");
}

/* Runs calls; on failure names the first failed call. */
static int run(struct dw_client *c, struct cm_unary *calls, int n,
               const char *what, int timeout_ms, int wait_for_ready,
               cm_unary_done done, void *ctx) {
  struct cm_run_opts o = {.timeout_ms = timeout_ms,
                          .inflight = c->o.inflight,
                          .wait_for_ready = wait_for_ready,
                          .done = done,
                          .ctx = ctx,
                          .cq = c->cq};
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
        call_error(c, what, &calls[i]);
        break;
      }
  }
  return rc;
}

/* Cuts every variable's slice on every shard into messages. */
static int plan(struct dw_client *c) {
  int cap_p = 16, cap_m = 16;
  c->pieces = malloc(cap_p * sizeof *c->pieces);
  c->msgs = malloc(cap_m * sizeof *c->msgs);
  if (!c->pieces || !c->msgs)
    return CM_ENOMEM;
  for (int s = 0; s < c->nshards; s++) {
    struct msg *cur = NULL;
    uint64_t total = 0, chunk;
    uint32_t nshard = 0; /* messages to shard s so far */
    for (int i = 0; i < c->nvars; i++) {
      int64_t rb, re;
      cm_shard_rows(c->vars[i].shape[0], c->vars[i].placement, c->nshards, s,
                    &rb, &re);
      total += (uint64_t)(re - rb) *
               (numel(&c->vars[i]) / (uint64_t)c->vars[i].shape[0]);
    }
    /* At least `inflight` messages once a shard's share is worth it, so
     * a transfer of a few MiB is pipelined too; never above chunk_bytes. */
    chunk = (total + c->o.inflight - 1) / c->o.inflight;
    if (chunk < MIN_SPLIT / sizeof(float))
      chunk = MIN_SPLIT / sizeof(float);
    if (chunk > c->o.chunk_bytes / sizeof(float))
      chunk = c->o.chunk_bytes / sizeof(float);
    for (int i = 0; i < c->nvars; i++) {
      const struct dw_var *v = &c->vars[i];
      int64_t rb, re;
      uint64_t row = numel(v) / (uint64_t)v->shape[0];
      cm_shard_rows(v->shape[0], v->placement, c->nshards, s, &rb, &re);
      uint64_t off = (uint64_t)rb * row, end = (uint64_t)re * row;
      while (off < end) {
        if (!cur || cur->bytes / sizeof(float) >= chunk) {
          if (c->nmsgs == cap_m) {
            struct msg *m = realloc(c->msgs, (cap_m *= 2) * sizeof *m);
            if (!m)
              return CM_ENOMEM;
            c->msgs = m;
          }
          cur = &c->msgs[c->nmsgs++];
          *cur = (struct msg){s, c->npieces, 0, 0, nshard == 0, nshard};
          nshard++;
        }
        uint64_t room = chunk - cur->bytes / sizeof(float);
        uint64_t k = end - off < room ? end - off : room;
        if (c->npieces == cap_p) {
          struct piece *p = realloc(c->pieces, (cap_p *= 2) * sizeof *p);
          if (!p)
            return CM_ENOMEM;
          c->pieces = p;
        }
        c->pieces[c->npieces++] = (struct piece){i, off, k};
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
 * whose socket cannot be used stays on TCP. */
static int use_unix_sockets(struct dw_client *c) {
  char path[200], target[210];
  for (int s = 0; s < c->nshards; s++) {
    struct cm_channel *ch;
    int fd;
    /* gRPC runs no TLS over a socket handed to it: TLS jobs stay on TCP. */
    if (!cm_endpoint_unix_candidate(c->spec->job.name, &c->spec->ps[s],
                                    c->spec->job.unix_sockets && !c->creds.tls,
                                    path, sizeof path) ||
        cm_endpoint_unix_connect(path, &fd))
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
static void back_to_tcp(struct dw_client *c, const struct cm_unary *calls,
                        int n) {
  for (int i = 0; i < n; i++) {
    int s = -1;
    for (int k = 0; k < c->nshards; k++)
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

const char *dw_client_target(const struct dw_client *c, int shard) {
  return cm_channel_target(c->ch[shard]);
}

int dw_client_declare(struct dw_client *c, struct dw_var *vars, int n) {
  Psd__V1__Caller caller = caller_of(c);
  Psd__V1__DeclareRequest req = PSD__V1__DECLARE_REQUEST__INIT;
  Psd__V1__VarSpec *specs = NULL, **ptrs = NULL;
  struct cm_unary *calls = NULL;
  uint64_t *bytes = NULL;
  int *place = NULL, rc = 0;

  if (c->vars) {
    seterr(c, "declare: this client already declared its variables");
    return CM_EINVAL;
  }
  specs = calloc(n + 1, sizeof *specs);
  ptrs = calloc(n + 1, sizeof *ptrs);
  calls = calloc(c->nshards, sizeof *calls);
  bytes = calloc(n + 1, sizeof *bytes);
  place = calloc(n + 1, sizeof *place);
  if (!specs || !ptrs || !calls || !bytes || !place) {
    rc = CM_ENOMEM;
    goto out;
  }
  for (int i = 0; i < n; i++) {
    if (vars[i].ndim < 1 || vars[i].ndim > DW_VAR_MAX_DIMS) {
      seterr(c, "declare: variable '%s' has %d dimensions; expected 1..%d",
             vars[i].name, vars[i].ndim, DW_VAR_MAX_DIMS);
      rc = CM_EINVAL;
      goto out;
    }
    for (int d = 0; d < vars[i].ndim; d++)
      if (vars[i].shape[d] <= 0) {
        seterr(c, "declare: variable '%s' dimension %d is %lld; expected > 0",
               vars[i].name, d, (long long)vars[i].shape[d]);
        rc = CM_EINVAL;
        goto out;
      }
    bytes[i] = numel(&vars[i]) * sizeof(float);
  }
  cm_shard_auto(bytes, n, c->nshards, AUTO_SPLIT_BYTES, place);
  for (int i = 0; i < n; i++) {
    if (vars[i].placement == DW_PLACE_AUTO)
      vars[i].placement = place[i];
    psd__v1__var_spec__init(&specs[i]);
    specs[i].name = (char *)vars[i].name;
    specs[i].n_shape = vars[i].ndim;
    specs[i].shape = vars[i].shape;
    specs[i].placement = vars[i].placement;
    specs[i].init = vars[i].init == DW_INIT_UNIFORM
                        ? PSD__V1__INIT__INIT_UNIFORM
                        : PSD__V1__INIT__INIT_ZEROS;
    specs[i].init_scale = vars[i].init_scale;
    specs[i].seed = c->o.seed;
    ptrs[i] = &specs[i];
  }
  req.caller = &caller;
  req.n_vars = n;
  req.vars = ptrs;
  for (int s = 0; s < c->nshards; s++) {
    calls[s].channel = c->ch[s];
    calls[s].method = "/psd.v1.Data/Declare";
    calls[s].request = cm_rpc_pack(&req.base);
  }
  /* Shards may still be starting: wait for them, within the deadline. */
  rc = run(c, calls, c->nshards, "declare", c->o.connect_timeout_ms, 1, NULL,
           NULL);
  if (rc)
    goto out;
  c->vars = vars;
  c->nvars = n;
  rc = plan(c);
  if (!rc)
    rc = use_unix_sockets(c);
out:
  for (int s = 0; calls && s < c->nshards; s++)
    cm_unary_release(&calls[s]);
  free(calls);
  free(specs);
  free(ptrs);
  free(bytes);
  free(place);
  if (rc && !c->err[0])
    seterr(c, "declare: %s", cm_strerror(rc));
  return rc;
}

/* gRPC is done with one gradient slice (psclient.h: the caller's gradient
 * must not change while gRPC may still read it). */
static void release_ref(void *arg) {
  struct dw_client *c = arg;
  pthread_mutex_lock(&c->lock);
  if (--c->refs == 0)
    pthread_cond_broadcast(&c->cond);
  pthread_mutex_unlock(&c->lock);
}

/* Waits until gRPC has let go of every gradient slice; it does so as each
 * call completes, so this wait is short or nothing. */
static void wait_refs(struct dw_client *c) {
  struct timespec until = cm_abstime_after_ms(10000);
  pthread_mutex_lock(&c->lock);
  while (c->refs > 0)
    if (pthread_cond_timedwait(&c->cond, &c->lock, &until) == ETIMEDOUT)
      break;
  pthread_mutex_unlock(&c->lock);
}

/* Packs the caller and segments of message m as a Pull or Push head. */
static grpc_byte_buffer *build_request(struct dw_client *c, const struct msg *m,
                                       int push) {
  int first_of_shard = m->lead;
  Psd__V1__Caller caller = caller_of(c);
  Psd__V1__Segment segs[64], *sp[64], **ptrs = sp, *seg = segs;
  uint8_t stack[4096], *head = stack;
  grpc_byte_buffer *bb = NULL;
  struct cm_wire_piece wp[64], *pieces = wp;
  size_t len;

  if (m->npieces > 64) {
    seg = calloc(m->npieces, sizeof *seg);
    ptrs = calloc(m->npieces, sizeof *ptrs);
    pieces = calloc(m->npieces, sizeof *pieces);
    if (!seg || !ptrs || !pieces)
      goto out;
  }
  for (int i = 0; i < m->npieces; i++) {
    const struct piece *p = &c->pieces[m->first + i];
    const struct dw_var *v = &c->vars[p->var];
    psd__v1__segment__init(&seg[i]);
    seg[i].name = (char *)v->name;
    seg[i].offset = p->offset;
    seg[i].count = p->count;
    if (push) {
      seg[i].n_shape = v->ndim;
      seg[i].shape = (int64_t *)v->shape;
      pieces[i].ptr = (const uint8_t *)(v->grad + p->offset);
      pieces[i].len = p->count * sizeof(float);
    }
    ptrs[i] = &seg[i];
  }
  if (push) {
    Psd__V1__PushRequest req = PSD__V1__PUSH_REQUEST__INIT;
    req.caller = &caller;
    req.n_segments = m->npieces;
    req.segments = ptrs;
    req.examples = first_of_shard ? c->examples : 0;
    if (c->windex >= 0) {
      /* Every push of a joined worker names it; the shard's mode decides
       * whether it is staged (sync) or applied (async), never this. */
      req.worker = c->windex;
      req.has_worker = 1;
      req.first = first_of_shard;
    }
    if (c->sync_push) {
      req.step = c->push_step;
      req.gen = c->gen;
    }
    /* The same on every retry of this message: a shard applies it once. */
    req.client_id = c->client_id;
    req.seq = c->seq;
    req.chunk = m->chunk;
    len = psd__v1__push_request__get_packed_size(&req);
    if (len > sizeof stack && !(head = malloc(len)))
      goto out;
    psd__v1__push_request__pack(&req, head);
  } else {
    Psd__V1__PullRequest req = PSD__V1__PULL_REQUEST__INIT;
    req.caller = &caller;
    req.n_segments = m->npieces;
    req.segments = ptrs;
    req.min_version = c->min_version;
    req.gen = c->gen;
    len = psd__v1__pull_request__get_packed_size(&req);
    if (len > sizeof stack && !(head = malloc(len)))
      goto out;
    psd__v1__pull_request__pack(&req, head);
  }
  if (push) {
    pthread_mutex_lock(&c->lock);
    c->refs += m->npieces;
    pthread_mutex_unlock(&c->lock);
  }
  bb = push ? cm_wire_build(head, len, pieces, m->npieces, release_ref, c)
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

/* An answer said the job rolled back to `step`, generation gen: remembered
 * for dw_client_rolled_back (the newest generation wins). */
static void saw_rollback(struct dw_client *c, uint64_t gen, uint64_t step) {
  if (gen < c->gen)
    return;
  if (gen > c->gen || !c->rolled_back) {
    c->gen = gen;
    c->rolled_back = 1;
    c->rollback_step = step;
  }
}

/* Whether a parsed pull answer is a rolled-back one (it has no data). */
static int rolled_back_answer(const struct cm_wire_msg *w) {
  Psd__V1__PullResponse *pr =
      psd__v1__pull_response__unpack(NULL, w->head_len, w->head);
  int rb = pr && pr->rolled_back;
  if (pr)
    psd__v1__pull_response__free_unpacked(pr, NULL);
  return rb;
}

/* Checks a pull answer and copies its bytes into the variables. */
static void on_pulled(struct cm_unary *u, void *ctx) {
  struct dw_client *c = ctx;
  const struct msg *m = u->user;
  struct cm_wire_msg w;
  if (u->status != GRPC_STATUS_OK)
    return;
  if (cm_wire_parse(&w, u->response)) {
    u->status = GRPC_STATUS_INTERNAL;
    snprintf(u->details, sizeof u->details, "malformed pull answer");
    cm_unary_release(u);
    return;
  }
  if (w.bulk_len != m->bytes && !rolled_back_answer(&w)) {
    u->status = GRPC_STATUS_INTERNAL;
    snprintf(u->details, sizeof u->details,
             "pull answer holds %zu bytes; expected %llu", w.bulk_len,
             (unsigned long long)m->bytes);
  } else {
    size_t off = 0;
    Psd__V1__PullResponse *pr =
        psd__v1__pull_response__unpack(NULL, w.head_len, w.head);
    if (pr && pr->rolled_back) {
      /* No data: the job rolled back; the caller pulls that step again. */
      saw_rollback(c, pr->gen, pr->rollback_step);
      psd__v1__pull_response__free_unpacked(pr, NULL);
      cm_wire_msg_release(&w);
      cm_unary_release(u);
      return;
    }
    if (pr) {
      if (pr->step < c->pulled_step)
        c->pulled_step = pr->step;
      psd__v1__pull_response__free_unpacked(pr, NULL);
    }
    for (int i = 0; i < m->npieces; i++) {
      const struct piece *p = &c->pieces[m->first + i];
      size_t len = p->count * sizeof(float);
      cm_wire_bulk_read(&w, off, c->vars[p->var].value + p->offset, len);
      off += len;
    }
    c->pulled += m->bytes;
  }
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
  struct dw_client *c = ctx;
  if (u->method == PULL_METHOD) {
    on_pulled(u, ctx);
  } else if (c->sync_push && u->status == GRPC_STATUS_OK) {
    uint8_t *data = NULL;
    size_t len = 0;
    Psd__V1__PushResponse *r = NULL;
    if (cm_rpc_readall(u->response, &data, &len) == 0 &&
        (r = psd__v1__push_response__unpack(NULL, len, data)) && r->rolled_back)
      saw_rollback(c, r->gen, r->rollback_step);
    if (r)
      psd__v1__push_response__free_unpacked(r, NULL);
    free(data);
  }
}

/* ---- retries (see the top of this file) */

/* Whether a call that ended with st may succeed when sent again: the shard
 * is down or restarting (UNAVAILABLE) or did not answer in time (stopped,
 * cut off, overloaded). Every other status is the shard's answer. */
static int retryable(grpc_status_code st) {
  return st == GRPC_STATUS_UNAVAILABLE || st == GRPC_STATUS_DEADLINE_EXCEEDED;
}

/* A call to shard s failed retryably: the outage starts now unless it is
 * already on, and is said once. */
static void shard_down(struct dw_client *c, int s, const struct cm_unary *u) {
  if (c->down_since[s] > 0)
    return;
  c->down_since[s] = cm_mono_ms();
  c->stats.outages++;
  if (c->retry_ms > 0)
    cm_warn("ps:%d (%s) unreachable (%s: %s), retrying for up to %.0f s", s,
            c->spec->ps[s].text, cm_rpc_status_name(u->status),
            u->details[0] ? u->details : "no message", c->retry_ms / 1000);
}

/* A call to shard s succeeded: an outage ends, and is said so. */
static void shard_up(struct dw_client *c, int s) {
  if (c->down_since[s] <= 0)
    return;
  if (c->retry_ms > 0)
    cm_info("ps:%d (%s) back after %.1f s", s, c->spec->ps[s].text,
            (cm_mono_ms() - c->down_since[s]) / 1000);
  c->down_since[s] = 0;
}

/* Before attempt number `attempt` (1, 2, ...) at the calls to the shards
 * flagged in down[0..ndown): 0 after the backoff wait when every such shard
 * is within the retry budget; else CM_ETIMEDOUT or CM_EUNAVAIL (st, the last
 * failure's status) with c->err naming the shard, what and how long. */
static int retry_wait(struct dw_client *c, const unsigned char *down, int ndown,
                      int attempt, const char *what, grpc_status_code st,
                      const char *details) {
  double now = cm_mono_ms();
  for (int s = 0; s < ndown; s++) {
    if (!down[s] || (c->retry_ms > 0 && now - c->down_since[s] < c->retry_ms))
      continue;
    if (c->retry_ms > 0)
      seterr(c,
             "%s to ps:%d (%s) failed: %s: %s; unreachable for %.1f s, the "
             "retry budget (job.retry_s %.0f s)",
             what, s, c->spec->ps[s].text, cm_rpc_status_name(st),
             details[0] ? details : "(no message)",
             (now - c->down_since[s]) / 1000, c->retry_ms / 1000);
    /* else run() described the failure already */
    return st == GRPC_STATUS_DEADLINE_EXCEEDED ? CM_ETIMEDOUT : CM_EUNAVAIL;
  }
  int shift = attempt - 1 < 5 ? attempt - 1 : 5;
  double ms = (double)BACKOFF_MS * (1 << shift);
  if (ms > BACKOFF_MAX_MS)
    ms = BACKOFF_MAX_MS;
  ms *=
      0.5 + 0.5 * (double)(cm_splitmix64(&c->rng) >> 11) / (double)(1ull << 53);
  struct timespec ts = {(time_t)(ms / 1000),
                        (long)((ms - 1000 * (time_t)(ms / 1000)) * 1e6)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
  return 0;
}

/* With job.nonfinite "reject", a gradient holding NaN or an infinity is
 * refused before any message leaves: each shard checks only the messages it
 * gets, so one shard would refuse its part while the others applied theirs.
 * The shards' own scan (finite.h), about a fifth of the time a push spends
 * copying the gradient into its messages. */
static int check_finite(struct dw_client *c) {
  if (strcmp(c->spec->job.nonfinite, "reject") != 0)
    return 0;
  for (int i = 0; i < c->nvars; i++) {
    const struct dw_var *v = &c->vars[i];
    uint64_t n = numel(v), k = cm_first_nonfinite(v->grad, n);
    if (k == n)
      continue;
    seterr(c,
           "push: gradient of '%s' element %llu is %s; nothing of this push "
           "was sent (job.nonfinite is \"reject\")",
           v->name, (unsigned long long)k,
           isnan(v->grad[k])   ? "NaN"
           : v->grad[k] > 0.0f ? "+Inf"
                               : "-Inf");
    return CM_EINVAL;
  }
  return 0;
}

/* Pushes, pulls, or both at once (each shard's push and pull in flight
 * together), every planned message in one cm_client_run; then only the
 * calls that failed retryably, again, until all are answered or a shard
 * stays unreachable past the retry budget. A push is one logical push
 * (one seq) however often its messages are sent. */
static int transfer(struct dw_client *c, int what) {
  const char *name = what == XFER_PUSH   ? "push"
                     : what == XFER_PULL ? "pull"
                                         : "push and pull";
  unsigned char down[256];
  int rc = 0, left = 0, rolled_before = c->rolled_back;
  if (!c->vars) {
    seterr(c, "%s: declare the variables first", name);
    return CM_EINVAL;
  }
  if (c->nshards > (int)sizeof down) {
    seterr(c, "%s: more than %zu shards", name, sizeof down);
    return CM_EINVAL;
  }
  if ((what & XFER_PUSH) && (rc = check_finite(c)))
    return rc;
  if (what & XFER_PUSH)
    c->seq++;
  for (int i = 0; i < c->nmsgs; i++) {
    c->pending[2 * i] = (what & XFER_PUSH) != 0;
    c->pending[2 * i + 1] = (what & XFER_PULL) != 0;
    left += c->pending[2 * i] + c->pending[2 * i + 1];
  }
  for (int attempt = 0; left > 0; attempt++) {
    grpc_status_code last = GRPC_STATUS_OK;
    char last_details[sizeof c->calls[0].details] = "";
    int n = 0, fatal = 0;
    for (int p = 0; p < 2 * c->nmsgs; p++) {
      if (!c->pending[p])
        continue;
      const struct msg *m = &c->msgs[p / 2];
      int push = p % 2 == 0;
      struct cm_unary *u = &c->calls[n];
      memset(u, 0, sizeof *u);
      u->channel = c->ch[m->shard];
      u->method = push ? PUSH_METHOD : PULL_METHOD;
      u->user = (void *)m;
      u->request = build_request(c, m, push);
      c->call_pair[n++] = p;
      if (!u->request) {
        seterr(c, "%s: out of memory", name);
        for (int k = 0; k < n - 1; k++)
          cm_unary_release(&c->calls[k]);
        rc = CM_ENOMEM;
        goto out;
      }
    }
    if (attempt > 0)
      c->stats.retries += (uint64_t)n;
    rc = run(c, c->calls, n, name, c->o.timeout_ms, 0,
             (what & XFER_PULL) || c->sync_push ? on_done : NULL, c);
    memset(down, 0, (size_t)c->nshards);
    /* A shard with any call to retry is still out, whatever else it
     * answered. */
    for (int k = 0; k < n; k++)
      if (retryable(c->calls[k].status))
        down[((const struct msg *)c->calls[k].user)->shard] = 1;
    /* on_pulled may have turned an OK into a failure: statuses decide. */
    for (int k = 0; k < n; k++) {
      const struct cm_unary *u = &c->calls[k];
      const struct msg *m = u->user;
      int p = c->call_pair[k], push = p % 2 == 0;
      c->stats.calls++;
      if (u->status == GRPC_STATUS_OK) {
        if (push)
          c->pushed += m->bytes;
        if (!down[m->shard])
          shard_up(c, m->shard);
      } else if (push && c->sync_push && u->status == GRPC_STATUS_ABORTED) {
        c->closed = 1; /* the step closed without us: not an error */
      } else {
        c->stats.failed++;
        if (!retryable(u->status)) {
          if (!fatal)
            call_error(c, push ? "push" : "pull", u);
          fatal = 1;
          continue;
        }
        shard_down(c, m->shard, u);
        last = u->status;
        snprintf(last_details, sizeof last_details, "%s", u->details);
        continue;
      }
      c->pending[p] = 0;
      left--;
    }
    /* A Unix socket never reconnects: the retry goes over TCP. */
    back_to_tcp(c, c->calls, n);
    for (int k = 0; k < n; k++)
      cm_unary_release(&c->calls[k]);
    /* Sync: a shard answered that the job rolled back. The calls left to
     * send are of the old generation's step; resent, they would carry the
     * new generation with that step, which a shard refuses. The caller
     * goes back to the step rolled to (dw_client_rolled_back) instead. */
    if (c->rolled_back && !rolled_before) {
      rc = 0;
      break;
    }
    if (fatal) {
      rc = CM_ERPC;
      break;
    }
    rc = 0;
    if (left > 0 && (rc = retry_wait(c, down, c->nshards, attempt + 1, name,
                                     last, last_details)))
      break;
  }
out:
  if (what & XFER_PUSH)
    wait_refs(c);
  return rc;
}

int dw_client_pull(struct dw_client *c) { return transfer(c, XFER_PULL); }

int dw_client_push(struct dw_client *c) { return transfer(c, XFER_PUSH); }

int dw_client_push_pull(struct dw_client *c) {
  return transfer(c, XFER_PUSH | XFER_PULL);
}

int dw_client_pull_at(struct dw_client *c, uint64_t min_version,
                      uint64_t *version) {
  c->min_version = min_version;
  c->pulled_step = UINT64_MAX;
  int rc = transfer(c, XFER_PULL);
  c->min_version = 0;
  *version = c->pulled_step == UINT64_MAX ? 0 : c->pulled_step;
  return rc;
}

int dw_client_push_step(struct dw_client *c, uint64_t step, int *closed) {
  if (c->windex < 0) {
    seterr(c, "push: join the job first (dw_client_join)");
    return CM_EINVAL;
  }
  c->sync_push = 1;
  c->push_step = step;
  c->closed = 0;
  int rc = transfer(c, XFER_PUSH);
  c->sync_push = 0;
  *closed = c->closed;
  return rc;
}

/* One message of a dw_client_read run. */
struct read_part {
  struct dw_read *r; /* the run it belongs to */
  uint64_t count;    /* elements in this message */
  float *dst;        /* where they go */
};

/* Checks one read answer and copies its bytes out. */
static void on_read(struct cm_unary *u, void *ctx) {
  const struct read_part *p = u->user;
  struct cm_wire_msg w;
  (void)ctx;
  if (u->status != GRPC_STATUS_OK)
    return;
  if (cm_wire_parse(&w, u->response) ||
      w.bulk_len != p->count * sizeof(float)) {
    u->status = GRPC_STATUS_INTERNAL;
    snprintf(u->details, sizeof u->details,
             "pull answer holds %zu bytes; expected %llu", w.bulk_len,
             (unsigned long long)(p->count * sizeof(float)));
  } else {
    cm_wire_bulk_read(&w, 0, p->dst, w.bulk_len);
  }
  cm_wire_msg_release(&w);
  cm_unary_release(u);
}

int dw_client_read(struct dw_client *c, struct dw_read *reads, int n) {
  Psd__V1__Caller caller = caller_of(c);
  uint64_t per = c->o.chunk_bytes / sizeof(float);
  struct cm_unary *calls = NULL;
  struct read_part *parts = NULL;
  int ncalls = 0, k = 0, rc = 0;

  for (int i = 0; i < n; i++) {
    reads[i].rc = 0;
    reads[i].err[0] = 0;
    if (reads[i].shard < 0 || reads[i].shard >= c->nshards) {
      seterr(c, "read '%s': no shard %d; the cluster has %d", reads[i].name,
             reads[i].shard, c->nshards);
      return CM_EINVAL;
    }
    ncalls += (int)((reads[i].count + per - 1) / per);
  }
  if (!(calls = calloc(ncalls + 1, sizeof *calls)) ||
      !(parts = calloc(ncalls + 1, sizeof *parts))) {
    seterr(c, "read: out of memory");
    rc = CM_ENOMEM;
    goto out;
  }
  for (int i = 0; i < n; i++) {
    for (uint64_t off = 0; off < reads[i].count; off += per, k++) {
      Psd__V1__PullRequest req = PSD__V1__PULL_REQUEST__INIT;
      Psd__V1__Segment seg = PSD__V1__SEGMENT__INIT, *sp = &seg;
      uint64_t left = reads[i].count - off;
      parts[k] = (struct read_part){&reads[i], left < per ? left : per,
                                    reads[i].dst + off};
      seg.name = (char *)reads[i].name;
      seg.offset = reads[i].offset + off;
      seg.count = parts[k].count;
      req.caller = &caller;
      req.n_segments = 1;
      req.segments = &sp;
      req.slots = reads[i].slots;
      req.slot = reads[i].slot;
      calls[k].channel = c->ch[reads[i].shard];
      calls[k].method = PULL_METHOD;
      calls[k].user = &parts[k];
      if (!(calls[k].request = cm_rpc_pack(&req.base))) {
        seterr(c, "read: out of memory");
        rc = CM_ENOMEM;
        goto out;
      }
    }
  }
  rc = run(c, calls, ncalls, "read", c->o.timeout_ms, 0, on_read, NULL);
  for (int i = 0; i < ncalls; i++) {
    struct dw_read *r = parts[i].r;
    if (calls[i].status == GRPC_STATUS_OK || r->rc)
      continue;
    r->rc = cm_rpc_status_rc(calls[i].status);
    snprintf(r->err, sizeof r->err,
             "read of '%s' from ps:%d (%s) failed: %s: %s", r->name, r->shard,
             cm_channel_target(calls[i].channel),
             cm_rpc_status_name(calls[i].status),
             calls[i].details[0] ? calls[i].details : "(no message)");
    if (!rc)
      rc = r->rc; /* on_read turned it into a failure after the run */
  }
out:
  for (int i = 0; calls && i < ncalls; i++)
    cm_unary_release(&calls[i]);
  free(calls);
  free(parts);
  return rc;
}

/* One call to the coordinator (shard 0), retried like a transfer's calls
 * while the coordinator is unreachable (it may be restarting); unpacks the
 * answer into *out (NULL to ignore it). */
static int coord_call(struct dw_client *c, const char *method,
                      const ProtobufCMessage *req, int timeout_ms,
                      const ProtobufCMessageDescriptor *desc,
                      ProtobufCMessage **out) {
  const char *what = method + sizeof "/psd.v1.Coord/" - 1;
  unsigned char down[1] = {1};
  struct cm_unary u;
  uint8_t *data = NULL;
  size_t len;
  int rc;
  memset(&u, 0, sizeof u);
  for (int attempt = 0;; attempt++) {
    u.channel = c->ch[0];
    u.method = method;
    u.request = cm_rpc_pack(req);
    if (attempt > 0)
      c->stats.retries++;
    rc = run(c, &u, 1, what, timeout_ms, 1, NULL, NULL);
    c->stats.calls++;
    if (!rc) {
      shard_up(c, 0);
      break;
    }
    c->stats.failed++;
    if (!retryable(u.status))
      break;
    shard_down(c, 0, &u);
    back_to_tcp(c, &u, 1);
    grpc_status_code st = u.status;
    char details[sizeof u.details];
    snprintf(details, sizeof details, "%s", u.details);
    cm_unary_release(&u);
    memset(&u, 0, sizeof u);
    if ((rc = retry_wait(c, down, 1, attempt + 1, what, st, details)))
      break;
  }
  if (!rc && out) {
    if (cm_rpc_readall(u.response, &data, &len) ||
        !(*out = protobuf_c_message_unpack(desc, NULL, len, data))) {
      seterr(c, "%s: malformed answer from ps:0", method);
      rc = CM_EPROTO;
    }
  }
  free(data);
  cm_unary_release(&u);
  return rc;
}

/* Joins again on the heartbeat thread's channel, when the coordinator said
 * it does not count this worker (it restarted, or declared it dead). */
static void rejoin(struct dw_client *c, struct cm_channel *ch) {
  Psd__V1__Caller caller = caller_of(c);
  Psd__V1__JoinRequest req = PSD__V1__JOIN_REQUEST__INIT;
  Psd__V1__JoinResponse *resp = NULL;
  struct cm_run_opts o = {.timeout_ms = c->o.timeout_ms, .inflight = 1};
  struct cm_unary u;
  uint8_t *data = NULL;
  size_t len = 0;
  req.caller = &caller;
  req.worker = c->windex;
  memset(&u, 0, sizeof u);
  u.channel = ch;
  u.method = "/psd.v1.Coord/Join";
  u.request = cm_rpc_pack(&req.base);
  cm_client_run(&u, 1, &o);
  if (u.status == GRPC_STATUS_OK && !cm_rpc_readall(u.response, &data, &len) &&
      (resp = psd__v1__join_response__unpack(NULL, len, data)))
    cm_info("worker:%d joined the job again at step %llu (the coordinator "
            "had restarted or declared it dead); %d workers live",
            c->windex, (unsigned long long)resp->step, resp->live);
  else
    cm_warn("worker:%d: joining again failed: %s: %s (the next heartbeat "
            "retries)",
            c->windex, cm_rpc_status_name(u.status), u.details);
  if (resp)
    psd__v1__join_response__free_unpacked(resp, NULL);
  free(data);
  cm_unary_release(&u);
}

/* Sends heartbeats until dw_client_free; a missed one is only logged by
 * the coordinator's silence timer, never fatal here. An answer that says
 * the coordinator does not count this worker makes it join again. */
static void *heartbeat_thread(void *arg) {
  struct dw_client *c = arg;
  struct cm_channel *ch = NULL;
  Psd__V1__Caller caller = caller_of(c);
  Psd__V1__HeartbeatRequest req = PSD__V1__HEARTBEAT_REQUEST__INIT;
  req.caller = &caller;
  req.worker = c->windex;
  if (cm_channel_new(&ch, c->spec->ps[0].text, &c->creds))
    return NULL;
  pthread_mutex_lock(&c->lock);
  while (!c->hb_stop) {
    pthread_mutex_unlock(&c->lock);
    struct cm_unary u;
    struct cm_run_opts o = {.timeout_ms = c->hb_ms * 2, .inflight = 1};
    Psd__V1__HeartbeatResponse *resp = NULL;
    uint8_t *data = NULL;
    size_t len = 0;
    memset(&u, 0, sizeof u);
    u.channel = ch;
    u.method = "/psd.v1.Coord/Heartbeat";
    u.request = cm_rpc_pack(&req.base);
    cm_client_run(&u, 1, &o);
    /* A sync worker joins a restarted coordinator from its training
     * thread, at its next Admit (dw_client_admit), to learn the step and
     * generation to go on from; joining here would count it in steps it
     * is not in yet. */
    if (u.status == GRPC_STATUS_OK &&
        !cm_rpc_readall(u.response, &data, &len) &&
        (resp = psd__v1__heartbeat_response__unpack(NULL, len, data)) &&
        resp->rejoin &&
        !(resp->restarted && !strcmp(c->spec->job.mode, "sync"))) {
      pthread_mutex_lock(&c->lock);
      int go = !c->left && !c->hb_stop;
      pthread_mutex_unlock(&c->lock);
      if (go)
        rejoin(c, ch);
    }
    if (resp)
      psd__v1__heartbeat_response__free_unpacked(resp, NULL);
    free(data);
    cm_unary_release(&u);
    struct timespec until = cm_abstime_after_ms(c->hb_ms);
    pthread_mutex_lock(&c->lock);
    while (!c->hb_stop &&
           pthread_cond_timedwait(&c->cond, &c->lock, &until) != ETIMEDOUT) {
    }
  }
  pthread_mutex_unlock(&c->lock);
  cm_channel_free(ch);
  return NULL;
}

int dw_client_join(struct dw_client *c, int worker, int heartbeat_ms,
                   uint64_t *step) {
  Psd__V1__Caller caller = caller_of(c);
  Psd__V1__JoinRequest req = PSD__V1__JOIN_REQUEST__INIT;
  Psd__V1__JoinResponse *resp = NULL;
  int rc;
  req.caller = &caller;
  req.worker = worker;
  rc = coord_call(c, "/psd.v1.Coord/Join", &req.base, c->o.connect_timeout_ms,
                  &psd__v1__join_response__descriptor,
                  (ProtobufCMessage **)&resp);
  if (rc)
    return rc;
  *step = resp->step;
  if (resp->gen > c->gen)
    c->gen = resp->gen;
  psd__v1__join_response__free_unpacked(resp, NULL);
  c->windex = worker;
  if (!c->hb_running && heartbeat_ms > 0) {
    c->hb_ms = heartbeat_ms;
    c->hb_stop = 0;
    if (pthread_create(&c->hb_thread, NULL, heartbeat_thread, c) == 0)
      c->hb_running = 1;
  }
  return 0;
}

int dw_client_leave(struct dw_client *c) {
  pthread_mutex_lock(&c->lock);
  c->left = 1; /* the heartbeat thread must not join again */
  pthread_mutex_unlock(&c->lock);
  Psd__V1__Caller caller = caller_of(c);
  Psd__V1__JoinRequest req = PSD__V1__JOIN_REQUEST__INIT;
  req.caller = &caller;
  req.worker = c->windex;
  req.leave = 1;
  return coord_call(c, "/psd.v1.Coord/Join", &req.base, c->o.timeout_ms, NULL,
                    NULL);
}

int dw_client_admit(struct dw_client *c, uint64_t step, int *admitted,
                    uint64_t *next_step) {
  Psd__V1__Caller caller = caller_of(c);
  Psd__V1__AdmitRequest req = PSD__V1__ADMIT_REQUEST__INIT;
  Psd__V1__AdmitResponse *resp = NULL;
  req.caller = &caller;
  req.worker = c->windex;
  req.step = step;
  req.gen = c->gen;
  int rc = coord_call(c, "/psd.v1.Coord/Admit", &req.base, c->o.timeout_ms,
                      &psd__v1__admit_response__descriptor,
                      (ProtobufCMessage **)&resp);
  if (rc)
    return rc;
  *admitted = resp->admitted;
  *next_step = resp->next_step;
  if (resp->rolled_back)
    saw_rollback(c, resp->gen, resp->next_step);
  if (resp->rejoin) {
    /* The coordinator restarted since this worker joined: join again and
     * go on from the step it opens, in its generation. */
    Psd__V1__JoinRequest jreq = PSD__V1__JOIN_REQUEST__INIT;
    Psd__V1__JoinResponse *j = NULL;
    *admitted = 0;
    jreq.caller = &caller;
    jreq.worker = c->windex;
    rc = coord_call(c, "/psd.v1.Coord/Join", &jreq.base, c->o.timeout_ms,
                    &psd__v1__join_response__descriptor,
                    (ProtobufCMessage **)&j);
    if (rc == 0) {
      if (j->gen > c->gen)
        c->gen = j->gen;
      c->rolled_back = 0; /* superseded by the step joined at */
      c->rejoined = 1;
      c->rejoin_step = j->step;
      *next_step = j->step;
      psd__v1__join_response__free_unpacked(j, NULL);
    }
  }
  psd__v1__admit_response__free_unpacked(resp, NULL);
  return rc;
}

int dw_client_rejoined(struct dw_client *c, uint64_t *step) {
  if (!c->rejoined)
    return 0;
  c->rejoined = 0;
  *step = c->rejoin_step;
  return 1;
}

int dw_client_rolled_back(struct dw_client *c, uint64_t *step) {
  if (!c->rolled_back)
    return 0;
  c->rolled_back = 0;
  *step = c->rollback_step;
  return 1;
}

uint64_t dw_client_gen(const struct dw_client *c) { return c->gen; }

int dw_client_clock(struct dw_client *c, uint64_t clock) {
  Psd__V1__Caller caller = caller_of(c);
  Psd__V1__ClockRequest req = PSD__V1__CLOCK_REQUEST__INIT;
  req.caller = &caller;
  req.worker = c->windex;
  req.clock = clock;
  return coord_call(c, "/psd.v1.Coord/Clock", &req.base, c->o.timeout_ms, NULL,
                    NULL);
}

/* {"name", "bounds", "counts", "sum", "count"}, as in the message. */
static json_t *hist_json(const Psd__V1__Histogram *h) {
  json_t *b = json_array(), *n = json_array();
  for (size_t i = 0; i < h->n_bounds; i++)
    json_array_append_new(b, json_real(h->bounds[i]));
  for (size_t i = 0; i < h->n_counts; i++)
    json_array_append_new(n, json_integer((json_int_t)h->counts[i]));
  return json_pack("{s:s, s:o, s:o, s:f, s:I}", "name", h->name, "bounds", b,
                   "counts", n, "sum", h->sum, "count", (json_int_t)h->count);
}

int dw_client_status(struct dw_client *c, int shard, char **json) {
  Psd__V1__Caller caller = caller_of(c);
  Psd__V1__StatusRequest req = PSD__V1__STATUS_REQUEST__INIT;
  Psd__V1__StatusResponse *resp = NULL;
  struct cm_unary u;
  uint8_t *data = NULL;
  size_t len;
  json_t *root = NULL, *vars;
  int rc;

  *json = NULL;
  if (shard < 0 || shard >= c->nshards) {
    seterr(c, "status: no shard %d; the cluster has %d", shard, c->nshards);
    return CM_EINVAL;
  }
  req.caller = &caller;
  memset(&u, 0, sizeof u);
  u.channel = c->ch[shard];
  u.method = "/psd.v1.Admin/Status";
  u.request = cm_rpc_pack(&req.base);
  if ((rc = run(c, &u, 1, "status", c->o.timeout_ms, 0, NULL, NULL)))
    goto out;
  if ((rc = cm_rpc_readall(u.response, &data, &len)))
    goto out;
  if (!(resp = psd__v1__status_response__unpack(NULL, len, data))) {
    seterr(c, "status from ps:%d: malformed answer", shard);
    rc = CM_EPROTO;
    goto out;
  }
  root = json_pack("{s:i, s:i, s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:f, "
                   "s:I}",
                   "shard", resp->shard, "num_shards", resp->num_shards, "job",
                   resp->job, "mode", resp->mode, "pulls",
                   (json_int_t)resp->pulls, "pushes", (json_int_t)resp->pushes,
                   "examples", (json_int_t)resp->examples, "bytes_in",
                   (json_int_t)resp->bytes_in, "bytes_out",
                   (json_int_t)resp->bytes_out, "errors",
                   (json_int_t)resp->errors, "uptime_s", resp->uptime_s,
                   "unauthenticated", (json_int_t)resp->unauthenticated);
  if (root) { /* job.nonfinite: pushes with NaN or Inf, and the policy */
    json_object_set_new(root, "nonfinite_pushes",
                        json_integer((json_int_t)resp->nonfinite_pushes));
    json_object_set_new(root, "nonfinite", json_string(resp->nonfinite));
  }
  vars = json_array();
  for (size_t i = 0; root && i < resp->n_vars; i++) {
    const Psd__V1__VarStatus *v = resp->vars[i];
    json_t *shape = json_array(), *slots = json_array();
    for (size_t d = 0; d < v->n_shape; d++)
      json_array_append_new(shape, json_integer(v->shape[d]));
    for (size_t k = 0; k < v->n_slots; k++)
      json_array_append_new(slots, json_string(v->slots[k]));
    json_array_append_new(
        vars,
        json_pack("{s:s, s:o, s:[I, I], s:I, s:I, s:s, s:i, s:o}", "name",
                  v->name, "shape", shape, "rows", (json_int_t)v->row_begin,
                  (json_int_t)v->row_end, "version", (json_int_t)v->version,
                  "bytes", (json_int_t)v->bytes, "optimizer", v->optimizer,
                  "placement", v->placement, "slots", slots));
  }
  if (!root) {
    json_decref(vars);
    rc = CM_ENOMEM;
    goto out;
  }
  json_object_set_new(root, "vars", vars);
  json_object_set_new(root, "step", json_integer((json_int_t)resp->step));
  json_object_set_new(root, "duplicates",
                      json_integer((json_int_t)resp->duplicates));
  json_object_set_new(root, "rollbacks",
                      json_integer((json_int_t)resp->rollbacks));
  json_object_set_new(root, "rollback_step",
                      json_integer((json_int_t)resp->rollback_step));
  json_object_set_new(root, "resumed", json_boolean(resp->resumed));
  json_object_set_new(root, "dedup_clients",
                      json_integer((json_int_t)resp->dedup_clients));
  json_object_set_new(root, "dedup_evicted",
                      json_integer((json_int_t)resp->dedup_evicted));
  json_object_set_new(root, "coordinator", json_boolean(resp->coordinator));
  {
    json_t *steps = json_array(), *workers = json_array();
    for (size_t i = 0; i < resp->n_steps; i++) {
      const Psd__V1__StepRecord *r = resp->steps[i];
      json_t *a = json_array(), *d = json_array();
      for (size_t k = 0; k < r->n_applied; k++)
        json_array_append_new(a, json_integer(r->applied[k]));
      for (size_t k = 0; k < r->n_dropped; k++)
        json_array_append_new(d, json_integer(r->dropped[k]));
      json_array_append_new(steps, json_pack("{s:I, s:o, s:o}", "step",
                                             (json_int_t)r->step, "applied", a,
                                             "dropped", d));
    }
    for (size_t i = 0; i < resp->n_workers; i++) {
      const Psd__V1__WorkerStatus *w = resp->workers[i];
      json_t *o =
          json_pack("{s:i, s:b, s:b, s:I, s:I, s:I, s:f, s:i}", "worker",
                    w->worker, "live", w->live, "joined", w->joined, "applied",
                    (json_int_t)w->applied, "dropped", (json_int_t)w->dropped,
                    "clock", (json_int_t)w->clock, "last_seen_ms",
                    w->last_seen_ms, "joins", (int)w->joins);
      json_object_set_new(o, "last_step", json_integer(w->last_step));
      json_object_set_new(o, "pushes", json_integer(w->pushes));
      json_object_set_new(o, "step_samples", json_integer(w->step_samples));
      json_object_set_new(o, "step_p50_ms", json_real(w->step_p50_ms));
      json_object_set_new(o, "step_p95_ms", json_real(w->step_p95_ms));
      json_object_set_new(o, "lag_p50_ms", json_real(w->lag_p50_ms));
      json_object_set_new(o, "lag_p95_ms", json_real(w->lag_p95_ms));
      if (w->step_time)
        json_object_set_new(o, "step_time", hist_json(w->step_time));
      json_array_append_new(workers, o);
    }
    json_t *hists = json_array();
    for (size_t i = 0; i < resp->n_histograms; i++)
      json_array_append_new(hists, hist_json(resp->histograms[i]));
    json_object_set_new(root, "histograms", hists);
    json_object_set_new(root, "steps", steps);
    json_object_set_new(root, "workers", workers);
    json_object_set_new(root, "max_clock_spread",
                        json_integer((json_int_t)resp->max_clock_spread));
  }
  if (resp->checkpoint) {
    const Psd__V1__CheckpointStatus *k = resp->checkpoint;
    json_object_set_new(
        root, "checkpoint",
        json_pack("{s:s, s:I, s:I, s:I, s:s, s:I, s:f, s:s}", "dir", k->dir,
                  "written", (json_int_t)k->written, "failed",
                  (json_int_t)k->failed, "step", (json_int_t)k->step, "path",
                  k->path, "bytes", (json_int_t)k->bytes, "ms", k->ms, "error",
                  k->error));
  }
  *json = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
  rc = *json ? 0 : CM_ENOMEM;
out:
  json_decref(root);
  if (resp)
    psd__v1__status_response__free_unpacked(resp, NULL);
  free(data);
  cm_unary_release(&u);
  return rc;
}

/* ---- admin calls (psctl) ---- */

int dw_client_checkpoint(struct dw_client *c, int wait,
                         struct dw_checkpoint *out) {
  Psd__V1__Caller caller = caller_of(c);
  Psd__V1__CheckpointRequest req = PSD__V1__CHECKPOINT_REQUEST__INIT;
  struct cm_unary *calls = calloc(c->nshards, sizeof *calls);
  int rc;

  memset(out, 0, c->nshards * sizeof *out);
  if (!calls) {
    seterr(c, "checkpoint: out of memory");
    return CM_ENOMEM;
  }
  req.caller = &caller;
  req.wait = wait;
  for (int s = 0; s < c->nshards; s++) {
    calls[s].channel = c->ch[s];
    calls[s].method = "/psd.v1.Admin/Checkpoint";
    calls[s].request = cm_rpc_pack(&req.base);
  }
  /* All shards at once: each writes its own slice in parallel. */
  rc = run(c, calls, c->nshards, "checkpoint", c->o.timeout_ms, 0, NULL, NULL);
  for (int s = 0; s < c->nshards; s++) {
    struct dw_checkpoint *k = &out[s];
    Psd__V1__CheckpointResponse *resp = NULL;
    uint8_t *data = NULL;
    size_t len = 0;
    if (calls[s].status == GRPC_STATUS_OK &&
        cm_rpc_readall(calls[s].response, &data, &len) == 0)
      resp = psd__v1__checkpoint_response__unpack(NULL, len, data);
    free(data);
    k->status = calls[s].status;
    snprintf(k->details, sizeof k->details, "%s", calls[s].details);
    if (k->status == GRPC_STATUS_OK && !resp) {
      k->status = GRPC_STATUS_INTERNAL;
      snprintf(k->details, sizeof k->details, "malformed answer");
      if (!rc) {
        seterr(c, "checkpoint from ps:%d: malformed answer", s);
        rc = CM_EPROTO;
      }
    }
    if (resp) {
      k->written = resp->written;
      k->step = resp->step;
      k->bytes = resp->bytes;
      k->ms = resp->ms;
      snprintf(k->path, sizeof k->path, "%s", resp->path);
      psd__v1__checkpoint_response__free_unpacked(resp, NULL);
    }
    cm_unary_release(&calls[s]);
  }
  free(calls);
  return rc;
}

int dw_client_last_status(const struct dw_client *c, const char **details) {
  if (details)
    *details = c->last_details;
  return c->last_status;
}
