/* psc__client_status (psclient.h): one shard's Admin/Status answer as a JSON
 * text, for psctl and the tests; the document itself is common/metrics'
 * (status_json.h), which psd's metrics endpoint renders too. */
#include "client_internal.h"

#include <string.h>

#include <jansson.h>

#include "err.h"
#include "status_json.h"

int psc__client_status(struct psc__client *c, int shard, char **json) {
  Psd__V1__Caller caller = psc__caller(c, -1);
  Psd__V1__StatusRequest req = PSD__V1__STATUS_REQUEST__INIT;
  Psd__V1__StatusResponse *resp = NULL;
  struct cm_unary u;
  json_t *root = NULL;
  int rc;

  *json = NULL;
  /* Any address of the pool: a standby shard has a status too. */
  if (shard < 0 || shard >= c->spec->nps) {
    psc__seterr(c, "status: no shard %d; the cluster has %d", shard,
                c->spec->nps);
    return CM_EINVAL;
  }
  req.caller = &caller;
  memset(&u, 0, sizeof u);
  u.channel = c->ch[shard];
  u.method = "/psd.v1.Admin/Status";
  u.request = cm_rpc_pack(&req.base);
  if ((rc = psc__run(c, &u, 1, "status", c->o.timeout_ms, 0, NULL, NULL)))
    goto out;
  if (!(resp = (Psd__V1__StatusResponse *)cm_rpc_unpack(
            u.response, &psd__v1__status_response__descriptor))) {
    psc__seterr(c, "status from ps:%d: malformed answer", shard);
    rc = CM_EPROTO;
    goto out;
  }
  if (!(root = cm_status_json(resp))) {
    rc = CM_ENOMEM;
    goto out;
  }
  *json = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
  rc = *json ? 0 : CM_ENOMEM;
out:
  json_decref(root);
  if (resp)
    psd__v1__status_response__free_unpacked(resp, NULL);
  cm_unary_release(&u);
  return rc;
}

int psc__client_await(struct psc__client *c, int shard, int ms) {
  if (shard < 0 || shard >= c->spec->nps)
    return 0;
  return cm_channels_await(&c->ch[shard], NULL, 1, c->cq, ms);
}
