/* The job's measured rate, printed once every worker is done: ps:0's
 * coordinator adds up what each worker reported as it left (its examples,
 * and when its first and last steps were, on the coordinator's clock), and
 * pslaunch prints that as one stdout line
 *
 *   job: workers=2 reported=2 examples=300000 wall_s=5.83 examples_per_s=51456
 *
 * (every worker's examples over the wall time from the first step of any
 * worker to the last step of any). This is the figure to quote for the
 * job; a worker's own rate is its final:/done: line's
 * worker_examples_per_s. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "pslaunch_internal.h"

/* How long the one Status call may take: the shards are up and idle. */
#define PL_JOB_RATE_DEADLINE_MS 3000

void pl_job_rate_print(const struct pl_launch *l, json_t *status) {
  json_t *r = json_object_get(status, "job_rate");
  long long workers = json_integer_value(json_object_get(r, "workers"));
  double examples = json_number_value(json_object_get(r, "examples"));
  double wall = json_number_value(json_object_get(r, "wall_s"));
  double rate = json_number_value(json_object_get(r, "examples_per_s"));
  char line[256];
  int n;

  if (!r || workers <= 0) {
    pl_say("no worker reported its examples to ps:0 as it left, so there is "
           "no job rate to print");
    return;
  }
  if (workers < l->spec->nworker)
    pl_say("the job's rate covers %lld of the %d workers: the others did not "
           "leave the job cleanly (or ps:0 restarted since they did)",
           workers, l->spec->nworker);
  n = snprintf(line, sizeof line,
               "job: workers=%d reported=%lld examples=%.0f wall_s=%.2f "
               "examples_per_s=%.0f\n",
               l->spec->nworker, workers, examples, wall, rate);
  if (n > 0 && (size_t)n < sizeof line)
    pl_write_all(STDOUT_FILENO, line, (size_t)n);
}

void pl_job_rate_ask(const struct pl_launch *l) {
  char *text = NULL, err[1024];
  json_t *root = NULL;

  if (pl_ask_status(l, PL_JOB_RATE_DEADLINE_MS, &text, err, sizeof err) < 0) {
    pl_say("cannot ask ps:0 for the job's rate: %s", err);
    goto out;
  }
  root = json_loads(text, 0, NULL);
  if (!root) {
    pl_say("ps:0's status is not JSON; no job rate");
    goto out;
  }
  pl_job_rate_print(l, root);
out:
  json_decref(root);
  free(text);
}
