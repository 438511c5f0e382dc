/* Declare calls to the shards, waiting for shards that are still starting
 * (client_internal.h: psc__declare_calls, psc__declare_everywhere): the
 * variables' and tables' declares send their requests through here, any
 * number per shard (a variable's values may take several, docs/wire.md),
 * each sent again until its shard answers it or connect_timeout_ms has
 * passed.
 *
 * The wait is visible (retry.c): a Declare goes without wait_for_ready, so
 * a shard that cannot be reached fails it at once with gRPC's reason
 * (connection refused, no route, a TLS handshake), and one whose channel is
 * not connected yet gets PROBE_MS to answer, so that a host that drops the
 * packets is said within 2 s too. Each is said after a second (a shard
 * started beside its workers, as pslaunch does, is usually up by then) and
 * every 10 s, and sent again until it answers or connect_timeout_ms has
 * passed; the backoff between attempts ends as soon as the shard's channel
 * connects (psc__retry_wait). A shard's answer carries its process's boot
 * id, sent back with every later call to it (a shard that restarted without
 * a checkpoint refuses the old one). An answer "layout moved" ends the
 * calls with its message in c->moved, for the caller to re-plan. */
#include "client_internal.h"

#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "err.h"

/* The deadline of a Declare on a channel not connected yet, ms. */
#define PROBE_MS 1500
/* Calls per shard packed and sent in one batch: a variable's values may
 * take hundreds of messages, packed only when their turn comes. */
#define BATCH_PER_SHARD 8

void psc__decl_calls_free(struct psc__decl_call *dc, int n) {
  for (int k = 0; dc && k < n; k++)
    if (dc[k].resp) {
      psd__v1__declare_response__free_unpacked(dc[k].resp, NULL);
      dc[k].resp = NULL;
    }
}

/* Records call u's outcome for dc (its shard s): the answer, or why not.
 * Sets *fatal to the first failure that is not worth a retry, down[s] for
 * a shard that could not be reached. */
static void take_answer(struct psc__client *c, struct psc__decl_call *dc,
                        struct cm_unary *u, unsigned char *down, int *fatal) {
  int s = dc->shard;
  if (u->status == GRPC_STATUS_OK) {
    Psd__V1__DeclareResponse *r = (Psd__V1__DeclareResponse *)cm_rpc_unpack(
        u->response, &psd__v1__declare_response__descriptor);
    if (!r) {
      if (!*fatal) {
        psc__seterr(c, "declare: ps:%d (%s) sent a malformed answer", s,
                    c->spec->ps[s].text);
        *fatal = CM_EPROTO;
      }
      return;
    }
    c->boot[s] = r->boot;
    dc->resp = r;
    psc__shard_up(c, s);
  } else if (psc__is_moved(u)) {
    /* The job's layout moved: the declare is made again on the new one
     * (declare.c, sparse.c), not retried here. */
    int seen = c->moved[0] != 0; /* the caller empties it per declare */
    psc__note_moved(c, &seen, u->details);
    if (!*fatal) {
      psc__call_error(c, "declare", u);
      *fatal = CM_ERPC;
    }
  } else if (!psc__retryable(u->status)) {
    if (!*fatal) {
      psc__call_error(c, "declare", u);
      *fatal = cm_rpc_status_rc(u->status);
    }
  } else if (u->status == GRPC_STATUS_DEADLINE_EXCEEDED && u->timeout_ms > 0 &&
             cm_channel_connected(u->channel)) {
    /* It connected, and is creating variables: no outage, the next
     * Declare (idempotent) gets the whole wait. */
  } else {
    psc__shard_down(c, s, u);
    down[s] = 1;
  }
}

int psc__declare_calls(struct psc__client *c, struct psc__decl_call *dc,
                       int n) {
  /* Per address of the pool: a move's destinations are past nshards. */
  unsigned char *down = calloc((size_t)c->spec->nps, 1);
  int *per = calloc((size_t)c->spec->nps, sizeof *per);
  int *idx = calloc((size_t)n + 1, sizeof *idx);
  struct cm_unary *calls = calloc((size_t)n + 1, sizeof *calls);
  int rc = 0, left = n;
  if (!down || !per || !idx || !calls) {
    rc = CM_ENOMEM;
    goto out;
  }
  c->starting = 1;
  c->wait_from = cm_mono_ms();
  for (int attempt = 0; left > 0;) {
    int m = 0, fatal = 0, any_down = 0;
    memset(per, 0, (size_t)c->spec->nps * sizeof *per);
    for (int k = 0; k < n; k++) {
      int s = dc[k].shard;
      if (dc[k].resp || per[s] == BATCH_PER_SHARD)
        continue;
      per[s]++;
      memset(&calls[m], 0, sizeof calls[m]);
      calls[m].channel = c->ch[s];
      calls[m].method = "/psd.v1.Data/Declare";
      calls[m].request = cm_rpc_pack(&dc[k].req->base);
      /* A connected shard gets the whole wait, however long creating its
       * variables takes; the others PROBE_MS to connect and answer. */
      if (!cm_channel_connected(c->ch[s]) && c->o.connect_timeout_ms > PROBE_MS)
        calls[m].timeout_ms = PROBE_MS;
      idx[m++] = k;
    }
    psc__run(c, calls, m, "declare", c->o.connect_timeout_ms, 0, NULL, NULL);
    memset(down, 0, (size_t)c->spec->nps);
    for (int j = 0; j < m; j++) {
      take_answer(c, &dc[idx[j]], &calls[j], down, &fatal);
      if (dc[idx[j]].resp)
        left--;
      cm_unary_release(&calls[j]);
    }
    if ((rc = fatal))
      break;
    for (int s = 0; s < c->spec->nps; s++)
      any_down |= down[s];
    /* Another batch goes at once; a shard not reached, after a backoff. */
    if (left > 0 && any_down &&
        (rc = psc__retry_wait(c, down, c->spec->nps, ++attempt, "declare")))
      break;
  }
out:
  c->starting = 0;
  for (int j = 0; calls && j <= n; j++)
    cm_unary_release(&calls[j]);
  free(calls);
  free(idx);
  free(per);
  free(down);
  return rc;
}

int psc__declare_everywhere(struct psc__client *c,
                            const Psd__V1__DeclareRequest *req) {
  /* Every shard that holds table rows: a live move's destinations too. */
  int n = c->map.nshards, rc;
  struct psc__decl_call *dc = calloc((size_t)n, sizeof *dc);
  if (!dc)
    return CM_ENOMEM;
  for (int s = 0; s < n; s++)
    dc[s] = (struct psc__decl_call){s, req, NULL};
  rc = psc__declare_calls(c, dc, n);
  psc__decl_calls_free(dc, n);
  free(dc);
  return rc;
}
