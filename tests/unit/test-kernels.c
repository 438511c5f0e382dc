/* Unit tests of the CPU kernels (kernels/dense.h, kernels/blas.h): the
 * sgemm-based dense layer against naive loops in double at several shapes,
 * relu, the softmax cross-entropy against a double reference, finite
 * differences and a case worked by hand, and the optimizer updates against
 * a plain loop and a hand-computed momentum example; tanh and sigmoid
 * against double and finite differences; the convolution against the
 * definition in double (forward) and central differences (dx, dw, db), and
 * max pooling against a plain loop (values, argmax, where dy lands). */
#include "blas.h"
#include "conv.h"
#include "dense.h"
#include "frand.h"
#include "unit.h"

#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* One shape of the dense layer. */
struct shape {
  int B;   /* batch rows */
  int in;  /* input features */
  int out; /* output features */
};

/* Odd sizes, a batch of 1, an empty batch and an empty input. */
static const struct shape shapes[] = {
    {1, 1, 1},      {1, 784, 10}, {3, 5, 7}, {17, 33, 9},
    {64, 784, 256}, {7, 1, 13},   {0, 4, 3}, {2, 0, 3},
};

int openblas_get_num_threads(void);

/* Asserts |got - want| <= rel * (|want| + floor) for each of n elements.
 * One ck_assert for the lot: check logs every assertion it evaluates. */
static void assert_close(const float *got, const double *want, size_t n,
                         double rel, double floor, const char *what) {
  size_t i = 0;

  while (i < n && fabs(got[i] - want[i]) <= rel * (fabs(want[i]) + floor))
    i++;
  ck_assert_msg(i == n, "%s[%zu]: got %.9g, want %.9g", what, i,
                i < n ? got[i] : 0.0, i < n ? want[i] : 0.0);
}

START_TEST(test_dense_forward) {
  struct shape s = shapes[_i];
  size_t ny = (size_t)s.B * s.out;
  float *x = tu_frandv((size_t)s.B * s.in, 1, 0),
        *w = tu_frandv((size_t)s.out * s.in, 2, 0);
  float *b = tu_frandv(s.out, 3, 0), *y = tu_frandv(ny, 4, 0),
        *y0 = tu_frandv(ny, 4, 0);
  double *ref = calloc(ny + 1, sizeof *ref);

  for (int r = 0; r < s.B; r++)
    for (int j = 0; j < s.out; j++) {
      double acc = b[j];
      for (int k = 0; k < s.in; k++)
        acc += (double)x[r * s.in + k] * w[j * s.in + k];
      ref[r * s.out + j] = acc;
    }
  kn_dense_forward(y, x, w, b, s.B, s.in, s.out);
  assert_close(y, ref, ny, 1e-4, 1.0, "y");
  /* Without a bias the result is x w^T alone. */
  for (size_t i = 0; i < ny; i++)
    ref[i] -= b[i % s.out];
  kn_dense_forward(y0, x, w, NULL, s.B, s.in, s.out);
  assert_close(y0, ref, ny, 1e-4, 1.0, "y (no bias)");
  free(x), free(w), free(b), free(y), free(y0), free(ref);
}
END_TEST

START_TEST(test_dense_backward) {
  struct shape s = shapes[_i];
  size_t nx = (size_t)s.B * s.in, nw = (size_t)s.out * s.in;
  float *x = tu_frandv(nx, 5, 0), *w = tu_frandv(nw, 6, 0);
  float *dy = tu_frandv((size_t)s.B * s.out, 7, 0);
  float *dx = tu_frandv(nx, 8, 0), *dw = tu_frandv(nw, 9, 0),
        *db = tu_frandv(s.out, 10, 0);
  double *rdx = calloc(nx + 1, sizeof *rdx), *rdw = calloc(nw + 1, sizeof *rdw);
  double *rdb = calloc(s.out + 1, sizeof *rdb);

  for (int r = 0; r < s.B; r++)
    for (int j = 0; j < s.out; j++) {
      double g = dy[r * s.out + j];
      rdb[j] += g;
      for (int k = 0; k < s.in; k++) {
        rdw[j * s.in + k] += g * x[r * s.in + k];
        rdx[r * s.in + k] += g * w[j * s.in + k];
      }
    }
  kn_dense_backward(dx, dw, db, dy, x, w, s.B, s.in, s.out);
  assert_close(dx, rdx, nx, 1e-4, 1.0, "dx");
  assert_close(dw, rdw, nw, 1e-4, 1.0, "dw");
  assert_close(db, rdb, s.out, 1e-4, 1.0, "db");
  /* dx == NULL skips dx but still overwrites dw and db. */
  memset(dw, 0x7f, nw * sizeof *dw);
  memset(db, 0x7f, s.out * sizeof *db);
  kn_dense_backward(NULL, dw, db, dy, x, w, s.B, s.in, s.out);
  assert_close(dw, rdw, nw, 1e-4, 1.0, "dw (no dx)");
  assert_close(db, rdb, s.out, 1e-4, 1.0, "db (no dx)");
  free(x), free(w), free(dy), free(dx), free(dw), free(db);
  free(rdx), free(rdw), free(rdb);
}
END_TEST

static const size_t sizes[] = {0, 1, 7, 8, 1000003};

START_TEST(test_relu) {
  size_t n = sizes[_i], i;
  float *x = tu_frandv(n, 11, 0), *dy = tu_frandv(n, 12, 0),
        *y = tu_frandv(n, 13, 0);
  float *dx = tu_frandv(n, 14, 0);

  if (n > 2)
    x[2] = 0.0f;
  kn_relu_forward(y, x, n);
  i = 0;
  while (i < n && y[i] == (x[i] > 0.0f ? x[i] : 0.0f))
    i++;
  ck_assert_msg(i == n, "relu forward wrong at %zu", i);
  kn_relu_backward(dx, dy, y, n);
  i = 0;
  while (i < n && dx[i] == (y[i] > 0.0f ? dy[i] : 0.0f))
    i++;
  ck_assert_msg(i == n, "relu backward wrong at %zu", i);
  /* In place, as dense.h allows. */
  kn_relu_backward(dy, dy, y, n);
  ck_assert(n == 0 || memcmp(dy, dx, n * sizeof *dx) == 0);
  kn_relu_forward(x, x, n);
  ck_assert(n == 0 || memcmp(x, y, n * sizeof *y) == 0);
  free(x), free(dy), free(y), free(dx);
}
END_TEST

/* Smooth activations: forward against double, backward against the
 * formula on the output and against central differences of the forward. */
START_TEST(test_smooth_activations) {
  enum { N = 1001 };
  float *x = tu_frandv(N, 31, 0), *dy = tu_frandv(N, 32, 0), y[N], dx[N];

  for (int i = 0; i < N; i++)
    x[i] *= 6.0f;
  for (int f = 0; f < 2; f++) {
    void (*fwd)(float *, const float *, size_t) =
        f ? kn_sigmoid_forward : kn_tanh_forward;
    void (*bwd)(float *, const float *, const float *, size_t) =
        f ? kn_sigmoid_backward : kn_tanh_backward;
    const float h = 1e-2f;
    int i;

    fwd(y, x, N);
    for (i = 0; i < N; i++) {
      double want = f ? 1.0 / (1.0 + exp(-(double)x[i])) : tanh((double)x[i]);
      if (fabs(y[i] - want) > 1e-6 * (fabs(want) + 1.0))
        break;
    }
    ck_assert_msg(i == N, "%s forward wrong at %d", f ? "sigmoid" : "tanh", i);
    bwd(dx, dy, y, N);
    for (i = 0; i < N; i++) {
      float p = x[i] + h, m = x[i] - h, yp, ym;
      fwd(&yp, &p, 1);
      fwd(&ym, &m, 1);
      double fd = dy[i] * ((double)yp - ym) / (2.0 * h);
      if (fabs(dx[i] - fd) > 2e-3 * (fabs(fd) + 0.05))
        break;
    }
    ck_assert_msg(i == N, "%s backward vs finite differences at %d: %g",
                  f ? "sigmoid" : "tanh", i, i < N ? dx[i] : 0.0);
    /* In place, as dense.h allows. */
    memcpy(y, dx, sizeof dx);
    bwd(dy, dy, (fwd(x, x, N), x), N);
    ck_assert(memcmp(dy, y, sizeof y) == 0);
  }
  free(x), free(dy);
}
END_TEST

/* Convolution shapes: the demo CNN's two layers (batch of 3), padding,
 * a 1x1 kernel, a kernel as big as the input, an empty batch, and a batch
 * whose input gradient is made 2 examples and then 1 at a time (the
 * second layer's, 1 at a time: conv_cpu.c's KN__DCOL_FLOATS). */
static const struct kn_conv_shape convs[] = {
    {3, 1, 28, 28, 16, 5, 2}, {3, 16, 14, 14, 32, 5, 0}, {2, 3, 7, 6, 4, 3, 1},
    {2, 2, 5, 5, 3, 1, 0},    {1, 2, 4, 4, 2, 4, 0},     {0, 2, 5, 5, 3, 3, 0},
    {3, 8, 22, 22, 4, 3, 0},
};

/* x[n, c, h, w] of an NCHW tensor, 0 outside the image. */
static double at(const float *x, const struct kn_conv_shape *s, int n, int c,
                 int h, int w) {
  if (h < 0 || h >= s->H || w < 0 || w >= s->W)
    return 0.0;
  return x[(((size_t)n * s->C + c) * s->H + h) * s->W + w];
}

/* The definition in conv.h, in double: y (B, OC, OH, OW). */
static void conv_ref(double *y, const struct kn_conv_shape *s, const float *x,
                     const float *w, const float *b) {
  int oh = kn_conv_oh(s), ow = kn_conv_ow(s), K = s->K;

  for (int n = 0; n < s->B; n++)
    for (int o = 0; o < s->OC; o++)
      for (int i = 0; i < oh; i++)
        for (int j = 0; j < ow; j++) {
          double acc = b[o];
          for (int c = 0; c < s->C; c++)
            for (int kh = 0; kh < K; kh++)
              for (int kw = 0; kw < K; kw++)
                acc += w[((o * s->C + c) * K + kh) * K + kw] *
                       at(x, s, n, c, i + kh - s->pad, j + kw - s->pad);
          y[(((size_t)n * s->OC + o) * oh + i) * ow + j] = acc;
        }
}

START_TEST(test_conv_forward) {
  const struct kn_conv_shape *s = &convs[_i];
  size_t nx = (size_t)s->B * s->C * s->H * s->W;
  size_t nw = (size_t)s->OC * s->C * s->K * s->K;
  size_t ny = (size_t)s->B * s->OC * kn_conv_oh(s) * kn_conv_ow(s);
  float *x = tu_frandv(nx, 41, 0), *w = tu_frandv(nw, 42, 0),
        *b = tu_frandv(s->OC, 43, 0);
  float *y = tu_frandv(ny, 44, 0),
        *col = tu_frandv(kn_conv_col_floats(s), 45, 0);
  double *ref = calloc(ny + 1, sizeof *ref);

  conv_ref(ref, s, x, w, b);
  kn_conv2d_forward(s, y, x, w, b, col);
  assert_close(y, ref, ny, 1e-5, 1.0, "conv y");
  for (size_t i = 0; i < ny; i++)
    ref[i] -= b[i / (ny / (s->B ? s->B : 1) / s->OC) % s->OC];
  kn_conv2d_forward(s, y, x, w, NULL, col);
  assert_close(y, ref, ny, 1e-5, 1.0, "conv y (no bias)");
  free(x), free(w), free(b), free(y), free(col), free(ref);
}
END_TEST

/* L = sum of y * r over the output, in double: its gradient w.r.t. y is r. */
static double conv_loss(const struct kn_conv_shape *s, const float *x,
                        const float *w, const float *b, const float *r,
                        size_t ny) {
  double *y = calloc(ny + 1, sizeof *y), L = 0.0;

  conv_ref(y, s, x, w, b);
  for (size_t i = 0; i < ny; i++)
    L += y[i] * r[i];
  free(y);
  return L;
}

/* Central differences of L for every element of v (n floats), against g. */
static void fd_check(const struct kn_conv_shape *s, float *x, float *w,
                     float *b, const float *r, size_t ny, float *v, size_t n,
                     const float *g, const char *what) {
  const float h = 0.5f; /* L is linear in each input: exact up to rounding */
  size_t i;

  for (i = 0; i < n; i++) {
    float keep = v[i];
    v[i] = keep + h;
    double lp = conv_loss(s, x, w, b, r, ny);
    v[i] = keep - h;
    double lm = conv_loss(s, x, w, b, r, ny);
    v[i] = keep;
    double fd = (lp - lm) / (2.0 * h);
    if (fabs(g[i] - fd) > 1e-4 * (fabs(fd) + 1.0))
      break;
  }
  ck_assert_msg(i == n, "%s[%zu]: backward %g, finite differences differ", what,
                i, i < n ? g[i] : 0.0);
}

START_TEST(test_conv_backward) {
  /* Small shapes only: every element gets two reference forward passes. */
  const struct kn_conv_shape *s = &convs[2 + _i];
  size_t nx = (size_t)s->B * s->C * s->H * s->W;
  size_t nw = (size_t)s->OC * s->C * s->K * s->K;
  size_t ny = (size_t)s->B * s->OC * kn_conv_oh(s) * kn_conv_ow(s);
  float *x = tu_frandv(nx, 51, 0), *w = tu_frandv(nw, 52, 0),
        *b = tu_frandv(s->OC, 53, 0);
  float *r = tu_frandv(ny, 54, 0),
        *col = tu_frandv(kn_conv_col_floats(s), 55, 0);
  float *dx = tu_frandv(nx, 56, 0), *dw = tu_frandv(nw, 57, 0),
        *db = tu_frandv(s->OC, 58, 0);
  float *dw2 = tu_frandv(nw, 59, 0), *db2 = tu_frandv(s->OC, 60, 0);

  kn_conv2d_backward(s, dx, dw, db, r, x, w, col);
  fd_check(s, x, w, b, r, ny, x, nx, dx, "conv dx");
  fd_check(s, x, w, b, r, ny, w, nw, dw, "conv dw");
  fd_check(s, x, w, b, r, ny, b, s->OC, db, "conv db");
  /* Without dx, dw and db come out the same. */
  kn_conv2d_backward(s, NULL, dw2, db2, r, x, w, col);
  ck_assert(memcmp(dw, dw2, nw * sizeof *dw) == 0);
  ck_assert(memcmp(db, db2, s->OC * sizeof *db) == 0);
  free(x), free(w), free(b), free(r), free(col), free(dx), free(dw), free(db);
  free(dw2), free(db2);
}
END_TEST

/* dx of L = sum of y * r, in double: dx[n, c, h, w] = the sum over o, kh,
 * kw of r[n, o, h - kh + pad, w - kw + pad] * w[o, c, kh, kw]. */
static void conv_dx_ref(double *dx, const struct kn_conv_shape *s,
                        const float *r, const float *w) {
  int oh = kn_conv_oh(s), ow = kn_conv_ow(s), K = s->K;

  for (int n = 0; n < s->B; n++)
    for (int c = 0; c < s->C; c++)
      for (int h = 0; h < s->H; h++)
        for (int x = 0; x < s->W; x++) {
          double acc = 0.0;
          for (int o = 0; o < s->OC; o++)
            for (int kh = 0; kh < K; kh++)
              for (int kw = 0; kw < K; kw++) {
                int i = h - kh + s->pad, j = x - kw + s->pad;
                if (i >= 0 && i < oh && j >= 0 && j < ow)
                  acc +=
                      (double)r[(((size_t)n * s->OC + o) * oh + i) * ow + j] *
                      w[((o * s->C + c) * K + kh) * K + kw];
              }
          dx[(((size_t)n * s->C + c) * s->H + h) * s->W + x] = acc;
        }
}

/* dx on every shape, the big ones too (their input gradient is made a few
 * examples at a time), against the definition in double. */
START_TEST(test_conv_dx) {
  const struct kn_conv_shape *s = &convs[_i];
  size_t nx = (size_t)s->B * s->C * s->H * s->W;
  size_t nw = (size_t)s->OC * s->C * s->K * s->K;
  size_t ny = (size_t)s->B * s->OC * kn_conv_oh(s) * kn_conv_ow(s);
  float *x = tu_frandv(nx, 91, 0), *w = tu_frandv(nw, 92, 0),
        *r = tu_frandv(ny, 93, 0),
        *col = tu_frandv(kn_conv_col_floats(s), 94, 0);
  float *dx = tu_frandv(nx, 95, 0), *dw = tu_frandv(nw, 96, 0),
        *db = tu_frandv(s->OC, 97, 0);
  double *ref = calloc(nx + 1, sizeof *ref);

  conv_dx_ref(ref, s, r, w);
  kn_conv2d_backward(s, dx, dw, db, r, x, w, col);
  assert_close(dx, ref, nx, 1e-5, 1.0, "conv dx");
  free(x), free(w), free(r), free(col), free(dx), free(dw), free(db);
  free(ref);
}
END_TEST

/* The backward pass from the unfolding the forward pass left in col equals
 * the one that unfolds x itself, bit for bit, on every shape (the demo
 * CNN's at batch 3 included), with dx and without. */
START_TEST(test_conv_backward_unfolded) {
  const struct kn_conv_shape *s = &convs[_i];
  size_t nx = (size_t)s->B * s->C * s->H * s->W;
  size_t nw = (size_t)s->OC * s->C * s->K * s->K;
  size_t ny = (size_t)s->B * s->OC * kn_conv_oh(s) * kn_conv_ow(s);
  size_t ncol = kn_conv_col_floats(s);
  float *x = tu_frandv(nx, 71, 0), *w = tu_frandv(nw, 72, 0),
        *b = tu_frandv(s->OC, 73, 0), *dy = tu_frandv(ny, 74, 0);
  float *y = tu_frandv(ny, 75, 0), *col = tu_frandv(ncol, 76, 0),
        *col2 = tu_frandv(ncol, 77, 0);
  float *dx = tu_frandv(nx, 78, 0), *dw = tu_frandv(nw, 79, 0),
        *db = tu_frandv(s->OC, 80, 0);
  float *dx2 = tu_frandv(nx, 81, 0), *dw2 = tu_frandv(nw, 82, 0),
        *db2 = tu_frandv(s->OC, 83, 0);

  for (int with_dx = 1; with_dx >= 0; with_dx--) {
    kn_conv2d_backward(s, with_dx ? dx : NULL, dw, db, dy, x, w, col);
    kn_conv2d_forward(s, y, x, w, b, col2);
    kn_conv2d_backward_unfolded(s, with_dx ? dx2 : NULL, dw2, db2, dy, w, col2);
    ck_assert_msg(memcmp(dw, dw2, nw * sizeof *dw) == 0, "dw differs");
    ck_assert_msg(memcmp(db, db2, s->OC * sizeof *db) == 0, "db differs");
    ck_assert_msg(memcmp(dx, dx2, nx * sizeof *dx) == 0, "dx differs");
  }
  free(x), free(w), free(b), free(dy), free(y), free(col), free(col2);
  free(dx), free(dw), free(db), free(dx2), free(dw2), free(db2);
}
END_TEST

START_TEST(test_maxpool) {
  /* planes, H, W, P: the CNN's two pools, odd sizes (the edge dropped), a
   * window of 3 and one of 1. */
  static const int cases[][4] = {{48, 28, 28, 2},
                                 {96, 10, 10, 2},
                                 {3, 7, 5, 2},
                                 {2, 9, 9, 3},
                                 {2, 3, 3, 1}};
  const int *c = cases[_i];
  int planes = c[0], H = c[1], W = c[2], P = c[3], oh = H / P, ow = W / P;
  size_t nx = (size_t)planes * H * W, ny = (size_t)planes * oh * ow;
  float *x = tu_frandv(nx, 61, 0), *y = tu_frandv(ny, 62, 0),
        *dy = tu_frandv(ny, 63, 0);
  float *dx = tu_frandv(nx, 64, 0);
  int32_t *idx = malloc(ny * sizeof *idx);

  x[0] = x[1]; /* a tie: the first position wins */
  kn_maxpool2d_forward(y, idx, x, planes, H, W, P);
  for (int p = 0; p < planes; p++)
    for (int i = 0; i < oh; i++)
      for (int j = 0; j < ow; j++) {
        int best = i * P * W + j * P;
        for (int a = 0; a < P; a++)
          for (int b = 0; b < P; b++)
            if (x[(size_t)p * H * W + (i * P + a) * W + j * P + b] >
                x[(size_t)p * H * W + best])
              best = (i * P + a) * W + j * P + b;
        size_t o = ((size_t)p * oh + i) * ow + j;
        ck_assert_int_eq(idx[o], best);
        ck_assert(y[o] == x[(size_t)p * H * W + best]);
      }
  kn_maxpool2d_backward(dx, dy, idx, planes, H, W, P);
  /* Each dy lands on its argmax; everything else is 0. */
  for (size_t i = 0; i < nx; i++) {
    size_t p = i / ((size_t)H * W);
    int h = (int)(i % ((size_t)H * W)) / W, w = (int)(i % W);
    float want = 0.0f;
    if (h / P < oh && w / P < ow) {
      size_t o = (p * oh + h / P) * ow + w / P;
      if (idx[o] == (int32_t)(i % ((size_t)H * W)))
        want = dy[o];
    }
    ck_assert_msg(dx[i] == want, "pool dx[%zu] = %g, want %g", i, dx[i], want);
  }
  free(x), free(y), free(dy), free(dx), free(idx);
}
END_TEST

/* Mean softmax cross-entropy of logits (B, C), in double. */
static double xent_ref(const float *logits, const uint8_t *labels, int B,
                       int C) {
  double total = 0.0;

  for (int r = 0; r < B; r++) {
    const float *l = logits + r * C;
    double max = l[0], sum = 0.0;
    for (int j = 1; j < C; j++)
      max = l[j] > max ? l[j] : max;
    for (int j = 0; j < C; j++)
      sum += exp(l[j] - max);
    total += log(sum) + max - l[labels[r]];
  }
  return total / B;
}

START_TEST(test_xent_values) {
  enum { B = 50, C = 10 };
  float *logits = tu_frandv(B * C, 15, 0), d[B * C];
  uint8_t labels[B];
  int correct, hits = 0;

  for (int i = 0; i < B * C; i++)
    logits[i] *= 8.0f;
  for (int r = 0; r < B; r++) {
    int arg = 0;
    labels[r] = (uint8_t)(r * 7 % C);
    for (int j = 1; j < C; j++)
      arg = logits[r * C + j] > logits[r * C + arg] ? j : arg;
    hits += arg == labels[r];
  }
  ck_assert_double_eq_tol(kn_softmax_xent(d, &correct, logits, labels, B, C),
                          xent_ref(logits, labels, B, C), 1e-5);
  ck_assert_int_eq(correct, hits);
  /* Every row of the gradient sums to 0. */
  for (int r = 0; r < B; r++) {
    double sum = 0.0;
    for (int j = 0; j < C; j++)
      sum += d[r * C + j];
    ck_assert_double_eq_tol(sum, 0.0, 1e-7);
  }
  /* Optional outputs may be NULL. */
  ck_assert_double_eq_tol(kn_softmax_xent(NULL, NULL, logits, labels, B, C),
                          xent_ref(logits, labels, B, C), 1e-5);
  free(logits);
}
END_TEST

START_TEST(test_xent_finite_diff) {
  enum { B = 3, C = 5 };
  float *logits = tu_frandv(B * C, 17, 0), d[B * C];
  const uint8_t labels[B] = {0, 4, 2};
  const float eps = 1e-2f;

  for (int i = 0; i < B * C; i++)
    logits[i] *= 2.0f;
  kn_softmax_xent(d, NULL, logits, labels, B, C);
  for (int i = 0; i < B * C; i++) {
    float keep = logits[i], up, down;
    logits[i] = keep + eps;
    up = kn_softmax_xent(NULL, NULL, logits, labels, B, C);
    logits[i] = keep - eps;
    down = kn_softmax_xent(NULL, NULL, logits, labels, B, C);
    logits[i] = keep;
    ck_assert_double_eq_tol(d[i], (up - down) / (2.0 * eps), 1e-3);
  }
  free(logits);
}
END_TEST

START_TEST(test_xent_by_hand) {
  /* Row 0: softmax(1, 2, 3) = (0.0900306, 0.2447285, 0.6652410), label 2,
   * argmax 2. Row 1: uniform thirds, label 1, argmax 0 (first of the ties).
   * Loss = (-ln 0.6652410 + ln 3) / 2. */
  const float logits[6] = {1, 2, 3, 0, 0, 0};
  const uint8_t labels[2] = {2, 1};
  const double want[6] = {0.0450153, 0.1223642,  -0.1673795,
                          0.1666667, -0.3333333, 0.1666667};
  float d[6], big[2] = {1000.0f, 0.0f};
  int correct;

  ck_assert_double_eq_tol(kn_softmax_xent(d, &correct, logits, labels, 2, 3),
                          0.7531091, 1e-6);
  ck_assert_int_eq(correct, 1);
  for (int i = 0; i < 6; i++)
    ck_assert_double_eq_tol(d[i], want[i], 1e-6);
  /* Large logits neither overflow nor lose the loss. */
  ck_assert_double_eq_tol(kn_softmax_xent(d, NULL, big, labels + 1, 1, 2),
                          1000.0, 1e-3);
  ck_assert_double_eq_tol(d[0], 1.0, 1e-6);
  ck_assert_double_eq_tol(d[1], -1.0, 1e-6);
}
END_TEST

START_TEST(test_sgd) {
  size_t n = sizes[_i];
  float *w = tu_frandv(n, 18, 0), *g = tu_frandv(n, 19, 0),
        *ref = tu_frandv(n, 18, 0);
  const float lr = 0.05f;
  double *want = malloc((n ? n : 1) * sizeof *want);

  for (size_t i = 0; i < n; i++) {
    ref[i] -= lr * g[i];
    want[i] = ref[i];
  }
  kn_sgd_update(w, g, n, lr);
  assert_close(w, want, n, 1e-6, 1e-6, "w");
  free(w), free(g), free(ref), free(want);
}
END_TEST

START_TEST(test_momentum) {
  size_t n = sizes[_i];
  float *w = tu_frandv(n, 20, 0), *v = tu_frandv(n, 21, 0),
        *g = tu_frandv(n, 22, 0);
  float *rw = tu_frandv(n, 20, 0), *rv = tu_frandv(n, 21, 0);
  const float lr = 0.05f, mu = 0.9f;
  double *want_w = malloc((n ? n : 1) * sizeof *want_w);
  double *want_v = malloc((n ? n : 1) * sizeof *want_v);

  for (size_t i = 0; i < n; i++) {
    rv[i] = mu * rv[i] + g[i];
    rw[i] -= lr * rv[i];
    want_w[i] = rw[i];
    want_v[i] = rv[i];
  }
  kn_momentum_update(w, v, g, n, lr, mu);
  assert_close(w, want_w, n, 1e-6, 1e-6, "w");
  assert_close(v, want_v, n, 1e-6, 1e-6, "v");
  free(w), free(v), free(g), free(rw), free(rv), free(want_w), free(want_v);
}
END_TEST

START_TEST(test_momentum_two_steps) {
  /* lr 0.1, mu 0.9, v from 0. Element 0, g = 1 then 1: v = 1, w = 0.9;
   * v = 1.9, w = 0.71. Element 1, g = -2 then 0.5: v = -2, w = 1.2;
   * v = -1.3, w = 1.33. */
  float w[2] = {1.0f, 1.0f}, v[2] = {0.0f, 0.0f};
  const float g1[2] = {1.0f, -2.0f}, g2[2] = {1.0f, 0.5f};

  kn_momentum_update(w, v, g1, 2, 0.1f, 0.9f);
  ck_assert_float_eq_tol(v[0], 1.0f, 1e-6f);
  ck_assert_float_eq_tol(w[0], 0.9f, 1e-6f);
  ck_assert_float_eq_tol(v[1], -2.0f, 1e-6f);
  ck_assert_float_eq_tol(w[1], 1.2f, 1e-6f);
  kn_momentum_update(w, v, g2, 2, 0.1f, 0.9f);
  ck_assert_float_eq_tol(v[0], 1.9f, 1e-6f);
  ck_assert_float_eq_tol(w[0], 0.71f, 1e-6f);
  ck_assert_float_eq_tol(v[1], -1.3f, 1e-6f);
  ck_assert_float_eq_tol(w[1], 1.33f, 1e-6f);
}
END_TEST

START_TEST(test_blas) {
  char buf[256] = "";

  /* main already ran kn_blas_init; a second call never re-executes. */
  ck_assert_int_eq(kn_blas_init(NULL, 1), 0);
  ck_assert_int_eq(openblas_get_num_threads(), 1);
  kn_blas_describe(buf, sizeof buf);
  ck_assert_msg(strncmp(buf, "OpenBLAS ", 9) == 0, "describe: %s", buf);
  ck_assert_ptr_nonnull(strstr(buf, " core="));
  ck_assert_ptr_nonnull(strstr(buf, " threads=1 ("));
  kn_blas_describe(buf, 4);
  ck_assert_str_eq(buf, "Ope");
}
END_TEST

static Suite *kernels_suite(void) {
  Suite *s = suite_create("kernels");
  TCase *dense = tcase_create("dense"), *relu = tcase_create("relu");
  TCase *xent = tcase_create("xent"), *upd = tcase_create("updates");
  TCase *blas = tcase_create("blas"), *conv = tcase_create("conv");
  int nshapes = sizeof shapes / sizeof shapes[0];
  int nsizes = sizeof sizes / sizeof sizes[0];

  tcase_add_loop_test(dense, test_dense_forward, 0, nshapes);
  tcase_add_loop_test(dense, test_dense_backward, 0, nshapes);
  tcase_add_loop_test(relu, test_relu, 0, nsizes);
  tcase_add_test(relu, test_smooth_activations);
  tcase_add_loop_test(conv, test_conv_forward, 0,
                      sizeof convs / sizeof convs[0]);
  tcase_add_loop_test(conv, test_conv_backward, 0, 4);
  tcase_add_loop_test(conv, test_conv_backward_unfolded, 0,
                      sizeof convs / sizeof convs[0]);
  tcase_add_loop_test(conv, test_conv_dx, 0, sizeof convs / sizeof convs[0]);
  tcase_add_loop_test(conv, test_maxpool, 0, 5);
  tcase_add_test(xent, test_xent_values);
  tcase_add_test(xent, test_xent_finite_diff);
  tcase_add_test(xent, test_xent_by_hand);
  tcase_add_loop_test(upd, test_sgd, 0, nsizes);
  tcase_add_loop_test(upd, test_momentum, 0, nsizes);
  tcase_add_test(upd, test_momentum_two_steps);
  tcase_add_test(blas, test_blas);
  suite_add_tcase(s, dense);
  suite_add_tcase(s, relu);
  suite_add_tcase(s, xent);
  suite_add_tcase(s, upd);
  suite_add_tcase(s, blas);
  suite_add_tcase(s, conv);
  return s;
}

int main(int argc, char **argv) {
  (void)argc;
  /* First thing, as in every psd program: may re-execute this binary once
   * with OpenBLAS's fast kernels selected. */
  kn_blas_init(argv, 1);
  return tu_run(kernels_suite(), TU_ENV);
}
