/* The per-row optimizers (rowopt.h) against a double-precision
 * transcription of each published formula (with the hyper-parameters
 * rounded to float, as the rows use them), over several steps of random
 * gradients: each float weight and state stays within 2e-6 of the double
 * one relative to its size plus one learning rate (float rounds every
 * operation; the update's own size bounds what a cancellation against the
 * weight can magnify).
 * FTRL's weight is exactly 0 while |z| <= l1; lazy Adam corrects its bias
 * by the row's own step count. */
#include <check.h>
#include <math.h>
#include <string.h>

#include "rand.h"
#include "rowopt.h"
#include "unit.h"

#define DIM 7
#define STEPS 5

/* |a - b| within 2e-6 of |b| + scale. */
static int close_to(float a, double b, double scale) {
  return fabs(a - b) <= 2e-6 * (fabs(b) + scale);
}

static double rnd(uint64_t *st) {
  return (double)(cm_splitmix64(st) >> 11) * (1.0 / 9007199254740992.0) * 2 - 1;
}

/* Runs type for STEPS steps in float (rowopt) and in double (here). */
static void check_type(enum cm_rowopt_type type) {
  struct cm_rowopt o = {.type = type,
                        .lr = 0.05,
                        .eps = 1e-8,
                        .initial_accumulator = 0.1,
                        .beta1 = 0.9,
                        .beta2 = 0.999,
                        .l1 = 0.01,
                        .l2 = 0.1,
                        .ftrl_beta = 1.0};
  float w[DIM], st[2 * DIM], g[DIM];
  double W[DIM], S[2 * DIM];
  uint32_t t = 0;
  uint64_t seed = 42 + type;
  for (int i = 0; i < DIM; i++)
    W[i] = w[i] = (float)rnd(&seed);
  cm_rowopt_init_state(&o, DIM, st);
  for (uint32_t i = 0; i < cm_rowopt_nstate(type, DIM); i++)
    S[i] = st[i];
  for (int k = 1; k <= STEPS; k++) {
    for (int i = 0; i < DIM; i++)
      g[i] = (float)rnd(&seed);
    cm_rowopt_apply(&o, DIM, w, st, &t, g);
    ck_assert_uint_eq(t, (uint32_t)k);
    double G, a;
    switch (type) {
    case CM_ROWOPT_SGD:
      for (int i = 0; i < DIM; i++)
        W[i] -= (float)o.lr * (double)g[i];
      break;
    case CM_ROWOPT_ADAGRAD:
      for (int i = 0; i < DIM; i++) {
        S[i] += (double)g[i] * g[i];
        W[i] -= (float)o.lr * g[i] / (sqrt(S[i]) + (float)o.eps);
      }
      break;
    case CM_ROWOPT_ROWWISE_ADAGRAD:
      G = 0;
      for (int i = 0; i < DIM; i++)
        G += (double)g[i] * g[i];
      S[0] += G / DIM;
      for (int i = 0; i < DIM; i++)
        W[i] -= (float)o.lr * g[i] / (sqrt(S[0]) + (float)o.eps);
      break;
    case CM_ROWOPT_ADAM:
      for (int i = 0; i < DIM; i++) {
        double b1 = (float)o.beta1, b2 = (float)o.beta2;
        S[i] = b1 * S[i] + (1 - b1) * g[i];
        S[DIM + i] = b2 * S[DIM + i] + (1 - b2) * (double)g[i] * g[i];
        double mh = S[i] / (1 - pow(0.9, k)),
               vh = S[DIM + i] / (1 - pow(0.999, k));
        W[i] -= (float)o.lr * mh / (sqrt(vh) + (float)o.eps);
      }
      break;
    case CM_ROWOPT_FTRL:
      for (int i = 0; i < DIM; i++) {
        double n1 = S[DIM + i] + (double)g[i] * g[i];
        double sigma = (sqrt(n1) - sqrt(S[DIM + i])) / (float)o.lr;
        S[i] += g[i] - sigma * W[i];
        S[DIM + i] = n1;
        a = fabs(S[i]);
        W[i] = a <= (float)o.l1
                   ? 0
                   : -(S[i] - copysign((float)o.l1, S[i])) /
                         ((1.0 + sqrt(n1)) / (float)o.lr + (float)o.l2);
      }
      break;
    default:
      break;
    }
    for (int i = 0; i < DIM; i++)
      ck_assert_msg(close_to(w[i], W[i], o.lr),
                    "%s step %d w[%d]: %.9g vs %.9g", cm_rowopt_name(type), k,
                    i, w[i], W[i]);
    for (uint32_t i = 0; i < cm_rowopt_nstate(type, DIM); i++)
      ck_assert_msg(close_to(st[i], S[i], o.lr),
                    "%s step %d state[%u]: %.9g vs %.9g", cm_rowopt_name(type),
                    k, i, st[i], S[i]);
  }
}

START_TEST(each_formula) { check_type((enum cm_rowopt_type)_i); }
END_TEST

START_TEST(ftrl_zero_inside_l1) {
  struct cm_rowopt o = {
      .type = CM_ROWOPT_FTRL, .lr = 0.1, .l1 = 10.0, .ftrl_beta = 1.0};
  float w[DIM] = {0}, st[2 * DIM], g[DIM];
  uint32_t t = 0;
  cm_rowopt_init_state(&o, DIM, st);
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
  cm_rowopt_init_state(&o, DIM, st);
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
  tcase_add_test(tc, ftrl_zero_inside_l1);
  tcase_add_test(tc, adam_bias_by_the_rows_own_step);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(rowopt_suite(), 0); }
