/* Unit tests of the optimizer updates (kernels/optim.h) and schedules
 * (common/spec/optconf.h):
 *   - each update against a plain scalar loop that does the same float
 *     operations in the same order, at n = 0, 1, 7, 8 and 1,000,003, with and
 *     without weight decay, three steps: bit for bit (the vectorized kernels
 *     must not change a result);
 *   - each update against the published formula, in double, for three steps
 *     of one weight by hand (PyTorch's torch.optim conventions: Nesterov as
 *     SGD(nesterov=True), v = mu v + g, w -= lr (g + mu v); Adam as Kingma &
 *     Ba's Algorithm 1 with L2 added to g; AdamW with decoupled decay,
 *     w -= lr wd w before the step): within 1e-6 relative, plus values
 *     worked out on paper;
 *   - the schedules at chosen steps, warm-up composed with each;
 *   - clipping by global norm, and the sum of squares it uses;
 *   - cm_optim_apply: the spec's optimizer at update k is the kernel with
 *     lr from the schedule at k and t = k + 1. */
#include "frand.h"
#include "optconf.h"
#include "optim.h"
#include "optstep.h"
#include "unit.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const size_t sizes[] = {0, 1, 7, 8, 1000003};

static float *copyv(const float *x, size_t n) {
  float *v = malloc((n ? n : 1) * sizeof *v);

  ck_assert_ptr_nonnull(v);
  memcpy(v, x, n * sizeof *v);
  return v;
}

/* Asserts a and b hold the same bits; one ck_assert for the lot. */
static void same_bits(const float *a, const float *b, size_t n,
                      const char *what) {
  size_t i = 0;

  while (i < n && memcmp(&a[i], &b[i], sizeof *a) == 0)
    i++;
  ck_assert_msg(i == n, "%s[%zu]: kernel %.9g, reference %.9g", what, i,
                i < n ? a[i] : 0.0, i < n ? b[i] : 0.0);
}

enum kind { SGD, MOMENTUM, NESTEROV, ADAGRAD, ADAM, ADAMW, NKINDS };
static const char *const kind_names[NKINDS] = {
    "sgd", "momentum", "nesterov", "adagrad", "adam", "adamw"};

/* The reference loops: plain scalar code, the operations of optim.h in
 * its order, no restrict. */
static void ref_step(enum kind k, float *w, float *s0, float *s1,
                     const float *g, size_t n, const struct kn_optim_hp *hp) {
  struct kn_adam_consts c;
  float lr = hp->lr, mu = hp->momentum, wd = hp->weight_decay;

  kn_adam_consts(&c, hp, k == ADAMW);
  for (size_t i = 0; i < n; i++) {
    float wi = w[i], gi = g[i];
    if (k == ADAMW)
      wi = wi * c.decay;
    else if (wd != 0.0f)
      gi = gi + wd * wi;
    switch (k) {
    case SGD:
      w[i] = wi - lr * gi;
      break;
    case MOMENTUM:
      s0[i] = mu * s0[i] + gi;
      w[i] = wi - lr * s0[i];
      break;
    case NESTEROV:
      s0[i] = mu * s0[i] + gi;
      w[i] = wi - lr * (gi + mu * s0[i]);
      break;
    case ADAGRAD:
      s0[i] = s0[i] + gi * gi;
      w[i] = wi - lr * (gi / (sqrtf(s0[i]) + hp->eps));
      break;
    default:
      s0[i] = c.b1 * s0[i] + c.omb1 * gi;
      s1[i] = c.b2 * s1[i] + c.omb2 * (gi * gi);
      w[i] = wi - c.step * (s0[i] / (sqrtf(s1[i]) * c.rbc2 + hp->eps));
      break;
    }
  }
}

static void kernel_step(enum kind k, float *w, float *s0, float *s1,
                        const float *g, size_t n,
                        const struct kn_optim_hp *hp) {
  switch (k) {
  case SGD:
    kn_sgd_step(w, g, n, hp);
    break;
  case MOMENTUM:
    kn_momentum_step(w, s0, g, n, hp);
    break;
  case NESTEROV:
    kn_nesterov_step(w, s0, g, n, hp);
    break;
  case ADAGRAD:
    kn_adagrad_step(w, s0, g, n, hp);
    break;
  case ADAM:
    kn_adam_step(w, s0, s1, g, n, hp);
    break;
  default:
    kn_adamw_step(w, s0, s1, g, n, hp);
    break;
  }
}

/* _i = kind * 2 * nsizes + decay * nsizes + size index. */
START_TEST(test_kernel_vs_loop) {
  int nsizes = sizeof sizes / sizeof sizes[0];
  enum kind k = (enum kind)(_i / (2 * nsizes));
  int decay = (_i / nsizes) % 2;
  size_t n = sizes[_i % nsizes];
  float *w = tu_frandv(n, 1, 0),
        *s0 = tu_frandv(n, 2, k != MOMENTUM && k != NESTEROV),
        *s1 = tu_frandv(n, 3, 1), *g = tu_frandv(n, 4, 0);
  float *rw = copyv(w, n), *rs0 = copyv(s0, n), *rs1 = copyv(s1, n);
  struct kn_optim_hp hp = {.lr = 0.01f,
                           .momentum = 0.9f,
                           .beta1 = 0.9,
                           .beta2 = 0.999,
                           .eps = 1e-8f,
                           .weight_decay = decay ? 0.05f : 0.0f};
  char what[64];

  for (hp.t = 1; hp.t <= 3; hp.t++) {
    kernel_step(k, w, s0, s1, g, n, &hp);
    ref_step(k, rw, rs0, rs1, g, n, &hp);
  }
  snprintf(what, sizeof what, "%s wd=%g n=%zu: w", kind_names[k],
           (double)hp.weight_decay, n);
  same_bits(w, rw, n, what);
  what[strlen(what) - 1] = 's';
  same_bits(s0, rs0, n, what);
  same_bits(s1, rs1, n, what);
  free(w), free(s0), free(s1), free(g), free(rw), free(rs0), free(rs1);
}
END_TEST

/* The published formulas in double, one weight, three gradients. */
struct textbook {
  double w, s0, s1; /* weight and slots after the step */
};

static void textbook(enum kind k, double lr, double wd, const double *g,
                     struct textbook *out) {
  double w = 1.0, s0 = 0.0, s1 = 0.0;
  const double mu = 0.9, b1 = 0.9, b2 = 0.999, eps = 1e-8;

  for (int t = 1; t <= 3; t++) {
    double gi = g[t - 1];
    if (k == ADAMW)
      w -= lr * wd * w; /* Loshchilov & Hutter: decoupled */
    else
      gi += wd * w; /* L2 in the gradient */
    switch (k) {
    case SGD:
      w -= lr * gi;
      break;
    case MOMENTUM:
      s0 = mu * s0 + gi;
      w -= lr * s0;
      break;
    case NESTEROV:
      s0 = mu * s0 + gi;
      w -= lr * (gi + mu * s0);
      break;
    case ADAGRAD:
      s0 += gi * gi;
      w -= lr * gi / (sqrt(s0) + eps);
      break;
    default: {
      s0 = b1 * s0 + (1 - b1) * gi;
      s1 = b2 * s1 + (1 - b2) * gi * gi;
      double mh = s0 / (1 - pow(b1, t)), vh = s1 / (1 - pow(b2, t));
      w -= lr * mh / (sqrt(vh) + eps);
      break;
    }
    }
    out[t - 1] = (struct textbook){w, s0, s1};
  }
}

static void close_to(double got, double want, const char *what, int step) {
  ck_assert_msg(fabs(got - want) <= 1e-6 * (fabs(want) + 1e-3),
                "%s step %d: got %.9g, want %.9g", what, step, got, want);
}

/* _i = kind * 2 + decay */
START_TEST(test_kernel_vs_formula) {
  enum kind k = (enum kind)(_i / 2);
  double wd = _i % 2 ? 0.1 : 0.0;
  static const double g[3] = {0.5, -0.3, 0.2};
  struct textbook want[3];
  struct kn_optim_hp hp = {.lr = 0.1f,
                           .momentum = 0.9f,
                           .beta1 = 0.9,
                           .beta2 = 0.999,
                           .eps = 1e-8f,
                           .weight_decay = (float)wd};
  float w = 1.0f, s0 = 0.0f, s1 = 0.0f;
  char what[64];

  textbook(k, 0.1, wd, g, want);
  snprintf(what, sizeof what, "%s wd=%g", kind_names[k], wd);
  for (hp.t = 1; hp.t <= 3; hp.t++) {
    float gf = (float)g[hp.t - 1];
    kernel_step(k, &w, &s0, &s1, &gf, 1, &hp);
    close_to(w, want[hp.t - 1].w, what, (int)hp.t);
    close_to(s0, want[hp.t - 1].s0, what, (int)hp.t);
    close_to(s1, want[hp.t - 1].s1, what, (int)hp.t);
  }
}
END_TEST

/* Three steps worked out on paper (lr 0.1, g = 0.5, -0.3, 0.2, w0 = 1). */
START_TEST(test_by_hand) {
  static const float g[3] = {0.5f, -0.3f, 0.2f};
  struct kn_optim_hp hp = {
      .lr = 0.1f, .momentum = 0.9f, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8f};
  float w = 1.0f, v = 0.0f, m = 0.0f, s = 0.0f;

  /* Nesterov: v = 0.5, w = 1 - 0.1 (0.5 + 0.45) = 0.905; v = 0.15,
   * w = 0.905 - 0.1 (-0.3 + 0.135) = 0.9215; v = 0.335,
   * w = 0.9215 - 0.1 (0.2 + 0.3015) = 0.87135. */
  static const float nag[3] = {0.905f, 0.9215f, 0.87135f};
  for (int t = 0; t < 3; t++) {
    kn_nesterov_step(&w, &v, &g[t], 1, &hp);
    ck_assert_float_eq_tol(w, nag[t], 1e-6f);
  }
  /* Adam: step 1 moves by lr exactly (m^ / sqrt(v^) = sign g): 0.9. Step
   * 2: m = 0.015, v = 3.3975e-4, m^ = 0.015 / 0.19, v^ = 3.3975e-4 /
   * 0.001999, w = 0.9 - 0.1 * 0.0789474 / 0.412262 = 0.8808502. Step 3:
   * m = 0.0335, v = 3.7941e-4, w = 0.8461074. */
  static const float adam[3] = {0.9f, 0.8808502f, 0.8461074f};
  w = 1.0f;
  for (hp.t = 1; hp.t <= 3; hp.t++) {
    kn_adam_step(&w, &m, &s, &g[hp.t - 1], 1, &hp);
    ck_assert_float_eq_tol(w, adam[hp.t - 1], 2e-6f);
  }
  /* AdamW, wd 0.1: each step first w *= 1 - 0.01; step 1: 0.99 - 0.1. */
  hp.weight_decay = 0.1f;
  w = 1.0f, m = s = 0.0f;
  hp.t = 1;
  kn_adamw_step(&w, &m, &s, &g[0], 1, &hp);
  ck_assert_float_eq_tol(w, 0.89f, 1e-6f);
  /* SGD, wd 0.1 (L2): w = 1 - 0.1 (0.5 + 0.1) = 0.94. */
  w = 1.0f;
  kn_sgd_step(&w, &g[0], 1, &hp);
  ck_assert_float_eq_tol(w, 0.94f, 1e-6f);
}
END_TEST

static double lr_at(enum cm_sched_type type, uint64_t warmup, uint64_t k) {
  struct cm_schedule s = {.type = type,
                          .warmup_steps = warmup,
                          .decay_every = 10,
                          .gamma = 0.5,
                          .total_steps = 100 + warmup,
                          .min_lr = 0.1};
  return cm_schedule_lr(&s, 1.0, k);
}

START_TEST(test_schedules) {
  /* constant */
  ck_assert_double_eq(lr_at(CM_SCHED_CONSTANT, 0, 0), 1.0);
  ck_assert_double_eq(lr_at(CM_SCHED_CONSTANT, 0, 123456), 1.0);
  /* step: gamma^floor(k / 10) */
  ck_assert_double_eq(lr_at(CM_SCHED_STEP, 0, 0), 1.0);
  ck_assert_double_eq(lr_at(CM_SCHED_STEP, 0, 9), 1.0);
  ck_assert_double_eq(lr_at(CM_SCHED_STEP, 0, 10), 0.5);
  ck_assert_double_eq(lr_at(CM_SCHED_STEP, 0, 25), 0.25);
  /* cosine from 1 to 0.1 over 100 steps: the middle is 0.55 */
  ck_assert_double_eq(lr_at(CM_SCHED_COSINE, 0, 0), 1.0);
  ck_assert_double_eq_tol(lr_at(CM_SCHED_COSINE, 0, 50), 0.55, 1e-12);
  ck_assert_double_eq_tol(lr_at(CM_SCHED_COSINE, 0, 25),
                          0.1 + 0.9 * 0.5 * (1 + cos(M_PI / 4)), 1e-12);
  ck_assert_double_eq(lr_at(CM_SCHED_COSINE, 0, 100), 0.1);
  ck_assert_double_eq(lr_at(CM_SCHED_COSINE, 0, 1000000), 0.1);
  /* warm-up of 10: (k + 1) / 10 of lr, then the decay from its start */
  ck_assert_double_eq(lr_at(CM_SCHED_CONSTANT, 10, 0), 0.1);
  ck_assert_double_eq(lr_at(CM_SCHED_CONSTANT, 10, 4), 0.5);
  ck_assert_double_eq(lr_at(CM_SCHED_CONSTANT, 10, 9), 1.0);
  ck_assert_double_eq(lr_at(CM_SCHED_CONSTANT, 10, 10), 1.0);
  ck_assert_double_eq(lr_at(CM_SCHED_STEP, 10, 9), 1.0);
  ck_assert_double_eq(lr_at(CM_SCHED_STEP, 10, 19), 1.0);
  ck_assert_double_eq(lr_at(CM_SCHED_STEP, 10, 20), 0.5);
  ck_assert_double_eq(lr_at(CM_SCHED_COSINE, 10, 0), 0.1);
  ck_assert_double_eq(lr_at(CM_SCHED_COSINE, 10, 10), 1.0);
  ck_assert_double_eq_tol(lr_at(CM_SCHED_COSINE, 10, 60), 0.55, 1e-12);
  ck_assert_double_eq(lr_at(CM_SCHED_COSINE, 10, 110), 0.1);
}
END_TEST

START_TEST(test_clip) {
  float g[2] = {3.0f, 4.0f}, h[2] = {0.3f, 0.4f};
  size_t n = 1000003;
  float *x = tu_frandv(n, 9, 0), *y;
  double want = 0.0, norm;

  /* Above the bound: scaled to it. */
  ck_assert_double_eq(kn_clip_global_norm(g, 2, 1.0), 5.0);
  ck_assert_float_eq_tol(g[0], 0.6f, 1e-7f);
  ck_assert_float_eq_tol(g[1], 0.8f, 1e-7f);
  /* Below or at it: untouched, bit for bit. */
  norm = kn_clip_global_norm(h, 2, 1.0);
  ck_assert_double_eq_tol(norm, 0.5, 1e-7);
  ck_assert_float_eq(h[0], 0.3f);
  ck_assert_float_eq(h[1], 0.4f);
  ck_assert_double_eq(kn_clip_global_norm(h, 0, 1.0), 0.0);
  /* The sum of squares: 8 double partial sums (element i in sum i mod 8),
   * added pairwise; within 1e-12 of one sum in index order. */
  {
    double part[8] = {0}, seq = 0.0;
    for (size_t i = 0; i < n; i++) {
      part[i % 8] += (double)x[i] * x[i];
      seq += (double)x[i] * x[i];
    }
    want = ((part[0] + part[1]) + (part[2] + part[3])) +
           ((part[4] + part[5]) + (part[6] + part[7]));
    ck_assert_double_eq(kn_sumsq(x, n), want);
    ck_assert_double_eq_tol(kn_sumsq(x, n), seq, 1e-12 * seq);
    for (size_t k = 0; k < 20; k++) { /* short ones: the tail alone */
      double t = 0.0;
      for (size_t i = 0; i < k; i++)
        t += (double)x[i] * x[i];
      ck_assert_double_eq_tol(kn_sumsq(x, k), t, 1e-15 * (t + 1));
    }
  }
  /* A big gradient comes out at the bound, each element scaled alike. */
  y = copyv(x, n);
  norm = kn_clip_global_norm(x, n, 2.0);
  ck_assert_double_eq(norm, sqrt(want));
  ck_assert_double_eq_tol(sqrt(kn_sumsq(x, n)), 2.0, 2e-6);
  for (size_t i = 0; i < n; i += 1000)
    ck_assert_float_eq(x[i], y[i] * (float)(2.0 / norm));
  free(x), free(y);
}
END_TEST

/* cm_optim_apply runs the spec's optimizer: update k uses the schedule's
 * lr at k and t = k + 1, and the slots in cm_optim_slot_name order. */
START_TEST(test_apply) {
  size_t n = 1003;
  for (int type = 0; type < CM_OPT_NTYPES; type++) {
    struct cm_optim o;
    struct kn_optim_hp hp;
    float *w = tu_frandv(n, 1, 0), *s0 = tu_frandv(n, 2, 1),
          *s1 = tu_frandv(n, 3, 1), *g = tu_frandv(n, 4, 0);
    float *rw = copyv(w, n), *rs0 = copyv(s0, n), *rs1 = copyv(s1, n);
    float *slots[2] = {s0, s1};

    cm_optim_defaults(&o);
    o.type = (enum cm_optim_type)type;
    o.lr = 0.01;
    o.weight_decay = 0.01;
    o.schedule.type = CM_SCHED_COSINE;
    o.schedule.warmup_steps = 3;
    o.schedule.total_steps = 20;
    for (uint64_t k = 0; k < 6; k++) {
      cm_optim_apply(&o, k, w, slots, g, n);
      cm_optim_hp_at(&hp, &o, k);
      ck_assert_uint_eq(hp.t, k + 1);
      ck_assert_float_eq(hp.lr, (float)cm_schedule_lr(&o.schedule, o.lr, k));
      ref_step((enum kind)type, rw, rs0, rs1, g, n, &hp);
    }
    same_bits(w, rw, n, cm_optim_name(o.type));
    same_bits(s0, rs0, n, cm_optim_name(o.type));
    same_bits(s1, rs1, n, cm_optim_name(o.type));
    ck_assert_int_eq(cm_optim_nslots(o.type),
                     type == CM_OPT_SGD                            ? 0
                     : type == CM_OPT_ADAM || type == CM_OPT_ADAMW ? 2
                                                                   : 1);
    free(w), free(s0), free(s1), free(g), free(rw), free(rs0), free(rs1);
  }
}
END_TEST

START_TEST(test_describe) {
  struct cm_optim o;
  char buf[256];

  cm_optim_defaults(&o);
  cm_optim_describe(&o, buf, sizeof buf);
  ck_assert_str_eq(buf, "momentum(lr=0.05, momentum=0.9)");
  o.type = CM_OPT_SGD;
  cm_optim_describe(&o, buf, sizeof buf);
  ck_assert_str_eq(buf, "sgd(lr=0.05)");
  o.type = CM_OPT_ADAMW;
  o.lr = 0.001;
  o.weight_decay = 0.01;
  o.schedule.type = CM_SCHED_COSINE;
  o.schedule.warmup_steps = 100;
  o.schedule.total_steps = 2000;
  cm_optim_describe(&o, buf, sizeof buf);
  ck_assert_str_eq(buf, "adamw(lr=0.001, beta1=0.9, beta2=0.999, eps=1e-08, "
                        "weight_decay=0.01, schedule=cosine(warmup_steps=100, "
                        "total_steps=2000, min_lr=0))");
  /* Cut off cleanly in a short buffer. */
  cm_optim_describe(&o, buf, 12);
  ck_assert_str_eq(buf, "adamw(lr=0.");
  ck_assert_str_eq(cm_optim_slot_name(CM_OPT_ADAM, 1), "v");
  ck_assert_ptr_null(cm_optim_slot_name(CM_OPT_SGD, 0));
}
END_TEST

static Suite *optim_suite(void) {
  Suite *s = suite_create("optim");
  TCase *tc = tcase_create("kernels");
  int nsizes = sizeof sizes / sizeof sizes[0];

  tcase_add_loop_test(tc, test_kernel_vs_loop, 0, NKINDS * 2 * nsizes);
  tcase_add_loop_test(tc, test_kernel_vs_formula, 0, NKINDS * 2);
  tcase_add_test(tc, test_by_hand);
  tcase_add_test(tc, test_clip);
  tcase_add_test(tc, test_apply);
  tcase_set_timeout(tc, 60);
  suite_add_tcase(s, tc);
  tc = tcase_create("config");
  tcase_add_test(tc, test_schedules);
  tcase_add_test(tc, test_describe);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(optim_suite(), 0); }
