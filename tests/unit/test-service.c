/* Unit tests for ps-server/psd/service.c (with coord.c's and saver.c's
 * handlers): every class of bad input gets its status and a message naming the
 * field, variable or shape, and changes nothing. The handlers run as local
 * calls (cm_rpc_call_local): the same decoding and checks as over gRPC, without
 * a network. Also cm_first_nonfinite against a plain loop. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord.h"
#include "err.h"
#include "finite.h"
#include "ps.pb-c.h"
#include "rpc.h"
#include "saver.h"
#include "service.h"
#include "spec.h"
#include "steps.h"
#include "store.h"
#include "unit.h"
#include "wire.h"

#define SPEC(mode)                                                             \
  "{\"cluster\": {\"ps\": [\"127.0.0.1:1\", \"127.0.0.1:2\"], \"worker\":"     \
  " [\"127.0.0.1:3\", \"127.0.0.1:4\"]}, \"job\": {\"name\": \"t\","           \
  " \"optimizer\": {\"type\": \"sgd\", \"lr\": 1}, \"sync\": " mode "}}"

/* The shard under test: shard 0 of 2, two workers, sgd with lr 1. */
static struct psd_store *store;
static struct psd_service *svc;
static struct psd_coord *coord;
static struct psd_saver *saver;
static struct cm_spec *spec;
static Psd__V1__Caller caller = PSD__V1__CALLER__INIT;

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
  ck_assert_int_eq(psd_coord_new(&coord, spec), 0);
  psd_service_set_coord(svc, coord);
  struct psd_saver_opts so = {
      .store = store, .steps = psd_service_steps(svc), .job = "t"};
  ck_assert_int_eq(psd_saver_new(&saver, &so), 0);
  caller.job = "t";
  caller.worker = "test";
}

static void setup_async(void) { start("async", "async"); }
static void setup_sync(void) { start("sync", "sync"); }

static void teardown(void) {
  psd_coord_free(coord);
  psd_service_free(svc);
  psd_saver_free(saver);
  psd_store_free(store);
  cm_spec_free(spec);
  cm_rpc_global_shutdown();
}

/* The handler serving `path`. */
static const struct cm_rpc_method *method(const char *path) {
  const struct cm_rpc_method *m[3];
  int n[3];
  m[0] = psd_service_methods(svc, &n[0]);
  m[1] = psd_coord_methods(coord, &n[1]);
  m[2] = psd_saver_methods(saver, &n[2]);
  for (int k = 0; k < 3; k++)
    for (int i = 0; i < n[k]; i++)
      if (!strcmp(m[k][i].path, path))
        return &m[k][i];
  ck_abort_msg("no method %s", path);
  return NULL;
}

/* Calls path with bb (destroyed) and checks the status and that the message
 * holds `want` (when not NULL); *ans is the answer (release it). */
static void call_ans(const char *path, grpc_byte_buffer *bb,
                     grpc_status_code code, const char *want,
                     struct cm_rpc_answer *ans) {
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

static void call(const char *path, grpc_byte_buffer *bb, grpc_status_code code,
                 const char *want) {
  struct cm_rpc_answer ans;
  call_ans(path, bb, code, want, &ans);
  cm_rpc_answer_release(&ans);
}

/* ---- requests ---- */

static grpc_byte_buffer *declare_req(const char *name, int n,
                                     const int64_t *shape, int placement) {
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

static void declare(const char *name, int n, const int64_t *shape) {
  call("/psd.v1.Data/Declare", declare_req(name, n, shape, -1), GRPC_STATUS_OK,
       NULL);
}

static Psd__V1__Segment seg(const char *name, uint64_t off, uint64_t count,
                            int nshape, int64_t *shape) {
  Psd__V1__Segment s = PSD__V1__SEGMENT__INIT;
  s.name = (char *)name;
  s.offset = off;
  s.count = count;
  s.n_shape = nshape;
  s.shape = shape;
  return s;
}

/* A push of segs[0..n) with gradient g[0..ng) (g must outlive the buffer). */
static grpc_byte_buffer *push_req(Psd__V1__PushRequest *r,
                                  Psd__V1__Segment *segs, int n, const float *g,
                                  size_t ng) {
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

static grpc_byte_buffer *pull_req(Psd__V1__Segment *segs, int n,
                                  uint64_t min_version) {
  Psd__V1__PullRequest r = PSD__V1__PULL_REQUEST__INIT;
  Psd__V1__Segment *ptr[8];
  for (int i = 0; i < n; i++)
    ptr[i] = &segs[i];
  r.caller = &caller;
  r.n_segments = n;
  r.segments = ptr;
  r.min_version = min_version;
  return cm_rpc_pack(&r.base);
}

/* Pulls count elements of name from off into out. */
static void pull_values(const char *name, uint64_t off, uint64_t count,
                        float *out) {
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

static Psd__V1__StatusResponse *status(void) {
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

static grpc_byte_buffer *raw(const void *p, size_t n) {
  grpc_slice sl = grpc_slice_from_copied_buffer(p, n);
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&sl, 1);
  grpc_slice_unref(sl);
  return bb;
}

/* ---- callers ---- */

static const char *const all_methods[] = {
    "/psd.v1.Data/Declare",     "/psd.v1.Data/Pull",    "/psd.v1.Data/Push",
    "/psd.v1.Data/Commit",      "/psd.v1.Admin/Status", "/psd.v1.Coord/Join",
    "/psd.v1.Coord/Heartbeat",  "/psd.v1.Coord/Admit",  "/psd.v1.Coord/Clock",
    "/psd.v1.Admin/Checkpoint", "/psd.v1.Data/Rollback"};

/* Every method: an empty message has no caller; a caller of another job is
 * refused naming both jobs; bytes that are not protobuf are malformed. */
START_TEST(caller_missing_wrong_or_malformed) {
  /* field 1 (caller) = {job: "other"} */
  static const uint8_t other[] = {0x0a, 0x07, 0x0a, 0x05, 'o',
                                  't',  'h',  'e',  'r'};
  static const uint8_t junk[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 1, 2};
  for (size_t i = 0; i < sizeof all_methods / sizeof *all_methods; i++) {
    const char *m = all_methods[i];
    call(m, NULL, GRPC_STATUS_INVALID_ARGUMENT, "caller.job is missing");
    /* Commit in an async job is refused for the mode only after the
     * caller; every other method names the other job. */
    call(m, raw(other, sizeof other), GRPC_STATUS_FAILED_PRECONDITION,
         "'other'");
    call(m, raw(junk, sizeof junk), GRPC_STATUS_INVALID_ARGUMENT,
         "malformed protobuf");
  }
}
END_TEST

/* ---- Declare ---- */

START_TEST(declare_checks_every_field) {
  const char *d = "/psd.v1.Data/Declare";
  int64_t five[5] = {1, 1, 1, 1, 1}, neg[2] = {3, -1}, zero[2] = {0, 4},
          big[2] = {1 << 20, 1 << 21}, wrap[2] = {1LL << 62, 4}, ok[2] = {4, 3};
  char long_name[PSD_VAR_MAX_NAME + 2];
  memset(long_name, 'a', sizeof long_name - 1);
  long_name[sizeof long_name - 1] = 0;

  call(d, declare_req("a", 0, ok, -1), GRPC_STATUS_INVALID_ARGUMENT,
       "'a': the shape has 0 dimensions; expected 1..4");
  call(d, declare_req("a", 5, five, -1), GRPC_STATUS_INVALID_ARGUMENT,
       "the shape has 5 dimensions");
  call(d, declare_req("a", 2, neg, -1), GRPC_STATUS_INVALID_ARGUMENT,
       "'a': shape [3, -1]: dimension 1 is -1; expected a positive size");
  call(d, declare_req("a", 2, zero, -1), GRPC_STATUS_INVALID_ARGUMENT,
       "dimension 0 is 0");
  call(d, declare_req("a", 2, big, -1), GRPC_STATUS_INVALID_ARGUMENT,
       "shape [1048576, 2097152] has more than 2^40 elements");
  call(d, declare_req("a", 2, wrap, -1), GRPC_STATUS_INVALID_ARGUMENT,
       "more than 2^40 elements");
  call(d, declare_req("a", 2, ok, 2), GRPC_STATUS_INVALID_ARGUMENT,
       "'a': placement 2; expected -1 (split) or a shard index 0..1");
  call(d, declare_req("a", 2, ok, -2), GRPC_STATUS_INVALID_ARGUMENT,
       "placement -2");
  call(d, declare_req("", 2, ok, -1), GRPC_STATUS_INVALID_ARGUMENT,
       "variable 0: the variable name is 0 bytes long; expected 1..200");
  call(d, declare_req(long_name, 2, ok, -1), GRPC_STATUS_INVALID_ARGUMENT,
       "the variable name is 201 bytes long");
  call(d, declare_req("a\nb", 2, ok, -1), GRPC_STATUS_INVALID_ARGUMENT,
       "control character (0x0a) at byte 1");

  /* init and init_scale */
  Psd__V1__DeclareRequest r = PSD__V1__DECLARE_REQUEST__INIT;
  Psd__V1__VarSpec vs = PSD__V1__VAR_SPEC__INIT, *vp[2] = {&vs, &vs};
  vs.name = "a";
  vs.n_shape = 2;
  vs.shape = ok;
  vs.placement = -1;
  vs.init = 7;
  r.caller = &caller;
  r.n_vars = 1;
  r.vars = vp;
  call(d, cm_rpc_pack(&r.base), GRPC_STATUS_INVALID_ARGUMENT,
       "'a': init 7 is not an Init value");
  vs.init = PSD__V1__INIT__INIT_UNIFORM;
  vs.init_scale = NAN;
  call(d, cm_rpc_pack(&r.base), GRPC_STATUS_INVALID_ARGUMENT,
       "init_scale nan; expected a finite number >= 0");
  vs.init_scale = -1;
  call(d, cm_rpc_pack(&r.base), GRPC_STATUS_INVALID_ARGUMENT, "init_scale -1");

  /* A name twice in one request with different shapes; and a bad second
   * variable: neither request creates anything. */
  Psd__V1__VarSpec v2 = PSD__V1__VAR_SPEC__INIT;
  int64_t other[2] = {4, 4};
  vs.init_scale = 0.1f;
  v2 = vs;
  v2.shape = other;
  vp[1] = &v2;
  r.n_vars = 2;
  call(d, cm_rpc_pack(&r.base), GRPC_STATUS_INVALID_ARGUMENT,
       "'a' is declared twice in one request with different shapes");
  v2.name = "b";
  v2.n_shape = 0;
  call(d, cm_rpc_pack(&r.base), GRPC_STATUS_INVALID_ARGUMENT,
       "'b': the shape has 0 dimensions");
  Psd__V1__StatusResponse *st = status();
  ck_assert_uint_eq(st->n_vars, 0);
  ck_assert_uint_eq(st->errors, 16);
  psd__v1__status_response__free_unpacked(st, NULL);
  /* The same name twice with the same shape is one variable. */
  v2 = vs;
  call(d, cm_rpc_pack(&r.base), GRPC_STATUS_OK, NULL);
  st = status();
  ck_assert_uint_eq(st->n_vars, 1);
  psd__v1__status_response__free_unpacked(st, NULL);
  /* And another shape later is ALREADY_EXISTS naming both. */
  call(d, declare_req("a", 2, other, -1), GRPC_STATUS_ALREADY_EXISTS,
       "'a' already exists with shape [4, 3] placement -1; this declaration "
       "asks for shape [4, 4]");
}
END_TEST

/* A variable the shard cannot hold is refused before any memory is taken. */
START_TEST(declare_beyond_memory) {
  int64_t huge[1] = {1LL << 39}, mib[2] = {512, 1024}, kib[1] = {256};
  call("/psd.v1.Data/Declare", declare_req("huge", 1, huge, -1),
       GRPC_STATUS_RESOURCE_EXHAUSTED,
       "need 1.0 TiB on shard 0 (values and optimizer slots), which holds 0 "
       "B already; its limit is");
  call("/psd.v1.Data/Declare", declare_req("huge", 1, huge, -1),
       GRPC_STATUS_RESOURCE_EXHAUSTED, "(this machine's memory)");
  /* Without a limit, what the machine has free now still counts. */
  psd_service_set_limits(svc, &(struct psd_limits){.max_message = 64 << 20,
                                                   .max_held = UINT64_MAX});
  call("/psd.v1.Data/Declare", declare_req("huge", 1, huge, -1),
       GRPC_STATUS_RESOURCE_EXHAUSTED,
       "need 1.0 TiB on shard 0 (values and optimizer slots), but this "
       "machine has ");
  psd_service_set_limits(
      svc, &(struct psd_limits){.max_message = 64 << 20, .max_held = 1 << 20});
  /* Shard 0 of 2 holds 256 rows of 1024 floats: exactly 1 MiB. */
  declare("m", 2, mib);
  call("/psd.v1.Data/Declare", declare_req("k", 1, kib, 0),
       GRPC_STATUS_RESOURCE_EXHAUSTED,
       "need 1.0 KiB on shard 0 (values and optimizer slots), which holds "
       "1.0 MiB already; its limit is 1.0 MiB");
  /* Placed on the other shard it takes nothing here. */
  call("/psd.v1.Data/Declare", declare_req("k", 1, kib, 1), GRPC_STATUS_OK,
       NULL);
}
END_TEST

/* ---- Pull ---- */

START_TEST(pull_checks_segments) {
  int64_t shape[2] = {4, 2};
  const char *p = "/psd.v1.Data/Pull";
  declare("w", 2, shape); /* shard 0: rows [0, 2) = elements [0, 4) */
  Psd__V1__Segment s = seg("nosuch", 0, 1, 0, NULL);
  call(p, pull_req(&s, 1, 0), GRPC_STATUS_NOT_FOUND,
       "pull: no variable 'nosuch' on shard 0 (declare it first)");
  s = seg("w", 0, 0, 0, NULL);
  call(p, pull_req(&s, 1, 0), GRPC_STATUS_INVALID_ARGUMENT,
       "pull of 'w': segment 0 has count 0");
  s = seg("w", 2, 4, 0, NULL);
  call(p, pull_req(&s, 1, 0), GRPC_STATUS_OUT_OF_RANGE,
       "pull of 'w' elements [2, 6) is outside shard 0's slice, elements "
       "[0, 4) (rows [0, 2))");
  /* offset + count wraps around 2^64: still refused, and said exactly. */
  s = seg("w", 1ULL << 63, (1ULL << 63) + 5, 0, NULL);
  call(p, pull_req(&s, 1, 0), GRPC_STATUS_OUT_OF_RANGE,
       "elements [9223372036854775808, 9223372036854775808 + "
       "9223372036854775813)");
  s = seg("w", 1, UINT64_MAX, 0, NULL);
  call(p, pull_req(&s, 1, 0), GRPC_STATUS_OUT_OF_RANGE, "elements [1, 1 + ");
  /* An answer that would not fit in a message. */
  int64_t big[2] = {4096, 4096}; /* 32 MiB here */
  declare("big", 2, big);
  psd_service_set_limits(svc, &(struct psd_limits){.max_message = 4 << 20});
  s = seg("big", 0, 2 << 20, 0, NULL);
  call(p, pull_req(&s, 1, 0), GRPC_STATUS_RESOURCE_EXHAUSTED,
       "pull asks for more than 4190208 bytes in one message");
  s = seg("big", 0, 1 << 19, 0, NULL);
  call(p, pull_req(&s, 1, 0), GRPC_STATUS_OK, NULL);
}
END_TEST

/* More segments than any request may carry. */
START_TEST(too_many_segments) {
  int64_t shape[1] = {4};
  declare("w", 1, shape);
  Psd__V1__PullRequest r = PSD__V1__PULL_REQUEST__INIT;
  size_t n = PSD_MAX_SEGMENTS + 1;
  Psd__V1__Segment s = seg("w", 0, 1, 1, shape), **ptr = calloc(n, sizeof *ptr);
  for (size_t i = 0; i < n; i++)
    ptr[i] = &s;
  r.caller = &caller;
  r.n_segments = n;
  r.segments = ptr;
  call("/psd.v1.Data/Pull", cm_rpc_pack(&r.base), GRPC_STATUS_INVALID_ARGUMENT,
       "Pull: 65537 segments in one request; at most 65536");
  Psd__V1__PushRequest pr = PSD__V1__PUSH_REQUEST__INIT;
  pr.caller = &caller;
  pr.n_segments = n;
  pr.segments = ptr;
  call("/psd.v1.Data/Push", cm_rpc_pack(&pr.base), GRPC_STATUS_INVALID_ARGUMENT,
       "Push: 65537 segments");
  free(ptr);
}
END_TEST

/* ---- Push ---- */

START_TEST(push_checks_before_applying) {
  int64_t shape[2] = {4, 2}, wrong[2] = {4, 3}, one[1] = {3};
  const char *p = "/psd.v1.Data/Push";
  float g[8] = {1, 2, 3, 4, 5, 6, 7, 8}, got[4];
  declare("w", 2, shape);
  call("/psd.v1.Data/Declare", declare_req("b", 1, one, 0), GRPC_STATUS_OK,
       NULL); /* whole on shard 0 */
  Psd__V1__PushRequest r = PSD__V1__PUSH_REQUEST__INIT;
  Psd__V1__Segment s[3];

  s[0] = seg("w", 0, 4, 2, wrong);
  call(p, push_req(&r, s, 1, g, 4), GRPC_STATUS_INVALID_ARGUMENT,
       "push to 'w': gradient shape [4, 3] does not match the variable's "
       "shape [4, 2]");
  s[0] = seg("w", 0, 4, 2, shape);
  call(p, push_req(&r, s, 1, g, 3), GRPC_STATUS_INVALID_ARGUMENT,
       "segments describe at least 16 bytes of gradient but the data field "
       "holds 12");
  call(p, push_req(&r, s, 1, g, 5), GRPC_STATUS_INVALID_ARGUMENT,
       "segments describe 16 bytes of gradient but the data field holds 20");
  /* Overlapping segments of one variable, in any order. */
  s[0] = seg("w", 2, 2, 2, shape);
  s[1] = seg("b", 0, 3, 1, one);
  s[2] = seg("w", 0, 3, 2, shape);
  call(p, push_req(&r, s, 3, g, 8), GRPC_STATUS_INVALID_ARGUMENT,
       "push to 'w': segments 0 and 2 overlap (elements [0, 3) and [2, 4))");
  s[2] = seg("w", 2, 2, 2, shape);
  call(p, push_req(&r, s, 3, g, 7), GRPC_STATUS_INVALID_ARGUMENT,
       "segments 0 and 2 overlap (elements [2, 4) and [2, 4))");
  /* A named worker must exist. */
  s[0] = seg("w", 0, 4, 2, shape);
  r.has_worker = 1;
  r.worker = 2;
  call(p, push_req(&r, s, 1, g, 4), GRPC_STATUS_INVALID_ARGUMENT,
       "Push: worker 2 out of range; cluster.worker has 2 entries");
  r.worker = -1;
  call(p, push_req(&r, s, 1, g, 4), GRPC_STATUS_INVALID_ARGUMENT,
       "worker -1 out of range");
  /* Unknown variable in the second segment: the first is not applied. */
  s[1] = seg("nosuch", 0, 1, 1, one);
  r.worker = 0;
  call(p, push_req(&r, s, 2, g, 5), GRPC_STATUS_NOT_FOUND, "'nosuch'");
  pull_values("w", 0, 4, got);
  for (int i = 0; i < 4; i++)
    ck_assert_float_eq(got[i], 0.0f);
  /* Adjacent segments are fine; lr 1 sgd: w = -g. */
  s[0] = seg("w", 0, 2, 2, shape);
  s[1] = seg("w", 2, 2, 2, shape);
  call(p, push_req(&r, s, 2, g, 4), GRPC_STATUS_OK, NULL);
  pull_values("w", 0, 4, got);
  for (int i = 0; i < 4; i++)
    ck_assert_float_eq(got[i], -g[i]);
}
END_TEST

/* job.nonfinite "reject": the first bad element is named, by variable and
 * element index, and nothing of the push is applied. */
START_TEST(nonfinite_rejected) {
  int64_t shape[2] = {4, 2}, one[1] = {3};
  const char *p = "/psd.v1.Data/Push";
  float g[7] = {1, 2, 3, 4, 5, 6, 7}, got[4], b[3];
  declare("w", 2, shape);
  call("/psd.v1.Data/Declare", declare_req("b", 1, one, 0), GRPC_STATUS_OK,
       NULL); /* whole on shard 0 */
  Psd__V1__PushRequest r = PSD__V1__PUSH_REQUEST__INIT;
  Psd__V1__Segment s[2] = {seg("w", 0, 4, 2, shape), seg("b", 0, 3, 1, one)};
  g[5] = NAN;
  call(p, push_req(&r, s, 2, g, 7), GRPC_STATUS_INVALID_ARGUMENT,
       "push to 'b': gradient element 1 (segment 1) is NaN; nothing of this "
       "push was applied (job.nonfinite is \"reject\")");
  g[5] = 6;
  g[2] = INFINITY;
  call(p, push_req(&r, s, 2, g, 7), GRPC_STATUS_INVALID_ARGUMENT,
       "push to 'w': gradient element 2 (segment 0) is +Inf");
  g[2] = -INFINITY;
  s[0] = seg("w", 1, 3, 2, shape);
  call(p, push_req(&r, s, 1, g, 3), GRPC_STATUS_INVALID_ARGUMENT,
       "gradient element 3 (segment 0) is -Inf");
  pull_values("w", 0, 4, got);
  pull_values("b", 0, 3, b);
  for (int i = 0; i < 4; i++)
    ck_assert_float_eq(got[i], 0.0f);
  for (int i = 0; i < 3; i++)
    ck_assert_float_eq(b[i], 0.0f);
  Psd__V1__StatusResponse *st = status();
  ck_assert_uint_eq(st->nonfinite_pushes, 3);
  ck_assert_str_eq(st->nonfinite, "reject");
  ck_assert_uint_eq(st->pushes, 0);
  ck_assert_uint_eq(st->errors, 3);
  ck_assert_uint_eq(st->max_message_bytes, 64 << 20);
  psd__v1__status_response__free_unpacked(st, NULL);
}
END_TEST

/* job.nonfinite "skip": acknowledged, not applied, counted. */
START_TEST(nonfinite_skipped) {
  int64_t shape[1] = {100};
  float g[100] = {0}, got[50];
  struct cm_rpc_answer ans;
  uint8_t *data;
  size_t len;
  psd_service_set_limits(svc,
                         &(struct psd_limits){.max_message = 64 << 20,
                                              .nonfinite = PSD_NONFINITE_SKIP});
  declare("v", 1, shape);
  Psd__V1__PushRequest r = PSD__V1__PUSH_REQUEST__INIT;
  Psd__V1__Segment s = seg("v", 0, 50, 1, shape);
  for (int i = 0; i < 50; i++)
    g[i] = 1;
  g[49] = NAN;
  call_ans("/psd.v1.Data/Push", push_req(&r, &s, 1, g, 50), GRPC_STATUS_OK,
           NULL, &ans);
  ck_assert_int_eq(cm_rpc_readall(ans.response, &data, &len), 0);
  Psd__V1__PushResponse *pr = psd__v1__push_response__unpack(NULL, len, data);
  ck_assert_uint_eq(pr->n_versions, 1);
  ck_assert_uint_eq(pr->versions[0], 0); /* not applied: still version 0 */
  psd__v1__push_response__free_unpacked(pr, NULL);
  free(data);
  cm_rpc_answer_release(&ans);
  pull_values("v", 0, 50, got);
  for (int i = 0; i < 50; i++)
    ck_assert_float_eq(got[i], 0.0f);
  g[49] = 1;
  call("/psd.v1.Data/Push", push_req(&r, &s, 1, g, 50), GRPC_STATUS_OK, NULL);
  pull_values("v", 0, 50, got);
  for (int i = 0; i < 50; i++)
    ck_assert_float_eq(got[i], -1.0f);
  Psd__V1__StatusResponse *st = status();
  ck_assert_uint_eq(st->nonfinite_pushes, 1);
  ck_assert_str_eq(st->nonfinite, "skip");
  ck_assert_uint_eq(st->pushes, 1);
  ck_assert_uint_eq(st->errors, 0);
  psd__v1__status_response__free_unpacked(st, NULL);
}
END_TEST

/* job.nonfinite "apply": applied as it is, and counted. */
START_TEST(nonfinite_applied) {
  int64_t shape[1] = {100};
  float g[50] = {0}, got[50];
  psd_service_set_limits(
      svc, &(struct psd_limits){.max_message = 64 << 20,
                                .nonfinite = PSD_NONFINITE_APPLY});
  declare("v", 1, shape);
  Psd__V1__PushRequest r = PSD__V1__PUSH_REQUEST__INIT;
  Psd__V1__Segment s = seg("v", 0, 50, 1, shape);
  g[3] = NAN;
  g[4] = INFINITY;
  g[5] = 2;
  call("/psd.v1.Data/Push", push_req(&r, &s, 1, g, 50), GRPC_STATUS_OK, NULL);
  pull_values("v", 0, 50, got);
  ck_assert(isnan(got[3]));
  ck_assert(isinf(got[4]) && got[4] < 0);
  ck_assert_float_eq(got[5], -2.0f);
  Psd__V1__StatusResponse *st = status();
  ck_assert_uint_eq(st->nonfinite_pushes, 1);
  ck_assert_str_eq(st->nonfinite, "apply");
  ck_assert_uint_eq(st->pushes, 1);
  psd__v1__status_response__free_unpacked(st, NULL);
}
END_TEST

/* The vectorized scan finds exactly the first NaN or infinity, at every
 * position and length, and no finite value (the largest, the smallest
 * subnormal, negative zero) is taken for one. */
START_TEST(first_nonfinite_matches_a_plain_loop) {
  float g[300] = {0};
  const float bad[3] = {NAN, INFINITY, -INFINITY};
  const float fine[4] = {3.4028235e38f, -3.4028235e38f, 1e-45f, -0.0f};
  for (size_t n = 0; n <= 300; n += (n < 140 ? 1 : 37)) {
    for (size_t i = 0; i < n; i++)
      g[i] = fine[i % 4];
    ck_assert_uint_eq(cm_first_nonfinite(g, n), n);
    for (size_t at = 0; at < n; at++) {
      for (int k = 0; k < 3; k++) {
        g[at] = bad[k];
        ck_assert_uint_eq(cm_first_nonfinite(g, n), at);
        if (at + 70 < n) { /* a second one later changes nothing */
          g[at + 70] = NAN;
          ck_assert_uint_eq(cm_first_nonfinite(g, n), at);
          g[at + 70] = fine[(at + 70) % 4];
        }
      }
      g[at] = fine[at % 4];
    }
  }
}
END_TEST

/* ---- sync: staging, commits, parked pulls ---- */

START_TEST(sync_push_late_ahead_and_nonfinite) {
  int64_t shape[1] = {8}; /* shard 0 holds elements [0, 4) */
  const char *p = "/psd.v1.Data/Push", *c = "/psd.v1.Data/Commit";
  float g[4] = {1, 2, 3, 4}, got[4];
  declare("s", 1, shape);
  Psd__V1__PushRequest r = PSD__V1__PUSH_REQUEST__INIT;
  Psd__V1__Segment s = seg("s", 0, 4, 1, shape);
  Psd__V1__CommitRequest cr = PSD__V1__COMMIT_REQUEST__INIT;
  int32_t applied[3] = {0, 1, 0}, dropped[2] = {1, 5};

  /* The worker index must exist, with or without has_worker. */
  r.worker = 2;
  call(p, push_req(&r, &s, 1, g, 4), GRPC_STATUS_INVALID_ARGUMENT,
       "Push: worker 2 out of range; cluster.worker has 2 entries");
  r.worker = 0;
  r.step = 3;
  call(p, push_req(&r, &s, 1, g, 4), GRPC_STATUS_FAILED_PRECONDITION,
       "push to 's' for step 3 from worker 0: this shard has committed 0 "
       "steps (the open step is 0)");
  /* NaN in a staged gradient: refused, nothing staged. */
  r.step = 0;
  g[1] = NAN;
  call(p, push_req(&r, &s, 1, g, 4), GRPC_STATUS_INVALID_ARGUMENT,
       "push to 's': gradient element 1 (segment 0) is NaN");
  g[1] = 2;

  /* Commit's sets: range, duplicates, both applied and dropped. */
  cr.caller = &caller;
  cr.step = 0;
  cr.applied = applied;
  cr.dropped = dropped;
  cr.n_applied = 3;
  call(c, cm_rpc_pack(&cr.base), GRPC_STATUS_INVALID_ARGUMENT,
       "Commit of step 0: 3 workers in applied; the job has 2");
  cr.n_applied = 2;
  applied[1] = 0;
  call(c, cm_rpc_pack(&cr.base), GRPC_STATUS_INVALID_ARGUMENT,
       "Commit of step 0: worker 0 is listed twice in applied");
  applied[1] = 7;
  call(c, cm_rpc_pack(&cr.base), GRPC_STATUS_INVALID_ARGUMENT,
       "worker 7 in applied is out of range; cluster.worker has 2 entries");
  cr.n_applied = 1;
  cr.n_dropped = 2;
  call(c, cm_rpc_pack(&cr.base), GRPC_STATUS_INVALID_ARGUMENT,
       "worker 5 in dropped is out of range");
  dropped[0] = 0;
  cr.n_dropped = 1;
  call(c, cm_rpc_pack(&cr.base), GRPC_STATUS_INVALID_ARGUMENT,
       "worker 0 is listed both in applied and in dropped");
  cr.step = 5;
  cr.n_dropped = 0;
  call(c, cm_rpc_pack(&cr.base), GRPC_STATUS_FAILED_PRECONDITION,
       "commit of step 5: this shard has committed only 0 steps");

  /* A pull too far ahead is refused; one step ahead is parked until the
   * commit; the commit applies worker 0's gradient (the NaN one was never
   * staged: the values are -g). */
  Psd__V1__Segment ps = seg("s", 0, 4, 0, NULL);
  call("/psd.v1.Data/Pull", pull_req(&ps, 1, 2),
       GRPC_STATUS_FAILED_PRECONDITION,
       "Pull: version 2 asked for, but shard 0 has committed 0 steps");
  struct cm_rpc_answer parked;
  grpc_byte_buffer *bb = pull_req(&ps, 1, 1);
  ck_assert_int_eq(cm_rpc_call_local(method("/psd.v1.Data/Pull"), bb, &parked),
                   0);
  grpc_byte_buffer_destroy(bb);
  ck_assert_int_eq(parked.answered, 0);
  call(p, push_req(&r, &s, 1, g, 4), GRPC_STATUS_OK, NULL);
  call(c, cm_rpc_pack(&cr.base), GRPC_STATUS_FAILED_PRECONDITION, NULL);
  cr.step = 0;
  call(c, cm_rpc_pack(&cr.base), GRPC_STATUS_OK, NULL);
  ck_assert_int_eq(parked.answered, 1);
  ck_assert_int_eq(parked.status, GRPC_STATUS_OK);
  cm_rpc_answer_release(&parked);
  pull_values("s", 0, 4, got);
  for (int i = 0; i < 4; i++)
    ck_assert_float_eq(got[i], -g[i]);

  /* A push for the closed step 0: ABORTED, naming the step and the open
   * one; nothing staged, so committing step 1 changes nothing. */
  call(p, push_req(&r, &s, 1, g, 4), GRPC_STATUS_ABORTED,
       "push to 's' for step 0 from worker 0: step 0 is already closed (this "
       "shard has committed 1 steps; the open step is 1); the gradient is "
       "dropped");
  cr.step = 1;
  call(c, cm_rpc_pack(&cr.base), GRPC_STATUS_OK, NULL);
  pull_values("s", 0, 4, got);
  for (int i = 0; i < 4; i++)
    ck_assert_float_eq(got[i], -g[i]);
}
END_TEST

/* Parked pulls are answered UNAVAILABLE when the service stops. */
START_TEST(sync_parked_pull_answered_at_stop) {
  int64_t shape[1] = {8};
  declare("s", 1, shape);
  Psd__V1__Segment ps = seg("s", 0, 4, 0, NULL);
  struct cm_rpc_answer parked;
  grpc_byte_buffer *bb = pull_req(&ps, 1, 1);
  ck_assert_int_eq(cm_rpc_call_local(method("/psd.v1.Data/Pull"), bb, &parked),
                   0);
  grpc_byte_buffer_destroy(bb);
  ck_assert_int_eq(parked.answered, 0);
  psd_service_stop(svc);
  ck_assert_int_eq(parked.answered, 1);
  ck_assert_int_eq(parked.status, GRPC_STATUS_UNAVAILABLE);
}
END_TEST

/* ---- the coordinator and the checkpoint call ---- */

START_TEST(coordinator_checks_workers_and_clocks) {
  Psd__V1__JoinRequest j = PSD__V1__JOIN_REQUEST__INIT;
  Psd__V1__HeartbeatRequest h = PSD__V1__HEARTBEAT_REQUEST__INIT;
  Psd__V1__ClockRequest c = PSD__V1__CLOCK_REQUEST__INIT;
  Psd__V1__AdmitRequest a = PSD__V1__ADMIT_REQUEST__INIT;
  j.caller = h.caller = c.caller = a.caller = &caller;
  j.worker = 2;
  call("/psd.v1.Coord/Join", cm_rpc_pack(&j.base), GRPC_STATUS_INVALID_ARGUMENT,
       "Join: worker 2 out of range; cluster.worker has 2 entries");
  h.worker = -1;
  call("/psd.v1.Coord/Heartbeat", cm_rpc_pack(&h.base),
       GRPC_STATUS_INVALID_ARGUMENT, "Heartbeat: worker -1 out of range");
  c.worker = 0;
  c.clock = UINT64_MAX;
  call("/psd.v1.Coord/Clock", cm_rpc_pack(&c.base),
       GRPC_STATUS_INVALID_ARGUMENT,
       "Clock: worker 0 reports clock 18446744073709551615; a clock counts a "
       "worker's pushes and is at most 2^48");
  a.worker = 0;
  call("/psd.v1.Coord/Admit", cm_rpc_pack(&a.base),
       GRPC_STATUS_FAILED_PRECONDITION, "Admit: job 't' is asynchronous");
  j.worker = 1;
  call("/psd.v1.Coord/Join", cm_rpc_pack(&j.base), GRPC_STATUS_OK, NULL);
}
END_TEST

START_TEST(sync_admit_far_ahead) {
  Psd__V1__JoinRequest j = PSD__V1__JOIN_REQUEST__INIT;
  Psd__V1__AdmitRequest a = PSD__V1__ADMIT_REQUEST__INIT;
  j.caller = a.caller = &caller;
  j.worker = 0;
  call("/psd.v1.Coord/Join", cm_rpc_pack(&j.base), GRPC_STATUS_OK, NULL);
  a.worker = 0;
  a.step = 1ULL << 60;
  call("/psd.v1.Coord/Admit", cm_rpc_pack(&a.base),
       GRPC_STATUS_FAILED_PRECONDITION,
       "Admit: step 1152921504606846976 is not open yet (open: 0)");
  a.worker = 9;
  call("/psd.v1.Coord/Admit", cm_rpc_pack(&a.base),
       GRPC_STATUS_INVALID_ARGUMENT, "Admit: worker 9 out of range");
}
END_TEST

/* A heartbeat's answer: rejoin and restarted, as bits 1 and 2. */
static int heartbeat_flags(int worker) {
  Psd__V1__HeartbeatRequest h = PSD__V1__HEARTBEAT_REQUEST__INIT;
  Psd__V1__HeartbeatResponse *r;
  struct cm_rpc_answer ans;
  uint8_t *data = NULL;
  size_t len = 0;
  int flags;
  h.caller = &caller;
  h.worker = worker;
  call_ans("/psd.v1.Coord/Heartbeat", cm_rpc_pack(&h.base), GRPC_STATUS_OK,
           NULL, &ans);
  ck_assert_int_eq(cm_rpc_readall(ans.response, &data, &len), 0);
  r = psd__v1__heartbeat_response__unpack(NULL, len, data);
  ck_assert_ptr_nonnull(r);
  flags = (r->rejoin ? 1 : 0) | (r->restarted ? 2 : 0);
  psd__v1__heartbeat_response__free_unpacked(r, NULL);
  free(data);
  cm_rpc_answer_release(&ans);
  return flags;
}

/* A worker this coordinator never saw join (it restarted since) is asked to
 * join again, and told the coordinator restarted, so that a sync worker
 * joins from its training thread; once joined, neither. */
START_TEST(sync_heartbeat_of_unknown_worker_says_restarted) {
  Psd__V1__JoinRequest j = PSD__V1__JOIN_REQUEST__INIT;
  j.caller = &caller;
  j.worker = 1;
  ck_assert_int_eq(heartbeat_flags(1), 3);
  call("/psd.v1.Coord/Join", cm_rpc_pack(&j.base), GRPC_STATUS_OK, NULL);
  ck_assert_int_eq(heartbeat_flags(1), 0);
}
END_TEST

/* Data/Rollback: a retry at the step the shard is at is answered OK; one
 * that would take the generation back is refused; a real one needs the
 * checkpoints this shard does not keep. */
static grpc_byte_buffer *rollback_req(uint64_t step, uint64_t gen) {
  Psd__V1__RollbackRequest r = PSD__V1__ROLLBACK_REQUEST__INIT;
  r.caller = &caller;
  r.step = step;
  r.gen = gen;
  return cm_rpc_pack(&r.base);
}

START_TEST(sync_rollback_checks_generation) {
  call("/psd.v1.Data/Rollback", rollback_req(0, 0), GRPC_STATUS_OK, NULL);
  call("/psd.v1.Data/Rollback", rollback_req(5, 0),
       GRPC_STATUS_FAILED_PRECONDITION,
       "Rollback to step 5 in generation 0: shard 0 is at generation 0 "
       "already");
  call("/psd.v1.Data/Rollback", rollback_req(5, 1),
       GRPC_STATUS_FAILED_PRECONDITION, "cannot:");
}
END_TEST

START_TEST(checkpoint_off_and_commit_in_async) {
  Psd__V1__CheckpointRequest k = PSD__V1__CHECKPOINT_REQUEST__INIT;
  Psd__V1__CommitRequest c = PSD__V1__COMMIT_REQUEST__INIT;
  k.caller = c.caller = &caller;
  call("/psd.v1.Admin/Checkpoint", cm_rpc_pack(&k.base),
       GRPC_STATUS_FAILED_PRECONDITION, NULL);
  call("/psd.v1.Data/Commit", cm_rpc_pack(&c.base),
       GRPC_STATUS_FAILED_PRECONDITION,
       "Commit: shard 0 runs an asynchronous job");
}
END_TEST

static Suite *service_suite(void) {
  Suite *s = suite_create("service");
  TCase *tc = tcase_create("async");
  tcase_add_checked_fixture(tc, setup_async, teardown);
  tcase_add_test(tc, caller_missing_wrong_or_malformed);
  tcase_add_test(tc, declare_checks_every_field);
  tcase_add_test(tc, declare_beyond_memory);
  tcase_add_test(tc, pull_checks_segments);
  tcase_add_test(tc, too_many_segments);
  tcase_add_test(tc, push_checks_before_applying);
  tcase_add_test(tc, nonfinite_rejected);
  tcase_add_test(tc, nonfinite_skipped);
  tcase_add_test(tc, nonfinite_applied);
  tcase_add_test(tc, first_nonfinite_matches_a_plain_loop);
  tcase_add_test(tc, coordinator_checks_workers_and_clocks);
  tcase_add_test(tc, checkpoint_off_and_commit_in_async);
  suite_add_tcase(s, tc);

  tc = tcase_create("sync");
  tcase_add_checked_fixture(tc, setup_sync, teardown);
  tcase_add_test(tc, sync_push_late_ahead_and_nonfinite);
  tcase_add_test(tc, sync_parked_pull_answered_at_stop);
  tcase_add_test(tc, sync_heartbeat_of_unknown_worker_says_restarted);
  tcase_add_test(tc, sync_admit_far_ahead);
  tcase_add_test(tc, sync_rollback_checks_generation);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(service_suite(), 0); }
