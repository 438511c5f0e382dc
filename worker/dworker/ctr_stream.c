/* job.ctr.stream (docs/ctr.md, "Training on a stream"): the CTR model's
 * windows from worker/data/stream.h, this worker's share of each (lines
 * k, k + n, ... of a part, as of train.svm), and the progressive
 * validation's record: each window is scored with the current model
 * before it is trained on (ctr_run.c scores it), its log loss and AUC go
 * to the "window N (part): ..." line, TensorBoard ("window/logloss",
 * "window/auc" at step N) and the result line's figures. SIGTERM or
 * SIGINT end the stream as the end marker does, at the next batch (the
 * batch being trained is finished, the rest of its window is not): the
 * worker reports and leaves. */
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "criteo.h"
#include "ctrgen.h"
#include "dworker_internal.h"
#include "err.h"
#include "libsvm.h"
#include "log.h"
#include "stream.h"

/* Set by SIGTERM or SIGINT: the stream ends at the next look. */
static volatile sig_atomic_t stop_asked;

static void on_stop(int sig) {
  (void)sig;
  stop_asked = 1;
}

/* The stream and what its windows scored. */
struct dw_ctr_stream {
  struct dw_stream *s;         /* the follower */
  const struct cm_ctr_conf *c; /* job.ctr */
  int criteo;                  /* parts in Criteo's TSV */
  unsigned long long windows;  /* windows taken */
  unsigned long long scored;   /* windows scored (this worker had examples) */
  uint64_t examples;           /* examples scored, all windows */
  double ll_sum;               /* sum of the scored examples' log losses */
  double auc_sum;              /* sum of each window's AUC x its examples */
  double last_auc, last_ll;    /* the last window's */
  char last[256];              /* the last window's name, "" before the first */
  size_t last_n;               /* this worker's examples of it */
};

/* A relative path from the spec file's directory. */
static void from_spec(const struct dw_worker *w, const char *p, char *out,
                      size_t size) {
  char spec_dir[1024];
  snprintf(spec_dir, sizeof spec_dir, "%s", w->args.cluster);
  if (p[0] == '/')
    snprintf(out, size, "%s", p);
  else
    snprintf(out, size, "%s/%s", dirname(spec_dir), p);
}

int dw_ctrs_open(struct dw_worker *w, struct dw_ctr_stream **out) {
  static const char *const svm[] = {".svm", NULL};
  static const char *const tsv[] = {".tsv", ".tsv.gz", NULL};
  const struct cm_ctr_conf *c = &w->spec->job.ctr;
  struct dw_ctr_stream *cs = calloc(1, sizeof *cs);
  char dir[1024], file[1024], err[1200];
  struct sigaction sa;
  int rc;

  if (!cs) {
    cm_error("job.ctr.stream: out of memory");
    return CM_ENOMEM;
  }
  cs->c = c;
  cs->criteo = !strcmp(c->format, "criteo");
  from_spec(w, c->stream_dir, dir, sizeof dir);
  from_spec(w, c->stream_file, file, sizeof file);
  struct dw_stream_opts o = {
      c->stream_dir[0] ? dir : NULL, c->stream_file[0] ? file : NULL,
      cs->criteo ? tsv : svm, c->stream_end, c->stream_window};
  if ((rc = dw_stream_open(&o, &cs->s, err, sizeof err))) {
    cm_error("job.ctr.stream: %s", err);
    free(cs);
    return rc;
  }
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  if (o.dir)
    cm_info("following the stream of parts in %s (names *%s, taken in name "
            "order; those starting with '.' are not parts) until %s/%s "
            "appears or SIGTERM",
            dir, cs->criteo ? ".tsv, *.tsv.gz" : ".svm", dir, c->stream_end);
  else
    cm_info("following the growing file %s in windows of %lld lines until "
            "%s appears beside it or SIGTERM",
            file, c->stream_window, c->stream_end);
  *out = cs;
  return 0;
}

/* Loads this worker's share of window win into *part. */
static int load(struct dw_ctr_stream *cs, const struct dw_stream_window *win,
                int share, int nshares, struct dw_svm *part) {
  char err[1200];
  int rc;

  if (!win->text) {
    rc = cs->criteo
             ? dw_criteo_load_svm(win->path, share, nshares, part, err,
                                  sizeof err)
             : dw_svm_load(win->path, share, nshares, part, err, sizeof err);
  } else {
    FILE *f = fmemopen((void *)win->text, win->len, "r");
    if (!f) {
      cm_error("%s: out of memory", win->name);
      return CM_ENOMEM;
    }
    rc = dw_svm_read(f, win->path, win->line0, share, nshares, part, err,
                     sizeof err);
    fclose(f);
  }
  if (rc) {
    cm_error("stream: %s", err);
    return rc;
  }
  for (size_t j = 0; j < part->nnz; j++)
    if (part->idx[j] / DW_CTR_SPAN >= (uint64_t)cs->c->fields) {
      cm_error("%s: feature %llu is in field %llu (id / 10^9); job.ctr.fields "
               "is %d",
               win->path, (unsigned long long)part->idx[j],
               (unsigned long long)(part->idx[j] / DW_CTR_SPAN), cs->c->fields);
      dw_svm_free(part);
      return CM_EFORMAT;
    }
  return 0;
}

int dw_ctrs_next(struct dw_ctr_stream *cs, int share, int nshares,
                 struct dw_svm *part, char *name, size_t size) {
  struct dw_stream_window win;
  char err[1200];
  int rc;

  /* Every push of the last window has been answered: say so before waiting
   * for the next one (a feeder, or a test, releases parts on this line). */
  if (cs->last[0]) {
    printf("window %llu (%s): trained examples=%zu\n", cs->windows, cs->last,
           cs->last_n);
    fflush(stdout);
    cs->last[0] = '\0';
  }
  rc = dw_stream_wait(cs->s, &win, cs->c->stream_poll_s, &stop_asked, err,
                      sizeof err);

  if (rc < 0) {
    cm_error("job.ctr.stream: %s", err);
    return rc;
  }
  if (rc == DW_STREAM_END || rc == DW_STREAM_STOPPED) {
    cm_info("the stream ended (%s) after %llu windows",
            rc == DW_STREAM_END ? "its end marker" : "SIGTERM", cs->windows);
    return 0;
  }
  cs->windows++;
  snprintf(name, size, "%s", win.name);
  if ((rc = load(cs, &win, share, nshares, part)))
    return rc;
  snprintf(cs->last, sizeof cs->last, "%s", win.name);
  cs->last_n = part->n;
  return 1;
}

void dw_ctrs_scored(struct dw_worker *w, struct dw_ctr_stream *cs,
                    const char *name, size_t n, double ll, double auc) {
  if (!n) {
    printf("window %llu (%s): no examples for worker %d of %d\n", cs->windows,
           name, w->index, w->nworkers);
    fflush(stdout);
    return;
  }
  cs->scored++;
  cs->examples += n;
  cs->ll_sum += ll * (double)n;
  cs->auc_sum += auc * (double)n;
  cs->last_auc = auc;
  cs->last_ll = ll;
  printf("window %llu (%s): logloss=%.4f auc=%.4f examples=%zu before "
         "training\n",
         cs->windows, name, ll, auc, n);
  fflush(stdout);
  dw_tb_ctr(w, (long)cs->windows, "window", ll, auc, 0);
  psc__client_set_window(w->client, cs->windows, auc, ll);
}

int dw_ctrs_stop(const struct dw_ctr_stream *cs, const char *name, size_t done,
                 size_t n) {
  if (!stop_asked)
    return 0;
  cm_info("the stream ended (SIGTERM) after %llu windows, in window %llu "
          "(%s) after %zu of its %zu examples here",
          cs->windows, cs->windows, name, done, n);
  return 1;
}

unsigned long long dw_ctrs_windows(const struct dw_ctr_stream *cs) {
  return cs->windows;
}

void dw_ctrs_figures(const struct dw_ctr_stream *cs, char *out, size_t size) {
  double n = cs->examples ? (double)cs->examples : 1;
  snprintf(out, size,
           "windows=%llu window_examples=%llu window_logloss=%.4f "
           "window_auc=%.4f last_window_logloss=%.4f last_window_auc=%.4f",
           cs->windows, (unsigned long long)cs->examples, cs->ll_sum / n,
           cs->auc_sum / n, cs->last_ll, cs->last_auc);
}

void dw_ctrs_free(struct dw_ctr_stream *cs) {
  if (!cs)
    return;
  dw_stream_free(cs->s);
  free(cs);
}
