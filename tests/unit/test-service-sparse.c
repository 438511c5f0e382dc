/* Unit tests for psd.v1.Data/SparsePull and Data/SparsePush
 * (ps-server/psd/shard/service_sparse.c; a push goes through service_push.c's
 * pipeline, as a dense one does) and their table (table.c): a push with
 * no ids is answered OK and changes nothing (once it killed the shard), one
 * with no ids but gradient bytes is refused naming the table; a push's
 * ids and widths are checked before anything is applied; a gradient with NaN
 * or an infinity is judged, logged and counted as a dense push's is; an
 * empty pull is an empty answer. Async and sync. Sync: a push for a step
 * beyond a shard that resumed from its checkpoint is retried (UNAVAILABLE),
 * as a dense push's. The shard and the calls are service_fixture.h's. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layout.h"
#include "log.h"
#include "ps.pb-c.h"
#include "rpc.h"
#include "rpc_server.h"
#include "service.h"
#include "service_fixture.h"
#include "steps.h"
#include "unit.h"
#include "wire.h"

#define PUSH "/psd.v1.Data/SparsePush"
#define PULL "/psd.v1.Data/SparsePull"

/* The answer's version (SparsePushResponse.version) of an OK push. */
static uint64_t push_version(grpc_byte_buffer *bb) {
  struct cm_rpc_answer ans;
  uint8_t *data;
  size_t len;
  call_ans(PUSH, bb, GRPC_STATUS_OK, NULL, &ans);
  ck_assert_int_eq(cm_rpc_readall(ans.response, &data, &len), 0);
  Psd__V1__SparsePushResponse *r =
      psd__v1__sparse_push_response__unpack(NULL, len, data);
  ck_assert_ptr_nonnull(r);
  uint64_t v = r->version;
  ck_assert(!r->rolled_back);
  psd__v1__sparse_push_response__free_unpacked(r, NULL);
  free(data);
  cm_rpc_answer_release(&ans);
  return v;
}

/* The version a SparsePull of no ids answers (the table's, or the steps
 * committed). */
static uint64_t pull_version(const char *table) {
  struct cm_rpc_answer ans;
  struct cm_wire_msg m;
  call_ans(PULL, sparse_pull_req(table, NULL, 0, 0), GRPC_STATUS_OK, NULL,
           &ans);
  ck_assert_int_eq(cm_wire_parse(&m, ans.response), 0);
  Psd__V1__SparsePullResponse *r =
      psd__v1__sparse_pull_response__unpack(NULL, m.head_len, m.head);
  ck_assert_ptr_nonnull(r);
  uint64_t v = r->version;
  psd__v1__sparse_pull_response__free_unpacked(r, NULL);
  cm_wire_msg_release(&m);
  cm_rpc_answer_release(&ans);
  return v;
}

/* What the shard holds of both tables' rows ids[0..3), and their counters:
 * an empty or refused push must leave all of it as it was. */
struct held {
  float emb[6], adm[6];              /* the rows, as pulled */
  struct psd_table_stats semb, sadm; /* the tables' counters */
  struct psd_counters c;             /* the shard's counters */
};

static void hold(struct held *h, const uint64_t *ids) {
  pull_rows("emb", ids, 3, h->emb); /* creates emb's rows the first time */
  pull_rows("adm", ids, 3, h->adm);
  h->semb = table_stats("emb");
  h->sadm = table_stats("adm");
  psd_service_counters(svc, &h->c);
}

static void same(const struct held *a, const struct held *b) {
  ck_assert_mem_eq(a->emb, b->emb, sizeof a->emb);
  ck_assert_mem_eq(a->adm, b->adm, sizeof a->adm);
  ck_assert_uint_eq(a->semb.rows, b->semb.rows);
  ck_assert_uint_eq(a->semb.rows_pushed, b->semb.rows_pushed);
  ck_assert_uint_eq(a->sadm.rows, b->sadm.rows);
  ck_assert_uint_eq(a->sadm.pending, b->sadm.pending);
  ck_assert_uint_eq(a->sadm.rows_pushed, b->sadm.rows_pushed);
  ck_assert_uint_eq(a->c.examples, b->c.examples);
  ck_assert_uint_eq(a->c.bytes_in, b->c.bytes_in);
  ck_assert_uint_eq(a->c.step, b->c.step);
}

/* A push with no ids: OK without data (nothing to apply), INVALID_ARGUMENT
 * naming the table with gradient bytes that belong to no id. Either way
 * the rows, the admission counts and the shard's counters stay. */
START_TEST(empty_push_changes_nothing) {
  uint64_t ids[3] = {shard0_id(0), shard0_id(1), shard0_id(2)};
  float g[6] = {1, 2, 3, 4, 5, 6};
  struct held before, after;
  const char *tables[2] = {"emb", "adm"};
  /* Rows that exist (emb) and a pending id (adm: one push of two). */
  Psd__V1__SparsePushRequest r = PSD__V1__SPARSE_PUSH_REQUEST__INIT;
  call(PUSH, sparse_push_req(&r, "emb", ids, 3, g, 6), GRPC_STATUS_OK, NULL);
  call(PUSH, sparse_push_req(&r, "adm", ids, 1, g, 2), GRPC_STATUS_OK, NULL);
  hold(&before, ids);

  for (int k = 0; k < 2; k++) {
    Psd__V1__SparsePushRequest e = PSD__V1__SPARSE_PUSH_REQUEST__INIT;
    e.examples = 32;
    e.client_id = 9;
    e.seq = 1;
    /* No ids, no data: the ids field absent, then present and empty. */
    uint64_t v = push_version(sparse_push_req(&e, tables[k], NULL, 0, NULL, 0));
    ck_assert_uint_eq(v, pull_version(tables[k]));
    static const uint64_t none[1];
    push_version(sparse_push_req(&e, tables[k], none, 0, NULL, 0));
    /* An empty data field as well. */
    push_version(sparse_push_req(&e, tables[k], none, 0, g, 0));
    /* No ids, but gradient bytes: refused, naming the table. */
    char want[128];
    snprintf(want, sizeof want,
             "SparsePush '%s': no ids, but data holds 8 bytes", tables[k]);
    call(PUSH, sparse_push_req(&e, tables[k], NULL, 0, g, 2),
         GRPC_STATUS_INVALID_ARGUMENT, want);
    call(PUSH, sparse_push_req(&e, tables[k], NULL, 0, g, 1),
         GRPC_STATUS_INVALID_ARGUMENT, "no ids, but data holds 4 bytes");
  }
  /* The same message id again, now with rows: applied (the empty ones
   * claimed nothing in the table of applied pushes). */
  hold(&after, ids);
  same(&before, &after);
  if (!psd_service_steps(svc)) {
    Psd__V1__SparsePushRequest e = PSD__V1__SPARSE_PUSH_REQUEST__INIT;
    e.client_id = 9;
    e.seq = 1;
    call(PUSH, sparse_push_req(&e, "emb", ids, 1, g, 2), GRPC_STATUS_OK, NULL);
    float now[2];
    pull_rows("emb", ids, 1, now);
    ck_assert_float_eq(now[0], before.emb[0] - g[0]);
    ck_assert_float_eq(now[1], before.emb[1] - g[1]);
  }
}
END_TEST

/* An empty pull is an empty answer of the table's dim. */
START_TEST(empty_pull_is_an_empty_answer) {
  struct cm_rpc_answer ans;
  struct cm_wire_msg m;
  struct psd_table_stats st = table_stats("emb");
  call_ans(PULL, sparse_pull_req("emb", NULL, 0, 0), GRPC_STATUS_OK, NULL,
           &ans);
  ck_assert_int_eq(cm_wire_parse(&m, ans.response), 0);
  ck_assert_uint_eq(m.bulk_len, 0);
  Psd__V1__SparsePullResponse *r =
      psd__v1__sparse_pull_response__unpack(NULL, m.head_len, m.head);
  ck_assert_ptr_nonnull(r);
  ck_assert_uint_eq(r->dim, 2);
  psd__v1__sparse_pull_response__free_unpacked(r, NULL);
  cm_wire_msg_release(&m);
  cm_rpc_answer_release(&ans);
  ck_assert_uint_eq(table_stats("emb").rows, st.rows);
}
END_TEST

/* A push's ids and widths are checked before anything is applied. */
START_TEST(push_checks_before_applying) {
  uint64_t ids[3] = {shard0_id(0), shard0_id(1), 0}, far = shard0_id(0);
  uint64_t mine[3] = {shard0_id(0), shard0_id(1), shard0_id(2)};
  float g[6] = {1, 2, 3, 4, 5, 6};
  struct held before, after;
  for (int k = 0; far < 1000; k++)
    far = shard0_id(k);
  for (uint64_t id = 0;; id++)
    if (fresh_shard(id, 2) == 1) {
      ids[2] = id; /* shard 1's */
      break;
    }
  hold(&before, mine);
  Psd__V1__SparsePushRequest r = PSD__V1__SPARSE_PUSH_REQUEST__INIT;
  call(PUSH, sparse_push_req(&r, "emb", ids, 3, g, 6),
       GRPC_STATUS_INVALID_ARGUMENT, "(position 2) belongs to shard 1");
  call(PUSH, sparse_push_req(&r, "emb", ids, 2, g, 6),
       GRPC_STATUS_INVALID_ARGUMENT,
       "SparsePush 'emb': row gradients of width 3; the table's rows have "
       "width 2 (dim)");
  call(PUSH, sparse_push_req(&r, "emb", ids, 2, g, 5),
       GRPC_STATUS_INVALID_ARGUMENT,
       "SparsePush 'emb': 2 ids need 16 bytes of gradient (dim 2); data "
       "holds 20");
  uint64_t two[2] = {ids[0], far};
  call(PUSH, sparse_push_req(&r, "adm", two, 2, g, 4), GRPC_STATUS_OUT_OF_RANGE,
       "ids must be below id_bound 1000");
  call(PUSH, sparse_push_req(&r, "nope", ids, 1, g, 2), GRPC_STATUS_NOT_FOUND,
       "no table 'nope'");
  hold(&after, mine);
  same(&before, &after);
}
END_TEST

/* The lines the shard logged at warn level and above, while a test has
 * set keep_line as the log's sink. */
static char logged[8192];

static void keep_line(void *arg, enum cm_log_level level, const char *msg) {
  size_t n = strlen(logged);
  (void)arg;
  if (level >= CM_LOG_WARN && n < sizeof logged)
    snprintf(logged + n, sizeof logged - n, "%s\n", msg);
}

/* Asserts that a line logged holds want. */
static void assert_logged(const char *want) {
  ck_assert_msg(strstr(logged, want), "no log line holds \"%s\"; logged:\n%s",
                want, logged);
}

/* A gradient with NaN or an infinity is judged as a dense push's is
 * (job.nonfinite): rejected naming the table and the id, or skipped
 * (nothing applied or counted) or applied, and then logged the way a dense
 * one is; counted in nonfinite_pushes whatever was done with it. */
START_TEST(nonfinite_push_judged_and_logged) {
  uint64_t mine[3] = {shard0_id(0), shard0_id(1), shard0_id(2)};
  float g[6] = {1, 2, NAN, 4, 5, 6};
  char want[256];
  struct held before, after;
  Psd__V1__SparsePushRequest r = PSD__V1__SPARSE_PUSH_REQUEST__INIT;
  hold(&before, mine);
  logged[0] = 0;
  cm_log_set_sink(keep_line, NULL);
  snprintf(want, sizeof want,
           "SparsePush 'emb': the gradient of id %llu holds NaN "
           "(job.nonfinite is \"reject\": nothing applied)",
           (unsigned long long)mine[1]);
  call(PUSH, sparse_push_req(&r, "emb", mine, 3, g, 6),
       GRPC_STATUS_INVALID_ARGUMENT, want);
  psd_service_set_limits(svc,
                         &(struct psd_limits){.max_message = 64 << 20,
                                              .nonfinite = PSD_NONFINITE_SKIP});
  logged[0] = 0;
  push_version(sparse_push_req(&r, "emb", mine, 3, g, 6));
  snprintf(want, sizeof want,
           ": SparsePush 'emb': the gradient of id %llu holds NaN; "
           "job.nonfinite is \"skip\" (2 such pushes so far)",
           (unsigned long long)mine[1]);
  assert_logged("skipped a push from ");
  assert_logged(want);
  hold(&after, mine);
  same(&before, &after); /* skipped: the rows and counters as they were */
  g[2] = 3;
  g[5] = -INFINITY;
  psd_service_set_limits(
      svc, &(struct psd_limits){.max_message = 64 << 20,
                                .nonfinite = PSD_NONFINITE_APPLY});
  logged[0] = 0;
  push_version(sparse_push_req(&r, "emb", mine, 3, g, 6));
  snprintf(want, sizeof want,
           ": SparsePush 'emb': the gradient of id %llu holds an infinity; "
           "job.nonfinite is \"apply\" (3 such pushes so far)",
           (unsigned long long)mine[2]);
  assert_logged("applied a push from ");
  assert_logged(want);
  cm_log_set_sink(NULL, NULL);
  Psd__V1__StatusResponse *st = status();
  ck_assert_uint_eq(st->nonfinite_pushes, 3);
  ck_assert_str_eq(st->nonfinite, "apply");
  psd__v1__status_response__free_unpacked(st, NULL);
  hold(&after, mine); /* the one applied is counted */
  ck_assert_uint_eq(after.c.bytes_in, before.c.bytes_in + sizeof g);
}
END_TEST

/* Sync: a push for a step beyond this shard's is refused
 * (FAILED_PRECONDITION); after the shard resumed from a checkpoint, one
 * beyond it is UNAVAILABLE, retried until the coordinator rolls the job
 * back to that checkpoint, as a dense push's (service_push.c). Nothing is
 * staged either way. */
START_TEST(sync_push_beyond_a_resumed_shard_is_retried) {
  uint64_t ids[1] = {shard0_id(0)};
  float g[2] = {1, 2};
  Psd__V1__SparsePushRequest r = PSD__V1__SPARSE_PUSH_REQUEST__INIT;
  r.step = 5;
  call(PUSH, sparse_push_req(&r, "emb", ids, 1, g, 2),
       GRPC_STATUS_FAILED_PRECONDITION,
       "SparsePush 'emb': step 5 is not open on shard 0 (it has committed 0 "
       "steps)");
  psd_steps_resume(psd_service_steps(svc), 3);
  call(PUSH, sparse_push_req(&r, "emb", ids, 1, g, 2), GRPC_STATUS_UNAVAILABLE,
       "SparsePush 'emb': step 5 is not open on shard 0 (it has committed 3 "
       "steps)");
  r.step = 3;
  ck_assert_uint_eq(push_version(sparse_push_req(&r, "emb", ids, 1, g, 2)), 3);
}
END_TEST

static Suite *sparse_suite(void) {
  Suite *s = suite_create("sparse");
  const char *modes[2] = {"async", "sync"};
  for (int i = 0; i < 2; i++) {
    TCase *tc = service_tcase(s, modes[i]);
    tcase_add_test(tc, empty_push_changes_nothing);
    tcase_add_test(tc, empty_pull_is_an_empty_answer);
    tcase_add_test(tc, push_checks_before_applying);
    tcase_add_test(tc, nonfinite_push_judged_and_logged);
    if (i == 1)
      tcase_add_test(tc, sync_push_beyond_a_resumed_shard_is_retried);
  }
  return s;
}

int main(void) { return tu_run(sparse_suite(), 0); }
