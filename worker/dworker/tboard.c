/* TensorBoard output (job.tensorboard_dir): each worker writes its own
 * event file (common/base/tfevents.h) in that directory, one event per
 * progress line with the line's figures and the bytes the client has
 * moved, and worker 0 one more with the test accuracy of the final line
 * (the CTR model: log loss and AUC, dw_tb_ctr).
 * The file is an aid, not the result: a write that fails is said once and
 * ends the output, never the training. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "dworker_internal.h"
#include "err.h"
#include "log.h"
#include "tfevents.h"

int dw_tb_open(struct dw_worker *w) {
  const char *dir = w->spec->job.tensorboard_dir;
  int rc;

  if (!dir[0])
    return 0;
  rc = cm_tfevents_open(&w->tb, dir, w->index);
  if (rc < 0) {
    cm_error("job.tensorboard_dir %s: cannot create an event file there: %s",
             dir, rc == CM_EIO ? strerror(errno) : cm_strerror(rc));
    return rc;
  }
  cm_info("TensorBoard: writing %s", cm_tfevents_path(w->tb));
  return 0;
}

/* Writes one event of n scalars at step; on failure says so and stops. */
static void write_event(struct dw_worker *w, long step,
                        const struct cm_tf_scalar *v, int n) {
  int rc;

  if (!w->tb)
    return;
  rc = cm_tfevents_write(w->tb, step, v, n);
  if (rc < 0) {
    cm_warn("TensorBoard: cannot write to %s (%s); no more events",
            cm_tfevents_path(w->tb),
            rc == CM_EIO ? strerror(errno) : cm_strerror(rc));
    cm_tfevents_close(w->tb);
    w->tb = NULL;
  }
}

void dw_tb_progress(struct dw_worker *w, long step, double loss, double acc,
                    double examples_per_s, double step_ms) {
  struct cm_tf_scalar v[6] = {
      {"train/loss", (float)loss},
      {"train/accuracy", (float)acc},
      {"train/examples_per_s", (float)examples_per_s},
      {"train/step_ms", (float)step_ms},
  };
  int n = 4;

  if (w->client) { /* --standalone moves no bytes */
    v[n++] = (struct cm_tf_scalar){"net/bytes_pulled",
                                   (float)psc__client_bytes_pulled(w->client)};
    v[n++] = (struct cm_tf_scalar){"net/bytes_pushed",
                                   (float)psc__client_bytes_pushed(w->client)};
  }
  write_event(w, step, v, n);
}

void dw_tb_final(struct dw_worker *w, long step, double acc, double loss) {
  struct cm_tf_scalar v[2] = {{"test/accuracy", (float)acc},
                              {"test/loss", (float)loss}};
  write_event(w, step, v, 2);
}

void dw_tb_ctr(struct dw_worker *w, long step, const char *split,
               double logloss, double auc, double examples_per_s) {
  char tl[32], ta[32];
  struct cm_tf_scalar v[5];
  int n = 0;

  snprintf(tl, sizeof tl, "%s/logloss", split);
  snprintf(ta, sizeof ta, "%s/auc", split);
  v[n++] = (struct cm_tf_scalar){tl, (float)logloss};
  v[n++] = (struct cm_tf_scalar){ta, (float)auc};
  if (examples_per_s > 0)
    v[n++] =
        (struct cm_tf_scalar){"train/examples_per_s", (float)examples_per_s};
  if (w->client && examples_per_s > 0) {
    v[n++] = (struct cm_tf_scalar){"net/bytes_pulled",
                                   (float)psc__client_bytes_pulled(w->client)};
    v[n++] = (struct cm_tf_scalar){"net/bytes_pushed",
                                   (float)psc__client_bytes_pushed(w->client)};
  }
  write_event(w, step, v, n);
}

void dw_tb_close(struct dw_worker *w) {
  char path[PATH_MAX];

  if (!w->tb)
    return;
  snprintf(path, sizeof path, "%s", cm_tfevents_path(w->tb));
  if (cm_tfevents_close(w->tb) < 0)
    cm_warn("TensorBoard: closing %s: %s", path, strerror(errno));
  w->tb = NULL;
}
