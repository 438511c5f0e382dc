/* Unit tests for psd.v1.Data/SparsePull and Data/SparsePush
 * (ps-server/psd/shard/service_sparse.c; a push goes through service_push.c's
 * pipeline, as a dense one does) and their table (table.c): a push with
 * no ids is answered OK and changes nothing (once it killed the shard), one
 * with no ids but gradient bytes is refused naming the table; a push's
 * ids and widths are checked before anything is applied; a gradient with NaN
 * or an infinity is judged, logged and counted as a dense push's is; an
 * empty pull is an empty answer. Async and sync. Sync: a push for a step
 * beyond a shard that resumed from its checkpoint is retried (UNAVAILABLE),
 * as a dense push's. A live move of buckets (service_move.c, reshard/move.c):
 * MoveRows' refusals; copies, a delta and the hand-over installed on a
 * destination equal the source's rows bit for bit (values, state, stats);
 * after the hand-over the source holds none of them and refuses their
 * pushes and pulls "layout moved: ...", and owns them again when told to.
 * The shard and the calls are service_fixture.h's. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <unistd.h>

#include "err.h"
#include "layout.h"
#include "log.h"
#include "move.h"
#include "ps.pb-c.h"
#include "request.h"
#include "rpc.h"
#include "rpc_server.h"
#include "service.h"
#include "service_fixture.h"
#include "steps.h"
#include "table.h"
#include "tables.h"
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

#define MOVE "/psd.v1.Admin/MoveRows"

/* A MoveRows request. */
/* A MoveRows request from destination ps:dest - 1 (0: not said). */
static grpc_byte_buffer *move_req_from(Psd__V1__MovePhase phase, uint64_t move,
                                       const uint8_t *set, size_t len,
                                       int move_to, int moved, int dest) {
  Psd__V1__MoveRowsRequest r = PSD__V1__MOVE_ROWS_REQUEST__INIT;
  r.caller = &caller;
  r.buckets = (ProtobufCBinaryData){len, (uint8_t *)set};
  r.phase = phase;
  r.move = move;
  r.move_to = (uint32_t)move_to;
  r.moved = (uint32_t)moved;
  r.destination = (uint32_t)dest;
  return cm_rpc_pack(&r.base);
}

static grpc_byte_buffer *move_req(Psd__V1__MovePhase phase, uint64_t move,
                                  const uint8_t *set, size_t len, int move_to,
                                  int moved) {
  return move_req_from(phase, move, set, len, move_to, moved, 0);
}

/* A MoveRows call of destination dest (as move_req_from) that the source
 * answers from its thread: waits for the answer, checks it is OK and
 * returns it unpacked. */
static Psd__V1__MoveRowsResponse *move_rows_from(Psd__V1__MovePhase phase,
                                                 uint64_t move,
                                                 const uint8_t *set, int dest) {
  struct cm_rpc_answer ans;
  grpc_byte_buffer *bb =
      move_req_from(phase, move, set, PSD_MOVE_SET_BYTES, 3, 7, dest);
  uint8_t *data;
  size_t len;
  ck_assert_int_eq(cm_rpc_call_local(method(MOVE), bb, &ans), 0);
  grpc_byte_buffer_destroy(bb);
  for (int i = 0;
       i < 30000 && !__atomic_load_n(&ans.answered, __ATOMIC_ACQUIRE); i++)
    usleep(1000); /* the thread's answer, polled */
  ck_assert_msg(ans.answered, "MoveRows: no answer in 30 s");
  ck_assert_msg(ans.status == GRPC_STATUS_OK, "MoveRows: %s (%s)",
                cm_rpc_status_name(ans.status), ans.details);
  ck_assert_int_eq(cm_rpc_readall(ans.response, &data, &len), 0);
  Psd__V1__MoveRowsResponse *r =
      psd__v1__move_rows_response__unpack(NULL, len, data);
  ck_assert_ptr_nonnull(r);
  free(data);
  cm_rpc_answer_release(&ans);
  return r;
}

static Psd__V1__MoveRowsResponse *move_rows(Psd__V1__MovePhase phase,
                                            uint64_t move, const uint8_t *set) {
  return move_rows_from(phase, move, set, 0);
}

/* Pushes gradient rows of (k + 1 + i) / 4 to ids[0..n) (n <= 8) of a
 * table of dim 2. */
static void push_rows(const char *table, const uint64_t *ids, size_t n, int k) {
  float g[16];
  Psd__V1__SparsePushRequest r = PSD__V1__SPARSE_PUSH_REQUEST__INIT;
  for (size_t i = 0; i < 2 * n; i++)
    g[i] = (float)(k + 1 + (int)i) / 4;
  push_version(sparse_push_req(&r, table, ids, n, g, 2 * n));
}

/* One row of a table, as psd_table_get reads it. */
struct row {
  int rc;                  /* 0 or CM_ENOENT */
  float v[8];              /* value then state */
  struct psd_row_stats st; /* statistics */
};

static struct row get_row(struct psd_table *t, uint64_t id) {
  struct row r;
  memset(&r, 0, sizeof r);
  r.rc = psd_table_get(t, id, r.v, r.v + psd_table_conf(t)->dim, &r.st);
  return r;
}

START_TEST(move_copies_hands_over_and_gates) {
  static struct cm_request_self self = {
      .shard = 0, .nshards = 2, .layout = 4, .rows = CM_LAYOUT_RULE_BUCKETS};
  psd_service_set_self(svc, &self);
  struct psd_tables *src = psd_service_tables(svc), *dst;
  struct cm_table_conf confs[2];
  char err[300];
  for (int i = 0; i < 2; i++)
    confs[i] = *psd_table_conf(psd_tables_at(src, i));
  ck_assert_int_eq(psd_tables_new(&dst, confs, 2, NULL, 0, err, sizeof err), 0);
  /* The set: every other bucket of shard 0's; ids in it and out of it,
   * below adm's bound (adm: adagrad, so rows have state). */
  struct cm_layout_map map;
  uint8_t set[PSD_MOVE_SET_BYTES] = {0};
  cm_layout_map_init(&map, CM_LAYOUT_RULE_BUCKETS, 2);
  for (unsigned b = 0, k = 0; b < CM_LAYOUT_BUCKETS; b++)
    if (map.shard[b] == 0 && k++ % 2 == 0)
      set[b >> 3] |= (uint8_t)(1u << (b & 7));
  uint64_t in[8], out[4];
  size_t nin = 0, nout = 0;
  for (uint64_t id = 1; id < 1000 && (nin < 8 || nout < 4); id++) {
    unsigned b = cm_layout_bucket(cm_layout_id_hash(id));
    if (map.shard[b] != 0)
      continue;
    if (set[b >> 3] >> (b & 7) & 1) {
      if (nin < 8)
        in[nin++] = id;
    } else if (nout < 4) {
      out[nout++] = id;
    }
  }
  ck_assert_uint_eq(nin, 8);
  ck_assert_uint_eq(nout, 4);
  static const char *const names[] = {"emb", "adm"};
  for (int k = 0; k < 3; k++) /* adm admits after 2 pushes */
    for (int t = 0; t < 2; t++) {
      push_rows(names[t], in, 6, k);
      push_rows(names[t], out, 4, k);
    }
  /* Refusals, changing nothing. */
  call(MOVE, move_req(PSD__V1__MOVE_PHASE__MOVE_COPY, 1, set, 3, 0, 0),
       GRPC_STATUS_INVALID_ARGUMENT, "buckets holds 3 bytes; a set of 4096");
  uint8_t theirs[PSD_MOVE_SET_BYTES] = {0};
  unsigned other = 0;
  while (map.shard[other] != 1)
    other++;
  theirs[other >> 3] |= (uint8_t)(1u << (other & 7));
  char want[300];
  snprintf(want, sizeof want, "ps:0 does not own bucket %u", other);
  call(MOVE,
       move_req(PSD__V1__MOVE_PHASE__MOVE_COPY, 1, theirs, sizeof theirs, 0, 0),
       GRPC_STATUS_FAILED_PRECONDITION, want);
  call(MOVE,
       move_req(PSD__V1__MOVE_PHASE__MOVE_HANDOVER, 1, set, sizeof set, 0, 0),
       GRPC_STATUS_FAILED_PRECONDITION, "serves no move 1");
  /* The first copy: every row of the set, installed on the destination. */
  uint64_t rows = 0;
  Psd__V1__MoveRowsResponse *r =
      move_rows(PSD__V1__MOVE_PHASE__MOVE_COPY, 42, set);
  ck_assert_uint_eq(r->n_tables, 2);
  ck_assert(!r->tables[0]->delta);
  ck_assert_uint_eq(r->tables[0]->nrows, 6);
  ck_assert_int_eq(psd_move_install(dst, r, set, &rows, err, sizeof err), 0);
  psd__v1__move_rows_response__free_unpacked(r, NULL);
  /* Another move while this one runs. */
  call(MOVE,
       move_req(PSD__V1__MOVE_PHASE__MOVE_COPY, 43, set, sizeof set, 0, 0),
       GRPC_STATUS_ABORTED, "ps:0 is the source of move 42; move 43 waits");
  /* Changes meanwhile: a delta of them alone. */
  push_rows("emb", in + 6, 2, 5);
  push_rows("adm", in, 1, 5);
  r = move_rows(PSD__V1__MOVE_PHASE__MOVE_COPY, 42, set);
  ck_assert(r->tables[0]->delta);
  ck_assert_uint_eq(r->tables[0]->nrows, 2);
  ck_assert_uint_eq(r->tables[1]->nrows, 1);
  ck_assert_int_eq(psd_move_install(dst, r, set, &rows, err, sizeof err), 0);
  psd__v1__move_rows_response__free_unpacked(r, NULL);
  push_rows("emb", in, 1, 6); /* in the hand-over's last delta */
  struct row before[2][8];
  for (int t = 0; t < 2; t++)
    for (size_t i = 0; i < nin; i++)
      before[t][i] = get_row(psd_tables_at(src, t), in[i]);
  r = move_rows(PSD__V1__MOVE_PHASE__MOVE_HANDOVER, 42, set);
  ck_assert_uint_eq(r->tables[0]->nrows, 1);
  ck_assert_int_eq(psd_move_install(dst, r, set, &rows, err, sizeof err), 0);
  psd__v1__move_rows_response__free_unpacked(r, NULL);
  /* Handed over: refused here, the rows kept until MOVE_DONE, which alone
   * follows (a copy or a second hand-over is refused). */
  call(PULL, sparse_pull_req("emb", in, 1, 0), GRPC_STATUS_FAILED_PRECONDITION,
       "layout moved: ");
  ck_assert_int_eq(get_row(psd_tables_at(src, 0), in[0]).rc, 0);
  call(MOVE,
       move_req(PSD__V1__MOVE_PHASE__MOVE_COPY, 42, set, sizeof set, 3, 7),
       GRPC_STATUS_FAILED_PRECONDITION, "what follows is MOVE_DONE");
  call(MOVE,
       move_req(PSD__V1__MOVE_PHASE__MOVE_DONE, 41, set, sizeof set, 3, 7),
       GRPC_STATUS_ABORTED, "ps:0 is the source of move 42");
  r = move_rows(PSD__V1__MOVE_PHASE__MOVE_DONE, 42, set);
  ck_assert_uint_eq(r->n_tables, 0);
  psd__v1__move_rows_response__free_unpacked(r, NULL);
  /* Asked again (an answer lost): the move just ended is done. */
  psd__v1__move_rows_response__free_unpacked(
      move_rows(PSD__V1__MOVE_PHASE__MOVE_DONE, 42, set), NULL);
  call(MOVE,
       move_req(PSD__V1__MOVE_PHASE__MOVE_DONE, 40, set, sizeof set, 3, 7),
       GRPC_STATUS_FAILED_PRECONDITION, "no hand-over of move 40 to finish");
  /* The destination equals what the source held, bit for bit; the source
   * holds none of it now. */
  for (int t = 0; t < 2; t++)
    for (size_t i = 0; i < nin; i++) {
      struct row a = before[t][i], b = get_row(psd_tables_at(dst, t), in[i]);
      ck_assert_int_eq(a.rc, b.rc);
      ck_assert_mem_eq(a.v, b.v, sizeof a.v);
      ck_assert_uint_eq(a.st.count, b.st.count);
      ck_assert_uint_eq(a.st.t, b.st.t);
      ck_assert_uint_eq(a.st.last_step, b.st.last_step);
      ck_assert_int_eq(get_row(psd_tables_at(src, t), in[i]).rc, CM_ENOENT);
    }
  ck_assert_int_eq(before[1][0].rc, 0); /* adm's rows were admitted */
  ck_assert_int_eq(get_row(psd_tables_at(dst, 0), out[0]).rc, CM_ENOENT);
  ck_assert_int_eq(get_row(psd_tables_at(src, 0), out[0]).rc, 0);
  /* The gate: a push or pull naming a moved bucket is refused whole. */
  float g[4] = {1, 1, 1, 1};
  uint64_t mixed[2] = {out[0], in[3]};
  unsigned b3 = cm_layout_bucket(cm_layout_id_hash(in[3]));
  Psd__V1__SparsePushRequest pr = PSD__V1__SPARSE_PUSH_REQUEST__INIT;
  snprintf(want, sizeof want,
           "layout moved: ps:0 holds layout 4 of 2 shards, rows by buckets, "
           "moving to 3 shards after 7 moves; bucket %u (table 'emb' row "
           "%llu) is no longer here; the client re-plans and calls again",
           b3, (unsigned long long)in[3]);
  struct row o0 = get_row(psd_tables_at(src, 0), out[0]);
  call(PUSH, sparse_push_req(&pr, "emb", mixed, 2, g, 4),
       GRPC_STATUS_FAILED_PRECONDITION, want);
  call(PULL, sparse_pull_req("emb", in + 3, 1, 0),
       GRPC_STATUS_FAILED_PRECONDITION, "layout moved: ");
  struct row o1 = get_row(psd_tables_at(src, 0), out[0]);
  ck_assert_mem_eq(o0.v, o1.v, sizeof o0.v); /* nothing of it applied */
  ck_assert_int_eq(get_row(psd_tables_at(src, 0), in[3]).rc, CM_ENOENT);
  push_rows("emb", out, 4, 9); /* the buckets it keeps train on */
  Psd__V1__StatusResponse *st = status();
  ck_assert_uint_eq(st->move_to, 3);
  ck_assert_uint_eq(st->moved, 7);
  ck_assert_uint_eq(st->buckets_owned, CM_LAYOUT_BUCKETS / 4);
  psd__v1__status_response__free_unpacked(st, NULL);
  /* A hand-over cancelled (the destination could not own the buckets):
   * this shard owns them again with every row as it was. */
  uint8_t set2[PSD_MOVE_SET_BYTES] = {0};
  unsigned b0 = cm_layout_bucket(cm_layout_id_hash(out[0]));
  set2[b0 >> 3] |= (uint8_t)(1u << (b0 & 7));
  struct row k0 = get_row(psd_tables_at(src, 0), out[0]);
  psd__v1__move_rows_response__free_unpacked(
      move_rows(PSD__V1__MOVE_PHASE__MOVE_COPY, 44, set2), NULL);
  psd__v1__move_rows_response__free_unpacked(
      move_rows(PSD__V1__MOVE_PHASE__MOVE_HANDOVER, 44, set2), NULL);
  call(PULL, sparse_pull_req("emb", out, 1, 0), GRPC_STATUS_FAILED_PRECONDITION,
       "layout moved: ");
  psd__v1__move_rows_response__free_unpacked(
      move_rows(PSD__V1__MOVE_PHASE__MOVE_CANCEL, 44, set2), NULL);
  struct row k1 = get_row(psd_tables_at(src, 0), out[0]);
  ck_assert_int_eq(k1.rc, 0);
  ck_assert_mem_eq(k0.v, k1.v, sizeof k0.v);
  push_rows("emb", out, 1, 2); /* served again */
  /* Owned again (a destination's end of a move): served again. */
  psd_service_own(svc, set, 0, 0);
  push_rows("emb", in + 3, 1, 1);
  ck_assert_int_eq(get_row(psd_tables_at(src, 0), in[3]).rc, 0);
  psd_tables_free(dst);
  psd_service_set_self(svc, NULL);
}
END_TEST

/* A move whose destination's process was lost: the destination started
 * again tells the source (MOVE_CANCEL of move 0 naming it, with the moves
 * on its disk), which cancels the move, owning the buckets again after a
 * hand-over too, or ends it as MOVE_DONE does when those moves hold it;
 * the destination's MOVE_COPY of another move cancels an open one not
 * handed over; another destination's is refused. */
START_TEST(move_lost_with_its_destination_is_ended) {
  static struct cm_request_self self = {
      .shard = 0, .nshards = 2, .layout = 4, .rows = CM_LAYOUT_RULE_BUCKETS};
  psd_service_set_self(svc, &self);
  struct psd_tables *src = psd_service_tables(svc);
  struct cm_layout_map map;
  cm_layout_map_init(&map, CM_LAYOUT_RULE_BUCKETS, 2);
  uint64_t id = 1;
  while (map.shard[cm_layout_bucket(cm_layout_id_hash(id))] != 0)
    id++;
  unsigned b = cm_layout_bucket(cm_layout_id_hash(id));
  uint8_t set[PSD_MOVE_SET_BYTES] = {0}, none[PSD_MOVE_SET_BYTES] = {0};
  set[b >> 3] |= (uint8_t)(1u << (b & 7));
  push_rows("emb", &id, 1, 1);
  struct row k0 = get_row(psd_tables_at(src, 0), id);
  ck_assert_int_eq(k0.rc, 0);
  /* Handed over to ps:2 (destination 3), which then starts again with 6
   * moves on its disk: the move (the 7th) was lost, the bucket is owned
   * here again with its row. */
  psd__v1__move_rows_response__free_unpacked(
      move_rows_from(PSD__V1__MOVE_PHASE__MOVE_COPY, 50, set, 3), NULL);
  psd__v1__move_rows_response__free_unpacked(
      move_rows_from(PSD__V1__MOVE_PHASE__MOVE_HANDOVER, 50, set, 3), NULL);
  call(PULL, sparse_pull_req("emb", &id, 1, 0), GRPC_STATUS_FAILED_PRECONDITION,
       "layout moved: ");
  call(MOVE,
       move_req_from(PSD__V1__MOVE_PHASE__MOVE_CANCEL, 0, none, sizeof none, 3,
                     6, 1),
       GRPC_STATUS_OK, NULL); /* another destination's: nothing of it */
  call(PULL, sparse_pull_req("emb", &id, 1, 0), GRPC_STATUS_FAILED_PRECONDITION,
       "layout moved: ");
  call(MOVE,
       move_req_from(PSD__V1__MOVE_PHASE__MOVE_CANCEL, 0, none, sizeof none, 3,
                     6, 3),
       GRPC_STATUS_OK, NULL);
  call(PULL, sparse_pull_req("emb", &id, 1, 0), GRPC_STATUS_OK, NULL);
  struct row k1 = get_row(psd_tables_at(src, 0), id);
  ck_assert_int_eq(k1.rc, 0);
  ck_assert_mem_eq(k0.v, k1.v, sizeof k0.v);
  /* Again, and it starts again with the move's 7 on its disk (its move
   * file): ended as MOVE_DONE ends it, the row dropped, 7 moves adopted. */
  psd__v1__move_rows_response__free_unpacked(
      move_rows_from(PSD__V1__MOVE_PHASE__MOVE_COPY, 51, set, 3), NULL);
  psd__v1__move_rows_response__free_unpacked(
      move_rows_from(PSD__V1__MOVE_PHASE__MOVE_HANDOVER, 51, set, 3), NULL);
  call(MOVE,
       move_req_from(PSD__V1__MOVE_PHASE__MOVE_CANCEL, 0, none, sizeof none, 3,
                     7, 3),
       GRPC_STATUS_OK, NULL);
  ck_assert_int_eq(get_row(psd_tables_at(src, 0), id).rc, CM_ENOENT);
  Psd__V1__StatusResponse *st = status();
  ck_assert_uint_eq(st->moved, 7);
  psd__v1__status_response__free_unpacked(st, NULL);
  psd_service_own(svc, set, 0, 0); /* back, for what follows */
  push_rows("emb", &id, 1, 2);
  /* Copied, not handed over: the same destination's next move cancels
   * it; another destination's is refused while one is open. */
  psd__v1__move_rows_response__free_unpacked(
      move_rows_from(PSD__V1__MOVE_PHASE__MOVE_COPY, 52, set, 3), NULL);
  call(MOVE,
       move_req_from(PSD__V1__MOVE_PHASE__MOVE_COPY, 53, set, sizeof set, 3, 7,
                     2),
       GRPC_STATUS_ABORTED, "ps:0 is the source of move 52");
  psd__v1__move_rows_response__free_unpacked(
      move_rows_from(PSD__V1__MOVE_PHASE__MOVE_COPY, 54, set, 3), NULL);
  psd__v1__move_rows_response__free_unpacked(
      move_rows_from(PSD__V1__MOVE_PHASE__MOVE_CANCEL, 54, set, 3), NULL);
  call(PULL, sparse_pull_req("emb", &id, 1, 0), GRPC_STATUS_OK, NULL);
  psd_service_set_self(svc, NULL);
}
END_TEST

/* Sync jobs move by psctl reshard's stop and cut. */
START_TEST(move_refused_in_sync_mode) {
  uint8_t set[PSD_MOVE_SET_BYTES] = {1};
  call(MOVE, move_req(PSD__V1__MOVE_PHASE__MOVE_COPY, 1, set, sizeof set, 0, 0),
       GRPC_STATUS_FAILED_PRECONDITION,
       "MoveRows: live bucket moves need an async job (job.sync.mode async); "
       "psctl reshard stops and cuts sync jobs");
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
    tcase_add_test(tc, i == 0 ? move_copies_hands_over_and_gates
                              : move_refused_in_sync_mode);
    if (i == 0)
      tcase_add_test(tc, move_lost_with_its_destination_is_ended);
  }
  return s;
}

int main(void) { return tu_run(sparse_suite(), 0); }
