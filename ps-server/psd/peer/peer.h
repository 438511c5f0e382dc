/* Room ps-server/psd/peer/, the one way psd calls its own job's shards:
 * the coordinator's commits, rollbacks and step checks (coord/), ps:0's
 * calls of a live reshard (reshard/) and job.exit_when_done's look at
 * ps:0's Status (done.c) all go through this header. Rooms it calls: none.
 *
 * A struct psd_peers holds what a caller needs to reach every address of
 * the spec's cluster.ps (the job's shards and the standby ones): the
 * credentials a client of the job presents (the token, and with TLS the CA
 * and, with mutual TLS, the client certificate), who calls (Caller.worker),
 * and a channel per shard, made when the peers are and kept (gRPC
 * reconnects it), or, with fresh, one made for each call and closed after
 * it. Each caller owns its own peers; every call blocks its thread until
 * its answers are in, so none is made on the loop's thread or gRPC's. */
#ifndef PSD_PEER_H
#define PSD_PEER_H

#include <stddef.h>

#include "ps.pb-c.h"
#include "rpc_client.h"
#include "spec.h"

struct psd_peers;

/* How a caller's calls are made. */
struct psd_peer_opts {
  const char *who; /* Caller.worker its calls carry ("coordinator", ...);
                      borrowed, must outlive the peers */
  int fresh;       /* 1: every call dials a channel of its own, closed
                      after it, so that a shard killed and started again
                      is reached at once, not after the reconnect backoff
                      of a channel kept */
};

/* Makes the peers of spec's shards (spec borrowed, must outlive them).
 * Returns 0, or a negative code with err saying why (credentials that
 * cannot be read, a channel that cannot be made). */
int psd_peers_new(struct psd_peers **out, const struct cm_spec *spec,
                  const struct psd_peer_opts *o, char *err, size_t errlen);
void psd_peers_free(struct psd_peers *p);

/* The identity every call to a shard carries: the job, o->who, the spec's
 * fingerprint and counts. Points into the spec and the options. */
Psd__V1__Caller psd_peer_caller(const struct psd_peers *p);

/* One call of method carrying msg to shard s, within timeout_ms (with
 * wait_for_ready, a channel still connecting is waited for within it).
 * u is filled whatever happens: its status (not OK when the shard could
 * not be called, the details saying why), details and response, which the
 * caller reads (cm_rpc_unpack) and releases (cm_unary_release). */
void psd_peer_call(struct psd_peers *p, int s, const char *method,
                   const ProtobufCMessage *msg, int timeout_ms,
                   int wait_for_ready, struct cm_unary *u);

/* One call of method carrying msg to each shard s < n not yet done[s],
 * all at once, waiting for their answers (each within timeout_ms, as
 * psd_peer_call): calls[0..k) hold them, each call's user its shard
 * index, for the caller to read and release. Returns k. */
int psd_peer_call_all(struct psd_peers *p, int n, struct cm_unary *calls,
                      const int *done, const char *method,
                      const ProtobufCMessage *msg, int timeout_ms,
                      int wait_for_ready);

/* Judges one shard's answer that is not OK in a round of
 * psd_peer_call_until_all (attempt counts the rounds from 0): returns 1 to
 * stop after this round (having logged what it must), or 0 to send it
 * again, logged as a failure every 10th round. */
typedef int (*psd_peer_judge)(void *arg, int shard, const struct cm_unary *call,
                              int attempt);

/* Waits up to ms between two rounds (0: not at all), woken early when psd
 * stops. Returns whether psd is stopping. */
typedef int (*psd_peer_pause)(void *arg, int ms);

/* How psd_peer_call_until_all goes on until every shard has answered. */
struct psd_peer_rounds {
  const char *what;     /* names the call in the log ("commit of step 7
                           to": "... ps:1 failed: UNAVAILABLE: ...;
                           retrying") */
  int timeout_ms;       /* each call's deadline */
  int retry_ms;         /* the pause between two rounds */
  psd_peer_judge judge; /* an answer that is not OK */
  void *judge_arg;      /* passed to judge */
  psd_peer_pause pause; /* the wait between rounds */
  void *pause_arg;      /* passed to pause */
};

/* Sends method carrying msg to each shard s < n not yet done[s] (the
 * caller clears done), waiting for channels that connect, and again every
 * r->retry_ms to those that did not answer OK, until every shard has, the
 * judge stops it, or psd stops; done[s] is set for each shard that
 * answered OK, *left counts the others. calls has n entries, released
 * here. Returns whether psd is stopping. */
int psd_peer_call_until_all(struct psd_peers *p, int n, struct cm_unary *calls,
                            int *done, const char *method,
                            const ProtobufCMessage *msg,
                            const struct psd_peer_rounds *r, int *left);

#endif
