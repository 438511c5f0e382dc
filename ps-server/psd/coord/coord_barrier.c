/* The coordinator's barrier (coord.h, coord_internal.h): the calls it
 * answers. Join and Heartbeat keep membership; Admit counts a worker into
 * the open sync step, and this is where that step closes (close_step), when
 * k workers are in or at the deadline once m are; Clock holds an async worker
 * that runs too far ahead of the slowest (SSP). psd_coord_tick acts on time:
 * deadlines, and workers declared dead. Closed steps are queued for the
 * commit thread (coord_commit.c); every parked call is answered by a
 * decision, never by a sleeping thread. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "coord_internal.h"
#include "err.h"
#include "log.h"
#include "ps.pb-c.h"

/* Least time the start barrier waits for every worker's first join. */
#define START_WINDOW_MS 10000.0

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
    double t[PSD__COORD_RECENT_STEPS];
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

void psd__coord_reply_redirect(struct psd_coord *c, struct cm_rpc_call *call,
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
  struct psd__coord_commit *cm = calloc(1, sizeof *cm);
  double now = cm_mono_ms();
  uint64_t t = c->open;

  if (!cm) {
    cm_error("coordinator: out of memory closing step %llu",
             (unsigned long long)t);
    return;
  }
  cm->step = t;
  if (c->cut_armed && c->cut_step == t) {
    cm->checkpoint = 1;
    c->cut_armed = 0;
  }
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
  for (struct psd__coord_parked **pp = &c->admits; *pp;) {
    struct psd__coord_parked *p = *pp;
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
    c->recent[c->nrecent < PSD__COORD_RECENT_STEPS
                  ? c->nrecent
                  : (int)(t % PSD__COORD_RECENT_STEPS)] = now - c->last_close;
    if (c->nrecent < PSD__COORD_RECENT_STEPS)
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
void psd__coord_maybe_close(struct psd_coord *c, double now) {
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
  for (struct psd__coord_parked **pp = &c->clocks; *pp;) {
    struct psd__coord_parked *p = *pp;
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

/* Keeps what a leaving worker reported for the job's rate, placed on this
 * coordinator's clock: its last step ended ended_s_ago before now, and its
 * first began train_s before that. A report that makes no sense (negative,
 * or no time at all) is ignored rather than let it skew the rate. Caller
 * holds the lock. */
static void took_report(struct psd__coord_worker *w,
                        const Psd__V1__JoinRequest *req) {
  double now = cm_mono_ms();
  if (req->train_s <= 0 || req->ended_s_ago < 0 ||
      req->ended_s_ago * 1000.0 > now)
    return;
  w->examples = req->examples;
  w->last_ms = now - req->ended_s_ago * 1000.0;
  w->first_ms = w->last_ms - req->train_s * 1000.0;
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
    struct psd__coord_worker *w = &c->w[req->worker];
    if (req->leave) {
      if (w->live)
        cm_info("worker:%d left the job", req->worker);
      w->live = 0;
      w->left = 1;
      took_report(w, req);
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
      psd__coord_maybe_close(c, cm_mono_ms());
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
    if (req->windows) { /* a worker on a stream: its window scores */
      c->w[req->worker].windows = req->windows;
      c->w[req->worker].window_auc = req->window_auc;
      c->w[req->worker].window_logloss = req->window_logloss;
    }
    cm_debug("heartbeat from worker:%d%s", req->worker,
             rejoin ? ", answered \"join again\"" : "");
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
  if (c->stopping) {
    /* Stopped: psd_coord_stop answered the parked ones; none parks now. */
    cm_rpc_fail(call, GRPC_STATUS_UNAVAILABLE, "psd is shutting down");
  } else if (!c->sync) {
    cm_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION,
                "Admit: job '%s' is asynchronous; only sync jobs have steps",
                c->spec->job.name);
  } else if (c->bad[0]) {
    cm_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION, "%s", c->bad);
  } else if (seen(c, call, req->worker, "Admit") == 0) {
    struct psd__coord_worker *w = &c->w[req->worker];
    struct psd__coord_parked *p;
    if (c->rolling && (p = calloc(1, sizeof *p))) {
      /* Answered once every shard has rolled back. */
      *p = (struct psd__coord_parked){call, req->worker, req->step, 0,
                                      c->admits};
      c->admits = p;
    } else if (req->gen < c->gen) {
      psd__coord_time_step(w, cm_mono_ms());
      psd__coord_reply_redirect(c, call, req->step, 0);
    } else if (!w->joined && !c->checked && (p = calloc(1, sizeof *p))) {
      /* This coordinator restarted since the worker joined, and is still
       * finding out where the shards are: the answer waits for that (a
       * rollback, or "join again" at the step it opens). */
      *p = (struct psd__coord_parked){call, req->worker, req->step, 1,
                                      c->admits};
      c->admits = p;
    } else if (!w->joined || w->must_rejoin) {
      /* Restarted since it joined, or declared dead since (a sync worker's
       * heartbeats leave the join to its training thread: psclient's
       * coord.c): it joins again, and goes on from the step Join says. */
      psd__coord_reply_redirect(c, call, req->step, 1);
    } else if (!w->live) {
      cm_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION,
                  "Admit: worker:%d is not live (declared dead or left); "
                  "Join again",
                  req->worker);
    } else if (req->step < c->open) {
      /* Too late: the step closed without it (counted at the close). */
      psd__coord_time_step(w, cm_mono_ms());
      w->last_step = req->step;
      reply_admit(call, 0, req->step, NULL, 0, c->open);
    } else if (req->step > c->open) {
      cm_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION,
                  "Admit: step %llu is not open yet (open: %llu)",
                  (unsigned long long)req->step, (unsigned long long)c->open);
    } else {
      struct psd__coord_parked *p = calloc(1, sizeof *p);
      if (!p) {
        cm_rpc_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
      } else {
        double now = cm_mono_ms();
        if (!w->arrived) {
          psd__coord_time_step(w, now);
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
        *p = (struct psd__coord_parked){call, req->worker, req->step, 0,
                                        c->admits};
        c->admits = p;
        psd__coord_maybe_close(c, now);
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
  if (c->stopping) {
    cm_rpc_fail(call, GRPC_STATUS_UNAVAILABLE, "psd is shutting down");
  } else if (req->clock > PSD_COORD_MAX_CLOCK) {
    cm_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT,
                "Clock: worker %d reports clock %llu; a clock counts a "
                "worker's pushes and is at most 2^48",
                req->worker, (unsigned long long)req->clock);
  } else if (seen(c, call, req->worker, "Clock") == 0) {
    struct psd__coord_parked *p = calloc(1, sizeof *p);
    c->w[req->worker].clock = req->clock;
    if (!p) {
      cm_rpc_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    } else if (c->staleness < 0) {
      free(p);
      Psd__V1__ClockResponse r = PSD__V1__CLOCK_RESPONSE__INIT;
      cm_rpc_reply(call, cm_rpc_pack(&r.base));
    } else {
      *p = (struct psd__coord_parked){call, req->worker, req->clock, 0,
                                      c->clocks};
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
    struct psd__coord_worker *w = &c->w[i];
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
    psd__coord_maybe_close(c, now);
  else if (changed || c->clocks)
    check_clocks(c);
  pthread_mutex_unlock(&c->lock);
}

void psd__coord_init_methods(struct psd_coord *c) {
  c->methods[0] = (struct cm_rpc_method){"/psd.v1.Coord/Join", on_join, c};
  c->methods[1] =
      (struct cm_rpc_method){"/psd.v1.Coord/Heartbeat", on_heartbeat, c};
  c->methods[2] = (struct cm_rpc_method){"/psd.v1.Coord/Admit", on_admit, c};
  c->methods[3] = (struct cm_rpc_method){"/psd.v1.Coord/Clock", on_clock, c};
}

int psd_coord_cut(struct psd_coord *c, uint64_t *step, char *err, size_t len) {
  int rc = 0, live = 0;
  pthread_mutex_lock(&c->lock);
  for (int i = 0; i < c->n; i++)
    live += c->w[i].live;
  if (!c->sync) {
    snprintf(err, len,
             "the job is asynchronous: each shard checkpoints on its own");
    rc = CM_EINVAL;
  } else if (c->rolling || !c->checked || c->bad[0]) {
    snprintf(err, len, "%s",
             c->bad[0] ? c->bad
                       : "the coordinator is checking or rolling back the "
                         "shards' steps; try again in a moment");
    rc = CM_EUNAVAIL;
  } else if (!live) {
    *step = c->committed;
  } else {
    c->cut_armed = 1;
    c->cut_step = c->open;
    *step = c->open + 1;
  }
  pthread_mutex_unlock(&c->lock);
  if (!rc)
    cm_info("checkpoint cut: every shard writes step %llu%s",
            (unsigned long long)*step,
            live ? " when it commits it" : " now (no worker is live)");
  return rc;
}

uint64_t psd_coord_open_step(struct psd_coord *c, int *live) {
  uint64_t open;
  pthread_mutex_lock(&c->lock);
  open = c->open;
  *live = live_count(c);
  pthread_mutex_unlock(&c->lock);
  return open;
}

int psd_coord_wait_committed(struct psd_coord *c, uint64_t version, int ms) {
  double until = cm_mono_ms() + ms;
  int done = 0, stop = 0;
  while (!done && !stop && cm_mono_ms() < until) {
    pthread_mutex_lock(&c->lock);
    done = c->committed >= version;
    stop = c->stopping;
    pthread_mutex_unlock(&c->lock);
    if (!done && !stop)
      usleep(10 * 1000);
  }
  return done;
}

int psd_coord_members(struct psd_coord *c, char *buf, size_t len) {
  size_t at = 0;
  int n = 0;
  buf[0] = 0;
  pthread_mutex_lock(&c->lock);
  for (int i = 0; i < c->n && at + 12 < len; i++)
    if (c->w[i].joined && c->w[i].live && !c->w[i].must_rejoin) {
      at += (size_t)snprintf(buf + at, len - at, "%s%d", n ? "," : "", i);
      n++;
    }
  pthread_mutex_unlock(&c->lock);
  return n;
}

void psd_coord_adopt(struct psd_coord *c, const char *list) {
  char *end;
  int n = 0;
  pthread_mutex_lock(&c->lock);
  for (const char *p = list; *p;) {
    long i = strtol(p, &end, 10);
    if (end == p)
      break;
    if (i >= 0 && i < c->n) {
      c->w[i].joined = 1;
      c->w[i].live = 1;
      c->w[i].last_seen = cm_mono_ms();
      n++;
    }
    p = *end == ',' ? end + 1 : end;
  }
  if (n && c->started == 0)
    c->started = cm_mono_ms();
  pthread_mutex_unlock(&c->lock);
  if (n)
    cm_info("the %d worker%s joined before the reshard stay%s joined: %s", n,
            n == 1 ? "" : "s", n == 1 ? "s" : "", list);
}
