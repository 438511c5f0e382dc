/* The dworker program's internals, shared by its files and by nothing
 * else: the worker's state (struct dw_worker), which main owns and passes
 * to every step, and the functions each file gives the others.
 *
 *   dworker.c  main: the run from the command line to the exit status
 *   cmdline.c  the command line and --help
 *   feeder.c   where each training batch comes from (feeder.h)
 *   setup.c    the device, the data, the model, the parameters
 *   image.c    the image models' side of the loop (struct dw_trainer)
 *   train.c    the one pull-compute-push loop, and rollbacks in sync mode
 *   notify.c   what systemd is told
 *   finish.c   the one result: evaluation and the final: (or done:) line
 *   ctr_run.c  job.model "ctr": the click-through-rate model over tables,
 *              its setup and its side of the loop (struct dw_trainer)
 *   ctr_stream.c  job.ctr.stream: the CTR model's windows and their
 *              progressive validation
 *   tboard.c   TensorBoard event files (job.tensorboard_dir)
 *
 * Every function here returns 0 or a negative CM_E* code after logging
 * what went wrong, unless its comment says otherwise. */
#ifndef DW_DWORKER_INTERNAL_H
#define DW_DWORKER_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "feeder.h"
#include "idx.h"
#include "model.h"
#include "psclient.h"
#include "spec.h"
#include "tfevents.h"

/* Most workers --emulate-workers stands in for. */
#define DW_MAX_EMULATED 64
/* Most tables one step pulls rows of and pushes row gradients to. */
#define DW_MAX_STEP_TABLES 4

struct dw_worker;

/* What a model gives the one training loop (train.c) and the one
 * end-of-run report (finish.c): its batches, its forward and backward, the
 * rows of tables a step pulls and pushes, its progress line and its
 * test-set figures. The loop owns the rest: the steps and their count, the
 * pulls and pushes of the dense variables (w->vars), the sync protocol
 * (push at the step, admit, pull at the version, rollbacks), and the
 * counts the result line gives (steps, dropped, redone). A model's own
 * state hangs on w->mctx. Hooks that return int return 0 (or what they
 * say) or a negative CM_E* code after logging what went wrong. */
struct dw_trainer {
  /* Before the first step: sets up the batches and w->steps_per_epoch
   * (this worker's steps in one pass over its share). */
  int (*start)(struct dw_worker *w);
  /* Logs the "training: ..." line, once w->total_steps is known. */
  void (*say_plan)(struct dw_worker *w);
  /* Starts gathering step t's batch ahead of its step (on a thread pool);
   * NULL when batch does all the work. */
  int (*queue)(struct dw_worker *w, long t);
  /* Makes step t's batch the current one; returns its examples (> 0), or
   * 0 when the data ended (a stream's end: w->stream), which ends the
   * run. */
  int (*batch)(struct dw_worker *w, long t);
  /* The current batch's rows of each table: q[i].rows is where the pull
   * writes, q[i].grads what the push sends. Returns the tables filled
   * (<= max); NULL for a model without tables. */
  int (*tables)(struct dw_worker *w, struct psc__rows *q, int max);
  /* Forward and backward over the current batch with the pulled values:
   * overwrites the gradients of w->vars (and of the tables' rows); *loss
   * gets the batch's mean loss. */
  int (*compute)(struct dw_worker *w, float *loss);
  /* After step t (counted in w->steps_done) of n examples with mean loss
   * `loss`: sums the figures, and prints the progress line when due. */
  void (*progress)(struct dw_worker *w, long t, float loss, int n);
  /* Worker 0, the final parameters pulled: evaluates them on the test set
   * and writes the final: line's leading figures ("test_accuracy=0.8712")
   * into figures. */
  int (*evaluate)(struct dw_worker *w, char *figures, size_t size);
  /* Workers other than 0: the model's figures for the done: line (NULL:
   * none). */
  void (*report)(struct dw_worker *w, char *figures, size_t size);
  /* Frees w->mctx (safe on a model that was never set up). */
  void (*free)(struct dw_worker *w);
};

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
  struct psc__var vars[DW_MODEL_MAX_VARS]; /* views into model */
  int nvars;                               /* entries used in vars */
  struct psc__client *client; /* owned: the parameter-server client, or NULL */
  float *slots;               /* owned: optimizer slots (standalone only) */
  struct dw_feeder feed;      /* the read-ahead */
  long first_step;            /* the first step's index (sync: the step the job
                                 was at when this run joined it), which picks
                                 the first batch; 0 for a fresh job */
  long total_steps;           /* one past the last step's index: this run
                                 takes steps first_step..total_steps - 1 */
  long steps_done;            /* steps taken */
  uint64_t examples_done;     /* training examples consumed */
  double train_start;         /* cm_mono_s() at the training loop's start */
  double train_s;             /* wall time of the training loop: its first
                                 step's start to its last step's end */
  double train_end;           /* cm_mono_s() at the training loop's end */
  int sync;                   /* job.sync.mode is "sync" */
  int ssp;                    /* async with a staleness bound */
  uint64_t step;              /* sync: the step being computed */
  uint64_t clock;             /* async: pushes completed */
  int prefetched;             /* async: the last push also pulled the next
                                 step's parameters */
  long dropped;               /* sync: gradients the coordinator dropped */
  uint64_t rollbacks;         /* sync: the job's rollbacks (its generation)
                                 said in the log */
  long redone;                /* sync: steps this worker computed that a
                                 rollback undid (and that it takes again) */
  int nfeeds;                 /* feeders: 1, or N with --emulate-workers N */
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
  long clipped;           /* steps whose gradient norm was above clip_norm */
  double max_norm;        /* the largest gradient norm seen (with clip_norm) */
  struct cm_tfevents *tb; /* owned: the TensorBoard event file, NULL when
                             job.tensorboard_dir is not set (or a write
                             failed) */
  /* the model's side of the loop (train.c, finish.c); NULL until a model
   * is set up */
  const struct dw_trainer *trainer;
  /* owned (trainer->free): the model's own state */
  void *mctx;
  /* the dense gradients as one buffer, which job.optimizer.clip_norm
   * clips; NULL when the model has none (CTR: not clipped) */
  float *grads;
  /* floats in grads */
  size_t ngrads;
  /* this worker's steps in one pass over its share (trainer->start) */
  long steps_per_epoch;
  /* the data is a stream (job.ctr.stream): no step count; the run ends
   * when trainer->batch returns 0 */
  int stream;
};

/* ---- cmdline.c ---- */

/* Fills *a from argv (a's strings point into argv). Returns 0, 1 when
 * --help was printed, or CM_EINVAL after explaining the mistake on stderr.
 * Nothing else happens here, so it may run before kn_blas_init's re-exec. */
int dw_parse_args(int argc, char **argv, struct dw_args *a);

/* Prints a spec error text (one mistake per line) to stderr. */
void dw_print_spec_errors(const char *err);

/* ---- feeder.c: the worker's batches, from its feeders ---- */

/* Sets up the read-ahead: this worker's feeder (w->feed) over its share
 * and, with --emulate-workers N, the feeders of shares 1..N-1 and the
 * buffer their batches are joined in. Returns 0, or a CM_E* code for the
 * caller to report. */
int dw_batches_init(struct dw_worker *w);

/* Starts gathering step `step`'s batches: this worker's and, with
 * --emulate-workers, the emulated ones'. */
int dw_batches_queue(struct dw_worker *w, long step);

/* Waits for step t's batch and points *x and *y at it (owned by the
 * feeders, valid until step t + 2 is queued); returns its examples. With
 * --emulate-workers the batch is the N workers' batches back to back. */
int dw_batches_wait(struct dw_worker *w, long t, const float **x,
                    const uint8_t **y);

/* Frees what dw_batches_init set up (safe on a zeroed worker). */
void dw_batches_free(struct dw_worker *w);

/* ---- setup.c ---- */

/* Settles --device before anything is loaded (see setup.c). */
int dw_pick_device(struct dw_worker *w);

/* Loads the training share (and, for worker 0, the test set). */
int dw_load_data(struct dw_worker *w);

/* Builds the spec's model (job.model) and the variables that view its
 * parameters and grads. */
int dw_build_model(struct dw_worker *w);

/* Connects to the parameter servers, declares the variables and joins the
 * job; or, with --standalone, initialises the parameters and the
 * optimizers here. */
int dw_setup_params(struct dw_worker *w);

/* ---- image.c ---- */

/* The image models' side of the loop (softmax, MLP, CNN over w->model and
 * the feeders); dw_build_model sets w->trainer to it. */
extern const struct dw_trainer dw_image_trainer;

/* ---- train.c ---- */

/* The training loop, for every model (w->trainer): runs every step, then
 * sets w->train_s. */
int dw_train(struct dw_worker *w);

/* Sync: pulls the parameters of step w->step (see train.c). Logs nothing:
 * the caller says which pull failed, with psc__client_error. */
int dw_pull_step(struct dw_worker *w);

/* ---- notify.c: systemd; no-ops without libsystemd or outside a unit ---- */

/* READY=1 and a first STATUS=, and starts the watchdog clock. */
void dw_notify_ready(struct dw_worker *w);

/* After step t: WATCHDOG=1 and STATUS= when they are due. */
void dw_notify_step(struct dw_worker *w, long t);

/* ---- ctr_run.c ---- */

/* Sets up job.model "ctr" (docs/ctr.md): its data, its model, the
 * variables and tables declared on the shards and the job joined; sets
 * w->trainer to its side of the loop, which dw_train and dw_finish run. */
int dw_ctr_setup(struct dw_worker *w);

/* ---- ctr_stream.c: job.ctr.stream ---- */

struct dw_svm;
struct dw_ctr_stream;

/* Opens job.ctr.stream (paths relative to the spec file's directory) and
 * makes SIGTERM and SIGINT end the stream. */
int dw_ctrs_open(struct dw_worker *w, struct dw_ctr_stream **out);

/* Waits for the next window and loads this worker's share of it (worker k
 * of n: its examples k, k + n, ...) into *part, its name into name:
 * returns 1, or 0 when the stream ended (the marker, or SIGTERM: said). */
int dw_ctrs_next(struct dw_ctr_stream *cs, int share, int nshares,
                 struct dw_svm *part, char *name, size_t size);

/* Records the window just taken, scored before training on n examples
 * (log loss ll, AUC auc): its progress line and TensorBoard event. */
void dw_ctrs_scored(struct dw_worker *w, struct dw_ctr_stream *cs,
                    const char *name, size_t n, double ll, double auc);

/* Whether SIGTERM or SIGINT came: then says where in window `name` (done
 * of its n examples here) the stream ended, and returns 1. */
int dw_ctrs_stop(const struct dw_ctr_stream *cs, const char *name, size_t done,
                 size_t n);

/* Windows taken so far. */
unsigned long long dw_ctrs_windows(const struct dw_ctr_stream *cs);

/* The result line's figures: windows, examples scored, their log loss and
 * the example-weighted mean of the windows' AUCs, the last window's. */
void dw_ctrs_figures(const struct dw_ctr_stream *cs, char *out, size_t size);

/* Frees cs (NULL is fine). */
void dw_ctrs_free(struct dw_ctr_stream *cs);

/* ---- tboard.c: TensorBoard events; no-ops while w->tb is NULL ---- */

/* With job.tensorboard_dir: creates this worker's event file there. */
int dw_tb_open(struct dw_worker *w);

/* The figures of the progress line after step `step` (steps counted from
 * 1): mean loss and training accuracy over the interval, examples/s, mean
 * step time; with a client, the bytes it has pulled and pushed so far.
 * Never fails: a write error is logged once and ends the output. */
void dw_tb_progress(struct dw_worker *w, long step, double loss, double acc,
                    double examples_per_s, double step_ms);

/* Worker 0's test-set figures of the final line, at step `step`. */
void dw_tb_final(struct dw_worker *w, long step, double acc, double loss);

/* The CTR model's event (ctr_run.c): split "train" (with examples_per_s
 * > 0, and the bytes moved) or "test", its log loss and AUC. */
void dw_tb_ctr(struct dw_worker *w, long step, const char *split,
               double logloss, double auc, double examples_per_s);

/* Closes the event file (safe when none is open). */
void dw_tb_close(struct dw_worker *w);

/* ---- finish.c ---- */

/* Leaves the job and prints the result line, for every model (see
 * finish.c). */
int dw_finish(struct dw_worker *w);

#endif
