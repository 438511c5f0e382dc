/* psd: one parameter-server shard.
 *
 * main reads top to bottom: pick the BLAS kernels, parse the command line
 * and the cluster spec (cmdline.c), restore the store from its newest
 * checkpoint and open the server (startup.c), listen, tell systemd we are
 * ready, run the event loop, tear down. The daemon's state is one struct
 * psd_server (psd.h), passed explicitly. gRPC's completion queue runs on
 * its own thread (common/rpc/rpc_server.c); libuv's loop on the main thread
 * carries what waits outside gRPC: signals, the periodic stats line and the
 * systemd watchdog. Its handlers are here. With job.metrics_listen,
 * libmicrohttpd serves GET /metrics from a thread of its own (metrics.h).
 *
 * Checkpoints (ckpt.h, saver.h): the store, and in async mode the table of
 * applied pushes (dedup.h), are restored from the newest checkpoint before
 * psd listens, a thread of the saver's writes the periodic and asked-for
 * ones, and teardown writes a last one once no call is in flight. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <uv.h>

#include "auth.h"
#include "blas.h"
#include "ckpt.h"
#include "cmdline.h"
#include "coord.h"
#include "dedup.h"
#include "done.h"
#include "live.h"
#include "local.h"
#include "log.h"
#include "move.h"
#include "notify.h"
#include "psd.h"
#include "publish.h"
#include "rpc.h"
#include "rpc_server.h"
#include "saver.h"
#include "serve_start.h"
#include "service.h"
#include "spec.h"
#include "startup.h"
#include "stopsig.h"
#include "store.h"
#include "switch.h"
#include "tables.h"
#include "units.h"

/* The stop signals' pipe is readable (stopsig.h): SIGHUP is only logged;
 * SIGTERM or SIGINT stops the loop, the first time. */
static void on_signal(uv_poll_t *h, int status, int events) {
  struct psd_server *srv = h->data;
  int hups, signum = psd_stopsig_take(&hups);
  (void)status;
  (void)events;
  if (hups)
    cm_info("SIGHUP: nothing to reload (the spec is read at start)");
  if (signum && !srv->stop_signal) {
    srv->stop_signal = signum;
    uv_stop(&srv->loop);
  }
}

static void on_stats(uv_timer_t *t) {
  struct psd_server *srv = t->data;
  struct psd_counters c;
  psd_service_counters(srv->service, &c);
  if (c.pulls == srv->last.pulls && c.pushes == srv->last.pushes &&
      c.errors == srv->last.errors)
    return;
  double secs = PSD_STATS_PERIOD_MS / 1000.0;
  char nonfinite[64] = "";
  if (c.nonfinite)
    snprintf(nonfinite, sizeof nonfinite, ", %llu pushes with NaN or Inf",
             (unsigned long long)c.nonfinite);
  cm_info("%d variables; last %.0fs: %.1f pulls/s %.1f pushes/s %.1f MB/s in "
          "%.1f MB/s out; %llu errors in all%s",
          psd_store_count(srv->store), secs, (c.pulls - srv->last.pulls) / secs,
          (c.pushes - srv->last.pushes) / secs,
          (c.bytes_in - srv->last.bytes_in) / secs / 1e6,
          (c.bytes_out - srv->last.bytes_out) / secs / 1e6,
          (unsigned long long)c.errors, nonfinite);
  srv->last = c;
}

static void on_watchdog(uv_timer_t *t) { cm_notify("WATCHDOG=1"); }

/* Tells systemd what the shard is doing, e.g. "STATUS=shard 0 of 2 on
 * 10.0.0.1:7100, job 'x', sync, step 120, 4 of 4 workers live, 1.2k
 * pushes/s" (systemctl status shows it). The step is the shard's committed
 * steps in sync mode and the worker steps it has applied in async mode; only
 * the coordinator (shard 0) knows the live workers. The rate covers the time
 * since the previous update. */
static void notify_status(struct psd_server *srv) {
  struct psd_counters c;
  struct psd_worker_info *w = NULL;
  char line[512], rate[32], workers[48] = "";
  uint64_t now = uv_now(&srv->loop);
  double secs = (now - srv->status_at) / 1000.0;

  psd_service_counters(srv->service, &c);
  cm_fmt_count(secs > 0 ? (c.pushes - srv->status_last.pushes) / secs : 0, rate,
               sizeof rate);
  if (srv->coord && srv->spec->nworker > 0 &&
      (w = calloc(srv->spec->nworker, sizeof *w))) {
    int n = psd_coord_workers(srv->coord, w, srv->spec->nworker), live = 0;
    for (int i = 0; i < n && i < srv->spec->nworker; i++)
      live += w[i].live;
    snprintf(workers, sizeof workers, ", %d of %d workers live", live,
             srv->spec->nworker);
  }
  snprintf(line, sizeof line,
           "STATUS=shard %d of %d on %s, job '%s', %s, step %llu%s, %s "
           "pushes/s",
           srv->shard, srv->spec->nps, srv->listen, srv->spec->job.name,
           srv->spec->job.mode, (unsigned long long)c.step, workers, rate);
  cm_notify(line);
  srv->status_last = c;
  srv->status_at = now;
  free(w);
}

static void on_status_timer(uv_timer_t *t) { notify_status(t->data); }

static void on_tick(uv_timer_t *t) {
  struct psd_server *srv = t->data;
  psd_coord_tick(srv->coord);
}

/* Starts the loop's watchers: the stop signals, the stats line, the
 * coordinator's tick (shard 0), and under systemd the watchdog and STATUS=
 * timers. */
static void start_loop(struct psd_server *srv) {
  uint64_t wd_usec = cm_notify_watchdog_usec();
  /* A signal that came before the loop ran waits in the pipe: the loop's
   * first turn stops gracefully (final checkpoint included). */
  uv_poll_init(&srv->loop, &srv->signals, psd_stopsig_fd());
  srv->signals.data = srv;
  uv_poll_start(&srv->signals, UV_READABLE, on_signal);
  uv_timer_init(&srv->loop, &srv->stats);
  srv->stats.data = srv;
  uv_timer_start(&srv->stats, on_stats, PSD_STATS_PERIOD_MS,
                 PSD_STATS_PERIOD_MS);
  uv_timer_init(&srv->loop, &srv->watchdog);
  srv->watchdog.data = srv;
  uv_timer_init(&srv->loop, &srv->tick);
  srv->tick.data = srv;
  uv_timer_init(&srv->loop, &srv->status);
  srv->status.data = srv;
  srv->status_at = uv_now(&srv->loop);
  if (srv->coord)
    uv_timer_start(&srv->tick, on_tick, PSD_TICK_MS, PSD_TICK_MS);
  if (srv->spec->job.exit_when_done && psd_done_start(srv) < 0)
    cm_warn("job.exit_when_done: cannot watch the workers; this shard will "
            "not stop by itself");
  if (wd_usec > 0)
    uv_timer_start(&srv->watchdog, on_watchdog, wd_usec / 2000, wd_usec / 2000);
  /* Only systemd reads STATUS=; elsewhere the timer would be wasted. */
  if (cm_notify_listening())
    uv_timer_start(&srv->status, on_status_timer, PSD_STATUS_PERIOD_MS,
                   PSD_STATUS_PERIOD_MS);
}

static void close_cb(uv_handle_t *h, void *arg) {
  if (!uv_is_closing(h))
    uv_close(h, NULL);
}

/* The checkpoint at exit, once no call is in flight. Returns PSD_EXIT_OK, or
 * PSD_EXIT_FAILED when it failed (reported). */
static enum psd_exit final_checkpoint(struct psd_server *srv) {
  struct psd_ckpt_result r;
  char err[4096];
  int rc;
  if (!srv->saver)
    return PSD_EXIT_OK;
  rc = psd_saver_final(srv->saver, &r, err, sizeof err);
  if (rc == 1)
    cm_info("no checkpoint written at exit (no checkpoint dir)");
  return rc < 0 ? PSD_EXIT_FAILED : PSD_EXIT_OK;
}

/* Names the log after the shard and says which BLAS kernels run. */
static void log_start(struct psd_server *srv) {
  char name[64], blas[256];
  if (srv->serving)
    snprintf(name, sizeof name, "psd serve:%d", srv->replica);
  else
    snprintf(name, sizeof name, "psd ps:%d", srv->shard);
  cm_log_set_name(name);
  kn_blas_describe(blas, sizeof blas);
  cm_info("%s", blas);
}

/* Once the loop has returned (a stop signal): a graceful stop. The
 * coordinator finishes the commit it is sending, then every new call is
 * answered UNAVAILABLE (clients retry it until the shard is back), the
 * parked calls are answered the same way, the calls in flight finish, and
 * only then is the final checkpoint written: it holds every push the shard
 * acknowledged. Last, gRPC shuts down. Returns the exit status. */
static enum psd_exit shut_down(struct psd_server *srv) {
  enum psd_exit rc;
  char why[160];
  int left, live = psd_live_pending(srv->live);
  const char *reason = live ? "resharding" : strsignal(srv->stop_signal);
  /* A reshard's stop is followed by the same process starting again. */
  cm_notify(live ? "RELOADING=1" : "STOPPING=1");
  psd_local_stop(srv->local);
  srv->local = NULL;
  psd_metrics_stop(srv->metrics);
  srv->metrics = NULL;
  cm_info("%s: stopping (calls in flight get up to %d ms; new calls are "
          "answered UNAVAILABLE, which clients retry)",
          reason, PSD_STOP_GRACE_MS);
  if (srv->coord)
    psd_coord_stop(srv->coord);
  /* A live move ps:0 drives ends after its batch under way, while the
   * shards it moves between (this one too) still answer. */
  psd_live_stop_move(srv->live);
  snprintf(why, sizeof why, "ps:%d is stopping (%s); retry until it is back",
           srv->shard, reason);
  cm_server_drain(srv->rpc, why);
  /* Parked calls would hold the stop: answer them (UNAVAILABLE) now. */
  psd_service_stop(srv->service);
  psd_saver_stop(srv->saver);
  if (srv->publisher)
    psd_publisher_stop(srv->publisher);
  if ((left = cm_server_wait_idle(srv->rpc, PSD_STOP_GRACE_MS)) > 0)
    cm_warn("%d calls still unanswered after %d ms", left, PSD_STOP_GRACE_MS);
  /* No handler runs now: the final checkpoint is the shard's state. */
  rc = final_checkpoint(srv);
  cm_server_stop(srv->rpc, 1000);
  uv_walk(&srv->loop, close_cb, NULL);
  uv_run(&srv->loop, UV_RUN_DEFAULT);
  uv_loop_close(&srv->loop);
  cm_info("stopped");
  return rc;
}

/* Frees what srv owns, however far startup got. */
static void free_server(struct psd_server *srv) {
  psd_done_free(srv);
  psd_live_free(srv->live);
  psd_move_free(srv->move);       /* joins a move's thread, which uses the
                                     service */
  psd_switch_free(srv->switcher); /* likewise a switch's phase */
  psd_metrics_stop(srv->metrics);
  cm_server_free(srv->rpc);
  psd_coord_free(srv->coord);
  psd_saver_free(srv->saver);
  psd_publisher_free(srv->publisher);
  psd_service_free(srv->service);
  psd_dedup_free(srv->dedup);
  psd_store_free(srv->store);
  psd_tables_free(srv->tables);
  cm_creds_free(&srv->creds);
  psd_ckpt_free(srv->ckpt);
  cm_spec_free(srv->spec);
}

int main(int argc, char **argv) {
  struct psd_server srv;
  enum psd_config cfg;
  enum psd_exit rc;
  int loop_open = 0; /* srv.loop is initialised and not closed */

  /* First, before anything touches OpenBLAS: kn_blas_init may re-execute
   * the program once, with OPENBLAS_CORETYPE set, when the kernels OpenBLAS
   * loaded are narrower than the CPU's (kernels/blas.h). */
  kn_blas_init(argv, 1);
  /* A closed stdout or stderr (a launcher or pipe that went away) must not
   * kill the shard: writes then fail, and are ignored. */
  signal(SIGPIPE, SIG_IGN);
  if (psd_stopsig_init() < 0) {
    cm_error("cannot catch stop signals: %s", strerror(errno));
    return PSD_EXIT_FAILED;
  }
  memset(&srv, 0, sizeof srv);
  cm_log_set_name("psd");

  /* Parse the command line and the cluster spec, and check them. */
  cfg = psd_server_configure(&srv, argc, argv);
  if (cfg == PSD_CONFIG_RESHARD) {
    rc = psd_server_reshard(&srv);
    cm_spec_free(srv.spec);
    return rc;
  }
  if (cfg != PSD_CONFIG_RUN) {
    cm_spec_free(srv.spec);
    return cfg == PSD_CONFIG_HELP ? PSD_EXIT_OK : PSD_EXIT_USAGE;
  }
  log_start(&srv);
  cm_rpc_global_init();
  /* Before any server or channel exists: they take the limit when made. */
  cm_rpc_set_max_message((long long)srv.spec->job.max_message_mb << 20);
  /* A serving task (serve:J) runs a setup of its own (serve_start.h). */
  if (srv.serving) {
    rc = psd_serve_main(&srv);
    goto out;
  }

  /* Open the store, restored from its newest checkpoint, and listen. */
  uv_loop_init(&srv.loop);
  loop_open = 1;
  rc = psd_server_restore(&srv);
  if (rc)
    goto out;
  rc = psd_server_open(&srv);
  if (rc)
    goto out;
  rc = psd_server_start_metrics(&srv);
  if (rc)
    goto out;
  start_loop(&srv);
  psd_server_start_local(&srv);
  psd_server_log_ready(&srv);

  /* Tell systemd, run until a stop signal, tear down. */
  cm_notify("READY=1");
  notify_status(&srv);
  uv_run(&srv.loop, UV_RUN_DEFAULT);
  rc = shut_down(&srv);
  loop_open = 0; /* shut_down closed it */
  /* A live reshard stopped it: cut or wait, then run again (live.h). */
  if (psd_live_pending(srv.live))
    rc = psd_live_finish(srv.live, rc, argv);
out:
  if (loop_open) { /* startup failed: its handles (live.h's) closed */
    uv_walk(&srv.loop, close_cb, NULL);
    uv_run(&srv.loop, UV_RUN_DEFAULT);
    uv_loop_close(&srv.loop);
  }
  free_server(&srv);
  cm_rpc_global_shutdown();
  return rc;
}
