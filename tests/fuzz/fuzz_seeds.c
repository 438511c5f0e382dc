/* fuzz-seeds DIR: writes the fuzzer's seed corpus, valid conversations with
 * a shard in the format of fuzz_input.h: every method alone (each of
 * fuzz_methods, async and sync), an async job (declare, push, pull, status,
 * checkpoint, the coordinator's calls), a push with NaN under each policy, a
 * sync step (join, stage, admit, commit, a parked pull, a late push), the
 * embedding tables' calls in an async job and a sync step (admission,
 * eviction, rows, export), each method with each field of its request
 * left out in turn, Declare's initial values (fuzz_seeds_values.c), and
 * a serving task's lookups.
 * Built with the ordinary compiler, so the seeds always match the current
 * proto. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_input.h"
#include "fuzz_seeds.h"
#include "ps.pb-c.h"
#include "rand.h"

Psd__V1__Caller fseed_caller = PSD__V1__CALLER__INIT;

static int method_index(const char *path) {
  for (int i = 0; i < FUZZ_NMETHODS; i++)
    if (!strcmp(fuzz_methods[i], path))
      return i;
  fprintf(stderr, "fuzz-seeds: no method %s\n", path);
  exit(1);
}

uint32_t fseed_drop_field;
/* While set, fseed_add() leaves every field but the caller (field 1 of
 * every request) out. */
static int only_caller;

static uint64_t varint(const uint8_t *p, size_t n, size_t *at) {
  uint64_t v = 0;
  for (int sh = 0; *at < n && sh < 64; sh += 7) {
    uint8_t c = p[(*at)++];
    v |= (uint64_t)(c & 0x7f) << sh;
    if (!(c & 0x80))
      break;
  }
  return v;
}

/* Copies the top-level fields of p[0..n) that fseed_drop_field and only_caller
 * keep to out; returns the bytes written. */
static size_t keep_fields(const uint8_t *p, size_t n, uint8_t *out) {
  size_t at = 0, w = 0;
  while (at < n) {
    size_t start = at;
    uint64_t key = varint(p, n, &at);
    switch (key & 7) {
    case 0:
      varint(p, n, &at);
      break;
    case 1:
      at += 8;
      break;
    case 5:
      at += 4;
      break;
    default: /* 2: what protobuf-c writes for the rest */
      at += varint(p, n, &at);
    }
    uint32_t field = (uint32_t)(key >> 3);
    if (field == fseed_drop_field || (only_caller && field != 1))
      continue;
    memcpy(out + w, p + start, at - start);
    w += at - start;
  }
  return w;
}

void fseed_add(struct seed *s, const char *path, int cut,
               const ProtobufCMessage *msg) {
  static uint8_t whole[1 << 16];
  size_t n = protobuf_c_message_get_packed_size(msg);
  if (s->len + 3 + n > sizeof s->buf) {
    fprintf(stderr, "fuzz-seeds: seed too large\n");
    exit(1);
  }
  protobuf_c_message_pack(msg, whole);
  n = keep_fields(whole, n, s->buf + s->len + 3);
  s->buf[s->len++] = (uint8_t)(method_index(path) + FUZZ_NMETHODS * cut);
  s->buf[s->len++] = (uint8_t)(n & 0xff);
  s->buf[s->len++] = (uint8_t)(n >> 8);
  s->len += n;
}

/* The request message of method path, from the proto's services. */
static const ProtobufCMessageDescriptor *request_of(const char *path) {
  static const ProtobufCServiceDescriptor *const svcs[] = {
      &psd__v1__data__descriptor, &psd__v1__coord__descriptor,
      &psd__v1__admin__descriptor, &psd__v1__serve__descriptor};
  for (int k = 0; k < 4; k++)
    for (unsigned i = 0; i < svcs[k]->n_methods; i++) {
      char p[128];
      snprintf(p, sizeof p, "/%s/%s", svcs[k]->name, svcs[k]->methods[i].name);
      if (!strcmp(p, path))
        return svcs[k]->methods[i].input;
    }
  fprintf(stderr, "fuzz-seeds: %s is no rpc of proto/ps.proto\n", path);
  exit(1);
}

void fseed_write(const char *dir, const char *name, const struct seed *s) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(s->buf, 1, s->len, f) != s->len || fclose(f) != 0) {
    fprintf(stderr, "fuzz-seeds: cannot write %s: %s\n", path, strerror(errno));
    exit(1);
  }
}

static int64_t shape_w[2] = {4, 3}, shape_b[1] = {3};

static void declare(struct seed *s, int cut) {
  Psd__V1__DeclareRequest r = PSD__V1__DECLARE_REQUEST__INIT;
  Psd__V1__VarSpec w = PSD__V1__VAR_SPEC__INIT, b = PSD__V1__VAR_SPEC__INIT;
  Psd__V1__VarSpec *v[2] = {&w, &b};
  w.name = "w";
  w.n_shape = 2;
  w.shape = shape_w;
  w.placement = -1;
  w.init = PSD__V1__INIT__INIT_UNIFORM;
  w.init_scale = 0.1f;
  w.seed = 7;
  b.name = "b";
  b.n_shape = 1;
  b.shape = shape_b;
  b.placement = 0;
  r.caller = &fseed_caller;
  r.n_vars = 2;
  r.vars = v;
  fseed_add(s, "/psd.v1.Data/Declare", cut, &r.base);
}

/* A push of w's rows on shard 0 ([0, 6)) and all of b, values g[0..9). */
static void push(struct seed *s, int cut, uint64_t step, int worker,
                 const float *g) {
  Psd__V1__PushRequest r = PSD__V1__PUSH_REQUEST__INIT;
  Psd__V1__Segment w = PSD__V1__SEGMENT__INIT, b = PSD__V1__SEGMENT__INIT;
  Psd__V1__Segment *sg[2] = {&w, &b};
  w.name = "w";
  w.count = 6;
  w.n_shape = 2;
  w.shape = shape_w;
  b.name = "b";
  b.count = 3;
  b.n_shape = 1;
  b.shape = shape_b;
  r.caller = &fseed_caller;
  r.n_segments = 2;
  r.segments = sg;
  r.examples = 32;
  r.step = step;
  r.worker = worker;
  r.has_worker = 1;
  r.first = 1;
  r.data.len = 9 * sizeof(float);
  r.data.data = (uint8_t *)g;
  fseed_add(s, "/psd.v1.Data/Push", cut, &r.base);
}

static void pull(struct seed *s, int cut, uint64_t min_version) {
  Psd__V1__PullRequest r = PSD__V1__PULL_REQUEST__INIT;
  Psd__V1__Segment w = PSD__V1__SEGMENT__INIT, *sg[1] = {&w};
  w.name = "w";
  w.offset = 3;
  w.count = 3;
  r.caller = &fseed_caller;
  r.n_segments = 1;
  r.segments = sg;
  r.min_version = min_version;
  fseed_add(s, "/psd.v1.Data/Pull", cut, &r.base);
}

static void status(struct seed *s, int cut) {
  Psd__V1__StatusRequest r = PSD__V1__STATUS_REQUEST__INIT;
  r.caller = &fseed_caller;
  fseed_add(s, "/psd.v1.Admin/Status", cut, &r.base);
}

static void checkpoint(struct seed *s, int cut) {
  Psd__V1__CheckpointRequest r = PSD__V1__CHECKPOINT_REQUEST__INIT;
  r.caller = &fseed_caller;
  r.wait = 1;
  fseed_add(s, "/psd.v1.Admin/Checkpoint", cut, &r.base);
}

static void join(struct seed *s, int cut, int worker) {
  Psd__V1__JoinRequest r = PSD__V1__JOIN_REQUEST__INIT;
  r.caller = &fseed_caller;
  r.worker = worker;
  fseed_add(s, "/psd.v1.Coord/Join", cut, &r.base);
}

static void heartbeat(struct seed *s, int cut, int worker) {
  Psd__V1__HeartbeatRequest r = PSD__V1__HEARTBEAT_REQUEST__INIT;
  r.caller = &fseed_caller;
  r.worker = worker;
  fseed_add(s, "/psd.v1.Coord/Heartbeat", cut, &r.base);
}

static void admit(struct seed *s, int cut, int worker, uint64_t step) {
  Psd__V1__AdmitRequest r = PSD__V1__ADMIT_REQUEST__INIT;
  r.caller = &fseed_caller;
  r.worker = worker;
  r.step = step;
  fseed_add(s, "/psd.v1.Coord/Admit", cut, &r.base);
}

static void clock_(struct seed *s, int cut, int worker, uint64_t clock) {
  Psd__V1__ClockRequest r = PSD__V1__CLOCK_REQUEST__INIT;
  r.caller = &fseed_caller;
  r.worker = worker;
  r.clock = clock;
  fseed_add(s, "/psd.v1.Coord/Clock", cut, &r.base);
}

static void commit(struct seed *s, int cut, uint64_t step) {
  Psd__V1__CommitRequest r = PSD__V1__COMMIT_REQUEST__INIT;
  int32_t applied[2] = {0, 1};
  r.caller = &fseed_caller;
  r.step = step;
  r.n_applied = 2;
  r.applied = applied;
  fseed_add(s, "/psd.v1.Data/Commit", cut, &r.base);
}

static void rollback(struct seed *s, int cut, uint64_t step, uint64_t gen) {
  Psd__V1__RollbackRequest r = PSD__V1__ROLLBACK_REQUEST__INIT;
  r.caller = &fseed_caller;
  r.step = step;
  r.gen = gen;
  fseed_add(s, "/psd.v1.Data/Rollback", cut, &r.base);
}

/* The k-th id (from 0) that shard 0 of 2 holds (table.h: splitmix64(id) %
 * shards). */
static uint64_t mine(int k) {
  for (uint64_t id = 0;; id++)
    if (cm_splitmix64_at(id) % 2 == 0 && k-- == 0)
      return id;
}

/* A Declare of the variables and of tables: "emb" as the spec has it, and
 * "extra", which only this declares. */
static void declare_tables(struct seed *s, int cut) {
  Psd__V1__DeclareRequest r = PSD__V1__DECLARE_REQUEST__INIT;
  Psd__V1__TableSpec emb = PSD__V1__TABLE_SPEC__INIT,
                     extra = PSD__V1__TABLE_SPEC__INIT;
  Psd__V1__TableSpec *t[2] = {&emb, &extra};
  emb.name = "emb";
  emb.dim = 2;
  extra.name = "extra";
  extra.dim = 2;
  extra.id_bound = 100;
  r.caller = &fseed_caller;
  r.n_tables = 2;
  r.tables = t;
  fseed_add(s, "/psd.v1.Data/Declare", cut, &r.base);
}

/* The first n ids of shard 0 as SparsePull's or SparsePush's ids. */
static uint64_t ids_buf[8];
static ProtobufCBinaryData ids(int first, int n) {
  for (int i = 0; i < n; i++)
    ids_buf[i] = mine(first + i);
  return (ProtobufCBinaryData){(size_t)n * sizeof(uint64_t),
                               (uint8_t *)ids_buf};
}

static void sparse_pull(struct seed *s, int cut, const char *table, int first,
                        int n, uint64_t min_version) {
  Psd__V1__SparsePullRequest r = PSD__V1__SPARSE_PULL_REQUEST__INIT;
  r.caller = &fseed_caller;
  r.table = (char *)table;
  r.min_version = min_version;
  r.ids = ids(first, n);
  fseed_add(s, "/psd.v1.Data/SparsePull", cut, &r.base);
}

/* A push of rows of width dim for ids first.. first + n, values from g. */
static void sparse_push(struct seed *s, int cut, const char *table, int first,
                        int n, int dim, const float *g, uint64_t step,
                        int worker) {
  Psd__V1__SparsePushRequest r = PSD__V1__SPARSE_PUSH_REQUEST__INIT;
  r.caller = &fseed_caller;
  r.table = (char *)table;
  r.examples = 8;
  r.step = step;
  r.worker = worker;
  r.has_worker = 1;
  r.client_id = 77;
  r.seq = (uint64_t)s->len; /* a new message each time */
  r.ids = ids(first, n);
  r.data.len = (size_t)n * dim * sizeof(float);
  r.data.data = (uint8_t *)g;
  fseed_add(s, "/psd.v1.Data/SparsePush", cut, &r.base);
}

static void rows(struct seed *s, int cut, const char *table, int first, int n,
                 uint32_t top) {
  Psd__V1__RowsRequest r = PSD__V1__ROWS_REQUEST__INIT;
  uint64_t want[8];
  for (int i = 0; i < n; i++)
    want[i] = mine(first + i);
  r.caller = &fseed_caller;
  r.table = (char *)table;
  r.n_ids = (size_t)n;
  r.ids = want;
  r.top = top;
  fseed_add(s, "/psd.v1.Admin/Rows", cut, &r.base);
}

/* A Lookup of shard 0's first n rows of table and of dense variables
 * dense[0..nd) (the serving task of fuzz_service.c). */
static void lookup(struct seed *s, int cut, const char *table, int first, int n,
                   const char *const *dense, int nd, uint64_t min_version) {
  Psd__V1__LookupRequest r = PSD__V1__LOOKUP_REQUEST__INIT;
  r.caller = &fseed_caller;
  r.table = (char *)table;
  r.ids = ids(first, n);
  r.n_dense = (size_t)nd;
  r.dense = (char **)dense;
  r.min_version = min_version;
  fseed_add(s, "/psd.v1.Serve/Lookup", cut, &r.base);
}

/* Each method alone, with the arguments a first call of it would have
 * (fuzz_methods' order does not matter: looked up by path). */
static const float g0[16] = {0.5f,  -1, 2, 0.25f, -0.125f, 3, 1, -2,
                             0.75f, 1,  1, 1,     1,       1, 1, 1};
static void one_declare(struct seed *s) { declare(s, 0); }
static void one_pull(struct seed *s) { pull(s, 0, 0); }
static void one_push(struct seed *s) { push(s, 0, 0, 0, g0); }
static void one_commit(struct seed *s) { commit(s, 0, 0); }
static void one_status(struct seed *s) { status(s, 0); }
static void one_checkpoint(struct seed *s) { checkpoint(s, 0); }
static void one_join(struct seed *s) { join(s, 0, 0); }
static void one_heartbeat(struct seed *s) { heartbeat(s, 0, 0); }
static void one_admit(struct seed *s) { admit(s, 0, 0, 0); }
static void one_clock(struct seed *s) { clock_(s, 0, 0, 1); }
static void one_rollback(struct seed *s) { rollback(s, 0, 0, 1); }
static void one_sparse_pull(struct seed *s) {
  sparse_pull(s, 0, "emb", 0, 3, 0);
}
static void one_sparse_push(struct seed *s) {
  sparse_push(s, 0, "emb", 0, 3, 2, g0, 0, 0);
}
static void one_rows(struct seed *s) { rows(s, 0, "emb", 0, 2, 0); }
static void one_shrink(struct seed *s) { fseed_shrink(s, 0, "adm"); }
static void one_export(struct seed *s) { fseed_export(s, 0, "emb", 0, 0, 0); }
static void one_reshard(struct seed *s) { fseed_reshard(s, 0, 3, 0, 0, 0); }
static void one_move_rows(struct seed *s) { fseed_move(s, 0, 0, 0, 2); }
static void one_move_buckets(struct seed *s) { fseed_move(s, 0, 1, 0, 2); }
static void one_switch(struct seed *s) { fseed_switch(s, 0, 0, 2, 3, 1); }
static void one_dense_rows(struct seed *s) {
  fseed_dense_rows(s, 0, "w", 2, 1);
}
static void one_lookup(struct seed *s) {
  static const char *const w[1] = {"w"};
  lookup(s, 0, "emb", 0, 3, w, 1, 1);
}

static const struct {
  const char *path;             /* the method */
  void (*write)(struct seed *); /* its call */
} alone[] = {
    {"/psd.v1.Data/Declare", one_declare},
    {"/psd.v1.Data/Pull", one_pull},
    {"/psd.v1.Data/Push", one_push},
    {"/psd.v1.Data/Commit", one_commit},
    {"/psd.v1.Data/Rollback", one_rollback},
    {"/psd.v1.Data/SparsePull", one_sparse_pull},
    {"/psd.v1.Data/SparsePush", one_sparse_push},
    {"/psd.v1.Admin/Status", one_status},
    {"/psd.v1.Admin/Checkpoint", one_checkpoint},
    {"/psd.v1.Admin/Rows", one_rows},
    {"/psd.v1.Admin/Shrink", one_shrink},
    {"/psd.v1.Admin/Export", one_export},
    {"/psd.v1.Coord/Join", one_join},
    {"/psd.v1.Coord/Heartbeat", one_heartbeat},
    {"/psd.v1.Coord/Admit", one_admit},
    {"/psd.v1.Coord/Clock", one_clock},
    {"/psd.v1.Serve/Lookup", one_lookup},
    {"/psd.v1.Admin/Reshard", one_reshard},
    {"/psd.v1.Admin/MoveRows", one_move_rows},
    {"/psd.v1.Admin/MoveBuckets", one_move_buckets},
    {"/psd.v1.Admin/SwitchLayout", one_switch},
    {"/psd.v1.Admin/DenseRows", one_dense_rows},
};

int main(int argc, char **argv) {
  float g[9] = {0.5f, -1, 2, 0.25f, -0.125f, 3, 1, -2, 0.75f};
  struct seed s;
  char name[64];

  if (argc != 2) {
    fprintf(stderr, "usage: fuzz-seeds DIR\n");
    return 2;
  }
  fseed_caller.job = "f";
  fseed_caller.worker = "worker:0";

  /* Every method alone, async and sync: each of fuzz_methods (a method
   * without a writer here is an error, as one fuzz_methods lacks is). */
  for (int sync = 0; sync < 2; sync++)
    for (int i = 0; i < FUZZ_NMETHODS; i++) {
      size_t k = 0;
      while (k < sizeof alone / sizeof alone[0] &&
             strcmp(alone[k].path, fuzz_methods[i]))
        k++;
      if (k == sizeof alone / sizeof alone[0]) {
        fprintf(stderr, "fuzz-seeds: no seed writer for %s\n", fuzz_methods[i]);
        return 1;
      }
      s.len = 0;
      s.buf[s.len++] = sync ? FUZZ_SYNC : 0;
      alone[k].write(&s);
      snprintf(name, sizeof name, "%s-one-%s", sync ? "sync" : "async",
               strrchr(fuzz_methods[i], '/') + 1);
      fseed_write(argv[1], name, &s);

      /* The same call with each field left out in turn, then with only its
       * caller, after a Declare of the variables (tests/unit's
       * service-empty sends these and more, checking every answer). */
      const ProtobufCMessageDescriptor *d = request_of(fuzz_methods[i]);
      s.len = 0;
      s.buf[s.len++] = sync ? FUZZ_SYNC : 0;
      declare(&s, 0);
      for (unsigned f = 0; f < d->n_fields && f + 2 < FUZZ_MAX_CALLS; f++) {
        fseed_drop_field = d->fields[f].id;
        alone[k].write(&s);
      }
      fseed_drop_field = 0;
      only_caller = 1;
      alone[k].write(&s);
      only_caller = 0;
      snprintf(name, sizeof name, "%s-fields-%s", sync ? "sync" : "async",
               strrchr(fuzz_methods[i], '/') + 1);
      fseed_write(argv[1], name, &s);
    }

  /* Async: everything in one conversation, requests cut into slices. */
  s.len = 0;
  s.buf[s.len++] = FUZZ_MOMENTUM;
  declare(&s, 1);
  push(&s, 2, 0, 0, g);
  pull(&s, 3, 0);
  status(&s, 0);
  checkpoint(&s, 0);
  join(&s, 0, 0);
  join(&s, 4, 1);
  heartbeat(&s, 0, 1);
  clock_(&s, 5, 0, 1);
  clock_(&s, 0, 1, 3);
  commit(&s, 0, 0);
  admit(&s, 0, 0, 0);
  fseed_write(argv[1], "async-conversation", &s);

  /* NaN in a push, rejected, skipped and applied. */
  static const uint8_t policy[3] = {0, FUZZ_SKIP, FUZZ_APPLY};
  static const char *const policy_name[3] = {"reject", "skip", "apply"};
  for (int k = 0; k < 3; k++) {
    float bad[9];
    memcpy(bad, g, sizeof bad);
    bad[7] = NAN;
    s.len = 0;
    s.buf[s.len++] = policy[k];
    declare(&s, 0);
    push(&s, 0, 0, 0, bad);
    pull(&s, 0, 0);
    status(&s, 0);
    snprintf(name, sizeof name, "nonfinite-%s", policy_name[k]);
    fseed_write(argv[1], name, &s);
  }

  /* Sync: a step staged by both workers, admitted, committed; a pull that
   * parks for the next step, and a late push. */
  s.len = 0;
  s.buf[s.len++] = FUZZ_SYNC | FUZZ_SMALL;
  declare(&s, 0);
  join(&s, 0, 0);
  join(&s, 0, 1);
  pull(&s, 0, 0);
  push(&s, 6, 0, 0, g);
  push(&s, 0, 0, 1, g);
  admit(&s, 0, 0, 0);
  commit(&s, 0, 0);
  pull(&s, 7, 1);
  pull(&s, 0, 2);
  push(&s, 0, 0, 1, g);
  status(&s, 0);
  fseed_write(argv[1], "sync-step", &s);

  /* Sync: a rollback (this shard keeps no checkpoints: refused), a retry
   * of one at the step it is at, and calls of an older and a newer
   * generation. */
  s.len = 0;
  s.buf[s.len++] = FUZZ_SYNC;
  declare(&s, 0);
  join(&s, 0, 0);
  rollback(&s, 0, 0, 1);
  rollback(&s, 2, 0, 0);
  pull(&s, 0, 1);
  push(&s, 0, 0, 0, g);
  admit(&s, 0, 0, 0);
  status(&s, 0);
  fseed_write(argv[1], "sync-rollback", &s);

  /* Async tables: rows created, admitted by count (the second push) and by
   * probability, trained by each row optimizer, read back, evicted by count
   * and by age (the dense push moves the shard's step), exported in pages. */
  s.len = 0;
  s.buf[s.len++] = 0;
  declare(&s, 0);
  declare_tables(&s, 1);
  sparse_pull(&s, 2, "emb", 0, 3, 0);
  sparse_push(&s, 0, "emb", 0, 3, 2, g0, 0, 0);
  sparse_push(&s, 3, "adm", 0, 2, 3, g0, 0, 0);
  sparse_push(&s, 0, "adm", 0, 2, 3, g0, 0, 0);
  sparse_push(&s, 0, "prob", 0, 4, 1, g0, 0, 0);
  sparse_push(&s, 5, "row", 0, 2, 4, g0, 0, 0);
  push(&s, 0, 0, 0, g);
  push(&s, 0, 0, 0, g);
  sparse_pull(&s, 0, "adm", 0, 3, 0);
  rows(&s, 0, "adm", 0, 3, 0);
  rows(&s, 0, "emb", 0, 0, 2);
  fseed_shrink(&s, 0, "row");
  fseed_export(&s, 0, "emb", 0, 0, 2);
  fseed_export(&s, 7, "emb", 1, mine(1), 0);
  fseed_write(argv[1], "async-tables", &s);

  /* Sync tables: both workers stage rows for step 0, the commit applies
   * them; a pull of the committed step, one parked for the next, a late
   * push, eviction and export after the step. */
  s.len = 0;
  s.buf[s.len++] = FUZZ_SYNC;
  declare_tables(&s, 0);
  join(&s, 0, 0);
  join(&s, 0, 1);
  sparse_push(&s, 0, "emb", 0, 3, 2, g0, 0, 0);
  sparse_push(&s, 2, "emb", 1, 3, 2, g0, 0, 1);
  sparse_push(&s, 0, "adm", 0, 1, 3, g0, 0, 0);
  sparse_push(&s, 0, "adm", 0, 1, 3, g0, 0, 1);
  admit(&s, 0, 0, 0);
  commit(&s, 0, 0);
  sparse_pull(&s, 0, "emb", 0, 4, 1);
  sparse_pull(&s, 6, "emb", 0, 2, 2);
  sparse_push(&s, 0, "emb", 0, 1, 2, g0, 0, 1);
  rows(&s, 0, "adm", 0, 1, 0);
  fseed_shrink(&s, 0, "adm");
  fseed_export(&s, 0, "emb", 0, 0, 0);
  status(&s, 0);
  fseed_write(argv[1], "sync-tables", &s);

  /* Serving: lookups of rows and dense values (cut into slices), of a
   * spec table no publication holds, of an unknown table and variable,
   * ahead of the version held. */
  {
    static const char *const w[2] = {"w", "nope"};
    s.len = 0;
    s.buf[s.len++] = 0;
    lookup(&s, 2, "emb", 0, 6, w, 1, 0);
    lookup(&s, 5, "adm", 1, 2, NULL, 0, 0);
    lookup(&s, 0, "", 0, 0, w, 1, 0);
    lookup(&s, 0, "nope", 0, 1, NULL, 0, 0);
    lookup(&s, 0, "emb", 0, 1, w + 1, 1, 0);
    lookup(&s, 0, "emb", 0, 2, NULL, 0, 9);
    fseed_write(argv[1], "serve-lookups", &s);
  }

  /* Declare's initial values (fuzz_seeds_values.c). */
  fseed_values(argv[1]);
  return 0;
}
