/* kernel_bench: GFLOP/s of the layer kernels at the demo models' shapes
 * (the MLP 784-256-128-10 and the CNN, batch 64), each next to a plain
 * sgemm of the same (M, N, K) timed in the same run, so the ratio says what
 * the layer adds to its GEMMs (bias, im2col, col2im, pooling-free here).
 * CPU lines always; GPU lines (the CUDA twins against a bias-free dense
 * forward of the same shape, i.e. one cuBLAS sgemm) when a GPU works, else
 * one line saying why not. Run by `make bench` through tests/bench/bench.py
 * ("bench kernels"); prints one line per layer and pass:
 *   kernels cpu conv1 fwd M=32 N=64 K=400 x64 gflops=... sgemm_gflops=...
 *   ratio=... */
#include "psd_config.h"

#include "blas.h"
#include "conv.h"
#include "dense.h"
#include "device.h"
#if PSD_HAVE_CUDA
#include "conv_cuda.h"
#include "dense_cuda.h"
#endif

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* One layer of a demo model. */
struct layer {
  const char *name;       /* e.g. "mlp dense0" */
  int conv;               /* 1: a convolution, 0: a dense layer */
  int B, in, out;         /* dense: batch, inputs, outputs */
  struct kn_conv_shape s; /* conv: its shape */
};

static const struct layer layers[] = {
    {"mlp.dense0", 0, 64, 784, 256, {0}},
    {"mlp.dense1", 0, 64, 256, 128, {0}},
    {"mlp.dense2", 0, 64, 128, 10, {0}},
    {"cnn.conv0", 1, 0, 0, 0, {64, 1, 28, 28, 16, 5, 2}},
    {"cnn.conv1", 1, 0, 0, 0, {64, 16, 14, 14, 32, 5, 0}},
    {"cnn.dense0", 0, 64, 800, 64, {0}},
    {"cnn.dense1", 0, 64, 64, 10, {0}},
};

/* Seconds spent in each timed region are at least this. */
#define MIN_S 0.2

static double now_s(void) {
  struct timespec ts;

  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static float *randv(size_t n) {
  float *v = malloc((n ? n : 1) * sizeof *v);
  unsigned s = 12345u + (unsigned)n;

  for (size_t i = 0; i < n; i++) {
    s = s * 1664525u + 1013904223u;
    v[i] = (float)(s >> 8) / (float)(1 << 24) - 0.5f;
  }
  return v;
}

/* What one pass of one layer computes, as GEMMs: count GEMMs of (M, N, K)
 * each, plus, for a backward pass, a second kind (M2, N2, K2). */
struct gemms {
  int M, N, K, count;     /* the first GEMM and how many times it runs */
  int M2, N2, K2, count2; /* the second (backward: dx), count2 = 0 if none */
};

static double flops(const struct gemms *g) {
  return 2.0 * g->M * g->N * g->K * g->count +
         2.0 * g->M2 * g->N2 * g->K2 * g->count2;
}

/* The CPU buffers of one layer. */
struct bufs {
  float *x, *w, *b, *y, *dy, *dx, *dw, *db, *col; /* as the kernels name them */
  float *ga, *gb, *gc;                            /* sgemm operands */
};

static void bufs_make(struct bufs *u, const struct layer *l) {
  size_t nx, nw, ny, ncol = 0, oc;

  if (l->conv) {
    const struct kn_conv_shape *s = &l->s;
    nx = (size_t)s->B * s->C * s->H * s->W;
    nw = (size_t)s->OC * s->C * s->K * s->K;
    ny = (size_t)s->B * s->OC * kn_conv_oh(s) * kn_conv_ow(s);
    ncol = kn_conv_col_floats(s);
    oc = s->OC;
  } else {
    nx = (size_t)l->B * l->in, nw = (size_t)l->out * l->in;
    ny = (size_t)l->B * l->out, oc = l->out;
  }
  u->x = randv(nx), u->dx = randv(nx), u->w = randv(nw), u->dw = randv(nw);
  u->b = randv(oc), u->db = randv(oc), u->y = randv(ny), u->dy = randv(ny);
  u->col = randv(ncol);
  /* Big enough for any operand of this layer's GEMMs. */
  size_t big = nx + nw + ny + ncol;
  u->ga = randv(big), u->gb = randv(big), u->gc = randv(big);
}

static void bufs_free(struct bufs *u) {
  free(u->x), free(u->dx), free(u->w), free(u->dw), free(u->b), free(u->db);
  free(u->y), free(u->dy), free(u->col), free(u->ga), free(u->gb), free(u->gc);
}

/* The GEMMs of layer l's forward (pass 0) or backward (pass 1) pass. */
static struct gemms gemms_of(const struct layer *l, int pass) {
  struct gemms g = {0};

  if (l->conv) {
    const struct kn_conv_shape *s = &l->s;
    int P = kn_conv_oh(s) * kn_conv_ow(s), ckk = s->C * s->K * s->K;
    /* The CPU twin runs one GEMM over the batch: N = B * OH * OW. */
    if (!pass)
      g = (struct gemms){s->OC, s->B * P, ckk, 1, 0, 0, 0, 0};
    else /* dw, and dcol unless it is the input layer */
      g = (struct gemms){s->OC, ckk,      s->B * P, 1,
                         ckk,   s->B * P, s->OC,    s->C > 1 ? 1 : 0};
  } else if (!pass) {
    g = (struct gemms){l->B, l->out, l->in, 1, 0, 0, 0, 0};
  } else {
    g = (struct gemms){l->out, l->in, l->B, 1, l->B, l->in, l->out, 1};
  }
  return g;
}

static void run_layer(const struct layer *l, int pass, struct bufs *u) {
  if (l->conv && !pass)
    kn_conv2d_forward(&l->s, u->y, u->x, u->w, u->b, u->col);
  else if (l->conv)
    kn_conv2d_backward(&l->s, l->s.C > 1 ? u->dx : NULL, u->dw, u->db, u->dy,
                       u->x, u->w, u->col);
  else if (!pass)
    kn_dense_forward(u->y, u->x, u->w, u->b, l->B, l->in, l->out);
  else
    kn_dense_backward(u->dx, u->dw, u->db, u->dy, u->x, u->w, l->B, l->in,
                      l->out);
}

static void run_sgemm(const struct gemms *g, struct bufs *u) {
  for (int i = 0; i < g->count; i++)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, g->M, g->N, g->K,
                1.0f, u->ga, g->K, u->gb, g->N, 0.0f, u->gc, g->N);
  for (int i = 0; i < g->count2; i++)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, g->M2, g->N2, g->K2,
                1.0f, u->ga, g->K2, u->gb, g->N2, 0.0f, u->gc, g->N2);
}

/* Seconds per call of layer (which = 0) or its sgemm reference (1),
 * interleaved in rounds so drift on a shared machine hits both alike. */
static void time_pair(const struct layer *l, int pass, struct bufs *u,
                      double *t_layer, double *t_gemm) {
  struct gemms g = gemms_of(l, pass);
  double spent[2] = {0, 0};
  long reps[2] = {0, 0};

  run_layer(l, pass, u), run_sgemm(&g, u); /* warm up */
  while (spent[0] < MIN_S || spent[1] < MIN_S)
    for (int which = 0; which < 2; which++) {
      double t0 = now_s();
      for (int r = 0; r < 10; r++)
        which ? run_sgemm(&g, u) : run_layer(l, pass, u);
      spent[which] += now_s() - t0;
      reps[which] += 10;
    }
  *t_layer = spent[0] / (double)reps[0];
  *t_gemm = spent[1] / (double)reps[1];
}

static void print_line(const char *dev, const struct layer *l, int pass,
                       double tl, double tg) {
  struct gemms g = gemms_of(l, pass);
  double f = flops(&g);

  printf("kernels %s %s %s M=%d N=%d K=%d x%d", dev, l->name,
         pass ? "bwd" : "fwd", g.M, g.N, g.K, g.count);
  if (g.count2)
    printf("+M=%d N=%d K=%d x%d", g.M2, g.N2, g.K2, g.count2);
  printf(" gflops=%.2f sgemm_gflops=%.2f ratio=%.2f\n", f / tl * 1e-9,
         f / tg * 1e-9, tg / tl);
  fflush(stdout);
}

#if PSD_HAVE_CUDA
/* The GPU twins of run_layer and run_sgemm; the reference GEMM is a
 * bias-free kn_dense_forward_cuda, which is one cuBLAS sgemm. */
struct gbufs {
  float *x, *w, *b, *y, *dy, *dx, *dw, *db, *col, *ga, *gb, *gc; /* device */
};

static float *dev_copy(struct kn_cuda *ctx, const float *src, size_t n) {
  void *d = NULL;

  if (kn_cuda_alloc(&d, (n ? n : 1) * sizeof(float)) < 0 ||
      kn_cuda_upload(ctx, d, src, n * sizeof(float)) < 0)
    exit(1);
  return d;
}

static int gpu_layer(struct kn_cuda *ctx, const struct layer *l, int pass,
                     struct gbufs *u) {
  if (l->conv && !pass)
    return kn_conv2d_forward_cuda(ctx, &l->s, u->y, u->x, u->w, u->b, u->col);
  if (l->conv)
    return kn_conv2d_backward_cuda(ctx, &l->s, l->s.C > 1 ? u->dx : NULL, u->dw,
                                   u->db, u->dy, u->x, u->w, u->col);
  if (!pass)
    return kn_dense_forward_cuda(ctx, u->y, u->x, u->w, u->b, l->B, l->in,
                                 l->out);
  return kn_dense_backward_cuda(ctx, u->dx, u->dw, u->db, u->dy, u->x, u->w,
                                l->B, l->in, l->out);
}

/* C (M, N) = A (M, K) B^T as kn_dense_forward_cuda computes it. */
static int gpu_sgemm(struct kn_cuda *ctx, const struct gemms *g,
                     struct gbufs *u) {
  int rc = 0;

  for (int i = 0; !rc && i < g->count; i++)
    rc =
        kn_dense_forward_cuda(ctx, u->gc, u->ga, u->gb, NULL, g->M, g->K, g->N);
  for (int i = 0; !rc && i < g->count2; i++)
    rc = kn_dense_forward_cuda(ctx, u->gc, u->ga, u->gb, NULL, g->M2, g->K2,
                               g->N2);
  return rc;
}

static int gpu_bench(void) {
  struct kn_cuda *ctx = NULL;
  int rc = kn_cuda_create(&ctx);

  for (size_t i = 0; !rc && i < sizeof layers / sizeof layers[0]; i++) {
    const struct layer *l = &layers[i];
    struct bufs h;
    struct gbufs u;
    size_t nx, nw, ny, ncol = 0, oc;

    bufs_make(&h, l);
    if (l->conv) {
      nx = (size_t)l->s.B * l->s.C * l->s.H * l->s.W;
      nw = (size_t)l->s.OC * l->s.C * l->s.K * l->s.K;
      ny = (size_t)l->s.B * l->s.OC * kn_conv_oh(&l->s) * kn_conv_ow(&l->s);
      ncol = kn_conv_col_floats(&l->s);
      oc = l->s.OC;
    } else {
      nx = (size_t)l->B * l->in, nw = (size_t)l->out * l->in;
      ny = (size_t)l->B * l->out, oc = l->out;
    }
    size_t big = nx + nw + ny + ncol;
    u.x = dev_copy(ctx, h.x, nx), u.dx = dev_copy(ctx, h.dx, nx);
    u.w = dev_copy(ctx, h.w, nw), u.dw = dev_copy(ctx, h.dw, nw);
    u.b = dev_copy(ctx, h.b, oc), u.db = dev_copy(ctx, h.db, oc);
    u.y = dev_copy(ctx, h.y, ny), u.dy = dev_copy(ctx, h.dy, ny);
    u.col = dev_copy(ctx, h.col, ncol);
    u.ga = dev_copy(ctx, h.ga, big), u.gb = dev_copy(ctx, h.gb, big);
    u.gc = dev_copy(ctx, h.gc, big);
    for (int pass = 0; !rc && pass < 2; pass++) {
      struct gemms g = gemms_of(l, pass);
      double spent[2] = {0, 0};
      long reps[2] = {0, 0};

      rc = gpu_layer(ctx, l, pass, &u) || gpu_sgemm(ctx, &g, &u) ||
           kn_cuda_sync(ctx);
      while (!rc && (spent[0] < MIN_S || spent[1] < MIN_S))
        for (int which = 0; !rc && which < 2; which++) {
          double t0 = now_s();
          for (int r = 0; !rc && r < 50; r++)
            rc = which ? gpu_sgemm(ctx, &g, &u) : gpu_layer(ctx, l, pass, &u);
          rc = rc ? rc : kn_cuda_sync(ctx);
          spent[which] += now_s() - t0;
          reps[which] += 50;
        }
      if (!rc)
        print_line("gpu", l, pass, spent[0] / reps[0], spent[1] / reps[1]);
    }
    kn_cuda_free(u.x), kn_cuda_free(u.dx), kn_cuda_free(u.w);
    kn_cuda_free(u.dw), kn_cuda_free(u.b), kn_cuda_free(u.db);
    kn_cuda_free(u.y), kn_cuda_free(u.dy), kn_cuda_free(u.col);
    kn_cuda_free(u.ga), kn_cuda_free(u.gb), kn_cuda_free(u.gc);
    bufs_free(&h);
  }
  kn_cuda_destroy(ctx);
  return rc;
}
#endif

int main(int argc, char **argv) {
  char why[256], blas[256];
  int rc = 0;

  (void)argc;
  kn_blas_init(argv, 1);
  kn_blas_describe(blas, sizeof blas);
  printf("kernels cpu: %s\n", blas);
  for (size_t i = 0; i < sizeof layers / sizeof layers[0]; i++) {
    struct bufs u;

    bufs_make(&u, &layers[i]);
    for (int pass = 0; pass < 2; pass++) {
      double tl, tg;
      time_pair(&layers[i], pass, &u, &tl, &tg);
      print_line("cpu", &layers[i], pass, tl, tg);
    }
    bufs_free(&u);
  }
  if (kn_cuda_probe(why, sizeof why) <= 0) {
    printf("kernels gpu: none (%s)\n", why);
    return 0;
  }
#if PSD_HAVE_CUDA
  rc = gpu_bench();
  if (rc)
    printf("kernels gpu: failed (%d)\n", rc);
#endif
  return rc ? 1 : 0;
}
