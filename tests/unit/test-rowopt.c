/* The per-row optimizers (kernels/rowopt.h, through optstep.h) against a
 * double-precision transcription of each published formula, with the
 * hyper-parameters as configured (doubles, not rounded to float), over several
 * steps of random gradients from a random initial row. Each float weight and
 * state element stays within 2e-6 of the double one relative to the sum of the
 * magnitudes of the terms that made it (about 30 float roundings' worth:
 * float rounds every operation, and a cancellation cannot be more exact
 * than its terms). That bound is tight enough to refuse Adam's 1 - b
 * computed in float from a float b (1 - f32(0.999) is 1.3e-5 off), and
 * FTRL started from z = 0 under a non-zero weight.
 * FTRL's weight is exactly 0 while |z| <= l1, and a new row's z gives back
 * its initial weight; lazy Adam corrects its bias by the row's own step
 * count, and its first moments are the double constants rounded once. */
#include <check.h>
#include <math.h>
#include <string.h>

#include "optstep.h"
#include "rand.h"
#include "unit.h"

#define DIM 7
#define STEPS 5
#define TOL 2e-6

/* |a - b| within TOL of the magnitude m of what made b. */
static int close_to(float a, double b, double m) {
  return fabs(a - b) <= TOL * m;
}

static double rnd(uint64_t *st) {
  return (double)(cm_splitmix64(st) >> 11) * (1.0 / 9007199254740992.0) * 2 - 1;
}

/* The hyper-parameters the formula tests use. */
static const struct cm_rowopt HP = {.lr = 0.05,
                                    .eps = 1e-8,
                                    .initial_accumulator = 0.1,
                                    .beta1 = 0.9,
                                    .beta2 = 0.999,
                                    .l1 = 0.01,
                                    .l2 = 0.1,
                                    .ftrl_beta = 1.0};

/* Runs type for STEPS steps in float (rowopt) and in double (here): W, S
 * the double row and state, MW, MS the magnitudes they are made of. */
static void check_type(enum cm_rowopt_type type) {
  struct cm_rowopt o = HP;
  o.type = type;
  const double lr = o.lr, eps = o.eps, b1 = o.beta1, b2 = o.beta2, l1 = o.l1,
               l2 = o.l2, fb = o.ftrl_beta;
  float w[DIM], st[2 * DIM], g[DIM];
  double W[DIM], S[2 * DIM], MW[DIM], MS[2 * DIM];
  uint32_t t = 0;
  uint64_t seed = 42 + type;
  for (int i = 0; i < DIM; i++) {
    W[i] = w[i] = (float)(0.1 * rnd(&seed));
    MW[i] = fabs(W[i]);
  }
  cm_rowopt_init_state(&o, DIM, w, st);
  for (int i = 0; i < 2 * DIM; i++)
    S[i] = MS[i] = 0;
  switch (type) {
  case CM_ROWOPT_ADAGRAD:
  case CM_ROWOPT_ROWWISE_ADAGRAD:
    for (int i = 0; i < DIM; i++)
      S[i] = MS[i] = o.initial_accumulator;
    break;
  case CM_ROWOPT_FTRL:
    /* n0 = initial_accumulator; z0 such that the weight is the initial
     * one: -(z0 - sign(z0) l1) / d0 = w0. */
    for (int i = 0; i < DIM; i++) {
      double d0 = (fb + sqrt(o.initial_accumulator)) / lr + l2;
      S[DIM + i] = MS[DIM + i] = o.initial_accumulator;
      S[i] = W[i] == 0 ? 0 : -(W[i] * d0 + copysign(l1, W[i]));
      MS[i] = fabs(S[i]);
    }
    break;
  default:
    break;
  }
  for (uint32_t i = 0; i < cm_rowopt_nstate(type, DIM); i++)
    ck_assert_msg(close_to(st[i], S[i], MS[i]),
                  "%s initial state[%u]: %.9g vs %.9g", cm_rowopt_name(type), i,
                  st[i], S[i]);
  for (int k = 1; k <= STEPS; k++) {
    for (int i = 0; i < DIM; i++)
      g[i] = (float)rnd(&seed);
    cm_rowopt_apply(&o, DIM, w, st, &t, g);
    ck_assert_uint_eq(t, (uint32_t)k);
    double G, u, d;
    switch (type) {
    case CM_ROWOPT_SGD:
      for (int i = 0; i < DIM; i++) {
        u = lr * g[i];
        W[i] -= u;
        MW[i] += fabs(u);
      }
      break;
    case CM_ROWOPT_ADAGRAD:
      for (int i = 0; i < DIM; i++) {
        S[i] += (double)g[i] * g[i];
        MS[i] = S[i];
        u = lr * g[i] / (sqrt(S[i]) + eps);
        W[i] -= u;
        MW[i] += fabs(u);
      }
      break;
    case CM_ROWOPT_ROWWISE_ADAGRAD:
      G = 0;
      for (int i = 0; i < DIM; i++)
        G += (double)g[i] * g[i];
      S[0] += G / DIM;
      MS[0] = S[0];
      for (int i = 0; i < DIM; i++) {
        u = lr * g[i] / (sqrt(S[0]) + eps);
        W[i] -= u;
        MW[i] += fabs(u);
      }
      break;
    case CM_ROWOPT_ADAM:
      for (int i = 0; i < DIM; i++) {
        S[i] = b1 * S[i] + (1 - b1) * g[i];
        MS[i] = b1 * MS[i] + (1 - b1) * fabs(g[i]);
        S[DIM + i] = b2 * S[DIM + i] + (1 - b2) * (double)g[i] * g[i];
        MS[DIM + i] = S[DIM + i];
        double mh = S[i] / (1 - pow(b1, k)), vh = S[DIM + i] / (1 - pow(b2, k));
        u = lr * mh / (sqrt(vh) + eps);
        W[i] -= u;
        MW[i] += fabs(u);
      }
      break;
    case CM_ROWOPT_FTRL:
      for (int i = 0; i < DIM; i++) {
        double n1 = S[DIM + i] + (double)g[i] * g[i];
        double sigma = (sqrt(n1) - sqrt(S[DIM + i])) / lr;
        S[i] += g[i] - sigma * W[i];
        MS[i] += fabs(g[i]) + fabs(sigma * W[i]);
        S[DIM + i] = MS[DIM + i] = n1;
        d = (fb + sqrt(n1)) / lr + l2;
        W[i] = fabs(S[i]) <= l1 ? 0 : -(S[i] - copysign(l1, S[i])) / d;
        MW[i] = (MS[i] + l1) / d;
      }
      break;
    default:
      break;
    }
    for (int i = 0; i < DIM; i++)
      ck_assert_msg(close_to(w[i], W[i], MW[i]),
                    "%s step %d w[%d]: %.9g vs %.9g", cm_rowopt_name(type), k,
                    i, w[i], W[i]);
    for (uint32_t i = 0; i < cm_rowopt_nstate(type, DIM); i++)
      ck_assert_msg(close_to(st[i], S[i], MS[i]),
                    "%s step %d state[%u]: %.9g vs %.9g (relative %.3g)",
                    cm_rowopt_name(type), k, i, st[i], S[i],
                    fabs(st[i] - S[i]) / MS[i]);
  }
}

START_TEST(each_formula) { check_type((enum cm_rowopt_type)_i); }
END_TEST

START_TEST(adam_constants_rounded_once_from_double) {
  /* One step of g = 1 from m = v = 0: m = f32(1 - 0.9), v = f32(1 -
   * 0.999), each the double rounded once (1 - f32(0.999) = 0.00099998713). */
  struct cm_rowopt o = HP;
  o.type = CM_ROWOPT_ADAM;
  float w[DIM] = {0}, st[2 * DIM], g[DIM];
  uint32_t t = 0;
  cm_rowopt_init_state(&o, DIM, w, st);
  for (int i = 0; i < DIM; i++)
    g[i] = 1.0f;
  cm_rowopt_apply(&o, DIM, w, st, &t, g);
  for (int i = 0; i < DIM; i++) {
    ck_assert_msg(st[i] == (float)(1.0 - 0.9), "m %.9g", st[i]);
    ck_assert_msg(st[DIM + i] == (float)(1.0 - 0.999), "v %.9g", st[DIM + i]);
  }
}
END_TEST

START_TEST(ftrl_new_row_keeps_its_initial_weight) {
  /* z0 from w0 and n0: the FTRL weight of (z0, n0) is w0 (to a few
   * roundings); w0 = 0 gives McMahan's start z = 0. */
  struct cm_rowopt o = HP;
  o.type = CM_ROWOPT_FTRL;
  float w[DIM] = {0.01f, -0.01f, 0.0f, 1e-7f, -0.5f, 3.0f, -0.0f}, st[2 * DIM];
  cm_rowopt_init_state(&o, DIM, w, st);
  float d = (1.0f + sqrtf(0.1f)) / 0.05f + 0.1f;
  for (int i = 0; i < DIM; i++) {
    ck_assert(st[DIM + i] == (float)0.1); /* n0 = initial_accumulator */
    float z = st[i];
    if (w[i] == 0.0f) {
      ck_assert(z == 0.0f);
      continue;
    }
    ck_assert(fabsf(z) > 0.01f);
    float back = -(z - copysignf(0.01f, z)) / d;
    ck_assert_msg(fabsf(back - w[i]) <= 4e-7f * fabsf(w[i]) + 1e-9f,
                  "w0 %.9g gives z %.9g, whose weight is %.9g", w[i], z, back);
  }
}
END_TEST

START_TEST(ftrl_zero_inside_l1) {
  struct cm_rowopt o = {
      .type = CM_ROWOPT_FTRL, .lr = 0.1, .l1 = 10.0, .ftrl_beta = 1.0};
  float w[DIM] = {0}, st[2 * DIM], g[DIM];
  uint32_t t = 0;
  cm_rowopt_init_state(&o, DIM, w, st);
  for (int i = 0; i < DIM; i++)
    g[i] = 0.5f * (float)(i + 1);
  cm_rowopt_apply(&o, DIM, w, st, &t, g);
  for (int i = 0; i < DIM; i++)
    ck_assert(w[i] == 0.0f); /* |z| = |g| <= l1 */
  for (int i = 0; i < DIM; i++)
    g[i] = 100.0f;
  cm_rowopt_apply(&o, DIM, w, st, &t, g);
  for (int i = 0; i < DIM; i++)
    ck_assert(w[i] < 0.0f); /* past l1 the weight moves against z */
}
END_TEST

START_TEST(adam_bias_by_the_rows_own_step) {
  /* A row's first update moves each weight by about lr, however many
   * other updates the table saw: t is the row's. */
  struct cm_rowopt o = {.type = CM_ROWOPT_ADAM,
                        .lr = 0.01,
                        .eps = 1e-8,
                        .beta1 = 0.9,
                        .beta2 = 0.999};
  float w[DIM] = {0}, st[2 * DIM], g[DIM];
  uint32_t t = 0;
  cm_rowopt_init_state(&o, DIM, w, st);
  for (int i = 0; i < DIM; i++)
    g[i] = (float)(i + 1);
  cm_rowopt_apply(&o, DIM, w, st, &t, g);
  for (int i = 0; i < DIM; i++)
    ck_assert(fabsf(w[i] + 0.01f) < 1e-6f);
}
END_TEST

static Suite *rowopt_suite(void) {
  Suite *s = suite_create("rowopt");
  TCase *tc = tcase_create("formulas");
  tcase_add_loop_test(tc, each_formula, 0, CM_ROWOPT_NTYPES);
  tcase_add_test(tc, adam_constants_rounded_once_from_double);
  tcase_add_test(tc, ftrl_new_row_keeps_its_initial_weight);
  tcase_add_test(tc, ftrl_zero_inside_l1);
  tcase_add_test(tc, adam_bias_by_the_rows_own_step);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(rowopt_suite(), 0); }
