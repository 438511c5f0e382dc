/* Declare's initial values on shard 0 of 2 (service_values.c, vstage.c;
 * docs/wire.md, "Initial values"): a variable created from the values a
 * Declare carries, the first declaration's values kept; values that do not
 * cover the shard's rows refused without a stage, gathered over several
 * Declares with one; a stage overtaken by another client's creation; a
 * variable awaited until another Declare creates it; and each bad run
 * refused naming the variable. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "service_fixture.h"
#include "unit.h"

#define DECLARE "/psd.v1.Data/Declare"

/* A [4, 3] split variable: shard 0 holds rows [0, 2), elements [0, 6). */
static int64_t shape43[2] = {4, 3};

/* DeclareRequest.client of the requests req() makes (0: not said). */
static uint64_t req_client;

/* A Declare of name (shape43, placement) from source with the runs
 * (offset, count) of vals (from element 0 of vals on), under stage. */
static grpc_byte_buffer *req(const char *name, int placement, int source,
                             uint64_t stage, const float *vals, int nruns,
                             const uint64_t (*runs)[2]) {
  Psd__V1__DeclareRequest r = PSD__V1__DECLARE_REQUEST__INIT;
  Psd__V1__VarSpec vs = PSD__V1__VAR_SPEC__INIT, *vp[1] = {&vs};
  Psd__V1__ValueRun rv[4], *rp[4];
  vs.name = (char *)name;
  vs.n_shape = 2;
  vs.shape = shape43;
  vs.placement = placement;
  vs.source = source;
  for (int k = 0; k < nruns; k++) {
    psd__v1__value_run__init(&rv[k]);
    rv[k].name = (char *)name;
    rv[k].offset = runs[k][0];
    rv[k].data.len = runs[k][1] * sizeof(float);
    rv[k].data.data = (uint8_t *)(vals + runs[k][0]);
    rp[k] = &rv[k];
  }
  r.caller = &caller;
  r.n_vars = 1;
  r.vars = vp;
  r.n_values = (size_t)nruns;
  r.values = rp;
  r.stage = stage;
  r.client = req_client;
  return cm_rpc_pack(&r.base);
}

/* Declares with bb, which must succeed: -1 when the answer has no slice,
 * else its created flag. */
static int declared(grpc_byte_buffer *bb) {
  struct cm_rpc_answer ans;
  uint8_t *data;
  size_t len;
  int got = -1;
  call_ans(DECLARE, bb, GRPC_STATUS_OK, NULL, &ans);
  ck_assert_int_eq(cm_rpc_readall(ans.response, &data, &len), 0);
  Psd__V1__DeclareResponse *r =
      psd__v1__declare_response__unpack(NULL, len, data);
  ck_assert_ptr_nonnull(r);
  ck_assert_uint_le(r->n_slices, 1);
  if (r->n_slices)
    got = r->slices[0]->created;
  psd__v1__declare_response__free_unpacked(r, NULL);
  free(data);
  cm_rpc_answer_release(&ans);
  return got;
}

/* Whether name exists on the shard: a pull of its first element. */
static int exists(const char *name) {
  Psd__V1__Segment s = seg(name, 0, 1, 0, NULL);
  struct cm_rpc_answer ans;
  grpc_byte_buffer *bb = pull_req(&s, 1, 0);
  ck_assert_int_eq(cm_rpc_call_local(method("/psd.v1.Data/Pull"), bb, &ans), 0);
  grpc_byte_buffer_destroy(bb);
  int ok = ans.status == GRPC_STATUS_OK;
  cm_rpc_answer_release(&ans);
  return ok;
}

static const uint64_t all[1][2] = {{0, 6}};

START_TEST(created_from_the_first_values) {
  float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {-1, -2, -3, -4, -5, -6}, got[6];
  ck_assert_int_eq(declared(req("w", -1, 1, 0, a, 1, all)), 1);
  pull_values("w", 0, 6, got);
  ck_assert_mem_eq(got, a, sizeof a);
  /* Another client's values: the variable exists, they are ignored. */
  ck_assert_int_eq(declared(req("w", -1, 1, 0, b, 1, all)), 0);
  pull_values("w", 0, 6, got);
  ck_assert_mem_eq(got, a, sizeof a);
}
END_TEST

/* A client whose Declare created a variable, but that missed the answer (a
 * deadline passed while the shard created it) and sent it again, is told
 * it created it: it then puts it on its other shards, where every other
 * client awaits it. Another client, or one that says no id, is not. */
START_TEST(a_declare_sent_again_by_its_client_is_answered_created) {
  req_client = 11;
  ck_assert_int_eq(declared(req("z", -1, 0, 0, NULL, 0, NULL)), 1);
  ck_assert_int_eq(declared(req("z", -1, 0, 0, NULL, 0, NULL)), 1);
  req_client = 12;
  ck_assert_int_eq(declared(req("z", -1, 0, 0, NULL, 0, NULL)), 0);
  req_client = 0;
  ck_assert_int_eq(declared(req("z", -1, 0, 0, NULL, 0, NULL)), 0);
}
END_TEST

START_TEST(values_not_covering_the_rows_are_refused) {
  float a[6] = {1, 2, 3, 4, 5, 6};
  static const uint64_t half[2][2] = {{0, 2}, {1, 2}};
  call(DECLARE, req("w", -1, 1, 0, a, 2, half), GRPC_STATUS_INVALID_ARGUMENT,
       "Declare 'w': the values cover 3 of the 6 elements shard 0 holds, [0, "
       "6)");
  ck_assert(!exists("w"));
}
END_TEST

START_TEST(staged_values_create_it_once_complete) {
  float a[6] = {1, 2, 3, 4, 5, 6}, got[6];
  static const uint64_t first[1][2] = {{0, 3}}, rest[2][2] = {{3, 3}, {0, 1}};
  ck_assert_int_eq(declared(req("w", -1, 1, 7, a, 1, first)), -1);
  ck_assert(!exists("w"));
  /* The rest, and a run sent again (a retry): created now. */
  ck_assert_int_eq(declared(req("w", -1, 1, 7, a, 2, rest)), 1);
  pull_values("w", 0, 6, got);
  ck_assert_mem_eq(got, a, sizeof a);
}
END_TEST

START_TEST(stage_overtaken_by_another_declare) {
  float a[6] = {1, 2, 3, 4, 5, 6}, got[6], zero[6] = {0};
  static const uint64_t first[1][2] = {{0, 3}}, rest[1][2] = {{3, 3}};
  ck_assert_int_eq(declared(req("w", -1, 1, 9, a, 1, first)), -1);
  ck_assert_int_eq(declared(req("w", -1, 0, 0, NULL, 0, NULL)), 1);
  ck_assert_int_eq(declared(req("w", -1, 1, 9, a, 1, rest)), 0);
  pull_values("w", 0, 6, got);
  ck_assert_mem_eq(got, zero, sizeof zero);
}
END_TEST

START_TEST(awaited_until_another_declare_creates_it) {
  float a[6] = {1, 2, 3, 4, 5, 6}, got[6];
  ck_assert_int_eq(declared(req("w", -1, 2, 0, NULL, 0, NULL)), -1);
  ck_assert(!exists("w"));
  ck_assert_int_eq(declared(req("w", -1, 1, 0, a, 1, all)), 1);
  ck_assert_int_eq(declared(req("w", -1, 2, 0, NULL, 0, NULL)), 0);
  pull_values("w", 0, 6, got);
  ck_assert_mem_eq(got, a, sizeof a);
}
END_TEST

START_TEST(no_rows_here_created_without_values) {
  /* Whole on shard 1: nothing of it is held here. */
  ck_assert_int_eq(declared(req("w", 1, 1, 0, NULL, 0, NULL)), 1);
}
END_TEST

START_TEST(bad_runs_refused) {
  float a[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  static const uint64_t past[1][2] = {{4, 3}}, empty[1][2] = {{0, 0}};
  call(DECLARE, req("w", -1, 0, 0, a, 1, all), GRPC_STATUS_INVALID_ARGUMENT,
       "value run 0 is of 'w', which this request does not declare with "
       "source SOURCE_VALUES");
  call(DECLARE, req("w", -1, 1, 0, a, 1, past), GRPC_STATUS_OUT_OF_RANGE,
       "Declare 'w': value run 0, elements [4, +3), is outside shard 0's "
       "rows of it, elements [0, 6)");
  call(DECLARE, req("w", -1, 1, 0, a, 1, empty), GRPC_STATUS_INVALID_ARGUMENT,
       "Declare 'w': value run 0 holds 0 bytes; expected a positive multiple "
       "of 4");
  call(DECLARE, req("w", -1, 7, 0, NULL, 0, NULL), GRPC_STATUS_INVALID_ARGUMENT,
       "Declare 'w': source 7 is not a Source value");
  /* A stage's rows are fixed by its first request. */
  static const uint64_t first[1][2] = {{0, 3}};
  ck_assert_int_eq(declared(req("w", -1, 1, 5, a, 1, first)), -1);
  call(DECLARE, req("w", 0, 1, 5, a, 1, first), GRPC_STATUS_INVALID_ARGUMENT,
       "Declare 'w': stage 0000000000000005 holds elements [0, 6) of it, but "
       "this request's shape and placement put [0, 12) on shard 0");
  ck_assert(!exists("w"));
}
END_TEST

static Suite *values_suite(void) {
  Suite *s = suite_create("service-values");
  TCase *tc = service_tcase(s, "async");
  tcase_add_test(tc, created_from_the_first_values);
  tcase_add_test(tc, a_declare_sent_again_by_its_client_is_answered_created);
  tcase_add_test(tc, values_not_covering_the_rows_are_refused);
  tcase_add_test(tc, staged_values_create_it_once_complete);
  tcase_add_test(tc, stage_overtaken_by_another_declare);
  tcase_add_test(tc, awaited_until_another_declare_creates_it);
  tcase_add_test(tc, no_rows_here_created_without_values);
  tcase_add_test(tc, bad_runs_refused);
  return s;
}

int main(void) { return tu_run(values_suite(), 0); }
