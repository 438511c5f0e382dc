/* The gRPC client half (common/rpc/rpc_client.c): cm_unary describes one call;
 * cm_client_run puts a set of them in flight at once (up to a limit per
 * channel), each with its deadline, and calls back as each completes. */
#ifndef CM_RPC_CLIENT_H
#define CM_RPC_CLIENT_H

#include <grpc/grpc.h>

/* Both halves pack and unpack messages and name statuses with rpc.h. */
#include "rpc.h"

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
/* 1 when ch is connected now (gRPC's READY; always for a channel made over
 * a socket), else 0: a call that failed on a channel that is not never
 * reached its server. */
int cm_channel_connected(struct cm_channel *ch);

/* Waits up to ms for one of the channels chs[0..n) flagged in which
 * (NULL: all; NULL entries skipped) that is not connected now to connect,
 * driving gRPC meanwhile on cq (a queue with nothing in flight, left so):
 * gRPC dials, and runs its timers, only while some thread polls, and a
 * client between two attempts of a call polls nothing. Every 50 ms each
 * such channel is asked to connect with its reconnect backoff reset, so one
 * whose server has started listening connects within about that long.
 * Returns 1 as soon as one of them connected, 0 once ms passed. */
int cm_channels_await(struct cm_channel *const *chs, const unsigned char *which,
                      int n, grpc_completion_queue *cq, double ms);

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
  int timeout_ms;             /* > 0: this call's deadline instead of the
                                 run's */
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
  int tick_ms; /* > 0: tick(tick_ctx) runs about this often while calls
                  are in flight (a client says what it is waiting for) */
  void (*tick)(void *tick_ctx); /* NULL: none */
  void *tick_ctx;               /* passed to tick */
  /* NULL: none. Else polled about every 100 ms while calls are in flight;
   * once it returns nonzero, every call in flight is cancelled and those not
   * started yet end CANCELLED ("interrupted") unsent, and the run returns
   * CM_ECANCELED when they are all done. */
  int (*interrupted)(void *interrupt_ctx);
  void *interrupt_ctx; /* passed to interrupted */
};

/* Runs calls[0..n): starts up to `inflight` per channel at once, keeps them
 * topped up as calls complete, and returns when all are done. Returns 0 when
 * all finished with OK, CM_ECANCELED when o->interrupted said so, else the
 * first failure's code (CM_ETIMEDOUT for a deadline, CM_EUNAVAIL when a
 * server cannot be reached, CM_ERPC for others); every call's own status
 * and details are filled either way. */
int cm_client_run(struct cm_unary *calls, int n, const struct cm_run_opts *o);

/* Shuts down, drains and destroys a queue made for cm_run_opts.cq. */
void cm_queue_free(grpc_completion_queue *cq);

/* Releases a completed call's response and internal state. */
void cm_unary_release(struct cm_unary *u);

#endif
