/* Retries, and what the client says while it waits (client_internal.h):
 * which failures are worth sending again, an outage per shard from its
 * first retryable failure to its first answer, the backoff between
 * attempts, and the lines that make a wait visible (docs/faults.md,
 * "Waiting"):
 *
 *   ps:0 (127.0.0.1:1) not reachable: connection refused (nothing listens
 *     there?); waiting up to 60 s for it              (declare, after 1 s)
 *   ps:1 (...) unreachable (UNAVAILABLE: ...): connection refused (...);
 *     retrying for up to 120 s                         (later calls)
 *   still waiting for ps:0 (127.0.0.1:1): connection refused (...); 10 s
 *     of up to 60 s                                    (every 10 s)
 *   ps:0 (127.0.0.1:1) back after 12.3 s
 *
 * A wait is bounded by a budget: connect_timeout_ms while declare waits for
 * the shards to start, job.retry_s afterwards. A backoff ends as soon as
 * the channel of a shard that could not be reached connects
 * (cm_channels_await, which keeps it dialling every 50 ms meanwhile). The cause
 * in words comes from the status and gRPC's message (gRPC puts the connect
 * error of a call made without wait_for_ready into its UNAVAILABLE details). */
#include "client_internal.h"

#include <stdio.h>
#include <string.h>

#include "clock.h"
#include "err.h"
#include "log.h"
#include "rand.h"

/* Retries wait BACKOFF_MS, doubling per attempt up to BACKOFF_MAX_MS, each
 * wait drawn uniformly from its upper half (jitter, so that the workers
 * of a job do not all come back at the same instant). */
#define BACKOFF_MS 100
#define BACKOFF_MAX_MS 2000
/* How often a wait is said again. */
#define SAY_EVERY_MS 10000
/* How long declare waits quietly for a shard still starting (one started
 * beside its workers, as pslaunch does, is usually up by then). */
#define QUIET_START_MS 700

/* Whether a call that ended with st may succeed when sent again: the shard
 * is down or restarting (UNAVAILABLE), did not answer in time (stopped,
 * cut off, overloaded), or cancelled the call while it shut down
 * (CANCELLED: gRPC cancels the calls a stopping server never took; this
 * client never cancels its own). Every other status is the shard's
 * answer. */
int psc__retryable(grpc_status_code st) {
  return st == GRPC_STATUS_UNAVAILABLE || st == GRPC_STATUS_DEADLINE_EXCEEDED ||
         st == GRPC_STATUS_CANCELLED;
}

/* gRPC's words for a connection that failed, and ours. Matched without
 * case, first match wins. */
static const struct {
  const char *needle; /* in the status details */
  const char *words;  /* what it means */
} causes[] = {
    {"connection refused", "connection refused (nothing listens there?)"},
    {"no route to host", "no route to host (is the host up and the address "
                         "right?)"},
    {"network is unreachable", "network unreachable (this host has no route "
                               "to that address)"},
    {"dns resolution failed", "its host name does not resolve"},
    {"connection timed out", "connection timed out (is the host up? a "
                             "firewall may drop the packets)"},
    /* gRPC's own name for a connection attempt it gave up on (a shard
     * that stopped while it was dialled), not TLS. */
    {"tcp handshaker shutdown", "connection attempt abandoned (the shard "
                                "stopped or is restarting)"},
    {"handshake", "TLS handshake failed (do this client's and the shard's "
                  "auth.tls settings agree: the CA that signed the shard's "
                  "certificate, TLS on both sides, a client certificate "
                  "where the shard requires one?)"},
    {"ssl", "TLS handshake failed (do this client's and the shard's "
            "auth.tls settings agree?)"},
    {"tsi", "TLS handshake failed (do this client's and the shard's auth.tls "
            "settings agree?)"},
    {"connection reset", "connection reset (the shard stopped or is "
                         "restarting)"},
    {"shutting down", "the shard is shutting down"},
    {"draining", "the shard is shutting down"},
    {"socket closed", "connection closed (the shard is stopping or "
                      "restarting; or it runs TLS and this client does not?)"},
    {"transport closed", "connection closed (the shard stopped or is "
                         "restarting)"},
    {"broken pipe", "connection closed (the shard stopped or is "
                    "restarting)"},
    {"goaway", "connection closed (the shard stopped or is restarting)"},
};

int psc__reach_cause(grpc_status_code st, const char *details, int connected,
                     double timeout_s, char *buf, size_t len) {
  switch (st) {
  case GRPC_STATUS_UNAVAILABLE:
    for (size_t i = 0; i < sizeof causes / sizeof causes[0]; i++)
      if (strcasestr(details, causes[i].needle)) {
        snprintf(buf, len, "%s", causes[i].words);
        return 1;
      }
    snprintf(buf, len, "unavailable (%s)",
             details[0] ? details : "gRPC gave no reason");
    return 1;
  case GRPC_STATUS_DEADLINE_EXCEEDED:
    if (connected)
      snprintf(buf, len,
               "no answer within %.1f s (the shard is stopped, overloaded or "
               "cut off?)",
               timeout_s);
    else
      snprintf(buf, len,
               "no connection within %.1f s (is the host up? a firewall may "
               "drop the packets)",
               timeout_s);
    return 1;
  case GRPC_STATUS_CANCELLED:
    snprintf(buf, len,
             "the shard cancelled the call (it is stopping or "
             "restarting?)");
    return 1;
  case GRPC_STATUS_UNAUTHENTICATED:
    snprintf(buf, len,
             "wrong token: the shard refused this client's bearer token (the "
             "spec's auth.token_file must hold the token the shard was "
             "started with)");
    return 1;
  case GRPC_STATUS_UNIMPLEMENTED:
    /* An HTTP server, or a proxy, answers there: not psd. */
    if (strcasestr(details, "http2 header with status")) {
      snprintf(buf, len, "something that is not psd answers there (%s)",
               details);
      return 1;
    }
    return 0;
  default:
    return 0;
  }
}

/* The budget of the wait under way, ms: declare's wait for the shards to
 * start, else the retry budget. */
static double budget_ms(const struct psc__client *c) {
  return c->starting ? c->o.connect_timeout_ms : c->retry_ms;
}

/* Records u's failure as shard s's cause, in words. */
static void note_cause(struct psc__client *c, int s, const struct cm_unary *u) {
  struct psc__outage *o = &c->out[s];
  o->status = u->status;
  snprintf(o->details, sizeof o->details, "%s", u->details);
  psc__reach_cause(u->status, u->details, cm_channel_connected(u->channel),
                   (u->timeout_ms > 0 ? u->timeout_ms : c->call_timeout_ms) /
                       1000.0,
                   o->cause, sizeof o->cause);
}

/* A call to shard s failed retryably: the outage starts now unless it is
 * already on, and is said at once; while declaring, once the shard has had
 * QUIET_START_MS to come up (psc__say_waiting). */
void psc__shard_down(struct psc__client *c, int s, const struct cm_unary *u) {
  struct psc__outage *o = &c->out[s];
  if (c->interrupted)
    return; /* cancelled here, not a shard that is down */
  note_cause(c, s, u);
  if (o->since > 0)
    return;
  o->since = cm_mono_ms();
  o->said = 0;
  c->stats.outages++;
  if (budget_ms(c) <= 0)
    return; /* no wait: the caller's error says it all */
  if (c->starting) {
    psc__say_waiting(c);
    return;
  }
  o->said = o->since;
  cm_warn("ps:%d (%s) unreachable (%s: %s): %s; retrying for up to %.0f s", s,
          c->spec->ps[s].text, cm_rpc_status_name(u->status),
          u->details[0] ? u->details : "no message", o->cause,
          budget_ms(c) / 1000);
}

/* A call to shard s succeeded: an outage ends, and is said so when it was
 * said to begin. */
void psc__shard_up(struct psc__client *c, int s) {
  struct psc__outage *o = &c->out[s];
  if (o->since <= 0)
    return;
  if (budget_ms(c) > 0 && o->said > 0)
    cm_info("ps:%d (%s) %s after %.1f s", s, c->spec->ps[s].text,
            c->starting ? "answered" : "back",
            (cm_mono_ms() - o->since) / 1000);
  o->since = 0;
}

void psc__say_waiting(void *ctx) {
  struct psc__client *c = ctx;
  double now = cm_mono_ms();
  if (budget_ms(c) <= 0)
    return;
  /* Every address: a live move's destinations are past nshards. */
  for (int s = 0; s < c->spec->nps; s++) {
    struct psc__outage *o = &c->out[s];
    if (o->since <= 0)
      continue;
    if (o->said <= 0) { /* declare's first line */
      if (now - c->wait_from < QUIET_START_MS)
        continue;
      o->said = now;
      cm_warn("ps:%d (%s) not reachable: %s; waiting up to %.0f s for it", s,
              c->spec->ps[s].text, o->cause, budget_ms(c) / 1000);
      continue;
    }
    if (now - o->said < SAY_EVERY_MS)
      continue;
    o->said = now;
    cm_warn("still waiting for ps:%d (%s): %s; %.0f s of up to %.0f s", s,
            c->spec->ps[s].text, o->cause, (now - o->since) / 1000,
            budget_ms(c) / 1000);
  }
}

/* Before attempt number `attempt` (1, 2, ...) at the calls to the shards
 * flagged in down[0..ndown): 0 after the backoff wait when every such shard
 * is within the budget; else CM_ETIMEDOUT or CM_EUNAVAIL (by the shard's
 * last failure) with c->err naming the shard, what, how long, and the
 * cause. */
int psc__retry_wait(struct psc__client *c, const unsigned char *down, int ndown,
                    int attempt, const char *what) {
  double now = cm_mono_ms(), budget = budget_ms(c), left = BACKOFF_MAX_MS;
  int rc = psc__check_interrupt(c);
  if (rc)
    return rc;
  for (int s = 0; s < ndown; s++) {
    const struct psc__outage *o = &c->out[s];
    if (down[s] && budget > 0 && now - o->since < budget) {
      if (budget - (now - o->since) < left)
        left = budget - (now - o->since);
      continue;
    }
    if (!down[s])
      continue;
    if (budget > 0 && c->starting)
      psc__seterr(c,
                  "%s to ps:%d (%s) failed: not reachable for %.1f s, the time "
                  "a client waits for the shards to start (%.0f s): %s [%s: "
                  "%s]; is ps:%d running, at that address?",
                  what, s, c->spec->ps[s].text, (now - o->since) / 1000,
                  budget / 1000, o->cause, cm_rpc_status_name(o->status),
                  o->details[0] ? o->details : "no message", s);
    else if (budget > 0)
      psc__seterr(
          c,
          "%s to ps:%d (%s) failed: %s: %s; unreachable for %.1f s, the "
          "retry budget (job.retry_s %.0f s): %s",
          what, s, c->spec->ps[s].text, cm_rpc_status_name(o->status),
          o->details[0] ? o->details : "(no message)", (now - o->since) / 1000,
          budget / 1000, o->cause);
    /* else psc__run() described the failure already */
    return o->status == GRPC_STATUS_DEADLINE_EXCEEDED ? CM_ETIMEDOUT
                                                      : CM_EUNAVAIL;
  }
  psc__say_waiting(c);
  int shift = attempt - 1 < 5 ? attempt - 1 : 5;
  double ms = (double)BACKOFF_MS * (1 << shift);
  if (ms > BACKOFF_MAX_MS)
    ms = BACKOFF_MAX_MS;
  ms *=
      0.5 + 0.5 * (double)(cm_splitmix64(&c->rng) >> 11) / (double)(1ull << 53);
  /* The last attempt goes when the budget ends, not a backoff past it. */
  if (ms > left)
    ms = left > 0 ? left : 0;
  /* Declaring: wake when the quiet start ends, so that an unreachable
   * shard is said then, not a long backoff later. Likewise when an outage
   * already said is due to be said again (every SAY_EVERY_MS), so that the
   * line comes on time, not after the backoff that spans its moment. */
  for (int s = 0; s < ndown; s++) {
    double say = c->out[s].said > 0
                     ? c->out[s].said + SAY_EVERY_MS - now
                     : (c->starting ? c->wait_from + QUIET_START_MS - now : -1);
    if (down[s] && say > 0 && ms > say)
      ms = say + 1;
  }
  /* In steps of at most 100 ms when an interrupt is polled; over as soon
   * as a shard that could not be reached connects (one started with its
   * clients answers within ~50 ms of listening, not a backoff later). */
  for (double end = cm_mono_ms() + ms; (ms = end - cm_mono_ms()) > 0;) {
    if (c->interrupt && ms > 100)
      ms = 100;
    int up = cm_channels_await(c->ch, down, ndown, c->cq, ms);
    if ((rc = psc__check_interrupt(c)))
      return rc;
    if (up)
      break;
  }
  psc__say_waiting(c); /* what woke the wait may be a line due */
  return 0;
}
