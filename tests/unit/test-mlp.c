/* Unit tests for worker/model/mlp.c: the flat parameter layout, Glorot
 * initialisation, the gradients of dw_mlp_train_step (against finite
 * differences, both of the model's own f32 loss and of an independent
 * double-precision forward pass written here), that training lowers the loss
 * on a tiny separable problem, and dw_mlp_evaluate's counts and loss.
 *
 * Tolerances, and why they are honest:
 *  - f32 finite differences with eps = 1e-2: the loss is computed in f32, so
 *    each difference carries about 1e-7 / 1e-2 = 1e-5 of rounding noise, and
 *    the central difference a truncation error of order eps^2 = 1e-4 times
 *    the third derivative. We accept |g - fd| <= 1e-4 + 1e-2 * |fd|
 *    (the worst seen is about 1e-5; each case prints its own).
 *  - double finite differences (eps = 1e-6, on exactly representable f32
 *    steps) leave the model's f32 arithmetic as the only error: we accept
 *    |g - fd| <= 1e-6 + 1e-4 * |fd| (the worst seen is about 3e-8).
 * A ReLU kink inside [p - eps, p + eps] would break either comparison: one
 * eps step moves a pre-activation by at most eps times the largest input to
 * its layer, so the f32 check first asserts that every hidden
 * pre-activation is more than twice that far from zero. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dense.h"
#include "err.h"
#include "mlp.h"
#include "unit.h"

/* The test's own generator, so inputs never depend on mlp.c's. */
static float test_rand(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return (float)(*s >> 40) / 16777216.0f * 2.0f - 1.0f; /* [-1, 1) */
}

/* Reference forward pass in double, straight from the definitions, on the
 * model's parameters as they are now. Returns the mean loss; when minpre is
 * not NULL stores the smallest |pre-activation| of any hidden unit, and in
 * *maxin the largest |input| of any layer (1 for a bias). */
static double ref_loss(const struct dw_mlp *m, const float *x, const uint8_t *y,
                       int B, double *minpre, double *maxin) {
  double a[64], z[64], total = 0.0, least = INFINITY, most = 1.0;
  int r, l, i, j;

  for (r = 0; r < B; r++) {
    int C = m->sizes[m->nlayers];
    double mx, sum = 0.0;

    for (i = 0; i < m->sizes[0]; i++)
      a[i] = x[r * m->sizes[0] + i];
    for (l = 0; l < m->nlayers; l++) {
      int in = m->sizes[l], out = m->sizes[l + 1];

      for (i = 0; i < in; i++)
        most = fmax(most, fabs(a[i]));
      for (j = 0; j < out; j++) {
        z[j] = m->b[l][j];
        for (i = 0; i < in; i++)
          z[j] += (double)m->w[l][j * in + i] * a[i];
        if (l + 1 < m->nlayers && fabs(z[j]) < least)
          least = fabs(z[j]);
      }
      for (j = 0; j < out; j++)
        a[j] = l + 1 < m->nlayers ? fmax(z[j], 0.0) : z[j];
    }
    mx = a[0];
    for (j = 1; j < C; j++)
      mx = fmax(mx, a[j]);
    for (j = 0; j < C; j++)
      sum += exp(a[j] - mx);
    total += log(sum) + mx - a[y[r]];
  }
  if (minpre != NULL) {
    *minpre = least;
    *maxin = most;
  }
  return total / B;
}

/* One gradient-check case: widths, batch, and the seeds for the model and
 * the data. */
struct grad_case {
  int sizes[5];  /* layer widths */
  int nsizes;    /* entries used in sizes */
  int B;         /* batch */
  uint64_t seed; /* model and data seed */
};

static const struct grad_case grad_cases[] = {
    {{5, 4, 3}, 3, 3, 9},
    {{6, 5, 4, 3}, 4, 3, 16},
    {{4, 3}, 2, 2, 3},
};

/* Builds the case's model and batch; the caller frees m, x, y. */
static void setup_case(const struct grad_case *gc, struct dw_mlp **m, float **x,
                       uint8_t **y) {
  uint64_t s = gc->seed;
  int i, C = gc->sizes[gc->nsizes - 1];

  ck_assert_int_eq(dw_mlp_new(m, gc->sizes, gc->nsizes, gc->B), 0);
  dw_mlp_init(*m, gc->seed);
  /* random non-zero biases, so the bias gradients are checked in a
   * non-trivial position too */
  for (i = 0; i < (*m)->nlayers; i++)
    for (int j = 0; j < (*m)->sizes[i + 1]; j++)
      (*m)->b[i][j] = 0.3f * test_rand(&s);
  *x = malloc(sizeof **x * gc->B * gc->sizes[0]);
  *y = malloc(gc->B);
  for (i = 0; i < gc->B * gc->sizes[0]; i++)
    (*x)[i] = test_rand(&s);
  for (i = 0; i < gc->B; i++)
    (*y)[i] = (uint8_t)(i % C);
}

START_TEST(test_grad_fd_f32) {
  const struct grad_case *gc = &grad_cases[_i];
  const float eps = 1e-2f;
  struct dw_mlp *m;
  float *x, *g;
  uint8_t *y;
  double minpre, maxin, worst = 0.0;
  size_t p;

  setup_case(gc, &m, &x, &y);
  ref_loss(m, x, y, gc->B, &minpre, &maxin);
  ck_assert_msg(minpre > 2.0 * eps * maxin,
                "case %d: pre-activation %g too near a kink for a step of %g",
                _i, minpre, eps * maxin);
  dw_mlp_train_step(m, x, y, gc->B, NULL);
  g = malloc(m->nparams * sizeof *g);
  memcpy(g, m->grads, m->nparams * sizeof *g);
  for (p = 0; p < m->nparams; p++) {
    float keep = m->params[p], lp, lm;
    double fd, diff;

    m->params[p] = keep + eps;
    lp = dw_mlp_train_step(m, x, y, gc->B, NULL);
    m->params[p] = keep - eps;
    lm = dw_mlp_train_step(m, x, y, gc->B, NULL);
    m->params[p] = keep;
    fd = ((double)lp - lm) / (2.0 * eps);
    diff = fabs(g[p] - fd);
    ck_assert_msg(diff <= 1e-4 + 1e-2 * fabs(fd),
                  "case %d param %zu: analytic %g, f32 finite difference %g",
                  _i, p, g[p], fd);
    if (diff > worst)
      worst = diff;
  }
  fprintf(stderr, "mlp grad case %d: f32 fd, worst |g - fd| = %.2e\n", _i,
          worst);
  free(g);
  free(x);
  free(y);
  dw_mlp_free(m);
}
END_TEST

START_TEST(test_grad_fd_double) {
  const struct grad_case *gc = &grad_cases[_i];
  const double eps = 1e-6;
  struct dw_mlp *m;
  float *x, *g;
  uint8_t *y;
  double worst = 0.0, lref;
  float loss;
  size_t p;

  setup_case(gc, &m, &x, &y);
  lref = ref_loss(m, x, y, gc->B, NULL, NULL);
  loss = dw_mlp_train_step(m, x, y, gc->B, NULL);
  ck_assert_double_eq_tol(loss, lref, 1e-5 * fabs(lref) + 1e-6);
  g = malloc(m->nparams * sizeof *g);
  memcpy(g, m->grads, m->nparams * sizeof *g);
  for (p = 0; p < m->nparams; p++) {
    /* perturb in double: params[p] itself is f32, so evaluate the reference
     * with the shifted value and put the exact value back */
    float keep = m->params[p];
    double lp, lm, fd, diff, h;

    m->params[p] = (float)(keep + eps);
    h = (double)m->params[p] - keep;
    lp = ref_loss(m, x, y, gc->B, NULL, NULL);
    m->params[p] = (float)(keep - eps);
    h += keep - (double)m->params[p];
    lm = ref_loss(m, x, y, gc->B, NULL, NULL);
    m->params[p] = keep;
    fd = (lp - lm) / h;
    diff = fabs(g[p] - fd);
    ck_assert_msg(diff <= 1e-6 + 1e-4 * fabs(fd),
                  "case %d param %zu: analytic %g, double finite difference %g",
                  _i, p, g[p], fd);
    if (diff > worst)
      worst = diff;
  }
  fprintf(stderr, "mlp grad case %d: double fd, worst |g - fd| = %.2e\n", _i,
          worst);
  free(g);
  free(x);
  free(y);
  dw_mlp_free(m);
}
END_TEST

START_TEST(test_layout) {
  const int sizes[] = {5, 4, 3};
  struct dw_mlp *m;

  ck_assert_int_eq(dw_mlp_new(&m, sizes, 3, 8), 0);
  ck_assert_int_eq(m->nlayers, 2);
  ck_assert_uint_eq(m->nparams, 5 * 4 + 4 + 4 * 3 + 3);
  ck_assert_ptr_eq(m->w[0], m->params);
  ck_assert_ptr_eq(m->b[0], m->params + 20);
  ck_assert_ptr_eq(m->w[1], m->params + 24);
  ck_assert_ptr_eq(m->b[1], m->params + 36);
  ck_assert_ptr_eq(m->gw[0], m->grads);
  ck_assert_ptr_eq(m->gb[1], m->grads + 36);
  dw_mlp_free(m);
}
END_TEST

START_TEST(test_bad_args) {
  const int sizes[] = {5, 0, 3};
  int many[DW_MLP_MAX_LAYERS + 2];
  struct dw_mlp *m = (struct dw_mlp *)1;
  int i;

  for (i = 0; i < DW_MLP_MAX_LAYERS + 2; i++)
    many[i] = 2;
  ck_assert_int_eq(dw_mlp_new(&m, sizes, 3, 8), CM_EINVAL);
  ck_assert_ptr_null(m);
  ck_assert_int_eq(dw_mlp_new(&m, sizes, 1, 8), CM_EINVAL);
  ck_assert_int_eq(dw_mlp_new(&m, many, DW_MLP_MAX_LAYERS + 2, 8), CM_EINVAL);
  ck_assert_int_eq(dw_mlp_new(&m, many, DW_MLP_MAX_LAYERS + 1, 0), CM_EINVAL);
  ck_assert_int_eq(dw_mlp_new(&m, many, DW_MLP_MAX_LAYERS + 1, 2), 0);
  dw_mlp_free(m);
}
END_TEST

/* A batch larger than the buffers is refused with NaN, touching nothing. */
START_TEST(test_batch_too_big) {
  const int sizes[] = {2, 2};
  float x[6] = {0};
  uint8_t y[3] = {0};
  struct dw_mlp *m;
  int c = -1;

  ck_assert_int_eq(dw_mlp_new(&m, sizes, 2, 2), 0);
  ck_assert(isnan(dw_mlp_train_step(m, x, y, 3, &c)));
  ck_assert_int_eq(c, 0);
  dw_mlp_free(m);
}
END_TEST

START_TEST(test_init) {
  const int sizes[] = {30, 20, 10};
  struct dw_mlp *a, *b;
  float la = sqrtf(6.f / 50.f), lb = sqrtf(6.f / 30.f);
  double sum = 0.0;
  int i, differ = 0;

  ck_assert_int_eq(dw_mlp_new(&a, sizes, 3, 1), 0);
  ck_assert_int_eq(dw_mlp_new(&b, sizes, 3, 1), 0);
  dw_mlp_init(a, 42);
  dw_mlp_init(b, 42);
  ck_assert_int_eq(memcmp(a->params, b->params, a->nparams * sizeof *a->params),
                   0);
  for (i = 0; i < 600; i++) {
    ck_assert(fabsf(a->w[0][i]) <= la);
    sum += a->w[0][i];
  }
  ck_assert(fabs(sum / 600) < 0.1 * la); /* roughly centred */
  for (i = 0; i < 200; i++)
    ck_assert(fabsf(a->w[1][i]) <= lb);
  for (i = 0; i < 20; i++)
    ck_assert_float_eq(a->b[0][i], 0.0f);
  for (i = 0; i < 10; i++)
    ck_assert_float_eq(a->b[1][i], 0.0f);
  dw_mlp_init(b, 43);
  for (i = 0; i < 600; i++)
    differ += a->w[0][i] != b->w[0][i];
  ck_assert_int_gt(differ, 590);
  dw_mlp_free(a);
  dw_mlp_free(b);
}
END_TEST

/* Two classes in 4-D split by the sign of x0 + x1: a few dozen SGD steps on
 * a {4, 8, 2} net must drive the loss well down and classify all of them. */
START_TEST(test_loss_decreases) {
  const int sizes[] = {4, 8, 2};
  enum { N = 32 };
  float x[N * 4];
  uint8_t y[N];
  struct dw_mlp *m;
  uint64_t s = 99;
  float first, last = 0.0f;
  int i, step, correct = 0;

  for (i = 0; i < N; i++) {
    int k;

    for (k = 0; k < 4; k++)
      x[i * 4 + k] = test_rand(&s);
    /* push each point away from the boundary for a clear margin */
    if (x[i * 4] + x[i * 4 + 1] >= 0) {
      x[i * 4] += 0.5f;
      y[i] = 1;
    } else {
      x[i * 4] -= 0.5f;
      y[i] = 0;
    }
  }
  ck_assert_int_eq(dw_mlp_new(&m, sizes, 3, N), 0);
  dw_mlp_init(m, 5);
  first = dw_mlp_train_step(m, x, y, N, NULL);
  kn_sgd_update(m->params, m->grads, m->nparams, 0.5f);
  for (step = 1; step < 200; step++) {
    last = dw_mlp_train_step(m, x, y, N, NULL);
    kn_sgd_update(m->params, m->grads, m->nparams, 0.5f);
  }
  ck_assert_msg(last < 0.25f * first, "loss %g -> %g", first, last);
  ck_assert_int_eq(dw_mlp_evaluate(m, x, y, N, NULL), N);
  dw_mlp_train_step(m, x, y, N, &correct);
  ck_assert_int_eq(correct, N);
  dw_mlp_free(m);
}
END_TEST

/* A single 2 -> 2 layer set to the identity predicts argmax(x): five examples
 * in batches of 2 (the last one partial), three labelled right. */
START_TEST(test_evaluate) {
  const int sizes[] = {2, 2};
  const float x[] = {1, 0, 0, 1, 2, 0, 0, 3, 1, 0};
  const uint8_t y[] = {0, 1, 1, 0, 0};
  struct dw_mlp *m;
  double want = 0.0;
  float loss;
  int i;

  ck_assert_int_eq(dw_mlp_new(&m, sizes, 2, 2), 0);
  m->w[0][0] = 1;
  m->w[0][1] = 0;
  m->w[0][2] = 0;
  m->w[0][3] = 1;
  m->b[0][0] = 0;
  m->b[0][1] = 0;
  ck_assert_int_eq(dw_mlp_evaluate(m, x, y, 5, &loss), 3);
  for (i = 0; i < 5; i++) {
    double a = x[2 * i], b = x[2 * i + 1];
    double mx = fmax(a, b);

    want += log(exp(a - mx) + exp(b - mx)) + mx - (y[i] ? b : a);
  }
  ck_assert_double_eq_tol(loss, want / 5, 1e-5);
  ck_assert_int_eq(dw_mlp_evaluate(m, x, y, 0, &loss), 0);
  ck_assert_float_eq(loss, 0.0f);
  dw_mlp_free(m);
}
END_TEST

static Suite *mlp_suite(void) {
  Suite *s = suite_create("mlp");
  int ncases = (int)(sizeof grad_cases / sizeof grad_cases[0]);
  TCase *tc = tcase_create("mlp");

  tcase_add_test(tc, test_layout);
  tcase_add_test(tc, test_bad_args);
  tcase_add_test(tc, test_batch_too_big);
  tcase_add_test(tc, test_init);
  tcase_add_loop_test(tc, test_grad_fd_f32, 0, ncases);
  tcase_add_loop_test(tc, test_grad_fd_double, 0, ncases);
  tcase_add_test(tc, test_loss_decreases);
  tcase_add_test(tc, test_evaluate);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(mlp_suite(), 0); }
