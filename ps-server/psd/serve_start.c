/* A serving task's run (serve_start.h), as psd.c's main runs a training
 * shard's, but with nothing to restore and no checkpoint at the end: the
 * serving object (serve.h) over the spec's tables, the gRPC server with
 * its methods and the job's credentials, then libuv's loop on the main
 * thread with the stop signals, the systemd watchdog and the follower's
 * timer (a look at the publications every PSD_SERVE_POLL_MS; a publication
 * is applied on this thread while gRPC's answers Lookups on its own). */
#include "serve_start.h"

#include <stdio.h>
#include <string.h>

#include <uv.h>

#include "err.h"
#include "log.h"
#include "notify.h"
#include "pubfile.h"
#include "rand.h"
#include "rpc_server.h"
#include "serve.h"
#include "spec.h"
#include "startup.h"
#include "stopsig.h"

/* What the loop's callbacks need. */
struct run {
  struct psd_server *srv;  /* the daemon */
  struct psd_serve *serve; /* the serving task */
};

static void on_signal(uv_poll_t *h, int status, int events) {
  struct run *r = h->data;
  int hups, signum = psd_stopsig_take(&hups);
  (void)status;
  (void)events;
  if (hups)
    cm_info("SIGHUP: nothing to reload (the spec is read at start)");
  if (signum && !r->srv->stop_signal) {
    r->srv->stop_signal = signum;
    uv_stop(&r->srv->loop);
  }
}

static void on_poll(uv_timer_t *t) {
  struct run *r = t->data;
  psd_serve_poll(r->serve);
}

static void on_watchdog(uv_timer_t *t) {
  (void)t;
  cm_notify("WATCHDOG=1");
}

static void close_cb(uv_handle_t *h, void *arg) {
  (void)arg;
  if (!uv_is_closing(h))
    uv_close(h, NULL);
}

/* The serving object over the spec's tables, and who it is. */
static int make_serve(struct psd_server *srv, struct psd_serve **out) {
  const struct cm_job *job = &srv->spec->job;
  char dir[1200];
  psd_pub_dir(job->publish_dir, job->name, srv->shard, dir, sizeof dir);
  struct psd_serve_conf c = {
      .dir = dir,
      .job = job->name,
      .replica = srv->replica,
      .shard = srv->shard,
      .shards = srv->spec->nps,
      .job_shards = job->shards > 0 ? job->shards : srv->spec->nps,
      /* two intervals and a second: the new
         shard's next publication, read */
      .keep_left_ms = 2000 * job->publish_interval_s + 1000,
      .seed = job->seed,
      .tables = job->tables,
      .ntables = job->ntables,
      .defaults = &job->table_defaults,
      .max_message = (uint64_t)cm_rpc_max_message()};
  /* A serving task holds nothing a caller trained: no boot id to check. */
  srv->self =
      (struct cm_request_self){.shard = srv->shard,
                               .spec_fp = cm_spec_fingerprint(srv->spec),
                               .nps = srv->spec->nps,
                               .nworkers = srv->spec->nworker,
                               .boot = cm_random_id(srv),
                               .resumed = 1,
                               .ckpt_dir = ""};
  if (psd_serve_new(out, &c))
    return CM_ENOMEM;
  psd_serve_set_self(*out, &srv->self);
  return 0;
}

/* Listens on srv->listen with the serving methods. */
static enum psd_exit open_server(struct psd_server *srv,
                                 struct psd_serve *serve) {
  const struct cm_rpc_method *m;
  char err[512];
  int n, rc;
  m = psd_serve_methods(serve, &n);
  if ((rc = cm_server_new(&srv->rpc, srv->listen, m, n, &srv->creds, err,
                          sizeof err))) {
    cm_error("%s", err);
    if (rc == CM_EADDRINUSE)
      cm_error("is another psd (or another program) using that port? "
               "change cluster.serve[%d] in the spec or stop it",
               srv->replica);
    return PSD_EXIT_FAILED;
  }
  psd_serve_set_server(serve, srv->rpc);
  if (cm_server_start(srv->rpc)) {
    cm_error("cannot start the gRPC server");
    return PSD_EXIT_FAILED;
  }
  return PSD_EXIT_OK;
}

/* A stop signal came: new calls are answered UNAVAILABLE (clients retry
 * them, or go to another replica), the calls in flight finish. */
static void stop(struct psd_server *srv) {
  char why[160];
  int left;
  cm_notify("STOPPING=1");
  cm_info("%s: stopping (calls in flight get up to %d ms; new calls are "
          "answered UNAVAILABLE, which clients retry)",
          strsignal(srv->stop_signal), PSD_STOP_GRACE_MS);
  snprintf(why, sizeof why,
           "serve:%d is stopping (%s); retry, or ask another "
           "replica",
           srv->replica, strsignal(srv->stop_signal));
  cm_server_drain(srv->rpc, why);
  if ((left = cm_server_wait_idle(srv->rpc, PSD_STOP_GRACE_MS)) > 0)
    cm_warn("%d calls still unanswered after %d ms", left, PSD_STOP_GRACE_MS);
  cm_server_stop(srv->rpc, 1000);
}

enum psd_exit psd_serve_main(struct psd_server *srv) {
  struct run r = {.srv = srv};
  uv_timer_t poll, watchdog;
  uint64_t wd_usec = cm_notify_watchdog_usec();
  enum psd_exit rc;

  if (make_serve(srv, &r.serve)) {
    cm_error("out of memory");
    return PSD_EXIT_FAILED;
  }
  if ((rc = open_server(srv, r.serve)))
    goto out;
  uv_loop_init(&srv->loop);
  uv_poll_init(&srv->loop, &srv->signals, psd_stopsig_fd());
  srv->signals.data = &r;
  uv_poll_start(&srv->signals, UV_READABLE, on_signal);
  uv_timer_init(&srv->loop, &poll);
  poll.data = &r;
  uv_timer_start(&poll, on_poll, 0, PSD_SERVE_POLL_MS);
  uv_timer_init(&srv->loop, &watchdog);
  if (wd_usec > 0)
    uv_timer_start(&watchdog, on_watchdog, wd_usec / 2000, wd_usec / 2000);
  psd_server_log_security(srv);
  cm_info("ready: listening on %s, serve:%d of job '%s': shard %d of %d's "
          "publications in %s/%s/ps-%d, looked at every %d ms",
          srv->listen, srv->replica, srv->spec->job.name, srv->shard,
          srv->spec->nps, srv->spec->job.publish_dir, srv->spec->job.name,
          srv->shard, PSD_SERVE_POLL_MS);
  cm_notify("READY=1");
  uv_run(&srv->loop, UV_RUN_DEFAULT);
  stop(srv);
  uv_walk(&srv->loop, close_cb, NULL);
  uv_run(&srv->loop, UV_RUN_DEFAULT);
  uv_loop_close(&srv->loop);
  cm_info("stopped");
out:
  cm_server_free(srv->rpc);
  srv->rpc = NULL;
  psd_serve_free(r.serve);
  return rc;
}
