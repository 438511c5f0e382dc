/* gRPC C core plumbing shared by psd and libpsclient.
 *
 * Server: one completion queue drained by one thread. Each in-flight call
 * is a struct cm_rpc_call with its own state; its tag says which step
 * completed. A registered method's handler gets the request and must answer
 * exactly once, now or later (cm_rpc_reply / cm_rpc_fail), so a call that has
 * to wait can be parked without holding a thread.
 *
 * Shutdown order (written down because gRPC requires it): cm_server_stop
 * asks gRPC to shut down and waits; the queue thread keeps draining until it
 * sees the shutdown tag, then shuts the queue down and drains it to
 * GRPC_QUEUE_SHUTDOWN; only then are the server and queue destroyed.
 *
 * Client: cm_unary describes one call; cm_client_run puts a set of them in
 * flight at once (up to a limit per channel), each with its deadline, and
 * calls back as each completes. */
#ifndef CM_RPC_H
#define CM_RPC_H

#include <stddef.h>
#include <stdint.h>

#include <grpc/grpc.h>

/* Largest message either side accepts by default (the spec's
 * job.max_message_mb changes it). Tensors travel in chunks far below this
 * (2 MiB by default), so the limit only stops runaway messages. */
#define CM_RPC_MAX_MESSAGE (64 * 1024 * 1024)

/* The smallest limit that still carries a 2 MiB chunk with its head. */
#define CM_RPC_MIN_MESSAGE (4 * 1024 * 1024)

/* Sets the largest message, in bytes, that servers and channels created
 * afterwards send and receive (clamped to [CM_RPC_MIN_MESSAGE, INT_MAX]);
 * anything larger is answered RESOURCE_EXHAUSTED by gRPC itself. Process-wide
 * rather than an argument of every constructor: one process serves or calls
 * one job, and the setting is gRPC's per-channel argument in the end. */
void cm_rpc_set_max_message(long long bytes);

/* The limit in force (CM_RPC_MAX_MESSAGE unless set). */
int cm_rpc_max_message(void);

/* Call before any other gRPC use: grpc_init and malloc settings that keep
 * large message buffers from page-faulting. Reference-counted like
 * grpc_init: each call is balanced by one cm_rpc_global_shutdown. */
void cm_rpc_global_init(void);
void cm_rpc_global_shutdown(void);

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

/* Packs a protobuf-c message into a new byte buffer. */
struct ProtobufCMessage;
grpc_byte_buffer *cm_rpc_pack(const struct ProtobufCMessage *msg);

/* Reads a whole byte buffer into malloc'd memory (*len bytes); for small
 * messages only. NULL bb gives an empty buffer. Returns 0 or CM_ENOMEM. */
int cm_rpc_readall(grpc_byte_buffer *bb, uint8_t **data, size_t *len);

/* Reads a whole (small) byte buffer and unpacks it as a message of type
 * desc: a response, or a request without a bulk field. Returns the message
 * (free it with protobuf_c_message_free_unpacked), or NULL when bb is not
 * valid protobuf of that type or memory ran out. */
struct ProtobufCMessageDescriptor;
struct ProtobufCMessage *
cm_rpc_unpack(grpc_byte_buffer *bb,
              const struct ProtobufCMessageDescriptor *desc);

/* gRPC's status name, e.g. "INVALID_ARGUMENT". */
const char *cm_rpc_status_name(grpc_status_code code);

/* The error code a call's status maps to: 0 for OK, CM_ETIMEDOUT,
 * CM_EUNAVAIL, CM_ENOENT (NOT_FOUND), CM_ERANGE (OUT_OF_RANGE), else
 * CM_ERPC. The one mapping of statuses to codes, for every client. */
int cm_rpc_status_rc(grpc_status_code code);

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

/* ---- client ---- */

/* A channel to one server. */
struct cm_channel;

struct cm_creds;

/* Opens a channel to target ("host:port") with psd's message limits. With
 * creds (may be NULL): TLS when creds->tls, and creds->token as a bearer
 * token on every call. creds is copied from; the caller keeps it. */
int cm_channel_new(struct cm_channel **out, const char *target,
                   const struct cm_creds *creds);
/* A channel over the connected socket fd (ownership taken), named target
 * in messages. It never reconnects: once the connection breaks, its calls
 * fail with UNAVAILABLE. Only creds->token is used: gRPC runs no TLS over
 * a socket handed to it (callers keep TLS jobs on TCP). */
int cm_channel_new_fd(struct cm_channel **out, const char *target, int fd,
                      const struct cm_creds *creds);
void cm_channel_free(struct cm_channel *ch);
const char *cm_channel_target(const struct cm_channel *ch);

struct cm_unary;
/* Called as each call completes, on the thread running cm_client_run. */
typedef void (*cm_unary_done)(struct cm_unary *u, void *ctx);

/* One unary call. The caller fills the first block; cm_client_run fills the
 * rest. */
struct cm_unary {
  struct cm_channel *channel; /* where to send; not owned */
  const char *method;         /* full path; must outlive the call */
  grpc_byte_buffer *request;  /* owned by the call: destroyed when sent */
  void *user;                 /* the caller's; untouched */
  grpc_status_code status;    /* result status */
  char details[512];          /* the status message, "" when none */
  grpc_byte_buffer *response; /* owned by the caller after done (may be NULL) */
  /* internal state below */
  grpc_call *call;                 /* the gRPC call while in flight */
  grpc_metadata_array md_initial;  /* received initial metadata */
  grpc_metadata_array md_trailing; /* received trailing metadata */
  grpc_slice status_details;       /* received status message */
};

/* Options of one cm_client_run. */
struct cm_run_opts {
  int timeout_ms;     /* deadline of each call, from its start */
  int inflight;       /* calls in flight per channel, >= 1 */
  int wait_for_ready; /* 1: wait for the channel to connect (within the
                         deadline) */
  cm_unary_done done; /* called once per call as it completes (may be NULL) */
  void *ctx;          /* passed to done */
  grpc_completion_queue *cq; /* a queue to reuse (NULL: one per run); empty
                                again when the run returns */
};

/* Runs calls[0..n): starts up to `inflight` per channel at once, keeps them
 * topped up as calls complete, and returns when all are done. Returns 0 when
 * all finished with OK, else the first failure's code (CM_ETIMEDOUT for a
 * deadline, CM_EUNAVAIL when a server cannot be reached, CM_ERPC for
 * others); every call's own status and details are filled either way. */
int cm_client_run(struct cm_unary *calls, int n, const struct cm_run_opts *o);

/* Shuts down, drains and destroys a queue made for cm_run_opts.cq. */
void cm_queue_free(grpc_completion_queue *cq);

/* Releases a completed call's response and internal state. */
void cm_unary_release(struct cm_unary *u);

#endif
