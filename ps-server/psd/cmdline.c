/* psd's command line (cmdline.h): the --help text, and configure, which
 * reads the options, then the cluster spec they name, this shard's task and
 * the spec's credentials. Every refusal goes to stderr as "psd: ..." with
 * the fix, before anything is logged or opened. */
#include "cmdline.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth.h"
#include "layout.h"
#include "spec.h"
#include "units.h"

/* The --help text, with the periods and exit statuses it states. */
static void usage(FILE *f) {
  fprintf(
      f,
      "usage: psd --cluster FILE [--task ps:I|serve:J] [--listen HOST:PORT]\n"
      "           [--checkpoint-dir DIR] [--resume-step N]\n"
      "           [--metrics-listen HOST:PORT]\n"
      "       psd --cluster FILE --reshard [--checkpoint-dir DIR]\n"
      "           [--shards M] [--reshard-memory MIB]\n"
      "\n"
      "Runs shard I of a psd job: holds its slices of the job's variables\n"
      "in memory and applies the workers' pushes with each variable's\n"
      "optimizer (sgd, momentum, nesterov, adagrad, adam or adamw, with a\n"
      "learning-rate schedule: the spec's job.optimizer and\n"
      "job.optimizer_overrides).\n"
      "\n"
      "  --cluster FILE     the cluster spec (JSON, TF_CONFIG-shaped; see\n"
      "                     deploy/examples/local.json)\n"
      "  --cluster slurm[:FILE]  the cluster from Slurm's environment (this\n"
      "                     task: SLURM_PROCID), the job's settings from FILE\n"
      "                     (\"job\", \"auth\", \"slurm\"); see psd-spec(5)\n"
      "  --cluster k8s[:FILE]  the cluster from a Kubernetes pod's "
      "environment\n"
      "                     (deploy/k8s; this shard: its pod's hostname, "
      "psd-I)\n"
      "  --cluster tf_config[:FILE]  the cluster and task from Kubeflow's\n"
      "                     TF_CONFIG, the job's settings from FILE\n"
      "  --task ps:I        which shard this is; else the spec's \"task\" or\n"
      "                     the TF_CONFIG environment variable\n"
      "  --task serve:J     a serving task (cluster.serve[J]): no training;\n"
      "                     it follows shard J %% nps's publications in\n"
      "                     job.publish.dir and answers Serve/Lookup from\n"
      "                     them, read-only (docs/serving.md)\n"
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
      "  --metrics-listen HOST:PORT  serve Prometheus metrics (GET /metrics)\n"
      "                     here instead of the spec's job.metrics_listen\n"
      "                     for this shard; with neither, none are served\n"
      "  --reshard          restore the job's newest checkpoint, written by\n"
      "                     another number of shards, onto the spec's\n"
      "                     (cluster.ps), bit for bit, then exit: run it\n"
      "                     once, with every shard stopped, before starting\n"
      "                     the shards of the new count. The old layout is\n"
      "                     kept as <dir>/<job>.<N>-shards-<time>\n"
      "                     (docs/reshard.md)\n"
      "  --shards M         with --reshard: onto M shards, the first M of\n"
      "                     cluster.ps (default: all of them); the others\n"
      "                     stand by. A running job changes its count with\n"
      "                     psctl reshard --shards M instead, without\n"
      "                     stopping its workers\n"
      "  --reshard-memory MIB  the memory --reshard may hold at once "
      "(default:\n"
      "                     half of MemAvailable; give a container's limit\n"
      "                     here): the fewer new shards fit, the more often\n"
      "                     it reads the old ones\n"
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
      "failed, 2 bad command line or cluster spec. With --reshard: 0\n"
      "restored, 1 not (the checkpoint is unchanged; the error says why).\n",
      PSD_STATUS_PERIOD_MS / 1000, PSD_STOP_GRACE_MS / 1000);
}

/* serve:J (serve_start.h): the training shard it follows, where it
 * listens, and its credentials. Returns PSD_CONFIG_RUN or PSD_CONFIG_BAD
 * (said). */
static enum psd_config configure_serving(struct psd_server *srv,
                                         const char *listen,
                                         const char *metrics) {
  const struct cm_spec *spec = srv->spec;
  char err[8192];
  srv->serving = 1;
  srv->replica = spec->task.index;
  srv->shard = cm_layout_serve_shard(spec->task.index, spec->nps);
  if (!spec->job.publish_dir[0]) {
    fprintf(stderr,
            "psd: serve:%d follows the publications of shard %d, but the "
            "spec has no job.publish.dir; set it to the directory the "
            "training shards publish into (docs/serving.md)\n",
            srv->replica, srv->shard);
    return PSD_CONFIG_BAD;
  }
  if (metrics) {
    fprintf(stderr,
            "psd: --metrics-listen: a serving task (serve:%d) "
            "serves no /metrics; ask its Status (psctl)\n",
            srv->replica);
    return PSD_CONFIG_BAD;
  }
  if (srv->ckpt_root[0] || srv->has_resume_step) {
    fprintf(stderr,
            "psd: --checkpoint-dir and --resume-step are for ps:I; "
            "serve:%d loads its shard's publications\n",
            srv->replica);
    return PSD_CONFIG_BAD;
  }
  if (cm_creds_load(&srv->spec->auth, 1, &srv->creds, err, sizeof err)) {
    fprintf(stderr, "psd: %s\n", err);
    return PSD_CONFIG_BAD;
  }
  snprintf(srv->listen, sizeof srv->listen, "%s",
           listen ? listen : spec->serve[srv->replica].text);
  return PSD_CONFIG_RUN;
}

enum psd_config psd_server_configure(struct psd_server *srv, int argc,
                                     char **argv) {
  static const struct option opts[] = {
      {"cluster", required_argument, 0, 'c'},
      {"task", required_argument, 0, 't'},
      {"listen", required_argument, 0, 'l'},
      {"checkpoint-dir", required_argument, 0, 'k'},
      {"resume-step", required_argument, 0, 'r'},
      {"metrics-listen", required_argument, 0, 'm'},
      {"reshard", no_argument, 0, 'R'},
      {"reshard-memory", required_argument, 0, 'M'},
      {"shards", required_argument, 0, 'S'},
      {"help", no_argument, 0, 'h'},
      {0, 0, 0, 0}};
  const char *cluster = NULL, *task = NULL, *listen = NULL, *metrics = NULL;
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
    case 'm':
      metrics = optarg;
      break;
    case 'k':
      if (!optarg[0] || strlen(optarg) >= sizeof srv->ckpt_root) {
        fprintf(stderr,
                "psd: --checkpoint-dir: expected a path of 1..%zu "
                "characters\n",
                sizeof srv->ckpt_root - 1);
        return PSD_CONFIG_BAD;
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
        return PSD_CONFIG_BAD;
      }
      srv->has_resume_step = 1;
      break;
    }
    case 'R':
      srv->reshard = 1;
      break;
    case 'M': {
      long long mib;
      if (cm_parse_int(optarg, 1, 1LL << 30, &mib)) {
        fprintf(stderr,
                "psd: --reshard-memory %s: expected MiB, a whole number "
                "1..%lld\n",
                optarg, 1LL << 30);
        return PSD_CONFIG_BAD;
      }
      srv->reshard_memory = (uint64_t)mib << 20;
      break;
    }
    case 'S': {
      long long m;
      if (cm_parse_int(optarg, 1, 100000, &m)) {
        fprintf(stderr, "psd: --shards %s: expected a shard count >= 1\n",
                optarg);
        return PSD_CONFIG_BAD;
      }
      srv->reshard_shards = (int)m;
      break;
    }
    case 'h':
      usage(stdout);
      return PSD_CONFIG_HELP;
    default:
      usage(stderr);
      return PSD_CONFIG_BAD;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "psd: unexpected argument '%s' (see psd --help)\n",
            argv[optind]);
    return PSD_CONFIG_BAD;
  }
  if (!cluster) {
    fprintf(stderr, "psd: --cluster FILE is required (see psd --help)\n");
    return PSD_CONFIG_BAD;
  }
  if ((srv->reshard_memory || srv->reshard_shards) && !srv->reshard) {
    fprintf(stderr, "psd: %s goes with --reshard\n",
            srv->reshard_memory ? "--reshard-memory" : "--shards");
    return PSD_CONFIG_BAD;
  }
  if (srv->reshard) {
    if (task || listen || metrics || srv->has_resume_step) {
      fprintf(stderr, "psd: --reshard restores the whole job's checkpoint "
                      "and exits: it takes no --task, --listen, "
                      "--metrics-listen or --resume-step\n");
      return PSD_CONFIG_BAD;
    }
    if (cm_spec_open(cluster, &srv->spec, NULL, err, sizeof err)) {
      fprintf(stderr, "psd: %s\n", err);
      return PSD_CONFIG_BAD;
    }
    if (srv->reshard_shards > srv->spec->nps) {
      fprintf(stderr,
              "psd: --shards %d: %s's cluster.ps lists %d address%s; "
              "expected 1..%d\n",
              srv->reshard_shards, cluster, srv->spec->nps,
              srv->spec->nps == 1 ? "" : "es", srv->spec->nps);
      return PSD_CONFIG_BAD;
    }
    return PSD_CONFIG_RESHARD;
  }
  if (cm_spec_open(cluster, &srv->spec, NULL, err, sizeof err) ||
      cm_spec_resolve_task(srv->spec, task, err, sizeof err)) {
    fprintf(stderr, "psd: %s\n", err);
    return PSD_CONFIG_BAD;
  }
  cm_spec_say_notes(srv->spec, "psd");
  if (srv->spec->task.type != CM_TASK_PS &&
      srv->spec->task.type != CM_TASK_SERVE) {
    fprintf(stderr,
            "psd: task %s:%d is not a ps task (nor a serve task); psd "
            "runs ps:I and serve:J\n",
            cm_task_type_name(srv->spec->task.type), srv->spec->task.index);
    return PSD_CONFIG_BAD;
  }
  if (srv->spec->task.type == CM_TASK_SERVE)
    return configure_serving(srv, listen, metrics);
  if (cm_creds_load(&srv->spec->auth, 1, &srv->creds, err, sizeof err)) {
    fprintf(stderr, "psd: %s\n", err);
    return PSD_CONFIG_BAD;
  }
  srv->shard = srv->spec->task.index;
  if (metrics && cm_addr_parse(metrics, "--metrics-listen", &srv->metrics_addr,
                               err, sizeof err)) {
    fprintf(stderr, "psd: %s\n", err);
    return PSD_CONFIG_BAD;
  }
  if (!metrics && srv->spec->metrics)
    srv->metrics_addr = srv->spec->metrics[srv->shard];
  snprintf(srv->listen, sizeof srv->listen, "%s",
           listen ? listen : srv->spec->ps[srv->shard].text);
  return PSD_CONFIG_RUN;
}
