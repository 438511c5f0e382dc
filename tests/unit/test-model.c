/* Unit tests for worker/model/model.c and worker/model/cnn.c: the variables
 * each model declares (names, shapes, the layout of the flat buffers), the
 * CNN's gradient against central differences of its own loss, that training the
 * CNN lowers its loss, and that R replicas give the gradient, loss and
 * counts of one replica on the same (concatenated) batch.
 *
 * Tolerances:
 *  - CNN finite differences: f32 loss, eps = 3e-4, so each difference
 *    carries about 3e-7 / 3e-4 = 1e-3 of rounding noise; we accept
 *    |g - fd| <= 1.5e-3 + 5e-2 |fd| on 8 entries of every variable, fd the
 *    central difference or either one-sided one: with thousands of ReLU and
 *    pooling kinks in a batch, one often lies within eps of the point, and
 *    there the gradient is the slope on one side (conv0/kernel[76] of these
 *    seeds: left slope -0.0457, right -0.0637, backward -0.0463). The
 *    checked gradients must not all be ~0.
 *  - replicas: the same float operations on parts of the batch, summed in a
 *    different order: |g_R - g_1| <= 1e-4 (|g_1| + 1e-3), loss within 1e-6
 *    relative, correct counts equal. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blas.h"
#include "cnn.h"
#include "err.h"
#include "model.h"
#include "unit.h"

/* The test's own generator: uniform in [-1, 1). */
static float test_rand(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return (float)(*s >> 40) / 16777216.0f * 2.0f - 1.0f;
}

/* A job of the given model with small layers. */
static struct cm_job job_of(const char *model) {
  struct cm_job j;

  memset(&j, 0, sizeof j);
  snprintf(j.model, sizeof j.model, "%s", model);
  j.hidden[0] = 12;
  j.hidden[1] = 7;
  j.nhidden = 2;
  j.channels[0] = 4;
  j.channels[1] = 6;
  return j;
}

/* n random examples of dim pixels in [0, 1) and labels < 10. */
static void batch(float *x, uint8_t *y, int n, int dim, uint64_t seed) {
  for (int i = 0; i < n * dim; i++)
    x[i] = 0.5f + 0.5f * test_rand(&seed);
  for (int i = 0; i < n; i++)
    y[i] = (uint8_t)((unsigned)(test_rand(&seed) * 5.0f + 5.0f) % 10);
}

static struct dw_model *model_new(const char *kind, int max_batch, int R) {
  struct cm_job j = job_of(kind);
  struct dw_model *m = NULL;
  char err[256] = "";

  ck_assert_msg(
      dw_model_new(&m, &j, 784, 10, max_batch, R, -1, err, sizeof err) == 0,
      "%s", err);
  return m;
}

START_TEST(test_vars) {
  struct dw_model *m = model_new("softmax", 8, 1);
  size_t total = 0;

  ck_assert_int_eq(m->nvars, 2);
  ck_assert_str_eq(m->vars[0].name, "dense0/kernel");
  ck_assert_int_eq(m->vars[0].shape[0], 10);
  ck_assert_int_eq(m->vars[0].shape[1], 784);
  ck_assert_str_eq(m->vars[1].name, "dense0/bias");
  ck_assert_uint_eq(m->nparams, 7850);
  dw_model_free(m);

  m = model_new("cnn", 8, 1);
  /* 28 -> conv (padded) 28 -> pool 14 -> conv 10 -> pool 5: 6 * 25 head
   * inputs. */
  static const char *const names[] = {
      "conv0/kernel",  "conv0/bias",  "conv1/kernel",  "conv1/bias",
      "dense0/kernel", "dense0/bias", "dense1/kernel", "dense1/bias"};
  static const size_t counts[] = {4 * 25,   4,  6 * 4 * 25, 6,
                                  64 * 150, 64, 10 * 64,    10};
  ck_assert_int_eq(m->nvars, 8);
  for (int i = 0; i < 8; i++) {
    ck_assert_str_eq(m->vars[i].name, names[i]);
    ck_assert_uint_eq(m->vars[i].count, counts[i]);
    ck_assert_ptr_eq(m->vars[i].value, m->params + total);
    ck_assert_ptr_eq(m->vars[i].grad, m->grads + total);
    ck_assert(i % 2 ? m->vars[i].scale == 0.0f : m->vars[i].scale > 0.0f);
    total += counts[i];
  }
  ck_assert_int_eq(m->vars[2].ndim, 4);
  ck_assert_int_eq(m->vars[2].shape[1], 4);
  ck_assert_uint_eq(m->nparams, total);
  dw_model_free(m);
}
END_TEST

/* The CNN's default size on 28x28 images: 1 -> 16 -> 32 channels. */
START_TEST(test_cnn_default_size) {
  struct dw_cnn *c = NULL;

  ck_assert_int_eq(dw_cnn_new(&c, 28, 28, 16, 32, 10, 4), 0);
  ck_assert_int_eq(c->flat, 800);
  ck_assert_uint_eq(c->nparams, 65162);
  ck_assert_uint_eq(c->nparams, 16 * 25 + 16 + 32 * 16 * 25 + 32 + 800 * 64 +
                                    64 + 64 * 10 + 10);
  dw_cnn_free(c);
  /* Too small for two conv + pool blocks. */
  ck_assert_int_eq(dw_cnn_new(&c, 9, 9, 4, 4, 10, 4), CM_EINVAL);
  ck_assert_ptr_null(c);
}
END_TEST

START_TEST(test_cnn_finite_diff) {
  enum { B = 4, DIM = 784 };
  struct dw_model *m = model_new("cnn", B, 1);
  float x[B * DIM], *g = malloc(m->nparams * sizeof *g);
  uint8_t y[B];
  const float eps = 3e-4f;
  float biggest = 0.0f;

  batch(x, y, B, DIM, 7);
  dw_model_init(m, 3);
  dw_model_train_step(m, x, y, B, NULL);
  memcpy(g, m->grads, m->nparams * sizeof *g);
  for (int v = 0; v < m->nvars; v++) {
    struct dw_model_var *var = &m->vars[v];
    for (int k = 0; k < 8; k++) {
      size_t i = (size_t)k * 7919 % var->count;
      size_t at = (size_t)(var->value - m->params) + i;
      float keep = m->params[at], l0, lp, lm;
      double fd[3];
      int ok = 0;

      l0 = dw_model_train_step(m, x, y, B, NULL);
      m->params[at] = keep + eps;
      lp = dw_model_train_step(m, x, y, B, NULL);
      m->params[at] = keep - eps;
      lm = dw_model_train_step(m, x, y, B, NULL);
      m->params[at] = keep;
      fd[0] = ((double)lp - lm) / (2.0 * eps);
      fd[1] = ((double)lp - l0) / eps;
      fd[2] = ((double)l0 - lm) / eps;
      for (int d = 0; d < 3; d++)
        ok |= fabs(g[at] - fd[d]) <= 1.5e-3 + 5e-2 * fabs(fd[d]);
      ck_assert_msg(ok, "%s[%zu]: backward %g; central %g, right %g, left %g",
                    var->name, i, g[at], fd[0], fd[1], fd[2]);
      biggest = fmaxf(biggest, fabsf(g[at]));
    }
  }
  ck_assert_msg(biggest > 1e-2f, "checked gradients all tiny (%g)", biggest);
  free(g);
  dw_model_free(m);
}
END_TEST

START_TEST(test_cnn_learns) {
  enum { B = 16, DIM = 784 };
  struct dw_model *m = model_new("cnn", B, 1);
  float x[B * DIM], first = 0.0f, last = 0.0f;
  uint8_t y[B];

  batch(x, y, B, DIM, 11);
  dw_model_init(m, 5);
  for (int step = 0; step < 60; step++) {
    float l = dw_model_train_step(m, x, y, B, NULL);
    if (step == 0)
      first = l;
    last = l;
    for (size_t k = 0; k < m->nparams; k++)
      m->params[k] -= 0.05f * m->grads[k];
  }
  dw_model_free(m);
  /* Memorising 16 examples: the loss must fall well below its start. */
  ck_assert_msg(last < 0.5f * first, "loss %g -> %g", first, last);
}
END_TEST

/* Replica counts and batch sizes: even split, uneven split, more replicas
 * than examples (some sit the step out). */
static const int splits[][2] = {{2, 64}, {2, 37}, {3, 20}, {4, 2}};

START_TEST(test_replicas_same_gradient) {
  static const char *const kinds[] = {"softmax", "mlp", "cnn"};
  int R = splits[_i][0], B = splits[_i][1];

  for (int k = 0; k < 3; k++) {
    struct dw_model *one = model_new(kinds[k], 64, 1);
    struct dw_model *many = model_new(kinds[k], 64, R);
    float *x = malloc((size_t)B * 784 * sizeof *x);
    uint8_t *y = malloc(B);
    int c1 = -1, cR = -2;
    float l1, lR;
    size_t i = 0;

    ck_assert_int_eq(many->replicas, R);
    ck_assert_uint_eq(many->nparams, one->nparams);
    batch(x, y, B, 784, 13 + k);
    dw_model_init(one, 9);
    dw_model_init(many, 9);
    ck_assert(memcmp(one->params, many->params,
                     one->nparams * sizeof *one->params) == 0);
    l1 = dw_model_train_step(one, x, y, B, &c1);
    lR = dw_model_train_step(many, x, y, B, &cR);
    ck_assert_msg(fabsf(l1 - lR) <= 1e-6f * fabsf(l1), "%s: loss %g vs %g",
                  kinds[k], l1, lR);
    ck_assert_int_eq(c1, cR);
    while (i < one->nparams && fabsf(one->grads[i] - many->grads[i]) <=
                                   1e-4f * (fabsf(one->grads[i]) + 1e-3f))
      i++;
    ck_assert_msg(i == one->nparams, "%s R=%d B=%d grad[%zu]: %g vs %g",
                  kinds[k], R, B, i, i < one->nparams ? one->grads[i] : 0.0,
                  i < one->nparams ? many->grads[i] : 0.0);
    /* The gradient is not trivially zero. */
    i = 0;
    while (i < one->nparams && one->grads[i] == 0.0f)
      i++;
    ck_assert(i < one->nparams);
    free(x), free(y);
    dw_model_free(one), dw_model_free(many);
  }
}
END_TEST

START_TEST(test_bad_settings) {
  struct cm_job j = job_of("cnn");
  struct dw_model *m = NULL;
  char err[256] = "";

  ck_assert_int_eq(dw_model_new(&m, &j, 783, 10, 8, 1, -1, err, sizeof err),
                   CM_EINVAL);
  ck_assert_ptr_null(m);
  ck_assert_str_eq(err, "the cnn needs square images; these have 783 pixels");
  ck_assert_int_eq(dw_model_new(&m, &j, 784, 10, 8, 0, -1, err, sizeof err),
                   CM_EINVAL);
  ck_assert_ptr_null(m);
}
END_TEST

static Suite *model_suite(void) {
  Suite *s = suite_create("model");
  TCase *tc = tcase_create("model");

  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_vars);
  tcase_add_test(tc, test_cnn_default_size);
  tcase_add_test(tc, test_cnn_finite_diff);
  tcase_add_test(tc, test_cnn_learns);
  tcase_add_loop_test(tc, test_replicas_same_gradient, 0,
                      sizeof splits / sizeof splits[0]);
  tcase_add_test(tc, test_bad_settings);
  suite_add_tcase(s, tc);
  return s;
}

int main(int argc, char **argv) {
  (void)argc;
  /* As in dworker: one OpenBLAS thread, so replicas do not contend. */
  kn_blas_init(argv, 1);
  return tu_run(model_suite(), 0);
}
