/* dworker: one worker task of a psd training job.
 *
 * main reads top to bottom: pick the BLAS kernels, load and check the
 * cluster spec, load this worker's 1/n share of Fashion-MNIST (worker 0 also
 * the test set), build the MLP, declare its variables on the parameter
 * servers, then loop pull, compute, push; at the end worker 0 pulls the final
 * parameters and evaluates them on the test set. With --standalone there is
 * no parameter server: the same model, data and batch size are trained in
 * this process with the spec's optimizer applied locally (the single-process
 * baseline the distributed runs are compared with).
 *
 * Batches are gathered ahead: while step t computes, libuv's thread pool
 * copies the shuffled examples of step t+1 into the other half of a double
 * buffer (uv_queue_work); the main thread runs the loop only to wait for
 * that work. At most one gather is ever in flight, so the shuffled order it
 * reads is never touched by two threads at once.
 *
 * stdout carries only the progress and result lines documented in --help
 * (flushed line by line; a launcher reads them through a pipe); logs go to
 * stderr. Run as a systemd Type=notify unit (deploy/systemd/dworker@.service)
 * it sends READY=1 once it has joined the job, STATUS= with its progress and
 * WATCHDOG=1 pings from the training loop; without libsystemd those are
 * compiled out. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <uv.h>

#include "psd_config.h"
#if PSD_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

#include "blas.h"
#include "clock.h"
#include "dense.h"
#include "device.h"
#include "err.h"
#include "idx.h"
#include "log.h"
#include "model.h"
#include "optim.h"
#include "optstep.h"
#include "psclient.h"
#include "rand.h"
#include "rpc.h"
#include "spec.h"

/* Exit codes, as documented in --help. */
enum { DW_EXIT_OK = 0, DW_EXIT_FAILED = 1, DW_EXIT_USAGE = 2 };

/* The classes of Fashion-MNIST, the width of the model's head. */
#define DW_CLASSES 10
/* Most workers --emulate-workers stands in for. */
#define DW_MAX_EMULATED 64
/* Seconds between systemd STATUS= updates from the training loop. */
#define DW_STATUS_PERIOD_S 2.0

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
    "                       0 = run every epoch)\n"
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
    "    final: test_accuracy=0.8712 epochs=3 examples_per_s=12345 "
    "wall_s=12.3 steps=1407 dropped=0\n"
    "  and every other worker\n"
    "    done: steps=1407 examples_per_s=12345 wall_s=12.3 dropped=0\n"
    "  dropped: in sync mode, this worker's gradients left out of a step\n"
    "    (a backup worker's, or one that came after the step closed)\n"
    "  redone=N, sync, after a rollback (a shard restarted from its\n"
    "    checkpoint): the steps undone, which this worker took again, so\n"
    "    steps counts them twice\n"
    "  test_accuracy: on the 10k test set, with the parameters pulled once\n"
    "    worker 0 has run its own steps (other workers may still be pushing);\n"
    "    epochs: passes started over this worker's share; steps: steps\n"
    "    this worker ran; wall_s: this worker's training time, from its first\n"
    "    step to its last (loading and evaluation excluded); examples_per_s:\n"
    "    the job's rate, estimated: this worker's training examples / wall_s\n"
    "    x the number of workers (1 with --standalone).\n"
    "Logs go to stderr.\n"
    "\n"
    "Exit status: 0 done; 1 a data, model or parameter-server error; 2 a bad\n"
    "command line or cluster spec.\n";

/* What the command line asked for. */
struct dw_args {
  const char *cluster;     /* --cluster FILE */
  const char *task;        /* --task, NULL when not given */
  int standalone;          /* --standalone */
  long max_steps;          /* --max-steps, -1 when not given */
  int threads;             /* --threads, default 1 */
  int inject_delay_ms;     /* --inject-delay-ms, 0 when not given */
  int no_overlap;          /* --no-overlap */
  const char *save_params; /* --save-params FILE, NULL when not given */
  int emulate;             /* --emulate-workers N (standalone), 0 = off */
  int connect_timeout_ms;  /* --connect-timeout-ms, 0 = the client's default */
  const char *device;      /* --device: "cpu" (default), "cuda", "cuda:N",
                              "auto" */
  int gpu;                 /* the N of --device cuda:N; 0 for plain cuda */
  int replicas;            /* --replicas R, default 1 */
};

/* One half of the read-ahead double buffer. */
struct dw_slot {
  uv_work_t req;          /* the gather; req.data points at this slot */
  struct dw_feeder *feed; /* the feeder this slot belongs to */
  float *x;               /* owned, (batch, dim): the gathered pixels */
  uint8_t *y;             /* owned, (batch): the gathered labels */
  long step;              /* global step whose batch this slot holds */
  int n;                  /* examples in it; fewer at an epoch's end */
  int busy;               /* queued; completion not yet seen */
};

/* Prepares batches on libuv's thread pool, one step ahead of the trainer. */
struct dw_feeder {
  uv_loop_t loop;              /* runs only while waiting for a gather */
  int loop_ready;              /* loop initialised (so it must be closed) */
  const struct dw_dataset *ds; /* borrowed: this worker's examples */
  uint32_t *order;             /* owned, (ds->n): this epoch's shuffled order */
  long order_epoch;            /* epoch order was shuffled for; -1 = none */
  int batch;                   /* examples per full batch */
  long steps_per_epoch;        /* ceil(ds->n / batch) */
  uint64_t seed;               /* job.seed */
  int worker;                  /* worker index, mixed into the shuffle */
  struct dw_slot slot[2];      /* the double buffer; step t uses slot t % 2 */
};

/* Everything one run of the worker holds; main owns it and tears it down. */
struct dw_worker {
  struct dw_args args;     /* the command line */
  struct cm_spec *spec;    /* owned: the cluster spec */
  char name[64];           /* "worker:I" (or "standalone") */
  int index;               /* this worker's index (0 standalone) */
  int nworkers;            /* workers sharing the data (1 standalone) */
  struct dw_dataset train; /* owned: this worker's training share */
  struct dw_dataset test;  /* owned: the test set (worker 0 only) */
  struct dw_model *model;  /* owned: the model, params and grads */
  struct dw_var vars[DW_MODEL_MAX_VARS]; /* views into model */
  int nvars;                             /* entries used in vars */
  struct dw_client *client; /* owned: the parameter-server client, or NULL */
  float *slots;             /* owned: optimizer slots (standalone only) */
  struct dw_feeder feed;    /* the read-ahead */
  long total_steps;         /* steps this run will take */
  long steps_done;          /* steps taken */
  uint64_t examples_done;   /* training examples consumed */
  double train_s;           /* wall time of the training loop */
  int sync;                 /* job.sync.mode is "sync" */
  int ssp;                  /* async with a staleness bound */
  uint64_t step;            /* sync: the step being computed */
  uint64_t clock;           /* async: pushes completed */
  int prefetched;           /* async: the last push also pulled the next
                               step's parameters */
  long dropped;             /* sync: gradients the coordinator dropped */
  uint64_t rollbacks;       /* sync: the job's rollbacks said in the log */
  long redone;              /* sync: steps this worker computed that a
                               rollback undid (and that it takes again) */
  int nfeeds;               /* feeders: 1, or N with --emulate-workers N */
  struct dw_dataset emu_ds[DW_MAX_EMULATED];  /* owned: shares 1..N-1 */
  struct dw_feeder emu_feed[DW_MAX_EMULATED]; /* feeders of shares 1..N-1 */
  float *batch_x;           /* owned with N > 1: the concatenated batch */
  uint8_t *batch_y;         /* owned with N > 1: its labels */
  int first_gpu;            /* CUDA device of replica 0; -1: the CPU */
  double wd_period_s;       /* systemd: seconds between WATCHDOG=1, 0 = off */
  double watchdog_at;       /* cm_mono_s() of the last WATCHDOG=1 */
  double status_at;         /* cm_mono_s() of the last STATUS= */
  uint64_t status_examples; /* examples_done at the last STATUS= */
  /* standalone: variable i's slots, views into slots in
   * cm_optim_slot_name order */
  float *var_slots[DW_MODEL_MAX_VARS][CM_OPTIM_MAX_SLOTS];
  /* standalone: variable i's optimizer (borrowed from spec) */
  const struct cm_optim *var_opt[DW_MODEL_MAX_VARS];
  long clipped;    /* steps whose gradient norm was above clip_norm */
  double max_norm; /* the largest gradient norm seen (with clip_norm) */
};

/* Running sums behind one progress line. */
struct dw_progress {
  double loss_sum; /* sum of step losses since the last line */
  long correct;    /* correct predictions since the last line */
  long examples;   /* examples since the last line */
  long steps;      /* steps since the last line */
  double since;    /* monotonic time of the last line (or the start) */
};

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
static int parse_args(int argc, char **argv, struct dw_args *a) {
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
static void print_spec_errors(const char *err) {
  size_t n = strlen(err);

  fputs(err, stderr);
  if (n == 0 || err[n - 1] != '\n')
    fputc('\n', stderr);
}

/* Puts feed->order into the order of epoch `epoch`: a Fisher-Yates shuffle
 * of the identity seeded by (job seed, epoch, worker), so every epoch's
 * order is reproducible on its own. */
static void shuffle_epoch(struct dw_feeder *feed, long epoch) {
  uint64_t s = feed->seed * 0x9e3779b97f4a7c15ull +
               (uint64_t)epoch * 0xbf58476d1ce4e5b9ull +
               (uint64_t)feed->worker * 0x94d049bb133111ebull;
  uint32_t i, n = (uint32_t)feed->ds->n;

  for (i = 0; i < n; i++)
    feed->order[i] = i;
  for (i = n; i > 1; i--) {
    /* multiply-shift maps 32 random bits onto [0, i) */
    uint32_t j = (uint32_t)(((cm_splitmix64(&s) >> 32) * (uint64_t)i) >> 32);
    uint32_t t = feed->order[i - 1];

    feed->order[i - 1] = feed->order[j];
    feed->order[j] = t;
  }
  feed->order_epoch = epoch;
}

/* Runs on libuv's thread pool: copies step slot->step's examples into the
 * slot, shuffling first when the step opens a new epoch. */
static void gather_work(uv_work_t *req) {
  struct dw_slot *slot = req->data;
  struct dw_feeder *feed = slot->feed;
  const struct dw_dataset *ds = feed->ds;
  long epoch = slot->step / feed->steps_per_epoch;
  long first = (slot->step % feed->steps_per_epoch) * feed->batch;
  int k;

  if (epoch != feed->order_epoch)
    shuffle_epoch(feed, epoch);
  slot->n = ds->n - first < feed->batch ? (int)(ds->n - first) : feed->batch;
  for (k = 0; k < slot->n; k++) {
    uint32_t e = feed->order[first + k];

    memcpy(slot->x + (size_t)k * ds->dim, ds->x + (size_t)e * ds->dim,
           (size_t)ds->dim * sizeof *slot->x);
    slot->y[k] = ds->y[e];
  }
}

/* Runs on the loop (main) thread once the gather is done. */
static void gather_done(uv_work_t *req, int status) {
  struct dw_slot *slot = req->data;

  (void)status; /* gathers are never cancelled */
  slot->busy = 0;
}

static int feeder_init(struct dw_feeder *feed, const struct dw_dataset *ds,
                       int batch, uint64_t seed, int worker) {
  int rc = 0;
  int i;

  memset(feed, 0, sizeof *feed);
  feed->ds = ds;
  feed->batch = batch;
  feed->steps_per_epoch = (ds->n + batch - 1) / batch;
  feed->seed = seed;
  feed->worker = worker;
  feed->order_epoch = -1;
  feed->order = malloc((size_t)ds->n * sizeof *feed->order);
  if (feed->order == NULL) {
    rc = CM_ENOMEM;
    goto out;
  }
  for (i = 0; i < 2; i++) {
    feed->slot[i].feed = feed;
    feed->slot[i].req.data = &feed->slot[i];
    feed->slot[i].x = malloc((size_t)batch * ds->dim * sizeof(float));
    feed->slot[i].y = malloc((size_t)batch);
    if (feed->slot[i].x == NULL || feed->slot[i].y == NULL) {
      rc = CM_ENOMEM;
      goto out;
    }
  }
  if (uv_loop_init(&feed->loop) != 0) {
    rc = CM_ESYS;
    goto out;
  }
  feed->loop_ready = 1;
out:
  return rc;
}

/* Starts gathering step `step` into its slot (step % 2). */
static int feeder_queue(struct dw_feeder *feed, long step) {
  struct dw_slot *slot = &feed->slot[step % 2];
  int rc;

  slot->step = step;
  slot->busy = 1;
  rc = uv_queue_work(&feed->loop, &slot->req, gather_work, gather_done);
  if (rc != 0) {
    slot->busy = 0;
    cm_error("cannot queue a batch on the thread pool: %s", uv_strerror(rc));
    return CM_ESYS;
  }
  return 0;
}

/* Waits for step `step`'s gather and returns its slot. */
static struct dw_slot *feeder_wait(struct dw_feeder *feed, long step) {
  struct dw_slot *slot = &feed->slot[step % 2];

  while (slot->busy)
    uv_run(&feed->loop, UV_RUN_ONCE);
  return slot;
}

/* Starts gathering step `step`'s batches: this worker's and, with
 * --emulate-workers, the emulated ones'. */
static int queue_step(struct dw_worker *w, long step) {
  int rc = feeder_queue(&w->feed, step);
  for (int i = 1; rc == 0 && i < w->nfeeds; i++)
    rc = feeder_queue(&w->emu_feed[i], step);
  return rc;
}

/* Waits for any gather still in flight, then frees everything. */
static void feeder_free(struct dw_feeder *feed) {
  int i;

  if (feed->loop_ready) {
    uv_run(&feed->loop, UV_RUN_DEFAULT);
    uv_loop_close(&feed->loop);
    feed->loop_ready = 0;
  }
  for (i = 0; i < 2; i++) {
    free(feed->slot[i].x);
    free(feed->slot[i].y);
  }
  free(feed->order);
  memset(feed, 0, sizeof *feed);
}

/* Settles --device before anything is loaded: cpu as asked; cuda or cuda:N
 * only if the CUDA runtime says that device works (else a clear error
 * naming what failed); auto takes GPU 0 when one works and says which. */
static int pick_device(struct dw_worker *w) {
  const char *dev = w->args.device;
  char why[256] = "";
  int count, rc = 0;

  if (!strcmp(dev, "cpu"))
    goto out;
  count = kn_cuda_probe(why, sizeof why);
  if (!strcmp(dev, "auto")) {
    if (count <= 0) {
      cm_info("--device auto: no usable GPU (%s); using the CPU", why);
      w->args.device = "cpu";
      goto out;
    }
    w->args.gpu = 0;
  } else if (count <= 0) {
    fprintf(stderr, "dworker: --device %s: %s\n", dev, why);
    rc = CM_ENODEV;
    goto out;
  }
  if (w->args.gpu + w->args.replicas > count) {
    fprintf(stderr,
            "dworker: --device %s with --replicas %d: needs CUDA devices "
            "%d..%d, but cudaGetDeviceCount found %d\n",
            dev, w->args.replicas, w->args.gpu,
            w->args.gpu + w->args.replicas - 1, count);
    rc = CM_ENODEV;
    goto out;
  }
  w->first_gpu = w->args.gpu;
  cm_info("--device %s: %d CUDA device(s) work; replica%s on device %d..%d",
          dev, count, w->args.replicas > 1 ? "s" : "", w->first_gpu,
          w->first_gpu + w->args.replicas - 1);
out:
  return rc;
}

/* Loads the training share (and, for worker 0, the test set). */
static int load_data(struct dw_worker *w) {
  const struct cm_job *job = &w->spec->job;
  char err[1024];
  double t0 = cm_mono_s();
  int rc;

  /* With --emulate-workers N the standalone trainer holds share 0 of N
   * here and shares 1..N-1 in emu_ds. */
  rc = dw_dataset_load(job->data_dir, "train", w->index,
                       w->nfeeds > 1 ? w->nfeeds : w->nworkers, &w->train, err,
                       sizeof err);
  if (rc < 0) {
    cm_error("training data: %s", err);
    goto out;
  }
  for (int i = 1; i < w->nfeeds; i++) {
    rc = dw_dataset_load(job->data_dir, "train", i, w->nfeeds, &w->emu_ds[i],
                         err, sizeof err);
    if (rc < 0) {
      cm_error("training data: %s", err);
      goto out;
    }
  }
  if (w->index == 0) {
    rc =
        dw_dataset_load(job->data_dir, "t10k", 0, 1, &w->test, err, sizeof err);
    if (rc < 0) {
      cm_error("test data: %s", err);
      goto out;
    }
    if (w->test.dim != w->train.dim) {
      rc = CM_ESHAPE;
      cm_error("test images have %d pixels but training images %d", w->test.dim,
               w->train.dim);
      goto out;
    }
  }
  cm_info("loaded %d training examples (part %d of %d) and %d test examples "
          "from %s in %.1fs",
          w->train.n, w->index, w->nworkers, w->test.n, job->data_dir,
          cm_mono_s() - t0);
out:
  return rc;
}

/* Builds the spec's model (job.model) and the variables that view its
 * parameters and grads. */
static int build_model(struct dw_worker *w) {
  const struct cm_job *job = &w->spec->job;
  char err[256];
  int rc;

  rc = dw_model_new(&w->model, job, w->train.dim, DW_CLASSES,
                    job->batch_size * w->nfeeds, w->args.replicas, w->first_gpu,
                    err, sizeof err);
  if (rc < 0) {
    cm_error("%s: job.model %s: %s", w->spec->source, job->model, err);
    goto out;
  }
  for (int i = 0; i < w->model->nvars; i++) {
    const struct dw_model_var *mv = &w->model->vars[i];
    struct dw_var *v = &w->vars[i];

    memset(v, 0, sizeof *v);
    v->name = mv->name;
    v->ndim = mv->ndim;
    memcpy(v->shape, mv->shape, sizeof mv->shape);
    v->placement = DW_PLACE_AUTO;
    v->init = mv->scale > 0 ? DW_INIT_UNIFORM : DW_INIT_ZEROS;
    v->init_scale = mv->scale;
    v->value = mv->value;
    v->grad = mv->grad;
  }
  w->nvars = w->model->nvars;
  cm_info("model: %s, %zu parameters in %d variables, %d replica%s on %s",
          job->model, w->model->nparams, w->nvars, w->model->replicas,
          w->model->replicas == 1 ? "" : "s",
          w->first_gpu < 0 ? "the CPU" : "GPUs");
out:
  return rc;
}

/* Elements of variable v. */
static size_t var_numel(const struct dw_var *v) {
  size_t n = 1;
  for (int d = 0; d < v->ndim; d++)
    n *= (size_t)v->shape[d];
  return n;
}

/* Standalone: gives each variable the optimizer psd would give it (the
 * spec's job.optimizer, or its job.optimizer_overrides entry) and zeroed
 * slots, as psd does. */
static int setup_local_optim(struct dw_worker *w) {
  const struct cm_optim_set *set = &w->spec->job.optim;
  size_t total = 0;
  float *p;
  char desc[256];
  int rule;

  for (int i = 0; i < w->nvars; i++) {
    w->var_opt[i] = cm_optim_pick(set, w->vars[i].name, &rule);
    total +=
        (size_t)cm_optim_nslots(w->var_opt[i]->type) * var_numel(&w->vars[i]);
    if (rule >= 0) {
      cm_optim_describe(w->var_opt[i], desc, sizeof desc);
      cm_info("'%s': optimizer %s (job.optimizer_overrides[\"%s\"])",
              w->vars[i].name, desc, set->rules[rule].pattern);
    }
  }
  if (!(w->slots = calloc(total ? total : 1, sizeof *w->slots))) {
    cm_error("cannot allocate the optimizer's slots (%zu floats)", total);
    return CM_ENOMEM;
  }
  p = w->slots;
  for (int i = 0; i < w->nvars; i++)
    for (int k = 0; k < cm_optim_nslots(w->var_opt[i]->type); k++) {
      w->var_slots[i][k] = p;
      p += var_numel(&w->vars[i]);
    }
  cm_optim_describe(&set->def, desc, sizeof desc);
  cm_info("optimizer %s, applied here", desc);
  return 0;
}

/* Connects to the parameter servers and declares the variables; or, with
 * --standalone, initialises the parameters here. */
static int setup_params(struct dw_worker *w) {
  struct dw_client_opts opts = {0};
  int rc = 0;

  if (w->args.standalone) {
    /* The same initial model psd would create, so runs compare exactly. */
    dw_model_init(w->model, w->spec->job.seed);
    rc = setup_local_optim(w);
    goto out;
  }
  opts.worker = w->name;
  opts.connect_timeout_ms = w->args.connect_timeout_ms;
  rc = dw_client_new(&w->client, w->spec, &opts);
  if (rc < 0) {
    cm_error("cannot create the parameter-server client: %s",
             w->client && *dw_client_error(w->client)
                 ? dw_client_error(w->client)
                 : cm_strerror(rc));
    goto out;
  }
  rc = dw_client_declare(w->client, w->vars, w->nvars);
  if (rc < 0) {
    cm_error("declare: %s", *dw_client_error(w->client)
                                ? dw_client_error(w->client)
                                : cm_strerror(rc));
    goto out;
  }
  cm_info("declared %d variables on %d shards", w->nvars, w->spec->nps);
  for (int s = 0; s < w->spec->nps; s++) {
    const char *t = dw_client_target(w->client, s);
    if (!strncmp(t, "unix:", 5))
      cm_info("shard %d (%s) runs on this host: using %s", s,
              w->spec->ps[s].text, t);
    else
      cm_info("shard %d: using TCP to %s", s, t);
  }
  /* Every worker joins the coordinator: membership and heartbeats for
   * status, steps in sync mode, clocks with a staleness bound. */
  rc = dw_client_join(w->client, w->index, w->spec->job.heartbeat_ms, &w->step);
  if (rc < 0) {
    cm_error("join: %s", *dw_client_error(w->client)
                             ? dw_client_error(w->client)
                             : cm_strerror(rc));
    goto out;
  }
  if (w->sync)
    cm_info("joined the synchronous job at step %llu",
            (unsigned long long)w->step);
out:
  return rc;
}

/* Sync: when the last call's answer said the job rolled back to a common
 * checkpoint, goes on from its step (this worker keeps its place in its
 * data and redoes those step numbers), said once per rollback; likewise
 * from the step a restarted coordinator was joined at. Returns 1 then,
 * else 0. */
static void go_back(struct dw_worker *w, uint64_t step);

static int rolled_back(struct dw_worker *w) {
  uint64_t step;
  if (dw_client_rejoined(w->client, &step)) {
    /* Said once: a restarted coordinator asks each worker once. */
    cm_warn("the coordinator restarted: joined the job again at step %llu "
            "(generation %llu); going on from there (this worker was at step "
            "%llu)",
            (unsigned long long)step,
            (unsigned long long)dw_client_gen(w->client),
            (unsigned long long)w->step);
    if (dw_client_gen(w->client) > w->rollbacks)
      w->rollbacks = dw_client_gen(w->client);
    go_back(w, step);
    return 1;
  }
  if (!dw_client_rolled_back(w->client, &step))
    return 0;
  if (dw_client_gen(w->client) > w->rollbacks) {
    w->rollbacks = dw_client_gen(w->client);
    cm_warn("the job rolled back to step %llu (a shard restarted from its "
            "checkpoint); going on from there (this worker was at step %llu)",
            (unsigned long long)step, (unsigned long long)w->step);
  }
  go_back(w, step);
  return 1;
}

/* Goes on from `step`, below the step this worker was at: the steps
 * between were undone, so the run takes that many more (with its next
 * batches), and the job still commits every step it was asked for. */
static void go_back(struct dw_worker *w, uint64_t step) {
  if (step < w->step) {
    w->redone += (long)(w->step - step);
    w->total_steps += (long)(w->step - step);
  }
  w->step = step;
}

/* Sync: pulls the parameters of step w->step, parked by each shard until
 * it has committed step w->step - 1; again from the step rolled back to
 * when the job rolls back meanwhile. */
static int pull_step(struct dw_worker *w) {
  uint64_t version = 0;
  int rc;
  do
    rc = dw_client_pull_at(w->client, w->step, &version);
  while (rc == 0 && rolled_back(w));
  if (rc == 0 && version > w->step)
    w->step = version; /* we fell behind: start at the newest step */
  return rc;
}

/* Applies this step's gradient: locally with --standalone, else by pushing
 * it to the parameter servers. more: another step follows, whose pull may
 * travel with this push (async without a staleness bound). */
static int apply_grads(struct dw_worker *w, int examples, int more) {
  int rc = 0;

  if (w->args.standalone) {
    /* Update k = steps_done, as psd's sync step of the same number. */
    for (int i = 0; i < w->nvars; i++)
      cm_optim_apply(w->var_opt[i], (uint64_t)w->steps_done, w->vars[i].value,
                     w->var_slots[i], w->vars[i].grad, var_numel(&w->vars[i]));
    goto out;
  }
  dw_client_set_examples(w->client, (uint32_t)examples);
  if (w->sync) {
    int closed = 0, admitted = 0;
    uint64_t next = w->step + 1;
    /* Stage on every shard first, then ask to be counted: a worker that
     * dies in between can never leave the shards with different sets. */
    rc = dw_client_push_step(w->client, w->step, &closed);
    if (rc == 0 && rolled_back(w))
      goto out; /* the gradient is dropped: redo from the step rolled to */
    if (rc == 0 && !closed)
      rc = dw_client_admit(w->client, w->step, &admitted, &next);
    if (rc == 0 && rolled_back(w))
      goto out;
    if (rc == 0 && !admitted)
      w->dropped++;
    w->step = next > w->step ? next : w->step + 1;
  } else if (more && !w->ssp && !w->args.no_overlap) {
    rc = dw_client_push_pull(w->client);
    w->prefetched = rc == 0;
    w->clock++;
  } else {
    rc = dw_client_push(w->client);
    w->clock++;
  }
  if (rc < 0)
    cm_error("push at step %ld: %s", w->steps_done,
             *dw_client_error(w->client) ? dw_client_error(w->client)
                                         : cm_strerror(rc));
out:
  return rc;
}

static int pull_params(struct dw_worker *w) {
  int rc = 0;

  if (w->args.standalone)
    return 0;
  if (w->prefetched) {
    w->prefetched = 0;
    return 0;
  }
  if (w->ssp) {
    /* Wait here until the slowest live worker is close enough. */
    rc = dw_client_clock(w->client, w->clock);
    if (rc < 0) {
      cm_error("clock %llu: %s", (unsigned long long)w->clock,
               dw_client_error(w->client));
      return rc;
    }
  }
  if (w->sync) {
    rc = pull_step(w);
  } else {
    rc = dw_client_pull(w->client);
  }
  if (rc < 0)
    cm_error("pull at step %ld: %s", w->steps_done,
             *dw_client_error(w->client) ? dw_client_error(w->client)
                                         : cm_strerror(rc));
  return rc;
}

/* Prints one progress line and starts the next interval. */
static void report_progress(struct dw_worker *w, struct dw_progress *p,
                            long step, double start) {
  long spe = w->feed.steps_per_epoch;
  long epochs = (w->total_steps + spe - 1) / spe;
  double now = cm_mono_s(), dt = now - p->since;
  double per_step = (now - start) / (double)(step + 1);

  printf("epoch %ld/%ld step %ld/%ld loss %.4f acc %.4f ex/s %.0f eta %.1fs\n",
         step / spe + 1, epochs, step % spe + 1, spe,
         p->loss_sum / (double)p->steps,
         (double)p->correct / (double)p->examples,
         dt > 0 ? (double)p->examples / dt : 0.0,
         per_step * (double)(w->total_steps - step - 1));
  fflush(stdout);
  memset(p, 0, sizeof *p);
  p->since = now;
}

/* Sends one sd_notify(3) message to systemd; a no-op outside a Type=notify
 * unit and without libsystemd. */
static void notify(const char *state) {
#if PSD_HAVE_SYSTEMD
  sd_notify(0, state);
#else
  (void)state;
#endif
}

/* Who this is and in which job, for STATUS=: "worker:0 of 2, job 'x',
 * async" or "standalone, job 'x'". */
static void describe(const struct dw_worker *w, char *buf, size_t len) {
  if (w->args.standalone)
    snprintf(buf, len, "standalone, job '%s'", w->spec->job.name);
  else
    snprintf(buf, len, "%s of %d, job '%s', %s", w->name, w->nworkers,
             w->spec->job.name, w->spec->job.mode);
}

/* Tells systemd the worker is ready (it has joined the job, or is
 * standalone and about to train) and starts the watchdog clock. */
static void notify_ready(struct dw_worker *w) {
  char line[256], who[160];
  uint64_t usec = 0;

#if PSD_HAVE_SYSTEMD
  if (sd_watchdog_enabled(0, &usec) <= 0)
    usec = 0;
#endif
  w->wd_period_s = (double)usec / 2e6; /* ping at half the timeout */
  w->watchdog_at = w->status_at = cm_mono_s();
  describe(w, who, sizeof who);
  snprintf(line, sizeof line, "STATUS=%s, %s", who,
           w->args.standalone ? "training" : "joined");
  notify("READY=1");
  notify(line);
}

/* After step t: a WATCHDOG=1 when half the watchdog timeout has passed, and
 * a STATUS= line with the progress every DW_STATUS_PERIOD_S, e.g. "worker:0
 * of 2, job 'x', async, epoch 1/5, step 200/2345, 31234 ex/s". */
static void notify_step(struct dw_worker *w, long t) {
  double now = cm_mono_s();
  long spe = w->feed.steps_per_epoch;
  char line[256], who[160];

  if (w->wd_period_s > 0 && now - w->watchdog_at >= w->wd_period_s) {
    notify("WATCHDOG=1");
    w->watchdog_at = now;
  }
  if (now - w->status_at < DW_STATUS_PERIOD_S || spe <= 0)
    return;
  describe(w, who, sizeof who);
  snprintf(
      line, sizeof line, "STATUS=%s, epoch %ld/%ld, step %ld/%ld, %.0f ex/s",
      who, t / spe + 1, (w->total_steps + spe - 1) / spe, t + 1, w->total_steps,
      (double)(w->examples_done - w->status_examples) / (now - w->status_at));
  notify(line);
  w->status_at = now;
  w->status_examples = w->examples_done;
}

/* Clips this step's whole gradient (every variable: grads is one buffer) to
 * global L2 norm max_norm, before it is pushed or applied. Done here
 * because a shard sees only its slice of the gradient, and the global norm
 * is over all of it; the shards then apply an already clipped gradient. In
 * sync mode each worker clips its own gradient before the average. */
static void clip_grads(struct dw_worker *w, double max_norm) {
  double norm =
      kn_clip_global_norm(w->model->grads, w->model->nparams, max_norm);

  if (norm > max_norm)
    w->clipped++;
  if (norm > w->max_norm)
    w->max_norm = norm;
}

/* The training loop: pull, compute, push (or update locally), with the next
 * batch gathered on the thread pool meanwhile. */
static int train(struct dw_worker *w) {
  const struct cm_job *job = &w->spec->job;
  struct dw_progress prog = {0};
  long spe, limit, t;
  double start = cm_mono_s();
  int rc;

  rc = feeder_init(&w->feed, &w->train, job->batch_size, job->seed, w->index);
  for (int i = 1; rc == 0 && i < w->nfeeds; i++)
    rc = feeder_init(&w->emu_feed[i], &w->emu_ds[i], job->batch_size, job->seed,
                     i);
  if (rc == 0 && w->nfeeds > 1) {
    size_t max = (size_t)job->batch_size * w->nfeeds;
    w->batch_x = malloc(max * w->train.dim * sizeof *w->batch_x);
    w->batch_y = malloc(max);
    if (!w->batch_x || !w->batch_y)
      rc = CM_ENOMEM;
  }
  if (rc < 0) {
    cm_error("cannot set up the batch read-ahead: %s", cm_strerror(rc));
    goto out;
  }
  spe = w->feed.steps_per_epoch;
  w->total_steps = (long)job->epochs * spe;
  limit = w->args.max_steps >= 0 ? w->args.max_steps : job->max_steps;
  if (limit > 0 && limit < w->total_steps)
    w->total_steps = limit;
  cm_info("training: %d epochs of %ld steps of %d examples, %ld steps in all",
          job->epochs, spe, job->batch_size, w->total_steps);

  start = cm_mono_s();
  prog.since = start;
  if (w->total_steps > 0) {
    rc = feeder_queue(&w->feed, 0);
    for (int i = 1; rc == 0 && i < w->nfeeds; i++)
      rc = feeder_queue(&w->emu_feed[i], 0);
    if (rc < 0)
      goto out;
  }
  for (t = 0; t < w->total_steps; t++) {
    struct dw_slot *slot = feeder_wait(&w->feed, t);
    int queued = 0; /* step t + 1's batch is being gathered */
    const float *x = slot->x;
    const uint8_t *y = slot->y;
    int n = slot->n;
    float loss;
    int correct = 0;

    if (w->nfeeds > 1) {
      /* The emulated workers' batches of step t, back to back. */
      size_t dim = (size_t)w->train.dim;
      for (int i = 0; i < w->nfeeds; i++) {
        const struct dw_slot *s =
            i == 0 ? slot : feeder_wait(&w->emu_feed[i], t);
        size_t at = (size_t)(i == 0 ? 0 : n);
        memcpy(w->batch_x + at * dim, s->x, (size_t)s->n * dim * sizeof *x);
        memcpy(w->batch_y + at, s->y, (size_t)s->n);
        if (i > 0)
          n += s->n;
      }
      x = w->batch_x;
      y = w->batch_y;
    }
    if (t + 1 < w->total_steps) {
      rc = queue_step(w, t + 1);
      if (rc < 0)
        goto out;
      queued = 1;
    }
    rc = pull_params(w);
    if (rc < 0)
      goto out;
    loss = dw_model_train_step(w->model, x, y, n, &correct);
    if (job->clip_norm > 0)
      clip_grads(w, job->clip_norm);
    if (w->args.inject_delay_ms > 0)
      cm_sleep_ms(w->args.inject_delay_ms);
    rc = apply_grads(w, n, t + 1 < w->total_steps);
    if (rc < 0)
      goto out;
    /* A rollback during the last step lengthened the run. */
    if (!queued && t + 1 < w->total_steps && (rc = queue_step(w, t + 1)) < 0)
      goto out;
    w->steps_done++;
    w->examples_done += (uint64_t)n;
    prog.loss_sum += loss;
    prog.correct += correct;
    prog.examples += n;
    prog.steps++;
    if (job->log_every > 0 && (t + 1) % job->log_every == 0)
      report_progress(w, &prog, t, start);
    notify_step(w, t);
  }
out:
  w->train_s = cm_mono_s() - start;
  if (job->clip_norm > 0)
    cm_info("gradient clipping at global norm %g: %ld of %ld steps clipped, "
            "largest norm %.4g",
            job->clip_norm, w->clipped, w->steps_done, w->max_norm);
  return rc;
}

/* Prints the result line: worker 0 (and standalone) evaluate the final
 * parameters on the test set, the others report their own figures. */
static int finish(struct dw_worker *w) {
  long spe = w->feed.steps_per_epoch;
  double rate = w->train_s > 0 ? (double)w->examples_done / w->train_s *
                                     (double)w->nworkers
                               : 0.0;
  float loss = 0.0f;
  int rc = 0, correct;

  if (w->client) {
    /* Stop counting in the job's n before the final pull and evaluation. */
    rc = dw_client_leave(w->client);
    if (rc < 0)
      cm_warn("leave: %s", dw_client_error(w->client));
    rc = 0;
  }
  if (w->index != 0) {
    printf("done: steps=%ld examples_per_s=%.0f wall_s=%.1f dropped=%ld",
           w->steps_done, rate, w->train_s, w->dropped);
    if (w->redone)
      printf(" redone=%ld", w->redone);
    printf("\n");
    fflush(stdout);
    goto out;
  }
  if (w->client) {
    uint64_t version;
    /* Sync: wait for the last step's commit, so the result is the job's. */
    (void)version;
    rc = w->sync ? pull_step(w) : dw_client_pull(w->client);
    if (rc < 0) {
      cm_error("final pull: %s", dw_client_error(w->client));
      goto out;
    }
  }
  if (w->args.save_params) {
    FILE *f = fopen(w->args.save_params, "wb");
    if (!f || fwrite(w->model->params, sizeof(float), w->model->nparams, f) !=
                  w->model->nparams) {
      cm_error("%s: cannot write the parameters: %s", w->args.save_params,
               strerror(errno));
      if (f)
        fclose(f);
      rc = CM_EIO;
      goto out;
    }
    if (fclose(f) != 0) {
      cm_error("%s: %s", w->args.save_params, strerror(errno));
      rc = CM_EIO;
      goto out;
    }
  }
  correct = dw_model_evaluate(w->model, w->test.x, w->test.y, w->test.n, &loss);
  cm_info("test set: %d of %d correct, mean loss %.4f", correct, w->test.n,
          loss);
  printf("final: test_accuracy=%.4f epochs=%ld examples_per_s=%.0f "
         "wall_s=%.1f steps=%ld dropped=%ld",
         (double)correct / (double)w->test.n,
         spe > 0 ? (w->steps_done + spe - 1) / spe : 0, rate, w->train_s,
         w->steps_done, w->dropped);
  if (w->redone)
    printf(" redone=%ld", w->redone);
  printf("\n");
  fflush(stdout);
out:
  return rc;
}

int main(int argc, char **argv) {
  struct dw_worker w;
  char err[8192], blas[256], logname[80];
  int status = DW_EXIT_FAILED;
  int rpc_ready = 0;
  int rc;

  memset(&w, 0, sizeof w);
  w.first_gpu = -1;
  rc = parse_args(argc, argv, &w.args);
  if (rc != 0) {
    status = rc > 0 ? DW_EXIT_OK : DW_EXIT_USAGE;
    goto out;
  }
  /* Before anything touches OpenBLAS: this may re-execute the program. */
  /* Replicas share the CPU: each gets its share of the BLAS threads. */
  kn_blas_init(argv, w.args.threads > 0 && w.args.replicas > 1
                         ? (w.args.threads / w.args.replicas > 0
                                ? w.args.threads / w.args.replicas
                                : 1)
                         : w.args.threads);
  kn_blas_describe(blas, sizeof blas);
  cm_log_set_name("dworker");
  cm_info("%s", blas);

  rc = cm_spec_load(w.args.cluster, &w.spec, err, sizeof err);
  if (rc < 0) {
    print_spec_errors(err);
    status = DW_EXIT_USAGE;
    goto out;
  }
  /* Standalone needs no task; one given on the command line is still
   * checked, and names the log lines. */
  if (!w.args.standalone || w.args.task != NULL) {
    rc = cm_spec_resolve_task(w.spec, w.args.task, err, sizeof err);
    if (rc < 0) {
      print_spec_errors(err);
      status = DW_EXIT_USAGE;
      goto out;
    }
    if (w.spec->task.type != CM_TASK_WORKER) {
      fprintf(stderr, "dworker: task %s:%d is not a worker task\n",
              cm_task_type_name(w.spec->task.type), w.spec->task.index);
      status = DW_EXIT_USAGE;
      goto out;
    }
  }
  w.nfeeds = 1;
  if (w.args.emulate > 0 && !w.args.standalone) {
    fprintf(stderr, "dworker: --emulate-workers needs --standalone\n");
    status = DW_EXIT_USAGE;
    goto out;
  }
  if (w.args.standalone) {
    w.index = 0;
    w.nworkers = 1;
    if (w.args.emulate > 1)
      w.nfeeds = w.args.emulate;
    snprintf(w.name, sizeof w.name, "standalone");
  } else {
    w.index = w.spec->task.index;
    w.nworkers = w.spec->nworker;
    w.sync = strcmp(w.spec->job.mode, "sync") == 0;
    w.ssp = !w.sync && w.spec->job.staleness >= 0;
    snprintf(w.name, sizeof w.name, "worker:%d", w.index);
  }
  snprintf(logname, sizeof logname, "dworker %s", w.name);
  cm_log_set_name(logname);

  if (pick_device(&w) < 0)
    goto out;
  if (load_data(&w) < 0)
    goto out;
  if (build_model(&w) < 0)
    goto out;
  if (!w.args.standalone) {
    cm_rpc_global_init(); /* before any gRPC use, as rpc.h asks */
    rpc_ready = 1;
  }
  if (setup_params(&w) < 0)
    goto out;
  notify_ready(&w);
  if (train(&w) < 0)
    goto out;
  notify("STOPPING=1");
  if (finish(&w) < 0)
    goto out;
  status = DW_EXIT_OK;
out:
  feeder_free(&w.feed);
  for (int i = 1; i < w.nfeeds; i++) {
    feeder_free(&w.emu_feed[i]);
    dw_dataset_free(&w.emu_ds[i]);
  }
  free(w.batch_x);
  free(w.batch_y);
  dw_client_free(w.client);
  if (rpc_ready)
    cm_rpc_global_shutdown();
  free(w.slots);
  dw_model_free(w.model);
  dw_dataset_free(&w.test);
  dw_dataset_free(&w.train);
  cm_spec_free(w.spec);
  return status;
}
