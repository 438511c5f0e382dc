/* The coordinator's commit thread (coord_internal.h): where each sync step
 * closed by the barrier (coord_barrier.c) is sent to every shard as
 * Data/Commit, retried until each has it, and, in async mode, nothing but a
 * wait for psd to stop. A shard that refuses a commit because it restarted
 * from an older checkpoint, or one found behind while the thread is idle,
 * makes the job roll back (coord_rollback.c). It runs on a thread of its own
 * so that no handler ever waits on the network. How a call is sent to
 * every shard until all answer (psd__coord_rounds, over peer.h's
 * psd_peer_call_until_all) is here, for the rollback too. */
#include <errno.h>
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

/* How often an idle commit thread asks the shards for their steps (sync). */
#define WATCH_MS 300

int psd__coord_pause(struct psd_coord *c, int ms) {
  int stop;
  pthread_mutex_lock(&c->lock);
  if (ms > 0 && !c->stopping) {
    struct timespec until = cm_abstime_after_ms(ms);
    pthread_cond_timedwait(&c->wake, &c->lock, &until);
  }
  stop = c->stopping;
  pthread_mutex_unlock(&c->lock);
  return stop;
}

/* psd__coord_pause as the rounds' pause (peer.h). */
static int rounds_pause(void *c, int ms) { return psd__coord_pause(c, ms); }

struct psd_peer_rounds psd__coord_rounds(struct psd_coord *c, const char *what,
                                         psd_peer_judge judge, void *arg) {
  return (struct psd_peer_rounds){.what = what,
                                  .timeout_ms = c->spec->job.timeout_ms,
                                  .retry_ms = PSD__COORD_RETRY_MS,
                                  .judge = judge,
                                  .judge_arg = arg,
                                  .pause = rounds_pause,
                                  .pause_arg = c};
}

/* A commit being sent: what its judge needs and finds. */
struct commit_round {
  uint64_t step; /* the step being committed */
  int behind;    /* the first shard that refused it, or -1 */
};

/* A shard that refuses the commit (FAILED_PRECONDITION) restarted from an
 * older checkpoint, or at this step without the gradients staged before:
 * the round stops there to find out. Any other failure is retried. */
static int commit_refused(void *arg, int s, const struct cm_unary *call,
                          int attempt) {
  struct commit_round *r = arg;
  if (call->status == GRPC_STATUS_FAILED_PRECONDITION && r->behind < 0) {
    r->behind = s;
    if (attempt % 10 == 0)
      cm_warn("commit of step %llu to ps:%d refused: %s",
              (unsigned long long)r->step, s, call->details);
    return 1;
  }
  return 0;
}

/* Sync, job.publish: whether the commit about to be sent carries publish
 * (every interval_s; the first one does), so that every shard publishes
 * that step (publish.h). */
static int publish_now(struct psd_coord *c) {
  const struct cm_job *job = &c->spec->job;
  double now = cm_mono_ms();
  if (!job->publish_dir[0] || now < c->publish_due)
    return 0;
  c->publish_due = now + job->publish_interval_s * 1000;
  return 1;
}

/* Sends each decided step to every shard, retrying a shard that does not
 * answer (it may be restarting) until it does or psd stops. */
void *psd__coord_commit_thread(void *arg) {
  struct psd_coord *c = arg;
  struct cm_unary *calls = calloc(c->nshards, sizeof *calls);
  int *done = calloc(c->nshards, sizeof *done);
  if (c->sync)
    psd__coord_check_steps(c, calls, done);
  pthread_mutex_lock(&c->lock);
  c->committed = c->open;
  for (;;) {
    while (!c->queue && !c->stopping) {
      struct timespec until = cm_abstime_after_ms(WATCH_MS);
      if (pthread_cond_timedwait(&c->wake, &c->lock, &until) == ETIMEDOUT &&
          c->sync && !c->queue && !c->stopping) {
        pthread_mutex_unlock(&c->lock);
        psd__coord_watch_shards(c, calls, done);
        pthread_mutex_lock(&c->lock);
      }
    }
    if (c->stopping)
      break;
    struct psd__coord_commit *cm = c->queue;
    c->queue = cm->next;
    if (!c->queue)
      c->tail = &c->queue;
    pthread_mutex_unlock(&c->lock);

    Psd__V1__Caller caller = psd_peer_caller(c->peers);
    Psd__V1__CommitRequest req = PSD__V1__COMMIT_REQUEST__INIT;
    int32_t a[PSD_STEPS_MAX_WORKERS], d[PSD_STEPS_MAX_WORKERS];
    for (int i = 0; i < cm->napplied; i++)
      a[i] = cm->applied[i];
    for (int i = 0; i < cm->ndropped; i++)
      d[i] = cm->dropped[i];
    req.caller = &caller;
    req.step = cm->step;
    req.n_applied = cm->napplied;
    req.applied = a;
    req.n_dropped = cm->ndropped;
    req.dropped = d;
    req.checkpoint = cm->checkpoint;
    req.publish = publish_now(c);
    memset(done, 0, c->nshards * sizeof *done);
    struct commit_round r = {.step = cm->step, .behind = -1};
    char what[64];
    int left;
    snprintf(what, sizeof what, "commit of step %llu to",
             (unsigned long long)cm->step);
    struct psd_peer_rounds rounds =
        psd__coord_rounds(c, what, commit_refused, &r);
    for (;;) {
      /* Done when every shard has it, or psd stops; a shard that refused
       * it is asked for its step after the usual wait. */
      if (psd_peer_call_until_all(c->peers, c->nshards, calls, done,
                                  "/psd.v1.Data/Commit", &req.base, &rounds,
                                  &left) ||
          r.behind < 0 || psd__coord_pause(c, PSD__COORD_RETRY_MS))
        break;
      uint64_t st, g;
      struct cm_unary one;
      memset(&one, 0, sizeof one);
      if (psd__coord_shard_step(c, &one, r.behind, c->spec->job.timeout_ms, &st,
                                &g) ||
          st > cm->step) {
        r.behind = -1; /* not a restart: retried as before */
        continue;
      }
      char who[96];
      snprintf(who, sizeof who,
               "ps:%d restarted from its checkpoint of step %llu", r.behind,
               (unsigned long long)st);
      psd__coord_rollback(c, calls, done, st, 0, who);
      break;
    }
    if (r.behind < 0 && left == 0) {
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
