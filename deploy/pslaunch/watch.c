/* Waiting for the cluster's other workers. A launcher that runs only part of
 * a spec (one host of several, or --only ps) must not stop its shards while
 * workers it did not start still train on them. Once its own workers are
 * done, it asks the coordinator (ps:0, wherever it runs) for the workers'
 * state every PL_WATCH_EVERY_MS, says what it waits for, and stops its ps
 * tasks once every worker of the spec has finished or is gone.
 *
 * A worker counts as finished once it has left the job (Join with leave)
 * and then gone silent: worker 0 leaves before it pulls the final
 * parameters, and its heartbeats go on until it lets go of its client, so
 * silence means it no longer needs the shards. A worker the coordinator
 * declared dead (silent for job.dead_after_ms without leaving) is gone: a
 * launcher waiting for it would wait forever. A worker that has not joined
 * yet is waited for.
 *
 * libpsclient's calls block, so each ask runs on libuv's thread pool, one
 * at a time, with a client of its own (pslaunch_internal.h says why); the
 * loop thread reads the answer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "err.h"
#include "psclient.h"
#include "pslaunch_internal.h"
#include "rpc.h"

/* Asks in a row that must fail before the failure is reported (one may
 * meet a shard still starting), and how often it is said again while it
 * lasts. */
#define FAILS_BEFORE_SAYING 2
#define SAY_AGAIN_MS 10000

/* Words for a state in the "waiting for" line. */
static const char *state_words(enum pl_worker_state s) {
  switch (s) {
  case PL_W_NOT_JOINED:
    return "not joined yet";
  case PL_W_TRAINING:
    return "training";
  case PL_W_FINISHING:
    return "leaving";
  default:
    return "?";
  }
}

/* 1 when worker i is one this launcher ran (and so, here, saw exit 0). */
static int is_mine(const struct pl_launch *l, int i) {
  for (int k = 0; k < l->ntasks; k++)
    if (l->tasks[k].type == CM_TASK_WORKER && l->tasks[k].index == i)
      return 1;
  return 0;
}

int pl_ask_status(const struct pl_launch *l, int timeout_ms, char **json,
                  char *err, size_t len) {
  struct psc__client_opts o = {
      .worker = "pslaunch", .timeout_ms = timeout_ms, .retry_s = -1};
  struct psc__client *c = NULL;
  int rc;

  *json = NULL;
  err[0] = '\0';
  rc = psc__client_new(&c, l->spec, &o);
  if (rc == 0)
    rc = psc__client_status(c, 0, json);
  if (rc < 0 && c && *psc__client_error(c))
    snprintf(err, len, "%s", psc__client_error(c));
  else if (rc < 0)
    snprintf(err, len, "status to ps:0 (%s) failed: %s", l->spec->ps[0].text,
             cm_strerror(rc));
  psc__client_free(c);
  return rc;
}

/* On the thread pool: one Status call to ps:0. Short deadlines, no
 * retries: the ask is repeated anyway, and a Ctrl-C waits for the one in
 * flight. */
static void ask(uv_work_t *req) {
  struct pl_launch *l = req->data;
  struct pl_watch *w = &l->watch;
  w->rc =
      pl_ask_status(l, PL_WATCH_DEADLINE_MS, &w->json, w->err, sizeof w->err);
}

/* What the coordinator's status says of worker i (psc__worker_judge). */
static enum pl_worker_state judge(const struct pl_launch *l, json_t *root,
                                  int i) {
  switch (psc__worker_judge(root, i, l->spec->job.heartbeat_ms)) {
  case PSC__W_TRAINING:
    return PL_W_TRAINING;
  case PSC__W_FINISHING:
    return PL_W_FINISHING;
  case PSC__W_FINISHED:
    return PL_W_FINISHED;
  case PSC__W_DEAD:
    return PL_W_DEAD;
  default:
    return PL_W_NOT_JOINED;
  }
}

/* Reads ps:0's answer: says which workers finished or died since the last
 * one, then either stops the ps tasks (nobody left to wait for) or prints
 * what it still waits for, when that changed. */
static void take_answer(struct pl_launch *l, json_t *root) {
  struct pl_watch *w = &l->watch;
  json_t *workers = json_object_get(root, "workers"), *e;
  char line[sizeof w->said];
  size_t k, len = 0;
  int waiting = 0, leaving = 1;

  for (int i = 0; i < l->spec->nworker; i++) {
    json_t *entry = NULL;
    enum pl_worker_state s;

    json_array_foreach(workers, k, e) {
      if (json_integer_value(json_object_get(e, "worker")) == i)
        entry = e;
    }
    s = is_mine(l, i) ? PL_W_MINE : judge(l, root, i);
    if (s != w->state[i] && s == PL_W_FINISHED)
      pl_say("worker:%d finished (it left the job)", i);
    if (s != w->state[i] && s == PL_W_DEAD)
      pl_say("worker:%d was declared dead by ps:0 (not heard from for %.1f s; "
             "job.dead_after_ms %d) and has not come back; not waiting for it",
             i, json_number_value(json_object_get(entry, "last_seen_ms")) / 1e3,
             l->spec->job.dead_after_ms);
    w->state[i] = s;
    if (s == PL_W_MINE || s == PL_W_FINISHED || s == PL_W_DEAD)
      continue;
    leaving &= s == PL_W_FINISHING;
    if (len < sizeof line)
      len +=
          (size_t)snprintf(line + len, sizeof line - len, "%sworker:%d (%s)",
                           waiting ? ", " : "waiting for ", i, state_words(s));
    waiting++;
  }
  w->answered = 1;
  w->all_leaving = leaving;
  if (!waiting) {
    pl_job_rate_print(l, root);
    pl_say("every worker of the cluster has finished or is gone%s",
           l->opt->export_dir ? "" : "; stopping the ps tasks");
    pl_job_done(l);
    return;
  }
  if (len < sizeof line)
    snprintf(line + len, sizeof line - len,
             " to finish; Ctrl-C stops the shards now");
  if (strcmp(line, w->said) != 0) {
    pl_say("%s", line);
    snprintf(w->said, sizeof w->said, "%s", line);
  }
}

/* ps:0 did not answer. Once every worker had left, a coordinator that goes
 * away was stopped because the job is over (by the launcher on its host);
 * else the failure is reported now and then, and the asking goes on. */
static void take_failure(struct pl_launch *l) {
  struct pl_watch *w = &l->watch;

  w->fails++;
  if (w->answered && w->all_leaving && w->fails >= FAILS_BEFORE_SAYING) {
    pl_say("ps:0 no longer answers (%s), and every worker had left the job; "
           "stopping the ps tasks",
           w->err);
    pl_job_done(l); /* an export asked for fails, saying so */
    return;
  }
  if (w->fails < FAILS_BEFORE_SAYING ||
      (w->fails > FAILS_BEFORE_SAYING &&
       uv_now(&l->loop) - w->said_fail_at < SAY_AGAIN_MS))
    return;
  w->said_fail_at = uv_now(&l->loop);
  pl_say("waiting for the cluster's workers to finish, but ps:0 does not "
         "answer: %s; asking again every %d ms; Ctrl-C stops the shards now",
         w->err, PL_WATCH_EVERY_MS);
}

/* Back on the loop thread with the ask's result. */
static void asked(uv_work_t *req, int status) {
  struct pl_launch *l = req->data;
  struct pl_watch *w = &l->watch;
  json_t *root = NULL;

  w->busy = 0;
  if (l->stopping || status < 0)
    goto out;
  if (w->rc < 0) {
    take_failure(l);
    goto out;
  }
  if (w->fails >= FAILS_BEFORE_SAYING) {
    pl_say("ps:0 (%s) answers again", l->spec->ps[0].text);
    w->said[0] = '\0'; /* say again what is waited for */
  }
  w->fails = 0;
  root = json_loads(w->json, 0, NULL);
  if (!root) {
    pl_say("ps:0's status could not be read; asking again");
    goto out;
  }
  take_answer(l, root);
out:
  json_decref(root);
  free(w->json);
  w->json = NULL;
}

/* The timer: one ask at a time, none once the stop has begun. */
static void on_timer(uv_timer_t *h) {
  struct pl_launch *l = h->data;
  struct pl_watch *w = &l->watch;
  int rc;

  if (l->stopping) {
    uv_timer_stop(h);
    return;
  }
  if (w->busy)
    return;
  w->work.data = l;
  rc = uv_queue_work(&l->loop, &w->work, ask, asked);
  if (rc < 0)
    pl_say("cannot ask ps:0: %s", uv_strerror(rc));
  else
    w->busy = 1;
}

int pl_watch_start(struct pl_launch *l) {
  struct pl_watch *w = &l->watch;
  struct psc__client *c = NULL;
  int rc;

  if (w->active)
    return 0;
  w->state = calloc((size_t)l->spec->nworker, sizeof *w->state);
  if (!w->state) {
    pl_say("cannot wait for the cluster's other workers: out of memory");
    return CM_ENOMEM;
  }
  /* A client that cannot be made now (credentials) never will be: say so
   * once, here, rather than at every ask. */
  if ((rc = psc__client_new(&c, l->spec, NULL)) < 0) {
    pl_say("cannot ask ps:0 (%s) about the cluster's other workers: %s",
           l->spec->ps[0].text, cm_strerror(rc));
    return rc;
  }
  psc__client_free(c);
  /* gRPC stays initialised between the asks' clients. */
  cm_rpc_global_init();
  uv_timer_init(&l->loop, &w->timer);
  w->timer.data = l;
  w->active = 1;
  uv_timer_start(&w->timer, on_timer, 0, PL_WATCH_EVERY_MS);
  return 0;
}

void pl_watch_close(struct pl_launch *l) {
  if (l->watch.active)
    uv_close((uv_handle_t *)&l->watch.timer, NULL);
}

void pl_watch_free(struct pl_launch *l) {
  if (l->watch.active)
    cm_rpc_global_shutdown();
  free(l->watch.state);
  l->watch.state = NULL;
}
