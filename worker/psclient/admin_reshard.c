/* psc__client_reshard (psclient.h, "admin calls"): Admin.Reshard at the
 * coordinator, ps:0, for psctl reshard (docs/reshard.md "Live"). */
#include "client_internal.h"

#include <stdio.h>
#include <string.h>

#include "err.h"

int psc__client_reshard(struct psc__client *c,
                        const struct psc__reshard_ask *ask,
                        struct psc__reshard *out) {
  Psd__V1__Caller caller = psc__caller(c, -1);
  Psd__V1__ReshardRequest req = PSD__V1__RESHARD_REQUEST__INIT;
  Psd__V1__ReshardResponse *resp = NULL;
  struct cm_unary call;
  int rc;

  memset(out, 0, sizeof *out);
  memset(&call, 0, sizeof call);
  req.caller = &caller;
  req.shards = ask->shards;
  req.how = (Psd__V1__ReshardHow)ask->how;
  req.batch = ask->batch;
  req.rate_mbps = ask->rate_mbps;
  req.cancel = ask->cancel;
  call.channel = c->ch[0];
  call.method = "/psd.v1.Admin/Reshard";
  call.request = cm_rpc_pack(&req.base);
  rc = psc__run(c, &call, 1, "reshard", c->o.timeout_ms, 0, NULL, NULL);
  out->status = call.status;
  snprintf(out->details, sizeof out->details, "%s", call.details);
  if (!rc && !(resp = (Psd__V1__ReshardResponse *)cm_rpc_unpack(
                   call.response, &psd__v1__reshard_response__descriptor))) {
    out->status = GRPC_STATUS_INTERNAL;
    snprintf(out->details, sizeof out->details, "malformed answer");
    psc__seterr(c, "reshard: ps:0 sent a malformed answer");
    rc = CM_EPROTO;
  }
  if (resp) {
    out->layout = resp->layout;
    out->from = resp->from;
    out->to = resp->to;
    out->moves = resp->moves;
    snprintf(out->message, sizeof out->message, "%s",
             resp->message ? resp->message : "");
    psd__v1__reshard_response__free_unpacked(resp, NULL);
  }
  cm_unary_release(&call);
  return rc;
}
