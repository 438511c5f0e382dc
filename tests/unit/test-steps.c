/* Sync staging is idempotent: staging the same (worker, step, chunk) again
 * replaces it, so a retried push counts once in the step's average; parts
 * never staged count as zero; a stage for a committed step is refused
 * (CM_ERANGE) and one beyond the open step too (CM_EINVAL); a repeated
 * commit of the last step changes nothing; after a restart, a commit of the
 * resumed step whose set holds a worker that staged nothing since is
 * refused. A commit's sum is a plain loop's bit for bit, past the
 * threshold where staging streams too; a step's pulls
 * share one snapshot of its values. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "steps.h"
#include "store.h"
#include "unit.h"

/* A store with one zero-initialised variable of n elements on one shard,
 * sgd with lr 0.5 (an update by g is exactly -0.5 g in f32). */
static struct psd_store *store_with_len(struct psd_var **v, int64_t n) {
  static struct cm_optim_set opt; /* copied by the store */
  struct psd_store *s = NULL;
  int64_t shape[1] = {n};
  char err[256];
  int created = 0;
  cm_optim_defaults(&opt.def);
  opt.def.type = CM_OPT_SGD;
  opt.def.lr = 0.5;
  ck_assert_int_eq(psd_store_new(&s, 0, 1, &opt), 0);
  ck_assert_int_eq(psd_store_declare(s, "w", 1, shape, -1, PSD_INIT_ZEROS, 0, 1,
                                     NULL, v, &created, err, sizeof err),
                   0);
  ck_assert_int_eq(created, 1);
  return s;
}

/* The same with 8 elements (every update below is exact in f32). */
static struct psd_store *store_with_var(struct psd_var **v) {
  return store_with_len(v, 8);
}

START_TEST(restaging_a_chunk_replaces_it) {
  struct psd_var *v;
  struct psd_store *store = store_with_var(&v);
  struct psd_steps *st = NULL;
  const float one[4] = {1, 1, 1, 1}, two[4] = {2, 2, 2, 2};
  int none[1] = {0}; /* no worker dropped */
  char err[256];
  int w0 = 0, w1 = 1;
  ck_assert_int_eq(psd_steps_new(&st, store, 2), 0);
  /* Worker 0 stages both halves, then its first half again (a retry). */
  ck_assert_int_eq(psd_steps_stage(st, w0, 0, v, 0, one, 4, err, sizeof err),
                   0);
  ck_assert_int_eq(psd_steps_stage(st, w0, 0, v, 4, two, 4, err, sizeof err),
                   0);
  ck_assert_int_eq(psd_steps_stage(st, w0, 0, v, 0, one, 4, err, sizeof err),
                   0);
  /* Worker 1 stages its first half twice with different contents (the
   * later one wins) and never its second half (zero). */
  ck_assert_int_eq(psd_steps_stage(st, w1, 0, v, 0, two, 4, err, sizeof err),
                   0);
  ck_assert_int_eq(psd_steps_stage(st, w1, 0, v, 0, one, 4, err, sizeof err),
                   0);
  int applied[2] = {0, 1};
  ck_assert_int_eq(
      psd_steps_commit(st, 0, applied, 2, none, 0, err, sizeof err), 0);
  /* Mean gradient: first half (1 + 1) / 2 = 1, second (2 + 0) / 2 = 1;
   * w = 0 - 0.5 * 1 once. */
  for (int i = 0; i < 8; i++)
    ck_assert_float_eq(v->value[i], -0.5f);
  ck_assert_uint_eq(psd_steps_version(st), 1);
  /* The commit's retry changes nothing. */
  ck_assert_int_eq(
      psd_steps_commit(st, 0, applied, 2, none, 0, err, sizeof err), 0);
  for (int i = 0; i < 8; i++)
    ck_assert_float_eq(v->value[i], -0.5f);
  /* A retry that comes after its step closed is refused as late. */
  ck_assert_int_eq(psd_steps_stage(st, w0, 0, v, 0, one, 4, err, sizeof err),
                   CM_ERANGE);
  ck_assert_int_eq(psd_steps_stage(st, w0, 2, v, 0, one, 4, err, sizeof err),
                   CM_EINVAL);
  /* Step 1: only worker 1, staged three times, applied once. */
  for (int k = 0; k < 3; k++)
    ck_assert_int_eq(psd_steps_stage(st, w1, 1, v, 0, two, 4, err, sizeof err),
                     0);
  int only1[1] = {1};
  ck_assert_int_eq(psd_steps_commit(st, 1, only1, 1, none, 0, err, sizeof err),
                   0);
  for (int i = 0; i < 4; i++)
    ck_assert_float_eq(v->value[i], -1.5f);
  for (int i = 4; i < 8; i++)
    ck_assert_float_eq(v->value[i], -0.5f);
  psd_steps_free(st);
  psd_store_free(store);
}
END_TEST

START_TEST(resumed_step_needs_every_applied_gradient) {
  struct psd_var *v;
  struct psd_store *store = store_with_var(&v);
  struct psd_steps *st = NULL;
  const float one[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  int none[1] = {0}, both[2] = {0, 1};
  char err[512];
  ck_assert_int_eq(psd_steps_new(&st, store, 2), 0);
  /* Restored at step 5: worker 1's gradient for step 5, pushed before the
   * restart, is gone; the coordinator's set still has it. */
  psd_steps_resume(st, 5);
  ck_assert_int_eq(psd_steps_stage(st, 0, 5, v, 0, one, 8, err, sizeof err), 0);
  ck_assert_int_eq(psd_steps_commit(st, 5, both, 2, none, 0, err, sizeof err),
                   CM_EINVAL);
  ck_assert_msg(strstr(err, "worker 1 is in its set but staged nothing here"),
                "%s", err);
  ck_assert_uint_eq(psd_steps_version(st), 5);
  for (int i = 0; i < 8; i++)
    ck_assert_float_eq(v->value[i], 0);
  /* Staged again (a retried push to the restarted shard): applied. */
  ck_assert_int_eq(psd_steps_stage(st, 1, 5, v, 0, one, 8, err, sizeof err), 0);
  ck_assert_int_eq(psd_steps_commit(st, 5, both, 2, none, 0, err, sizeof err),
                   0);
  for (int i = 0; i < 8; i++)
    ck_assert_float_eq(v->value[i], -0.5f);
  /* Later steps are not checked: a worker may have no rows here. */
  ck_assert_int_eq(psd_steps_stage(st, 0, 6, v, 0, one, 8, err, sizeof err), 0);
  ck_assert_int_eq(psd_steps_commit(st, 6, both, 2, none, 0, err, sizeof err),
                   0);
  psd_steps_free(st);
  psd_store_free(store);
}
END_TEST

/* A rollback to a common checkpoint: the step reopens, every staged
 * gradient is dropped, the history forgets the commits rolled back, the
 * generation is kept and the resumed state cleared. */
START_TEST(rollback_drops_staged_and_history) {
  struct psd_var *v;
  struct psd_store *store = store_with_var(&v);
  struct psd_steps *st = NULL;
  const float one[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  int none[1] = {0}, w0[1] = {0};
  struct psd_step_record *h = calloc(PSD_STEPS_HISTORY, sizeof *h);
  struct psd_steps_state ss;
  char err[512];
  ck_assert_ptr_nonnull(h);
  ck_assert_int_eq(psd_steps_new(&st, store, 2), 0);
  psd_steps_resume(st, 3);
  psd_steps_state(st, &ss);
  ck_assert_int_eq(ss.resumed, 1);
  ck_assert_uint_eq(ss.gen, 0);
  ck_assert_uint_eq(ss.rollback_step, 0);
  for (uint64_t t = 3; t < 6; t++) {
    ck_assert_int_eq(psd_steps_stage(st, 0, t, v, 0, one, 8, err, sizeof err),
                     0);
    ck_assert_int_eq(psd_steps_commit(st, t, w0, 1, none, 0, err, sizeof err),
                     0);
  }
  /* Staged for step 6, then rolled back to 4. */
  ck_assert_int_eq(psd_steps_stage(st, 1, 6, v, 0, one, 8, err, sizeof err), 0);
  psd_steps_rollback(st, 4, 1);
  ck_assert_uint_eq(psd_steps_version(st), 4);
  psd_steps_state(st, &ss);
  ck_assert_uint_eq(ss.gen, 1);
  ck_assert_uint_eq(ss.rollback_step, 4);
  ck_assert_int_eq(ss.resumed, 0);
  ck_assert_int_eq(psd_steps_history(st, h, PSD_STEPS_HISTORY), 1);
  ck_assert_uint_eq(h[0].step, 3);
  /* Step 4 again: worker 1's staged gradient (for 6) is gone, so a commit
   * of worker 0 alone applies exactly worker 0's. */
  float before = v->value[0];
  ck_assert_int_eq(psd_steps_stage(st, 0, 4, v, 0, one, 8, err, sizeof err), 0);
  ck_assert_int_eq(psd_steps_commit(st, 4, w0, 1, none, 0, err, sizeof err), 0);
  ck_assert_float_eq(v->value[0], before - 0.5f);
  ck_assert_int_eq(psd_steps_history(st, h, PSD_STEPS_HISTORY), 2);
  ck_assert_uint_eq(h[1].step, 4);
  free(h);
  psd_steps_free(st);
  psd_store_free(store);
}
END_TEST

/* A commit sums each element in ascending worker order and then scales it,
 * whatever order the gradients came in and however they were chunked: the
 * result is bit for bit a plain loop's, on a slice longer than the blocks
 * the sum works in, with chunks that start in the middle (the rest of the
 * slice counts as zero until pushed). */
START_TEST(commit_sums_in_worker_order_bit_for_bit) {
  enum { N = 5003, W = 3 };
  struct psd_var *v;
  struct psd_store *store = store_with_len(&v, N);
  struct psd_steps *st = NULL;
  float *g = malloc(W * N * sizeof *g), *want = malloc(N * sizeof *want);
  int applied[W] = {2, 0, 1}, none[1] = {0};
  char err[256];
  ck_assert_ptr_nonnull(g);
  ck_assert_ptr_nonnull(want);
  for (int i = 0; i < W * N; i++)
    g[i] = (float)((i * 37) % 101) / 7.0f - 6.0f;
  ck_assert_int_eq(psd_steps_new(&st, store, W), 0);
  /* Worker 2 pushes two chunks, the later half first; worker 1 only
   * [100, 4000); worker 0 the whole slice. */
  ck_assert_int_eq(psd_steps_stage(st, 2, 0, v, 2500, g + 2 * N + 2500,
                                   N - 2500, err, sizeof err),
                   0);
  ck_assert_int_eq(
      psd_steps_stage(st, 2, 0, v, 0, g + 2 * N, 2500, err, sizeof err), 0);
  ck_assert_int_eq(
      psd_steps_stage(st, 1, 0, v, 100, g + N + 100, 3900, err, sizeof err), 0);
  ck_assert_int_eq(psd_steps_stage(st, 0, 0, v, 0, g, N, err, sizeof err), 0);
  for (int e = 0; e < N; e++) {
    float w1 = e >= 100 && e < 4000 ? g[N + e] : 0.0f;
    float acc = g[e];
    acc += w1;
    acc += g[2 * N + e];
    acc *= 1.0f / (float)W;
    want[e] = -0.5f * acc;
  }
  ck_assert_int_eq(
      psd_steps_commit(st, 0, applied, W, none, 0, err, sizeof err), 0);
  ck_assert_int_eq(memcmp(v->value, want, N * sizeof *want), 0);
  free(g);
  free(want);
  psd_steps_free(st);
  psd_store_free(store);
}
END_TEST

/* Past PSD_STEPS_STREAM_BYTES of slots, staging writes around the caches
 * and the commit fetches ahead: the result is still a plain loop's bit for
 * bit, with chunks that start and end off the stores' 16-byte alignment
 * (staged once the slots are past the threshold), a retried chunk, a slice
 * that is not a whole number of the sum's blocks, and a worker that pushed
 * nothing. */
START_TEST(commit_past_stream_threshold_bit_for_bit) {
  enum { W = 6 };
  /* Four workers' slots pass the threshold. */
  const int n = (int)(PSD_STEPS_STREAM_BYTES / 4 / sizeof(float)) + 1003;
  struct psd_var *v;
  struct psd_store *store = store_with_len(&v, n);
  struct psd_steps *st = NULL;
  float *g = malloc((size_t)W * n * sizeof *g),
        *want = malloc(n * sizeof *want);
  int applied[W - 1] = {4, 1, 0, 3, 2}, none[1] = {5};
  char err[256];
  ck_assert_ptr_nonnull(g);
  ck_assert_ptr_nonnull(want);
  for (int64_t i = 0; i < (int64_t)W * n; i++)
    g[i] = (float)((i * 37) % 101) / 7.0f - 6.0f;
  ck_assert_int_eq(psd_steps_new(&st, store, W), 0);
  for (int w = 0; w < 4; w++)
    ck_assert_int_eq(
        psd_steps_stage(st, w, 0, v, 0, g + (int64_t)w * n, n, err, sizeof err),
        0);
  /* Worker 4: chunks [1, 7) (shorter than one store), [7, n - 5) and
   * [n - 5, n - 2), element 0 and the last two never pushed (zero). */
  const float *g4 = g + 4 * (int64_t)n;
  ck_assert_int_eq(
      psd_steps_stage(st, 4, 0, v, 7, g4 + 7, n - 12, err, sizeof err), 0);
  ck_assert_int_eq(psd_steps_stage(st, 4, 0, v, 1, g4 + 1, 6, err, sizeof err),
                   0);
  ck_assert_int_eq(
      psd_steps_stage(st, 4, 0, v, n - 5, g4 + n - 5, 3, err, sizeof err), 0);
  /* Worker 0 retries a chunk that starts off alignment, with other values
   * (the later one wins); worker 5 stages a gradient left out of the step. */
  const float *g5 = g + 5 * (int64_t)n;
  ck_assert_int_eq(
      psd_steps_stage(st, 0, 0, v, 3, g5 + 3, 4099, err, sizeof err), 0);
  ck_assert_int_eq(psd_steps_stage(st, 5, 0, v, 0, g5, n, err, sizeof err), 0);
  for (int e = 0; e < n; e++) {
    float w0 = e >= 3 && e < 3 + 4099 ? g5[e] : g[e];
    float w4 = e >= 1 && e < n - 2 ? g4[e] : 0.0f;
    float acc = w0;
    acc += g[n + e];
    acc += g[2 * (int64_t)n + e];
    acc += g[3 * (int64_t)n + e];
    acc += w4;
    acc *= 1.0f / (float)(W - 1);
    want[e] = -0.5f * acc;
  }
  ck_assert_int_eq(
      psd_steps_commit(st, 0, applied, W - 1, none, 1, err, sizeof err), 0);
  for (int e = 0; e < n; e++)
    if (memcmp(&v->value[e], &want[e], sizeof *want))
      ck_abort_msg("element %d: %a, a plain loop gives %a", e, v->value[e],
                   want[e]);
  free(g);
  free(want);
  psd_steps_free(st);
  psd_store_free(store);
}
END_TEST

/* Every pull of a step shares one snapshot of the values; a commit makes
 * the next pull take a new one, while answers still holding the old one
 * keep reading the old values. */
START_TEST(snapshot_is_shared_per_step) {
  struct psd_var *v;
  struct psd_store *store = store_with_var(&v);
  struct psd_steps *st = NULL;
  const float one[8] = {1, 1, 1, 1, 1, 1, 1, 1};
  int w0[1] = {0}, none[1] = {0};
  uint64_t ver = 99;
  char err[256];
  ck_assert_int_eq(psd_steps_new(&st, store, 1), 0);
  struct psd_steps_snap *a = psd_steps_snap_get(st),
                        *b = psd_steps_snap_get(st);
  ck_assert_ptr_nonnull(a);
  ck_assert_ptr_eq(a, b);
  const float *va = psd_steps_snap_values(a, v, &ver);
  ck_assert_uint_eq(ver, 0);
  ck_assert_float_eq(va[7], 0.0f);
  psd_steps_snap_release(b);
  ck_assert_int_eq(psd_steps_stage(st, 0, 0, v, 0, one, 8, err, sizeof err), 0);
  ck_assert_int_eq(psd_steps_commit(st, 0, w0, 1, none, 0, err, sizeof err), 0);
  struct psd_steps_snap *c = psd_steps_snap_get(st);
  ck_assert_ptr_nonnull(c);
  ck_assert_ptr_ne(c, a);
  const float *vc = psd_steps_snap_values(c, v, &ver);
  ck_assert_uint_eq(ver, 1);
  ck_assert_float_eq(vc[7], -0.5f);
  ck_assert_float_eq(va[7], 0.0f); /* a is still held: unchanged */
  /* Held by three slices, released by each. */
  psd_steps_snap_hold(c, 2);
  psd_steps_snap_release(c);
  psd_steps_snap_release(c);
  psd_steps_snap_release(a);
  /* A rollback to the same version number is a new generation: new values
   * (the saver reloads them), a new snapshot. */
  psd_steps_rollback(st, 1, 1);
  v->value[7] = 3.0f;
  struct psd_steps_snap *d = psd_steps_snap_get(st);
  ck_assert_float_eq(psd_steps_snap_values(d, v, &ver)[7], 3.0f);
  psd_steps_snap_release(d);
  psd_steps_snap_release(c);
  psd_steps_free(st);
  psd_store_free(store);
}
END_TEST

static Suite *steps_suite(void) {
  Suite *s = suite_create("steps");
  TCase *tc = tcase_create("staging");
  tcase_add_test(tc, restaging_a_chunk_replaces_it);
  tcase_add_test(tc, resumed_step_needs_every_applied_gradient);
  tcase_add_test(tc, rollback_drops_staged_and_history);
  tcase_add_test(tc, commit_sums_in_worker_order_bit_for_bit);
  tcase_add_test(tc, commit_past_stream_threshold_bit_for_bit);
  tcase_add_test(tc, snapshot_is_shared_per_step);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(steps_suite(), 0); }
