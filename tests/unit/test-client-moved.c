/* Unit tests for libpsclient's transfers when the job's shard layout moves
 * under them (worker/psclient/relayout.c through transfer.c, sparse.c and
 * declare.c), against three stand-in shards served in this process that
 * apply pushes by adding them up: a push whose ps:0 part was applied when
 * ps:1 answered "layout moved" sends only ps:1's part again, re-cut for 3
 * shards, and every element ends at exactly one gradient; the same for a
 * table push's ids; a pull's moved part pulled again from the new shards;
 * a declare made again on the new layout; a layout that keeps moving given up
 * after 8 re-plans, naming the last answer; and a count outside the pool
 * refused, naming it.
 *
 * A live move of table rows (layout 0 of 2 moving to 3, bucket by bucket):
 * the stand-ins gate table rows by the buckets each owns and refuse a call
 * touching another as psd does ("..., moving to 3 shards after K moves;
 * bucket B ..."). A bucket of ps:0 handed to ps:2 between plan and send:
 * a push re-plans once and sends that bucket's ids alone to ps:2, a pull
 * gets every row; ps:2 behind the client (fewer moves, the bucket not yet
 * its own) is sent again after a backoff until it catches up, no re-plan;
 * the hand-over's window (ps:0 and ps:2 both refusing) passes; a bucket
 * refused past the client's wait fails naming ps:2 and the bucket. */
#include <arpa/inet.h>
#include <check.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "client_internal.h"
#include "clock.h"
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
#define NT 128   /* the table ids the stand-ins keep */

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
  uint64_t tid[NT];     /* table "t": its ids so far */
  float t[NT];          /* and their rows (the sum pushed), by slot */
  int tby[NT];          /* the shard that applied each, -1: none */
  int ntid;             /* slots used */
  int moved_answers;    /* "moved" answers given */
  int declares[NS];     /* Declares answered OK */
  /* A live move of table rows, layout 0 of 2 to 3: */
  int move_to;                  /* 3 while it runs (0: none) */
  int k[NS];                    /* the moves each shard knows made */
  int owner[CM_LAYOUT_BUCKETS]; /* each bucket's shard, -1: between two */
  int hold_bucket;              /* a bucket held back from its destination,
                                   ps:2 (-1: none), until ps:2 refused it
                                   `hold_for` more times (-1: for ever) */
  int hold_for;                 /* those refusals left */
  int hold_k;                   /* the destination's moves meanwhile */
  int sparse_calls[NS];         /* table calls each shard answered OK */
  int creep; /* > 0: a refusing shard says one move more than it said
                last, up to creep (a move whose batches land while the
                call re-plans, each answer one step newer) */
} st;

/* Table "t"'s slot of id, made when new. */
static int tslot(uint64_t id) {
  for (int i = 0; i < st.ntid; i++)
    if (st.tid[i] == id)
      return i;
  ck_assert_int_lt(st.ntid, NT);
  st.tid[st.ntid] = id;
  st.t[st.ntid] = 0;
  st.tby[st.ntid] = -1;
  return st.ntid++;
}

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
  /* A standby out of the layout, unless a live move's destination. */
  moved = st.endless || (s >= n && s >= st.move_to) || !k || k->layout != v ||
          k->shards != n;
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

/* A table call's ids against the buckets shard s holds: outside a move,
 * its count's map (asserted: the client planned by the layout); during
 * one, st.owner, and a call touching a bucket s does not hold is refused
 * whole, as psd refuses it. Returns 1 when refused. */
static int gate(struct cm_rpc_call *call, int s, const uint64_t *ids,
                size_t n) {
  static struct cm_layout_map m;
  int refused = -1, k = 0;
  uint64_t rid = 0;
  pthread_mutex_lock(&st.lock);
  for (size_t i = 0; i < n && refused < 0; i++) {
    uint64_t id;
    memcpy(&id, &ids[i], sizeof id);
    int b = (int)cm_layout_bucket(cm_layout_id_hash(id));
    if (!st.move_to) {
      if (m.nshards != st.count[s])
        cm_layout_map_init(&m, CM_LAYOUT_RULE_BUCKETS, st.count[s]);
      ck_assert_int_eq(cm_layout_map_id_shard(&m, id), s);
    } else if (st.owner[b] != s) {
      refused = b;
      rid = id;
    }
  }
  if (refused >= 0) {
    if (st.creep && st.k[s] < st.creep)
      st.k[s]++;
    k = st.k[s];
    st.moved_answers++;
    /* The destination, ps:2, of a bucket held back takes it after
     * refusing it enough. */
    if (s == 2 && refused == st.hold_bucket && st.hold_for > 0 &&
        --st.hold_for == 0) {
      st.owner[refused] = s;
      st.k[s] = st.hold_k;
      st.hold_bucket = -1;
    }
  }
  pthread_mutex_unlock(&st.lock);
  if (refused >= 0)
    cm_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION,
                "layout moved: ps:%d holds layout 0 of 2 shards, rows by "
                "buckets, moving to %d shards after %d moves; bucket %d "
                "(table 't' row %llu) is no longer here; the client re-plans "
                "and calls again",
                s, st.move_to, k, refused, (unsigned long long)rid);
  return refused >= 0;
}

/* Answers a table pull with each id's row (its sum so far). */
static void on_sparse_pull(struct cm_rpc_call *call, grpc_byte_buffer *bb,
                           void *ctx) {
  int s = (int)(intptr_t)ctx;
  struct cm_wire_msg w;
  Psd__V1__SparsePullRequest *req = NULL;
  if (cm_wire_parse(&w, bb) == 0)
    req = psd__v1__sparse_pull_request__unpack(NULL, w.head_len, w.head);
  ck_assert_ptr_nonnull(req);
  size_t n = w.bulk_len / sizeof(uint64_t);
  uint64_t ids[NT];
  ck_assert_uint_le(n, NT);
  cm_wire_bulk_read(&w, 0, ids, n * sizeof *ids);
  if (!check_layout(call, s, req->caller) && !gate(call, s, ids, n)) {
    /* The bulk is not copied (cm_wire_build): each answer has rows of
     * its own, freed with it. One buffer a shard, shared by the calls
     * that shard answers at once, gave one call another's rows. */
    float *rows = malloc(NT * sizeof *rows);
    ck_assert_ptr_nonnull(rows);
    Psd__V1__SparsePullResponse r = PSD__V1__SPARSE_PULL_RESPONSE__INIT;
    uint8_t head[64];
    r.dim = 1;
    size_t len = psd__v1__sparse_pull_response__pack(&r, head);
    pthread_mutex_lock(&st.lock);
    for (size_t i = 0; i < n; i++)
      rows[i] = st.t[tslot(ids[i])];
    st.sparse_calls[s]++;
    pthread_mutex_unlock(&st.lock);
    struct cm_wire_piece p = {(const uint8_t *)rows, n * sizeof(float)};
    cm_rpc_reply(call, cm_wire_build(head, len, &p, 1, free, rows));
  }
  psd__v1__sparse_pull_request__free_unpacked(req, NULL);
  cm_wire_msg_release(&w);
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
  size_t n = req->ids.len / sizeof(uint64_t);
  if (!check_layout(call, s, req->caller) &&
      !gate(call, s, (const uint64_t *)(const void *)req->ids.data, n)) {
    Psd__V1__SparsePushResponse r = PSD__V1__SPARSE_PUSH_RESPONSE__INIT;
    pthread_mutex_lock(&st.lock);
    for (size_t i = 0; i < n; i++) {
      uint64_t id;
      float row;
      memcpy(&id, req->ids.data + i * sizeof id, sizeof id);
      cm_wire_bulk_read(&w, i * sizeof row, &row, sizeof row);
      int k = tslot(id);
      st.t[k] += row;
      st.tby[k] = s;
    }
    st.sparse_calls[s]++;
    pthread_mutex_unlock(&st.lock);
    cm_rpc_reply(call, cm_rpc_pack(&r.base));
  }
  psd__v1__sparse_push_request__free_unpacked(req, NULL);
  cm_wire_msg_release(&w);
}

static struct cm_server *srv[NS];
static struct cm_spec *spec;
static struct cm_rpc_method methods[NS][5];

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
  st.hold_bucket = -1;
  for (int s = 0; s < NS; s++) {
    st.count[s] = 2;
    snprintf(addr[s], sizeof addr[s], "127.0.0.1:%d", free_port());
    void *ctx = (void *)(intptr_t)s;
    struct cm_rpc_method m[5] = {
        {"/psd.v1.Data/Declare", on_declare, ctx},
        {"/psd.v1.Data/Push", on_push, ctx},
        {"/psd.v1.Data/Pull", on_pull, ctx},
        {"/psd.v1.Data/SparsePush", on_sparse_push, ctx},
        {"/psd.v1.Data/SparsePull", on_sparse_pull, ctx}};
    memcpy(methods[s], m, sizeof m);
    ck_assert_int_eq(
        cm_server_new(&srv[s], addr[s], methods[s], 5, NULL, err, sizeof err),
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
    ck_assert_msg(st.t[tslot(ids[i])] == rows[i], "id %d: %g, pushed %g",
                  ID0 + i, st.t[tslot(ids[i])], rows[i]);
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
                       "push: the job's layout moved 9 times during one call; "
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

/* ---- a live move of table rows: layout 0 of 2 moving to 3 ---- */

#define NB 4  /* ids in the bucket that moves between plan and send */
#define NL 40 /* ids in all */

static int kb;            /* the moves made before that bucket's */
static int bb;            /* that bucket, one of ps:0's */
static uint64_t lids[NL]; /* NB ids in bb, then ids no move up to it moves */
static float lrows[NL];   /* their gradients */
static struct cm_layout_map m2; /* the map of 2 shards */

/* The move the tests make: bb is the first bucket of ps:0 to move after
 * another has (move kb + 1 of 2 -> 3); ids picked around it. */
static void plan_move(void) {
  static struct cm_layout_map after;
  uint16_t mv[CM_LAYOUT_BUCKETS];
  int n = cm_layout_moves(2, 3, mv), nb = 0, no = 0;
  cm_layout_map_init(&m2, CM_LAYOUT_RULE_BUCKETS, 2);
  for (kb = 1; kb < n && m2.shard[mv[kb]] != 0; kb++)
    ;
  ck_assert_int_lt(kb, n);
  bb = mv[kb];
  cm_layout_map_moving(&after, 2, 3, kb + 1);
  for (uint64_t id = 1; nb < NB || no < NL - NB; id++) {
    int b = (int)cm_layout_bucket(cm_layout_id_hash(id));
    if (b == bb && nb < NB)
      lids[nb++] = id;
    else if (b != bb && after.shard[b] == m2.shard[b] && no < NL - NB)
      lids[NB + no++] = id;
  }
  for (int i = 0; i < NL; i++)
    lrows[i] = 0.5f * (float)(i + 1);
}

/* The stand-ins partway through the move: each knows k moves made, each
 * bucket is where the map after k puts it. */
static void stand_at(int k) {
  static struct cm_layout_map m;
  cm_layout_map_moving(&m, 2, 3, k);
  pthread_mutex_lock(&st.lock);
  st.move_to = 3;
  for (int s = 0; s < NS; s++)
    st.k[s] = k;
  for (int b = 0; b < (int)CM_LAYOUT_BUCKETS; b++)
    st.owner[b] = m.shard[b];
  pthread_mutex_unlock(&st.lock);
}

/* bb between owners: ps:2 refuses it `times` times (-1: always), saying
 * k moves, then holds it and knows kb + 1. */
static void hold_bb(int times, int k) {
  pthread_mutex_lock(&st.lock);
  st.owner[bb] = -1;
  st.hold_bucket = bb;
  st.hold_for = times;
  st.hold_k = kb + 1;
  st.k[2] = k;
  pthread_mutex_unlock(&st.lock);
}

/* A client that knows the move after k moves, as psctl learns it from
 * the shards' status. */
static struct psc__client *client_at(int k) {
  struct psc__client *c = client();
  ck_assert_msg(
      psc__client_take_layout(c, 0, 0, 2, CM_LAYOUT_RULE_BUCKETS, 3, k) == 0,
      "%s", psc__client_error(c));
  ck_assert_int_eq(c->move_to, 3);
  ck_assert_int_eq(c->moves, k);
  c->moved_wait_ms = 2000; /* a test's, not 30 s: a failure comes soon */
  return c;
}

/* Every id pushed once: its row is its gradient, applied by `by` (bb's
 * ids) or by its shard of 2 (the others), or not at all (by -2). */
static void assert_pushed_once(int by) {
  for (int i = 0; i < NL; i++) {
    int k = tslot(lids[i]);
    int want_by =
        i < NB ? by
               : (int)m2.shard[cm_layout_bucket(cm_layout_id_hash(lids[i]))];
    if (want_by == -2) {
      ck_assert_msg(st.tby[k] == -1 && st.t[k] == 0, "id %llu applied",
                    (unsigned long long)lids[i]);
      continue;
    }
    ck_assert_msg(st.t[k] == lrows[i], "id %llu: %g, pushed %g",
                  (unsigned long long)lids[i], st.t[k], lrows[i]);
    ck_assert_int_eq(st.tby[k], want_by);
  }
}

/* Planned after kb moves; bb handed from ps:0 to ps:2 before the send:
 * ps:0 refuses its message, the client re-plans to kb + 1 and sends
 * bb's ids alone to ps:2, the rest of ps:0's again to ps:0; ps:1's
 * acknowledged ids are not sent again. */
START_TEST(table_push_bucket_moved) {
  plan_move();
  struct psc__client *c = client_at(kb);
  struct psc__rows r = {.table = "t", .ids = lids, .n = NL, .grads = lrows};
  stand_at(kb + 1);
  ck_assert_msg(psc__client_push_rows(c, &r, 1) == 0, "%s",
                psc__client_error(c));
  ck_assert_int_gt(st.moved_answers, 0);
  ck_assert_int_eq(c->nshards, 2);
  ck_assert_int_eq(c->move_to, 3);
  ck_assert_int_eq(c->moves, kb + 1);
  ck_assert_uint_eq(c->stats.replans, 1);
  ck_assert_uint_eq(c->stats.moved_waits, 0);
  assert_pushed_once(2);
  ck_assert_int_eq(st.sparse_calls[2], 1); /* bb's ids, one message */
  Psd__V1__Caller k = psc__caller(c, 2);
  ck_assert_uint_eq(k.move_to, 3);
  ck_assert_uint_eq(k.moved, (uint32_t)kb + 1);
  psc__client_free(c);
}
END_TEST

/* The same for a pull: every row read, bb's from ps:2. */
START_TEST(table_pull_bucket_moved) {
  plan_move();
  struct psc__client *c = client_at(kb);
  float got[NL];
  struct psc__rows r = {.table = "t", .ids = lids, .n = NL, .rows = got};
  for (int i = 0; i < NL; i++)
    st.t[tslot(lids[i])] = lrows[i];
  stand_at(kb + 1);
  ck_assert_msg(psc__client_pull_rows(c, &r, 1) == 0, "%s",
                psc__client_error(c));
  ck_assert_int_gt(st.moved_answers, 0);
  ck_assert_int_eq(c->moves, kb + 1);
  ck_assert_uint_eq(c->stats.replans, 1);
  ck_assert_mem_eq(got, lrows, sizeof got);
  ck_assert_int_gt(st.sparse_calls[2], 0);
  psc__client_free(c);
}
END_TEST

/* The client knows kb + 1 moves; ps:2, the destination, still says kb and
 * does not hold bb for 10 refusals (more than a call's re-plans): sent
 * again after a backoff, no re-plan, applied once when it does. */
START_TEST(lagging_shard_waited_for) {
  plan_move();
  struct psc__client *c = client_at(kb + 1);
  struct psc__rows r = {.table = "t", .ids = lids, .n = NL, .grads = lrows};
  stand_at(kb + 1);
  hold_bb(10, kb);
  ck_assert_msg(psc__client_push_rows(c, &r, 1) == 0, "%s",
                psc__client_error(c));
  ck_assert_int_eq(st.moved_answers, 10);
  ck_assert_uint_eq(c->stats.replans, 0);
  ck_assert_uint_eq(c->stats.moved_waits, 10);
  ck_assert_int_eq(c->moves, kb + 1);
  assert_pushed_once(2);
  psc__client_free(c);
}
END_TEST

/* The hand-over's window: ps:0 gave bb up, ps:2 does not hold it yet, and
 * both know kb + 1 moves. The client planned after kb: ps:0's refusal
 * re-plans it, ps:2's (naming the moves it knows) are waited out. */
START_TEST(hand_over_window_passes) {
  plan_move();
  struct psc__client *c = client_at(kb);
  struct psc__rows r = {.table = "t", .ids = lids, .n = NL, .grads = lrows};
  stand_at(kb + 1);
  hold_bb(2, kb + 1);
  ck_assert_msg(psc__client_push_rows(c, &r, 1) == 0, "%s",
                psc__client_error(c));
  ck_assert_uint_eq(c->stats.replans, 1);
  ck_assert_uint_eq(c->stats.moved_waits, 2);
  assert_pushed_once(2);
  psc__client_free(c);
}
END_TEST

/* A table declared during the move is declared on ps:2 too, the
 * destination that holds some of its rows meanwhile. */
START_TEST(table_declared_on_destination) {
  plan_move();
  struct psc__client *c = client_at(kb);
  struct psc__table t = {.name = "t2", .dim = 1};
  int before[NS];
  stand_at(kb);
  memcpy(before, st.declares, sizeof before);
  ck_assert_msg(psc__client_declare_tables(c, &t, 1) == 0, "%s",
                psc__client_error(c));
  for (int s = 0; s < NS; s++)
    ck_assert_int_eq(st.declares[s], before[s] + 1);
  psc__client_free(c);
}
END_TEST

/* A move whose batches land one by one while a call re-plans (each
 * answer names one move more): the call follows every step of it, more
 * than PSC__MAX_REPLANS, and pushes every id once. */
#define NC 24 /* moves made under the call, past PSC__MAX_REPLANS */
START_TEST(move_steps_under_one_call_followed) {
  uint16_t mv[CM_LAYOUT_BUCKETS];
  uint64_t ids[NC];
  float rows[NC];
  ck_assert_int_gt(cm_layout_moves(2, 3, mv), NC);
  for (int j = 0; j < NC; j++) { /* an id in the bucket of move j */
    uint64_t id = 1;
    while ((int)cm_layout_bucket(cm_layout_id_hash(id)) != mv[j])
      id++;
    ids[j] = id;
    rows[j] = 0.25f * (float)(j + 1);
  }
  struct psc__client *c = client_at(0);
  stand_at(NC);
  pthread_mutex_lock(&st.lock);
  st.creep = NC;
  for (int k = 0; k < NS; k++)
    st.k[k] = 0; /* they own the map after NC, and say one more each time */
  pthread_mutex_unlock(&st.lock);
  struct psc__rows r = {.table = "t", .ids = ids, .n = NC, .grads = rows};
  ck_assert_msg(psc__client_push_rows(c, &r, 1) == 0, "%s",
                psc__client_error(c));
  ck_assert_int_eq(c->moves, NC);
  ck_assert_uint_gt(c->stats.replans, PSC__MAX_REPLANS);
  for (int j = 0; j < NC; j++) {
    int k = tslot(ids[j]);
    ck_assert_msg(st.t[k] == rows[j], "id %llu: %g, pushed %g",
                  (unsigned long long)ids[j], st.t[k], rows[j]);
    ck_assert_int_eq(st.tby[k], 2);
  }
  psc__client_free(c);
}
END_TEST

/* bb never reaches ps:2: the push fails once the client's wait (150 ms
 * here, 30 s by default) is spent, naming ps:2, bb and the last answer;
 * the other ids were applied once, bb's not at all. */
START_TEST(bucket_refused_past_wait) {
  char want[256];
  plan_move();
  struct psc__client *c = client_at(kb + 1);
  struct psc__rows r = {.table = "t", .ids = lids, .n = NL, .grads = lrows};
  stand_at(kb + 1);
  hold_bb(-1, kb + 1);
  c->moved_wait_ms = 150;
  double t0 = cm_mono_ms();
  ck_assert_int_eq(psc__client_push_rows(c, &r, 1), CM_ERPC);
  double took = cm_mono_ms() - t0;
  ck_assert_msg(took >= 150 && took < 2000, "took %.0f ms", took);
  snprintf(want, sizeof want, "push rows: ps:2 refused bucket %d as moved for ",
           bb);
  ck_assert_msg(strstr(psc__client_error(c), want), "%s", psc__client_error(c));
  snprintf(want, sizeof want,
           "; the last answer: layout moved: ps:2 holds layout 0 of 2 "
           "shards, rows by buckets, moving to 3 shards after %d moves; "
           "bucket %d (table 't' row ",
           kb + 1, bb);
  ck_assert_msg(strstr(psc__client_error(c), want), "%s", psc__client_error(c));
  ck_assert_uint_eq(c->stats.replans, 0);
  ck_assert_uint_gt(c->stats.moved_waits, 3);
  assert_pushed_once(-2);
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
  tcase_add_test(tc, table_push_bucket_moved);
  tcase_add_test(tc, table_pull_bucket_moved);
  tcase_add_test(tc, lagging_shard_waited_for);
  tcase_add_test(tc, hand_over_window_passes);
  tcase_add_test(tc, table_declared_on_destination);
  tcase_add_test(tc, bucket_refused_past_wait);
  tcase_add_test(tc, move_steps_under_one_call_followed);
  tcase_set_timeout(tc, 60);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(moved_suite(), TU_NOFORK); }
