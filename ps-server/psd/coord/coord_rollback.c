/* Where a sync job is rolled back (coord_internal.h), on the commit thread.
 * A starting coordinator asks every shard for its step
 * (psd__coord_check_steps) and decides from their answers (psd__coord_plan)
 * whether the job goes on, stops because the shards resumed from different
 * checkpoints, or rolls back because the others ran on while shard 0 was
 * away; while no commit is being sent it watches for a shard that restarted
 * behind the others (psd__coord_watch_shards). A rollback
 * (psd__coord_rollback) sends Data/Rollback to every shard, then reopens
 * the step and tells every parked Admit. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "coord_internal.h"
#include "log.h"
#include "ps.pb-c.h"

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
void psd__coord_check_steps(struct psd_coord *c, struct cm_unary *calls,
                            int *done) {
  Psd__V1__Caller caller = psd_peer_caller(c->peers);
  Psd__V1__StatusRequest req = PSD__V1__STATUS_REQUEST__INIT;
  struct psd_coord_shard *st = calloc(c->nshards, sizeof *st);
  enum psd_coord_start plan = PSD_COORD_AGREE;
  uint64_t open, step = 0, from = 0, gen = 0;
  int left = c->nshards, stop = 0, culprit = 0;

  req.caller = &caller;
  memset(done, 0, c->nshards * sizeof *done);
  pthread_mutex_lock(&c->lock);
  open = c->open;
  pthread_mutex_unlock(&c->lock);
  while (st && left > 0 && !stop) {
    /* Waits for each channel to connect (within the deadline) rather than
     * failing at once while gRPC backs off reconnecting. */
    int n = psd_peer_call_all(c->peers, c->nshards, calls, done,
                              "/psd.v1.Admin/Status", &req.base, 1000, 1);
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
    stop = psd__coord_pause(c, left > 0 ? 200 : 0);
  }
  if (st && !stop) {
    plan = psd__coord_plan(st, c->nshards, open, &step, &culprit, &from, &gen);
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
    psd__coord_rollback(c, calls, done, step, from, who);
  }
  pthread_mutex_lock(&c->lock);
  stop |= c->stopping;
  for (int s = 0; plan == PSD_COORD_DIFFER && !stop && s < c->nshards; s++) {
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
    for (struct psd__coord_parked **pp = &c->admits; *pp;) {
      struct psd__coord_parked *p = *pp;
      *pp = p->next;
      cm_rpc_fail(p->call, GRPC_STATUS_FAILED_PRECONDITION, "%s", c->bad);
      free(p);
    }
  }
  c->checked = !stop;
  /* Admissions of workers that had not joined this coordinator waited for
   * the check (a rollback has answered them already). */
  for (struct psd__coord_parked **pp = &c->admits; c->checked && *pp;) {
    struct psd__coord_parked *p = *pp;
    if (!p->rejoin) {
      pp = &p->next;
      continue;
    }
    if (c->bad[0])
      cm_rpc_fail(p->call, GRPC_STATUS_FAILED_PRECONDITION, "%s", c->bad);
    else
      psd__coord_reply_redirect(c, p->call, p->value, 1);
    *pp = p->next;
    free(p);
  }
  if (c->checked && !c->bad[0])
    psd__coord_maybe_close(c, cm_mono_ms());
  pthread_mutex_unlock(&c->lock);
  free(st);
}

/* Asks shard s for its step and generation, waiting up to timeout_ms.
 * Returns 0, or -1 when it did not answer. */
int psd__coord_shard_step(struct psd_coord *c, struct cm_unary *call, int s,
                          int timeout_ms, uint64_t *step, uint64_t *gen) {
  Psd__V1__Caller caller = psd_peer_caller(c->peers);
  Psd__V1__StatusRequest req = PSD__V1__STATUS_REQUEST__INIT;
  int rc = -1;
  Psd__V1__StatusResponse *r = NULL;

  req.caller = &caller;
  if (s < 0 || s >= c->nshards)
    return -1;
  psd_peer_call(c->peers, s, "/psd.v1.Admin/Status", &req.base, timeout_ms, 0,
                call);
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

/* Whether a shard at version `at` with checkpoints of steps[0..n) can be
 * at step t after a rollback: it is there already, or reloads t. */
static int can_reach(uint64_t at, const uint64_t *steps, size_t n, uint64_t t) {
  if (at == t)
    return 1;
  for (size_t i = 0; i < n; i++)
    if (steps[i] == t)
      return 1;
  return 0;
}

/* The newest step <= want that every shard can roll back to (can_reach),
 * from one Status round; want itself when a shard does not answer (it is
 * tried as before) or no step is common. A shard stopped gracefully writes
 * a checkpoint of the step it stopped at, which the others need not have:
 * then the newest periodic one they share is taken. */
static uint64_t common_step(struct psd_coord *c, struct cm_unary *calls,
                            int *done, uint64_t want) {
  Psd__V1__Caller caller = psd_peer_caller(c->peers);
  Psd__V1__StatusRequest req = PSD__V1__STATUS_REQUEST__INIT;
  Psd__V1__StatusResponse **r = calloc(c->nshards, sizeof *r);
  uint64_t best = want;
  int n, all = 1;

  req.caller = &caller;
  memset(done, 0, c->nshards * sizeof *done);
  n = r ? psd_peer_call_all(c->peers, c->nshards, calls, done,
                            "/psd.v1.Admin/Status", &req.base,
                            c->spec->job.timeout_ms, 1)
        : 0;
  for (int i = 0; i < n; i++) {
    int s = (int)(intptr_t)calls[i].user;
    if (calls[i].status == GRPC_STATUS_OK)
      r[s] = (Psd__V1__StatusResponse *)cm_rpc_unpack(
          calls[i].response, &psd__v1__status_response__descriptor);
    all &= r[s] != NULL;
    cm_unary_release(&calls[i]);
  }
  for (int k = -1; all && n > 0; k++) {
    /* Candidates: want, then shard 0's checkpoints below it, newest first. */
    Psd__V1__CheckpointStatus *ck0 = r[0]->checkpoint;
    uint64_t t;
    int ok = 1;
    if (k >= 0 && (!ck0 || (size_t)k >= ck0->n_steps))
      break;
    t = k < 0 ? want : ck0->steps[k];
    if (t > want)
      continue;
    for (int s = 0; ok && s < c->nshards; s++) {
      Psd__V1__CheckpointStatus *ck = r[s]->checkpoint;
      ok =
          can_reach(r[s]->step, ck ? ck->steps : NULL, ck ? ck->n_steps : 0, t);
    }
    if (ok) {
      best = t;
      if (t < want)
        cm_warn("not every shard has a checkpoint of step %llu: rolling back "
                "to step %llu, the newest step all of them have",
                (unsigned long long)want, (unsigned long long)t);
      break;
    }
  }
  for (int s = 0; r && s < c->nshards; s++)
    if (r[s])
      psd__v1__status_response__free_unpacked(r[s], NULL);
  free(r);
  return best;
}

/* A rollback being sent: what its judge finds. */
struct rollback_round {
  int failed;    /* the first shard that cannot roll back, or -1 */
  char why[512]; /* its answer's details */
};

/* A shard that refuses the rollback (FAILED_PRECONDITION, INVALID_ARGUMENT:
 * it has no usable checkpoint of the step) stops the round; any other
 * failure is retried. */
static int rollback_refused(void *arg, int s, const struct cm_unary *call,
                            int attempt) {
  struct rollback_round *r = arg;
  if (call->status == GRPC_STATUS_FAILED_PRECONDITION ||
      call->status == GRPC_STATUS_INVALID_ARGUMENT) {
    if (r->failed < 0) {
      r->failed = s;
      snprintf(r->why, sizeof r->why, "%s", call->details);
    }
    return 1;
  }
  return 0;
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
void psd__coord_rollback(struct psd_coord *c, struct cm_unary *calls, int *done,
                         uint64_t step, uint64_t from, const char *who) {
  Psd__V1__Caller caller = psd_peer_caller(c->peers);
  Psd__V1__RollbackRequest req = PSD__V1__ROLLBACK_REQUEST__INIT;
  struct rollback_round r = {.failed = -1};

  step = common_step(c, calls, done, step);
  pthread_mutex_lock(&c->lock);
  if (c->open > from)
    from = c->open;
  if (c->committed > from)
    from = c->committed;
  c->rolling = 1;
  /* Steps decided and not yet sent are redone. */
  while (c->queue) {
    struct psd__coord_commit *cm = c->queue;
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

  req.caller = &caller;
  req.step = step;
  memset(done, 0, c->nshards * sizeof *done);
  char what[64];
  int left;
  snprintf(what, sizeof what, "rollback to step %llu on",
           (unsigned long long)step);
  struct psd_peer_rounds rounds =
      psd__coord_rounds(c, what, rollback_refused, &r);
  if (psd_peer_call_until_all(c->peers, c->nshards, calls, done,
                              "/psd.v1.Data/Rollback", &req.base, &rounds,
                              &left))
    return;

  pthread_mutex_lock(&c->lock);
  c->rolling = 0;
  if (r.failed >= 0) {
    snprintf(c->bad, sizeof c->bad,
             "cannot roll the job back to step %llu (%s): ps:%d has no usable "
             "checkpoint of step %llu (%s); restart every shard with "
             "--resume-step N, N the newest step all of them have",
             (unsigned long long)step, who, r.failed, (unsigned long long)step,
             r.why);
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
    struct psd__coord_parked *p = c->admits;
    c->admits = p->next;
    if (r.failed >= 0)
      cm_rpc_fail(p->call, GRPC_STATUS_FAILED_PRECONDITION, "%s", c->bad);
    else
      psd__coord_reply_redirect(c, p->call, p->value, 0);
    free(p);
  }
  pthread_mutex_unlock(&c->lock);
}

/* Sync, while no commit is being sent: a shard behind the steps every shard
 * committed, or of an older generation, restarted from a checkpoint; the
 * job rolls back to the oldest such step. Shards that do not answer at
 * once are skipped (they may be restarting). */
void psd__coord_watch_shards(struct psd_coord *c, struct cm_unary *calls,
                             int *done) {
  uint64_t committed, gen, step = UINT64_MAX;
  int culprit = -1;
  pthread_mutex_lock(&c->lock);
  committed = c->committed;
  gen = c->gen;
  int go = c->checked && !c->bad[0] && !c->stopping;
  pthread_mutex_unlock(&c->lock);
  for (int s = 0; go && s < c->nshards; s++) {
    uint64_t st, g;
    if (psd__coord_shard_step(c, calls, s, 500, &st, &g))
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
    psd__coord_rollback(c, calls, done, step, 0, who);
  }
}
