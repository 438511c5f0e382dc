/* psd's calls to its own job's shards (peer.h): the credentials and
 * channels, one call, a call to all at once, and the rounds of a call sent
 * until every shard has answered it. Over common/rpc's client half
 * (cm_client_run), as libpsclient's calls are. */
#include "peer.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth.h"
#include "err.h"
#include "log.h"
#include "rpc.h"

struct psd_peers {
  const struct cm_spec *spec; /* borrowed: the shards' addresses */
  struct psd_peer_opts o;     /* copied; o.who borrowed */
  uint64_t spec_fp;           /* cm_spec_fingerprint(spec), every call's */
  struct cm_creds creds;      /* owned: a client's of the job */
  struct cm_channel **ch;     /* owned, one per address; NULL when fresh */
};

int psd_peers_new(struct psd_peers **out, const struct cm_spec *spec,
                  const struct psd_peer_opts *o, char *err, size_t errlen) {
  struct psd_peers *p = calloc(1, sizeof *p);
  int rc = 0;
  *out = NULL;
  if (!p) {
    snprintf(err, errlen, "out of memory");
    return CM_ENOMEM;
  }
  p->spec = spec;
  p->o = *o;
  p->spec_fp = cm_spec_fingerprint(spec);
  if ((rc = cm_creds_load(&spec->auth, 0, &p->creds, err, errlen)))
    goto out;
  if (o->fresh)
    goto out;
  if (!(p->ch = calloc(spec->nps, sizeof *p->ch))) {
    snprintf(err, errlen, "out of memory");
    rc = CM_ENOMEM;
    goto out;
  }
  for (int s = 0; s < spec->nps; s++)
    if ((rc = cm_channel_new(&p->ch[s], spec->ps[s].text, &p->creds))) {
      snprintf(err, errlen, "cannot make a channel to ps:%d (%s): %s", s,
               spec->ps[s].text, cm_strerror(rc));
      goto out;
    }
out:
  if (rc) {
    psd_peers_free(p);
    p = NULL;
  }
  *out = p;
  return rc;
}

void psd_peers_free(struct psd_peers *p) {
  if (!p)
    return;
  for (int s = 0; p->ch && s < p->spec->nps; s++)
    cm_channel_free(p->ch[s]);
  free(p->ch);
  cm_creds_free(&p->creds);
  free(p);
}

Psd__V1__Caller psd_peer_caller(const struct psd_peers *p) {
  Psd__V1__Caller caller = PSD__V1__CALLER__INIT;
  caller.job = (char *)p->spec->job.name;
  caller.worker = (char *)p->o.who;
  caller.spec_fp = p->spec_fp;
  caller.spec_ps = p->spec->nps;
  caller.spec_workers = p->spec->nworker;
  return caller;
}

/* Readies u for a call of method carrying msg to shard s: its channel (a
 * new one when fresh). Returns 0, or -1 with u's status and details
 * saying why it cannot be called. */
static int prepare(struct psd_peers *p, int s, const char *method,
                   const ProtobufCMessage *msg, struct cm_unary *u) {
  int rc;
  memset(u, 0, sizeof *u);
  u->user = (void *)(intptr_t)s;
  if (s < 0 || s >= p->spec->nps) {
    u->status = GRPC_STATUS_INVALID_ARGUMENT;
    snprintf(u->details, sizeof u->details,
             "no ps:%d: the spec's cluster.ps lists %d", s, p->spec->nps);
    return -1;
  }
  if (p->ch) {
    u->channel = p->ch[s];
  } else if ((rc = cm_channel_new(&u->channel, p->spec->ps[s].text,
                                  &p->creds))) {
    u->channel = NULL;
    u->status = GRPC_STATUS_INTERNAL;
    snprintf(u->details, sizeof u->details, "cannot call it: %s",
             cm_strerror(rc));
    return -1;
  }
  u->method = method;
  u->request = cm_rpc_pack(msg);
  return 0;
}

/* After a run: a fresh channel is closed (u->channel is then stale). */
static void finish(struct psd_peers *p, struct cm_unary *u) {
  if (!p->ch && u->channel)
    cm_channel_free(u->channel);
}

void psd_peer_call(struct psd_peers *p, int s, const char *method,
                   const ProtobufCMessage *msg, int timeout_ms,
                   int wait_for_ready, struct cm_unary *u) {
  struct cm_run_opts o = {.timeout_ms = timeout_ms,
                          .inflight = 1,
                          .wait_for_ready = wait_for_ready};
  if (prepare(p, s, method, msg, u))
    return;
  cm_client_run(u, 1, &o);
  finish(p, u);
}

int psd_peer_call_all(struct psd_peers *p, int n, struct cm_unary *calls,
                      const int *done, const char *method,
                      const ProtobufCMessage *msg, int timeout_ms,
                      int wait_for_ready) {
  struct cm_run_opts o = {.timeout_ms = timeout_ms,
                          .inflight = 1,
                          .wait_for_ready = wait_for_ready};
  int k = 0, ready = 0;
  for (int s = 0; s < n; s++) {
    if (done[s])
      continue;
    if (prepare(p, s, method, msg, &calls[k]) == 0) {
      /* The calls that can be made first: [0, ready) is run. */
      if (k != ready) {
        struct cm_unary t = calls[ready];
        calls[ready] = calls[k];
        calls[k] = t;
      }
      ready++;
    }
    k++;
  }
  cm_client_run(calls, ready, &o);
  for (int i = 0; i < ready; i++)
    finish(p, &calls[i]);
  return k;
}

int psd_peer_call_until_all(struct psd_peers *p, int n, struct cm_unary *calls,
                            int *done, const char *method,
                            const ProtobufCMessage *msg,
                            const struct psd_peer_rounds *r, int *left) {
  int stop = 0;
  *left = 0;
  for (int s = 0; s < n; s++)
    *left += !done[s];
  for (int attempt = 0; *left > 0 && !stop; attempt++) {
    int k = psd_peer_call_all(p, n, calls, done, method, msg, r->timeout_ms, 1);
    for (int i = 0; i < k; i++) {
      int s = (int)(intptr_t)calls[i].user;
      if (calls[i].status == GRPC_STATUS_OK) {
        done[s] = 1;
        (*left)--;
      } else if (r->judge(r->judge_arg, s, &calls[i], attempt)) {
        stop = 1;
      } else if (attempt % 10 == 0) {
        cm_warn("%s ps:%d failed: %s: %s; retrying", r->what, s,
                cm_rpc_status_name(calls[i].status), calls[i].details);
      }
      cm_unary_release(&calls[i]);
    }
    if (r->pause(r->pause_arg, *left > 0 && !stop ? r->retry_ms : 0))
      return 1;
  }
  return 0;
}
