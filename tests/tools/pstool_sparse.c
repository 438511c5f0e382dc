/* pstool sparse: the embedding-table benchmark's psd side (bench sparse,
 * tests/bench/bench.py). Declares table "bench/D" of dim D (its optimizer
 * comes from the spec's job.tables entry of that name: adagrad), fills it
 * with --rows ids (sparse pulls of 8192 new ids at a time: rows are created
 * on first touch), then --clients threads, each its own libpsclient
 * client, pull batches of --batch Zipf-distributed ids (s 1.1, zipf.h)
 * for --seconds, then push (adagrad) batches for --seconds. Prints
 *   sparse dim=D rows=N clients=C batch=B fill_s=F
 *     pull_rows_per_s=P push_rows_per_s=Q
 * where each rate is the rows every client moved over the wall time of
 * that phase (from the first thread's start to the last thread's end). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "psclient.h"
#include "pstool.h"
#include "zipf.h"

/* One client thread. */
struct worker {
  const struct cm_spec *spec; /* borrowed */
  const struct pstool_args *a;
  int index;         /* 0..clients-1 */
  uint32_t dim;      /* row width */
  char table[32];    /* "bench/D" */
  int phase;         /* 0 fill, 1 pull, 2 push */
  uint64_t rows;     /* out: rows moved */
  double start, end; /* out: cm_mono_ms of its first and last call */
  int rc;            /* out: 0 or failed */
  char err[1024];    /* out: why */
};

static void *run(void *arg) {
  struct worker *w = arg;
  const struct pstool_args *a = w->a;
  struct psc__client_opts o = {.worker = "pstool", .timeout_ms = a->timeout};
  struct psc__client *c = NULL;
  size_t batch = w->phase == 0 ? 8192 : (size_t)(a->chunk ? a->chunk : 1024);
  uint64_t *ids = malloc(batch * sizeof *ids), state = 0x5eed + w->index;
  float *rows = malloc(batch * w->dim * sizeof *rows);
  struct psc__table t = {w->table, w->dim, 0};
  w->rc = 1;
  if (!ids || !rows)
    goto out;
  for (size_t i = 0; i < batch * w->dim; i++)
    rows[i] = 1e-3f * (float)((i % 7) + 1);
  if (psc__client_new(&c, w->spec, &o) ||
      psc__client_declare_tables(c, &t, 1)) {
    snprintf(w->err, sizeof w->err, "%s",
             c ? psc__client_error(c) : "no client");
    goto out;
  }
  w->start = cm_mono_ms();
  if (w->phase == 0) {
    /* Ranks index..rows by clients: every rank once. */
    uint64_t r = 1 + (uint64_t)w->index, nr = a->bytes;
    while (r <= nr) {
      size_t n = 0;
      for (; n < batch && r <= nr; r += (uint64_t)a->clients)
        ids[n++] = zipf_id(r);
      struct psc__rows q = {w->table, ids, n, rows, NULL};
      if (psc__client_pull_rows(c, &q, 1))
        goto fail;
      w->rows += n;
    }
  } else {
    uint64_t *pool = zipf_pool(state, a->bytes, 1.1);
    size_t at = 0;
    if (!pool)
      goto out;
    w->start = cm_mono_ms();
    double until = w->start + a->seconds * 1000.0;
    while (cm_mono_ms() < until) {
      for (size_t i = 0; i < batch; i++, at++)
        ids[i] = pool[at % ZIPF_POOL];
      struct psc__rows q = {w->table, ids, batch, rows, rows};
      if (w->phase == 1 ? psc__client_pull_rows(c, &q, 1)
                        : psc__client_push_rows(c, &q, 1)) {
        free(pool);
        goto fail;
      }
      w->rows += batch;
    }
    free(pool);
  }
  w->end = cm_mono_ms();
  w->rc = 0;
  goto out;
fail:
  snprintf(w->err, sizeof w->err, "%s", psc__client_error(c));
out:
  psc__client_free(c);
  free(ids);
  free(rows);
  return NULL;
}

/* Runs one phase on every client; returns the rows per second, or -1. */
static double phase(const struct cm_spec *spec, const struct pstool_args *a,
                    uint32_t dim, int which, double *secs) {
  int n = a->clients > 0 ? a->clients : 1;
  struct worker *w = calloc((size_t)n, sizeof *w);
  pthread_t *th = calloc((size_t)n, sizeof *th);
  double first = 0, last = 0, rate = -1;
  uint64_t rows = 0;
  if (!w || !th)
    goto out;
  for (int i = 0; i < n; i++) {
    w[i] = (struct worker){
        .spec = spec, .a = a, .index = i, .dim = dim, .phase = which};
    snprintf(w[i].table, sizeof w[i].table, "bench/%u", dim);
    pthread_create(&th[i], NULL, run, &w[i]);
  }
  for (int i = 0; i < n; i++)
    pthread_join(th[i], NULL);
  for (int i = 0; i < n; i++) {
    if (w[i].rc) {
      fprintf(stderr, "pstool sparse: client %d: %s\n", i, w[i].err);
      goto out;
    }
    rows += w[i].rows;
    if (!first || w[i].start < first)
      first = w[i].start;
    if (w[i].end > last)
      last = w[i].end;
  }
  *secs = (last - first) / 1000.0;
  rate = *secs > 0 ? (double)rows / *secs : 0;
out:
  free(w);
  free(th);
  return rate;
}

int pstool_sparse(struct cm_spec *spec, const struct pstool_args *a,
                  uint32_t dim) {
  struct pstool_args b = *a;
  double fill_s = 0, pull_s = 0, push_s = 0;
  if (!dim || !b.bytes || b.seconds <= 0) {
    fprintf(stderr, "pstool sparse DIM --bytes ROWS --seconds S [--clients C] "
                    "[--chunk BATCH]\n");
    return 2;
  }
  if (b.clients < 1)
    b.clients = 1;
  double fill = phase(spec, &b, dim, 0, &fill_s);
  if (fill < 0)
    return 1;
  fprintf(stderr, "pstool sparse: filled %llu rows of dim %u in %.1f s\n",
          (unsigned long long)b.bytes, dim, fill_s);
  double pull = phase(spec, &b, dim, 1, &pull_s);
  double push = pull < 0 ? -1 : phase(spec, &b, dim, 2, &push_s);
  if (push < 0)
    return 1;
  printf("sparse dim=%u rows=%llu clients=%d batch=%llu fill_s=%.2f "
         "pull_rows_per_s=%.0f push_rows_per_s=%.0f\n",
         dim, (unsigned long long)b.bytes, b.clients,
         (unsigned long long)(b.chunk ? b.chunk : 1024), fill_s, pull, push);
  return 0;
}
