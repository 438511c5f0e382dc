/* psd: one parameter-server shard.
 *
 * main reads top to bottom: pick the BLAS kernels, parse the command line,
 * load and check the cluster spec, open the store, listen, tell systemd we
 * are ready, run the event loop, tear down. gRPC's completion queue runs on
 * its own thread (common/rpc/rpc.c); libuv's loop on the main thread carries
 * what waits outside gRPC: signals, the periodic stats line and the systemd
 * watchdog.
 *
 * Checkpoints (ckpt.h, saver.h): the store, and in async mode the table of
 * applied pushes (dedup.h), are restored from the newest checkpoint before
 * psd listens, a thread of the saver's writes the periodic and asked-for
 * ones, and teardown writes a last one once no call is in flight. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <uv.h>

#include "psd_config.h"
#if PSD_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

#include "auth.h"
#include "blas.h"
#include "ckpt.h"
#include "coord.h"
#include "dedup.h"
#include "endpoint.h"
#include "err.h"
#include "local.h"
#include "log.h"
#include "rpc.h"
#include "saver.h"
#include "service.h"
#include "spec.h"
#include "store.h"
#include "units.h"

/* Seconds between stats lines while there is traffic. */
#define STATS_PERIOD_MS 10000
/* How often the coordinator checks step deadlines and heartbeats. */
#define TICK_MS 10
/* How long calls in flight may take to finish on SIGTERM. */
#define STOP_GRACE_MS 5000
/* How often systemd's STATUS= line is refreshed (under systemd only). */
#define STATUS_PERIOD_MS 2000

/* The daemon's state, passed explicitly. */
struct psd_server {
  struct cm_spec *spec;        /* owned cluster spec */
  int shard;                   /* this shard's index */
  char listen[300];            /* address served */
  char unix_path[200];         /* Unix socket also served, "" when none */
  struct psd_local *local;     /* owned Unix socket listener, or NULL */
  struct cm_creds creds;       /* owned: token and TLS from the spec auth */
  struct psd_store *store;     /* owned variables */
  struct psd_service *service; /* owned gRPC handlers */
  struct psd_coord *coord;     /* owned coordinator, shard 0 only */
  struct cm_rpc_method methods[16];    /* served: data, admin, coordinator */
  struct cm_server *rpc;               /* owned gRPC server */
  uv_loop_t loop;                      /* signals and timers */
  uv_signal_t sigterm, sigint, sighup; /* signal watchers */
  uv_timer_t stats;                    /* periodic stats line */
  uv_timer_t watchdog;                 /* systemd watchdog pings */
  uv_timer_t tick;                     /* coordinator deadlines, heartbeats */
  uv_timer_t status;                   /* systemd STATUS= refreshes */
  struct psd_counters last;            /* counters at the previous stats line */
  struct psd_counters status_last;     /* counters at the previous STATUS= */
  uint64_t status_at;                  /* uv_now() of the previous STATUS= */
  int stop_signal; /* the signal that asked us to stop, or 0 */

  /* Checkpoints. */
  char ckpt_root[1024];          /* --checkpoint-dir, "" when not given */
  struct psd_ckpt *ckpt;         /* owned; NULL when checkpoints are off */
  struct psd_saver *saver;       /* owned checkpoint policy and thread */
  struct psd_ckpt_result resume; /* the checkpoint restored (step 0: none) */
  struct psd_dedup *dedup;       /* owned: the restored checkpoint's table of
                                    applied pushes, until the service takes it
                                    (then NULL) */
  int has_resume_step;           /* --resume-step given */
  uint64_t resume_step;          /* its value */
};

static void usage(FILE *f) {
  fprintf(
      f,
      "usage: psd --cluster FILE [--task ps:I] [--listen HOST:PORT]\n"
      "           [--checkpoint-dir DIR] [--resume-step N]\n"
      "\n"
      "Runs shard I of a psd job: holds its slices of the job's variables\n"
      "in memory and applies the workers' pushes with each variable's\n"
      "optimizer (sgd, momentum, nesterov, adagrad, adam or adamw, with a\n"
      "learning-rate schedule: the spec's job.optimizer and\n"
      "job.optimizer_overrides).\n"
      "\n"
      "  --cluster FILE     the cluster spec (JSON, TF_CONFIG-shaped; see\n"
      "                     deploy/examples/local.json)\n"
      "  --task ps:I        which shard this is; else the spec's \"task\" or\n"
      "                     the TF_CONFIG environment variable\n"
      "  --listen HOST:PORT listen here instead of cluster.ps[I] (e.g.\n"
      "                     0.0.0.0:7100 behind NAT); workers still dial the\n"
      "                     spec's address\n"
      "  --checkpoint-dir DIR  checkpoint under DIR/<job>/ps-I instead of\n"
      "                     the spec's job.checkpoint.dir (else\n"
      "                     $STATE_DIRECTORY; else checkpoints are off)\n"
      "  --resume-step N    resume from the newest checkpoint at or below\n"
      "                     step N (sync: give every shard the same N when\n"
      "                     their newest differ); newer ones are renamed\n"
      "                     superseded-ckpt-*\n"
      "  -h, --help         this text\n"
      "\n"
      "psd logs \"ready: listening on ...\" once it serves, after restoring\n"
      "its newest checkpoint. Run as a systemd Type=notify unit it then sends\n"
      "READY=1, a STATUS= line (shard, job, mode, step, live workers,\n"
      "pushes/s) refreshed every %d s, WATCHDOG=1 at half of WatchdogSec=,\n"
      "and STOPPING=1 when asked to stop. SIGTERM or SIGINT stop it\n"
      "gracefully (calls in flight finish, up to %d s), then it writes a\n"
      "final checkpoint.\n"
      "\n"
      "Exit status: 0 stopped by a signal, 1 could not start (port in use,\n"
      "out of memory, no checkpoint that verifies) or the final checkpoint\n"
      "failed, 2 bad command line or cluster spec.\n",
      STATUS_PERIOD_MS / 1000, STOP_GRACE_MS / 1000);
}

static void notify(const char *state) {
#if PSD_HAVE_SYSTEMD
  sd_notify(0, state);
#else
  (void)state;
#endif
}

static void on_signal(uv_signal_t *h, int signum) {
  struct psd_server *srv = h->data;
  if (signum == SIGHUP) {
    cm_info("SIGHUP: nothing to reload (the spec is read at start)");
    return;
  }
  srv->stop_signal = signum;
  uv_stop(&srv->loop);
}

static void on_stats(uv_timer_t *t) {
  struct psd_server *srv = t->data;
  struct psd_counters c;
  psd_service_counters(srv->service, &c);
  if (c.pulls == srv->last.pulls && c.pushes == srv->last.pushes &&
      c.errors == srv->last.errors)
    return;
  double secs = STATS_PERIOD_MS / 1000.0;
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

static void on_watchdog(uv_timer_t *t) { notify("WATCHDOG=1"); }

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
  notify(line);
  srv->status_last = c;
  srv->status_at = now;
  free(w);
}

static void on_status_timer(uv_timer_t *t) { notify_status(t->data); }

static void on_tick(uv_timer_t *t) {
  struct psd_server *srv = t->data;
  psd_coord_tick(srv->coord);
}

/* Parses the command line and the spec. Returns 0, or 2 for usage errors
 * (already reported), or 3 for --help. */
static int configure(struct psd_server *srv, int argc, char **argv) {
  static const struct option opts[] = {
      {"cluster", required_argument, 0, 'c'},
      {"task", required_argument, 0, 't'},
      {"listen", required_argument, 0, 'l'},
      {"checkpoint-dir", required_argument, 0, 'k'},
      {"resume-step", required_argument, 0, 'r'},
      {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  const char *cluster = NULL, *task = NULL, *listen = NULL;
  char err[8192];
  int c;

  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (c) {
    case 'c':
      cluster = optarg;
      break;
    case 't':
      task = optarg;
      break;
    case 'l':
      listen = optarg;
      break;
    case 'k':
      if (!optarg[0] || strlen(optarg) >= sizeof srv->ckpt_root) {
        fprintf(stderr,
                "psd: --checkpoint-dir: expected a path of 1..%zu "
                "characters\n",
                sizeof srv->ckpt_root - 1);
        return 2;
      }
      snprintf(srv->ckpt_root, sizeof srv->ckpt_root, "%s", optarg);
      break;
    case 'r': {
      char *end;
      errno = 0;
      srv->resume_step = strtoull(optarg, &end, 10);
      if (!optarg[0] || *end || errno || optarg[0] == '-') {
        fprintf(stderr, "psd: --resume-step %s: expected a step number\n",
                optarg);
        return 2;
      }
      srv->has_resume_step = 1;
      break;
    }
    case 'h':
      usage(stdout);
      return 3;
    default:
      usage(stderr);
      return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "psd: unexpected argument '%s' (see psd --help)\n",
            argv[optind]);
    return 2;
  }
  if (!cluster) {
    fprintf(stderr, "psd: --cluster FILE is required (see psd --help)\n");
    return 2;
  }
  if (cm_spec_load(cluster, &srv->spec, err, sizeof err) ||
      cm_spec_resolve_task(srv->spec, task, err, sizeof err)) {
    fprintf(stderr, "psd: %s\n", err);
    return 2;
  }
  if (srv->spec->task.type != CM_TASK_PS) {
    fprintf(stderr, "psd: task %s:%d is not a ps task; psd runs ps:I\n",
            cm_task_type_name(srv->spec->task.type), srv->spec->task.index);
    return 2;
  }
  if (cm_creds_load(&srv->spec->auth, 1, &srv->creds, err, sizeof err)) {
    fprintf(stderr, "psd: %s\n", err);
    return 2;
  }
  srv->shard = srv->spec->task.index;
  snprintf(srv->listen, sizeof srv->listen, "%s",
           listen ? listen : srv->spec->ps[srv->shard].text);
  return 0;
}

/* Serves the job's Unix socket too, so that clients on this host skip TCP
 * (common/rpc/endpoint.h). Not being able to is a warning: TCP serves. */
static void start_local(struct psd_server *srv) {
  char path[200], why[300];

  if (!srv->spec->job.unix_sockets)
    return;
  if (srv->creds.tls) {
    cm_info("no Unix socket: TLS is on, and gRPC runs no TLS over a socket "
            "handed to it; clients on this host use TCP");
    return;
  }
  if (cm_endpoint_unix_path(srv->spec->job.name, &srv->spec->ps[srv->shard],
                            path, sizeof path)) {
    cm_warn("no Unix socket: the path for job '%s' would be too long; "
            "clients on this host use TCP (set PSD_SOCKET_DIR shorter)",
            srv->spec->job.name);
    return;
  }
  if (psd_local_start(&srv->local, &srv->loop, srv->rpc, path, why,
                      sizeof why)) {
    cm_info("no Unix socket: %s; clients on this host use TCP", why);
    return;
  }
  snprintf(srv->unix_path, sizeof srv->unix_path, "%s", path);
}

/* Settles where checkpoints go (--checkpoint-dir, the spec's
 * job.checkpoint.dir, $STATE_DIRECTORY) and restores the newest one that
 * verifies into srv->store. Returns 0, or 1 (reported) when the directory
 * cannot be used or none of its checkpoints verifies. */
static int restore(struct psd_server *srv) {
  const struct cm_job *job = &srv->spec->job;
  const char *state = getenv("STATE_DIRECTORY"), *from = "--checkpoint-dir";
  char root[1024], err[4096];
  int rc;

  if (srv->ckpt_root[0]) {
    snprintf(root, sizeof root, "%s", srv->ckpt_root);
  } else if (job->ckpt_dir[0]) {
    snprintf(root, sizeof root, "%s", job->ckpt_dir);
    from = "job.checkpoint.dir";
  } else if (state && state[0]) {
    /* systemd's StateDirectory=; several are separated by ':'. */
    snprintf(root, sizeof root, "%.*s", (int)strcspn(state, ":"), state);
    from = "STATE_DIRECTORY";
  } else if (srv->has_resume_step) {
    cm_error("--resume-step needs checkpoints: no checkpoint dir (set "
             "job.checkpoint.dir, --checkpoint-dir or STATE_DIRECTORY)");
    return 2;
  } else {
    cm_info("checkpoints are off: no checkpoint dir (set job.checkpoint.dir, "
            "--checkpoint-dir or STATE_DIRECTORY)");
    return 0;
  }
  struct psd_ckpt_opts o = {.root = root,
                            .job = job->name,
                            .shard = srv->shard,
                            .nshards = srv->spec->nps,
                            .mode = job->mode,
                            .optims = &job->optim,
                            .keep = job->ckpt_keep,
                            .has_resume_step = srv->has_resume_step,
                            .resume_step = srv->resume_step};
  if ((rc = psd_ckpt_new(&srv->ckpt, &o, err, sizeof err))) {
    cm_error("checkpoint directory (from %s): %s", from, err);
    return 1;
  }
  cm_info("checkpoints in %s (from %s): every %d steps, every %g s, keep %d",
          psd_ckpt_dir(srv->ckpt), from, job->ckpt_every_steps,
          job->ckpt_every_s, job->ckpt_keep);
  if ((rc = psd_ckpt_load(srv->ckpt, &srv->store, &srv->dedup, &srv->resume,
                          err, sizeof err))) {
    cm_error("cannot resume: %s", err);
    return 1;
  }
  if (!srv->store) {
    cm_info("no checkpoint in %s: starting from scratch",
            psd_ckpt_dir(srv->ckpt));
    return 0;
  }
  char size[32], clients[64] = "";
  /* A checkpoint without a table (sync, or an older psd's) says nothing. */
  if (srv->resume.clients >= 0)
    snprintf(clients, sizeof clients, ", applied pushes of %d client%s",
             srv->resume.clients, srv->resume.clients == 1 ? "" : "s");
  cm_info("resumed from step %llu: %s, %d variables%s, %s verified and "
          "loaded in %.0f ms%s",
          (unsigned long long)srv->resume.step, srv->resume.path,
          srv->resume.nvars, clients,
          cm_fmt_bytes((double)srv->resume.bytes, size, sizeof size),
          srv->resume.ms,
          srv->resume.refused ? " (newer checkpoints were REFUSED, see above)"
                              : "");
  return 0;
}

/* Creates the checkpoint saver over the service's store and steps, and
 * continues the restored step. Returns 0 or CM_ENOMEM. */
static int attach_saver(struct psd_server *srv) {
  const struct cm_job *job = &srv->spec->job;
  struct psd_steps *steps = psd_service_steps(srv->service);
  struct psd_saver_opts o = {.ckpt = srv->ckpt,
                             .store = srv->store,
                             .steps = steps,
                             .dedup = psd_service_dedup(srv->service),
                             .job = job->name,
                             .every_steps = job->ckpt_every_steps,
                             .every_s = job->ckpt_every_s,
                             .step = steps ? 0 : srv->resume.step,
                             .resumed = &srv->resume};
  /* Only a store restored from a checkpoint continues a job. */
  if (steps && srv->resume.path[0])
    psd_steps_resume(steps, srv->resume.step);
  if (psd_saver_new(&srv->saver, &o) || psd_saver_start(srv->saver))
    return CM_ENOMEM;
  psd_service_set_saver(srv->service, srv->saver);
  return 0;
}

/* The checkpoint at exit, once no call is in flight. Returns 0, or 1 when
 * it failed (reported). */
static int final_checkpoint(struct psd_server *srv) {
  struct psd_ckpt_result r;
  char err[4096];
  int rc;
  if (!srv->saver)
    return 0;
  rc = psd_saver_final(srv->saver, &r, err, sizeof err);
  if (rc == 1)
    cm_info("no checkpoint written at exit (no checkpoint dir)");
  return rc < 0 ? 1 : 0;
}

/* Opens the store and the gRPC server; returns 0 or 1 (reported). */
static int open_server(struct psd_server *srv) {
  const struct cm_job *job = &srv->spec->job;
  const struct cm_rpc_method *methods;
  char err[512];
  int n, nc = 0, ns = 0, rc;

  /* The store may come from a checkpoint already (restore). */
  if ((!srv->store &&
       psd_store_new(&srv->store, srv->shard, srv->spec->nps, &job->optim)) ||
      psd_service_new(&srv->service, srv->store, srv->shard, srv->spec->nps,
                      srv->spec->nworker, job->name, job->mode)) {
    cm_error("out of memory");
    return 1;
  }
  /* So is the table of pushes its values hold: their retries stay
   * duplicates. Before the saver, which saves the service's table. */
  if (srv->dedup) {
    psd_service_set_dedup(srv->service, srv->dedup);
    srv->dedup = NULL;
  }
  if (attach_saver(srv)) {
    cm_error("out of memory");
    return 1;
  }
  psd_service_set_limits(
      srv->service,
      &(struct psd_limits){.max_message = (uint64_t)cm_rpc_max_message(),
                           .nonfinite = psd_nonfinite_parse(job->nonfinite)});
  methods = psd_service_methods(srv->service, &n);
  memcpy(srv->methods, methods, n * sizeof *methods);
  if (srv->shard == 0) {
    /* Shard 0 is also the coordinator: membership, steps, clocks. */
    if (psd_coord_new(&srv->coord, srv->spec)) {
      cm_error("cannot start the coordinator");
      return 1;
    }
    /* A resumed sync job opens its checkpoint's step (steps committed). */
    if (!strcmp(job->mode, "sync"))
      psd_coord_resume(srv->coord, srv->resume.step);
    if (psd_coord_start(srv->coord)) {
      cm_error("cannot start the coordinator");
      return 1;
    }
    psd_service_set_coord(srv->service, srv->coord);
    methods = psd_coord_methods(srv->coord, &nc);
    memcpy(srv->methods + n, methods, nc * sizeof *methods);
  }
  methods = psd_saver_methods(srv->saver, &ns);
  memcpy(srv->methods + n + nc, methods, ns * sizeof *methods);
  if ((rc = cm_server_new(&srv->rpc, srv->listen, srv->methods, n + nc + ns,
                          &srv->creds, err, sizeof err))) {
    cm_error("%s", err);
    if (rc == CM_EADDRINUSE)
      cm_error("is another psd (or another program) using that port? "
               "change cluster.ps[%d] in the spec or stop it",
               srv->shard);
    return 1;
  }
  psd_service_set_server(srv->service, srv->rpc);
  if (cm_server_start(srv->rpc)) {
    cm_error("cannot start the gRPC server");
    return 1;
  }
  return 0;
}

/* Says who may call this shard. */
static void log_security(struct psd_server *srv) {
  const struct cm_creds *c = &srv->creds;
  if (!c->token[0] && !c->tls) {
    const char *l = srv->listen;
    /* On loopback only this host's users can call; say it, don't warn. */
    int loopback = !strncmp(l, "127.", 4) || !strncmp(l, "[::1]:", 6) ||
                   !strncmp(l, "localhost:", 10);
    cm_log(loopback ? CM_LOG_INFO : CM_LOG_WARN,
           "no authentication (the spec has no \"auth\"): anyone who can "
           "reach %s can read and change the model",
           srv->listen);
    return;
  }
  cm_info("security: %s%s%s", c->token[0] ? "bearer token required" : "",
          c->token[0] && c->tls ? ", " : "",
          !c->tls     ? ""
          : c->mutual ? "TLS with client certificates (mutual)"
                      : "TLS");
}

/* Says what the shard refuses beyond the per-field checks. */
static void log_limits(struct psd_server *srv) {
  const struct cm_job *job = &srv->spec->job;
  cm_info("input: messages over %d MiB are refused (job.max_message_mb); "
          "pushes with NaN or Inf are %s (job.nonfinite \"%s\")",
          job->max_message_mb,
          !strcmp(job->nonfinite, "skip") ? "acknowledged, skipped and counted"
          : !strcmp(job->nonfinite, "apply") ? "applied as they are and counted"
                                             : "rejected",
          job->nonfinite);
}

static void log_ready(struct psd_server *srv) {
  const struct cm_job *job = &srv->spec->job;
  char optim[PSD_OPTIM_DESC], more[64] = "";
  cm_optim_describe(&job->optim.def, optim, sizeof optim);
  if (job->optim.nrules)
    snprintf(more, sizeof more, " (%d per-variable override%s)",
             job->optim.nrules, job->optim.nrules == 1 ? "" : "s");
  cm_info("ready: listening on %s%s%s, shard %d of %d, job '%s', %s, "
          "optimizer %s%s",
          srv->listen, srv->unix_path[0] ? " and unix:" : "", srv->unix_path,
          srv->shard, srv->spec->nps, job->name, job->mode, optim, more);
}

static void start_loop(struct psd_server *srv) {
  uint64_t wd_usec = 0;
  uv_loop_init(&srv->loop);
  uv_signal_t *sigs[] = {&srv->sigterm, &srv->sigint, &srv->sighup};
  int signums[] = {SIGTERM, SIGINT, SIGHUP};
  for (int i = 0; i < 3; i++) {
    uv_signal_init(&srv->loop, sigs[i]);
    sigs[i]->data = srv;
    uv_signal_start(sigs[i], on_signal, signums[i]);
  }
  uv_timer_init(&srv->loop, &srv->stats);
  srv->stats.data = srv;
  uv_timer_start(&srv->stats, on_stats, STATS_PERIOD_MS, STATS_PERIOD_MS);
  uv_timer_init(&srv->loop, &srv->watchdog);
  srv->watchdog.data = srv;
  uv_timer_init(&srv->loop, &srv->tick);
  srv->tick.data = srv;
  uv_timer_init(&srv->loop, &srv->status);
  srv->status.data = srv;
  srv->status_at = uv_now(&srv->loop);
  if (srv->coord)
    uv_timer_start(&srv->tick, on_tick, TICK_MS, TICK_MS);
#if PSD_HAVE_SYSTEMD
  if (sd_watchdog_enabled(0, &wd_usec) <= 0)
    wd_usec = 0;
#endif
  if (wd_usec > 0)
    uv_timer_start(&srv->watchdog, on_watchdog, wd_usec / 2000, wd_usec / 2000);
  /* Only systemd reads STATUS=; elsewhere the timer would be wasted. */
  if (PSD_HAVE_SYSTEMD && getenv("NOTIFY_SOCKET"))
    uv_timer_start(&srv->status, on_status_timer, STATUS_PERIOD_MS,
                   STATUS_PERIOD_MS);
}

/* A stop signal that came before the loop watched for signals (a handler
 * may only set a flag; the loop acts on it). */
static volatile sig_atomic_t early_stop;

static void on_early_stop(int signum) { early_stop = signum; }

/* Until the loop watches SIGTERM and SIGINT, catches them in a flag, so
 * that one sent as soon as psd logs "ready" stops it gracefully (with its
 * final checkpoint) instead of killing it, whichever thread it reaches
 * (OpenBLAS and gRPC start some before the loop). With watch set, hands a
 * caught one to the loop, whose handlers replaced these. */
static void catch_early_stop(int watch) {
  if (watch) {
    if (early_stop)
      raise(early_stop);
    return;
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_early_stop;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
}

static void close_cb(uv_handle_t *h, void *arg) {
  if (!uv_is_closing(h))
    uv_close(h, NULL);
}

int main(int argc, char **argv) {
  struct psd_server srv;
  char blas[256];
  int rc;

  kn_blas_init(argv, 1);
  catch_early_stop(0);
  memset(&srv, 0, sizeof srv);
  cm_log_set_name("psd");
  rc = configure(&srv, argc, argv);
  if (rc) {
    cm_spec_free(srv.spec);
    return rc == 3 ? 0 : rc;
  }
  {
    char name[64];
    snprintf(name, sizeof name, "psd ps:%d", srv.shard);
    cm_log_set_name(name);
  }
  kn_blas_describe(blas, sizeof blas);
  cm_info("%s", blas);
  cm_rpc_global_init();
  /* Before any server or channel exists: they take the limit when made. */
  cm_rpc_set_max_message((long long)srv.spec->job.max_message_mb << 20);
  rc = restore(&srv);
  if (rc)
    goto out;
  rc = open_server(&srv);
  if (rc)
    goto out;
  start_loop(&srv);
  catch_early_stop(1);
  start_local(&srv);
  log_security(&srv);
  log_limits(&srv);
  log_ready(&srv);
  notify("READY=1");
  notify_status(&srv);

  uv_run(&srv.loop, UV_RUN_DEFAULT);

  notify("STOPPING=1");
  psd_local_stop(srv.local);
  srv.local = NULL;
  cm_info("%s: stopping (calls in flight get up to %d ms)",
          strsignal(srv.stop_signal), STOP_GRACE_MS);
  /* Parked calls would hold the shutdown: answer them first. */
  if (srv.coord)
    psd_coord_stop(srv.coord);
  psd_service_stop(srv.service);
  psd_saver_stop(srv.saver);
  cm_server_stop(srv.rpc, STOP_GRACE_MS);
  /* No call is in flight now: the final checkpoint is the shard's state. */
  rc = final_checkpoint(&srv);
  uv_walk(&srv.loop, close_cb, NULL);
  uv_run(&srv.loop, UV_RUN_DEFAULT);
  uv_loop_close(&srv.loop);
  cm_info("stopped");
out:
  cm_server_free(srv.rpc);
  psd_coord_free(srv.coord);
  psd_saver_free(srv.saver);
  psd_service_free(srv.service);
  psd_dedup_free(srv.dedup);
  psd_store_free(srv.store);
  cm_creds_free(&srv.creds);
  psd_ckpt_free(srv.ckpt);
  cm_spec_free(srv.spec);
  cm_rpc_global_shutdown();
  return rc;
}
