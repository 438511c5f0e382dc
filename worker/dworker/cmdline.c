/* dworker's command line: the --help text, which documents every option,
 * the output lines and the exit status, and the parser that fills struct
 * dw_args from argv. Nothing here touches OpenBLAS, the spec or the data:
 * main parses before kn_blas_init may re-execute the program. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dworker_internal.h"
#include "err.h"
#include "model.h"

static const char usage_text[] =
    "Usage: dworker --cluster FILE [--task worker:I] [OPTIONS]\n"
    "\n"
    "Run one worker task of a psd training job. The worker loads its share\n"
    "of the training set (example i belongs to worker i mod n, for n\n"
    "workers) from the spec's job.data_dir, declares the model's variables\n"
    "on the parameter servers (job.model: dense<l>/kernel and dense<l>/bias\n"
    "for an MLP of widths 784, job.hidden..., 10; conv0/..., conv1/...,\n"
    "dense0/..., dense1/... for the cnn), and then, for job.epochs passes\n"
    "over its share in a fresh shuffled order each, pulls the parameters,\n"
    "computes the gradient of one batch of job.batch_size examples and\n"
    "pushes it.\n"
    "Worker 0 also loads the 10k test set and, at the end, evaluates the\n"
    "final parameters on it. With job.optimizer.clip_norm, each step's whole\n"
    "gradient is scaled down to that global L2 norm before it is pushed.\n"
    "\n"
    "Options:\n"
    "  --cluster FILE       the cluster spec (JSON shaped like TF_CONFIG;\n"
    "                       see deploy/examples/local.json); required\n"
    "  --cluster slurm[:FILE]  the cluster from Slurm's environment (this\n"
    "                       task: SLURM_PROCID), the job's settings from\n"
    "                       FILE (\"job\", \"auth\", \"slurm\"); psd-spec(5)\n"
    "  --cluster k8s[:FILE]  from a Kubernetes pod's environment (deploy/k8s;\n"
    "                       this worker: JOB_COMPLETION_INDEX)\n"
    "  --cluster tf_config[:FILE]  the cluster and task from Kubeflow's\n"
    "                       TF_CONFIG, the job's settings from FILE\n"
    "  --task worker:I      which task this is; without it the spec's\n"
    "                       \"task\", then TF_CONFIG's, is used\n"
    "  --standalone         no parameter server at all: train the same model\n"
    "                       on the whole training set (part 0 of 1) with the\n"
    "                       same batch size, applying each variable's\n"
    "                       optimizer from the spec (job.optimizer,\n"
    "                       job.optimizer_overrides) locally as psd would;\n"
    "                       the single-process baseline for benchmarks.\n"
    "                       --task is optional\n"
    "  --max-steps N        stop after N steps (overrides job.max_steps;\n"
    "                       0 = run every epoch); in a sync job already past\n"
    "                       step 0, N more steps from there (without it, the\n"
    "                       steps left of the spec's length: none when the\n"
    "                       job is complete, which is said, exit 0)\n"
    "  --threads N          OpenBLAS threads (default 1; 0 = OpenBLAS's own\n"
    "                       default)\n"
    "  --device DEV         cpu (default), cuda, cuda:N or auto: where the\n"
    "                       model runs; cuda without a working GPU is an\n"
    "                       error naming the cause, auto falls back to the\n"
    "                       CPU and says why\n"
    "  --replicas R         R copies of the model (default 1) on R CPU\n"
    "                       threads or GPUs N..N+R-1: each batch is split R\n"
    "                       ways, the gradients summed into the batch's, one\n"
    "                       push per step\n"
    "  --connect-timeout-ms N\n"
    "                       how long to wait for the parameter servers to\n"
    "                       come up before giving up (default 60000)\n"
    "  --no-overlap         async mode: wait for each push to be applied\n"
    "                       before pulling (default: a step's push and the\n"
    "                       next step's pull travel together, one round trip\n"
    "                       per step; the pull may miss this worker's own\n"
    "                       last gradient)\n"
    "  --inject-delay-ms N  TEST ONLY: sleep N ms in every step before the\n"
    "                       push, to simulate a straggler\n"
    "  --emulate-workers N  with --standalone: train as one worker whose\n"
    "                       batch at each step is the N batches that the N\n"
    "                       workers of a sync job would compute at that step,\n"
    "                       concatenated (the oracle for deterministic sync)\n"
    "  --save-params FILE   worker 0 / --standalone: write the final\n"
    "                       parameters to FILE as raw little-endian f32, the\n"
    "                       variables in declaration order (dense0/kernel,\n"
    "                       dense0/bias, ...)\n"
    "  --help               print this text and exit\n"
    "\n"
    "Output on stdout, one line each, flushed as written:\n"
    "  every job.log_every steps\n"
    "    epoch 1/3 step 200/469 loss 0.5123 acc 0.8125 ex/s 12345 eta 8.2s\n"
    "    (loss and acc: means over the steps since the previous line; ex/s:\n"
    "    this worker's training examples per second over those steps; eta:\n"
    "    this worker's remaining steps at its mean pace so far)\n"
    "  at the end, worker 0 and --standalone, as the last line\n"
    "    final: test_accuracy=0.8712 epochs=3 examples=90000 "
    "worker_examples_per_s=12345 wall_s=12.3 steps=1407 dropped=0\n"
    "  and every other worker\n"
    "    done: steps=1407 examples=90000 worker_examples_per_s=12345 "
    "wall_s=12.3 dropped=0\n"
    "  job.ctr.stream: a line per window, scored before it is trained on,\n"
    "    window 3 (part-00002.svm): logloss=0.51 auc=0.75 examples=20000 "
    "before training\n"
    "    and both result lines begin windows=N window_examples=N\n"
    "    window_logloss= window_auc= last_window_logloss= last_window_auc=\n"
    "  dropped: in sync mode, this worker's gradients left out of a step\n"
    "    (a backup worker's, or one that came after the step closed)\n"
    "  redone=N, sync, after a rollback (a shard restarted from its\n"
    "    checkpoint): the steps undone, which this worker took again, so\n"
    "    steps counts them twice\n"
    "  test_accuracy: on the 10k test set, with the parameters pulled once\n"
    "    worker 0 has run its own steps (other workers may still be pushing);\n"
    "    epochs: passes started over this worker's share; steps: steps\n"
    "    this worker ran; wall_s: this worker's training time, from its first\n"
    "    step to its last (loading and evaluation excluded); examples: this\n"
    "    worker's training examples; worker_examples_per_s: examples / "
    "wall_s,\n"
    "    this worker's own rate. The job's rate is every worker's examples\n"
    "    over the time from the first step of any to the last step of any:\n"
    "    the coordinator measures it from what each worker reports as it\n"
    "    leaves (psctl status; pslaunch prints it as its job: line).\n"
    "Logs go to stderr.\n"
    "\n"
    "Exit status: 0 done; 1 a data, model or parameter-server error; 2 a bad\n"
    "command line or cluster spec.\n";

/* Parses a whole decimal integer in [min, max]; CM_EINVAL otherwise. */
static int parse_long(const char *s, long min, long max, long *out) {
  char *end;
  long v;

  errno = 0;
  v = strtol(s, &end, 10);
  if (errno != 0 || end == s || *end != '\0' || v < min || v > max)
    return CM_EINVAL;
  *out = v;
  return 0;
}

/* Fills *a from argv. Returns 0, 1 when --help was printed, or CM_EINVAL
 * after explaining the mistake on stderr. Nothing else happens here, so it
 * may run before kn_blas_init's re-exec. */
int dw_parse_args(int argc, char **argv, struct dw_args *a) {
  enum {
    OPT_CLUSTER = 256,
    OPT_TASK,
    OPT_STANDALONE,
    OPT_MAX_STEPS,
    OPT_THREADS,
    OPT_DELAY,
    OPT_CONNECT,
    OPT_SAVE,
    OPT_EMULATE,
    OPT_NO_OVERLAP,
    OPT_DEVICE,
    OPT_REPLICAS,
    OPT_HELP
  };
  static const struct option longopts[] = {
      {"cluster", required_argument, NULL, OPT_CLUSTER},
      {"task", required_argument, NULL, OPT_TASK},
      {"standalone", no_argument, NULL, OPT_STANDALONE},
      {"max-steps", required_argument, NULL, OPT_MAX_STEPS},
      {"threads", required_argument, NULL, OPT_THREADS},
      {"inject-delay-ms", required_argument, NULL, OPT_DELAY},
      {"connect-timeout-ms", required_argument, NULL, OPT_CONNECT},
      {"save-params", required_argument, NULL, OPT_SAVE},
      {"emulate-workers", required_argument, NULL, OPT_EMULATE},
      {"no-overlap", no_argument, NULL, OPT_NO_OVERLAP},
      {"device", required_argument, NULL, OPT_DEVICE},
      {"replicas", required_argument, NULL, OPT_REPLICAS},
      {"help", no_argument, NULL, OPT_HELP},
      {NULL, 0, NULL, 0},
  };
  int rc = 0;
  long v;
  int c;

  memset(a, 0, sizeof *a);
  a->max_steps = -1;
  a->threads = 1;
  a->device = "cpu";
  a->replicas = 1;
  opterr = 0;
  while ((c = getopt_long(argc, argv, ":", longopts, NULL)) != -1) {
    switch (c) {
    case OPT_CLUSTER:
      a->cluster = optarg;
      break;
    case OPT_TASK:
      a->task = optarg;
      break;
    case OPT_STANDALONE:
      a->standalone = 1;
      break;
    case OPT_NO_OVERLAP:
      a->no_overlap = 1;
      break;
    case OPT_MAX_STEPS:
      if (parse_long(optarg, 0, LONG_MAX, &v) < 0) {
        fprintf(stderr, "dworker: --max-steps %s: expected an integer >= 0\n",
                optarg);
        rc = CM_EINVAL;
        goto out;
      }
      a->max_steps = v;
      break;
    case OPT_THREADS:
      if (parse_long(optarg, 0, 1024, &v) < 0) {
        fprintf(stderr,
                "dworker: --threads %s: expected an integer in "
                "0..1024\n",
                optarg);
        rc = CM_EINVAL;
        goto out;
      }
      a->threads = (int)v;
      break;
    case OPT_DELAY:
      if (parse_long(optarg, 0, 3600000, &v) < 0) {
        fprintf(stderr,
                "dworker: --inject-delay-ms %s: expected an integer "
                "in 0..3600000\n",
                optarg);
        rc = CM_EINVAL;
        goto out;
      }
      a->inject_delay_ms = (int)v;
      break;
    case OPT_CONNECT:
      if (parse_long(optarg, 1, 86400000, &v) < 0) {
        fprintf(stderr,
                "dworker: --connect-timeout-ms %s: expected an integer "
                "in 1..86400000\n",
                optarg);
        rc = CM_EINVAL;
        goto out;
      }
      a->connect_timeout_ms = (int)v;
      break;
    case OPT_SAVE:
      a->save_params = optarg;
      break;
    case OPT_EMULATE:
      if (parse_long(optarg, 1, DW_MAX_EMULATED, &v) < 0) {
        fprintf(stderr,
                "dworker: --emulate-workers %s: expected an integer in "
                "1..%d\n",
                optarg, DW_MAX_EMULATED);
        rc = CM_EINVAL;
        goto out;
      }
      a->emulate = (int)v;
      break;
    case OPT_DEVICE:
      a->device = optarg;
      a->gpu = 0;
      if (!strncmp(optarg, "cuda:", 5) &&
          parse_long(optarg + 5, 0, 1023, &v) == 0) {
        a->gpu = (int)v;
        break;
      }
      if (strcmp(optarg, "cpu") && strcmp(optarg, "cuda") &&
          strcmp(optarg, "auto")) {
        fprintf(stderr,
                "dworker: --device %s: expected cpu, cuda, cuda:N or auto\n",
                optarg);
        rc = CM_EINVAL;
        goto out;
      }
      break;
    case OPT_REPLICAS:
      if (parse_long(optarg, 1, DW_MODEL_MAX_REPLICAS, &v) < 0) {
        fprintf(stderr,
                "dworker: --replicas %s: expected an integer in 1..%d\n",
                optarg, DW_MODEL_MAX_REPLICAS);
        rc = CM_EINVAL;
        goto out;
      }
      a->replicas = (int)v;
      break;
    case OPT_HELP:
      fputs(usage_text, stdout);
      rc = 1;
      goto out;
    case ':':
      fprintf(stderr, "dworker: %s needs a value; see dworker --help\n",
              argv[optind - 1]);
      rc = CM_EINVAL;
      goto out;
    default:
      fprintf(stderr, "dworker: unknown option %s; see dworker --help\n",
              argv[optind - 1]);
      rc = CM_EINVAL;
      goto out;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "dworker: unexpected argument %s; see dworker --help\n",
            argv[optind]);
    rc = CM_EINVAL;
    goto out;
  }
  if (a->cluster == NULL) {
    fprintf(stderr, "dworker: --cluster FILE is required; see dworker "
                    "--help\n");
    rc = CM_EINVAL;
    goto out;
  }
out:
  return rc;
}

/* Prints a spec error text (one mistake per line) to stderr. */
void dw_print_spec_errors(const char *err) {
  size_t n = strlen(err);

  fputs(err, stderr);
  if (n == 0 || err[n - 1] != '\n')
    fputc('\n', stderr);
}
