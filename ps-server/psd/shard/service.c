/* psd's data service as an object (service.h): what psd_service_new makes
 * and psd_service_free undoes, the table of methods served, the setters psd
 * wires it with, and the counters it reports. Every handler refuses through
 * cm_request_refuse (common/rpc/request.h), which lands in refuse() below:
 * one place logs and counts the errors. The handlers live beside it, one
 * file per call (service_internal.h lists them). */
#include "service_internal.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dedup.h"
#include "err.h"
#include "layout.h"
#include "log.h"
#include "steps.h"

/* Answers a refused call, logging it (cm_request_host's refuse hook). */
static void refuse(void *ctx, struct cm_rpc_call *call, grpc_status_code code,
                   const char *msg) {
  struct psd_service *svc = ctx;
  if (code == GRPC_STATUS_ABORTED || (code == GRPC_STATUS_FAILED_PRECONDITION &&
                                      !strncmp(msg, "layout moved: ", 14))) {
    /* A sync gradient that came after its step closed (the coordinator
     * counts the drop), or a call planned for a layout this shard has
     * left (a live move answers one for every call that names a moved
     * bucket, and the client re-plans): routine, not an error. */
    cm_debug("%s from %s: %s", cm_rpc_status_name(code), cm_rpc_peer(call),
             msg);
    cm_rpc_fail(call, code, "%s", msg);
    return;
  }
  uint64_t n = atomic_fetch_add(&svc->errors, 1) + 1;
  if (n <= PSD__LOGGED_ERRORS || n % 1000 == 0)
    cm_warn("%s from %s: %s%s", cm_rpc_status_name(code), cm_rpc_peer(call),
            msg,
            n == PSD__LOGGED_ERRORS ? " (further errors are sampled)" : "");
  cm_rpc_fail(call, code, "%s", msg);
}

int psd_service_new(struct psd_service **out, struct psd_store *store,
                    int shard, int nshards, int nworkers, const char *job,
                    const char *mode) {
  struct psd_service *svc = calloc(1, sizeof *svc);
  if (!svc)
    return CM_ENOMEM;
  svc->store = store;
  svc->shard = shard;
  svc->nshards = nshards;
  cm_layout_map_init(&svc->map, CM_LAYOUT_RULE_BUCKETS, nshards);
  psd__owned_init(svc);
  svc->nworkers = nworkers;
  psd_service_set_limits(svc, NULL);
  snprintf(svc->job, sizeof svc->job, "%s", job);
  snprintf(svc->mode, sizeof svc->mode, "%s", mode);
  cm_request_host_init(&svc->host, svc->job, "shard", "shard %d", shard);
  svc->host.check_layout = 1;
  svc->host.refuse = refuse;
  svc->host.ctx = svc;
  clock_gettime(CLOCK_MONOTONIC, &svc->started);
  svc->methods[0] =
      (struct cm_rpc_method){"/psd.v1.Data/Declare", psd__gated_declare, svc};
  svc->methods[1] =
      (struct cm_rpc_method){"/psd.v1.Data/Pull", psd__gated_pull, svc};
  svc->methods[2] =
      (struct cm_rpc_method){"/psd.v1.Data/Push", psd__gated_push, svc};
  svc->methods[3] =
      (struct cm_rpc_method){"/psd.v1.Admin/Status", psd__gated_status, svc};
  svc->methods[4] =
      (struct cm_rpc_method){"/psd.v1.Data/Commit", psd__on_commit, svc};
  svc->methods[5] =
      (struct cm_rpc_method){"/psd.v1.Data/Rollback", psd__on_rollback, svc};
  svc->methods[6] = (struct cm_rpc_method){"/psd.v1.Data/SparsePull",
                                           psd__gated_sparse_pull, svc};
  svc->methods[7] = (struct cm_rpc_method){"/psd.v1.Data/SparsePush",
                                           psd__gated_sparse_push, svc};
  svc->methods[8] =
      (struct cm_rpc_method){"/psd.v1.Admin/Rows", psd__on_rows, svc};
  svc->methods[9] =
      (struct cm_rpc_method){"/psd.v1.Admin/Shrink", psd__on_shrink, svc};
  svc->methods[10] =
      (struct cm_rpc_method){"/psd.v1.Admin/Export", psd__on_export, svc};
  svc->methods[11] =
      (struct cm_rpc_method){"/psd.v1.Admin/MoveRows", psd__on_move_rows, svc};
  pthread_mutex_init(&svc->park_lock, NULL);
  pthread_rwlock_init(&svc->tables_gate, NULL);
  pthread_rwlock_init(&svc->owned_gate, NULL);
  pthread_mutex_init(&svc->move_lock, NULL);
  pthread_cond_init(&svc->move_idle, NULL);
  /* Sync mode stages pushes for steps; svc->steps != NULL says so. */
  if (psd_dedup_new(&svc->dedup, PSD_DEDUP_CLIENTS) ||
      psd_vstage_new(&svc->vstage) ||
      (strcmp(mode, "sync") == 0 &&
       (psd_steps_new(&svc->steps, store, nworkers) ||
        psd_sstage_new(&svc->sstage, nworkers)))) {
    psd_service_free(svc);
    return CM_ENOMEM;
  }
  *out = svc;
  return 0;
}

void psd_service_set_server(struct psd_service *svc, struct cm_server *rpc) {
  svc->rpc = rpc;
}

void psd_service_set_limits(struct psd_service *svc,
                            const struct psd_limits *l) {
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (l)
    svc->limits = *l;
  else
    svc->limits = (struct psd_limits){.max_message = CM_RPC_MAX_MESSAGE};
  if (svc->limits.max_message < CM_RPC_MIN_MESSAGE)
    svc->limits.max_message = CM_RPC_MIN_MESSAGE;
  svc->held_is_memory = !svc->limits.max_held;
  if (!svc->limits.max_held)
    svc->limits.max_held =
        pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : UINT64_MAX;
}

void psd_service_hold(struct psd_service *svc, uint64_t at) {
  pthread_mutex_lock(&svc->park_lock);
  svc->hold_at = at;
  pthread_mutex_unlock(&svc->park_lock);
}

void psd_service_set_reshard_note(struct psd_service *svc,
                                  void (*note)(void *ctx, char *buf,
                                               size_t len),
                                  void *ctx) {
  svc->reshard_note = note;
  svc->reshard_ctx = ctx;
}

void psd_service_set_move_status(struct psd_service *svc,
                                 int (*fill)(void *ctx,
                                             Psd__V1__MoveStatus *out),
                                 void *ctx) {
  svc->move_status = fill;
  svc->move_status_ctx = ctx;
}

void psd_service_set_self(struct psd_service *svc,
                          struct cm_request_self *self) {
  svc->host.self = self;
  svc->self_rw = self;
  if (self && self->rows) {
    cm_layout_map_init(&svc->map, self->rows, svc->nshards);
    psd__owned_init(svc);
  }
  /* A live move found at start: own what its map gives this shard. */
  if (self && __atomic_load_n(&self->move_to, __ATOMIC_ACQUIRE)) {
    psd__owned_moving(svc, self->move_to, self->moved);
    atomic_store(&svc->relocating, 1);
  }
}

void psd_service_set_coord(struct psd_service *svc, struct psd_coord *coord) {
  svc->coord = coord;
}

void psd_service_set_tables(struct psd_service *svc,
                            struct psd_tables *tables) {
  svc->tables = tables;
}

struct psd_tables *psd_service_tables(struct psd_service *svc) {
  return svc->tables;
}

void psd_service_set_saver(struct psd_service *svc, struct psd_saver *saver) {
  svc->saver = saver;
}

void psd_service_set_publisher(struct psd_service *svc,
                               struct psd_publisher *pub) {
  svc->publisher = pub;
}

struct psd_steps *psd_service_steps(struct psd_service *svc) {
  return svc->steps;
}

struct psd_dedup *psd_service_dedup(struct psd_service *svc) {
  return svc->dedup;
}

void psd_service_set_dedup(struct psd_service *svc, struct psd_dedup *d) {
  psd_dedup_free(svc->dedup);
  svc->dedup = d;
}

void psd_service_stop(struct psd_service *svc) {
  psd__pull_release_parked(svc, 1);
  psd__move_wait(svc);
}

void psd_service_free(struct psd_service *svc) {
  if (!svc)
    return;
  psd__pull_release_parked(svc, 1);
  psd__move_wait(svc);
  psd_steps_free(svc->steps);
  psd_sstage_free(svc->sstage);
  psd_dedup_free(svc->dedup);
  psd_vstage_free(svc->vstage);
  pthread_mutex_destroy(&svc->park_lock);
  pthread_rwlock_destroy(&svc->tables_gate);
  pthread_rwlock_destroy(&svc->owned_gate);
  pthread_mutex_destroy(&svc->move_lock);
  pthread_cond_destroy(&svc->move_idle);
  free(svc);
}

const struct cm_rpc_method *psd_service_methods(struct psd_service *svc,
                                                int *n) {
  *n = PSD__NMETHODS;
  return svc->methods;
}

void psd_service_counters(struct psd_service *svc, struct psd_counters *c) {
  c->pulls = atomic_load(&svc->pulls);
  c->pushes = atomic_load(&svc->pushes);
  c->examples = atomic_load(&svc->examples);
  c->bytes_in = atomic_load(&svc->bytes_in);
  c->bytes_out = atomic_load(&svc->bytes_out);
  c->errors = atomic_load(&svc->errors);
  c->nonfinite = atomic_load(&svc->nonfinite);
  c->step =
      svc->steps ? psd_steps_version(svc->steps) : atomic_load(&svc->updates);
}

enum psd_nonfinite psd_nonfinite_parse(const char *name) {
  return !strcmp(name, "skip")    ? PSD_NONFINITE_SKIP
         : !strcmp(name, "apply") ? PSD_NONFINITE_APPLY
                                  : PSD_NONFINITE_REJECT;
}

const char *psd_nonfinite_name(enum psd_nonfinite n) {
  return n == PSD_NONFINITE_SKIP    ? "skip"
         : n == PSD_NONFINITE_APPLY ? "apply"
                                    : "reject";
}
