/* A shard's sync staging and commit alone (steps.h), per push, as the
 * number of workers grows: each round every one of n workers stages its
 * gradient for a slice the size of one shard's share of the demo MLP when
 * 2 shards hold it (117,573 floats, 459 KiB; the push handler's buffer,
 * hot, copied into the worker's slot) and the step commits (the
 * sum of the n slots in ascending order, the momentum update). A shard's
 * cost per push that grows with n shows here without the network, the
 * clients or the other processes on the machine (tests/bench/scale_curve.py
 * measures the whole job).
 *
 * Run: build/tests/steps-bench [-e ELEMS] [N ...] (default 8 64; -e sets the
 * slice's floats); the counts are timed
 * in turn, round after round (interleaved), and each line gives the median
 * CPU µs per push over the repeats, in all and for the staging alone (the rest
 * is the commit). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "optconf.h"
#include "steps.h"
#include "store.h"

#define REPEATS 7

/* The slice's floats (-e). */
static int ELEMS = 117573;

/* This thread's CPU seconds: the machines it runs on are shared, and time
 * spent waiting for a core is not the code's. */
static double cpu_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* µs per push of `rounds` steps of n workers, in all and staging alone
 * (*stage_us); the rest is the commit. */
static double run(int n, int rounds, float *g, double *stage_us) {
  static struct cm_optim_set opt; /* copied by the store */
  struct psd_store *store = NULL;
  struct psd_steps *st = NULL;
  struct psd_var *v = NULL;
  int64_t shape[1] = {ELEMS};
  int applied[PSD_STEPS_MAX_WORKERS], created = 0;
  char err[256];
  double t0 = 0, us = -1, staging = 0;
  cm_optim_defaults(&opt.def);
  opt.def.type = CM_OPT_MOMENTUM;
  opt.def.lr = 0.001;
  if (psd_store_new(&store, 0, 1, &opt) ||
      psd_store_declare(store, "w", 1, shape, -1, PSD_INIT_ZEROS, 0, 1, NULL,
                        &v, &created, err, sizeof err) ||
      psd_steps_new(&st, store, n))
    goto out;
  for (int w = 0; w < n; w++)
    applied[w] = w;
  /* One step untimed: the slots are allocated on first use. */
  for (int r = -1; r < rounds; r++) {
    if (r == 0)
      t0 = cpu_s();
    uint64_t step = (uint64_t)(r + 1);
    double ts = cpu_s();
    for (int w = 0; w < n; w++) {
      g[w % 16] += 1.0f; /* the handler's buffer changes every push */
      if (psd_steps_stage(st, w, step, v, 0, g, ELEMS, err, sizeof err))
        goto out;
    }
    if (r >= 0)
      staging += cpu_s() - ts;
    if (psd_steps_commit(st, step, applied, n, NULL, 0, err, sizeof err))
      goto out;
  }
  us = (cpu_s() - t0) * 1e6 / ((double)rounds * n);
  *stage_us = staging * 1e6 / ((double)rounds * n);
out:
  if (us < 0)
    fprintf(stderr, "steps-bench: n=%d: %s\n", n, err);
  psd_steps_free(st);
  psd_store_free(store);
  return us;
}

int main(int argc, char **argv) {
  int ns[16] = {8, 64}, nn = 2;
  double t[16][REPEATS], ts[16][REPEATS];
  float *g;
  int a = 1;
  if (a + 1 < argc && !strcmp(argv[a], "-e")) {
    ELEMS = atoi(argv[a + 1]);
    a += 2;
  }
  if (ELEMS < 1)
    return 2;
  if (a < argc) {
    nn = 0;
    for (; a < argc && nn < 16; a++)
      ns[nn++] = atoi(argv[a]);
  }
  if (!(g = calloc(ELEMS, sizeof *g)))
    return 1;
  for (int i = 0; i < ELEMS; i++)
    g[i] = 1e-3f * (float)(i % 97);
  for (int r = 0; r < REPEATS; r++)
    for (int i = 0; i < nn; i++)
      /* About 64 MB staged per count: a count's rounds take alike. */
      if ((t[i][r] = run(ns[i], 1 + 512 / ns[i], g, &ts[i][r])) < 0)
        return 1;
  for (int i = 0; i < nn; i++) {
    qsort(t[i], REPEATS, sizeof(double), cmp_double);
    qsort(ts[i], REPEATS, sizeof(double), cmp_double);
    printf("bench steps workers=%d elems=%d us_per_push=%.1f "
           "stage_us_per_push=%.1f vs_first=%.2f\n",
           ns[i], ELEMS, t[i][REPEATS / 2], ts[i][REPEATS / 2],
           t[i][REPEATS / 2] / t[0][REPEATS / 2]);
  }
  free(g);
  return 0;
}
