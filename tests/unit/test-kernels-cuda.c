/* The CUDA twins (kernels/dense_cuda.h) against their CPU oracles
 * (kernels/dense.h) on the same random inputs. Tolerances, each
 * |gpu - cpu| <= tol * (|cpu| + floor):
 *   TOL_GEMM 1e-4, floor 1: dense and conv2d forward and backward (cuBLAS
 *     and OpenBLAS sum in different orders, and col2im gathers where the
 *     CPU scatters);
 *   exact: max pooling (values, argmax indices and the backward scatter);
 *   TOL_TRANS 1e-6, floor 1e-6: tanh and sigmoid forward (CUDA's tanhf and
 *     expf may differ from glibc's by an ulp or two); their backward passes,
 *     given the same y, at TOL_ELEM;
 *   TOL_ELEM 1e-6: relu and the updates (the kernels do the same rounded
 *     float operations, so these are expected to match exactly);
 *   TOL_XENT 1e-5, floor 1/B for the gradient: softmax cross-entropy
 *     (CUDA's expf and logf may differ from glibc's by an ulp or two);
 *   TOL_ELEM also for the optimizer updates (optim_cuda.h: the same float
 *     operations, explicitly rounded, so expected to match exactly);
 *   TOL_SUMSQ 1e-12 relative: the gradient's sum of squares, a double sum
 *     in another order (per-thread sums, then a tree).
 * Exits 77, which meson counts as skipped, in a build without CUDA or on a
 * machine without a usable GPU. */
#include "psd_config.h"

#include "device.h"
#include "unit.h"

#include <stdio.h>
#include <stdlib.h>

#if !PSD_HAVE_CUDA

int main(void) { return tu_skip("built without CUDA support"); }

#else

#include "conv_cuda.h"
#include "dense.h"
#include "dense_cuda.h"
#include "frand.h"
#include "optim.h"
#include "optim_cuda.h"

#include <check.h>
#include <math.h>
#include <string.h>

#define TOL_GEMM 1e-4
#define TOL_ELEM 1e-6
#define TOL_XENT 1e-5
#define TOL_SUMSQ 1e-12
#define TOL_TRANS 1e-6

/* One shape of the dense layer. */
struct shape {
  int B;   /* batch rows */
  int in;  /* input features */
  int out; /* output features */
};

static const struct shape shapes[] = {
    {1, 784, 10}, {3, 5, 7}, {17, 33, 9}, {64, 784, 256},
    {7, 1, 13},   {0, 4, 3}, {2, 0, 3},
};

static const size_t sizes[] = {0, 1, 7, 1000003};

/* The context every test uses; made by the test case's fixture. */
static struct kn_cuda *ctx;

static void setup(void) { ck_assert_int_eq(kn_cuda_create(&ctx), 0); }

static void teardown(void) {
  ck_assert_int_eq(kn_cuda_destroy(ctx), 0);
  ctx = NULL;
}

/* A device copy of n floats from host src; caller kn_cuda_free()s it. */
static float *to_gpu(const float *src, size_t n) {
  void *d = NULL;

  ck_assert_int_eq(kn_cuda_alloc(&d, (n ? n : 1) * sizeof(float)), 0);
  ck_assert_int_eq(kn_cuda_upload(ctx, d, src, n * sizeof(float)), 0);
  return d;
}

/* Downloads n floats from device src and asserts they are within
 * tol * (|cpu| + floor) of cpu. One ck_assert for the lot: check logs every
 * assertion it evaluates. */
static void assert_twin(const float *src, const float *cpu, size_t n,
                        double tol, double floor, const char *what) {
  float *gpu = malloc((n ? n : 1) * sizeof *gpu);
  size_t i = 0;

  ck_assert_int_eq(kn_cuda_download(ctx, gpu, src, n * sizeof *gpu), 0);
  while (i < n && fabs(gpu[i] - cpu[i]) <= tol * (fabs(cpu[i]) + floor))
    i++;
  ck_assert_msg(i == n, "%s[%zu]: gpu %.9g, cpu %.9g", what, i,
                i < n ? gpu[i] : 0.0, i < n ? cpu[i] : 0.0);
  free(gpu);
}

START_TEST(test_dense) {
  struct shape s = shapes[_i];
  size_t nx = (size_t)s.B * s.in, nw = (size_t)s.out * s.in;
  size_t ny = (size_t)s.B * s.out;
  float *x = tu_frandv(nx, 1, 0), *w = tu_frandv(nw, 2, 0),
        *b = tu_frandv(s.out, 3, 0);
  float *dy = tu_frandv(ny, 4, 0), *y = tu_frandv(ny, 5, 0),
        *dx = tu_frandv(nx, 6, 0);
  float *dw = tu_frandv(nw, 7, 0), *db = tu_frandv(s.out, 8, 0);
  float *gx = to_gpu(x, nx), *gw = to_gpu(w, nw), *gb = to_gpu(b, s.out);
  float *gdy = to_gpu(dy, ny), *gy = to_gpu(y, ny), *gdx = to_gpu(dx, nx);
  float *gdw = to_gpu(dw, nw), *gdb = to_gpu(db, s.out);

  kn_dense_forward(y, x, w, b, s.B, s.in, s.out);
  ck_assert_int_eq(kn_dense_forward_cuda(ctx, gy, gx, gw, gb, s.B, s.in, s.out),
                   0);
  assert_twin(gy, y, ny, TOL_GEMM, 1.0, "y");
  kn_dense_forward(y, x, w, NULL, s.B, s.in, s.out);
  ck_assert_int_eq(
      kn_dense_forward_cuda(ctx, gy, gx, gw, NULL, s.B, s.in, s.out), 0);
  assert_twin(gy, y, ny, TOL_GEMM, 1.0, "y (no bias)");
  kn_dense_backward(dx, dw, db, dy, x, w, s.B, s.in, s.out);
  ck_assert_int_eq(
      kn_dense_backward_cuda(ctx, gdx, gdw, gdb, gdy, gx, gw, s.B, s.in, s.out),
      0);
  assert_twin(gdx, dx, nx, TOL_GEMM, 1.0, "dx");
  assert_twin(gdw, dw, nw, TOL_GEMM, 1.0, "dw");
  assert_twin(gdb, db, s.out, TOL_GEMM, 1.0, "db");
  ck_assert_int_eq(kn_dense_backward_cuda(ctx, NULL, gdw, gdb, gdy, gx, gw, s.B,
                                          s.in, s.out),
                   0);
  assert_twin(gdw, dw, nw, TOL_GEMM, 1.0, "dw (no dx)");
  kn_cuda_free(gx), kn_cuda_free(gw), kn_cuda_free(gb), kn_cuda_free(gdy);
  kn_cuda_free(gy), kn_cuda_free(gdx), kn_cuda_free(gdw), kn_cuda_free(gdb);
  free(x), free(w), free(b), free(dy), free(y), free(dx), free(dw), free(db);
}
END_TEST

START_TEST(test_relu) {
  size_t n = sizes[_i];
  float *x = tu_frandv(n, 9, 0), *dy = tu_frandv(n, 10, 0),
        *y = tu_frandv(n, 11, 0);
  float *dx = tu_frandv(n, 12, 0);
  float *gx = to_gpu(x, n), *gdy = to_gpu(dy, n), *gy = to_gpu(y, n);
  float *gdx = to_gpu(dx, n);

  kn_relu_forward(y, x, n);
  ck_assert_int_eq(kn_relu_forward_cuda(ctx, gy, gx, n), 0);
  assert_twin(gy, y, n, TOL_ELEM, 0.0, "y");
  kn_relu_backward(dx, dy, y, n);
  ck_assert_int_eq(kn_relu_backward_cuda(ctx, gdx, gdy, gy, n), 0);
  assert_twin(gdx, dx, n, TOL_ELEM, 0.0, "dx");
  /* In place. */
  ck_assert_int_eq(kn_relu_backward_cuda(ctx, gdy, gdy, gy, n), 0);
  assert_twin(gdy, dx, n, TOL_ELEM, 0.0, "dx (in place)");
  ck_assert_int_eq(kn_relu_forward_cuda(ctx, gx, gx, n), 0);
  assert_twin(gx, y, n, TOL_ELEM, 0.0, "y (in place)");
  kn_cuda_free(gx), kn_cuda_free(gdy), kn_cuda_free(gy), kn_cuda_free(gdx);
  free(x), free(dy), free(y), free(dx);
}
END_TEST

/* Batches: one row, a typical batch, more rows than one block. */
static const int batches[] = {1, 64, 1000};

START_TEST(test_xent) {
  enum { C = 10 };
  int B = batches[_i], correct = -1, gcorrect = -2;
  size_t n = (size_t)B * C;
  float *logits = tu_frandv(n, 13, 0), *d = tu_frandv(n, 14, 0), loss,
        gloss = -1.0f;
  uint8_t *labels = malloc(B);
  float *glogits, *gd = to_gpu(d, n);
  void *glabels = NULL;

  for (size_t i = 0; i < n; i++)
    logits[i] *= 8.0f;
  for (int r = 0; r < B; r++)
    labels[r] = (uint8_t)(r * 7 % C);
  glogits = to_gpu(logits, n);
  ck_assert_int_eq(kn_cuda_alloc(&glabels, B), 0);
  ck_assert_int_eq(kn_cuda_upload(ctx, glabels, labels, B), 0);
  loss = kn_softmax_xent(d, &correct, logits, labels, B, C);
  ck_assert_int_eq(
      kn_softmax_xent_cuda(ctx, &gloss, gd, &gcorrect, glogits, glabels, B, C),
      0);
  ck_assert_double_eq_tol(gloss, loss, TOL_XENT * (fabs(loss) + 1.0));
  ck_assert_int_eq(gcorrect, correct);
  assert_twin(gd, d, n, TOL_XENT, 1.0 / B, "dlogits");
  /* Without host outputs the call only queues the gradient. */
  ck_assert_int_eq(
      kn_softmax_xent_cuda(ctx, NULL, gd, NULL, glogits, glabels, B, C), 0);
  assert_twin(gd, d, n, TOL_XENT, 1.0 / B, "dlogits (no loss)");
  kn_cuda_free(glogits), kn_cuda_free(gd), kn_cuda_free(glabels);
  free(logits), free(d), free(labels);
}
END_TEST

START_TEST(test_updates) {
  size_t n = sizes[_i];
  float *w = tu_frandv(n, 15, 0), *v = tu_frandv(n, 16, 0),
        *g = tu_frandv(n, 17, 0);
  float *gw = to_gpu(w, n), *gv = to_gpu(v, n), *gg = to_gpu(g, n);

  kn_sgd_update(w, g, n, 0.05f);
  ck_assert_int_eq(kn_sgd_update_cuda(ctx, gw, gg, n, 0.05f), 0);
  assert_twin(gw, w, n, TOL_ELEM, 1e-6, "w (sgd)");
  for (int step = 0; step < 3; step++) {
    kn_momentum_update(w, v, g, n, 0.05f, 0.9f);
    ck_assert_int_eq(kn_momentum_update_cuda(ctx, gw, gv, gg, n, 0.05f, 0.9f),
                     0);
  }
  assert_twin(gw, w, n, TOL_ELEM, 1e-6, "w (momentum)");
  assert_twin(gv, v, n, TOL_ELEM, 1e-6, "v (momentum)");
  kn_cuda_free(gw), kn_cuda_free(gv), kn_cuda_free(gg);
  free(w), free(v), free(g);
}
END_TEST

/* The optimizer updates (optim_cuda.h), 3 steps with and without weight
 * decay; _i = kind * nsizes + size index, kind 0..5 as in optim.h's order
 * (sgd, momentum, nesterov, adagrad, adam, adamw). */
START_TEST(test_optim_updates) {
  int nsizes = sizeof sizes / sizeof sizes[0], kind = _i / nsizes;
  size_t n = sizes[_i % nsizes];
  static const char *const names[6] = {"sgd",     "momentum", "nesterov",
                                       "adagrad", "adam",     "adamw"};
  char what[64];

  for (int decay = 0; decay < 2; decay++) {
    float *w = tu_frandv(n, 21, 0), *s0 = tu_frandv(n, 22, 0),
          *s1 = tu_frandv(n, 23, 0), *g = tu_frandv(n, 24, 0);
    struct kn_optim_hp hp = {.lr = 0.01f,
                             .momentum = 0.9f,
                             .beta1 = 0.9,
                             .beta2 = 0.999,
                             .eps = 1e-8f,
                             .weight_decay = decay ? 0.05f : 0.0f};
    /* Adagrad's accumulator and Adam's v are sums of squares: >= 0. */
    for (size_t i = 0; i < n; i++) {
      if (kind == 3)
        s0[i] = fabsf(s0[i]);
      s1[i] = fabsf(s1[i]);
    }
    float *gw = to_gpu(w, n), *gs0 = to_gpu(s0, n), *gs1 = to_gpu(s1, n),
          *gg = to_gpu(g, n);
    for (hp.t = 1; hp.t <= 3; hp.t++) {
      int rc;
      switch (kind) {
      case 0:
        kn_sgd_step(w, g, n, &hp);
        rc = kn_sgd_step_cuda(ctx, gw, gg, n, &hp);
        break;
      case 1:
        kn_momentum_step(w, s0, g, n, &hp);
        rc = kn_momentum_step_cuda(ctx, gw, gs0, gg, n, &hp);
        break;
      case 2:
        kn_nesterov_step(w, s0, g, n, &hp);
        rc = kn_nesterov_step_cuda(ctx, gw, gs0, gg, n, &hp);
        break;
      case 3:
        kn_adagrad_step(w, s0, g, n, &hp);
        rc = kn_adagrad_step_cuda(ctx, gw, gs0, gg, n, &hp);
        break;
      case 4:
        kn_adam_step(w, s0, s1, g, n, &hp);
        rc = kn_adam_step_cuda(ctx, gw, gs0, gs1, gg, n, &hp);
        break;
      default:
        kn_adamw_step(w, s0, s1, g, n, &hp);
        rc = kn_adamw_step_cuda(ctx, gw, gs0, gs1, gg, n, &hp);
        break;
      }
      ck_assert_int_eq(rc, 0);
    }
    snprintf(what, sizeof what, "%s wd=%d n=%zu w", names[kind], decay, n);
    assert_twin(gw, w, n, TOL_ELEM, 1e-6, what);
    snprintf(what, sizeof what, "%s wd=%d n=%zu slot 0", names[kind], decay, n);
    assert_twin(gs0, s0, n, TOL_ELEM, 1e-6, what);
    snprintf(what, sizeof what, "%s wd=%d n=%zu slot 1", names[kind], decay, n);
    assert_twin(gs1, s1, n, TOL_ELEM, 1e-6, what);
    kn_cuda_free(gw), kn_cuda_free(gs0), kn_cuda_free(gs1), kn_cuda_free(gg);
    free(w), free(s0), free(s1), free(g);
  }
}
END_TEST

/* The global norm (a tree of double partial sums, TOL_SUMSQ) and
 * clipping to it. */
START_TEST(test_clip) {
  size_t n = sizes[_i];
  float *g = tu_frandv(n, 31, 0), *gg = to_gpu(g, n);
  double cpu, gpu = -1.0, norm = -1.0;

  cpu = kn_sumsq(g, n);
  ck_assert_int_eq(kn_sumsq_cuda(ctx, &gpu, gg, n), 0);
  ck_assert_msg(fabs(gpu - cpu) <= TOL_SUMSQ * cpu,
                "sumsq n=%zu: gpu %.17g, "
                "cpu %.17g",
                n, gpu, cpu);
  cpu = kn_clip_global_norm(g, n, 0.5);
  ck_assert_int_eq(kn_clip_global_norm_cuda(ctx, &norm, gg, n, 0.5), 0);
  ck_assert_msg(fabs(norm - cpu) <= TOL_SUMSQ * (cpu + 1e-30),
                "norm n=%zu: gpu %.17g, cpu %.17g", n, norm, cpu);
  /* The scale factor may differ in its last bit with the norm. */
  assert_twin(gg, g, n, 1e-6, 1e-6, "clipped");
  kn_cuda_free(gg);
  free(g);
}
END_TEST

START_TEST(test_smooth) {
  size_t n = sizes[_i];
  float *x = tu_frandv(n, 21, 0), *dy = tu_frandv(n, 22, 0),
        *y = tu_frandv(n, 23, 0);
  float *dx = tu_frandv(n, 24, 0);
  float *gx = to_gpu(x, n), *gdy = to_gpu(dy, n), *gy = to_gpu(y, n);
  float *gdx = to_gpu(dx, n);

  kn_tanh_forward(y, x, n);
  ck_assert_int_eq(kn_tanh_forward_cuda(ctx, gy, gx, n), 0);
  assert_twin(gy, y, n, TOL_TRANS, 1e-6, "tanh y");
  /* Backward from the CPU's y on both sides: only the formula is compared. */
  ck_assert_int_eq(kn_cuda_upload(ctx, gy, y, n * sizeof *y), 0);
  kn_tanh_backward(dx, dy, y, n);
  ck_assert_int_eq(kn_tanh_backward_cuda(ctx, gdx, gdy, gy, n), 0);
  assert_twin(gdx, dx, n, TOL_ELEM, 1e-6, "tanh dx");
  kn_sigmoid_forward(y, x, n);
  ck_assert_int_eq(kn_sigmoid_forward_cuda(ctx, gy, gx, n), 0);
  assert_twin(gy, y, n, TOL_TRANS, 1e-6, "sigmoid y");
  ck_assert_int_eq(kn_cuda_upload(ctx, gy, y, n * sizeof *y), 0);
  kn_sigmoid_backward(dx, dy, y, n);
  ck_assert_int_eq(kn_sigmoid_backward_cuda(ctx, gdx, gdy, gy, n), 0);
  assert_twin(gdx, dx, n, TOL_ELEM, 1e-6, "sigmoid dx");
  kn_cuda_free(gx), kn_cuda_free(gdy), kn_cuda_free(gy), kn_cuda_free(gdx);
  free(x), free(dy), free(y), free(dx);
}
END_TEST

/* The demo CNN's layers at a batch of 64, padding, a 1x1 kernel, an
 * empty batch. */
static const struct kn_conv_shape convs[] = {
    {64, 1, 28, 28, 16, 5, 2}, {64, 16, 14, 14, 32, 5, 0},
    {2, 3, 7, 6, 4, 3, 1},     {2, 2, 5, 5, 3, 1, 0},
    {0, 2, 5, 5, 3, 3, 0},
};

START_TEST(test_conv) {
  const struct kn_conv_shape *s = &convs[_i];
  size_t nx = (size_t)s->B * s->C * s->H * s->W;
  size_t nw = (size_t)s->OC * s->C * s->K * s->K;
  size_t ny = (size_t)s->B * s->OC * kn_conv_oh(s) * kn_conv_ow(s);
  size_t ncol = kn_conv_col_floats(s);
  float *x = tu_frandv(nx, 31, 0), *w = tu_frandv(nw, 32, 0),
        *b = tu_frandv(s->OC, 33, 0);
  float *y = tu_frandv(ny, 34, 0), *dy = tu_frandv(ny, 35, 0),
        *col = tu_frandv(ncol, 36, 0);
  float *dx = tu_frandv(nx, 37, 0), *dw = tu_frandv(nw, 38, 0),
        *db = tu_frandv(s->OC, 39, 0);
  float *gx = to_gpu(x, nx), *gw = to_gpu(w, nw), *gb = to_gpu(b, s->OC);
  float *gy = to_gpu(y, ny), *gdy = to_gpu(dy, ny), *gcol = to_gpu(col, ncol);
  float *gdx = to_gpu(dx, nx), *gdw = to_gpu(dw, nw), *gdb = to_gpu(db, s->OC);

  kn_conv2d_forward(s, y, x, w, b, col);
  ck_assert_int_eq(kn_conv2d_forward_cuda(ctx, s, gy, gx, gw, gb, gcol), 0);
  assert_twin(gy, y, ny, TOL_GEMM, 1.0, "conv y");
  kn_conv2d_backward(s, dx, dw, db, dy, x, w, col);
  ck_assert_int_eq(
      kn_conv2d_backward_cuda(ctx, s, gdx, gdw, gdb, gdy, gx, gw, gcol), 0);
  assert_twin(gdx, dx, nx, TOL_GEMM, 1.0, "conv dx");
  assert_twin(gdw, dw, nw, TOL_GEMM, 1.0, "conv dw");
  assert_twin(gdb, db, s->OC, TOL_GEMM, 1.0, "conv db");
  /* From the unfolding the forward pass leaves, as the CNN's model does:
   * the outputs filled with something else first. */
  ck_assert_int_eq(kn_conv2d_forward_cuda(ctx, s, gy, gx, gw, gb, gcol), 0);
  ck_assert_int_eq(kn_cuda_upload(ctx, gdx, x, nx * sizeof *x), 0);
  ck_assert_int_eq(kn_cuda_upload(ctx, gdw, w, nw * sizeof *w), 0);
  ck_assert_int_eq(kn_cuda_upload(ctx, gdb, b, s->OC * sizeof *b), 0);
  ck_assert_int_eq(
      kn_conv2d_backward_unfolded_cuda(ctx, s, gdx, gdw, gdb, gdy, gw, gcol),
      0);
  assert_twin(gdx, dx, nx, TOL_GEMM, 1.0, "conv dx (unfolded)");
  assert_twin(gdw, dw, nw, TOL_GEMM, 1.0, "conv dw (unfolded)");
  assert_twin(gdb, db, s->OC, TOL_GEMM, 1.0, "conv db (unfolded)");
  kn_cuda_free(gx), kn_cuda_free(gw), kn_cuda_free(gb), kn_cuda_free(gy);
  kn_cuda_free(gdy), kn_cuda_free(gcol), kn_cuda_free(gdx);
  kn_cuda_free(gdw), kn_cuda_free(gdb);
  free(x), free(w), free(b), free(y), free(dy), free(col), free(dx), free(dw);
  free(db);
}
END_TEST

START_TEST(test_pool) {
  static const int cases[][4] = {
      {64 * 16, 28, 28, 2}, {64 * 32, 10, 10, 2}, {3, 7, 5, 2}, {2, 9, 9, 3}};
  const int *c = cases[_i];
  int planes = c[0], H = c[1], W = c[2], P = c[3];
  size_t nx = (size_t)planes * H * W, ny = (size_t)planes * (H / P) * (W / P);
  float *x = tu_frandv(nx, 41, 0), *y = tu_frandv(ny, 42, 0),
        *dy = tu_frandv(ny, 43, 0);
  float *dx = tu_frandv(nx, 44, 0);
  int32_t *idx = malloc(ny * sizeof *idx), *gidx_host = malloc(ny * 4);
  float *gx = to_gpu(x, nx), *gy = to_gpu(y, ny), *gdy = to_gpu(dy, ny);
  float *gdx = to_gpu(dx, nx);
  void *gidx = NULL;

  ck_assert_int_eq(kn_cuda_alloc(&gidx, ny * 4), 0);
  kn_maxpool2d_forward(y, idx, x, planes, H, W, P);
  ck_assert_int_eq(
      kn_maxpool2d_forward_cuda(ctx, gy, gidx, gx, planes, H, W, P), 0);
  assert_twin(gy, y, ny, 0.0, 0.0, "pool y");
  ck_assert_int_eq(kn_cuda_download(ctx, gidx_host, gidx, ny * 4), 0);
  ck_assert(memcmp(gidx_host, idx, ny * 4) == 0);
  kn_maxpool2d_backward(dx, dy, idx, planes, H, W, P);
  ck_assert_int_eq(
      kn_maxpool2d_backward_cuda(ctx, gdx, gdy, gidx, planes, H, W, P), 0);
  assert_twin(gdx, dx, nx, 0.0, 0.0, "pool dx");
  kn_cuda_free(gx), kn_cuda_free(gy), kn_cuda_free(gdy), kn_cuda_free(gdx);
  kn_cuda_free(gidx);
  free(x), free(y), free(dy), free(dx), free(idx), free(gidx_host);
}
END_TEST

static Suite *kernels_cuda_suite(void) {
  Suite *s = suite_create("kernels-cuda");
  TCase *tc = tcase_create("twins");

  tcase_add_unchecked_fixture(tc, setup, teardown);
  tcase_add_loop_test(tc, test_dense, 0, sizeof shapes / sizeof shapes[0]);
  tcase_add_loop_test(tc, test_relu, 0, sizeof sizes / sizeof sizes[0]);
  tcase_add_loop_test(tc, test_xent, 0, sizeof batches / sizeof batches[0]);
  tcase_add_loop_test(tc, test_updates, 0, sizeof sizes / sizeof sizes[0]);
  tcase_add_loop_test(tc, test_optim_updates, 0,
                      6 * (int)(sizeof sizes / sizeof sizes[0]));
  tcase_add_loop_test(tc, test_clip, 0, sizeof sizes / sizeof sizes[0]);
  tcase_add_loop_test(tc, test_smooth, 0, sizeof sizes / sizeof sizes[0]);
  tcase_add_loop_test(tc, test_conv, 0, sizeof convs / sizeof convs[0]);
  tcase_add_loop_test(tc, test_pool, 0, 4);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  char why[256];

  if (kn_cuda_probe(why, sizeof why) <= 0)
    return tu_skip(why);
  /* The probe has initialised CUDA, which does not survive fork(). */
  return tu_run(kernels_cuda_suite(), TU_NOFORK | TU_ENV);
}

#endif
