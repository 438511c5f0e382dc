/* A small model trained through psd from a program of your own, with the
 * installed C library (man 3 psclient):
 *
 *   cc linreg.c $(pkg-config --cflags --libs psclient) -o linreg
 *   ./linreg SPEC [worker:N] [STEPS]
 *
 * Linear regression on synthetic data, y = x . w_true + 0.5: the weights
 * (a variable "linreg/w" of 64 floats, placed by the shards' rule) and the
 * bias ("linreg/b") live on the job's shards, which apply the spec's
 * optimizer to the gradients this program pushes. It prints the loss as it
 * goes and a final line; exits 0 when the loss fell below 1e-3 of where it
 * started, 1 otherwise, 2 on a usage or psd error. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <psd/client.h>

#define DIM 64
#define BATCH 32

/* A deterministic stream of uniform numbers in [-1, 1). */
static float uniform(unsigned long long *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return (float)((*s >> 40) / (double)(1ull << 23) - 1.0);
}

int main(int argc, char **argv) {
  struct psc_options o;
  char err[4096];
  psc_client *c = NULL;
  float w[DIM], b[1], gw[DIM], gb[1], w_true[DIM], x[BATCH][DIM], y[BATCH];
  float *dst[2] = {w, b};
  const float *grads[2] = {gw, gb};
  unsigned long long seed = 42;
  int steps = argc > 3 ? atoi(argv[3]) : 300, vars[2], rc = 2;
  double first = -1, loss = 0;

  if (argc < 2) {
    fprintf(stderr, "usage: %s SPEC [worker:N] [STEPS]\n", argv[0]);
    return 2;
  }
  psc_options_init(&o);
  o.task = argc > 2 ? argv[2] : NULL;
  if (psc_open(&c, argv[1], &o, err, sizeof err)) {
    fprintf(stderr, "linreg: %s\n", err);
    return 2;
  }
  for (int i = 0; i < DIM; i++)
    w_true[i] = uniform(&seed);
  int64_t shape_w[1] = {DIM}, shape_b[1] = {1};
  if ((vars[0] = psc_declare(c, "linreg/w", 1, shape_w, NULL)) < 0 ||
      (vars[1] = psc_declare(c, "linreg/b", 1, shape_b, NULL)) < 0)
    goto fail;
  if (psc_pull(c, vars, dst, 2))
    goto fail;
  for (int step = 0; step < steps; step++) {
    loss = 0;
    for (int i = 0; i < DIM; i++)
      gw[i] = 0;
    gb[0] = 0;
    for (int n = 0; n < BATCH; n++) {
      float pred = b[0], want = 0.5f;
      for (int i = 0; i < DIM; i++) {
        x[n][i] = uniform(&seed);
        want += x[n][i] * w_true[i];
        pred += x[n][i] * w[i];
      }
      y[n] = want;
      float d = pred - y[n];
      loss += 0.5 * d * d / BATCH;
      for (int i = 0; i < DIM; i++)
        gw[i] += d * x[n][i] / BATCH;
      gb[0] += d / BATCH;
    }
    if (first < 0)
      first = loss;
    if (step % 50 == 0)
      printf("linreg: step %d loss %.6f\n", step, loss);
    /* One round trip: push this step's gradient, pull the new values. */
    if (psc_push_pull(c, vars, grads, dst, 2, BATCH))
      goto fail;
  }
  printf("final: steps=%d loss=%.6g first_loss=%.6g bytes_pulled=%llu "
         "bytes_pushed=%llu\n",
         steps, loss, first, (unsigned long long)psc_bytes_pulled(c),
         (unsigned long long)psc_bytes_pushed(c));
  rc = loss < first * 1e-3 ? 0 : 1;
  psc_close(c);
  return rc;
fail:
  fprintf(stderr, "linreg: %s (%s)\n", psc_error(c), "psd");
  psc_close(c);
  return 2;
}
