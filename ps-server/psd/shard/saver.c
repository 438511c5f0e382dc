/* The checkpoint policy and its thread (saver.h). One mutex guards the
 * request, the waiting calls, the commit gate and the last result; it is
 * never held while writing. */
#include "saver.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "err.h"
#include "log.h"
#include "ps.pb-c.h"
#include "request.h"
#include "units.h"

#define OFF_MESSAGE                                                            \
  "checkpoints are off: no checkpoint dir (set job.checkpoint.dir, "           \
  "--checkpoint-dir or STATE_DIRECTORY)"

/* A Checkpoint call waiting for the next write. */
struct waiter {
  struct cm_rpc_call *call; /* answered once the write is done */
  uint64_t at;              /* sync cut: the step it waits for; 0: the next
                               write, whatever its step */
  struct waiter *next;      /* list link */
};

struct psd_saver {
  struct psd_ckpt *ckpt;        /* borrowed; NULL when off */
  const int *standby;           /* borrowed: 1 while the shard stands by
                                   and writes nothing (NULL: never) */
  const int *holding;           /* borrowed: 1 while it stands by with
                                   rows moved to it, and writes (NULL:
                                   never) */
  struct psd_store *store;      /* borrowed */
  struct psd_steps *steps;      /* borrowed; sync mode only */
  struct psd_dedup *dedup;      /* borrowed; async mode only, may be NULL */
  char job[64];                 /* job callers must name */
  struct cm_request_host host;  /* how requests are taken and refused */
  int every_steps;              /* 0 = never */
  double every_s;               /* 0 = never */
  struct cm_rpc_method method;  /* Admin/Checkpoint */
  atomic_uint_fast64_t applied; /* async: pushes applied (the step) */
  pthread_mutex_t lock;         /* guards everything below */
  pthread_cond_t wake;          /* the thread: a request or stop */
  pthread_cond_t gate_open;     /* commits: the write is done */
  int pending;                  /* a checkpoint is asked for */
  const char *why;              /* what asked for it, for the log */
  struct waiter *waiters;       /* calls waiting for the pending one */
  int gate;                     /* sync: a checkpoint holds commits */
  int stopping;                 /* psd is stopping: refuse new requests */
  uint64_t last_gen;            /* step + variables at the last write */
  double next_due;              /* ms when every_s is due next */
  struct psd_saver_state state; /* last result */
  pthread_t thread;             /* the writer */
  int started;                  /* thread must be joined */
  int (*cut)(void *ctx, uint64_t *step, char *err, size_t len); /* names a
                                   cut's step (the coordinator), or NULL */
  void *cut_ctx; /* its argument; borrowed */
};

/* The checkpoints written now: none while the shard stands by holding
 * nothing (a live layout switch takes it in or out, reshard/switch.c; a
 * live move gives it rows, reshard/move.c). */
static struct psd_ckpt *ckpt_now(struct psd_saver *s) {
  if (s->standby && __atomic_load_n(s->standby, __ATOMIC_ACQUIRE) &&
      !(s->holding && __atomic_load_n(s->holding, __ATOMIC_ACQUIRE)))
    return NULL;
  return s->ckpt;
}

uint64_t psd_saver_step(struct psd_saver *s) {
  return s->steps ? psd_steps_version(s->steps) : atomic_load(&s->applied);
}

/* What changes when there is something new to save. */
static uint64_t generation(struct psd_saver *s) {
  return psd_saver_step(s) * 1000003u + (uint64_t)psd_store_count(s->store);
}

/* Asks the thread for a checkpoint. Caller holds the lock. */
static void request(struct psd_saver *s, const char *why) {
  if (!s->pending)
    s->why = why;
  s->pending = 1;
  pthread_cond_signal(&s->wake);
}

static void answer(struct cm_rpc_call *call, int rc,
                   const struct psd_ckpt_result *r, const char *err) {
  if (rc) {
    cm_rpc_fail(call, GRPC_STATUS_INTERNAL, "checkpoint failed: %s", err);
    return;
  }
  Psd__V1__CheckpointResponse resp = PSD__V1__CHECKPOINT_RESPONSE__INIT;
  resp.written = 1;
  resp.step = r->step;
  resp.path = (char *)r->path;
  resp.bytes = r->bytes;
  resp.ms = r->ms;
  cm_rpc_reply(call, cm_rpc_pack(&resp.base));
}

/* Records and logs the outcome of a write. Caller holds the lock. */
static void record(struct psd_saver *s, int rc, const struct psd_ckpt_result *r,
                   const char *err, const char *why) {
  if (rc) {
    s->state.failed++;
    snprintf(s->state.error, sizeof s->state.error, "%s", err);
    cm_error("checkpoint (%s) failed: %s; the previous checkpoint is intact%s",
             why, err, strcmp(why, "at exit") ? " and psd keeps serving" : "");
    return;
  }
  s->state.written++;
  s->state.step = r->step;
  snprintf(s->state.path, sizeof s->state.path, "%s", r->path);
  s->state.bytes = r->bytes;
  s->state.ms = r->ms;
  s->state.error[0] = 0;
  char size[32], held[64] = "";
  if (strcmp(why, "at exit"))
    snprintf(held, sizeof held,
             s->steps   ? "; commits waited up to %.0f ms"
             : s->dedup ? "; pushes waited up to %.0f ms"
                        : "; a variable's lock held up to %.0f ms",
             s->steps   ? r->ms
             : s->dedup ? r->freeze_ms
                        : r->hold_ms);
  cm_info("checkpoint (%s) at step %llu written to %s: %d variables, %s in "
          "%.0f ms (%.0f MB/s)%s",
          why, (unsigned long long)r->step, r->path, r->nvars,
          cm_fmt_bytes((double)r->bytes, size, sizeof size), r->ms,
          r->ms > 0 ? r->bytes / 1e3 / r->ms : 0.0, held);
}

/* Moves to *ws the waiting calls a write of `step` answers: those for a cut
 * of that step, and with next also those for the next write. Caller holds
 * the lock. */
static void take_waiters(struct psd_saver *s, struct waiter **ws, uint64_t step,
                         int next) {
  struct waiter **pp = &s->waiters;
  while (*pp) {
    struct waiter *w = *pp;
    if (w->at ? w->at != step : !next) {
      pp = &w->next;
      continue;
    }
    *pp = w->next;
    w->next = *ws;
    *ws = w;
  }
}

/* Read-holds the store's switch gate once no layout switch holds it
 * frozen (store.h): a checkpoint of a shard partway through a switch would
 * record a layout that the job's other shards do not hold. Returns 0, or
 * CM_EUNAVAIL when psd stops while frozen (nothing held). */
static int hold_store(struct psd_saver *s) {
  while (psd_store_hold_thawed(s->store, 100)) {
    pthread_mutex_lock(&s->lock);
    int stopping = s->stopping;
    pthread_mutex_unlock(&s->lock);
    if (stopping)
      return CM_EUNAVAIL;
  }
  return 0;
}

static void *saver_thread(void *arg) {
  struct psd_saver *s = arg;
  pthread_mutex_lock(&s->lock);
  for (;;) {
    while (!s->pending && !s->stopping) {
      if (s->every_s <= 0) {
        pthread_cond_wait(&s->wake, &s->lock);
        continue;
      }
      double now = cm_mono_ms();
      if (now >= s->next_due) {
        s->next_due = now + s->every_s * 1000;
        if (generation(s) != s->last_gen)
          request(s, "every_s");
        continue;
      }
      struct timespec until =
          cm_abstime_after_ms((long)(s->next_due - now) + 1);
      pthread_cond_timedwait(&s->wake, &s->lock, &until);
    }
    if (s->stopping)
      break;
    const char *why = s->why;
    s->pending = 0;
    /* Sync: no commit runs while we hold the lock; close the gate so none
     * starts until the write is done (commit_end may have closed it). */
    if (s->steps)
      s->gate = 1;
    uint64_t step = psd_saver_step(s);
    /* This write answers the calls for the next one and those waiting for
     * a cut of this very step; a cut of a later step waits on. */
    struct waiter *ws = NULL;
    take_waiters(s, &ws, step, 1);
    uint64_t gen = generation(s);
    pthread_mutex_unlock(&s->lock);

    struct psd_ckpt_result r;
    char err[4096];
    int rc = hold_store(s);
    struct psd_ckpt *c = rc ? NULL : ckpt_now(s);
    if (!rc && !c) {
      /* Standing by: nothing to write; its callers learn why. */
      psd_store_release(s->store);
      pthread_mutex_lock(&s->lock);
      s->gate = 0;
      pthread_cond_broadcast(&s->gate_open);
      while (ws) {
        struct waiter *w = ws;
        ws = w->next;
        cm_rpc_fail(w->call, GRPC_STATUS_FAILED_PRECONDITION, OFF_MESSAGE);
        free(w);
      }
      continue;
    }
    if (rc) {
      snprintf(err, sizeof err,
               "psd is stopping while a layout switch holds the variables");
    } else {
      rc = psd_ckpt_write(c, s->store, s->dedup, step, s->steps == NULL, &r,
                          err, sizeof err);
      psd_store_release(s->store);
    }

    pthread_mutex_lock(&s->lock);
    s->gate = 0;
    pthread_cond_broadcast(&s->gate_open);
    record(s, rc, &r, err, why);
    /* A cut's call for this step that came during the write. */
    take_waiters(s, &ws, step, 0);
    if (!rc)
      s->last_gen = gen;
    if (s->every_s > 0)
      s->next_due = cm_mono_ms() + s->every_s * 1000;
    while (ws) {
      struct waiter *w = ws;
      ws = w->next;
      answer(w->call, rc, &r, err);
      free(w);
    }
  }
  /* Stopping: calls whose write never started learn why. */
  while (s->waiters) {
    struct waiter *w = s->waiters;
    s->waiters = w->next;
    cm_rpc_fail(w->call, GRPC_STATUS_UNAVAILABLE,
                "psd is shutting down; it writes a final checkpoint at exit");
    free(w);
  }
  s->gate = 0;
  pthread_cond_broadcast(&s->gate_open);
  pthread_mutex_unlock(&s->lock);
  return NULL;
}

/* Whether the shard has a checkpoint of step on disk. Caller holds the
 * lock. */
static int have_step(struct psd_saver *s, uint64_t step) {
  uint64_t steps[PSD_SAVER_LISTED];
  int n = psd_ckpt_list(s->ckpt, steps, PSD_SAVER_LISTED);
  for (int i = 0; i < n; i++)
    if (steps[i] == step)
      return 1;
  return 0;
}

/* A sync job's checkpoint cut: `job` asks the coordinator to name the step
 * (psd_coord_cut); `at_step` asks this shard for its checkpoint of it,
 * written when it commits that step (psd_saver_commit_end), at once when it
 * is there already and has none, answered at once when it has one. */
static void on_cut(struct psd_saver *s, struct cm_rpc_call *call,
                   const Psd__V1__CheckpointRequest *req) {
  Psd__V1__CheckpointResponse resp = PSD__V1__CHECKPOINT_RESPONSE__INIT;
  char err[1024];
  uint64_t at = req->at_step, now;
  if (!s->steps) {
    cm_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION,
                "a checkpoint cut is for sync jobs; in an asynchronous job "
                "each shard checkpoints on its own");
    return;
  }
  if (req->job) {
    if (!s->cut) {
      cm_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION,
                  "only the coordinator (ps:0) names the step of a cut");
      return;
    }
    int rc = s->cut(s->cut_ctx, &at, err, sizeof err);
    if (rc) {
      cm_rpc_fail(call,
                  rc == CM_EUNAVAIL ? GRPC_STATUS_UNAVAILABLE
                                    : GRPC_STATUS_FAILED_PRECONDITION,
                  "checkpoint cut: %s", err);
      return;
    }
    resp.step = at;
    resp.path = "";
    cm_rpc_reply(call, cm_rpc_pack(&resp.base));
    return;
  }
  pthread_mutex_lock(&s->lock);
  now = psd_saver_step(s);
  if (s->stopping) {
    pthread_mutex_unlock(&s->lock);
    cm_rpc_fail(call, GRPC_STATUS_UNAVAILABLE,
                "psd is shutting down; it writes a final checkpoint at exit");
    return;
  }
  if (s->state.step == at && s->state.path[0]) {
    /* Written already: the answer is the one of that write. */
    struct psd_ckpt_result r = {0};
    r.step = at;
    snprintf(r.path, sizeof r.path, "%s", s->state.path);
    r.bytes = s->state.bytes;
    r.ms = s->state.ms;
    pthread_mutex_unlock(&s->lock);
    answer(call, 0, &r, NULL);
    return;
  }
  if (have_step(s, at)) {
    /* Written already, and a later one since. */
    struct psd_ckpt_result r = {0};
    r.step = at;
    snprintf(r.path, sizeof r.path, "%s/ckpt-%010llu", psd_ckpt_dir(s->ckpt),
             (unsigned long long)at);
    pthread_mutex_unlock(&s->lock);
    answer(call, 0, &r, NULL);
    return;
  }
  if (now > at) {
    pthread_mutex_unlock(&s->lock);
    cm_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION,
                "checkpoint cut of step %llu: this shard is at step %llu "
                "already and has no checkpoint of step %llu (was the job "
                "rolled back meanwhile?); ask again",
                (unsigned long long)at, (unsigned long long)now,
                (unsigned long long)at);
    return;
  }
  if (now == at && !s->gate)
    request(s, "cut"); /* every shard is there: write now */
  if (req->wait) {
    struct waiter *w = calloc(1, sizeof *w);
    if (!w) {
      pthread_mutex_unlock(&s->lock);
      cm_rpc_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
      return;
    }
    *w = (struct waiter){call, at, s->waiters};
    s->waiters = w;
    pthread_mutex_unlock(&s->lock);
    return;
  }
  pthread_mutex_unlock(&s->lock);
  resp.step = at;
  resp.path = "";
  cm_rpc_reply(call, cm_rpc_pack(&resp.base));
}

static void on_checkpoint(struct cm_rpc_call *call, grpc_byte_buffer *bb,
                          void *ctx) {
  struct psd_saver *s = ctx;
  Psd__V1__CheckpointRequest *req =
      (Psd__V1__CheckpointRequest *)cm_request_open(
          &s->host, call, bb, &psd__v1__checkpoint_request__descriptor,
          "Checkpoint", NULL);

  if (!req)
    return;
  /* A standby shard says so as it always did: it writes none. */
  if (!ckpt_now(s)) {
    cm_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION, OFF_MESSAGE);
    goto out;
  }
  if (req->job || req->at_step) {
    on_cut(s, call, req);
    goto out;
  }
  pthread_mutex_lock(&s->lock);
  if (s->stopping) {
    pthread_mutex_unlock(&s->lock);
    cm_rpc_fail(call, GRPC_STATUS_UNAVAILABLE,
                "psd is shutting down; it writes a final checkpoint at exit");
    goto out;
  }
  struct waiter *w = req->wait ? calloc(1, sizeof *w) : NULL;
  if (req->wait && !w) {
    pthread_mutex_unlock(&s->lock);
    cm_rpc_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    goto out;
  }
  request(s, "asked for");
  if (w) {
    *w = (struct waiter){call, 0, s->waiters};
    s->waiters = w;
  }
  pthread_mutex_unlock(&s->lock);
  if (!req->wait) {
    Psd__V1__CheckpointResponse resp = PSD__V1__CHECKPOINT_RESPONSE__INIT;
    resp.step = psd_saver_step(s);
    resp.path = "";
    cm_rpc_reply(call, cm_rpc_pack(&resp.base));
  }
out:
  cm_request_free(&req->base);
}

int psd_saver_new(struct psd_saver **out, const struct psd_saver_opts *o) {
  struct psd_saver *s = calloc(1, sizeof *s);
  *out = NULL;
  if (!s)
    return CM_ENOMEM;
  s->ckpt = o->ckpt;
  s->standby = o->standby;
  s->holding = o->holding;
  s->store = o->store;
  s->steps = o->steps;
  s->dedup = o->steps ? NULL : o->dedup; /* ckpt.h: sync saves none */
  snprintf(s->job, sizeof s->job, "%s", o->job);
  cm_request_host_init(&s->host, s->job, "shard", "a shard");
  s->host.self = o->self;
  s->every_steps = o->every_steps;
  s->every_s = o->every_s;
  atomic_store(&s->applied, o->step);
  pthread_mutex_init(&s->lock, NULL);
  pthread_cond_init(&s->wake, NULL);
  pthread_cond_init(&s->gate_open, NULL);
  s->method =
      (struct cm_rpc_method){"/psd.v1.Admin/Checkpoint", on_checkpoint, s};
  s->state.on = ckpt_now(s) != NULL;
  if (s->state.on)
    snprintf(s->state.dir, sizeof s->state.dir, "%s", psd_ckpt_dir(s->ckpt));
  if (o->resumed && o->resumed->path[0]) {
    s->state.step = o->resumed->step;
    snprintf(s->state.path, sizeof s->state.path, "%s", o->resumed->path);
    s->state.bytes = o->resumed->bytes;
    s->state.ms = o->resumed->ms;
  }
  s->last_gen = generation(s);
  *out = s;
  return 0;
}

int psd_saver_start(struct psd_saver *s) {
  if (!s->ckpt)
    return 0;
  s->next_due = cm_mono_ms() + s->every_s * 1000;
  if (pthread_create(&s->thread, NULL, saver_thread, s) != 0)
    return CM_ESYS;
  s->started = 1;
  return 0;
}

const struct cm_rpc_method *psd_saver_methods(struct psd_saver *s, int *n) {
  *n = 1;
  return &s->method;
}

void psd_saver_pushed(struct psd_saver *s) {
  uint64_t n = atomic_fetch_add(&s->applied, 1) + 1;
  if (s->ckpt && s->every_steps > 0 && n % (uint64_t)s->every_steps == 0) {
    pthread_mutex_lock(&s->lock);
    request(s, "every_steps");
    pthread_mutex_unlock(&s->lock);
  }
}

void psd_saver_commit_begin(struct psd_saver *s) {
  pthread_mutex_lock(&s->lock);
  while (s->gate)
    pthread_cond_wait(&s->gate_open, &s->lock);
}

void psd_saver_set_cut(struct psd_saver *s,
                       int (*cut)(void *ctx, uint64_t *step, char *err,
                                  size_t len),
                       void *ctx) {
  s->cut = cut;
  s->cut_ctx = ctx;
}

void psd_saver_commit_end(struct psd_saver *s, uint64_t version, int cut) {
  int due = s->every_steps > 0 && version > 0 &&
            version % (uint64_t)s->every_steps == 0;
  if (s->ckpt && s->started && !s->stopping && (due || cut)) {
    /* Hold the next commit until this step is on disk. */
    s->gate = 1;
    request(s, due ? "every_steps" : "cut");
  }
  pthread_mutex_unlock(&s->lock);
}

int psd_saver_rollback(struct psd_saver *s, uint64_t step, uint64_t gen,
                       char *err, size_t errlen) {
  struct psd_ckpt_result r;
  uint64_t from;
  int rc = 0;
  if (!s->ckpt || !s->steps) {
    snprintf(err, errlen, "%s",
             !s->ckpt ? "checkpoints are off on this shard"
                      : "the job is asynchronous");
    return CM_ENOENT;
  }
  /* As a commit: no checkpoint is being written meanwhile. */
  psd_saver_commit_begin(s);
  from = psd_steps_version(s->steps);
  if (from == step) {
    /* Already at that step (a graceful stop left this shard there): its
     * values are that step's; only the staged gradients go. */
    psd_steps_rollback(s->steps, step, gen);
    cm_warn("ROLLED BACK to step %llu in place (the job's rollback %llu): "
            "this shard is at that step already; staged gradients dropped",
            (unsigned long long)step, (unsigned long long)gen);
    goto out;
  }
  if ((rc = psd_ckpt_restore(s->ckpt, step, s->store, &r, err, errlen)))
    goto out;
  psd_steps_rollback(s->steps, step, gen);
  s->state.step = step;
  snprintf(s->state.path, sizeof s->state.path, "%s", r.path);
  s->state.bytes = r.bytes;
  cm_warn("ROLLED BACK from step %llu to step %llu (the job's rollback %llu): "
          "reloaded %s (%d variables) in %.0f ms; staged gradients dropped",
          (unsigned long long)from, (unsigned long long)step,
          (unsigned long long)gen, r.path, r.nvars, r.ms);
out:
  pthread_mutex_unlock(&s->lock);
  return rc;
}

void psd_saver_state(struct psd_saver *s, struct psd_saver_state *st) {
  pthread_mutex_lock(&s->lock);
  *st = s->state;
  /* Taken in or out by a layout switch since start. */
  st->on = ckpt_now(s) != NULL;
  if (st->on)
    snprintf(st->dir, sizeof st->dir, "%s", psd_ckpt_dir(s->ckpt));
  else
    st->dir[0] = 0;
  /* A write renames its directory into place whole: never half listed. */
  st->nsteps = st->on ? psd_ckpt_list(s->ckpt, st->steps, PSD_SAVER_LISTED) : 0;
  pthread_mutex_unlock(&s->lock);
}

void psd_saver_request(struct psd_saver *s, const char *why) {
  pthread_mutex_lock(&s->lock);
  if (ckpt_now(s) && s->started && !s->stopping)
    request(s, why);
  pthread_mutex_unlock(&s->lock);
}

void psd_saver_stop(struct psd_saver *s) {
  pthread_mutex_lock(&s->lock);
  s->stopping = 1;
  pthread_cond_broadcast(&s->wake);
  pthread_mutex_unlock(&s->lock);
  if (s->started) {
    pthread_join(s->thread, NULL);
    s->started = 0;
  }
}

int psd_saver_final(struct psd_saver *s, struct psd_ckpt_result *res, char *err,
                    size_t errlen) {
  int rc;
  struct psd_ckpt *c = ckpt_now(s);
  if (!c)
    return 1;
  rc = psd_ckpt_write(c, s->store, s->dedup, psd_saver_step(s), 1, res, err,
                      errlen);
  pthread_mutex_lock(&s->lock);
  record(s, rc, res, err, "at exit");
  pthread_mutex_unlock(&s->lock);
  return rc;
}

void psd_saver_free(struct psd_saver *s) {
  if (!s)
    return;
  psd_saver_stop(s);
  pthread_mutex_destroy(&s->lock);
  pthread_cond_destroy(&s->wake);
  pthread_cond_destroy(&s->gate_open);
  free(s);
}
