/* The shard that the unit suites of psd's data service run against
 * (test-service.c, test-service-pull.c, test-service-push.c,
 * test-service-commit.c, test-service-sparse.c, test-service-empty.c): shard
 * 0 of 2 of job 't', two workers, sgd with lr 1, two embedding tables from
 * the spec ("emb": dim 2, sgd with lr 1, uniform in [-0.5, 0.5); "adm": dim
 * 2, id_bound 1000, adagrad, admitted after 2 pushes, evicted below 2), with
 * the coordinator's and the checkpoint saver's methods beside the
 * service's. The handlers run as local calls (cm_rpc_call_local): the same
 * decoding and checks as over gRPC, without a network. Each test gets a fresh
 * shard (a checked fixture: setup_async or setup_sync, then teardown). */
#ifndef TESTS_SERVICE_FIXTURE_H
#define TESTS_SERVICE_FIXTURE_H

#include <check.h>
#include <stddef.h>
#include <stdint.h>

#include "ps.pb-c.h"
#include "rpc_server.h"
#include "service.h"
#include "table.h"

/* The service under test, made by setup_*, freed by teardown. */
extern struct psd_service *svc;
/* The caller every request names: job "t", worker "test". */
extern Psd__V1__Caller caller;

/* Checked fixtures: an async or a sync shard; teardown frees either. */
void setup_async(void);
void setup_sync(void);
void teardown(void);

/* A test case of s named mode ("async" or "sync"), each of whose tests
 * runs against a fresh shard of that mode. */
TCase *service_tcase(Suite *s, const char *mode);

/* The handler serving `path` (the service's, the coordinator's or the
 * saver's); fails the test when there is none. */
const struct cm_rpc_method *method(const char *path);

/* Calls path with bb (destroyed) and checks the status and that the message
 * holds `want` (when not NULL); *ans is the answer (release it). */
void call_ans(const char *path, grpc_byte_buffer *bb, grpc_status_code code,
              const char *want, struct cm_rpc_answer *ans);
/* call_ans, the answer released. */
void call(const char *path, grpc_byte_buffer *bb, grpc_status_code code,
          const char *want);

/* ---- requests (each returns a message for call, which destroys it) ---- */

/* A Declare of one variable. */
grpc_byte_buffer *declare_req(const char *name, int n, const int64_t *shape,
                              int placement);
/* Declares a split variable, which must succeed. */
void declare(const char *name, int n, const int64_t *shape);
/* A segment (name and shape are borrowed). */
Psd__V1__Segment seg(const char *name, uint64_t off, uint64_t count, int nshape,
                     int64_t *shape);
/* A push of segs[0..n) (n <= 8) with gradient g[0..ng) (g must outlive the
 * buffer); r's other fields are the caller's. */
grpc_byte_buffer *push_req(Psd__V1__PushRequest *r, Psd__V1__Segment *segs,
                           int n, const float *g, size_t ng);
/* A pull of segs[0..n) (n <= 8) for min_version. */
grpc_byte_buffer *pull_req(Psd__V1__Segment *segs, int n, uint64_t min_version);
/* pull_req naming the largest answer the caller accepts (max_answer_bytes;
 * 0: gRPC's default, as pull_req). */
grpc_byte_buffer *pull_req_max(Psd__V1__Segment *segs, int n,
                               uint64_t min_version, uint64_t max_answer);
/* Bytes as they are, for messages protobuf-c would not write. */
grpc_byte_buffer *raw(const void *p, size_t n);

/* A sparse push to table of ids[0..n) (field 14) with gradient rows
 * g[0..ng) (the bulk field 15; none at all when g is NULL); r's other fields
 * are the caller's. ids and g must outlive the buffer. */
grpc_byte_buffer *sparse_push_req(Psd__V1__SparsePushRequest *r,
                                  const char *table, const uint64_t *ids,
                                  size_t n, const float *g, size_t ng);
/* A sparse pull of ids[0..n) of table for min_version. */
grpc_byte_buffer *sparse_pull_req(const char *table, const uint64_t *ids,
                                  size_t n, uint64_t min_version);
/* The k-th id (from 0) that shard 0 of 2 holds. */
uint64_t shard0_id(int k);
/* The shard of id among nshards in a fresh job's row map (layout.h). */
int fresh_shard(uint64_t id, int nshards);

/* ---- reads ---- */

/* Pulls count elements of name from off into out. */
void pull_values(const char *name, uint64_t off, uint64_t count, float *out);
/* Pulls the rows of ids[0..n) of table into out (n x dim). */
void pull_rows(const char *table, const uint64_t *ids, size_t n, float *out);
/* A table's counters, read directly (not through a call). */
struct psd_table_stats table_stats(const char *table);
/* Stops the shard as psd does (coordinator, then service): every parked
 * call is answered. Teardown still frees it. */
void stop_shard(void);
/* The shard's Status (free it with psd__v1__status_response__free_unpacked). */
Psd__V1__StatusResponse *status(void);

#endif
