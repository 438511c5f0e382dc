/* A live layout switch, the shard's service side (service.h; driven by
 * reshard/switch.c): the store's switch gate held around every call that
 * uses variables or the layout, the dense calls answered UNAVAILABLE while
 * frozen, and the COMMIT that swaps the variables and steps the layout
 * with the gate held for writing. gRPC's one queue thread runs the
 * handlers, so the gate is uncontended but for the threads beside it
 * (checkpoints, publications, /metrics' Status, a switch's PREPARE). A
 * sync job's parked pulls answer later without it: a sync job never
 * switches (its moves are refused). */
#include "service_internal.h"

#include <stdio.h>
#include <string.h>

#include "err.h"
#include "layout.h"
#include "log.h"

/* Runs handler h on the call with the store's gate read-held; a dense
 * call (dense) is answered UNAVAILABLE while the store is frozen. */
static void gated(struct psd_service *svc, struct cm_rpc_call *call,
                  grpc_byte_buffer *bb, cm_rpc_handler h, int dense,
                  const char *what) {
  if (psd_store_hold(svc->store) && dense) {
    int to = 0;
    uint64_t layout = psd_service_frozen(svc, &to);
    /* Not an error (not counted, not logged above debug): the client
     * retries it with its backoff until the switch's COMMIT or ABORT. */
    cm_debug("%s from %s: frozen for layout %llu", what, cm_rpc_peer(call),
             (unsigned long long)layout);
    cm_rpc_fail(call, GRPC_STATUS_UNAVAILABLE,
                "layout switching to layout %llu of %d shard%s on ps:%d; %s "
                "waits until it is done and is retried",
                (unsigned long long)layout, to, to == 1 ? "" : "s", svc->shard,
                what);
  } else {
    h(call, bb, svc);
  }
  psd_store_release(svc->store);
}

void psd__gated_declare(struct cm_rpc_call *call, grpc_byte_buffer *bb,
                        void *ctx) {
  gated(ctx, call, bb, psd__on_declare, 1, "Declare");
}

void psd__gated_pull(struct cm_rpc_call *call, grpc_byte_buffer *bb,
                     void *ctx) {
  gated(ctx, call, bb, psd__on_pull, 1, "Pull");
}

void psd__gated_push(struct cm_rpc_call *call, grpc_byte_buffer *bb,
                     void *ctx) {
  gated(ctx, call, bb, psd__on_push, 1, "Push");
}

void psd__gated_sparse_pull(struct cm_rpc_call *call, grpc_byte_buffer *bb,
                            void *ctx) {
  gated(ctx, call, bb, psd__on_sparse_pull, 0, "SparsePull");
}

void psd__gated_sparse_push(struct cm_rpc_call *call, grpc_byte_buffer *bb,
                            void *ctx) {
  gated(ctx, call, bb, psd__on_sparse_push, 0, "SparsePush");
}

void psd__gated_status(struct cm_rpc_call *call, grpc_byte_buffer *bb,
                       void *ctx) {
  gated(ctx, call, bb, psd__on_status, 0, "Status");
}

void psd_service_freeze(struct psd_service *svc, uint64_t layout, int to) {
  if (layout) {
    atomic_store(&svc->switch_to, to);
    atomic_store(&svc->switch_layout, layout);
  }
  psd_store_freeze(svc->store, layout != 0);
  if (!layout) {
    atomic_store(&svc->switch_layout, 0);
    atomic_store(&svc->switch_to, 0);
  }
}

uint64_t psd_service_frozen(struct psd_service *svc, int *to) {
  if (!psd_store_frozen(svc->store)) {
    *to = 0;
    return 0;
  }
  *to = atomic_load(&svc->switch_to);
  return atomic_load(&svc->switch_layout);
}

int psd_service_switchable(struct psd_service *svc, int to, char *msg,
                           size_t len) {
  struct cm_layout_map m;
  int extra = 0, lacks = 0, first = -1;
  if (!svc->gate) {
    snprintf(msg, len,
             "ps:%d places table rows by splitmix64(id) %% %d, not "
             "by buckets: it never moved any",
             svc->shard, svc->nshards);
    return CM_EINVAL;
  }
  cm_layout_map_init(&m, CM_LAYOUT_RULE_BUCKETS, to);
  for (unsigned b = 0; b < CM_LAYOUT_BUCKETS; b++) {
    int own = (int)(__atomic_load_n(&svc->owned[b >> 6], __ATOMIC_RELAXED) >>
                        (b & 63) &
                    1);
    int want = m.shard[b] == svc->shard;
    if (own == want)
      continue;
    extra += own;
    lacks += want;
    if (first < 0)
      first = (int)b;
  }
  if (!extra && !lacks)
    return 0;
  snprintf(msg, len,
           "the moves to %d shards are not done on ps:%d: it owns %d bucket%s "
           "that the map of %d shards gives another shard and lacks %d of its "
           "own (bucket %d first); move them (Admin/MoveBuckets) before the "
           "switch",
           to, svc->shard, extra, extra == 1 ? "" : "s", to, lacks, first);
  return CM_EINVAL;
}

void psd_service_switch(struct psd_service *svc, struct psd_store *staged,
                        uint64_t layout, int to, void (*under)(void *ctx),
                        void *ctx) {
  struct cm_request_self *me = svc->self_rw;
  psd_store_exclusive(svc->store);
  psd_store_replace(svc->store, staged);
  pthread_rwlock_wrlock(&svc->owned_gate);
  svc->nshards = to;
  cm_layout_map_init(&svc->map, CM_LAYOUT_RULE_BUCKETS, to);
  psd__owned_init(svc);
  pthread_rwlock_unlock(&svc->owned_gate);
  if (me) {
    __atomic_store_n(&me->layout, layout, __ATOMIC_RELEASE);
    __atomic_store_n(&me->nshards, to, __ATOMIC_RELEASE);
    __atomic_store_n(&me->move_to, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&me->moved, 0, __ATOMIC_RELEASE);
  }
  if (under)
    under(ctx);
  atomic_store(&svc->switch_layout, 0);
  atomic_store(&svc->switch_to, 0);
  psd_store_exclusive_end(svc->store, 1);
}
