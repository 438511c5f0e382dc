/* The shard the unit suites of psd's data service run against
 * (service_fixture.h): its setup and teardown, and the helpers that build
 * requests and make calls. */
#include "service_fixture.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord.h"
#include "layout.h"
#include "live.h"
#include "move.h"
#include "psd.h"
#include "saver.h"
#include "spec.h"
#include "store.h"
#include "switch.h"
#include "tables.h"
#include "wire.h"

#define SPEC(mode)                                                             \
  "{\"cluster\": {\"ps\": [\"127.0.0.1:1\", \"127.0.0.1:2\"], \"worker\":"     \
  " [\"127.0.0.1:3\", \"127.0.0.1:4\"]}, \"job\": {\"name\": \"t\","           \
  " \"optimizer\": {\"type\": \"sgd\", \"lr\": 1}, \"tables\": " TABLES ","    \
  " \"sync\": " mode "}}"

/* The spec's tables (service_fixture.h): emb, plain; adm, bounded, admitted
 * by count and evicted by it. */
#define TABLES                                                                 \
  "[{\"name\": \"emb\", \"dim\": 2, \"init\": \"uniform\","                    \
  " \"init_scale\": 0.5, \"optimizer\": {\"type\": \"sgd\", \"lr\": 1}},"      \
  " {\"name\": \"adm\", \"dim\": 2, \"id_bound\": 1000, \"optimizer\":"        \
  " {\"type\": \"adagrad\", \"lr\": 1}, \"admission\": {\"type\": \"count\","  \
  " \"count\": 2}, \"eviction\": {\"min_count\": 2}}]"

/* The shard under test: shard 0 of 2, two workers, sgd with lr 1. */
static struct psd_store *store;
struct psd_service *svc;
static struct psd_coord *coord;
static struct psd_saver *saver;
static struct psd_tables *tables;
static struct cm_spec *spec;
/* Admin/Reshard's handler (live.h) over a stand-in of psd's server: ps:0
 * of the spec's layout, checkpoints off, so every reshard is refused
 * before it calls anyone. */
static struct psd_server fsrv;
static struct psd_live *live;
/* Admin/MoveBuckets's handler (move.h) over the same stand-in. */
static struct psd_move *mover;
/* Admin/SwitchLayout's and DenseRows's handlers (switch.h), likewise: the
 * stand-in holds layout 0 of 0 shards and is never frozen, so every
 * switch is refused before it changes anything. */
static struct psd_switch *switcher;
Psd__V1__Caller caller = PSD__V1__CALLER__INIT;

static void start(const char *mode, const char *spec_mode) {
  char err[1024];
  const char *json = !strcmp(spec_mode, "sync")
                         ? SPEC("{\"mode\": \"sync\"}")
                         : SPEC("{\"mode\": \"async\", \"staleness\": 1}");
  cm_rpc_global_init();
  ck_assert_int_eq(
      cm_spec_parse(json, strlen(json), "t.json", &spec, err, sizeof err), 0);
  ck_assert_int_eq(psd_store_new(&store, 0, 2, &spec->job.optim), 0);
  ck_assert_int_eq(psd_service_new(&svc, store, 0, 2, 2, "t", mode), 0);
  ck_assert_msg(psd_tables_new(&tables, spec->job.tables, spec->job.ntables,
                               &spec->job.table_defaults, spec->job.seed, err,
                               sizeof err) == 0,
                "%s", err);
  psd_service_set_tables(svc, tables);
  ck_assert_int_eq(psd_coord_new(&coord, spec, spec->nps), 0);
  psd_service_set_coord(svc, coord);
  struct psd_saver_opts so = {
      .store = store, .steps = psd_service_steps(svc), .job = "t"};
  ck_assert_int_eq(psd_saver_new(&saver, &so), 0);
  memset(&fsrv, 0, sizeof fsrv);
  fsrv.spec = spec;
  fsrv.nshards = spec->nps;
  fsrv.service = svc;
  fsrv.coord = coord;
  ck_assert_int_eq(uv_loop_init(&fsrv.loop), 0);
  ck_assert_int_eq(psd_live_new(&live, &fsrv, ""), 0);
  ck_assert_int_eq(psd_move_new(&mover, &fsrv), 0);
  fsrv.store = store;
  ck_assert_int_eq(psd_switch_new(&switcher, &fsrv), 0);
  caller.job = "t";
  caller.worker = "test";
}

void setup_async(void) { start("async", "async"); }
void setup_sync(void) { start("sync", "sync"); }

TCase *service_tcase(Suite *s, const char *mode) {
  TCase *tc = tcase_create(mode);
  tcase_add_checked_fixture(tc, strcmp(mode, "sync") ? setup_async : setup_sync,
                            teardown);
  suite_add_tcase(s, tc);
  return tc;
}

static void close_cb(uv_handle_t *h, void *arg) {
  if (!uv_is_closing(h))
    uv_close(h, NULL);
}

void teardown(void) {
  uv_walk(&fsrv.loop, close_cb, NULL);
  uv_run(&fsrv.loop, UV_RUN_DEFAULT);
  uv_loop_close(&fsrv.loop);
  psd_live_free(live);
  psd_move_free(mover);
  psd_switch_free(switcher);
  psd_coord_free(coord);
  psd_service_free(svc);
  psd_saver_free(saver);
  psd_tables_free(tables);
  psd_store_free(store);
  cm_spec_free(spec);
  cm_rpc_global_shutdown();
}

const struct cm_rpc_method *method(const char *path) {
  const struct cm_rpc_method *m[6];
  int n[6];
  m[0] = psd_service_methods(svc, &n[0]);
  m[1] = psd_coord_methods(coord, &n[1]);
  m[2] = psd_saver_methods(saver, &n[2]);
  m[3] = psd_live_methods(live, &n[3]);
  m[4] = psd_move_methods(mover, &n[4]);
  m[5] = psd_switch_methods(switcher, &n[5]);
  for (int k = 0; k < 6; k++)
    for (int i = 0; i < n[k]; i++)
      if (!strcmp(m[k][i].path, path))
        return &m[k][i];
  ck_abort_msg("no method %s", path);
  return NULL;
}

void call_ans(const char *path, grpc_byte_buffer *bb, grpc_status_code code,
              const char *want, struct cm_rpc_answer *ans) {
  ck_assert_int_eq(cm_rpc_call_local(method(path), bb, ans), 0);
  if (bb)
    grpc_byte_buffer_destroy(bb);
  ck_assert_msg(ans->answered, "%s: not answered", path);
  ck_assert_msg(ans->status == code, "%s: %s (%s), expected %s", path,
                cm_rpc_status_name(ans->status), ans->details,
                cm_rpc_status_name(code));
  if (want)
    ck_assert_msg(strstr(ans->details, want), "%s: \"%s\" lacks \"%s\"", path,
                  ans->details, want);
}

void call(const char *path, grpc_byte_buffer *bb, grpc_status_code code,
          const char *want) {
  struct cm_rpc_answer ans;
  call_ans(path, bb, code, want, &ans);
  cm_rpc_answer_release(&ans);
}

grpc_byte_buffer *declare_req(const char *name, int n, const int64_t *shape,
                              int placement) {
  Psd__V1__DeclareRequest r = PSD__V1__DECLARE_REQUEST__INIT;
  Psd__V1__VarSpec vs = PSD__V1__VAR_SPEC__INIT, *vp[1] = {&vs};
  vs.name = (char *)name;
  vs.n_shape = n;
  vs.shape = (int64_t *)shape;
  vs.placement = placement;
  r.caller = &caller;
  r.n_vars = 1;
  r.vars = vp;
  return cm_rpc_pack(&r.base);
}

void declare(const char *name, int n, const int64_t *shape) {
  call("/psd.v1.Data/Declare", declare_req(name, n, shape, -1), GRPC_STATUS_OK,
       NULL);
}

Psd__V1__Segment seg(const char *name, uint64_t off, uint64_t count, int nshape,
                     int64_t *shape) {
  Psd__V1__Segment s = PSD__V1__SEGMENT__INIT;
  s.name = (char *)name;
  s.offset = off;
  s.count = count;
  s.n_shape = nshape;
  s.shape = shape;
  return s;
}

grpc_byte_buffer *push_req(Psd__V1__PushRequest *r, Psd__V1__Segment *segs,
                           int n, const float *g, size_t ng) {
  Psd__V1__Segment *ptr[8];
  uint8_t head[4096];
  struct cm_wire_piece piece = {(const uint8_t *)g, ng * sizeof(float)};
  for (int i = 0; i < n; i++)
    ptr[i] = &segs[i];
  r->caller = r->caller ? r->caller : &caller;
  r->n_segments = n;
  r->segments = ptr;
  size_t len = protobuf_c_message_get_packed_size(&r->base);
  ck_assert_uint_lt(len, sizeof head);
  protobuf_c_message_pack(&r->base, head);
  return cm_wire_build(head, len, &piece, 1, NULL, NULL);
}

grpc_byte_buffer *pull_req_max(Psd__V1__Segment *segs, int n,
                               uint64_t min_version, uint64_t max_answer) {
  Psd__V1__PullRequest r = PSD__V1__PULL_REQUEST__INIT;
  Psd__V1__Segment *ptr[8];
  for (int i = 0; i < n; i++)
    ptr[i] = &segs[i];
  r.caller = &caller;
  r.n_segments = n;
  r.segments = ptr;
  r.min_version = min_version;
  r.max_answer_bytes = max_answer;
  return cm_rpc_pack(&r.base);
}

grpc_byte_buffer *pull_req(Psd__V1__Segment *segs, int n,
                           uint64_t min_version) {
  return pull_req_max(segs, n, min_version, 0);
}

void pull_values(const char *name, uint64_t off, uint64_t count, float *out) {
  Psd__V1__Segment s = seg(name, off, count, 0, NULL);
  struct cm_rpc_answer ans;
  struct cm_wire_msg m;
  call_ans("/psd.v1.Data/Pull", pull_req(&s, 1, 0), GRPC_STATUS_OK, NULL, &ans);
  ck_assert_int_eq(cm_wire_parse(&m, ans.response), 0);
  ck_assert_uint_eq(m.bulk_len, count * sizeof(float));
  ck_assert_int_eq(cm_wire_bulk_read(&m, 0, out, m.bulk_len), 0);
  cm_wire_msg_release(&m);
  cm_rpc_answer_release(&ans);
}

Psd__V1__StatusResponse *status(void) {
  Psd__V1__StatusRequest r = PSD__V1__STATUS_REQUEST__INIT;
  struct cm_rpc_answer ans;
  uint8_t *data;
  size_t len;
  r.caller = &caller;
  call_ans("/psd.v1.Admin/Status", cm_rpc_pack(&r.base), GRPC_STATUS_OK, NULL,
           &ans);
  ck_assert_int_eq(cm_rpc_readall(ans.response, &data, &len), 0);
  Psd__V1__StatusResponse *st =
      psd__v1__status_response__unpack(NULL, len, data);
  ck_assert_ptr_nonnull(st);
  free(data);
  cm_rpc_answer_release(&ans);
  return st;
}

grpc_byte_buffer *raw(const void *p, size_t n) {
  grpc_slice sl = grpc_slice_from_copied_buffer(p, n);
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&sl, 1);
  grpc_slice_unref(sl);
  return bb;
}

int fresh_shard(uint64_t id, int nshards) {
  static struct cm_layout_map m;
  if (m.nshards != nshards)
    cm_layout_map_init(&m, CM_LAYOUT_RULE_BUCKETS, nshards);
  return cm_layout_map_id_shard(&m, id);
}

uint64_t shard0_id(int k) {
  for (uint64_t id = 0;; id++)
    if (fresh_shard(id, 2) == 0 && k-- == 0)
      return id;
}

grpc_byte_buffer *sparse_push_req(Psd__V1__SparsePushRequest *r,
                                  const char *table, const uint64_t *ids,
                                  size_t n, const float *g, size_t ng) {
  uint8_t head[4096];
  r->caller = r->caller ? r->caller : &caller;
  r->table = (char *)table;
  r->ids.data = (uint8_t *)ids;
  r->ids.len = n * sizeof *ids;
  if (!g)
    return cm_rpc_pack(&r->base);
  struct cm_wire_piece piece = {(const uint8_t *)g, ng * sizeof(float)};
  size_t len = protobuf_c_message_get_packed_size(&r->base);
  ck_assert_uint_lt(len, sizeof head);
  protobuf_c_message_pack(&r->base, head);
  return cm_wire_build(head, len, &piece, 1, NULL, NULL);
}

grpc_byte_buffer *sparse_pull_req(const char *table, const uint64_t *ids,
                                  size_t n, uint64_t min_version) {
  Psd__V1__SparsePullRequest r = PSD__V1__SPARSE_PULL_REQUEST__INIT;
  r.caller = &caller;
  r.table = (char *)table;
  r.min_version = min_version;
  r.ids.data = (uint8_t *)ids;
  r.ids.len = n * sizeof *ids;
  return cm_rpc_pack(&r.base);
}

void pull_rows(const char *table, const uint64_t *ids, size_t n, float *out) {
  struct cm_rpc_answer ans;
  struct cm_wire_msg m;
  uint32_t dim = psd_table_conf(psd_tables_find(tables, table))->dim;
  call_ans("/psd.v1.Data/SparsePull", sparse_pull_req(table, ids, n, 0),
           GRPC_STATUS_OK, NULL, &ans);
  ck_assert_int_eq(cm_wire_parse(&m, ans.response), 0);
  ck_assert_uint_eq(m.bulk_len, n * dim * sizeof(float));
  ck_assert_int_eq(cm_wire_bulk_read(&m, 0, out, m.bulk_len), 0);
  cm_wire_msg_release(&m);
  cm_rpc_answer_release(&ans);
}

struct psd_table_stats table_stats(const char *table) {
  struct psd_table_stats st;
  struct psd_table *t = psd_tables_find(tables, table);
  ck_assert_ptr_nonnull(t);
  psd_table_stats(t, &st);
  return st;
}

void stop_shard(void) {
  psd_coord_stop(coord);
  psd_service_stop(svc);
}
