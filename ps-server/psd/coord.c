/* The coordinator (coord.h). All state is guarded by one mutex: calls
 * arrive on the gRPC queue thread, deadlines and heartbeats are checked by
 * psd's loop (psd_coord_tick), and commits are sent by a thread of their
 * own so that no handler ever waits on the network. */
#include "coord.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "auth.h"
#include "clock.h"
#include "err.h"
#include "log.h"
#include "ps.pb-c.h"
#include "request.h"
#include "steps.h"

/* Step times kept for the median that sets the admission deadline. */
#define RECENT_STEPS 21
/* How often an idle commit thread asks the shards for their steps (sync). */
#define WATCH_MS 300
/* Least time the start barrier waits for every worker's first join. */
#define START_WINDOW_MS 10000.0

/* A call waiting for a decision. */
struct parked {
  struct cm_rpc_call *call; /* answered exactly once */
  int worker;               /* who asked */
  uint64_t value;           /* Admit: the step; Clock: the clock */
  int rejoin; /* Admit of a worker this coordinator has not seen join, parked
                 until the shards' steps are checked: answered "join again"
                 (or told of the rollback the check decides) */
  struct parked *next; /* list link */
};

/* A decided step, waiting to be sent to every shard. */
struct commit {
  uint64_t step;                      /* the step */
  int napplied, ndropped;             /* entries used below */
  int applied[PSD_STEPS_MAX_WORKERS]; /* its set */
  int dropped[PSD_STEPS_MAX_WORKERS]; /* live workers left out */
  struct commit *next;                /* queue link */
};

/* What the coordinator knows of one worker. */
struct worker {
  int live;         /* counted in n */
  int joined;       /* has joined at least once */
  unsigned joins;   /* joins, rejoins included */
  double last_seen; /* ms, monotonic */
  uint64_t applied; /* gradients applied */
  uint64_t dropped; /* gradients dropped */
  uint64_t clock;   /* async: pushes completed, as last reported */
  int arrived;      /* sync: in the open step's arrivals */
  int left;         /* said it finished (Join with leave) */
  int must_rejoin;  /* declared dead since its last Join: its heartbeats are
                       answered "join again" until it does (a heartbeat's
                       answer may be lost, as when it was cut off) */

  /* Step timing (status, psctl workers). */
  double step_mark;   /* ms of its last timed event (Admit or push); 0: none
                         since it joined, so a rejoin's gap is no step */
  uint64_t last_step; /* sync: the step of its last Admit */
  uint64_t pushes;    /* async: pushes timed */
  float steps[PSD_COORD_STEP_RING]; /* step times, ms; ring */
  float lags[PSD_COORD_STEP_RING];  /* sync: step opening to Admit, ms; ring */
  uint64_t nsteps, nlags;           /* written ever; next slot is n % ring */
  struct psd_hist step_hist;        /* every step time, seconds */
};

struct psd_coord {
  const struct cm_spec *spec; /* borrowed */
  struct cm_creds creds;      /* owned: how to call the shards */
  int n;                      /* workers in the job */
  int sync;                   /* 1: sync mode */
  int k, m;                   /* replicas_to_aggregate, min_replicas */
  int deterministic;          /* no deadline closing */
  int staleness;              /* async SSP bound, -1 none */
  double dead_after;          /* ms of silence that kill */
  double started; /* ms: the first join (0: none yet), for the start barrier */
  struct cm_rpc_method methods[4];     /* Join, Heartbeat, Admit, Clock */
  struct cm_request_host host;         /* how requests are taken, refused */
  pthread_mutex_t lock;                /* guards everything below */
  struct worker *w;                    /* owned, n entries */
  uint64_t open;                       /* the step open for admission */
  int arrivals[PSD_STEPS_MAX_WORKERS]; /* open step's arrivals, in order */
  int narrivals;                       /* entries used */
  double first_arrival;                /* ms of the open step's first Admit */
  double last_close;                   /* ms of the last close */
  double recent[RECENT_STEPS];         /* step durations, ms (ring) */
  int nrecent;                         /* durations recorded, capped */
  int warned_below_m;                  /* said once that live < m */
  struct parked *admits;               /* parked Admit calls */
  struct parked *clocks;               /* parked Clock calls */
  uint64_t max_spread;                 /* widest granted clock spread */
  struct commit *queue, **tail;        /* commits not yet sent */
  pthread_cond_t wake;                 /* commit thread: queue or stop */
  int stopping;                        /* stop requested */
  pthread_t thread;                    /* the commit thread */
  int thread_started;                  /* thread must be joined */
  struct cm_channel **ch;              /* owned, one per shard */
  int checked;        /* sync: every shard was found at step `open` (or not) */
  char bad[1024];     /* sync: why the shards' steps disagree, "" when fine */
  uint64_t committed; /* sync: steps every shard has committed */
  uint64_t gen;       /* sync: rollbacks so far (the job's generation) */
  uint64_t rollback_step; /* sync: the step of the last rollback */
  int rolling;            /* sync: a rollback is being sent to the shards:
                             no step closes, Admit calls are parked */
};

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static int live_count(struct psd_coord *c) {
  int n = 0;
  for (int i = 0; i < c->n; i++)
    n += c->w[i].live;
  return n;
}

/* Records one step time of w, ending now. Caller holds the lock. */
static void time_step(struct worker *w, double now) {
  if (w->step_mark > 0) {
    double ms = now - w->step_mark;
    w->steps[w->nsteps++ % PSD_COORD_STEP_RING] = (float)ms;
    psd_hist_observe(&w->step_hist, ms / 1e3);
  }
  w->step_mark = now;
}

static int cmp_float(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return x < y ? -1 : x > y;
}

/* The p50 and p95 (nearest rank) of the newest entries of a ring that has
 * had n written. */
static void ring_quantiles(const float *ring, uint64_t n, double *p50,
                           double *p95) {
  float t[PSD_COORD_STEP_RING];
  int k = n < PSD_COORD_STEP_RING ? (int)n : PSD_COORD_STEP_RING;
  *p50 = *p95 = 0;
  if (k == 0)
    return;
  memcpy(t, ring, k * sizeof *t);
  qsort(t, k, sizeof *t, cmp_float);
  *p50 = t[(int)(0.50 * (k - 1) + 0.5)];
  *p95 = t[(int)(0.95 * (k - 1) + 0.5)];
}

static int all_joined(struct psd_coord *c) {
  for (int i = 0; i < c->n; i++)
    if (!c->w[i].joined)
      return 0;
  return 1;
}

/* Admission closes early after this many ms since the first arrival. */
static double deadline_ms(struct psd_coord *c) {
  const struct cm_job *job = &c->spec->job;
  double d = job->deadline_floor_ms;
  if (c->nrecent > 0) {
    double t[RECENT_STEPS];
    memcpy(t, c->recent, c->nrecent * sizeof *t);
    qsort(t, c->nrecent, sizeof *t, cmp_double);
    double med = t[c->nrecent / 2] * job->deadline_multiple;
    if (med > d)
      d = med;
  }
  return d;
}

static void reply_admit(struct cm_rpc_call *call, int admitted, uint64_t step,
                        const int *set, int nset, uint64_t next) {
  Psd__V1__AdmitResponse r = PSD__V1__ADMIT_RESPONSE__INIT;
  int32_t s[PSD_STEPS_MAX_WORKERS];
  for (int i = 0; i < nset; i++)
    s[i] = set[i];
  r.admitted = admitted;
  r.step = step;
  r.n_applied = nset;
  r.applied = s;
  r.next_step = next;
  cm_rpc_reply(call, cm_rpc_pack(&r.base));
}

/* Answers an Admit whose gradient is not counted because the worker must
 * go elsewhere first: rejoin 0, the job rolled back (it goes on from the
 * step rolled back to); rejoin 1, this coordinator has not seen it join (it
 * restarted since), so it joins again and the Join answers the step and
 * generation to go on from. Caller holds the lock. */
static void reply_redirect(struct psd_coord *c, struct cm_rpc_call *call,
                           uint64_t step, int rejoin) {
  Psd__V1__AdmitResponse r = PSD__V1__ADMIT_RESPONSE__INIT;
  r.step = step;
  r.next_step = rejoin ? c->open : c->rollback_step;
  r.rolled_back = !rejoin;
  r.rejoin = rejoin;
  r.gen = c->gen;
  cm_rpc_reply(call, cm_rpc_pack(&r.base));
}

/* Decides the open step with the arrivals so far. Caller holds the lock. */
static void close_step(struct psd_coord *c, int take, const char *why) {
  struct commit *cm = calloc(1, sizeof *cm);
  double now = cm_mono_ms();
  uint64_t t = c->open;

  if (!cm) {
    cm_error("coordinator: out of memory closing step %llu",
             (unsigned long long)t);
    return;
  }
  cm->step = t;
  /* The first `take` arrivals make the step (more may have come while
   * steps waited for the shards' steps to be checked). */
  for (int i = 0; i < c->narrivals; i++) {
    if (i < take)
      cm->applied[cm->napplied++] = c->arrivals[i];
    else
      c->w[c->arrivals[i]].arrived = 0;
  }
  for (int i = 0; i < c->n; i++) {
    if (c->w[i].arrived) {
      c->w[i].applied++;
      c->w[i].arrived = 0;
    } else if (c->w[i].live) {
      cm->dropped[cm->ndropped++] = i;
      c->w[i].dropped++;
    }
  }
  cm_debug("step %llu closed (%s): %d applied, %d dropped",
           (unsigned long long)t, why, cm->napplied, cm->ndropped);
  /* Answer the admissions parked on this step. */
  for (struct parked **pp = &c->admits; *pp;) {
    struct parked *p = *pp;
    if (p->value != t) {
      pp = &p->next;
      continue;
    }
    int in = 0;
    for (int i = 0; i < cm->napplied; i++)
      in |= cm->applied[i] == p->worker;
    reply_admit(p->call, in, t, cm->applied, cm->napplied, t + 1);
    *pp = p->next;
    free(p);
  }
  if (c->last_close > 0) {
    c->recent[c->nrecent < RECENT_STEPS ? c->nrecent
                                        : (int)(t % RECENT_STEPS)] =
        now - c->last_close;
    if (c->nrecent < RECENT_STEPS)
      c->nrecent++;
  }
  c->last_close = now;
  c->open = t + 1;
  c->narrivals = 0;
  *c->tail = cm;
  c->tail = &cm->next;
  pthread_cond_signal(&c->wake);
}

/* How long after the first join the start barrier waits for the other
 * workers' first joins: dead_after_ms, and at least START_WINDOW_MS, since
 * workers started together on a loaded host can join seconds apart. */
static double start_window(const struct psd_coord *c) {
  return c->dead_after > START_WINDOW_MS ? c->dead_after : START_WINDOW_MS;
}

/* Closes the open step if its rule is met. Caller holds the lock. */
static void maybe_close(struct psd_coord *c, double now) {
  int live = live_count(c), need = c->k < live ? c->k : live;
  /* No step closes before every shard is known to be at the open one. */
  if (c->narrivals == 0 || !c->checked || c->bad[0] || c->rolling)
    return;
  /* Start barrier: wait for every worker to join once, or dead_after; in
   * deterministic mode for every worker however long it takes, since a
   * slow start (a loaded machine) must not change which gradients make
   * the first steps. */
  if (!all_joined(c) &&
      (c->deterministic || now - c->started < start_window(c)))
    return;
  if (c->narrivals >= need && need > 0) {
    if (need < c->m && !c->warned_below_m) {
      cm_warn("only %d workers live, fewer than min_replicas %d: steps close "
              "when all live workers are in",
              live, c->m);
      c->warned_below_m = 1;
    }
    close_step(c, need, "replicas in");
    return;
  }
  if (!c->deterministic && c->narrivals >= c->m &&
      now - c->first_arrival >= deadline_ms(c))
    close_step(c, c->narrivals, "deadline");
}

/* Grants parked Clock calls that the slowest live worker now allows. */
static void check_clocks(struct psd_coord *c) {
  uint64_t min = UINT64_MAX;
  /* Start barrier, as for steps: nobody runs ahead of a worker that has
   * not even joined yet, unless it stays away for dead_after_ms. */
  if (!all_joined(c) && cm_mono_ms() - c->started < start_window(c))
    return;
  for (int i = 0; i < c->n; i++)
    if (c->w[i].live && c->w[i].clock < min)
      min = c->w[i].clock;
  for (struct parked **pp = &c->clocks; *pp;) {
    struct parked *p = *pp;
    if (min != UINT64_MAX && p->value > min + (uint64_t)c->staleness) {
      pp = &p->next;
      continue;
    }
    if (min != UINT64_MAX && p->value - min > c->max_spread && p->value >= min)
      c->max_spread = p->value - min;
    Psd__V1__ClockResponse r = PSD__V1__CLOCK_RESPONSE__INIT;
    r.min_clock = min == UINT64_MAX ? p->value : min;
    cm_rpc_reply(p->call, cm_rpc_pack(&r.base));
    *pp = p->next;
    free(p);
  }
}

/* Marks worker w as heard from; returns -1 (answered) for a bad index. A
 * worker declared dead that is heard from again (it was stopped, or cut
 * off) is live again: its heartbeat is proof of life. */
static int seen(struct psd_coord *c, struct cm_rpc_call *call, int w,
                const char *what) {
  if (w < 0 || w >= c->n) {
    cm_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT,
                "%s: worker %d out of range; cluster.worker has %d entries",
                what, w, c->n);
    return -1;
  }
  c->w[w].last_seen = cm_mono_ms();
  if (c->w[w].joined && !c->w[w].live && !c->w[w].left &&
      strcmp(what, "Join") != 0) {
    cm_info("worker:%d is heard from again; live at step %llu", w,
            (unsigned long long)c->open);
    c->w[w].live = 1;
  }
  return 0;
}

static void on_join(struct cm_rpc_call *call, grpc_byte_buffer *bb, void *ctx) {
  struct psd_coord *c = ctx;
  Psd__V1__JoinRequest *req = (Psd__V1__JoinRequest *)cm_request_open(
      &c->host, call, bb, &psd__v1__join_request__descriptor, "Join", NULL);
  if (!req)
    return;
  pthread_mutex_lock(&c->lock);
  if (c->bad[0] && !req->leave)
    cm_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION, "%s", c->bad);
  else if (seen(c, call, req->worker, "Join") == 0) {
    struct worker *w = &c->w[req->worker];
    if (req->leave) {
      if (w->live)
        cm_info("worker:%d left the job", req->worker);
      w->live = 0;
      w->left = 1;
    } else {
      /* A joined worker joins again when it restarted, or when its
       * heartbeat was told it had been declared dead (cut off, stopped). */
      if (w->joined)
        cm_info("worker:%d rejoined at step %llu", req->worker,
                (unsigned long long)c->open);
      else
        cm_info("worker:%d joined at step %llu", req->worker,
                (unsigned long long)c->open);
      w->live = 1;
      w->left = 0;
      w->joined = 1;
      w->must_rejoin = 0;
      w->joins++;
      if (c->started == 0)
        c->started = cm_mono_ms(); /* the start barrier's clock */
      w->step_mark = 0;
    }
    Psd__V1__JoinResponse r = PSD__V1__JOIN_RESPONSE__INIT;
    r.step = c->open;
    r.live = live_count(c);
    r.gen = c->gen;
    cm_rpc_reply(call, cm_rpc_pack(&r.base));
    if (c->sync)
      maybe_close(c, cm_mono_ms());
    else
      check_clocks(c);
  }
  pthread_mutex_unlock(&c->lock);
  cm_request_free(&req->base);
}

static void on_heartbeat(struct cm_rpc_call *call, grpc_byte_buffer *bb,
                         void *ctx) {
  struct psd_coord *c = ctx;
  Psd__V1__HeartbeatRequest *req = (Psd__V1__HeartbeatRequest *)cm_request_open(
      &c->host, call, bb, &psd__v1__heartbeat_request__descriptor, "Heartbeat",
      NULL);
  if (!req)
    return;
  pthread_mutex_lock(&c->lock);
  /* Not counted as a member (this coordinator restarted since the worker
   * joined, or declared it dead since): the worker is asked to join again,
   * so that membership and step timing start afresh; until it does, since
   * an answer can be lost (seen() meanwhile makes a dead worker live again
   * on any call). */
  int rejoin = req->worker >= 0 && req->worker < c->n &&
               !c->w[req->worker].left &&
               (!c->w[req->worker].joined || c->w[req->worker].must_rejoin);
  if (seen(c, call, req->worker, "Heartbeat") == 0) {
    Psd__V1__HeartbeatResponse r = PSD__V1__HEARTBEAT_RESPONSE__INIT;
    r.step = c->open;
    r.rejoin = rejoin;
    r.restarted = rejoin && !c->w[req->worker].joined;
    cm_rpc_reply(call, cm_rpc_pack(&r.base));
  }
  pthread_mutex_unlock(&c->lock);
  cm_request_free(&req->base);
}

static void on_admit(struct cm_rpc_call *call, grpc_byte_buffer *bb,
                     void *ctx) {
  struct psd_coord *c = ctx;
  Psd__V1__AdmitRequest *req = (Psd__V1__AdmitRequest *)cm_request_open(
      &c->host, call, bb, &psd__v1__admit_request__descriptor, "Admit", NULL);
  if (!req)
    return;
  pthread_mutex_lock(&c->lock);
  if (!c->sync) {
    cm_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION,
                "Admit: job '%s' is asynchronous; only sync jobs have steps",
                c->spec->job.name);
  } else if (c->bad[0]) {
    cm_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION, "%s", c->bad);
  } else if (seen(c, call, req->worker, "Admit") == 0) {
    struct worker *w = &c->w[req->worker];
    struct parked *p;
    if (c->rolling && (p = calloc(1, sizeof *p))) {
      /* Answered once every shard has rolled back. */
      *p = (struct parked){call, req->worker, req->step, 0, c->admits};
      c->admits = p;
    } else if (req->gen < c->gen) {
      time_step(w, cm_mono_ms());
      reply_redirect(c, call, req->step, 0);
    } else if (!w->joined && !c->checked && (p = calloc(1, sizeof *p))) {
      /* This coordinator restarted since the worker joined, and is still
       * finding out where the shards are: the answer waits for that (a
       * rollback, or "join again" at the step it opens). */
      *p = (struct parked){call, req->worker, req->step, 1, c->admits};
      c->admits = p;
    } else if (!w->joined) {
      reply_redirect(c, call, req->step, 1);
    } else if (!w->live) {
      cm_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION,
                  "Admit: worker:%d is not live (declared dead or left); "
                  "Join again",
                  req->worker);
    } else if (req->step < c->open) {
      /* Too late: the step closed without it (counted at the close). */
      time_step(w, cm_mono_ms());
      w->last_step = req->step;
      reply_admit(call, 0, req->step, NULL, 0, c->open);
    } else if (req->step > c->open) {
      cm_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION,
                  "Admit: step %llu is not open yet (open: %llu)",
                  (unsigned long long)req->step, (unsigned long long)c->open);
    } else {
      struct parked *p = calloc(1, sizeof *p);
      if (!p) {
        cm_rpc_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
      } else {
        double now = cm_mono_ms();
        if (!w->arrived) {
          time_step(w, now);
          w->last_step = req->step;
          if (c->last_close > 0) {
            w->lags[w->nlags++ % PSD_COORD_STEP_RING] =
                (float)(now - c->last_close);
          }
          if (c->narrivals == 0)
            c->first_arrival = now;
          w->arrived = 1;
          c->arrivals[c->narrivals++] = req->worker;
        }
        *p = (struct parked){call, req->worker, req->step, 0, c->admits};
        c->admits = p;
        maybe_close(c, now);
      }
    }
  }
  pthread_mutex_unlock(&c->lock);
  cm_request_free(&req->base);
}

static void on_clock(struct cm_rpc_call *call, grpc_byte_buffer *bb,
                     void *ctx) {
  struct psd_coord *c = ctx;
  Psd__V1__ClockRequest *req = (Psd__V1__ClockRequest *)cm_request_open(
      &c->host, call, bb, &psd__v1__clock_request__descriptor, "Clock", NULL);
  if (!req)
    return;
  pthread_mutex_lock(&c->lock);
  if (req->clock > PSD_COORD_MAX_CLOCK) {
    cm_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT,
                "Clock: worker %d reports clock %llu; a clock counts a "
                "worker's pushes and is at most 2^48",
                req->worker, (unsigned long long)req->clock);
  } else if (seen(c, call, req->worker, "Clock") == 0) {
    struct parked *p = calloc(1, sizeof *p);
    c->w[req->worker].clock = req->clock;
    if (!p) {
      cm_rpc_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    } else if (c->staleness < 0) {
      free(p);
      Psd__V1__ClockResponse r = PSD__V1__CLOCK_RESPONSE__INIT;
      cm_rpc_reply(call, cm_rpc_pack(&r.base));
    } else {
      *p = (struct parked){call, req->worker, req->clock, 0, c->clocks};
      c->clocks = p;
      check_clocks(c);
    }
  }
  pthread_mutex_unlock(&c->lock);
  cm_request_free(&req->base);
}

void psd_coord_tick(struct psd_coord *c) {
  double now = cm_mono_ms();
  int changed = 0;
  pthread_mutex_lock(&c->lock);
  for (int i = 0; i < c->n; i++) {
    struct worker *w = &c->w[i];
    if (w->live && now - w->last_seen > c->dead_after) {
      cm_warn("worker:%d declared dead: silent for %.0f ms (dead_after_ms "
              "%.0f); it rejoins by calling Join",
              i, now - w->last_seen, c->dead_after);
      w->live = 0;
      w->must_rejoin = 1;
      changed = 1;
    }
  }
  if (c->sync)
    maybe_close(c, now);
  else if (changed || c->clocks)
    check_clocks(c);
  pthread_mutex_unlock(&c->lock);
}

/* Fills calls[] with one call of method carrying msg to every shard not yet
 * done[s]; each call's user is its shard index. Returns how many. */
static int fill_calls(struct psd_coord *c, struct cm_unary *calls,
                      const int *done, const char *method,
                      const ProtobufCMessage *msg) {
  int n = 0;
  for (int s = 0; s < c->spec->nps; s++) {
    if (done[s])
      continue;
    memset(&calls[n], 0, sizeof calls[n]);
    calls[n].channel = c->ch[s];
    calls[n].method = method;
    calls[n].request = cm_rpc_pack(msg);
    calls[n].user = (void *)(intptr_t)s;
    n++;
  }
  return n;
}

static void rollback(struct psd_coord *c, struct cm_unary *calls, int *done,
                     uint64_t step, uint64_t from, const char *who);

enum psd_coord_start psd__coord_plan(const struct psd_coord_shard *s, int nps,
                                     uint64_t open, uint64_t *step,
                                     int *culprit, uint64_t *from,
                                     uint64_t *gen) {
  int ran_on = 0, differ = 0;
  *step = *from = open;
  *culprit = 0;
  *gen = 0;
  for (int i = 0; i < nps; i++) {
    if (s[i].gen > *gen)
      *gen = s[i].gen;
    differ |= s[i].step != open;
    /* Commits since it started, or a step reached without resuming (a
     * rollback, or steps whose history it forgot), mean it has served
     * while shard 0 was away; a shard that has only just resumed, or
     * starts fresh, has not. */
    if (i > 0 && (s[i].ncommits > 0 || (!s[i].resumed && s[i].step > 0)))
      ran_on = 1;
    if (s[i].step < *step) {
      *step = s[i].step;
      *culprit = i;
    }
    if (s[i].step > *from)
      *from = s[i].step;
  }
  if (ran_on)
    return PSD_COORD_ROLLBACK;
  return differ ? PSD_COORD_DIFFER : PSD_COORD_AGREE;
}

/* Sync: asks every shard for its step until each has answered once, and
 * checks that all are at the step the coordinator opens (0, or the step its
 * shard resumed from), learning the job's generation from them. When the
 * others ran on while shard 0 was away (it was killed and restarted from a
 * checkpoint), the job rolls back to the lowest step of any shard, with a
 * generation above every one known, so that every worker's call of the old
 * generation is told. Shards that all just started from different
 * checkpoints could never commit the same steps: that is said loudly, and
 * Join and Admit answer it, instead of a job that hangs. Steps close only
 * once checked. */
static void check_steps(struct psd_coord *c, struct cm_unary *calls,
                        int *done) {
  Psd__V1__Caller caller = PSD__V1__CALLER__INIT;
  Psd__V1__StatusRequest req = PSD__V1__STATUS_REQUEST__INIT;
  struct psd_coord_shard *st = calloc(c->spec->nps, sizeof *st);
  enum psd_coord_start plan = PSD_COORD_AGREE;
  uint64_t open, step = 0, from = 0, gen = 0;
  int left = c->spec->nps, stop = 0, culprit = 0;

  caller.job = (char *)c->spec->job.name;
  caller.worker = "coordinator";
  req.caller = &caller;
  memset(done, 0, c->spec->nps * sizeof *done);
  pthread_mutex_lock(&c->lock);
  open = c->open;
  pthread_mutex_unlock(&c->lock);
  while (st && left > 0 && !stop) {
    /* Waits for each channel to connect (within the deadline) rather than
     * failing at once while gRPC backs off reconnecting. */
    struct cm_run_opts o = {
        .timeout_ms = 1000, .inflight = 1, .wait_for_ready = 1};
    int n = fill_calls(c, calls, done, "/psd.v1.Admin/Status", &req.base);
    cm_client_run(calls, n, &o);
    for (int i = 0; i < n; i++) {
      int s = (int)(intptr_t)calls[i].user;
      Psd__V1__StatusResponse *r = NULL;
      if (calls[i].status == GRPC_STATUS_OK &&
          (r = (Psd__V1__StatusResponse *)cm_rpc_unpack(
               calls[i].response, &psd__v1__status_response__descriptor))) {
        st[s].step = r->step;
        st[s].gen = r->rollbacks;
        st[s].resumed = r->resumed;
        st[s].ncommits = (int)r->n_steps;
        done[s] = 1;
        left--;
        psd__v1__status_response__free_unpacked(r, NULL);
      }
      cm_unary_release(&calls[i]);
    }
    pthread_mutex_lock(&c->lock);
    if (left > 0 && !c->stopping) {
      struct timespec until = cm_abstime_after_ms(200);
      pthread_cond_timedwait(&c->wake, &c->lock, &until);
    }
    stop = c->stopping;
    pthread_mutex_unlock(&c->lock);
  }
  if (st && !stop) {
    plan =
        psd__coord_plan(st, c->spec->nps, open, &step, &culprit, &from, &gen);
    pthread_mutex_lock(&c->lock);
    if (gen > c->gen)
      c->gen = gen;
    pthread_mutex_unlock(&c->lock);
  }
  if (plan == PSD_COORD_ROLLBACK) {
    char who[160];
    if (culprit == 0)
      snprintf(who, sizeof who,
               "ps:0 (the coordinator) restarted from its checkpoint of step "
               "%llu",
               (unsigned long long)open);
    else
      snprintf(who, sizeof who,
               "ps:0 (the coordinator) restarted from its checkpoint of step "
               "%llu and ps:%d is at step %llu",
               (unsigned long long)open, culprit, (unsigned long long)step);
    rollback(c, calls, done, step, from, who);
  }
  pthread_mutex_lock(&c->lock);
  stop |= c->stopping;
  for (int s = 0; plan == PSD_COORD_DIFFER && !stop && s < c->spec->nps; s++) {
    size_t n = strlen(c->bad);
    if (st[s].step == open)
      continue;
    if (!n)
      n = snprintf(c->bad, sizeof c->bad,
                   "the shards are at different steps (the coordinator opens "
                   "step %llu):",
                   (unsigned long long)open);
    if (n < sizeof c->bad)
      snprintf(c->bad + n, sizeof c->bad - n, " ps:%d is at step %llu;", s,
               (unsigned long long)st[s].step);
  }
  if (plan == PSD_COORD_DIFFER && c->bad[0]) {
    size_t n = strlen(c->bad);
    if (n < sizeof c->bad)
      snprintf(c->bad + n, sizeof c->bad - n,
               " did they resume from different checkpoints? restart every "
               "shard with --resume-step N, N the newest step all of them "
               "have");
    cm_error("%s", c->bad);
    for (struct parked **pp = &c->admits; *pp;) {
      struct parked *p = *pp;
      *pp = p->next;
      cm_rpc_fail(p->call, GRPC_STATUS_FAILED_PRECONDITION, "%s", c->bad);
      free(p);
    }
  }
  c->checked = !stop;
  /* Admissions of workers that had not joined this coordinator waited for
   * the check (a rollback has answered them already). */
  for (struct parked **pp = &c->admits; c->checked && *pp;) {
    struct parked *p = *pp;
    if (!p->rejoin) {
      pp = &p->next;
      continue;
    }
    if (c->bad[0])
      cm_rpc_fail(p->call, GRPC_STATUS_FAILED_PRECONDITION, "%s", c->bad);
    else
      reply_redirect(c, p->call, p->value, 1);
    *pp = p->next;
    free(p);
  }
  if (c->checked && !c->bad[0])
    maybe_close(c, cm_mono_ms());
  pthread_mutex_unlock(&c->lock);
  free(st);
}

/* Asks shard s for its step and generation, waiting up to timeout_ms.
 * Returns 0, or -1 when it did not answer. */
static int shard_step(struct psd_coord *c, struct cm_unary *call, int s,
                      int timeout_ms, uint64_t *step, uint64_t *gen) {
  Psd__V1__Caller caller = PSD__V1__CALLER__INIT;
  Psd__V1__StatusRequest req = PSD__V1__STATUS_REQUEST__INIT;
  struct cm_run_opts o = {.timeout_ms = timeout_ms, .inflight = 1};
  int done[PSD_STEPS_MAX_WORKERS] = {0}, rc = -1;
  Psd__V1__StatusResponse *r = NULL;

  caller.job = (char *)c->spec->job.name;
  caller.worker = "coordinator";
  req.caller = &caller;
  for (int i = 0; i < c->spec->nps && i < PSD_STEPS_MAX_WORKERS; i++)
    done[i] = i != s;
  if (fill_calls(c, call, done, "/psd.v1.Admin/Status", &req.base) != 1)
    return -1;
  cm_client_run(call, 1, &o);
  if (call->status == GRPC_STATUS_OK &&
      (r = (Psd__V1__StatusResponse *)cm_rpc_unpack(
           call->response, &psd__v1__status_response__descriptor))) {
    *step = r->step;
    *gen = r->rollbacks;
    rc = 0;
    psd__v1__status_response__free_unpacked(r, NULL);
  }
  cm_unary_release(call);
  return rc;
}

/* Rolls the whole job back to `step`, the checkpoint a shard restarted
 * from: every shard reloads its own checkpoint of that step and
 * drops its staged gradients (Data/Rollback, retried while a shard is
 * unreachable), then the step reopens and every parked Admit is told. A
 * shard without that checkpoint stops the job loudly, as shards at
 * different steps do. from: the highest step any shard had reached, if
 * known beyond the coordinator's own; who: what happened, for the log
 * ("ps:1 restarted from its checkpoint of step 100"). Called on the commit
 * thread, without the lock. */
static void rollback(struct psd_coord *c, struct cm_unary *calls, int *done,
                     uint64_t step, uint64_t from, const char *who) {
  Psd__V1__Caller caller = PSD__V1__CALLER__INIT;
  Psd__V1__RollbackRequest req = PSD__V1__ROLLBACK_REQUEST__INIT;
  int failed = -1;
  char why[512] = "";

  pthread_mutex_lock(&c->lock);
  if (c->open > from)
    from = c->open;
  if (c->committed > from)
    from = c->committed;
  c->rolling = 1;
  /* Steps decided and not yet sent are redone. */
  while (c->queue) {
    struct commit *cm = c->queue;
    c->queue = cm->next;
    free(cm);
  }
  c->tail = &c->queue;
  for (int i = 0; i < c->n; i++)
    c->w[i].arrived = 0;
  c->narrivals = 0;
  req.gen = c->gen + 1;
  pthread_mutex_unlock(&c->lock);
  cm_warn("%s while the job was at step %llu: rolling every shard back to "
          "step %llu (generation %llu)",
          who, (unsigned long long)from, (unsigned long long)step,
          (unsigned long long)req.gen);

  caller.job = (char *)c->spec->job.name;
  caller.worker = "coordinator";
  req.caller = &caller;
  req.step = step;
  memset(done, 0, c->spec->nps * sizeof *done);
  for (int attempt = 0, left = c->spec->nps; left > 0 && failed < 0;
       attempt++) {
    struct cm_run_opts o = {.timeout_ms = c->spec->job.timeout_ms,
                            .inflight = 1,
                            .wait_for_ready = 1};
    int n = fill_calls(c, calls, done, "/psd.v1.Data/Rollback", &req.base);
    cm_client_run(calls, n, &o);
    for (int i = 0; i < n; i++) {
      int s = (int)(intptr_t)calls[i].user;
      if (calls[i].status == GRPC_STATUS_OK) {
        done[s] = 1;
        left--;
      } else if (calls[i].status == GRPC_STATUS_FAILED_PRECONDITION ||
                 calls[i].status == GRPC_STATUS_INVALID_ARGUMENT) {
        if (failed < 0) {
          failed = s;
          snprintf(why, sizeof why, "%s", calls[i].details);
        }
      } else if (attempt % 10 == 0) {
        cm_warn("rollback to step %llu on ps:%d failed: %s: %s; retrying",
                (unsigned long long)step, s,
                cm_rpc_status_name(calls[i].status), calls[i].details);
      }
      cm_unary_release(&calls[i]);
    }
    pthread_mutex_lock(&c->lock);
    int stop = c->stopping;
    if (left > 0 && failed < 0 && !stop) {
      struct timespec until = cm_abstime_after_ms(100);
      pthread_cond_timedwait(&c->wake, &c->lock, &until);
      stop = c->stopping;
    }
    pthread_mutex_unlock(&c->lock);
    if (stop)
      return;
  }

  pthread_mutex_lock(&c->lock);
  c->rolling = 0;
  if (failed >= 0) {
    snprintf(c->bad, sizeof c->bad,
             "cannot roll the job back to step %llu (%s): ps:%d has no usable "
             "checkpoint of step %llu (%s); restart every shard with "
             "--resume-step N, N the newest step all of them have",
             (unsigned long long)step, who, failed, (unsigned long long)step,
             why);
    cm_error("%s", c->bad);
  } else {
    c->gen = req.gen;
    c->rollback_step = step;
    c->open = step;
    c->committed = step;
    c->last_close = cm_mono_ms();
    cm_warn("rolled the job back to step %llu: %s while the others were at "
            "step %llu; %llu steps are redone (rollback %llu)",
            (unsigned long long)step, who, (unsigned long long)from,
            (unsigned long long)(from - step), (unsigned long long)c->gen);
  }
  while (c->admits) {
    struct parked *p = c->admits;
    c->admits = p->next;
    if (failed >= 0)
      cm_rpc_fail(p->call, GRPC_STATUS_FAILED_PRECONDITION, "%s", c->bad);
    else
      reply_redirect(c, p->call, p->value, 0);
    free(p);
  }
  pthread_mutex_unlock(&c->lock);
}

/* Sync, while no commit is being sent: a shard behind the steps every shard
 * committed, or of an older generation, restarted from a checkpoint; the
 * job rolls back to the oldest such step. Shards that do not answer at
 * once are skipped (they may be restarting). */
static void watch_shards(struct psd_coord *c, struct cm_unary *calls,
                         int *done) {
  uint64_t committed, gen, step = UINT64_MAX;
  int culprit = -1;
  pthread_mutex_lock(&c->lock);
  committed = c->committed;
  gen = c->gen;
  int go = c->checked && !c->bad[0] && !c->stopping;
  pthread_mutex_unlock(&c->lock);
  for (int s = 0; go && s < c->spec->nps; s++) {
    uint64_t st, g;
    if (shard_step(c, calls, s, 500, &st, &g))
      continue;
    if ((st < committed || g < gen) && st < step) {
      step = st;
      culprit = s;
    }
  }
  if (culprit >= 0) {
    char who[96];
    snprintf(who, sizeof who,
             "ps:%d restarted from its checkpoint of step %llu", culprit,
             (unsigned long long)step);
    rollback(c, calls, done, step, 0, who);
  }
}

/* Sends each decided step to every shard, retrying a shard that does not
 * answer (it may be restarting) until it does or psd stops. */
static void *commit_thread(void *arg) {
  struct psd_coord *c = arg;
  struct cm_unary *calls = calloc(c->spec->nps, sizeof *calls);
  int *done = calloc(c->spec->nps, sizeof *done);
  if (c->sync)
    check_steps(c, calls, done);
  pthread_mutex_lock(&c->lock);
  c->committed = c->open;
  for (;;) {
    while (!c->queue && !c->stopping) {
      struct timespec until = cm_abstime_after_ms(WATCH_MS);
      if (pthread_cond_timedwait(&c->wake, &c->lock, &until) == ETIMEDOUT &&
          c->sync && !c->queue && !c->stopping) {
        pthread_mutex_unlock(&c->lock);
        watch_shards(c, calls, done);
        pthread_mutex_lock(&c->lock);
      }
    }
    if (c->stopping)
      break;
    struct commit *cm = c->queue;
    c->queue = cm->next;
    if (!c->queue)
      c->tail = &c->queue;
    pthread_mutex_unlock(&c->lock);

    Psd__V1__Caller caller = PSD__V1__CALLER__INIT;
    Psd__V1__CommitRequest req = PSD__V1__COMMIT_REQUEST__INIT;
    int32_t a[PSD_STEPS_MAX_WORKERS], d[PSD_STEPS_MAX_WORKERS];
    for (int i = 0; i < cm->napplied; i++)
      a[i] = cm->applied[i];
    for (int i = 0; i < cm->ndropped; i++)
      d[i] = cm->dropped[i];
    caller.job = (char *)c->spec->job.name;
    caller.worker = "coordinator";
    req.caller = &caller;
    req.step = cm->step;
    req.n_applied = cm->napplied;
    req.applied = a;
    req.n_dropped = cm->ndropped;
    req.dropped = d;
    memset(done, 0, c->spec->nps * sizeof *done);
    int behind = -1, left = c->spec->nps;
    for (int attempt = 0; left > 0 && behind < 0; attempt++) {
      struct cm_run_opts o = {.timeout_ms = c->spec->job.timeout_ms,
                              .inflight = 1,
                              .wait_for_ready = 1};
      int n = fill_calls(c, calls, done, "/psd.v1.Data/Commit", &req.base);
      cm_client_run(calls, n, &o);
      for (int i = 0; i < n; i++) {
        int s = (int)(intptr_t)calls[i].user;
        if (calls[i].status == GRPC_STATUS_OK) {
          done[s] = 1;
          left--;
        } else if (calls[i].status == GRPC_STATUS_FAILED_PRECONDITION &&
                   behind < 0) {
          /* Refused: a shard that restarted from an older checkpoint, or
           * at this step without the gradients staged before. */
          behind = s;
          if (attempt % 10 == 0)
            cm_warn("commit of step %llu to ps:%d refused: %s",
                    (unsigned long long)cm->step, s, calls[i].details);
        } else if (attempt % 10 == 0) {
          cm_warn("commit of step %llu to ps:%d failed: %s: %s; retrying",
                  (unsigned long long)cm->step, s,
                  cm_rpc_status_name(calls[i].status), calls[i].details);
        }
        cm_unary_release(&calls[i]);
      }
      pthread_mutex_lock(&c->lock);
      int stop = c->stopping;
      if (left > 0 && !stop) {
        struct timespec until = cm_abstime_after_ms(100);
        pthread_cond_timedwait(&c->wake, &c->lock, &until);
        stop = c->stopping;
      }
      pthread_mutex_unlock(&c->lock);
      if (stop)
        break;
      if (behind >= 0) {
        uint64_t st, g;
        struct cm_unary one;
        memset(&one, 0, sizeof one);
        if (shard_step(c, &one, behind, c->spec->job.timeout_ms, &st, &g) ||
            st > cm->step)
          behind = -1; /* not a restart: retried as before */
        else {
          char who[96];
          snprintf(who, sizeof who,
                   "ps:%d restarted from its checkpoint of step %llu", behind,
                   (unsigned long long)st);
          rollback(c, calls, done, st, 0, who);
        }
      }
    }
    if (behind < 0 && left == 0) {
      pthread_mutex_lock(&c->lock);
      c->committed = cm->step + 1;
      pthread_mutex_unlock(&c->lock);
    }
    free(cm);
    pthread_mutex_lock(&c->lock);
  }
  pthread_mutex_unlock(&c->lock);
  free(calls);
  free(done);
  return NULL;
}

int psd_coord_new(struct psd_coord **out, const struct cm_spec *spec) {
  struct psd_coord *c = calloc(1, sizeof *c);
  const struct cm_job *job = &spec->job;
  char err[1024];
  int rc = 0;
  if (!c)
    return CM_ENOMEM;
  c->spec = spec;
  c->n = spec->nworker;
  c->sync = strcmp(job->mode, "sync") == 0;
  c->k = job->replicas_to_aggregate > 0 ? job->replicas_to_aggregate : c->n;
  c->m = job->min_replicas > 0 ? job->min_replicas : c->k;
  c->deterministic = job->deterministic;
  c->staleness = job->staleness;
  c->dead_after = job->dead_after_ms > 0 ? job->dead_after_ms : 5000;
  c->tail = &c->queue;
  cm_request_host_init(&c->host, job->name, "coordinator", "the coordinator");
  pthread_mutex_init(&c->lock, NULL);
  pthread_cond_init(&c->wake, NULL);
  c->methods[0] = (struct cm_rpc_method){"/psd.v1.Coord/Join", on_join, c};
  c->methods[1] =
      (struct cm_rpc_method){"/psd.v1.Coord/Heartbeat", on_heartbeat, c};
  c->methods[2] = (struct cm_rpc_method){"/psd.v1.Coord/Admit", on_admit, c};
  c->methods[3] = (struct cm_rpc_method){"/psd.v1.Coord/Clock", on_clock, c};
  if (c->n > PSD_STEPS_MAX_WORKERS) {
    cm_error("coordinator: %d workers; at most %d are supported", c->n,
             PSD_STEPS_MAX_WORKERS);
    rc = CM_EINVAL;
    goto out;
  }
  if (!(c->w = calloc(c->n, sizeof *c->w)) ||
      !(c->ch = calloc(spec->nps, sizeof *c->ch))) {
    rc = CM_ENOMEM;
    goto out;
  }
  /* The coordinator calls the shards as a client does: the token, and with
   * TLS the CA (and with mutual TLS the client certificate). */
  if ((rc = cm_creds_load(&spec->auth, 0, &c->creds, err, sizeof err))) {
    cm_error("coordinator: %s", err);
    goto out;
  }
  for (int s = 0; s < spec->nps; s++)
    if ((rc = cm_channel_new(&c->ch[s], spec->ps[s].text, &c->creds)))
      goto out;
out:
  if (rc) {
    psd_coord_free(c);
    c = NULL;
  }
  *out = c;
  return rc;
}

void psd_coord_resume(struct psd_coord *c, uint64_t step) {
  pthread_mutex_lock(&c->lock);
  c->open = step;
  pthread_mutex_unlock(&c->lock);
}

int psd_coord_start(struct psd_coord *c) {
  if (pthread_create(&c->thread, NULL, commit_thread, c) != 0)
    return CM_ESYS;
  c->thread_started = 1;
  return 0;
}

void psd_coord_stop(struct psd_coord *c) {
  pthread_mutex_lock(&c->lock);
  c->stopping = 1;
  struct parked *lists[2] = {c->admits, c->clocks};
  c->admits = c->clocks = NULL;
  for (int i = 0; i < 2; i++)
    while (lists[i]) {
      struct parked *p = lists[i];
      lists[i] = p->next;
      cm_rpc_fail(p->call, GRPC_STATUS_UNAVAILABLE, "psd is shutting down");
      free(p);
    }
  pthread_cond_broadcast(&c->wake);
  pthread_mutex_unlock(&c->lock);
  if (c->thread_started) {
    pthread_join(c->thread, NULL);
    c->thread_started = 0;
  }
}

void psd_coord_free(struct psd_coord *c) {
  if (!c)
    return;
  psd_coord_stop(c);
  while (c->queue) {
    struct commit *cm = c->queue;
    c->queue = cm->next;
    free(cm);
  }
  for (int s = 0; c->ch && s < c->spec->nps; s++)
    cm_channel_free(c->ch[s]);
  free(c->ch);
  cm_creds_free(&c->creds);
  free(c->w);
  pthread_mutex_destroy(&c->lock);
  pthread_cond_destroy(&c->wake);
  free(c);
}

const struct cm_rpc_method *psd_coord_methods(struct psd_coord *c, int *n) {
  *n = 4;
  return c->methods;
}

void psd_coord_pushed(struct psd_coord *c, int worker) {
  if (worker < 0 || worker >= c->n)
    return;
  double now = cm_mono_ms();
  pthread_mutex_lock(&c->lock);
  c->w[worker].pushes++;
  time_step(&c->w[worker], now);
  pthread_mutex_unlock(&c->lock);
}

int psd_coord_workers(struct psd_coord *c, struct psd_worker_info *out,
                      int max) {
  double now = cm_mono_ms();
  pthread_mutex_lock(&c->lock);
  for (int i = 0; i < c->n && i < max; i++) {
    const struct worker *w = &c->w[i];
    struct psd_worker_info *o = &out[i];
    *o = (struct psd_worker_info){i,
                                  w->live,
                                  w->joined,
                                  w->applied,
                                  w->dropped,
                                  w->clock,
                                  w->joined ? now - w->last_seen : -1,
                                  w->joins};
    o->last_step = w->last_step;
    o->pushes = w->pushes;
    o->step_samples = w->nsteps < PSD_COORD_STEP_RING ? (unsigned)w->nsteps
                                                      : PSD_COORD_STEP_RING;
    ring_quantiles(w->steps, w->nsteps, &o->step_p50_ms, &o->step_p95_ms);
    ring_quantiles(w->lags, w->nlags, &o->lag_p50_ms, &o->lag_p95_ms);
    psd_hist_read(&w->step_hist, o->step_counts, &o->step_sum);
  }
  pthread_mutex_unlock(&c->lock);
  return c->n;
}

uint64_t psd_coord_max_spread(struct psd_coord *c) {
  pthread_mutex_lock(&c->lock);
  uint64_t s = c->max_spread;
  pthread_mutex_unlock(&c->lock);
  return s;
}
