/* pslaunch's command line: the --help text, which documents the options,
 * the output and the exit status, and the parser that fills struct
 * pl_options from argv. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pslaunch_internal.h"

static const char usage_text[] =
    "Usage: pslaunch [OPTIONS] FILE [-- DWORKER_ARGS...]\n"
    "       pslaunch [OPTIONS] --cluster slurm[:FILE] [-- DWORKER_ARGS...]\n"
    "       pslaunch --cluster k8s[:FILE]|tf_config[:FILE] --print-spec\n"
    "\n"
    "Start the tasks of the cluster spec FILE whose address is on this host:\n"
    "every ps task first (psd --cluster FILE --task ps:I), then every serving\n"
    "task of cluster.serve (psd --cluster FILE --task serve:J; stopped with\n"
    "the ps tasks), then every worker (dworker --cluster FILE --task worker:I\n"
    "DWORKER_ARGS...). Each line they\n"
    "print is shown prefixed with the task name, their stdout on stdout and\n"
    "their stderr on stderr:\n"
    "\n"
    "  ps:0     | 12:00:01.002 psd ps:0 info: listening on 127.0.0.1:7100\n"
    "  worker:1 | 12:00:03.417 dworker worker:1 info: step 200 loss 0.41\n"
    "\n"
    "If the spec sets job.worker_command (an array: a program and its\n"
    "arguments, psd-spec(5)), each worker runs that command instead of\n"
    "dworker, with DWORKER_ARGS appended, in the spec file's directory. A\n"
    "program name without a slash is looked up in PATH; a relative path with\n"
    "one is relative to the spec file's directory. Its environment says which\n"
    "task it is:\n"
    "\n"
    "  TF_CONFIG   {\"cluster\": {\"ps\": [...], \"worker\": [...]},\n"
    "               \"task\": {\"type\": \"worker\", \"index\": I}}\n"
    "  PSD_SPEC    the spec file's absolute path\n"
    "  PSD_TASK    worker:I\n"
    "  PYTHONPATH  BUILD/worker/python first, when pslaunch runs from a build\n"
    "              tree where that exists, then what it was\n"
    "  OPENBLAS_CORETYPE  the OpenBLAS kernels this CPU runs fastest "
    "(SkylakeX,\n"
    "              Haswell), unless PSD_OPENBLAS_CORETYPE or an equally wide\n"
    "              OPENBLAS_CORETYPE is set: PyTorch's OpenBLAS may pick\n"
    "              generic kernels otherwise\n"
    "\n"
    "What follows holds for it as for dworker: its output, its exit status,\n"
    "how it is stopped.\n"
    "\n"
    "When every local worker has exited with status 0, the ps tasks are sent\n"
    "SIGTERM (with --export DIR, once the model is exported: below), a\n"
    "summary is printed and pslaunch exits 0. If the spec has\n"
    "workers that this pslaunch did not start (they run on other hosts, or\n"
    "--only ps), its ps tasks keep serving them: pslaunch asks the\n"
    "coordinator (ps:0, wherever it runs) every second and says what it\n"
    "waits for (\"waiting for worker:1 (training) to finish; Ctrl-C stops the\n"
    "shards now\"), and stops the ps tasks once every worker of the cluster\n"
    "has finished (left the job and let go of it) or is gone (declared dead\n"
    "by the coordinator after job.dead_after_ms). A worker that has not\n"
    "joined yet is waited for, however long it takes.\n"
    "\n"
    "If a task fails (it exits non-zero or by a signal, or a ps task exits at\n"
    "all while workers still run), every other task is sent SIGTERM and\n"
    "pslaunch exits 1. Ctrl-C (SIGINT), SIGTERM and SIGHUP stop every task\n"
    "the same way; a second Ctrl-C sends SIGKILL at once. A task still\n"
    "running SECS seconds after SIGTERM is sent SIGKILL.\n"
    "\n"
    "Each task runs in a session of its own, so a terminal's Ctrl-C reaches\n"
    "only pslaunch, which then stops the tasks. If pslaunch itself dies, even\n"
    "by SIGKILL, the kernel sends every task still running SIGTERM: a ps task\n"
    "writes its final checkpoint (with checkpoint.dir set) and exits, and a\n"
    "worker stops. Their output after that is lost, and nobody sends SIGKILL\n"
    "to a task that ignores SIGTERM.\n"
    "\n"
    "Under Slurm, --cluster slurm[:FILE] derives the cluster from the job\n"
    "step's environment (psd-spec(5)): every task of the step is one task\n"
    "of the cluster, the first PSD_SLURM_PS (or FILE's slurm.ps, default 1)\n"
    "are ps tasks, the rest workers, ports from PSD_SLURM_PORT (or\n"
    "slurm.port, default 7100) up on each host; FILE holds the job's\n"
    "settings (\"job\", \"auth\", \"slurm\"). Run it once per task with\n"
    "srun: each pslaunch starts the one task SLURM_PROCID names, and its\n"
    "psd or dworker gets the same --cluster. deploy/slurm/psd-job.sbatch\n"
    "is an example.\n"
    "\n"
    "On Kubernetes (deploy/k8s), --cluster k8s[:FILE] derives it from the\n"
    "pod's environment, and --cluster tf_config[:FILE] from the TF_CONFIG a\n"
    "Kubeflow TFJob injects; each pod is one task, as under Slurm.\n"
    "\n"
    "With --export DIR, once every worker of the cluster has finished with\n"
    "status 0 and before the ps tasks stop, every table the shards hold is\n"
    "written to DIR/tables/NAME.safetensors and the variables to\n"
    "DIR/dense.safetensors by psctl export (one run at a time, its lines\n"
    "prefixed \"export\"; as `psctl --cluster FILE export [TABLE] --out F`).\n"
    "DIR must be new (it is made) or empty when pslaunch starts: pslaunch\n"
    "never replaces a file it did not write. A failed export stops the job\n"
    "with exit 1, keeping what was written.\n"
    "\n"
    "Before anything starts, each local ps task's port is tried: a port in\n"
    "use is reported (\"ps:0: cannot listen on 127.0.0.1:7100: Address\n"
    "already in use\") and nothing is started.\n"
    "\n"
    "Options:\n"
    "  --psd PATH           the psd to run (default: psd next to pslaunch,\n"
    "                       else ../ps-server/psd from it in a build tree or\n"
    "                       ../sbin/psd in an installed one)\n"
    "  --dworker PATH       the dworker to run (default: dworker next to\n"
    "                       pslaunch); refused with job.worker_command\n"
    "  --psctl PATH         the psctl --export runs (default: psctl next to\n"
    "                       pslaunch, else ../ps-server/psctl)\n"
    "  --export DIR         export every table and the variables into DIR\n"
    "                       (new or empty) before the ps tasks stop (above)\n"
    "  --only ps|worker     start only this host's ps tasks (and serving\n"
    "                       tasks), or only its workers\n"
    "  --cluster SPEC       the spec: a FILE, slurm[:FILE], k8s[:FILE] or\n"
    "                       tf_config[:FILE] (above);\n"
    "                       instead of FILE\n"
    "  --print-spec         print the spec (JSON; under an engine, the one\n"
    "                       derived) on stdout and exit 0, starting nothing\n"
    "  --stop-timeout SECS  wait this long after SIGTERM before SIGKILL\n"
    "                       (default 10)\n"
    "  -h, --help           show this help and exit\n"
    "  -- DWORKER_ARGS...   pass the rest of the command line to every\n"
    "                       dworker (or job.worker_command)\n"
    "\n"
    "Examples:\n"
    "  pslaunch deploy/examples/local.json\n"
    "  pslaunch local.json -- --max-steps 100    # a short smoke run\n"
    "  pslaunch --only ps cluster.json           # this host serves shards\n"
    "  pslaunch --export model job.json          # train, then export\n"
    "  srun pslaunch --cluster slurm:job.json    # one task per Slurm task\n"
    "  pslaunch --cluster slurm:job.json --print-spec\n"
    "  pslaunch --psd build/ps-server/psd --dworker build/worker/dworker \\\n"
    "           local.json\n"
    "\n"
    "Exit status:\n"
    "  0    every local worker finished with status 0 (and every other\n"
    "       worker of the cluster finished or is gone)\n"
    "  1    a task failed or could not start, a ps port was in use, or the\n"
    "       export failed\n"
    "  2    bad usage, bad cluster spec, no task on this host, psd, dworker,\n"
    "       psctl or job.worker_command's program not found, or --export's\n"
    "       DIR not new or empty\n"
    "  129  stopped by SIGHUP\n"
    "  130  stopped by SIGINT (Ctrl-C)\n"
    "  143  stopped by SIGTERM\n";

/* Parses argv into *o. Returns -1 to go on, or the exit code to leave with
 * (0 after --help, 2 after a usage error, both already reported). */
int pl_parse_args(int argc, char **argv, struct pl_options *o) {
  static const struct option longopts[] = {
      {"psd", required_argument, NULL, 'p'},
      {"dworker", required_argument, NULL, 'd'},
      {"psctl", required_argument, NULL, 'x'},
      {"export", required_argument, NULL, 'e'},
      {"only", required_argument, NULL, 'o'},
      {"stop-timeout", required_argument, NULL, 't'},
      {"cluster", required_argument, NULL, 'c'},
      {"print-spec", no_argument, NULL, 'P'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  int nopt = argc, c, i;
  char *end;

  memset(o, 0, sizeof *o);
  o->want_ps = o->want_worker = 1;
  o->stop_timeout = 10;
  /* Everything after the first "--" belongs to the workers, so getopt only ever
   * sees what comes before it. */
  for (i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--") == 0) {
      nopt = i;
      o->extra = argv + i + 1;
      o->nextra = argc - i - 1;
      break;
    }
  }
  opterr = 0; /* reported below, in pslaunch's own words */
  while ((c = getopt_long(nopt, argv, ":h", longopts, NULL)) != -1) {
    switch (c) {
    case 'p':
      o->psd = optarg;
      break;
    case 'd':
      o->dworker = optarg;
      break;
    case 'x':
      o->psctl = optarg;
      break;
    case 'e':
      if (!optarg[0]) {
        pl_say("--export needs a directory");
        return PL_EXIT_USAGE;
      }
      o->export_dir = optarg;
      break;
    case 'o':
      if (strcmp(optarg, "ps") == 0) {
        o->want_worker = 0;
      } else if (strcmp(optarg, "worker") == 0) {
        o->want_ps = 0;
      } else {
        pl_say("--only %s: expected \"ps\" or \"worker\"", optarg);
        return PL_EXIT_USAGE;
      }
      break;
    case 't':
      errno = 0;
      o->stop_timeout = strtod(optarg, &end);
      if (errno || end == optarg || *end || !isfinite(o->stop_timeout) ||
          o->stop_timeout < 0 || o->stop_timeout > 86400) {
        pl_say("--stop-timeout %s: expected seconds between 0 and 86400",
               optarg);
        return PL_EXIT_USAGE;
      }
      break;
    case 'c':
      o->spec_path = optarg;
      break;
    case 'P':
      o->print_spec = 1;
      break;
    case 'h':
      pl_write_all(STDOUT_FILENO, usage_text, sizeof usage_text - 1);
      return PL_EXIT_OK;
    case ':':
      pl_say("%s needs a value; try 'pslaunch --help'", argv[optind - 1]);
      return PL_EXIT_USAGE;
    default:
      pl_say("unknown option %s; try 'pslaunch --help'", argv[optind - 1]);
      return PL_EXIT_USAGE;
    }
  }
  if (o->spec_path) {
    if (optind != nopt) {
      pl_say("--cluster %s and a spec FILE %s: give one of them", o->spec_path,
             argv[optind]);
      return PL_EXIT_USAGE;
    }
    /* Under an engine each process is one task of the cluster. */
    o->engine = cm_spec_is_engine(o->spec_path);
    return -1;
  }
  if (optind != nopt - 1) {
    pl_say(optind >= nopt ? "no cluster spec FILE given; try 'pslaunch --help'"
                          : "expected one cluster spec FILE, got %d arguments; "
                            "put dworker's own options after \"--\"",
           nopt - optind);
    return PL_EXIT_USAGE;
  }
  o->spec_path = argv[optind];
  return -1;
}
