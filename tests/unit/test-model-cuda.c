/* The GPU replica (worker/model/model_gpu.c) against the CPU model: each model
 * (softmax, MLP, CNN) built on CUDA device 0 and on the CPU from the same
 * initial values takes one training step on the same batch; the gradients
 * must agree within 1e-4 (|g_gpu - g_cpu| <= 1e-4 (|g_cpu| + 1e-3): cuBLAS
 * and OpenBLAS sum in different orders, and tanh/exp may differ by an ulp),
 * the losses within 1e-5 relative, the correct counts exactly, and so must
 * an evaluation of 300 examples. Two replicas of the CNN on devices 0 and 1
 * are checked the same way when two GPUs work (the case is not registered
 * otherwise). Exits 77 (skipped) without a
 * usable GPU or in a build without CUDA. */
#include "psd_config.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blas.h"
#include "device.h"
#include "model.h"
#include "unit.h"

/* GPUs that work here, from main's probe. */
static int ngpus;

static float test_rand(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return (float)(*s >> 40) / 16777216.0f * 2.0f - 1.0f;
}

static struct dw_model *build(const char *kind, int B, int R, int gpu) {
  struct cm_job j;
  struct dw_model *m = NULL;
  char err[256] = "";

  memset(&j, 0, sizeof j);
  snprintf(j.model, sizeof j.model, "%s", kind);
  j.hidden[0] = 64;
  j.nhidden = 1;
  j.channels[0] = 8;
  j.channels[1] = 16;
  ck_assert_msg(dw_model_new(&m, &j, 784, 10, B, R, gpu, err, sizeof err) == 0,
                "%s", err);
  dw_model_init(m, 4);
  return m;
}

START_TEST(test_gpu_matches_cpu) {
  static const char *const kinds[] = {"softmax", "mlp", "cnn"};
  enum { B = 64, N = 300 };
  int R = _i == 3 ? 2 : 1;
  const char *kind = kinds[_i == 3 ? 2 : _i];
  float *x = malloc((size_t)N * 784 * sizeof *x), lc, lg, ec, eg;
  uint8_t y[N];
  uint64_t seed = 21;
  int cc = -1, cg = -2;
  size_t i = 0;

  for (int k = 0; k < N * 784; k++)
    x[k] = 0.5f + 0.5f * test_rand(&seed);
  for (int k = 0; k < N; k++)
    y[k] = (uint8_t)(k * 7 % 10);
  struct dw_model *cpu = build(kind, B, 1, -1), *gpu = build(kind, B, R, 0);
  lc = dw_model_train_step(cpu, x, y, B, &cc);
  lg = dw_model_train_step(gpu, x, y, B, &cg);
  ck_assert_msg(fabsf(lc - lg) <= 1e-5f * fabsf(lc), "%s: loss %g vs %g", kind,
                lc, lg);
  ck_assert_int_eq(cc, cg);
  while (i < cpu->nparams && fabsf(cpu->grads[i] - gpu->grads[i]) <=
                                 1e-4f * (fabsf(cpu->grads[i]) + 1e-3f))
    i++;
  ck_assert_msg(i == cpu->nparams, "%s R=%d grad[%zu]: cpu %g, gpu %g", kind, R,
                i, i < cpu->nparams ? cpu->grads[i] : 0.0,
                i < cpu->nparams ? gpu->grads[i] : 0.0);
  cc = dw_model_evaluate(cpu, x, y, N, &ec);
  cg = dw_model_evaluate(gpu, x, y, N, &eg);
  ck_assert_int_eq(cc, cg);
  ck_assert_msg(fabsf(ec - eg) <= 1e-5f * fabsf(ec), "%s: eval loss %g vs %g",
                kind, ec, eg);
  dw_model_free(cpu);
  dw_model_free(gpu);
  free(x);
}
END_TEST

static Suite *model_cuda_suite(void) {
  Suite *s = suite_create("model-cuda");
  TCase *tc = tcase_create("gpu vs cpu");
  tcase_set_timeout(tc, 120);
  /* Case 3, two replicas on two GPUs, only where two work. */
  tcase_add_loop_test(tc, test_gpu_matches_cpu, 0, ngpus >= 2 ? 4 : 3);
  suite_add_tcase(s, tc);
  return s;
}

int main(int argc, char **argv) {
  char why[256];

  (void)argc;
  kn_blas_init(argv, 1);
  ngpus = kn_cuda_probe(why, sizeof why);
  if (ngpus <= 0)
    return tu_skip(why);
  /* The probe has initialised CUDA, which does not survive fork(). */
  return tu_run(model_cuda_suite(), TU_NOFORK | TU_ENV);
}
