/* Unit tests for libpsclient's transfers when the job's shard layout moves
 * under them (worker/psclient/relayout.c through transfer.c, sparse.c and
 * declare.c), against three stand-in shards served in this process that
 * apply pushes by adding them up: a push whose ps:0 part was applied when
 * ps:1 answered "layout moved" sends only ps:1's part again, re-cut for 3
 * shards, and every element ends at exactly one gradient; the same for a
 * table push's ids; a pull's moved part pulled again from the new shards;
 * a declare made again on the new layout; a layout that keeps moving given up
 * after 8 re-plans, naming the last answer; and a count outside the pool
 * refused, naming it. */
#include <arpa/inet.h>
#include <check.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "client_internal.h"
#include "err.h"
#include "layout.h"
#include "ps.pb-c.h"
#include "psclient.h"
#include "rand.h"
#include "rpc.h"
#include "rpc_server.h"
#include "spec.h"
#include "unit.h"
#include "wire.h"

#define NS 3     /* addresses in the pool */
#define ROWS 60  /* rows of "w", 2 floats each, split */
#define NIDS 50  /* ids of table "t", rows of 1 float */
#define ID0 1000 /* its first id */

/* The stand-ins' state, under lock. */
static struct {
  pthread_mutex_t lock;
  uint64_t layout[NS];  /* each shard's layout version */
  int count[NS];        /* and shard count */
  uint64_t next_layout; /* a move pending: to this version (0: none) */
  int next_count;       /* of this many shards */
  int move_at;          /* the shard that moves to the pending layout at
                           its first push or pull (the others move when a
                           call planned for it reaches them); -1: none */
  int endless;          /* every call answered "moved" to a new layout */
  float w[ROWS * 2];    /* "w" as pushed: the sum of what was applied */
  float t[NIDS];        /* table "t" likewise, by id - ID0 */
  int moved_answers;    /* "moved" answers given */
  int declares[NS];     /* Declares answered OK */
} st;

/* Answers "layout moved" when the caller planned for another layout than
 * shard s's, or s is a standby; returns 1 then. */
static int check_layout(struct cm_rpc_call *call, int s,
                        const Psd__V1__Caller *k) {
  int moved;
  uint64_t v;
  int n;
  pthread_mutex_lock(&st.lock);
  if (st.next_layout && k && k->layout == st.next_layout) {
    st.layout[s] = st.next_layout; /* the caller knows: so does this one */
    st.count[s] = st.next_count;
  }
  if (st.endless) {
    st.layout[s] = st.layout[s] + 1;
    st.count[s] = 2;
  }
  v = st.layout[s];
  n = st.count[s];
  moved = st.endless || s >= n || !k || k->layout != v || k->shards != n;
  st.moved_answers += moved;
  pthread_mutex_unlock(&st.lock);
  if (moved)
    cm_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION,
                "layout moved: ps:%d holds layout %llu of %d shards, rows by "
                "buckets; the stand-in",
                s, (unsigned long long)v, n);
  return moved;
}

/* Shard s moves to the pending layout, or all do (s -1). */
static void move(int s) {
  for (int k = 0; k < NS; k++)
    if (s < 0 || k == s) {
      st.layout[k] = st.next_layout;
      st.count[k] = st.next_count;
    }
  st.move_at = -1;
}

static void on_declare(struct cm_rpc_call *call, grpc_byte_buffer *bb,
                       void *ctx) {
  int s = (int)(intptr_t)ctx;
  Psd__V1__DeclareRequest *req = (Psd__V1__DeclareRequest *)cm_rpc_unpack(
      bb, &psd__v1__declare_request__descriptor);
  if (!check_layout(call, s, req ? req->caller : NULL)) {
    Psd__V1__DeclareResponse r = PSD__V1__DECLARE_RESPONSE__INIT;
    Psd__V1__VarSlice sl[4], *slp[4];
    /* Every variable asked for exists here now, created by this call. */
    for (size_t i = 0; i < req->n_vars && i < 4; i++) {
      psd__v1__var_slice__init(&sl[i]);
      sl[i].name = req->vars[i]->name;
      sl[i].created = 1;
      slp[i] = &sl[i];
    }
    r.n_slices = req->n_vars < 4 ? req->n_vars : 4;
    r.slices = slp;
    r.boot = 0x100 + (uint64_t)s;
    pthread_mutex_lock(&st.lock);
    st.declares[s]++;
    pthread_mutex_unlock(&st.lock);
    cm_rpc_reply(call, cm_rpc_pack(&r.base));
  }
  if (req)
    psd__v1__declare_request__free_unpacked(req, NULL);
}

/* Adds each segment of a push to st.w. */
static void on_push(struct cm_rpc_call *call, grpc_byte_buffer *bb, void *ctx) {
  int s = (int)(intptr_t)ctx;
  struct cm_wire_msg w;
  Psd__V1__PushRequest *req = NULL;
  if (cm_wire_parse(&w, bb) == 0)
    req = psd__v1__push_request__unpack(NULL, w.head_len, w.head);
  ck_assert_ptr_nonnull(req);
  pthread_mutex_lock(&st.lock);
  if (st.move_at == s)
    move(s); /* this one's answer says so; ps:0 applies its part */
  pthread_mutex_unlock(&st.lock);
  if (!check_layout(call, s, req->caller)) {
    Psd__V1__PushResponse r = PSD__V1__PUSH_RESPONSE__INIT;
    size_t off = 0;
    pthread_mutex_lock(&st.lock);
    for (size_t i = 0; i < req->n_segments; i++) {
      const Psd__V1__Segment *g = req->segments[i];
      float buf[ROWS * 2];
      ck_assert_str_eq(g->name, "w");
      ck_assert_uint_le(g->offset + g->count, ROWS * 2);
      /* Only rows this shard holds in its layout. */
      int64_t rb, re;
      cm_layout_rows(ROWS, -1, st.count[s], s, &rb, &re);
      ck_assert_uint_ge(g->offset, (uint64_t)rb * 2);
      ck_assert_uint_le(g->offset + g->count, (uint64_t)re * 2);
      cm_wire_bulk_read(&w, off, buf, g->count * sizeof(float));
      off += g->count * sizeof(float);
      for (uint64_t j = 0; j < g->count; j++)
        st.w[g->offset + j] += buf[j];
    }
    pthread_mutex_unlock(&st.lock);
    cm_rpc_reply(call, cm_rpc_pack(&r.base));
  }
  psd__v1__push_request__free_unpacked(req, NULL);
  cm_wire_msg_release(&w);
}

/* Answers a pull of "w" with its sums. */
static void on_pull(struct cm_rpc_call *call, grpc_byte_buffer *bb, void *ctx) {
  int s = (int)(intptr_t)ctx;
  Psd__V1__PullRequest *req = (Psd__V1__PullRequest *)cm_rpc_unpack(
      bb, &psd__v1__pull_request__descriptor);
  ck_assert_ptr_nonnull(req);
  pthread_mutex_lock(&st.lock);
  if (st.move_at == s)
    move(s);
  pthread_mutex_unlock(&st.lock);
  if (!check_layout(call, s, req->caller)) {
    static float out[ROWS * 2];
    Psd__V1__PullResponse r = PSD__V1__PULL_RESPONSE__INIT;
    struct cm_wire_piece p[8];
    uint8_t head[64];
    size_t len = psd__v1__pull_response__pack(&r, head);
    ck_assert_uint_le(req->n_segments, 8);
    pthread_mutex_lock(&st.lock);
    memcpy(out, st.w, sizeof out);
    pthread_mutex_unlock(&st.lock);
    for (size_t i = 0; i < req->n_segments; i++)
      p[i] = (struct cm_wire_piece){
          (const uint8_t *)(out + req->segments[i]->offset),
          req->segments[i]->count * sizeof(float)};
    cm_rpc_reply(call,
                 cm_wire_build(head, len, p, req->n_segments, NULL, NULL));
  }
  psd__v1__pull_request__free_unpacked(req, NULL);
}

/* Adds a table push's rows to st.t. */
static void on_sparse_push(struct cm_rpc_call *call, grpc_byte_buffer *bb,
                           void *ctx) {
  int s = (int)(intptr_t)ctx;
  struct cm_wire_msg w;
  Psd__V1__SparsePushRequest *req = NULL;
  if (cm_wire_parse(&w, bb) == 0)
    req = psd__v1__sparse_push_request__unpack(NULL, w.head_len, w.head);
  ck_assert_ptr_nonnull(req);
  pthread_mutex_lock(&st.lock);
  if (st.move_at == s)
    move(s);
  pthread_mutex_unlock(&st.lock);
  if (!check_layout(call, s, req->caller)) {
    Psd__V1__SparsePushResponse r = PSD__V1__SPARSE_PUSH_RESPONSE__INIT;
    size_t n = req->ids.len / sizeof(uint64_t);
    pthread_mutex_lock(&st.lock);
    for (size_t i = 0; i < n; i++) {
      uint64_t id;
      float row;
      memcpy(&id, req->ids.data + i * sizeof id, sizeof id);
      static struct cm_layout_map m;
      if (m.nshards != st.count[s])
        cm_layout_map_init(&m, CM_LAYOUT_RULE_BUCKETS, st.count[s]);
      ck_assert_int_eq(cm_layout_map_id_shard(&m, id), s);
      cm_wire_bulk_read(&w, i * sizeof row, &row, sizeof row);
      st.t[id - ID0] += row;
    }
    pthread_mutex_unlock(&st.lock);
    cm_rpc_reply(call, cm_rpc_pack(&r.base));
  }
  psd__v1__sparse_push_request__free_unpacked(req, NULL);
  cm_wire_msg_release(&w);
}

static struct cm_server *srv[NS];
static struct cm_spec *spec;
static struct cm_rpc_method methods[NS][4];

/* A port nobody listens on just now. */
static int free_port(void) {
  struct sockaddr_in a = {.sin_family = AF_INET};
  socklen_t len = sizeof a;
  int fd = socket(AF_INET, SOCK_STREAM, 0), port;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
  port = ntohs(a.sin_port);
  close(fd);
  return port;
}

/* Three stand-ins at layout 0 of 2 (ps:2 a standby), and the spec. */
static void serve(void) {
  char text[1024], addr[NS][64], err[1024];
  cm_rpc_global_init();
  memset(&st, 0, sizeof st);
  pthread_mutex_init(&st.lock, NULL);
  st.move_at = -1;
  for (int s = 0; s < NS; s++) {
    st.count[s] = 2;
    snprintf(addr[s], sizeof addr[s], "127.0.0.1:%d", free_port());
    void *ctx = (void *)(intptr_t)s;
    struct cm_rpc_method m[4] = {
        {"/psd.v1.Data/Declare", on_declare, ctx},
        {"/psd.v1.Data/Push", on_push, ctx},
        {"/psd.v1.Data/Pull", on_pull, ctx},
        {"/psd.v1.Data/SparsePush", on_sparse_push, ctx}};
    memcpy(methods[s], m, sizeof m);
    ck_assert_int_eq(
        cm_server_new(&srv[s], addr[s], methods[s], 4, NULL, err, sizeof err),
        0);
    ck_assert_int_eq(cm_server_start(srv[s]), 0);
  }
  snprintf(text, sizeof text,
           "{\"cluster\": {\"ps\": [\"%s\", \"%s\", \"%s\"], \"worker\": "
           "[\"127.0.0.1:1\"]}, \"job\": {\"name\": \"mv\", \"shards\": 2, "
           "\"retry_s\": 10, \"unix_sockets\": false, \"rpc_timeout_ms\": "
           "2000}}",
           addr[0], addr[1], addr[2]);
  ck_assert_msg(
      cm_spec_parse(text, strlen(text), "t.json", &spec, err, sizeof err) == 0,
      "%s", err);
}

static void unserve(void) {
  for (int s = 0; s < NS; s++)
    cm_server_free(srv[s]);
  cm_spec_free(spec);
  cm_rpc_global_shutdown();
  pthread_mutex_destroy(&st.lock);
}

static float value[ROWS * 2], grad[ROWS * 2];

/* A client that declared "w" (and table "t"), small messages so that each
 * shard gets several. */
static struct psc__client *client(void) {
  struct psc__client *c = NULL;
  struct psc__client_opts o = {.worker = "worker:0", .chunk_bytes = 64};
  struct psc__var v = {.name = "w",
                       .ndim = 2,
                       .shape = {ROWS, 2},
                       .placement = PSC__PLACE_SPLIT,
                       .value = value,
                       .grad = grad};
  struct psc__table t = {.name = "t", .dim = 1};
  ck_assert_int_eq(psc__client_new(&c, spec, &o), 0);
  ck_assert_msg(psc__client_declare(c, &v, 1) == 0, "%s", psc__client_error(c));
  ck_assert_msg(psc__client_declare_tables(c, &t, 1) == 0, "%s",
                psc__client_error(c));
  return c;
}

/* ps:0 applies its part; ps:1 answers that the job moved to layout 1 of 3
 * shards: ps:1's part alone goes again, across the three. */
START_TEST(push_sends_only_what_is_pending) {
  struct psc__client *c = client();
  for (int i = 0; i < ROWS * 2; i++)
    grad[i] = 0.125f * (float)(i + 1);
  st.next_layout = 1;
  st.next_count = 3;
  st.move_at = 1;
  ck_assert_msg(psc__client_push(c) == 0, "%s", psc__client_error(c));
  ck_assert_int_gt(st.moved_answers, 0);
  ck_assert_int_eq(c->nshards, 3);
  ck_assert_uint_eq(c->layout, 1);
  for (int i = 0; i < ROWS * 2; i++)
    ck_assert_msg(st.w[i] == grad[i], "element %d: %g, pushed %g", i, st.w[i],
                  grad[i]);
  /* The next push and pull go to the new layout at once. */
  int before = st.moved_answers;
  ck_assert_msg(psc__client_push(c) == 0, "%s", psc__client_error(c));
  ck_assert_msg(psc__client_pull(c) == 0, "%s", psc__client_error(c));
  ck_assert_int_eq(st.moved_answers, before);
  for (int i = 0; i < ROWS * 2; i++)
    ck_assert(value[i] == 2 * grad[i]);
  psc__client_free(c);
}
END_TEST

/* A pull whose ps:1 part answered "moved": that part pulled again from
 * the 3 shards, every value in place. */
START_TEST(pull_redone_on_new_layout) {
  struct psc__client *c = client();
  for (int i = 0; i < ROWS * 2; i++)
    st.w[i] = 0.25f * (float)i;
  memset(value, 0, sizeof value);
  st.next_layout = 1;
  st.next_count = 3;
  st.move_at = 1;
  ck_assert_msg(psc__client_pull(c) == 0, "%s", psc__client_error(c));
  ck_assert_int_gt(st.moved_answers, 0);
  ck_assert_int_eq(c->nshards, 3);
  ck_assert_mem_eq(value, st.w, sizeof value);
  psc__client_free(c);
}
END_TEST

START_TEST(table_push_sends_only_what_is_pending) {
  struct psc__client *c = client();
  uint64_t ids[NIDS];
  float rows[NIDS];
  for (int i = 0; i < NIDS; i++) {
    ids[i] = ID0 + (uint64_t)i;
    rows[i] = 0.125f * (float)(i + 1);
  }
  struct psc__rows r = {.table = "t", .ids = ids, .n = NIDS, .grads = rows};
  st.next_layout = 1;
  st.next_count = 3;
  st.move_at = 1;
  ck_assert_msg(psc__client_push_rows(c, &r, 1) == 0, "%s",
                psc__client_error(c));
  ck_assert_int_gt(st.moved_answers, 0);
  ck_assert_int_eq(c->nshards, 3);
  for (int i = 0; i < NIDS; i++)
    ck_assert_msg(st.t[i] == rows[i], "id %d: %g, pushed %g", ID0 + i, st.t[i],
                  rows[i]);
  psc__client_free(c);
}
END_TEST

/* A client that opens on the spec's layout, 0 of 2, when the shards hold
 * 2 of 3: its declare is made again on the three. */
START_TEST(declare_made_again) {
  st.next_layout = 2;
  st.next_count = 3;
  move(-1);
  struct psc__client *c = client();
  ck_assert_int_eq(c->nshards, 3);
  ck_assert_uint_eq(c->layout, 2);
  for (int s = 0; s < NS; s++) {
    ck_assert_int_gt(st.declares[s], 0);
    ck_assert_uint_eq(c->boot[s], 0x100 + (uint64_t)s);
  }
  psc__client_free(c);
}
END_TEST

START_TEST(endless_moves_given_up) {
  struct psc__client *c = client();
  st.endless = 1;
  ck_assert_int_eq(psc__client_push(c), CM_ERPC);
  ck_assert_msg(strstr(psc__client_error(c),
                       "push: the job's layout moved 9 times during one push; "
                       "the last answer: layout moved: ps:"),
                "%s", psc__client_error(c));
  ck_assert_int_le(st.moved_answers, 9 * 8);
  psc__client_free(c);
}
END_TEST

START_TEST(count_outside_pool) {
  struct psc__client *c = client();
  st.next_layout = 1;
  st.next_count = 5;
  st.move_at = 0;
  ck_assert_int_eq(psc__client_push(c), CM_ERANGE);
  ck_assert_msg(strstr(psc__client_error(c),
                       "push: ps:0 says the job moved to layout 1 of 5 "
                       "shards, but this client's spec lists 3 ps addresses"),
                "%s", psc__client_error(c));
  psc__client_free(c);
}
END_TEST

static Suite *moved_suite(void) {
  Suite *s = suite_create("client-moved");
  TCase *tc = tcase_create("moved");
  tcase_add_checked_fixture(tc, serve, unserve);
  tcase_add_test(tc, push_sends_only_what_is_pending);
  tcase_add_test(tc, pull_redone_on_new_layout);
  tcase_add_test(tc, table_push_sends_only_what_is_pending);
  tcase_add_test(tc, declare_made_again);
  tcase_add_test(tc, endless_moves_given_up);
  tcase_add_test(tc, count_outside_pool);
  tcase_set_timeout(tc, 60);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(moved_suite(), TU_NOFORK); }
