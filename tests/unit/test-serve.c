/* A serving task (serve.h) without files or a network: publications made
 * in memory applied by psd_serve_apply, and the handlers called as local
 * calls (cm_rpc_call_local). Lookup before anything is loaded
 * (UNAVAILABLE), rows by id with their found flags and the table's initial
 * row for ids never published, a spec table not published yet, dense
 * variables by name, the version, step and cut of the answer, min_version
 * ahead (UNAVAILABLE), unknown table and variable (NOT_FOUND naming them),
 * ids of another shard and a bad width refused, a delta's upserts and
 * removes, a delta that does not follow refused with nothing changed, a
 * full one replacing every row, every other call refused by name, and
 * Status's ServingStatus. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/slice.h>

#include "err.h"
#include "init.h"
#include "layout.h"
#include "ps.pb-c.h"
#include "pubfile.h"
#include "rpc.h"
#include "rpc_server.h"
#include "serve.h"
#include "serve_internal.h"
#include "table.h"
#include "unit.h"
#include "wire.h"

static struct psd_serve *s;
static struct cm_layout_map map2; /* a fresh job's of 2 shards */
static struct cm_table_conf spec_tab[2];
static Psd__V1__Caller caller = PSD__V1__CALLER__INIT;

/* Serving task 3 of job "t": shard 1 of 2; the spec names "emb" (dim 2,
 * uniform 0.5) and "later" (dim 3, never published here). */
static void setup(void) {
  cm_layout_map_init(&map2, CM_LAYOUT_RULE_BUCKETS, 2);
  struct psd_serve_conf c = {.dir = "/nonexistent",
                             .job = "t",
                             .replica = 3,
                             .shard = 1,
                             .shards = 2,
                             .seed = 7,
                             .tables = spec_tab,
                             .ntables = 2,
                             .max_message = 4u << 20};
  for (int i = 0; i < 2; i++)
    cm_table_conf_defaults(&spec_tab[i]);
  strcpy(spec_tab[0].name, "emb");
  spec_tab[0].dim = 2;
  spec_tab[0].init_scale = 0.5f;
  strcpy(spec_tab[1].name, "later");
  spec_tab[1].dim = 3;
  caller.job = "t";
  caller.worker = "test";
  ck_assert_int_eq(psd_serve_new(&s, &c), 0);
}

static void teardown(void) { psd_serve_free(s); }

/* The first n ids held by shard 1 of 2, from `from` on. */
static void shard_ids(uint64_t from, size_t n, uint64_t *out) {
  for (uint64_t id = from; n; id++)
    if (cm_layout_map_id_shard(&map2, id) == 1) {
      *out++ = id;
      n--;
    }
}

/* A publication: table "emb" (dim 2) with rows ids[0..n) of value id +
 * j / 4 + version, and dense "w" (shape 4 x 3, rows 2..4 here, values
 * version * 100 + k); removed[0..nrm). */
static struct psd_pub *pub(uint64_t version, int full, uint64_t base,
                           const uint64_t *ids, size_t n,
                           const uint64_t *removed, size_t nrm) {
  struct psd_pub *p = calloc(1, sizeof *p);
  p->version = version;
  p->full = full;
  p->base = base;
  p->prev = full ? 0 : version - 1;
  p->step = version * 10;
  p->time_unix_ms = 1700000000000 + (int64_t)version;
  p->shard = 1;
  p->shards = 2;
  strcpy(p->job, "t");
  p->ntables = 1;
  p->tables = calloc(1, sizeof *p->tables);
  struct psd_pub_table *t = &p->tables[0];
  strcpy(t->name, "emb");
  t->dim = 2;
  t->nrows = n;
  t->ids = malloc((n + 1) * sizeof *t->ids);
  t->values = malloc((2 * n + 1) * sizeof *t->values);
  for (size_t i = 0; i < n; i++) {
    t->ids[i] = ids[i];
    for (int j = 0; j < 2; j++)
      t->values[i * 2 + j] = (float)ids[i] + j / 4.0f + (float)version;
  }
  t->nremoved = nrm;
  t->removed = malloc((nrm + 1) * sizeof *t->removed);
  if (nrm)
    memcpy(t->removed, removed, nrm * sizeof *removed);
  p->ndense = 2;
  p->dense = calloc(2, sizeof *p->dense);
  /* "v" is placed whole on the other shard: no rows here, no values */
  strcpy(p->dense[1].name, "v");
  p->dense[1].ndim = 1;
  p->dense[1].shape[0] = 5;
  strcpy(p->dense[0].name, "w");
  p->dense[0].ndim = 2;
  p->dense[0].shape[0] = 4;
  p->dense[0].shape[1] = 3;
  p->dense[0].row_begin = 2;
  p->dense[0].row_end = 4;
  p->dense[0].values = malloc(6 * sizeof(float));
  for (int k = 0; k < 6; k++)
    p->dense[0].values[k] = (float)(version * 100 + k);
  return p;
}

static void pub_free(struct psd_pub *p) {
  for (int i = 0; i < p->ntables; i++) {
    free(p->tables[i].ids);
    free(p->tables[i].values);
    free(p->tables[i].removed);
  }
  for (int i = 0; i < p->ndense; i++)
    free(p->dense[i].values);
  free(p->tables);
  free(p->dense);
  free(p);
}

static int apply(struct psd_pub *p, char *err) {
  int rc = psd_serve_apply(s, p, err, 512);
  pub_free(p);
  return rc;
}

static const struct cm_rpc_method *method(const char *path) {
  int n;
  const struct cm_rpc_method *m = psd_serve_methods(s, &n);
  for (int i = 0; i < n; i++)
    if (!strcmp(m[i].path, path))
      return &m[i];
  ck_abort_msg("serving task serves no %s", path);
  return NULL;
}

/* Calls path with msg; checks the status and that the message holds want. */
static void call(const char *path, const ProtobufCMessage *msg,
                 grpc_status_code code, const char *want,
                 struct cm_rpc_answer *ans) {
  grpc_byte_buffer *bb = cm_rpc_pack(msg);
  ck_assert_int_eq(cm_rpc_call_local(method(path), bb, ans), 0);
  grpc_byte_buffer_destroy(bb);
  ck_assert(ans->answered);
  ck_assert_msg(ans->status == code, "%s: %s %s", path,
                cm_rpc_status_name(ans->status), ans->details);
  if (want)
    ck_assert_msg(strstr(ans->details, want), "'%s' lacks '%s'", ans->details,
                  want);
}

/* A Lookup answer taken apart: the head, and its data (floats). */
struct got {
  Psd__V1__LookupResponse *r; /* owned */
  float data[256];            /* the bulk field */
  size_t nfloats;             /* floats in data */
};

static void lookup(const char *table, const uint64_t *ids, size_t n,
                   const char *const *dense, size_t nd, uint64_t min_version,
                   grpc_status_code code, const char *want, struct got *g) {
  Psd__V1__LookupRequest r = PSD__V1__LOOKUP_REQUEST__INIT;
  struct cm_rpc_answer ans;
  r.caller = &caller;
  r.table = (char *)table;
  r.ids.data = (uint8_t *)ids;
  r.ids.len = n * sizeof *ids;
  r.dense = (char **)dense;
  r.n_dense = nd;
  r.min_version = min_version;
  call("/psd.v1.Serve/Lookup", &r.base, code, want, &ans);
  if (code == GRPC_STATUS_OK) {
    struct cm_wire_msg m;
    ck_assert_int_eq(cm_wire_parse(&m, ans.response), 0);
    g->r = psd__v1__lookup_response__unpack(NULL, m.head_len, m.head);
    ck_assert_ptr_nonnull(g->r);
    ck_assert_uint_le(m.bulk_len, sizeof g->data);
    ck_assert_int_eq(cm_wire_bulk_read(&m, 0, g->data, m.bulk_len), 0);
    g->nfloats = m.bulk_len / sizeof(float);
    cm_wire_msg_release(&m);
  }
  cm_rpc_answer_release(&ans);
}

static void got_free(struct got *g) {
  psd__v1__lookup_response__free_unpacked(g->r, NULL);
}

START_TEST(lookup_rows_and_dense) {
  uint64_t ids[6], ask[4], other = 0;
  const char *w[1] = {"w"}, *nope[1] = {"nope"};
  char err[512];
  struct got g;
  shard_ids(100, 6, ids);
  /* nothing loaded: UNAVAILABLE, naming what it follows */
  lookup("emb", ids, 1, NULL, 0, 0, GRPC_STATUS_UNAVAILABLE,
         "serve:3 has loaded no publication of shard 1 yet", NULL);
  ck_assert_int_eq(apply(pub(1, 1, 1, ids, 4, NULL, 0), err), 0);
  /* rows 0..3 published; ids[4] never: found 0, the initial row */
  ask[0] = ids[2];
  ask[1] = ids[4];
  ask[2] = ids[0];
  ask[3] = ids[2];
  lookup("emb", ask, 4, w, 1, 1, GRPC_STATUS_OK, NULL, &g);
  ck_assert_uint_eq(g.r->version, 1);
  ck_assert_uint_eq(g.r->step, 10);
  ck_assert_int_eq(g.r->time_unix_ms, 1700000000001);
  ck_assert_uint_eq(g.r->dim, 2);
  ck_assert_uint_eq(g.r->found.len, 4);
  ck_assert(g.r->found.data[0] && !g.r->found.data[1] && g.r->found.data[2] &&
            g.r->found.data[3]);
  ck_assert_uint_eq(g.nfloats, 4 * 2 + 6);
  ck_assert(g.data[0] == (float)ids[2] + 1 && g.data[1] == ids[2] + 1.25f);
  ck_assert(g.data[4] == (float)ids[0] + 1 && g.data[6] == g.data[0]);
  float init[2];
  cm_table_init_row(&spec_tab[0], 7, ids[4], init);
  ck_assert(!memcmp(g.data + 2, init, sizeof init) && init[0] != 0);
  ck_assert_uint_eq(g.r->n_dense, 1);
  ck_assert_str_eq(g.r->dense[0]->name, "w");
  ck_assert_int_eq(g.r->dense[0]->row_begin, 2);
  ck_assert_int_eq(g.r->dense[0]->row_end, 4);
  for (int k = 0; k < 6; k++)
    ck_assert(g.data[8 + k] == 100 + k);
  got_free(&g);
  /* a spec table not published yet: every row its initial one */
  lookup("later", ids, 1, NULL, 0, 0, GRPC_STATUS_OK, NULL, &g);
  ck_assert_uint_eq(g.r->dim, 3);
  ck_assert(!g.r->found.data[0]);
  got_free(&g);
  /* dense alone; one of another shard's: no rows */
  const char *wv[2] = {"v", "w"};
  lookup("", NULL, 0, wv, 2, 0, GRPC_STATUS_OK, NULL, &g);
  ck_assert_uint_eq(g.nfloats, 6);
  ck_assert_uint_eq(g.r->n_dense, 2);
  ck_assert_int_eq(g.r->dense[0]->row_end, 0);
  ck_assert_int_eq(g.r->dense[1]->row_end, 4);
  ck_assert(g.data[0] == 100);
  got_free(&g);
  /* refusals */
  lookup("emb", ids, 1, NULL, 0, 2, GRPC_STATUS_UNAVAILABLE,
         "serve:3 holds version 1, behind min_version 2", NULL);
  lookup("nope", ids, 1, NULL, 0, 0, GRPC_STATUS_NOT_FOUND,
         "serve:3 has no table 'nope'", NULL);
  lookup("emb", ids, 1, nope, 1, 0, GRPC_STATUS_NOT_FOUND,
         "no dense variable 'nope'", NULL);
  while (cm_layout_map_id_shard(&map2, other) != 0)
    other++;
  lookup("emb", &other, 1, NULL, 0, 0, GRPC_STATUS_INVALID_ARGUMENT,
         "belongs to shard 0, not shard 1, which serve:3 serves", NULL);
  lookup("", ids, 1, NULL, 0, 0, GRPC_STATUS_INVALID_ARGUMENT, "no table",
         NULL);
}
END_TEST

START_TEST(deltas_and_full) {
  uint64_t ids[6];
  const char *w[1] = {"w"};
  char err[512];
  struct got g;
  shard_ids(1000, 6, ids);
  ck_assert_int_eq(apply(pub(4, 1, 4, ids, 3, NULL, 0), err), 0);
  /* a delta that does not follow version 4: refused, nothing changed */
  ck_assert_int_eq(apply(pub(6, 0, 4, ids + 3, 3, NULL, 0), err), CM_EFORMAT);
  ck_assert_msg(strstr(err, "version 6 is a delta after version 5") &&
                    strstr(err, "holds version 4"),
                "%s", err);
  ck_assert_int_eq(apply(pub(5, 0, 3, ids + 3, 3, NULL, 0), err), CM_EFORMAT);
  lookup("emb", ids, 6, w, 1, 0, GRPC_STATUS_OK, NULL, &g);
  ck_assert_uint_eq(g.r->version, 4);
  for (int i = 0; i < 6; i++)
    ck_assert_int_eq(g.r->found.data[i], i < 3);
  ck_assert(g.data[12] == 400);
  got_free(&g);
  /* the delta 5: ids 3..5 added, id 0 removed, id 1 changed */
  ck_assert_int_eq(apply(pub(5, 0, 4, ids + 1, 5, ids, 1), err), 0);
  lookup("emb", ids, 6, w, 1, 5, GRPC_STATUS_OK, NULL, &g);
  ck_assert_uint_eq(g.r->version, 5);
  for (int i = 0; i < 6; i++)
    ck_assert_int_eq(g.r->found.data[i], i > 0);
  ck_assert(g.data[2] == (float)ids[1] + 5);
  ck_assert(g.data[12] == 500);
  got_free(&g);
  /* a full one replaces every row: only ids 4, 5 now */
  ck_assert_int_eq(apply(pub(6, 1, 6, ids + 4, 2, NULL, 0), err), 0);
  lookup("emb", ids, 6, NULL, 0, 0, GRPC_STATUS_OK, NULL, &g);
  for (int i = 0; i < 6; i++)
    ck_assert_int_eq(g.r->found.data[i], i >= 4);
  got_free(&g);
}
END_TEST

/* A live move 2 -> 3 takes buckets from shard 1 (docs/serving.md
 * "Following a reshard"): the version that names it lists their rows as
 * removed, as a source does, yet they are answered a while (the new
 * shard's task catching up), then dropped; an id never this shard's is
 * answered "layout moved" with the version's layout, for the client to
 * plan again. */
START_TEST(buckets_a_move_took_stay_answered_a_while) {
  struct cm_layout_map *map3 = malloc(sizeof *map3);
  int total = cm_layout_map_moving(map3, 2, 3, CM_LAYOUT_BUCKETS);
  uint64_t stay = 0, left = 0, other = 0;
  char err[512], want[200];
  struct got g;
  for (uint64_t id = 1; !stay || !left || !other; id++) {
    int was = cm_layout_map_id_shard(&map2, id),
        now = map3->shard[cm_layout_bucket(cm_layout_id_hash(id))];
    if (was == 1 && now == 1 && !stay)
      stay = id;
    else if (was == 1 && now == 2 && !left)
      left = id;
    else if (was == 0 && now == 0 && !other)
      other = id;
  }
  uint64_t both[2] = {stay, left};
  s->keep_left_ms = 60000;
  ck_assert_int_eq(apply(pub(1, 1, 1, both, 2, NULL, 0), err), 0);
  struct psd_pub *p = pub(2, 0, 1, &stay, 1, &left, 1);
  p->move_to = 3;
  p->moved = total;
  ck_assert_int_eq(apply(p, err), 0);
  caller.shards = 2;
  caller.move_to = 3;
  caller.moved = (uint32_t)total;
  lookup("emb", both, 2, NULL, 0, 0, GRPC_STATUS_OK, NULL, &g);
  ck_assert_int_eq(g.r->found.data[0], 1);
  ck_assert_int_eq(g.r->found.data[1], 1); /* left, still answered */
  ck_assert(g.data[2] == (float)left + 1); /* version 1's value */
  ck_assert_int_eq(g.r->shards, 2);
  ck_assert_int_eq(g.r->move_to, 3);
  ck_assert_int_eq(g.r->moved, total);
  got_free(&g);
  snprintf(want, sizeof want,
           "layout moved: ps:1 holds layout 0 of 2 shards, rows by buckets, "
           "moving to 3 shards after %d moves",
           total);
  lookup("emb", &other, 1, NULL, 0, 0, GRPC_STATUS_FAILED_PRECONDITION, want,
         &g);
  /* its time up, the next version drops it */
  s->keep_left_ms = 0;
  p = pub(3, 0, 1, &stay, 1, NULL, 0);
  p->move_to = 3;
  p->moved = total;
  ck_assert_int_eq(apply(p, err), 0);
  lookup("emb", &left, 1, NULL, 0, 0, GRPC_STATUS_FAILED_PRECONDITION,
         "on shard 2", &g);
  caller.shards = 0;
  caller.move_to = 0;
  caller.moved = 0;
  free(map3);
}
END_TEST

START_TEST(other_calls_refused_and_status) {
  Psd__V1__PushRequest push = PSD__V1__PUSH_REQUEST__INIT;
  Psd__V1__StatusRequest st = PSD__V1__STATUS_REQUEST__INIT;
  struct cm_rpc_answer ans;
  uint64_t ids[2];
  char err[512];
  push.caller = &caller;
  call("/psd.v1.Data/Push", &push.base, GRPC_STATUS_FAILED_PRECONDITION,
       "serve:3 is a serving task (read-only): Data/Push is refused", &ans);
  cm_rpc_answer_release(&ans);
  call("/psd.v1.Data/SparsePush", &push.base, GRPC_STATUS_FAILED_PRECONDITION,
       "Data/SparsePush is refused", &ans);
  cm_rpc_answer_release(&ans);
  call("/psd.v1.Admin/Export", &push.base, GRPC_STATUS_FAILED_PRECONDITION,
       "Admin/Export is refused", &ans);
  cm_rpc_answer_release(&ans);
  shard_ids(0, 2, ids);
  ck_assert_int_eq(apply(pub(1, 1, 1, ids, 2, NULL, 0), err), 0);
  st.caller = &caller;
  call("/psd.v1.Admin/Status", &st.base, GRPC_STATUS_OK, NULL, &ans);
  Psd__V1__StatusResponse *r;
  {
    grpc_byte_buffer_reader rd;
    grpc_byte_buffer_reader_init(&rd, ans.response);
    grpc_slice sl = grpc_byte_buffer_reader_readall(&rd);
    r = psd__v1__status_response__unpack(NULL, GRPC_SLICE_LENGTH(sl),
                                         GRPC_SLICE_START_PTR(sl));
    grpc_slice_unref(sl);
    grpc_byte_buffer_reader_destroy(&rd);
  }
  ck_assert_ptr_nonnull(r);
  ck_assert_ptr_nonnull(r->serving);
  ck_assert_int_eq(r->serving->replica, 3);
  ck_assert_int_eq(r->serving->shard, 1);
  ck_assert_uint_eq(r->serving->version, 1);
  ck_assert_uint_eq(r->serving->rows, 2);
  ck_assert_uint_gt(r->serving->bytes, 2 * 2 * 4);
  ck_assert_uint_eq(r->errors, 3);
  psd__v1__status_response__free_unpacked(r, NULL);
  cm_rpc_answer_release(&ans);
}
END_TEST

static Suite *suite(void) {
  Suite *su = suite_create("serve");
  TCase *tc = tcase_create("core");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, lookup_rows_and_dense);
  tcase_add_test(tc, deltas_and_full);
  tcase_add_test(tc, buckets_a_move_took_stay_answered_a_while);
  tcase_add_test(tc, other_calls_refused_and_status);
  suite_add_tcase(su, tc);
  return su;
}

int main(void) {
  cm_rpc_global_init();
  return tu_run(suite(), TU_NOFORK);
}
