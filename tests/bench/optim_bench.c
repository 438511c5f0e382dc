/* optim-bench: how close each optimizer update (kernels/optim.h) comes to
 * the machine's memory bandwidth. Every update is one pass over memory, so
 * the baseline is the STREAM triad a[i] = b[i] + s * c[i] on arrays of the
 * same size, timed in the same run, one thread, right before each update:
 * repeat R times { triad, sgd, triad, momentum, ..., triad, adamw }. Each
 * measurement is the best of K passes (as STREAM reports its best), a
 * ratio is an update's rate over the triad's just before it, and the
 * medians over the repeats are printed, one line per optimizer (the
 * machines are shared and their bandwidth drifts; adjacent pairs and
 * medians keep that out of the ratio):
 *
 *   bench optim type=adam mib=64 GBps=10.1 triad_GBps=11.9 ratio=0.85 ...
 *
 * isa= names the compiled version of the updates and baselines that ran
 * (kn_optim_isa: avx2 or baseline).
 *
 * A second baseline, axpy (a = a + s * c, the triad in place), moves
 * exactly sgd's bytes and, unlike the triad, never writes a line it did
 * not read; axpy_ratio is an update's rate over it, so it says how close
 * an update comes to the memory's speed for its own access pattern.
 *
 * GB/s counts every byte read and written once per pass (10^9 bytes/s):
 * triad, axpy and sgd 12 bytes per element (two reads, one write), momentum,
 * nesterov and adagrad 20 (value and slot read and written, gradient
 * read), adam and adamw 28 (value and two slots read and written, gradient
 * read). The triad's write-allocate read is not counted, as STREAM does not.
 *
 * Usage: optim-bench [--mib N] [--repeats R] [--passes K]
 * (defaults 64 MiB of f32 values per array, 9 repeats, 3 passes). */
#include "optim.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* What is timed: the two baselines, then each update. */
enum { TRIAD, AXPY, SGD, MOMENTUM, NESTEROV, ADAGRAD, ADAM, ADAMW, NKERNELS };

static const char *const names[NKERNELS] = {
    "triad", "axpy", "sgd", "momentum", "nesterov", "adagrad", "adam", "adamw"};
/* Bytes moved per element and pass. */
static const int bytes_per[NKERNELS] = {12, 12, 12, 20, 20, 20, 28, 28};

/* The arrays every kernel works on. */
struct arrays {
  float *w, *s0, *s1, *g; /* value, slots, gradient */
  float *a, *b, *c;       /* the triad's */
  size_t n;               /* elements in each */
};

/* The baselines are compiled as the updates are (optim_cpu.c): split into
 * a multiple of 8 and a tail so that GCC vectorizes them at -O2, and on
 * x86-64 cloned for AVX2 and the baseline ISA, the loader picking the same
 * one as for the updates (kn_optim_isa). A baseline held to 4-wide SSE
 * while the updates ran 8-wide would flatter the ratios. */
#if defined(__x86_64__) && !defined(KN_OPTIM_NO_CLONES)
#define BASELINE static __attribute__((target_clones("avx2", "default")))
#else
#define BASELINE static __attribute__((noinline))
#endif

/* a = b + s * c */
BASELINE void triad(float *restrict a, const float *restrict b,
                    const float *restrict c, size_t n, float s) {
  size_t i, m = n & ~(size_t)7;

  for (i = 0; i < m; i++)
    a[i] = b[i] + s * c[i];
  for (; i < n; i++)
    a[i] = b[i] + s * c[i];
}

/* a = a + s * c: the triad in place, so no line is written that was not
 * read (the triad's a is written without being read, and the hardware
 * reads it anyway: a write-allocate that 12 bytes per element do not
 * count). Its traffic is exactly sgd's. */
BASELINE void axpy(float *restrict a, const float *restrict c, size_t n,
                   float s) {
  size_t i, m = n & ~(size_t)7;

  for (i = 0; i < m; i++)
    a[i] = a[i] + s * c[i];
  for (; i < n; i++)
    a[i] = a[i] + s * c[i];
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Runs kernel k once over the arrays. */
static void run(int k, struct arrays *x, struct kn_optim_hp *hp) {
  switch (k) {
  case TRIAD:
    triad(x->a, x->b, x->c, x->n, 0.5f);
    break;
  case AXPY:
    axpy(x->a, x->c, x->n, 1e-4f);
    break;
  case SGD:
    kn_sgd_step(x->w, x->g, x->n, hp);
    break;
  case MOMENTUM:
    kn_momentum_step(x->w, x->s0, x->g, x->n, hp);
    break;
  case NESTEROV:
    kn_nesterov_step(x->w, x->s0, x->g, x->n, hp);
    break;
  case ADAGRAD:
    kn_adagrad_step(x->w, x->s0, x->g, x->n, hp);
    break;
  case ADAM:
    kn_adam_step(x->w, x->s0, x->s1, x->g, x->n, hp);
    break;
  default:
    kn_adamw_step(x->w, x->s0, x->s1, x->g, x->n, hp);
    break;
  }
}

/* The best rate of kernel k over `passes` passes, in GB/s. */
static double best_gbps(int k, struct arrays *x, struct kn_optim_hp *hp,
                        long passes) {
  double best = 0.0;

  for (long p = 0; p < passes; p++) {
    double t0 = now_s(), rate;
    hp->t++;
    run(k, x, hp);
    rate = (double)bytes_per[k] * x->n / (now_s() - t0) / 1e9;
    if (rate > best)
      best = rate;
  }
  return best;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* n floats in [0.25, 0.75): positive, so that the slots of adagrad and adam
 * stay sums of squares, and far from denormals. Touching them also maps
 * the pages before anything is timed. */
static float *filled(size_t n, unsigned seed) {
  float *p = NULL;
  if (posix_memalign((void **)&p, 64, n * sizeof *p) != 0)
    return NULL;
  for (size_t i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    p[i] = 0.25f + (float)(seed >> 8) / (float)(1u << 25);
  }
  return p;
}

int main(int argc, char **argv) {
  static const struct option longopts[] = {
      {"mib", required_argument, 0, 'm'},
      {"repeats", required_argument, 0, 'r'},
      {"passes", required_argument, 0, 'k'},
      {0, 0, 0, 0}};
  struct kn_optim_hp hp = {.lr = 1e-4f,
                           .momentum = 0.9f,
                           .beta1 = 0.9,
                           .beta2 = 0.999,
                           .eps = 1e-8f,
                           .weight_decay = 0.01f,
                           .t = 1};
  struct arrays x = {0};
  double *gbps[NKERNELS] = {0}, *triads[NKERNELS] = {0},
         *ratios[NKERNELS] = {0}, *axpys[NKERNELS] = {0},
         *aratios[NKERNELS] = {0};
  long mib = 64, repeats = 9, passes = 3;
  int c, rc = 1;

  while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
    long *dst = c == 'm' ? &mib : c == 'r' ? &repeats : &passes;
    if (c == '?' || (*dst = strtol(optarg, NULL, 10)) < 1) {
      fprintf(stderr,
              "usage: optim-bench [--mib N] [--repeats R] [--passes K]\n");
      return 2;
    }
  }
  x.n = (size_t)mib << 18; /* floats in mib MiB */
  if (!(x.w = filled(x.n, 1)) || !(x.s0 = filled(x.n, 2)) ||
      !(x.s1 = filled(x.n, 3)) || !(x.g = filled(x.n, 4)) ||
      !(x.a = filled(x.n, 5)) || !(x.b = filled(x.n, 6)) ||
      !(x.c = filled(x.n, 7))) {
    fprintf(stderr, "optim-bench: out of memory\n");
    goto out;
  }
  for (int k = 0; k < NKERNELS; k++)
    if (!(gbps[k] = calloc(repeats, sizeof **gbps)) ||
        !(triads[k] = calloc(repeats, sizeof **gbps)) ||
        !(ratios[k] = calloc(repeats, sizeof **gbps)) ||
        !(axpys[k] = calloc(repeats, sizeof **gbps)) ||
        !(aratios[k] = calloc(repeats, sizeof **gbps))) {
      fprintf(stderr, "optim-bench: out of memory\n");
      goto out;
    }
  /* Weight decay only changes sgd..adam's arithmetic, not their traffic; it
   * is on, the heavier case. A pass of each first, untimed (caches, TLB). */
  for (int k = 0; k < NKERNELS; k++)
    run(k, &x, &hp);
  for (long r = 0; r < repeats; r++)
    for (int k = SGD; k < NKERNELS; k++) {
      triads[k][r] = best_gbps(TRIAD, &x, &hp, passes);
      axpys[k][r] = best_gbps(AXPY, &x, &hp, passes);
      gbps[k][r] = best_gbps(k, &x, &hp, passes);
      ratios[k][r] = gbps[k][r] / triads[k][r];
      aratios[k][r] = gbps[k][r] / axpys[k][r];
    }
  for (int k = SGD; k < NKERNELS; k++) {
    double g = median(gbps[k], (int)repeats); /* sorts: [0] is the lowest */
    printf("bench optim type=%s mib=%ld GBps=%.2f triad_GBps=%.2f ratio=%.2f "
           "axpy_GBps=%.2f axpy_ratio=%.2f min_GBps=%.2f max_GBps=%.2f "
           "bytes_per_elem=%d ns_per_elem=%.3f repeats=%ld isa=%s\n",
           names[k], mib, g, median(triads[k], (int)repeats),
           median(ratios[k], (int)repeats), median(axpys[k], (int)repeats),
           median(aratios[k], (int)repeats), gbps[k][0], gbps[k][repeats - 1],
           bytes_per[k], bytes_per[k] / g, repeats, kn_optim_isa());
  }
  fflush(stdout);
  rc = 0;
out:
  for (int k = 0; k < NKERNELS; k++)
    free(gbps[k]), free(triads[k]), free(ratios[k]), free(axpys[k]),
        free(aratios[k]);
  free(x.w), free(x.s0), free(x.s1), free(x.g);
  free(x.a), free(x.b), free(x.c);
  return rc;
}
