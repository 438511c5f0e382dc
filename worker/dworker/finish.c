/* The end of a run: a worker of a job leaves it, then prints its result
 * line on stdout. Worker 0 pulls the final parameters (--standalone has
 * them already), writes them out with --save-params, evaluates them on the
 * test set and prints the final: line; every other worker prints its done:
 * line. Both are documented in --help, and tests and launchers parse
 * them. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "clock.h"
#include "dworker_internal.h"
#include "err.h"
#include "log.h"

/* Prints the result line: worker 0 (and standalone) evaluate the final
 * parameters on the test set, the others report their own figures. */
int dw_finish(struct dw_worker *w) {
  long spe = w->feed.steps_per_epoch;
  /* This worker's own rate; the job's is measured by the coordinator from
   * every worker's report (psc__client_leave) and printed by pslaunch. */
  double rate = w->train_s > 0 ? (double)w->examples_done / w->train_s : 0.0;
  float loss = 0.0f;
  int rc = 0, correct;

  if (w->client) {
    /* Stop counting in the job's n before the final pull and evaluation. */
    rc = psc__client_leave(w->client, w->examples_done, w->train_s,
                           cm_mono_s() - w->train_end);
    if (rc < 0)
      cm_warn("leave: %s", psc__client_error(w->client));
    rc = 0;
  }
  if (w->index != 0) {
    printf("done: steps=%ld examples=%llu worker_examples_per_s=%.0f "
           "wall_s=%.1f dropped=%ld",
           w->steps_done, (unsigned long long)w->examples_done, rate,
           w->train_s, w->dropped);
    if (w->redone)
      printf(" redone=%ld", w->redone);
    printf("\n");
    fflush(stdout);
    goto out;
  }
  if (w->client) {
    /* Sync: wait for the last step's commit, so the result is the job's. */
    rc = w->sync ? dw_pull_step(w) : psc__client_pull(w->client);
    if (rc < 0) {
      cm_error("final pull: %s", psc__client_error(w->client));
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
  dw_tb_final(w, w->total_steps, (double)correct / (double)w->test.n, loss);
  printf("final: test_accuracy=%.4f epochs=%ld examples=%llu "
         "worker_examples_per_s=%.0f wall_s=%.1f steps=%ld dropped=%ld",
         (double)correct / (double)w->test.n,
         spe > 0 ? (w->steps_done + spe - 1) / spe : 0,
         (unsigned long long)w->examples_done, rate, w->train_s, w->steps_done,
         w->dropped);
  if (w->redone)
    printf(" redone=%ld", w->redone);
  printf("\n");
  fflush(stdout);
out:
  return rc;
}
