/* dworker: one worker task of a psd training job.
 *
 * main reads top to bottom: parse the command line, pick the BLAS kernels,
 * load and check the cluster spec, settle which worker this is, pick the
 * device, load this worker's 1/n share of Fashion-MNIST (worker 0 also the
 * test set), build the spec's model (softmax, MLP or CNN; or the CTR model
 * over tables, ctr_run.c), declare its variables on the parameter servers,
 * then loop pull, compute, push (train.c, one loop for every model); at
 * the end worker 0 pulls the final parameters and evaluates them on the
 * test set (finish.c). With --standalone there is no parameter server: the same
 * model, data and batch size are trained in this process with the spec's
 * optimizer applied locally (the single-process baseline the distributed runs
 * are compared with). Each step of that story lives in a file of its own
 * (dworker_internal.h lists them); the batches come from feeder.c.
 *
 * stdout carries only the progress and result lines documented in --help
 * (flushed line by line; a launcher reads them through a pipe); logs go to
 * stderr. Run as a systemd Type=notify unit (deploy/systemd/dworker@.service)
 * it tells systemd how it is doing (notify.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blas.h"
#include "dworker_internal.h"
#include "err.h"
#include "log.h"
#include "notify.h"
#include "rpc.h"

/* Exit codes, as documented in --help. */
enum { DW_EXIT_OK = 0, DW_EXIT_FAILED = 1, DW_EXIT_USAGE = 2 };

/* The OpenBLAS threads to ask for: --threads (0 = OpenBLAS's own default).
 * Replicas share the CPU: each gets its share of the BLAS threads, at
 * least one. */
static int blas_threads(const struct dw_args *a) {
  if (a->threads <= 0 || a->replicas <= 1)
    return a->threads;
  return a->threads / a->replicas > 0 ? a->threads / a->replicas : 1;
}

/* Loads and checks the cluster spec into w->spec. Returns 0, or a negative
 * code after printing the spec's mistakes on stderr. */
static int load_spec(struct dw_worker *w) {
  char err[8192];
  int rc;

  rc = cm_spec_open(w->args.cluster, &w->spec, NULL, err, sizeof err);
  if (rc < 0)
    dw_print_spec_errors(err);
  else
    cm_spec_say_notes(w->spec, "dworker");
  return rc;
}

/* Settles who this process is: a worker task of the job (from --task, else
 * the spec's "task", else TF_CONFIG's), with its index, the job's worker
 * count and its mode; or, with --standalone, the one worker of its own run
 * over feeders for --emulate-workers N shares. Names the log lines after
 * it. Returns 0, or a negative code after saying on stderr what is wrong
 * with the command line or spec. */
static int resolve_role(struct dw_worker *w) {
  char err[8192], logname[80];
  int rc = 0;

  /* Standalone needs no task; one given on the command line is still
   * checked. */
  if (!w->args.standalone || w->args.task != NULL) {
    rc = cm_spec_resolve_task(w->spec, w->args.task, err, sizeof err);
    if (rc < 0) {
      dw_print_spec_errors(err);
      goto out;
    }
    if (w->spec->task.type != CM_TASK_WORKER) {
      fprintf(stderr, "dworker: task %s:%d is not a worker task\n",
              cm_task_type_name(w->spec->task.type), w->spec->task.index);
      rc = CM_EINVAL;
      goto out;
    }
  }
  w->nfeeds = 1;
  if (w->args.emulate > 0 && !w->args.standalone) {
    fprintf(stderr, "dworker: --emulate-workers needs --standalone\n");
    rc = CM_EINVAL;
    goto out;
  }
  if (w->args.standalone) {
    w->index = 0;
    w->nworkers = 1;
    if (w->args.emulate > 1)
      w->nfeeds = w->args.emulate;
    snprintf(w->name, sizeof w->name, "standalone");
  } else {
    w->index = w->spec->task.index;
    w->nworkers = w->spec->nworker;
    w->sync = strcmp(w->spec->job.mode, "sync") == 0;
    w->ssp = !w->sync && w->spec->job.staleness >= 0;
    snprintf(w->name, sizeof w->name, "worker:%d", w->index);
  }
  snprintf(logname, sizeof logname, "dworker %s", w->name);
  cm_log_set_name(logname);
out:
  return rc;
}

/* Sets up the spec's model and its parameters: the image models' device,
 * data and model (setup.c), the CTR model's data, model and tables
 * (ctr_run.c); then the variables declared on the parameter servers and
 * the job joined (or, with --standalone, the parameters initialised here).
 * Either way w->trainer is the model's side of the one training loop.
 * Sets *rpc_ready once gRPC is initialised (there is none standalone). */
static int setup(struct dw_worker *w, int *rpc_ready) {
  int ctr = !strcmp(w->spec->job.model, "ctr");
  int rc = 0;

  if (!ctr && ((rc = dw_pick_device(w)) < 0 || (rc = dw_load_data(w)) < 0 ||
               (rc = dw_build_model(w)) < 0))
    goto out;
  if (!w->args.standalone) {
    cm_rpc_global_init(); /* before any gRPC use, as rpc.h asks */
    *rpc_ready = 1;
  }
  rc = ctr ? dw_ctr_setup(w) : dw_setup_params(w);
out:
  return rc;
}

int main(int argc, char **argv) {
  struct dw_worker w;
  char blas[256];
  int status = DW_EXIT_FAILED;
  int rpc_ready = 0;
  int rc;

  /* kn_blas_init may re-execute the program once, with OPENBLAS_CORETYPE
   * set for this CPU (blas.h), so it must stay before anything touches
   * OpenBLAS; only the command line is read before it. */
  memset(&w, 0, sizeof w);
  w.first_gpu = -1;
  rc = dw_parse_args(argc, argv, &w.args);
  if (rc != 0) {
    /* rc > 0: --help was printed, and that is a success. */
    status = rc > 0 ? DW_EXIT_OK : DW_EXIT_USAGE;
    goto out;
  }
  kn_blas_init(argv, blas_threads(&w.args));
  kn_blas_describe(blas, sizeof blas);
  cm_log_set_name("dworker");
  cm_info("%s", blas);

  if (load_spec(&w) < 0 || resolve_role(&w) < 0) {
    status = DW_EXIT_USAGE;
    goto out;
  }
  if (dw_tb_open(&w) < 0)
    goto out;
  if (setup(&w, &rpc_ready) < 0)
    goto out;
  dw_notify_ready(&w);
  if (dw_train(&w) < 0)
    goto out;
  cm_notify("STOPPING=1");
  if (dw_finish(&w) < 0)
    goto out;
  status = DW_EXIT_OK;
out:
  if (w.trainer)
    w.trainer->free(&w);
  dw_tb_close(&w);
  dw_batches_free(&w);
  for (int i = 1; i < w.nfeeds; i++)
    dw_dataset_free(&w.emu_ds[i]);
  psc__client_free(w.client);
  if (rpc_ready)
    cm_rpc_global_shutdown();
  free(w.slots);
  dw_model_free(w.model);
  dw_dataset_free(&w.test);
  dw_dataset_free(&w.train);
  cm_spec_free(w.spec);
  return status;
}
