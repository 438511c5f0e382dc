/* psc__client_read (psclient.h): reads runs of variables the client did not
 * declare, as an admin tool does (psctl get), with Data/Pull. Each run is
 * cut into messages of at most chunk_bytes, sent all at once across the
 * shards, and each run reports on its own, so that the runs that arrived can
 * be used when others failed. */
#include "client_internal.h"

#include <stdio.h>
#include <stdlib.h>

#include "err.h"
#include "wire.h"

/* One message of a psc__client_read run. */
struct read_part {
  struct psc__read *r; /* the run it belongs to */
  uint64_t count;      /* elements in this message */
  float *dst;          /* where they go */
};

/* Checks one read answer and copies its bytes out. */
static void on_read(struct cm_unary *u, void *ctx) {
  const struct read_part *p = u->user;
  struct cm_wire_msg w;
  (void)ctx;
  if (u->status != GRPC_STATUS_OK)
    return;
  if (cm_wire_parse(&w, u->response) ||
      w.bulk_len != p->count * sizeof(float)) {
    u->status = GRPC_STATUS_INTERNAL;
    snprintf(u->details, sizeof u->details,
             "pull answer holds %zu bytes; expected %llu", w.bulk_len,
             (unsigned long long)(p->count * sizeof(float)));
  } else {
    cm_wire_bulk_read(&w, 0, p->dst, w.bulk_len);
  }
  cm_wire_msg_release(&w);
  cm_unary_release(u);
}

int psc__client_read(struct psc__client *c, struct psc__read *reads, int n) {
  Psd__V1__Caller caller = psc__caller(c, -1);
  /* An admin tool's read names its shards itself: no layout checked. */
  caller.layout = 0;
  caller.shards = 0;
  uint64_t per = c->o.chunk_bytes / sizeof(float);
  struct cm_unary *calls = NULL;
  struct read_part *parts = NULL;
  int ncalls = 0, k = 0, rc = 0;

  for (int i = 0; i < n; i++) {
    reads[i].rc = 0;
    reads[i].err[0] = 0;
    if (reads[i].shard < 0 || reads[i].shard >= c->spec->nps) {
      psc__seterr(c, "read '%s': no shard %d; the cluster has %d",
                  reads[i].name, reads[i].shard, c->spec->nps);
      return CM_EINVAL;
    }
    ncalls += (int)((reads[i].count + per - 1) / per);
  }
  if (!(calls = calloc(ncalls + 1, sizeof *calls)) ||
      !(parts = calloc(ncalls + 1, sizeof *parts))) {
    psc__seterr(c, "read: out of memory");
    rc = CM_ENOMEM;
    goto out;
  }
  for (int i = 0; i < n; i++) {
    for (uint64_t off = 0; off < reads[i].count; off += per, k++) {
      Psd__V1__PullRequest req = PSD__V1__PULL_REQUEST__INIT;
      Psd__V1__Segment seg = PSD__V1__SEGMENT__INIT, *sp = &seg;
      uint64_t left = reads[i].count - off;
      parts[k] = (struct read_part){&reads[i], left < per ? left : per,
                                    reads[i].dst + off};
      seg.name = (char *)reads[i].name;
      seg.offset = reads[i].offset + off;
      seg.count = parts[k].count;
      req.caller = &caller;
      req.n_segments = 1;
      req.segments = &sp;
      req.slots = reads[i].slots;
      req.slot = reads[i].slot;
      /* Answers up to this client's own receive limit come whole. */
      req.max_answer_bytes = (uint64_t)cm_rpc_max_message();
      calls[k].channel = c->ch[reads[i].shard];
      calls[k].method = "/psd.v1.Data/Pull";
      calls[k].user = &parts[k];
      if (!(calls[k].request = cm_rpc_pack(&req.base))) {
        psc__seterr(c, "read: out of memory");
        rc = CM_ENOMEM;
        goto out;
      }
    }
  }
  rc = psc__run(c, calls, ncalls, "read", c->o.timeout_ms, 0, on_read, NULL);
  for (int i = 0; i < ncalls; i++) {
    struct psc__read *r = parts[i].r;
    if (calls[i].status == GRPC_STATUS_OK || r->rc)
      continue;
    char cause[512];
    r->rc = cm_rpc_status_rc(calls[i].status);
    if (psc__reach_cause(calls[i].status, calls[i].details,
                         cm_channel_connected(calls[i].channel),
                         c->o.timeout_ms / 1000.0, cause, sizeof cause))
      snprintf(r->err, sizeof r->err,
               "read of '%s' from ps:%d (%s) failed: %s [%s: %s]", r->name,
               r->shard, cm_channel_target(calls[i].channel), cause,
               cm_rpc_status_name(calls[i].status),
               calls[i].details[0] ? calls[i].details : "no message");
    else
      snprintf(r->err, sizeof r->err,
               "read of '%s' from ps:%d (%s) failed: %s: %s", r->name, r->shard,
               cm_channel_target(calls[i].channel),
               cm_rpc_status_name(calls[i].status),
               calls[i].details[0] ? calls[i].details : "(no message)");
    if (!rc)
      rc = r->rc; /* on_read turned it into a failure after the run */
  }
out:
  for (int i = 0; calls && i < ncalls; i++)
    cm_unary_release(&calls[i]);
  free(calls);
  free(parts);
  return rc;
}
