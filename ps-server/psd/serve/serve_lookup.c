/* A serving task's handlers (serve.h): Serve/Lookup (proto/ps.proto's
 * LookupRequest is the contract), Admin/Status with its ServingStatus, and
 * every other rpc of the proto refused FAILED_PRECONDITION naming the call
 * and the task: a serving task is read-only, and a push sent to one by
 * mistake must not be taken for applied.
 *
 * A Lookup checks everything it can outside the lock (the ids' shard and
 * width), then, holding the table-wide lock shared, reads the version, the
 * rows held and the dense values into one answer buffer; the initial rows
 * of ids not published (found 0; cm_table_init_row, as a training pull
 * answers them) are filled after the lock is released. The answer's rows
 * and dense values leave as its bulk field from that one buffer. */
#include "serve_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "init.h"
#include "layout.h"
#include "log.h"
#include "ps.pb-c.h"
#include "wire.h"

/* Room for an answer's head beyond its found bytes and dense slices. */
#define HEAD_ROOM 64
/* Errors logged in full before the log only samples them. */
#define LOGGED_ERRORS 50

/* Answers a refused call, logged and counted (the host's refuse hook). */
static void refuse(void *ctx, struct cm_rpc_call *call, grpc_status_code code,
                   const char *msg) {
  struct psd_serve *s = ctx;
  uint64_t n = atomic_fetch_add(&s->errors, 1) + 1;
  if (n <= LOGGED_ERRORS || n % 1000 == 0)
    cm_warn("%s from %s: %s%s", cm_rpc_status_name(code), cm_rpc_peer(call),
            msg, n == LOGGED_ERRORS ? " (further errors are sampled)" : "");
  cm_rpc_fail(call, code, "%s", msg);
}

#define fail(s, call, code, ...)                                               \
  cm_request_refuse(&(s)->host, call, code, __VA_ARGS__)

static void release_free(void *p) { free(p); }

/* Checks the ids of a Lookup: whole u64s, each held by this task's shard.
 * Returns them (the caller frees; n may be 0) or NULL once answered. */
static uint64_t *take_ids(struct psd_serve *s, struct cm_rpc_call *call,
                          const Psd__V1__LookupRequest *req, size_t *n) {
  const char *t = req->table ? req->table : "";
  uint64_t *ids;
  if (req->ids.len % sizeof(uint64_t)) {
    fail(s, call, GRPC_STATUS_INVALID_ARGUMENT,
         "Lookup '%.200s': ids hold %zu bytes, not a whole number of 8-byte "
         "ids",
         t, req->ids.len);
    return NULL;
  }
  if (req->ids.len && !t[0]) {
    fail(s, call, GRPC_STATUS_INVALID_ARGUMENT,
         "Lookup: %zu ids but no table; name the table they are rows of",
         req->ids.len / sizeof(uint64_t));
    return NULL;
  }
  *n = req->ids.len / sizeof(uint64_t);
  if (!(ids = malloc(req->ids.len + 1))) {
    fail(s, call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    return NULL;
  }
  if (req->ids.len)
    memcpy(ids, req->ids.data, req->ids.len);
  return ids;
}

/* Whether the caller planned this lookup for the layout and live move the
 * version held places rows by (Caller.layout, shards, rows, move_to,
 * moved: the client's word for this task; shards 0, an older client: the
 * layout a fresh job starts in). */
static int planned_here(const struct psd_serve *s, const Psd__V1__Caller *c) {
  if (!c || c->shards <= 0)
    return s->layout == 0 && !s->move_to;
  return c->layout == s->layout && c->shards == s->lshards &&
         (!c->rows || c->rows == s->map.rule) &&
         (int)c->move_to == s->move_to && (int)c->moved == s->moved;
}

/* Under the lock: each id held by this task's shard in the row map of the
 * publication held, or of a bucket a live move took from it lately (its
 * rows still answered, docs/serving.md "Following a reshard"). Returns 0,
 * or -1 once answered: FAILED_PRECONDITION "rows moved" naming the map's
 * rule when the caller placed rows by another (the client takes it and
 * asks again); FAILED_PRECONDITION "layout moved: ps:S holds layout ..."
 * when the caller planned for another layout or move, or while a move is
 * under way (the client takes the layout, plans again, and waits for the
 * task that takes the bucket to catch up); else INVALID_ARGUMENT naming an
 * id of another shard. */
static int check_owner(struct psd_serve *s, struct cm_rpc_call *call,
                       const Psd__V1__LookupRequest *req, const uint64_t *ids,
                       size_t n) {
  char rule[96], holds[160];
  double now = n ? cm_mono_ms() : 0;
  if (n && req->caller && req->caller->rows &&
      req->caller->rows != s->map.rule) {
    fail(s, call, GRPC_STATUS_FAILED_PRECONDITION,
         "rows moved: serve:%d places rows by %s (%s), as version %llu of "
         "shard %d does; the lookup was planned by %s",
         s->replica, cm_layout_rule_name(s->map.rule),
         cm_layout_map_text(&s->map, rule, sizeof rule),
         (unsigned long long)s->version, s->shard,
         cm_layout_rule_name(req->caller->rows));
    return -1;
  }
  for (size_t i = 0; i < n; i++) {
    uint64_t h = cm_layout_id_hash(ids[i]);
    int owner = cm_layout_map_hash_shard(&s->map, h);
    if (owner == s->shard)
      continue;
    if (s->map.rule != CM_LAYOUT_RULE_MODULO) {
      double left = s->left_ms[cm_layout_bucket(h)];
      if (left && now - left <= s->keep_left_ms)
        continue;
    }
    if (!planned_here(s, req->caller) || s->move_to) {
      struct cm_request_self me = {.shard = s->shard,
                                   .layout = s->layout,
                                   .nshards = s->lshards,
                                   .rows = s->map.rule,
                                   .move_to = s->move_to,
                                   .moved = s->moved};
      fail(s, call, GRPC_STATUS_FAILED_PRECONDITION,
           "layout moved: %s; serve:%d answers from version %llu of its "
           "publications, which place id %llu (position %zu) on shard %d",
           cm_request_holds(&me, holds, sizeof holds), s->replica,
           (unsigned long long)s->version, (unsigned long long)ids[i], i,
           owner);
      return -1;
    }
    fail(s, call, GRPC_STATUS_INVALID_ARGUMENT,
         "Lookup '%.200s': id %llu (position %zu) belongs to shard %d, not "
         "shard %d, which serve:%d serves (%s)",
         req->table ? req->table : "", (unsigned long long)ids[i], i, owner,
         s->shard, s->replica, cm_layout_map_text(&s->map, rule, sizeof rule));
    return -1;
  }
  return 0;
}

/* Under the lock: the asked dense variables (into *out, n of them), and
 * their floats. Returns 0, or -1 once answered NOT_FOUND naming one. */
static int find_dense(struct psd_serve *s, struct cm_rpc_call *call,
                      const Psd__V1__LookupRequest *req,
                      const struct psd__serve_dense **out, uint64_t *floats) {
  *floats = 0;
  for (size_t i = 0; i < req->n_dense; i++) {
    const char *name = req->dense[i] ? req->dense[i] : "";
    int k = 0;
    while (k < s->ndense && strcmp(s->dense[k].name, name))
      k++;
    if (k == s->ndense) {
      fail(s, call, GRPC_STATUS_NOT_FOUND,
           "Lookup: serve:%d has no dense variable '%.200s' (version %llu of "
           "shard %d holds %d)",
           s->replica, name, (unsigned long long)s->version, s->shard,
           s->ndense);
      return -1;
    }
    out[i] = &s->dense[k];
    *floats += s->dense[k].nvalues;
  }
  return 0;
}

/* Sends the answer: its head (with found and the slices) and data. */
static void answer(struct psd_serve *s, struct cm_rpc_call *call,
                   Psd__V1__LookupResponse *resp, float *data, size_t bytes) {
  size_t len = protobuf_c_message_get_packed_size(&resp->base);
  uint8_t *head = malloc(len + 1);
  if (!head) {
    free(data);
    fail(s, call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  protobuf_c_message_pack(&resp->base, head);
  struct cm_wire_piece piece = {(const uint8_t *)data, bytes};
  cm_rpc_reply(call, cm_wire_build(head, len, &piece, 1, release_free, data));
  free(head);
  atomic_fetch_add(&s->lookups, 1);
}

static void on_lookup(struct cm_rpc_call *call, grpc_byte_buffer *bb,
                      void *ctx) {
  struct psd_serve *s = ctx;
  Psd__V1__LookupResponse resp = PSD__V1__LOOKUP_RESPONSE__INIT;
  const struct psd__serve_dense **dense = NULL;
  Psd__V1__VarSlice *sl = NULL, **slp = NULL;
  int64_t(*shapes)[8] = NULL; /* each slice's variable's shape, copied */
  struct cm_table_conf conf;
  uint64_t *ids = NULL, dfloats = 0;
  uint8_t *found = NULL;
  float *data = NULL;
  size_t n = 0, bytes = 0, missing = 0, at;
  int locked = 0;

  Psd__V1__LookupRequest *req = (Psd__V1__LookupRequest *)cm_request_open(
      &s->host, call, bb, &psd__v1__lookup_request__descriptor, "Lookup", NULL);
  memset(&conf, 0, sizeof conf);
  if (!req || !(ids = take_ids(s, call, req, &n)))
    goto out;
  const char *tname = req->table ? req->table : "";
  if (!(dense = calloc(req->n_dense + 1, sizeof *dense)) ||
      !(sl = calloc(req->n_dense + 1, sizeof *sl)) ||
      !(slp = calloc(req->n_dense + 1, sizeof *slp)) ||
      !(shapes = calloc(req->n_dense + 1, sizeof *shapes)) ||
      !(found = calloc(n + 1, 1))) {
    fail(s, call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    goto out;
  }
  pthread_rwlock_rdlock(&s->lock);
  locked = 1;
  if (!s->version || req->min_version > s->version) {
    uint64_t newest;
    pthread_mutex_lock(&s->stat_lock);
    newest = s->newest_seen;
    pthread_mutex_unlock(&s->stat_lock);
    if (!s->version)
      fail(s, call, GRPC_STATUS_UNAVAILABLE,
           "Lookup: serve:%d has loaded no publication of shard %d yet "
           "(following %s; newest seen %llu); retry",
           s->replica, s->shard, s->dir, (unsigned long long)newest);
    else
      fail(s, call, GRPC_STATUS_UNAVAILABLE,
           "Lookup: serve:%d holds version %llu, behind min_version %llu "
           "(newest seen %llu); retry, or ask another replica",
           s->replica, (unsigned long long)s->version,
           (unsigned long long)req->min_version, (unsigned long long)newest);
    goto out;
  }
  if (check_owner(s, call, req, ids, n))
    goto out;
  resp.rows = s->map.rule;
  struct psd__serve_tab *tab = NULL;
  if (tname[0] && !(tab = psd__serve_find(s, tname))) {
    fail(s, call, GRPC_STATUS_NOT_FOUND,
         "Lookup: serve:%d has no table '%.200s' (neither version %llu of "
         "shard %d nor the spec's job.tables name it)",
         s->replica, tname, (unsigned long long)s->version, s->shard);
    goto out;
  }
  if (tab) {
    conf = tab->conf;
    for (size_t i = 0; conf.id_bound && i < n; i++)
      if (ids[i] >= conf.id_bound) {
        fail(s, call, GRPC_STATUS_OUT_OF_RANGE,
             "Lookup '%s': id %llu (position %zu) is beyond the table's "
             "bound; ids must be below id_bound %llu",
             conf.name, (unsigned long long)ids[i], i,
             (unsigned long long)conf.id_bound);
        goto out;
      }
    resp.dim = conf.dim;
  }
  if (find_dense(s, call, req, dense, &dfloats))
    goto out;
  bytes = (n * resp.dim + dfloats) * sizeof(float);
  if (bytes + n + HEAD_ROOM + req->n_dense * 256 > s->max_message) {
    fail(s, call, GRPC_STATUS_RESOURCE_EXHAUSTED,
         "Lookup: the answer would hold %zu bytes; serve:%d answers at most "
         "%llu (job.max_message_mb): ask for fewer ids or variables at once",
         bytes + n, s->replica, (unsigned long long)s->max_message);
    goto out;
  }
  if (!(data = malloc(bytes + 1))) {
    fail(s, call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    goto out;
  }
  if (tab && tab->rows)
    missing = psd_serve_table_lookup(tab->rows, ids, n, data, found);
  else
    missing = n; /* a spec table no publication held yet */
  at = n * resp.dim;
  for (size_t i = 0; i < req->n_dense; i++) {
    const struct psd__serve_dense *d = dense[i];
    if (d->nvalues) /* none: a variable placed whole on another shard */
      memcpy(data + at, d->values, d->nvalues * sizeof(float));
    at += d->nvalues;
    psd__v1__var_slice__init(&sl[i]);
    sl[i].name = req->dense[i];
    sl[i].row_begin = d->row_begin;
    sl[i].row_end = d->row_end;
    memcpy(shapes[i], d->shape, sizeof shapes[i]); /* packed unlocked */
    sl[i].n_shape = (size_t)d->ndim;
    sl[i].shape = shapes[i];
    slp[i] = &sl[i];
  }
  resp.version = s->version;
  resp.step = s->step;
  resp.time_unix_ms = s->time_unix_ms;
  resp.layout = s->layout;
  resp.shards = s->lshards;
  resp.move_to = (uint32_t)s->move_to;
  resp.moved = (uint32_t)s->moved;
  pthread_rwlock_unlock(&s->lock);
  locked = 0;
  for (size_t i = 0; missing && i < n; i++)
    if (!found[i])
      cm_table_init_row(&conf, s->seed, ids[i], data + i * resp.dim);
  resp.found.data = found;
  resp.found.len = n;
  resp.n_dense = req->n_dense;
  resp.dense = slp;
  answer(s, call, &resp, data, bytes);
  data = NULL; /* the answer owns it */
out:
  if (locked)
    pthread_rwlock_unlock(&s->lock);
  free(data);
  free(found);
  free(ids);
  free(dense);
  free(sl);
  free(shapes);
  free(slp);
  cm_request_free((ProtobufCMessage *)req);
}

static void on_status(struct cm_rpc_call *call, grpc_byte_buffer *bb,
                      void *ctx) {
  struct psd_serve *s = ctx;
  Psd__V1__StatusResponse resp = PSD__V1__STATUS_RESPONSE__INIT;
  Psd__V1__ServingStatus ss = PSD__V1__SERVING_STATUS__INIT;
  struct psd_serve_state *st = malloc(sizeof *st);
  struct timespec now;
  ProtobufCMessage *req = cm_request_open(
      &s->host, call, bb, &psd__v1__status_request__descriptor, "Status", NULL);
  if (!req)
    goto out;
  if (!st) {
    fail(s, call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    goto out;
  }
  psd_serve_state(s, st);
  clock_gettime(CLOCK_MONOTONIC, &now);
  resp.shard = s->shard;
  resp.num_shards = s->shards;
  resp.job = s->job;
  resp.mode = "serving";
  resp.rows = (char *)cm_layout_rule_name(s->map.rule);
  resp.errors = st->errors;
  resp.unauthenticated = s->rpc ? cm_server_unauthenticated(s->rpc) : 0;
  resp.max_message_bytes = s->max_message;
  resp.uptime_s = (now.tv_sec - s->started.tv_sec) +
                  (now.tv_nsec - s->started.tv_nsec) / 1e9;
  resp.boot = s->host.self ? s->host.self->boot : 0;
  ss.replica = s->replica;
  ss.shard = s->shard;
  ss.dir = s->dir;
  ss.version = st->version;
  ss.step = st->step;
  ss.time_unix_ms = st->time_unix_ms;
  ss.newest_seen = st->newest_seen;
  ss.rows = st->rows;
  ss.bytes = st->bytes;
  ss.applied = st->applied;
  ss.refused = st->refused;
  ss.last_refusal = st->last_refusal;
  ss.lookups = st->lookups;
  ss.layout = st->layout;
  ss.shards = st->shards;
  ss.move_to = (uint32_t)st->move_to;
  ss.moved = (uint32_t)st->moved;
  resp.serving = &ss;
  cm_rpc_reply(call, cm_rpc_pack(&resp.base));
out:
  free(st);
  cm_request_free(req);
}

/* Any other call: a serving task is read-only. */
static void on_refused(struct cm_rpc_call *call, grpc_byte_buffer *bb,
                       void *ctx) {
  struct psd__serve_refusal *r = ctx;
  (void)bb;
  fail(r->s, call, GRPC_STATUS_FAILED_PRECONDITION,
       "serve:%d is a serving task (read-only): %s is refused; send it to "
       "the training shards (cluster.ps), and Serve/Lookup here",
       r->s->replica, r->call);
}

void psd__serve_methods_init(struct psd_serve *s) {
  static const ProtobufCServiceDescriptor *const svcs[] = {
      &psd__v1__data__descriptor, &psd__v1__coord__descriptor,
      &psd__v1__serve__descriptor, &psd__v1__admin__descriptor};
  s->host.refuse = refuse;
  s->host.ctx = s;
  s->nmethods = 0;
  for (size_t k = 0; k < sizeof svcs / sizeof svcs[0]; k++)
    for (unsigned i = 0; i < svcs[k]->n_methods; i++) {
      int m = s->nmethods;
      const char *name = svcs[k]->methods[i].name;
      if (m == PSD__SERVE_NMETHODS) {
        cm_error("serving: more rpcs in the proto than PSD__SERVE_NMETHODS "
                 "(%d); %s/%s is not served",
                 PSD__SERVE_NMETHODS, svcs[k]->short_name, name);
        continue;
      }
      snprintf(s->paths[m], sizeof s->paths[m], "/%s/%s", svcs[k]->name, name);
      snprintf(s->refusals[m].call, sizeof s->refusals[m].call, "%s/%s",
               svcs[k]->short_name, name);
      s->refusals[m].s = s;
      s->methods[m].path = s->paths[m];
      if (!strcmp(s->paths[m], "/psd.v1.Serve/Lookup"))
        s->methods[m] = (struct cm_rpc_method){s->paths[m], on_lookup, s};
      else if (!strcmp(s->paths[m], "/psd.v1.Admin/Status"))
        s->methods[m] = (struct cm_rpc_method){s->paths[m], on_status, s};
      else
        s->methods[m] =
            (struct cm_rpc_method){s->paths[m], on_refused, &s->refusals[m]};
      s->nmethods++;
    }
}
