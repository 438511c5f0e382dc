/* The gRPC server half (common/rpc/rpc_server.c): one completion queue drained
 * by one thread. Each in-flight call is a struct cm_rpc_call with its own
 * state; its tag says which step completed. A registered method's handler
 * gets the request and must answer exactly once, now or later (cm_rpc_reply
 * / cm_rpc_fail), so a call that has to wait can be parked without holding
 * a thread.
 *
 * Shutdown order (written down because gRPC requires it): cm_server_stop
 * asks gRPC to shut down and waits; the queue thread keeps draining until it
 * sees the shutdown tag, then shuts the queue down and drains it to
 * GRPC_QUEUE_SHUTDOWN; only then are the server and queue destroyed. */
#ifndef CM_RPC_SERVER_H
#define CM_RPC_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include <grpc/grpc.h>

/* Both halves pack and unpack messages and name statuses with rpc.h. */
#include "rpc.h"

struct cm_server;
struct cm_rpc_call;

/* A handler owns `call` until it answers it. `request` is borrowed until the
 * answer; it may be NULL for an empty message. */
typedef void (*cm_rpc_handler)(struct cm_rpc_call *call,
                               grpc_byte_buffer *request, void *ctx);

/* One method the server serves. */
struct cm_rpc_method {
  const char *path;       /* "/psd.v1.Data/Pull" */
  cm_rpc_handler handler; /* called on the queue thread */
  void *ctx;              /* passed to handler */
};

struct cm_creds;

/* Creates a server listening on addr ("host:port"), serving methods[0..n)
 * (the array must outlive the server). Unknown methods get UNIMPLEMENTED.
 * With creds (may be NULL): TLS when creds->tls (client certificates
 * required with creds->mutual), and with creds->token every call, admin
 * calls included, must carry "authorization: Bearer <token>" or is answered
 * UNAUTHENTICATED before any handler runs (counted; logged once per peer
 * host per minute). creds is copied from. Returns CM_EADDRINUSE (with the
 * reason in err) when it cannot listen. */
int cm_server_new(struct cm_server **out, const char *addr,
                  const struct cm_rpc_method *methods, int n,
                  const struct cm_creds *creds, char *err, size_t errlen);

/* Calls refused UNAUTHENTICATED so far. */
uint64_t cm_server_unauthenticated(const struct cm_server *s);

/* Serves the connected socket fd as one more client connection (ownership
 * of fd taken); after cm_server_start. */
void cm_server_add_fd(struct cm_server *s, int fd);

/* Starts the queue thread. */
int cm_server_start(struct cm_server *s);

/* Begins a graceful stop: from now on every new call is answered
 * UNAVAILABLE with why (e.g. "ps:0 is stopping (SIGTERM)"; copied), a status
 * clients retry, without running a handler. Calls already handed to a
 * handler are answered as usual. Safe from any thread; idempotent. */
void cm_server_drain(struct cm_server *s, const char *why);

/* Waits up to grace_ms for every call handed to a handler to be answered
 * (parked calls must be released by their owners meanwhile). Returns how
 * many were still unanswered. */
int cm_server_wait_idle(struct cm_server *s, int grace_ms);

/* Stops accepting calls, lets calls in flight finish for up to grace_ms,
 * cancels the rest, joins the queue thread. Safe from any thread except the
 * queue thread; idempotent. */
void cm_server_stop(struct cm_server *s, int grace_ms);

/* Stops (if needed) and frees. */
void cm_server_free(struct cm_server *s);

/* Answers a call with OK and `response` (ownership taken; may be NULL for
 * an empty message). The call is freed once gRPC is done with it. */
void cm_rpc_reply(struct cm_rpc_call *call, grpc_byte_buffer *response);

/* Answers a call with an error status and a message (printf-style). */
void cm_rpc_fail(struct cm_rpc_call *call, grpc_status_code code,
                 const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* The peer's address, e.g. "ipv4:127.0.0.1:53422" (owned by the call). */
const char *cm_rpc_peer(struct cm_rpc_call *call);

/* ---- calls that come from no network (fuzzing, unit tests) ---- */

/* How a local call was answered. */
struct cm_rpc_answer {
  int answered;               /* 1 once the handler answered */
  grpc_status_code status;    /* the status it answered with */
  char details[1024];         /* its message, "" for none */
  grpc_byte_buffer *response; /* OK's message, owned here (may be NULL);
                                 free with cm_rpc_answer_release */
};

/* Runs method m's handler on `request` (borrowed; NULL for an empty message)
 * exactly as the server would, minus the bearer-token check, and without a
 * network: cm_rpc_reply and cm_rpc_fail fill *ans. A handler that parks the
 * call answers later, on whatever thread answers it, so *ans must stay valid
 * until ans->answered (at the latest when the service that parked it stops).
 * Returns 0 or CM_ENOMEM (nothing ran). */
int cm_rpc_call_local(const struct cm_rpc_method *m, grpc_byte_buffer *request,
                      struct cm_rpc_answer *ans);

/* Frees an answer's response. */
void cm_rpc_answer_release(struct cm_rpc_answer *ans);

#endif
