/* The coordinator's calls (psclient.h, "synchronous steps and clocks"):
 * Join, Leave, Admit and Clock to shard 0, each retried like a transfer's
 * calls while the coordinator is unreachable (it may be restarting), and
 * the heartbeat thread that psc__client_join starts, on a channel of its own,
 * which joins again when the coordinator says it does not count this
 * worker. Here too the sync rollback and rejoin state that answers leave
 * for psc__client_rolled_back and psc__client_rejoined. */
#include "client_internal.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "err.h"
#include "log.h"

/* An answer said the job rolled back to `step`, generation gen: remembered
 * for psc__client_rolled_back (the newest generation wins). */
void psc__saw_rollback(struct psc__client *c, uint64_t gen, uint64_t step) {
  if (gen < c->gen)
    return;
  if (gen > c->gen || !c->rolled_back) {
    c->gen = gen;
    c->rolled_back = 1;
    c->rollback_step = step;
  }
}

/* One call to the coordinator (shard 0), retried like a transfer's calls
 * while the coordinator is unreachable (it may be restarting); unpacks the
 * answer into *out (NULL to ignore it). Sent without wait_for_ready, so
 * that a coordinator that cannot be reached is said at once, with the
 * cause, rather than after the call's deadline. */
static int coord_call(struct psc__client *c, const char *method,
                      const ProtobufCMessage *req, int timeout_ms,
                      const ProtobufCMessageDescriptor *desc,
                      ProtobufCMessage **out) {
  const char *what = method + sizeof "/psd.v1.Coord/" - 1;
  unsigned char down[1] = {1};
  struct cm_unary u;
  int rc;
  memset(&u, 0, sizeof u);
  for (int attempt = 0;; attempt++) {
    u.channel = c->ch[0];
    u.method = method;
    u.request = cm_rpc_pack(req);
    if (attempt > 0)
      c->stats.retries++;
    rc = psc__run(c, &u, 1, what, timeout_ms, 0, NULL, NULL);
    c->stats.calls++;
    if (!rc) {
      psc__shard_up(c, 0);
      break;
    }
    c->stats.failed++;
    if (!psc__retryable(u.status))
      break;
    psc__shard_down(c, 0, &u);
    psc__back_to_tcp(c, &u, 1);
    cm_unary_release(&u);
    memset(&u, 0, sizeof u);
    if ((rc = psc__retry_wait(c, down, 1, attempt + 1, what)))
      break;
  }
  if (!rc && out) {
    if (!(*out = cm_rpc_unpack(u.response, desc))) {
      psc__seterr(c, "%s: malformed answer from ps:0", method);
      rc = CM_EPROTO;
    }
  }
  cm_unary_release(&u);
  return rc;
}

/* One call of method carrying msg on ch, without retries (the heartbeat
 * thread's own channel): fills *u (release it with cm_unary_release) and
 * returns the answer unpacked as desc (free it with
 * protobuf_c_message_free_unpacked), or NULL when the call failed (u says
 * how) or the answer is not valid protobuf. */
static ProtobufCMessage *call_once(struct cm_channel *ch, const char *method,
                                   const ProtobufCMessage *msg, int timeout_ms,
                                   const ProtobufCMessageDescriptor *desc,
                                   struct cm_unary *u) {
  struct cm_run_opts o = {.timeout_ms = timeout_ms, .inflight = 1};
  memset(u, 0, sizeof *u);
  u->channel = ch;
  u->method = method;
  u->request = cm_rpc_pack(msg);
  cm_client_run(u, 1, &o);
  return u->status == GRPC_STATUS_OK ? cm_rpc_unpack(u->response, desc) : NULL;
}

/* Joins again on the heartbeat thread's channel, when the coordinator said
 * it does not count this worker (it restarted, or declared it dead). */
static void rejoin(struct psc__client *c, struct cm_channel *ch) {
  Psd__V1__Caller caller = psc__caller(c, 0);
  Psd__V1__JoinRequest req = PSD__V1__JOIN_REQUEST__INIT;
  Psd__V1__JoinResponse *resp;
  struct cm_unary u;
  req.caller = &caller;
  req.worker = c->windex;
  resp = (Psd__V1__JoinResponse *)call_once(
      ch, "/psd.v1.Coord/Join", &req.base, c->o.timeout_ms,
      &psd__v1__join_response__descriptor, &u);
  if (resp)
    cm_info("worker:%d joined the job again at step %llu (the coordinator "
            "had restarted or declared it dead); %d workers live",
            c->windex, (unsigned long long)resp->step, resp->live);
  else
    cm_warn("worker:%d: joining again failed: %s: %s (the next heartbeat "
            "retries)",
            c->windex, cm_rpc_status_name(u.status), u.details);
  if (resp)
    psd__v1__join_response__free_unpacked(resp, NULL);
  cm_unary_release(&u);
}

/* Sends heartbeats until psc__client_free; a missed one is only logged by
 * the coordinator's silence timer, never fatal here. An answer that says
 * the coordinator does not count this worker makes it join again. A sync
 * worker's Admit tells the coordinator that it is alive as a heartbeat does
 * (and its answer says "join again" where a heartbeat's would), so while
 * Admits come at least every hb_ms the heartbeat is not sent: with n
 * workers a step's heartbeats would grow as n times the step time, itself
 * growing with n. One is sent hb_ms after the last Admit sent, as while an
 * Admit waits for the other workers, and after Leave. */
static void *heartbeat_thread(void *arg) {
  struct psc__client *c = arg;
  struct cm_channel *ch = NULL;
  Psd__V1__Caller caller = psc__caller(c, 0);
  Psd__V1__HeartbeatRequest req = PSD__V1__HEARTBEAT_REQUEST__INIT;
  req.caller = &caller;
  req.worker = c->windex;
  if (cm_channel_new(&ch, c->spec->ps[0].text, &c->creds))
    return NULL;
  pthread_mutex_lock(&c->lock);
  while (!c->hb_stop) {
    double due = c->hb_heard + c->hb_ms;
    if (c->hb_heard > 0 && cm_mono_ms() < due) {
      /* Heard from at an Admit: wait until a heartbeat is due after it. */
      struct timespec until =
          cm_abstime_after_ms((long)(due - cm_mono_ms()) + 1);
      while (!c->hb_stop &&
             pthread_cond_timedwait(&c->cond, &c->lock, &until) != ETIMEDOUT) {
      }
      continue;
    }
    req.windows = c->win_n;
    req.window_auc = c->win_auc;
    req.window_logloss = c->win_ll;
    pthread_mutex_unlock(&c->lock);
    struct cm_unary u;
    Psd__V1__HeartbeatResponse *resp = (Psd__V1__HeartbeatResponse *)call_once(
        ch, "/psd.v1.Coord/Heartbeat", &req.base, c->hb_ms * 2,
        &psd__v1__heartbeat_response__descriptor, &u);
    /* A sync worker joins again from its training thread, at its next
     * Admit (psc__client_admit), whether the coordinator restarted or
     * declared it dead: to learn the step and generation to go on from
     * (joining here would count it in steps it is not in yet), and since
     * while it admits steps it sends no heartbeats. */
    if (resp && resp->rejoin && strcmp(c->spec->job.mode, "sync") != 0) {
      pthread_mutex_lock(&c->lock);
      int go = !c->left && !c->hb_stop;
      pthread_mutex_unlock(&c->lock);
      if (go)
        rejoin(c, ch);
    }
    if (resp)
      psd__v1__heartbeat_response__free_unpacked(resp, NULL);
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

void psc__client_set_window(struct psc__client *c, uint64_t windows, double auc,
                            double logloss) {
  pthread_mutex_lock(&c->lock);
  c->win_n = windows;
  c->win_auc = auc;
  c->win_ll = logloss;
  pthread_mutex_unlock(&c->lock);
}

int psc__client_join(struct psc__client *c, int worker, int heartbeat_ms,
                     uint64_t *step) {
  Psd__V1__Caller caller = psc__caller(c, 0);
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

int psc__client_leave(struct psc__client *c, uint64_t examples, double train_s,
                      double ended_s_ago) {
  pthread_mutex_lock(&c->lock);
  c->left = 1; /* the heartbeat thread must not join again */
  pthread_mutex_unlock(&c->lock);
  Psd__V1__Caller caller = psc__caller(c, 0);
  Psd__V1__JoinRequest req = PSD__V1__JOIN_REQUEST__INIT;
  req.caller = &caller;
  req.worker = c->windex;
  req.leave = 1;
  req.examples = examples;
  req.train_s = train_s;
  req.ended_s_ago = ended_s_ago;
  return coord_call(c, "/psd.v1.Coord/Join", &req.base, c->o.timeout_ms, NULL,
                    NULL);
}

int psc__client_admit(struct psc__client *c, uint64_t step, int *admitted,
                      uint64_t *next_step) {
  Psd__V1__Caller caller = psc__caller(c, 0);
  Psd__V1__AdmitRequest req = PSD__V1__ADMIT_REQUEST__INIT;
  Psd__V1__AdmitResponse *resp = NULL;
  req.caller = &caller;
  req.worker = c->windex;
  req.step = step;
  req.gen = c->gen;
  double sent = cm_mono_ms();
  int rc = coord_call(c, "/psd.v1.Coord/Admit", &req.base, c->o.timeout_ms,
                      &psd__v1__admit_response__descriptor,
                      (ProtobufCMessage **)&resp);
  if (rc)
    return rc;
  if (!resp->rejoin) {
    /* It arrived at `sent` or later: the heartbeat waits from then. */
    pthread_mutex_lock(&c->lock);
    c->hb_heard = sent;
    pthread_mutex_unlock(&c->lock);
  }
  *admitted = resp->admitted;
  *next_step = resp->next_step;
  if (resp->rolled_back)
    psc__saw_rollback(c, resp->gen, resp->next_step);
  if (resp->rejoin) {
    /* The coordinator restarted since this worker joined, or declared it
     * dead since: join again and go on from the step it opens, in its
     * generation. */
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

int psc__client_rejoined(struct psc__client *c, uint64_t *step) {
  if (!c->rejoined)
    return 0;
  c->rejoined = 0;
  *step = c->rejoin_step;
  return 1;
}

int psc__client_rolled_back(struct psc__client *c, uint64_t *step) {
  if (!c->rolled_back)
    return 0;
  c->rolled_back = 0;
  *step = c->rollback_step;
  return 1;
}

uint64_t psc__client_gen(const struct psc__client *c) { return c->gen; }

int psc__client_clock(struct psc__client *c, uint64_t clock) {
  Psd__V1__Caller caller = psc__caller(c, 0);
  Psd__V1__ClockRequest req = PSD__V1__CLOCK_REQUEST__INIT;
  req.caller = &caller;
  req.worker = c->windex;
  req.clock = clock;
  return coord_call(c, "/psd.v1.Coord/Clock", &req.base, c->o.timeout_ms, NULL,
                    NULL);
}
