/* libpsclient's calls for an operator's tool (psclient.h, "admin calls"):
 * Admin.Checkpoint on every shard at once, and the last batch's gRPC status
 * for a caller that words its errors itself (psctl). */
#include "client_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"

/* Sync: asks the coordinator (ps:0) to name the step of a cut (*at). On
 * failure every out[s] carries the coordinator's answer. */
static int name_cut(struct psc__client *c, uint64_t *at,
                    struct psc__checkpoint *out) {
  Psd__V1__Caller caller = psc__caller(c, 0);
  Psd__V1__CheckpointRequest req = PSD__V1__CHECKPOINT_REQUEST__INIT;
  Psd__V1__CheckpointResponse *resp = NULL;
  struct cm_unary call;
  int rc;

  memset(&call, 0, sizeof call);
  req.caller = &caller;
  req.job = 1;
  call.channel = c->ch[0];
  call.method = "/psd.v1.Admin/Checkpoint";
  call.request = cm_rpc_pack(&req.base);
  rc = psc__run(c, &call, 1, "checkpoint cut", c->o.timeout_ms, 0, NULL, NULL);
  if (!rc && !(resp = (Psd__V1__CheckpointResponse *)cm_rpc_unpack(
                   call.response, &psd__v1__checkpoint_response__descriptor))) {
    call.status = GRPC_STATUS_INTERNAL;
    snprintf(call.details, sizeof call.details, "malformed answer");
    psc__seterr(c, "checkpoint cut from ps:0: malformed answer");
    rc = CM_EPROTO;
  }
  if (resp) {
    *at = resp->step;
    psd__v1__checkpoint_response__free_unpacked(resp, NULL);
  } else {
    for (int s = 0; s < c->nshards; s++) {
      out[s].status = call.status ? call.status : GRPC_STATUS_INTERNAL;
      snprintf(out[s].details, sizeof out[s].details,
               "the coordinator (ps:0) named no step for the cut: %.400s",
               call.details);
      psc__reach_cause(
          call.status, call.details, cm_channel_connected(call.channel),
          c->o.timeout_ms / 1000.0, out[s].cause, sizeof out[s].cause);
    }
  }
  cm_unary_release(&call);
  return rc;
}

int psc__client_checkpoint(struct psc__client *c, int wait,
                           struct psc__checkpoint *out) {
  Psd__V1__Caller caller = psc__caller(c, -1);
  Psd__V1__CheckpointRequest req = PSD__V1__CHECKPOINT_REQUEST__INIT;
  /* Every address: a standby shard may hold rows a live move gave it. */
  int n = c->spec->nps;
  struct cm_unary *calls = calloc(n, sizeof *calls);
  int rc;

  memset(out, 0, n * sizeof *out);
  if (!calls) {
    psc__seterr(c, "checkpoint: out of memory");
    return CM_ENOMEM;
  }
  req.caller = &caller;
  req.wait = wait;
  if (!strcmp(c->spec->job.mode, "sync") &&
      (rc = name_cut(c, &req.at_step, out))) {
    free(calls);
    return rc;
  }
  for (int s = 0; s < n; s++) {
    calls[s].channel = c->ch[s];
    calls[s].method = "/psd.v1.Admin/Checkpoint";
    calls[s].request = cm_rpc_pack(&req.base);
  }
  /* All shards at once: each writes its own slice in parallel. */
  rc = psc__run(c, calls, n, "checkpoint", c->o.timeout_ms, 0, NULL, NULL);
  for (int s = 0; s < n; s++) {
    struct psc__checkpoint *k = &out[s];
    Psd__V1__CheckpointResponse *resp = NULL;
    int st = calls[s].status;
    if (st == GRPC_STATUS_OK)
      resp = (Psd__V1__CheckpointResponse *)cm_rpc_unpack(
          calls[s].response, &psd__v1__checkpoint_response__descriptor);
    /* Past the layout: one holding nothing answers that it writes none,
     * one not started is not reached; neither fails the call. */
    if (s >= c->nshards && (st == GRPC_STATUS_FAILED_PRECONDITION ||
                            st == GRPC_STATUS_UNAVAILABLE ||
                            st == GRPC_STATUS_DEADLINE_EXCEEDED)) {
      k->standby = 1;
      snprintf(k->details, sizeof k->details, "%s",
               st == GRPC_STATUS_FAILED_PRECONDITION
                   ? "standing by: holds nothing, writes none"
                   : "standing by, not reached");
      cm_unary_release(&calls[s]);
      continue;
    }
    k->status = st;
    snprintf(k->details, sizeof k->details, "%s", calls[s].details);
    psc__reach_cause(calls[s].status, calls[s].details,
                     cm_channel_connected(calls[s].channel),
                     c->o.timeout_ms / 1000.0, k->cause, sizeof k->cause);
    if (k->status == GRPC_STATUS_OK && !resp) {
      k->status = GRPC_STATUS_INTERNAL;
      snprintf(k->details, sizeof k->details, "malformed answer");
      if (!rc) {
        psc__seterr(c, "checkpoint from ps:%d: malformed answer", s);
        rc = CM_EPROTO;
      }
    }
    if (resp) {
      k->written = resp->written;
      k->step = resp->step;
      k->bytes = resp->bytes;
      k->ms = resp->ms;
      snprintf(k->path, sizeof k->path, "%s", resp->path);
      psd__v1__checkpoint_response__free_unpacked(resp, NULL);
    }
    cm_unary_release(&calls[s]);
  }
  free(calls);
  return rc;
}

int psc__client_last_status(const struct psc__client *c, const char **details) {
  if (details)
    *details = c->last_details;
  return c->last_status;
}
