/* Where a closed sync step is applied on a shard (service_internal.h; the
 * coordinator decides the step's set in coord_barrier.c): psd.v1.Data/Commit
 * applies the gradients staged for a step by the workers the coordinator
 * admitted (steps.h) and Data/Rollback takes the shard back to a
 * checkpointed step (saver.h); both then release the pulls parked for what
 * they made (service_pull.c). An asynchronous job has no steps, and refuses
 * both. */
#include "service_internal.h"

#include <pthread.h>
#include <stdint.h>

#include "log.h"
#include "publish.h"
#include "saver.h"
#include "steps.h"

/* Checks a Commit's sets: worker indices in range, none listed twice, none
 * both applied and dropped. Returns 0 or answers the call and returns -1. */
static int check_commit_sets(struct psd_service *svc, struct cm_rpc_call *call,
                             const Psd__V1__CommitRequest *req) {
  /* 1: applied, 2: dropped, per worker */
  unsigned char seen[PSD_STEPS_MAX_WORKERS] = {0};
  const struct {
    const char *name; /* the field */
    size_t n;         /* entries */
    const int32_t *w; /* worker indices */
  } sets[2] = {{"applied", req->n_applied, req->applied},
               {"dropped", req->n_dropped, req->dropped}};

  for (int k = 0; k < 2; k++) {
    if (sets[k].n > (size_t)svc->nworkers) {
      psd__fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
                "Commit of step %llu: %zu workers in %s; the job has %d",
                (unsigned long long)req->step, sets[k].n, sets[k].name,
                svc->nworkers);
      return -1;
    }
    for (size_t i = 0; i < sets[k].n; i++) {
      int32_t w = sets[k].w[i];
      if (w < 0 || w >= svc->nworkers) {
        psd__fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
                  "Commit of step %llu: worker %d in %s is out of range; "
                  "cluster.worker has %d entries",
                  (unsigned long long)req->step, w, sets[k].name,
                  svc->nworkers);
        return -1;
      }
      if (seen[w]) {
        psd__fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
                  "Commit of step %llu: worker %d is listed %s",
                  (unsigned long long)req->step, w,
                  seen[w] == k + 1
                      ? (k ? "twice in dropped" : "twice in applied")
                      : "both in applied and in dropped");
        return -1;
      }
      seen[w] = (unsigned char)(k + 1);
    }
  }
  return 0;
}

void psd__on_commit(struct cm_rpc_call *call, grpc_byte_buffer *bb, void *ctx) {
  struct psd_service *svc = ctx;
  struct cm_wire_msg m;
  Psd__V1__CommitRequest *req = (Psd__V1__CommitRequest *)cm_request_open(
      &svc->host, call, bb, &psd__v1__commit_request__descriptor, "Commit", &m);
  int applied[PSD_STEPS_MAX_WORKERS], dropped[PSD_STEPS_MAX_WORKERS];
  char err[256];
  cm_wire_msg_release(&m);
  if (!req)
    goto out;
  if (!svc->steps) {
    psd__fail(svc, call, GRPC_STATUS_FAILED_PRECONDITION,
              "Commit: shard %d runs an asynchronous job", svc->shard);
    goto out;
  }
  if (check_commit_sets(svc, call, req))
    goto out;
  for (size_t i = 0; i < req->n_applied; i++)
    applied[i] = req->applied[i];
  for (size_t i = 0; i < req->n_dropped; i++)
    dropped[i] = req->dropped[i];
  /* A checkpoint being written holds the commit (saver.h). */
  if (svc->saver)
    psd_saver_commit_begin(svc->saver);
  /* Sparse pulls wait while the step is applied, dense and sparse. */
  pthread_rwlock_wrlock(&svc->tables_gate);
  uint64_t before = psd_steps_version(svc->steps);
  int rc = psd_steps_commit(svc->steps, req->step, applied, (int)req->n_applied,
                            dropped, (int)req->n_dropped, err, sizeof err);
  if (!rc && before == req->step && psd_steps_version(svc->steps) > before &&
      psd__sparse_commit(svc, req->step, applied, (int)req->n_applied))
    cm_error("Commit of step %llu: the step's sparse rows could not be "
             "applied (out of memory); they are dropped",
             (unsigned long long)req->step);
  /* A publication of the step just made, at this instant (publish.h). */
  if (!rc && req->publish && svc->publisher && before == req->step &&
      psd_steps_version(svc->steps) > before)
    psd_publisher_cut(svc->publisher, psd_steps_version(svc->steps));
  pthread_rwlock_unlock(&svc->tables_gate);
  if (svc->saver)
    psd_saver_commit_end(svc->saver, psd_steps_version(svc->steps),
                         req->checkpoint);
  if (rc) {
    /* Shards resumed from different checkpoints cannot go on together. */
    psd__fail(
        svc, call, GRPC_STATUS_FAILED_PRECONDITION, "%s%s", err,
        req->step != psd_steps_version(svc->steps)
            ? "; did the shards resume from different checkpoints? restart "
              "every shard with --resume-step N, N the newest step all of "
              "them have"
            : "");
    goto out;
  }
  {
    Psd__V1__CommitResponse r = PSD__V1__COMMIT_RESPONSE__INIT;
    r.version = psd_steps_version(svc->steps);
    cm_rpc_reply(call, cm_rpc_pack(&r.base));
  }
  psd__pull_release_parked(svc, 0);
out:
  cm_request_free((ProtobufCMessage *)req);
}

/* Sync: the coordinator rolls the job back to a step (saver.h,
 * psd_saver_rollback): this shard reloads its checkpoint of that step in
 * place and drops every staged gradient; the pulls parked for steps of the
 * old generation are told. */
void psd__on_rollback(struct cm_rpc_call *call, grpc_byte_buffer *bb,
                      void *ctx) {
  struct psd_service *svc = ctx;
  struct cm_wire_msg m;
  Psd__V1__RollbackRequest *req = (Psd__V1__RollbackRequest *)cm_request_open(
      &svc->host, call, bb, &psd__v1__rollback_request__descriptor, "Rollback",
      &m);
  char err[4096];
  cm_wire_msg_release(&m);
  if (!req)
    goto out;
  if (!svc->steps) {
    psd__fail(svc, call, GRPC_STATUS_FAILED_PRECONDITION,
              "Rollback: shard %d runs an asynchronous job", svc->shard);
    goto out;
  }
  struct psd_steps_state st;
  psd_steps_state(svc->steps, &st);
  uint64_t gen = st.gen;
  if (gen >= req->gen && st.version == req->step) {
    /* A retry whose answer was lost. */
  } else if (gen >= req->gen) {
    /* A generation never goes back: a stale or forged call. */
    psd__fail(svc, call, GRPC_STATUS_FAILED_PRECONDITION,
              "Rollback to step %llu in generation %llu: shard %d is at "
              "generation %llu already",
              (unsigned long long)req->step, (unsigned long long)req->gen,
              svc->shard, (unsigned long long)gen);
    goto out;
  } else if (!svc->saver || psd_saver_rollback(svc->saver, req->step, req->gen,
                                               err, sizeof err)) {
    psd__fail(svc, call, GRPC_STATUS_FAILED_PRECONDITION,
              "Rollback to step %llu: shard %d cannot: %s",
              (unsigned long long)req->step, svc->shard,
              svc->saver ? err : "it keeps no checkpoints");
    goto out;
  }
  if (svc->sstage)
    psd_sstage_clear(svc->sstage);
  {
    Psd__V1__RollbackResponse r = PSD__V1__ROLLBACK_RESPONSE__INIT;
    r.version = psd_steps_version(svc->steps);
    cm_rpc_reply(call, cm_rpc_pack(&r.base));
  }
  psd__pull_release_parked(svc, 0);
out:
  cm_request_free((ProtobufCMessage *)req);
}
