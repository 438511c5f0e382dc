/* libFuzzer target: arbitrary bytes as requests to every method psd serves
 * (Data, Admin, Coord, and Serve to a serving task: every rpc of
 * proto/ps.proto), decoded and dispatched by the real handlers through
 * cm_rpc_call_local, against a fresh in-memory shard per input with the
 * spec's embedding tables (format: fuzz_input.h). Besides the sanitizers'
 * findings it checks what psd promises about bad input: every call is
 * answered exactly once (parked ones at the latest when the shard stops),
 * with a known status, and every error carries a message. Built with clang
 * -fsanitize=fuzzer (meson option fuzz); `make fuzz` runs it. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/grpc.h>
#include <grpc/slice.h>

#include "coord.h"
#include "err.h"
#include "fuzz_input.h"
#include "layout.h"
#include "log.h"
#include "pubfile.h"
#include "request.h"
#include "rpc.h"
#include "rpc_server.h"
#include "saver.h"
#include "serve.h"
#include "service.h"
#include "spec.h"
#include "store.h"
#include "table.h"
#include "tables.h"

/* The two specs (async with a staleness bound, sync), parsed once. */
static struct cm_spec *specs[2];

/* FUZZ_VERBOSE=1 prints every answer (to see what an input does). */
static int verbose;

/* The spec's embedding tables: every row optimizer, admission by count
 * and by probability, eviction by count and by age (the shard's step), so
 * that sparse calls reach each path of the tables. */
#define TABLES                                                                 \
  "\"tables\": ["                                                              \
  "{\"name\": \"emb\", \"dim\": 2, \"optimizer\": {\"type\": \"adagrad\"}}, "  \
  "{\"name\": \"adm\", \"dim\": 3, \"id_bound\": 1000, "                       \
  "\"optimizer\": {\"type\": \"ftrl\", \"l1\": 0.01}, "                        \
  "\"admission\": {\"type\": \"count\", \"count\": 2}, "                       \
  "\"eviction\": {\"min_count\": 2}}, "                                        \
  "{\"name\": \"prob\", \"dim\": 1, \"init\": \"zeros\", "                     \
  "\"optimizer\": {\"type\": \"adam\"}, "                                      \
  "\"admission\": {\"type\": \"probability\", \"probability\": 0.5}}, "        \
  "{\"name\": \"row\", \"dim\": 4, "                                           \
  "\"optimizer\": {\"type\": \"rowwise_adagrad\"}, "                           \
  "\"eviction\": {\"after_steps\": 2}}, "                                      \
  "{\"name\": \"plain\", \"dim\": 1, \"optimizer\": {\"type\": \"sgd\"}}]"

static const char *const spec_json[2] = {
    "{\"cluster\": {\"ps\": [\"127.0.0.1:1\", \"127.0.0.1:2\"], \"worker\": "
    "[\"127.0.0.1:3\", \"127.0.0.1:4\"]}, \"job\": {\"name\": \"f\", " TABLES
    ", \"sync\": {\"mode\": \"async\", \"staleness\": 1}}}",
    "{\"cluster\": {\"ps\": [\"127.0.0.1:1\", \"127.0.0.1:2\"], \"worker\": "
    "[\"127.0.0.1:3\", \"127.0.0.1:4\"]}, \"job\": {\"name\": \"f\", " TABLES
    ", \"sync\": {\"mode\": \"sync\"}}}"};

/* Variables the fuzzed shard may hold: small, so that each input runs fast
 * and a large declaration meets the limit instead of the RSS limit. */
#define FUZZ_MAX_HELD (8u << 20)

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  char err[2048];
  verbose = getenv("FUZZ_VERBOSE") != NULL;
  /* Quiet, but an error's message is still formatted (service.c's fail). */
  cm_log_set_level(verbose ? CM_LOG_INFO : CM_LOG_ERROR);
  cm_rpc_global_init();
  for (int i = 0; i < 2; i++)
    if (cm_spec_parse(spec_json[i], strlen(spec_json[i]), "fuzz.json",
                      &specs[i], err, sizeof err)) {
      fprintf(stderr, "fuzz_service: %s\n", err);
      abort();
    }
  return 0;
}

/* The serving task Serve/Lookup goes to (serve.h): serve:0 of job "f",
 * following shard 0, with the spec's tables and a publication applied in
 * memory: 4 rows of "emb" and dense "w" (4 x 3, rows 0..2 here). */
static struct psd_serve *serving(const struct cm_job *job,
                                 uint64_t max_message) {
  struct psd_serve_conf c = {.dir = "/nonexistent",
                             .job = "f",
                             .replica = 0,
                             .shard = 0,
                             .shards = 2,
                             .seed = job->seed,
                             .tables = job->tables,
                             .ntables = job->ntables,
                             .defaults = &job->table_defaults,
                             .max_message = max_message};
  struct psd_serve *sv;
  uint64_t ids[4];
  float vals[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  char err[512];
  int k = 0;
  static struct cm_layout_map m2;
  cm_layout_map_init(&m2, CM_LAYOUT_RULE_BUCKETS, 2);
  for (uint64_t id = 0; k < 4; id++)
    if (cm_layout_map_id_shard(&m2, id) == 0)
      ids[k++] = id;
  struct psd_pub_table t = {
      .name = "emb", .dim = 2, .nrows = 4, .ids = ids, .values = vals};
  struct psd_pub_dense d = {.name = "w",
                            .shape = {4, 3},
                            .ndim = 2,
                            .row_begin = 0,
                            .row_end = 2,
                            .values = calloc(6, sizeof(float))};
  struct psd_pub p = {.version = 1,
                      .base = 1,
                      .step = 1,
                      .full = 1,
                      .shard = 0,
                      .shards = 2,
                      .job = "f",
                      .ndense = 1,
                      .dense = &d,
                      .ntables = 1,
                      .tables = &t};
  if (!d.values || psd_serve_new(&sv, &c) ||
      psd_serve_apply(sv, &p, err, sizeof err))
    abort();
  free(d.values); /* NULL: the task took it */
  return sv;
}

/* The request of n bytes cut into slices of `cut` bytes (0: one slice);
 * NULL for an empty message, as gRPC may hand one over. */
static grpc_byte_buffer *request(const uint8_t *p, size_t n, unsigned cut) {
  grpc_slice sl[64];
  size_t ns = 0, off = 0;
  if (n == 0)
    return NULL;
  if (cut == 0 || n / cut >= 63)
    cut = (unsigned)n;
  while (off < n) {
    size_t k = n - off < cut ? n - off : cut;
    sl[ns++] = grpc_slice_from_copied_buffer((const char *)p + off, k);
    off += k;
  }
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(sl, ns);
  for (size_t i = 0; i < ns; i++)
    grpc_slice_unref(sl[i]);
  return bb;
}

/* The handler serving path among the shard's methods. */
static const struct cm_rpc_method *find(const struct cm_rpc_method *const *m,
                                        const int *n, const char *path) {
  for (int k = 0; k < 4; k++)
    for (int i = 0; i < n[k]; i++)
      if (!strcmp(m[k][i].path, path))
        return &m[k][i];
  return NULL;
}

/* Every method the shard serves is one the method byte can pick: checked
 * once, with the coordinator's methods among them, so that a handler added
 * to psd without a place in fuzz_methods stops the fuzzer at once. */
static void check_served(const struct cm_rpc_method *const *m, const int *n) {
  static int checked;
  if (checked || !m[1])
    return;
  for (int k = 0; k < 4; k++)
    for (int i = 0; i < n[k]; i++) {
      int j = 0;
      while (j < FUZZ_NMETHODS && strcmp(fuzz_methods[j], m[k][i].path))
        j++;
      if (j == FUZZ_NMETHODS) {
        fprintf(stderr,
                "fuzz_service: psd serves %s, which fuzz_methods "
                "(fuzz_input.h) lacks\n",
                m[k][i].path);
        abort();
      }
    }
  checked = 1;
}

/* What psd promises of every answer; anything else is a bug worth a crash. */
static void check_answer(const struct cm_rpc_answer *a, const char *path) {
  if (!a->answered) {
    fprintf(stderr, "fuzz_service: %s was never answered\n", path);
    abort();
  }
  if ((int)a->status < 0 || (int)a->status > GRPC_STATUS_UNAUTHENTICATED) {
    fprintf(stderr, "fuzz_service: %s answered status %d\n", path, a->status);
    abort();
  }
  if (a->status != GRPC_STATUS_OK && !a->details[0]) {
    fprintf(stderr, "fuzz_service: %s answered %s without a message\n", path,
            cm_rpc_status_name(a->status));
    abort();
  }
}

/* Whether any call of the input goes to the coordinator, which is made only
 * then: it opens gRPC channels to the shards, the slowest part of a run. */
static int uses_coord(const uint8_t *data, size_t size) {
  int ncalls = 0;
  for (size_t off = 1; off + 3 <= size && ncalls < FUZZ_MAX_CALLS; ncalls++) {
    size_t len = data[off + 1] | (size_t)data[off + 2] << 8;
    if (!strncmp(fuzz_methods[data[off] % FUZZ_NMETHODS], "/psd.v1.Coord/", 14))
      return 1;
    off += 3;
    off += len > size - off ? size - off : len;
  }
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  struct cm_rpc_answer ans[FUZZ_MAX_CALLS];
  const char *paths[FUZZ_MAX_CALLS];
  const struct cm_rpc_method *m[4];
  struct psd_store *store = NULL;
  struct psd_service *svc = NULL;
  struct psd_coord *coord = NULL;
  struct psd_saver *saver = NULL;
  struct psd_tables *tables = NULL;
  struct psd_serve *serve = NULL;
  int n[4], ncalls = 0;
  size_t off = 1;

  if (size < 1)
    return 0;
  uint8_t cfg = data[0];
  int sync = cfg & FUZZ_SYNC;
  /* sgd or momentum (one slot), lr 0.5, no per-variable rules. */
  struct cm_optim_set opt = {0};
  cm_optim_defaults(&opt.def);
  opt.def.type = cfg & FUZZ_MOMENTUM ? CM_OPT_MOMENTUM : CM_OPT_SGD;
  opt.def.lr = 0.5;
  const struct cm_job *job = &specs[sync]->job;
  char err[512];
  if (psd_store_new(&store, 0, 2, &opt) ||
      psd_service_new(&svc, store, 0, 2, 2, "f", sync ? "sync" : "async") ||
      psd_tables_new(&tables, job->tables, job->ntables, &job->table_defaults,
                     job->seed, err, sizeof err) ||
      (uses_coord(data, size) &&
       psd_coord_new(&coord, specs[sync], specs[sync]->nps)))
    abort();
  psd_service_set_tables(svc, tables);
  psd_service_set_limits(
      svc, &(struct psd_limits){
               .max_message = cfg & FUZZ_SMALL ? 4u << 20 : 64u << 20,
               .nonfinite = cfg & FUZZ_SKIP    ? PSD_NONFINITE_SKIP
                            : cfg & FUZZ_APPLY ? PSD_NONFINITE_APPLY
                                               : PSD_NONFINITE_REJECT,
               .max_held = FUZZ_MAX_HELD});
  /* Who the shard is (request.h): a caller naming another spec or an
   * earlier process of it is refused, so the bytes reach both checks. */
  static struct cm_request_self self = {.spec_fp = 0x5eed,
                                        .nps = 2,
                                        .nworkers = 2,
                                        .boot = 0xb007,
                                        .ckpt_dir = ""};
  psd_service_set_self(svc, &self);
  if (coord) {
    psd_coord_set_self(coord, &self);
    psd_service_set_coord(svc, coord);
  }
  struct psd_saver_opts so = {.store = store,
                              .steps = psd_service_steps(svc),
                              .job = "f",
                              .self = &self};
  if (psd_saver_new(&saver, &so))
    abort();
  m[0] = psd_service_methods(svc, &n[0]);
  m[1] = coord ? psd_coord_methods(coord, &n[1]) : NULL;
  n[1] = coord ? n[1] : 0;
  m[2] = psd_saver_methods(saver, &n[2]);
  /* The serving task's last: its Status and refused calls are the
   * shard's paths too, which find() gives the shard. */
  serve = serving(job, cfg & FUZZ_SMALL ? 4u << 20 : 64u << 20);
  m[3] = psd_serve_methods(serve, &n[3]);
  check_served(m, n);

  while (off + 3 <= size && ncalls < FUZZ_MAX_CALLS) {
    uint8_t sel = data[off];
    size_t len = data[off + 1] | (size_t)data[off + 2] << 8;
    off += 3;
    if (len > size - off)
      len = size - off;
    const char *path = fuzz_methods[sel % FUZZ_NMETHODS];
    const struct cm_rpc_method *meth = find(m, n, path);
    if (!meth) { /* uses_coord and this loop disagree */
      fprintf(stderr, "fuzz_service: psd does not serve %s\n", path);
      abort();
    }
    grpc_byte_buffer *bb =
        request(data + off, len, fuzz_cuts[(sel / FUZZ_NMETHODS) % FUZZ_NCUTS]);
    off += len;
    paths[ncalls] = path;
    if (cm_rpc_call_local(meth, bb, &ans[ncalls]))
      abort();
    ncalls++;
    if (bb)
      grpc_byte_buffer_destroy(bb);
  }

  /* Parked calls (sync pulls, Admit, Clock) are answered when psd stops. */
  if (coord)
    psd_coord_stop(coord);
  psd_service_stop(svc);
  for (int i = 0; i < ncalls; i++) {
    check_answer(&ans[i], paths[i]);
    if (verbose)
      fprintf(stderr, "%s: %s %s\n", paths[i],
              cm_rpc_status_name(ans[i].status), ans[i].details);
    cm_rpc_answer_release(&ans[i]);
  }
  psd_coord_free(coord);
  psd_serve_free(serve);
  psd_saver_free(saver);
  psd_service_free(svc);
  psd_tables_free(tables);
  psd_store_free(store);
  return 0;
}
