/* Every field of every call, absent or empty (ps-server/psd/shard/service*.c,
 * coord_barrier.c, saver.c): for each rpc of proto/ps.proto (the three
 * services' descriptors, so a new call without a request here fails) a valid
 * request is taken apart one field at a time, and each variant is sent to a
 * fresh shard that holds variables, table rows, a staged or applied push and
 * a joined worker. Each answer must be a known status, an error must carry a
 * message, and a refused call must leave the shard as it was (values, rows,
 * versions, tables, workers, counters of applied work). A parked call
 * (Admit, Clock) must be answered when the shard stops.
 *
 * The variants are made on the encoded request from the request message's
 * descriptor (pbvariants.h), so a field added to the proto is taken apart
 * with the rest without a change here. The emptiest request that names its
 * caller must change nothing even when answered OK (but for Join and
 * Commit, whose zero values are real calls). The shard and the calls are
 * service_fixture.h's; async and sync. */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layout.h"
#include "log.h"
#include "pbvariants.h"
#include "ps.pb-c.h"
#include "rpc.h"
#include "rpc_server.h"
#include "service.h"
#include "service_fixture.h"
#include "steps.h"
#include "unit.h"

/* ---- the shard before each call, and what it holds ---- */

#define DECLARE "/psd.v1.Data/Declare"
static int64_t shape_w[2] = {4, 2}, shape_b[1] = {3};
static float grad[4] = {1, -2, 0.5f, 4};

/* What every variant finds: w (split, shard 0 has elements [0, 4)) and b
 * (whole here), a push of w (applied, or staged for step 0 by worker 0),
 * rows of emb and a pending id of adm (pushed once of the two admission
 * needs), worker 0 joined. */
static void prepare(void) {
  uint64_t ids[2] = {shard0_id(0), shard0_id(1)};
  declare("w", 2, shape_w);
  call(DECLARE, declare_req("b", 1, shape_b, 0), GRPC_STATUS_OK, NULL);
  Psd__V1__PushRequest pr = PSD__V1__PUSH_REQUEST__INIT;
  Psd__V1__Segment s = seg("w", 0, 4, 2, shape_w);
  pr.examples = 1;
  pr.has_worker = 1;
  call("/psd.v1.Data/Push", push_req(&pr, &s, 1, grad, 4), GRPC_STATUS_OK,
       NULL);
  Psd__V1__SparsePushRequest sp = PSD__V1__SPARSE_PUSH_REQUEST__INIT;
  call("/psd.v1.Data/SparsePush", sparse_push_req(&sp, "emb", ids, 2, grad, 4),
       GRPC_STATUS_OK, NULL);
  Psd__V1__SparsePushRequest sa = PSD__V1__SPARSE_PUSH_REQUEST__INIT;
  call("/psd.v1.Data/SparsePush", sparse_push_req(&sa, "adm", ids, 1, grad, 2),
       GRPC_STATUS_OK, NULL);
  Psd__V1__JoinRequest j = PSD__V1__JOIN_REQUEST__INIT;
  j.caller = &caller;
  call("/psd.v1.Coord/Join", cm_rpc_pack(&j.base), GRPC_STATUS_OK, NULL);
}

#define PUTF(...)                                                              \
  do {                                                                         \
    size_t used_ = strlen(fp);                                                 \
    snprintf(fp + used_, len - used_, __VA_ARGS__);                            \
  } while (0)

/* What the shard holds that a refused call must not change, as text:
 * values and rows, versions, variables, tables, workers, steps and the
 * counters of applied work (not those of calls answered or refused). */
static void fingerprint(char *fp, size_t len) {
  uint64_t ids[2] = {shard0_id(0), shard0_id(1)};
  float w[4], b[3], emb[4], adm[4];
  fp[0] = 0;
  pull_values("w", 0, 4, w);
  pull_values("b", 0, 3, b);
  pull_rows("emb", ids, 2, emb);
  pull_rows("adm", ids, 2, adm);
  PUTF("w %a %a %a %a b %a %a %a\n", w[0], w[1], w[2], w[3], b[0], b[1], b[2]);
  PUTF("emb %a %a %a %a adm %a %a %a %a\n", emb[0], emb[1], emb[2], emb[3],
       adm[0], adm[1], adm[2], adm[3]);
  Psd__V1__StatusResponse *st = status();
  PUTF("step %llu pushes %llu examples %llu in %llu nonfinite %llu dup %llu "
       "clients %u rollbacks %llu at %llu\n",
       (unsigned long long)st->step, (unsigned long long)st->pushes,
       (unsigned long long)st->examples, (unsigned long long)st->bytes_in,
       (unsigned long long)st->nonfinite_pushes,
       (unsigned long long)st->duplicates, st->dedup_clients,
       (unsigned long long)st->rollbacks,
       (unsigned long long)st->rollback_step);
  for (size_t i = 0; i < st->n_vars; i++)
    PUTF("var %s v%llu rows [%lld, %lld) %s\n", st->vars[i]->name,
         (unsigned long long)st->vars[i]->version,
         (long long)st->vars[i]->row_begin, (long long)st->vars[i]->row_end,
         st->vars[i]->optimizer);
  for (size_t i = 0; i < st->n_tables; i++) {
    Psd__V1__TableStatus *t = st->tables[i];
    PUTF("table %s dim %u bound %llu rows %llu pending %llu admitted %llu "
         "evicted %llu pushed %llu\n",
         t->name, t->dim, (unsigned long long)t->id_bound,
         (unsigned long long)t->rows, (unsigned long long)t->pending,
         (unsigned long long)t->admitted, (unsigned long long)t->evicted,
         (unsigned long long)t->rows_pushed);
  }
  for (size_t i = 0; i < st->n_workers; i++) {
    Psd__V1__WorkerStatus *w = st->workers[i];
    PUTF("worker %d live %d joined %d joins %u left %d applied %llu dropped "
         "%llu clock %llu pushes %llu last %llu\n",
         w->worker, w->live, w->joined, w->joins, w->left,
         (unsigned long long)w->applied, (unsigned long long)w->dropped,
         (unsigned long long)w->clock, (unsigned long long)w->pushes,
         (unsigned long long)w->last_step);
  }
  if (st->checkpoint)
    PUTF("checkpoints %llu failed %llu\n",
         (unsigned long long)st->checkpoint->written,
         (unsigned long long)st->checkpoint->failed);
  psd__v1__status_response__free_unpacked(st, NULL);
  if (psd_service_steps(svc)) {
    struct psd_steps_state ss;
    psd_steps_state(psd_service_steps(svc), &ss);
    PUTF("version %llu gen %llu\n", (unsigned long long)ss.version,
         (unsigned long long)ss.gen);
  }
}

/* ---- a valid request of each call ---- */

/* Packs m into b. */
static void pack(const ProtobufCMessage *m, struct tu_buf *b) {
  memset(b, 0, sizeof *b);
  b->cap = protobuf_c_message_get_packed_size(m) + 1;
  b->p = malloc(b->cap);
  ck_assert_ptr_nonnull(b->p);
  b->n = protobuf_c_message_pack(m, b->p);
}

/* Declare: w again as it is, a new variable with every field set, the
 * spec's table emb and a new one. */
static void req_declare(struct tu_buf *b) {
  Psd__V1__DeclareRequest r = PSD__V1__DECLARE_REQUEST__INIT;
  Psd__V1__VarSpec w = PSD__V1__VAR_SPEC__INIT, v = PSD__V1__VAR_SPEC__INIT;
  Psd__V1__VarSpec *vars[2] = {&w, &v};
  Psd__V1__TableSpec e = PSD__V1__TABLE_SPEC__INIT,
                     t = PSD__V1__TABLE_SPEC__INIT;
  Psd__V1__TableSpec *tabs[2] = {&e, &t};
  int64_t shape_v[2] = {6, 3};
  w.name = "w";
  w.n_shape = 2;
  w.shape = shape_w;
  w.placement = -1;
  v.name = "v";
  v.n_shape = 2;
  v.shape = shape_v;
  v.placement = 0;
  v.init = PSD__V1__INIT__INIT_UNIFORM;
  v.init_scale = 0.25f;
  v.seed = 11;
  v.optimizer = "{\"type\": \"momentum\", \"lr\": 0.1}";
  e.name = "emb";
  e.dim = 2;
  t.name = "more";
  t.dim = 3;
  t.id_bound = 100;
  r.caller = &caller;
  r.n_vars = 2;
  r.vars = vars;
  r.n_tables = 2;
  r.tables = tabs;
  pack(&r.base, b);
}

static void req_pull(struct tu_buf *b) {
  Psd__V1__PullRequest r = PSD__V1__PULL_REQUEST__INIT;
  Psd__V1__Segment s = seg("w", 1, 3, 0, NULL), *sp[1] = {&s};
  r.caller = &caller;
  r.n_segments = 1;
  r.segments = sp;
  r.max_answer_bytes = 1 << 20;
  pack(&r.base, b);
}

static void req_push(struct tu_buf *b) {
  Psd__V1__PushRequest r = PSD__V1__PUSH_REQUEST__INIT;
  Psd__V1__Segment s = seg("w", 0, 4, 2, shape_w), *sp[1] = {&s};
  r.caller = &caller;
  r.n_segments = 1;
  r.segments = sp;
  r.examples = 8;
  r.worker = 1;
  r.has_worker = 1;
  r.first = 1;
  r.client_id = 5;
  r.seq = 1;
  r.chunk = 2;
  r.data.len = sizeof grad;
  r.data.data = (uint8_t *)grad;
  pack(&r.base, b);
}

static void req_commit(struct tu_buf *b) {
  Psd__V1__CommitRequest r = PSD__V1__COMMIT_REQUEST__INIT;
  int32_t applied[1] = {0}, dropped[1] = {1};
  r.caller = &caller;
  r.n_applied = 1;
  r.applied = applied;
  r.n_dropped = 1;
  r.dropped = dropped;
  pack(&r.base, b);
}

static void req_rollback(struct tu_buf *b) {
  Psd__V1__RollbackRequest r = PSD__V1__ROLLBACK_REQUEST__INIT;
  r.caller = &caller;
  r.gen = 1;
  pack(&r.base, b);
}

/* The ids of shard 0 these requests name, u64 little-endian. */
static uint64_t some_ids[3];

static void req_sparse_pull(struct tu_buf *b) {
  Psd__V1__SparsePullRequest r = PSD__V1__SPARSE_PULL_REQUEST__INIT;
  r.caller = &caller;
  r.table = "emb";
  r.max_answer_bytes = 1 << 20;
  r.ids.data = (uint8_t *)some_ids;
  r.ids.len = sizeof some_ids;
  pack(&r.base, b);
}

static void req_sparse_push(struct tu_buf *b) {
  Psd__V1__SparsePushRequest r = PSD__V1__SPARSE_PUSH_REQUEST__INIT;
  r.caller = &caller;
  r.table = "emb";
  r.examples = 4;
  r.worker = 1;
  r.has_worker = 1;
  r.client_id = 6;
  r.seq = 1;
  r.chunk = 1;
  r.ids.data = (uint8_t *)some_ids;
  r.ids.len = 2 * sizeof *some_ids;
  r.data.data = (uint8_t *)grad;
  r.data.len = sizeof grad;
  pack(&r.base, b);
}

static void req_join(struct tu_buf *b) {
  Psd__V1__JoinRequest r = PSD__V1__JOIN_REQUEST__INIT;
  r.caller = &caller;
  r.worker = 1;
  pack(&r.base, b);
}

/* Worker 0 leaves, saying what it did. */
static void req_leave(struct tu_buf *b) {
  Psd__V1__JoinRequest r = PSD__V1__JOIN_REQUEST__INIT;
  r.caller = &caller;
  r.leave = 1;
  r.examples = 100;
  r.train_s = 2.5;
  r.ended_s_ago = 0.5;
  pack(&r.base, b);
}

static void req_heartbeat(struct tu_buf *b) {
  Psd__V1__HeartbeatRequest r = PSD__V1__HEARTBEAT_REQUEST__INIT;
  r.caller = &caller;
  r.worker = 1;
  pack(&r.base, b);
}

static void req_admit(struct tu_buf *b) {
  Psd__V1__AdmitRequest r = PSD__V1__ADMIT_REQUEST__INIT;
  r.caller = &caller;
  r.worker = 1;
  r.gen = 0;
  pack(&r.base, b);
}

static void req_clock(struct tu_buf *b) {
  Psd__V1__ClockRequest r = PSD__V1__CLOCK_REQUEST__INIT;
  r.caller = &caller;
  r.worker = 1;
  r.clock = 1;
  pack(&r.base, b);
}

static void req_status(struct tu_buf *b) {
  Psd__V1__StatusRequest r = PSD__V1__STATUS_REQUEST__INIT;
  r.caller = &caller;
  pack(&r.base, b);
}

static void req_checkpoint(struct tu_buf *b) {
  Psd__V1__CheckpointRequest r = PSD__V1__CHECKPOINT_REQUEST__INIT;
  r.caller = &caller;
  r.wait = 1;
  r.job = 1;
  r.at_step = 1;
  pack(&r.base, b);
}

static void req_rows(struct tu_buf *b) {
  Psd__V1__RowsRequest r = PSD__V1__ROWS_REQUEST__INIT;
  r.caller = &caller;
  r.table = "adm";
  r.n_ids = 2;
  r.ids = some_ids;
  pack(&r.base, b);
}

static void req_top(struct tu_buf *b) {
  Psd__V1__RowsRequest r = PSD__V1__ROWS_REQUEST__INIT;
  r.caller = &caller;
  r.table = "emb";
  r.top = 2;
  pack(&r.base, b);
}

static void req_shrink(struct tu_buf *b) {
  Psd__V1__ShrinkRequest r = PSD__V1__SHRINK_REQUEST__INIT;
  r.caller = &caller;
  r.table = "adm";
  pack(&r.base, b);
}

static void req_export(struct tu_buf *b) {
  Psd__V1__ExportRequest r = PSD__V1__EXPORT_REQUEST__INIT;
  r.caller = &caller;
  r.table = "emb";
  r.after = 0;
  r.has_after = 1;
  r.max_rows = 1;
  pack(&r.base, b);
}

/* ps:0 is asked for the job's own count (refused, as is any count while
 * checkpoints are off), and a shard is told to hold and stop for layout 1
 * (refused: this is ps:0). Neither calls another shard. */
static void req_reshard(struct tu_buf *b) {
  Psd__V1__ReshardRequest r = PSD__V1__RESHARD_REQUEST__INIT;
  r.caller = &caller;
  r.shards = 2;
  pack(&r.base, b);
}

static void req_prepare(struct tu_buf *b) {
  Psd__V1__ReshardRequest r = PSD__V1__RESHARD_REQUEST__INIT;
  r.caller = &caller;
  r.shards = 1;
  r.prepare = 1;
  r.layout = 1;
  r.hold = 3;
  pack(&r.base, b);
}

/* A live move's calls, refused before any work or answered without a
 * change: the source told to cancel a move it does not run, and to copy
 * a bucket of ps:1's (refused); the destination (ps:0) told to take a
 * bucket of ps:1's from itself (refused: the source is another shard). */
static uint8_t move_set[512];

static void fill_move_set(void) {
  memset(move_set, 0, sizeof move_set);
  for (uint64_t id = 0;; id++)
    if (fresh_shard(id, 2) == 1) {
      unsigned b = cm_layout_bucket(cm_layout_id_hash(id));
      move_set[b >> 3] |= (uint8_t)(1u << (b & 7));
      return;
    }
}

static void req_move_cancel(struct tu_buf *b) {
  Psd__V1__MoveRowsRequest r = PSD__V1__MOVE_ROWS_REQUEST__INIT;
  fill_move_set();
  r.caller = &caller;
  r.buckets = (ProtobufCBinaryData){sizeof move_set, move_set};
  r.phase = PSD__V1__MOVE_PHASE__MOVE_CANCEL;
  r.move = 5;
  r.move_to = 3;
  r.moved = 1;
  pack(&r.base, b);
}

static void req_move_copy(struct tu_buf *b) {
  Psd__V1__MoveRowsRequest r = PSD__V1__MOVE_ROWS_REQUEST__INIT;
  fill_move_set();
  r.caller = &caller;
  r.buckets = (ProtobufCBinaryData){sizeof move_set, move_set};
  r.phase = PSD__V1__MOVE_PHASE__MOVE_COPY;
  r.move = 5;
  pack(&r.base, b);
}

static void req_move_buckets(struct tu_buf *b) {
  Psd__V1__MoveBucketsRequest r = PSD__V1__MOVE_BUCKETS_REQUEST__INIT;
  fill_move_set();
  r.caller = &caller;
  r.from = 0;
  r.buckets = (ProtobufCBinaryData){sizeof move_set, move_set};
  r.move_to = 3;
  r.moved = 1;
  pack(&r.base, b);
}

static void req_switch(struct tu_buf *b) {
  Psd__V1__SwitchLayoutRequest r = PSD__V1__SWITCH_LAYOUT_REQUEST__INIT;
  r.caller = &caller;
  r.phase = PSD__V1__SWITCH_PHASE__SWITCH_FREEZE;
  r.from = 2;
  r.to = 1;
  r.layout = 1;
  pack(&r.base, b);
}

static void req_dense_rows(struct tu_buf *b) {
  Psd__V1__DenseRowsRequest r = PSD__V1__DENSE_ROWS_REQUEST__INIT;
  r.caller = &caller;
  r.name = "w";
  r.row_end = 1;
  r.layout = 1;
  pack(&r.base, b);
}

/* Every call's valid requests (one or two), by method name. */
static const struct {
  const char *method;              /* the rpc's name in its service */
  void (*req[2])(struct tu_buf *); /* its requests */
  int acts_empty; /* the request with its caller alone is a real call that
                     changes the shard: Join (worker 0 joins again) and
                     Commit (step 0 closes with nobody's gradient) */
} requests[] = {
    {"Declare", {req_declare}, 0},
    {"Pull", {req_pull}, 0},
    {"Push", {req_push}, 0},
    {"Commit", {req_commit}, 1},
    {"Rollback", {req_rollback}, 0},
    {"SparsePull", {req_sparse_pull}, 0},
    {"SparsePush", {req_sparse_push}, 0},
    {"Join", {req_join, req_leave}, 1},
    {"Heartbeat", {req_heartbeat}, 0},
    {"Admit", {req_admit}, 0},
    {"Clock", {req_clock}, 0},
    {"Status", {req_status}, 0},
    {"Checkpoint", {req_checkpoint}, 0},
    {"Rows", {req_rows, req_top}, 0},
    {"Shrink", {req_shrink}, 0},
    {"Export", {req_export}, 0},
    {"Reshard", {req_reshard, req_prepare}, 0},
    {"MoveRows", {req_move_cancel, req_move_copy}, 0},
    {"MoveBuckets", {req_move_buckets}, 0},
    {"SwitchLayout", {req_switch}, 0},
    {"DenseRows", {req_dense_rows}, 0},
};

/* ---- the test ---- */

/* The services of proto/ps.proto, whose methods are every rpc. */
static const ProtobufCServiceDescriptor *const services[] = {
    &psd__v1__data__descriptor, &psd__v1__coord__descriptor,
    &psd__v1__admin__descriptor};
#define NSERVICES 3

static int nrpcs(void) {
  int n = 0;
  for (int s = 0; s < NSERVICES; s++)
    n += (int)services[s]->n_methods;
  return n;
}

/* The i-th rpc: its path and its request's descriptor. */
static const ProtobufCMethodDescriptor *rpc_at(int i, char *path, size_t len) {
  for (int s = 0; s < NSERVICES; s++) {
    if (i < (int)services[s]->n_methods) {
      snprintf(path, len, "/%s/%s", services[s]->name,
               services[s]->methods[i].name);
      return &services[s]->methods[i];
    }
    i -= (int)services[s]->n_methods;
  }
  ck_abort_msg("no rpc %d", i);
  return NULL;
}

/* What the variants of one call got. */
struct tally {
  int ok, refused, parked; /* answers */
};

/* Sends msg (NULL: no bytes at all) to a fresh shard of the mode and checks
 * the answer; a refused call must leave the shard as it was, and so must
 * one answered OK with must_keep. */
static void try_one(int sync, const char *path, const char *what,
                    const struct tu_buf *msg, int must_keep, struct tally *t) {
  static char before[16384], after[16384];
  struct cm_rpc_answer ans;
  if (sync)
    setup_sync();
  else
    setup_async();
  prepare();
  fingerprint(before, sizeof before);
  grpc_byte_buffer *bb = msg && msg->n ? raw(msg->p, msg->n) : NULL;
  ck_assert_int_eq(cm_rpc_call_local(method(path), bb, &ans), 0);
  if (bb)
    grpc_byte_buffer_destroy(bb);
  int parked = !ans.answered;
  if (parked) /* Admit, Clock, a pull for a later step: answered at stop */
    stop_shard();
  ck_assert_msg(ans.answered, "%s with %s: never answered, even at stop", path,
                what);
  ck_assert_msg((int)ans.status >= 0 &&
                    (int)ans.status <= GRPC_STATUS_UNAUTHENTICATED,
                "%s with %s: status %d", path, what, (int)ans.status);
  ck_assert_msg(ans.status == GRPC_STATUS_OK || ans.details[0],
                "%s with %s: %s without a message", path, what,
                cm_rpc_status_name(ans.status));
  if ((ans.status != GRPC_STATUS_OK || must_keep) && !parked) {
    fingerprint(after, sizeof after);
    ck_assert_msg(!strcmp(before, after),
                  "%s with %s was answered %s (%s) but changed the shard; "
                  "before:\n%safter:\n%s",
                  path, what, cm_rpc_status_name(ans.status), ans.details,
                  before, after);
  }
  if (getenv("PSD_EMPTY_VERBOSE")) /* every variant and its answer */
    printf("%s %s with %s: %s%s %s\n", sync ? "sync" : "async", path, what,
           parked ? "parked, then " : "", cm_rpc_status_name(ans.status),
           ans.details);
  t->parked += parked;
  t->ok += !parked && ans.status == GRPC_STATUS_OK;
  t->refused += !parked && ans.status != GRPC_STATUS_OK;
  cm_rpc_answer_release(&ans);
  teardown();
}

/* Rpc _i of the proto, in both modes: no request bytes at all, each valid
 * request as it is, and every variant of it. */
START_TEST(every_field_absent_or_empty) {
  char path[128];
  const ProtobufCMethodDescriptor *m = rpc_at(_i, path, sizeof path);
  size_t k = 0;
  static struct tu_variants vs;
  for (int i = 0; i < 3; i++)
    some_ids[i] = shard0_id(i);
  while (k < sizeof requests / sizeof requests[0] &&
         strcmp(requests[k].method, m->name))
    k++;
  ck_assert_msg(k < sizeof requests / sizeof requests[0],
                "%s (proto/ps.proto) has no valid request in "
                "test-service-empty.c's requests; add one",
                path);
  cm_log_set_level(CM_LOG_ERROR); /* refusals are the point here */
  for (int sync = 0; sync < 2; sync++) {
    struct tally t = {0};
    int n = 0;
    try_one(sync, path, "no bytes", NULL, 0, &t);
    for (int r = 0; r < 2 && requests[k].req[r]; r++) {
      struct tu_buf whole;
      requests[k].req[r](&whole);
      char what[64];
      snprintf(what, sizeof what, "request %d as it is", r);
      try_one(sync, path, what, &whole, 0, &t);
      tu_take_apart(&vs, whole.p, whole.n, m->input);
      for (int v = 0; v < vs.n; v++) {
        snprintf(what, sizeof what, "request %d", r);
        char label[256];
        snprintf(label, sizeof label, "%s, %s", what, vs.v[v].what);
        try_one(sync, path, label, &vs.v[v].msg,
                vs.v[v].keep && !requests[k].acts_empty, &t);
      }
      n += vs.n;
      tu_variants_release(&vs);
      free(whole.p);
    }
    printf("%s %s: %d variants: %d OK, %d refused, %d parked until stop\n",
           sync ? "sync" : "async", path, n, t.ok, t.refused, t.parked);
  }
}
END_TEST

static Suite *empty_suite(void) {
  Suite *s = suite_create("service-empty");
  TCase *tc = tcase_create("rpcs");
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, every_field_absent_or_empty, 0, nrpcs());
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(empty_suite(), 0); }
