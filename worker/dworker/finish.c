/* The end of a run, for every model: a worker of a job leaves it, then
 * prints its result line on stdout. Worker 0 pulls the final parameters
 * (--standalone has them already), has the model evaluate them on the test
 * set (w->trainer->evaluate: the line's leading figures) and prints the
 * final: line; every other worker prints its done: line. Both are
 * documented in --help, and tests and launchers parse them. */
#include <stdio.h>

#include "clock.h"
#include "dworker_internal.h"
#include "err.h"
#include "log.h"

/* Ends a result line with the counts both lines carry when they are not
 * 0: in sync mode after a rollback, the steps undone and taken again. */
static void end_line(const struct dw_worker *w) {
  if (w->redone)
    printf(" redone=%ld", w->redone);
  printf("\n");
  fflush(stdout);
}

/* Prints the result line: worker 0 (and standalone) evaluate the final
 * parameters on the test set, the others report their own figures. */
int dw_finish(struct dw_worker *w) {
  long spe = w->steps_per_epoch;
  /* This worker's own rate; the job's is measured by the coordinator from
   * every worker's report (psc__client_leave) and printed by pslaunch. */
  double rate = w->train_s > 0 ? (double)w->examples_done / w->train_s : 0.0;
  char figures[8192] = ""; /* a CTR run's files' paths, escaped, too */
  int rc = 0;

  if (w->client) {
    /* Stop counting in the job's n before the final pull and evaluation. */
    rc = psc__client_leave(w->client, w->examples_done, w->train_s,
                           cm_mono_s() - w->train_end);
    if (rc < 0)
      cm_warn("leave: %s", psc__client_error(w->client));
    rc = 0;
  }
  if (w->index != 0) {
    if (w->trainer && w->trainer->report)
      w->trainer->report(w, figures, sizeof figures);
    printf("done: %s%ssteps=%ld examples=%llu worker_examples_per_s=%.0f "
           "wall_s=%.1f dropped=%ld",
           figures, *figures ? " " : "", w->steps_done,
           (unsigned long long)w->examples_done, rate, w->train_s, w->dropped);
    end_line(w);
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
  rc = w->trainer->evaluate(w, figures, sizeof figures);
  if (rc < 0)
    goto out;
  printf("final: %s epochs=%ld examples=%llu worker_examples_per_s=%.0f "
         "wall_s=%.1f steps=%ld dropped=%ld",
         figures, spe > 0 ? (w->steps_done + spe - 1) / spe : 0,
         (unsigned long long)w->examples_done, rate, w->train_s, w->steps_done,
         w->dropped);
  end_line(w);
out:
  return rc;
}
