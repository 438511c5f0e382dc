/* psd_done_start (done.h): the shard watches the job's workers through
 * ps:0's status, as pslaunch does for the ps tasks it launched
 * (deploy/pslaunch/watch.c), and stops once none is left to serve. The
 * status call (peer.h, psd's one way to call a shard) blocks, so it runs
 * on libuv's thread pool, one at a time; the loop thread reads the answer,
 * as the status document libpsclient's callers read (status_json.h), and
 * judges each worker with pslaunch's rule (psc__worker_judge, the one
 * copy both keep to). */
#include "done.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "log.h"
#include "peer.h"
#include "psclient.h"
#include "psd.h"
#include "rpc.h"
#include "status_json.h"

/* How often ps:0 is asked, ms. */
#define DONE_EVERY_MS 1000
/* Each ask's deadline, ms. */
#define DONE_CALL_MS 5000

/* The watch's state, one per shard (srv->done). */
struct psd_done {
  struct psd_server *srv;  /* the shard */
  struct psd_peers *peers; /* owned: its calls to ps:0 */
  uv_timer_t timer;        /* asks every DONE_EVERY_MS */
  uv_work_t work;          /* the ask in flight on the thread pool */
  int busy;                /* 1 while work is queued */
  json_t *status;          /* the answer (owned), NULL when it failed */
  int said_waiting;        /* the wait was logged */
  int all_left;            /* the last answer: every worker had left */
};

/* On the thread pool: ps:0's Status as the status document. */
static void ask(uv_work_t *req) {
  struct psd_done *d = req->data;
  Psd__V1__Caller caller = psd_peer_caller(d->peers);
  Psd__V1__StatusRequest sreq = PSD__V1__STATUS_REQUEST__INIT;
  Psd__V1__StatusResponse *resp = NULL;
  struct cm_unary u;

  d->status = NULL;
  sreq.caller = &caller;
  psd_peer_call(d->peers, 0, "/psd.v1.Admin/Status", &sreq.base, DONE_CALL_MS,
                0, &u);
  if (u.status == GRPC_STATUS_OK &&
      (resp = (Psd__V1__StatusResponse *)cm_rpc_unpack(
           u.response, &psd__v1__status_response__descriptor)))
    d->status = cm_status_json(resp);
  if (resp)
    psd__v1__status_response__free_unpacked(resp, NULL);
  cm_unary_release(&u);
}

/* Whether every worker of the spec finished or is gone (1), or has at
 * least left (2: worker 0 still pulls the final values), else 0. */
static int all_done(struct psd_done *d, json_t *root) {
  const struct cm_spec *spec = d->srv->spec;
  int done = 1;
  for (int i = 0; i < spec->nworker; i++) {
    enum psc__worker_state s =
        psc__worker_judge(root, i, spec->job.heartbeat_ms);
    if (s == PSC__W_FINISHING)
      done = 2;
    else if (s != PSC__W_FINISHED && s != PSC__W_DEAD)
      return 0;
  }
  return spec->nworker > 0 ? done : 0;
}

/* Stops the shard as SIGTERM would. */
static void stop(struct psd_done *d, const char *why) {
  cm_info("%s (job.exit_when_done): stopping", why);
  d->srv->stop_signal = SIGTERM;
  uv_stop(&d->srv->loop);
}

static void asked(uv_work_t *req, int status) {
  struct psd_done *d = req->data;
  json_t *root = d->status;
  d->busy = 0;
  d->status = NULL;
  int done = status == 0 && root ? all_done(d, root) : -1;
  if (done == 1) {
    stop(d, "every worker of the job has finished or is gone");
  } else if (done < 0 && d->all_left) {
    /* Every worker had left, and now ps:0 is gone: it stopped because the
     * job is over (its own watch, or its launcher). */
    stop(d, "every worker had left the job and ps:0 stopped");
  } else if (!d->said_waiting) {
    cm_info("job.exit_when_done: this shard stops once every worker of the "
            "job has finished");
    d->said_waiting = 1;
  }
  if (done >= 0)
    d->all_left = done > 0;
  json_decref(root);
}

static void on_timer(uv_timer_t *t) {
  struct psd_done *d = t->data;
  if (d->busy)
    return;
  d->busy = 1;
  d->work.data = d;
  if (uv_queue_work(&d->srv->loop, &d->work, ask, asked) != 0)
    d->busy = 0;
}

int psd_done_start(struct psd_server *srv) {
  struct psd_done *d = calloc(1, sizeof *d);
  char err[512];
  int rc;
  if (!d)
    return -1;
  d->srv = srv;
  if ((rc = psd_peers_new(&d->peers, srv->spec,
                          &(struct psd_peer_opts){.who = "exit_when_done"}, err,
                          sizeof err))) {
    cm_error("job.exit_when_done: %s", err);
    free(d);
    return rc;
  }
  uv_timer_init(&srv->loop, &d->timer);
  d->timer.data = d;
  uv_timer_start(&d->timer, on_timer, DONE_EVERY_MS, DONE_EVERY_MS);
  srv->done = d;
  return 0;
}

void psd_done_free(struct psd_server *srv) {
  struct psd_done *d = srv->done;
  if (!d)
    return;
  psd_peers_free(d->peers);
  free(d);
  srv->done = NULL;
}
