/* What the worker tells systemd when it runs as a Type=notify unit
 * (deploy/systemd/dworker@.service): READY=1 once it has joined the job,
 * STATUS= with its progress, WATCHDOG=1 pings from the training loop and
 * STOPPING=1 when training is over. Without libsystemd those are compiled
 * out. */
#include <stdio.h>

#include "clock.h"
#include "dworker_internal.h"
#include "notify.h"

/* Seconds between systemd STATUS= updates from the training loop. */
#define DW_STATUS_PERIOD_S 2.0

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
void dw_notify_ready(struct dw_worker *w) {
  char line[256], who[160];
  uint64_t usec = cm_notify_watchdog_usec();

  w->wd_period_s = (double)usec / 2e6; /* ping at half the timeout */
  w->watchdog_at = w->status_at = cm_mono_s();
  describe(w, who, sizeof who);
  snprintf(line, sizeof line, "STATUS=%s, %s", who,
           w->args.standalone ? "training" : "joined");
  cm_notify("READY=1");
  cm_notify(line);
}

/* After step t: a WATCHDOG=1 when half the watchdog timeout has passed, and
 * a STATUS= line with the progress every DW_STATUS_PERIOD_S, e.g. "worker:0
 * of 2, job 'x', async, epoch 1/5, step 200/2345, 31234 ex/s". */
void dw_notify_step(struct dw_worker *w, long t) {
  double now = cm_mono_s();
  long spe = w->feed.steps_per_epoch;
  char line[256], who[160];

  if (w->wd_period_s > 0 && now - w->watchdog_at >= w->wd_period_s) {
    cm_notify("WATCHDOG=1");
    w->watchdog_at = now;
  }
  if (now - w->status_at < DW_STATUS_PERIOD_S || spe <= 0)
    return;
  describe(w, who, sizeof who);
  snprintf(
      line, sizeof line, "STATUS=%s, epoch %ld/%ld, step %ld/%ld, %.0f ex/s",
      who, t / spe + 1, (w->total_steps + spe - 1) / spe, t + 1, w->total_steps,
      (double)(w->examples_done - w->status_examples) / (now - w->status_at));
  cm_notify(line);
  w->status_at = now;
  w->status_examples = w->examples_done;
}
