/* The gRPC client half (client.h): channels with their credentials, and
 * batches of unary calls kept in flight up to a limit per channel. */
#include "rpc_client.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/grpc_posix.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>

#include "auth.h"
#include "clock.h"
#include "err.h"
#include "rpc.h"
#include "rpc_internal.h"

struct cm_channel {
  grpc_channel *channel; /* gRPC's channel */
  char target[300];      /* "host:port" */
  grpc_metadata auth;    /* "authorization: Bearer ..." sent with every call */
  int nauth;             /* 1 when auth is set */
  int on_fd;             /* 1: made over a connected socket (no connectivity
                            state: gRPC's fd channels are not client
                            channels) */
};

/* Sets the bearer token sent with every call on ch, if any. */
static void set_token(struct cm_channel *ch, const struct cm_creds *creds) {
  char value[CM_TOKEN_MAX + 16];
  if (!creds || !creds->token[0])
    return;
  snprintf(value, sizeof value, "Bearer %s", creds->token);
  ch->auth.key = grpc_slice_from_static_string("authorization");
  ch->auth.value = grpc_slice_from_copied_string(value);
  ch->nauth = 1;
}

/* A channel to target, or over the connected socket fd when fd >= 0 (then
 * without TLS: gRPC's fd API takes insecure credentials only). */
static int new_channel(struct cm_channel **out, const char *target, int fd,
                       const struct cm_creds *creds) {
  grpc_arg args[9];
  grpc_channel_args cargs;
  grpc_channel_credentials *gc;
  struct cm_channel *ch = calloc(1, sizeof *ch);
  if (!ch)
    return CM_ENOMEM;
  snprintf(ch->target, sizeof ch->target, "%s", target);
  ch->on_fd = fd >= 0;
  cm__rpc_build_args(args, &cargs.num_args, 0);
  if (fd < 0 && creds && creds->tls) {
    grpc_ssl_pem_key_cert_pair pair = {creds->key_pem, creds->cert_pem};
    gc = grpc_ssl_credentials_create(
        creds->ca_pem, creds->cert_pem ? &pair : NULL, NULL, NULL);
    if (creds->server_name[0]) {
      args[cargs.num_args].type = GRPC_ARG_STRING;
      args[cargs.num_args].key = GRPC_SSL_TARGET_NAME_OVERRIDE_ARG;
      args[cargs.num_args++].value.string = (char *)creds->server_name;
    }
  } else {
    gc = grpc_insecure_credentials_create();
  }
  cargs.args = args;
  ch->channel = fd < 0 ? grpc_channel_create(target, gc, &cargs)
                       : grpc_channel_create_from_fd(target, fd, gc, &cargs);
  grpc_channel_credentials_release(gc);
  set_token(ch, creds);
  *out = ch;
  return 0;
}

int cm_channel_new(struct cm_channel **out, const char *target,
                   const struct cm_creds *creds) {
  return new_channel(out, target, -1, creds);
}

int cm_channel_new_fd(struct cm_channel **out, const char *target, int fd,
                      const struct cm_creds *creds) {
  return new_channel(out, target, fd, creds);
}

void cm_channel_free(struct cm_channel *ch) {
  if (!ch)
    return;
  grpc_channel_destroy(ch->channel);
  if (ch->nauth)
    grpc_slice_unref(ch->auth.value);
  free(ch);
}

const char *cm_channel_target(const struct cm_channel *ch) {
  return ch->target;
}

int cm_channel_connected(struct cm_channel *ch) {
  /* A socket channel was connected when made, and never reconnects. */
  return ch->on_fd || grpc_channel_check_connectivity_state(ch->channel, 0) ==
                          GRPC_CHANNEL_READY;
}

/* How often cm_channels_await asks a channel that is not connected to
 * dial again, its reconnect backoff reset, and how long it polls gRPC at a
 * time, ms. */
#define REDIAL_MS 50
#define AWAIT_SLICE_MS 10

int cm_channels_await(struct cm_channel *const *chs, const unsigned char *which,
                      int n, grpc_completion_queue *cq, double ms) {
  double end = cm_mono_ms() + ms, dial = 0;
  unsigned char *watch = calloc((size_t)n + 1, 1);
  int rc = 0;
  /* A channel connected already (its server is slow, not gone) is no news
   * when it is connected still: only those that are not now count. */
  for (int k = 0; watch && k < n; k++)
    watch[k] = (!which || which[k]) && chs[k] && !chs[k]->on_fd &&
               grpc_channel_check_connectivity_state(chs[k]->channel, 0) !=
                   GRPC_CHANNEL_READY;
  for (double now; (now = cm_mono_ms()) < end && !rc;) {
    for (int k = 0; watch && k < n && !rc; k++) {
      if (!watch[k])
        continue;
      grpc_connectivity_state st =
          grpc_channel_check_connectivity_state(chs[k]->channel, 0);
      if (st == GRPC_CHANNEL_READY)
        rc = 1;
      else if (now >= dial) {
        /* gRPC waits its backoff (up to a second here) after a failed
         * connection before the next; a server that has just started
         * listening is then found that much later. */
        if (st == GRPC_CHANNEL_TRANSIENT_FAILURE)
          grpc_channel_reset_connect_backoff(chs[k]->channel);
        grpc_channel_check_connectivity_state(chs[k]->channel, 1);
      }
    }
    if (now >= dial)
      dial = now + REDIAL_MS;
    if (rc)
      break;
    /* gRPC connects, and runs its timers, only while a thread polls. */
    double slice = end - now < AWAIT_SLICE_MS ? end - now : AWAIT_SLICE_MS;
    gpr_timespec until = gpr_time_add(
        gpr_now(GPR_CLOCK_MONOTONIC),
        gpr_time_from_micros((int64_t)(slice * 1000) + 1, GPR_TIMESPAN));
    grpc_completion_queue_next(cq, until, NULL);
  }
  free(watch);
  return rc;
}

/* How often cm_run_opts.interrupted is polled, ms. */
#define POLL_MS 100

static int start_unary(struct cm_unary *u, grpc_completion_queue *cq,
                       const struct cm_run_opts *o) {
  grpc_op ops[6];
  gpr_timespec deadline = gpr_time_add(
      gpr_now(GPR_CLOCK_MONOTONIC),
      gpr_time_from_millis(u->timeout_ms > 0 ? u->timeout_ms : o->timeout_ms,
                           GPR_TIMESPAN));
  memset(ops, 0, sizeof ops);
  grpc_metadata_array_init(&u->md_initial);
  grpc_metadata_array_init(&u->md_trailing);
  u->status_details = grpc_empty_slice();
  u->response = NULL;
  u->call = grpc_channel_create_call(
      u->channel->channel, NULL, GRPC_PROPAGATE_DEFAULTS, cq,
      grpc_slice_from_static_string(u->method), NULL, deadline, NULL);
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[0].flags = o->wait_for_ready ? GRPC_INITIAL_METADATA_WAIT_FOR_READY : 0;
  ops[0].data.send_initial_metadata.count = (size_t)u->channel->nauth;
  ops[0].data.send_initial_metadata.metadata = &u->channel->auth;
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = u->request;
  ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[3].data.recv_initial_metadata.recv_initial_metadata = &u->md_initial;
  ops[4].op = GRPC_OP_RECV_MESSAGE;
  ops[4].data.recv_message.recv_message = &u->response;
  ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  ops[5].data.recv_status_on_client.status = &u->status;
  ops[5].data.recv_status_on_client.status_details = &u->status_details;
  ops[5].data.recv_status_on_client.trailing_metadata = &u->md_trailing;
  if (grpc_call_start_batch(u->call, ops, 6, u, NULL) != GRPC_CALL_OK)
    return CM_ERPC;
  return 0;
}

static void complete_unary(struct cm_unary *u) {
  size_t len = GRPC_SLICE_LENGTH(u->status_details);
  if (len >= sizeof u->details)
    len = sizeof u->details - 1;
  memcpy(u->details, GRPC_SLICE_START_PTR(u->status_details), len);
  u->details[len] = 0;
  grpc_slice_unref(u->status_details);
  u->status_details = grpc_empty_slice();
  if (u->request) {
    grpc_byte_buffer_destroy(u->request);
    u->request = NULL;
  }
  grpc_metadata_array_destroy(&u->md_initial);
  grpc_metadata_array_destroy(&u->md_trailing);
  grpc_call_unref(u->call);
  u->call = NULL;
}

int cm_client_run(struct cm_unary *calls, int n, const struct cm_run_opts *o) {
  struct slot {
    struct cm_channel *ch; /* a channel in this run */
    int inflight;          /* its calls in flight */
    int next;              /* index of its next call not yet started */
  } slots[64];
  int nslots = 0, done = 0, rc = 0, cancelled = 0;
  int limit = o->inflight > 0 ? o->inflight : 1;
  grpc_completion_queue *cq =
      o->cq ? o->cq : grpc_completion_queue_create_for_next(NULL);

  /* Channels beyond 64 share the last slot's limit; psd jobs have fewer. */
  for (int i = 0; i < n; i++) {
    calls[i].call = NULL; /* set while the call is in flight */
    int k;
    for (k = 0; k < nslots; k++)
      if (slots[k].ch == calls[i].channel)
        break;
    if (k == nslots && nslots < 64)
      slots[nslots++] = (struct slot){calls[i].channel, 0, i};
  }
  double next_tick = cm_mono_ms() + o->tick_ms;
  for (;;) {
    /* Top every channel up to its limit, calls in order. */
    for (int k = 0; k < nslots; k++) {
      struct slot *sl = &slots[k];
      while (sl->inflight < limit && sl->next < n) {
        struct cm_unary *u = &calls[sl->next++];
        if (u->channel != sl->ch)
          continue;
        if (cancelled) {
          /* Interrupted: the calls not sent yet end unsent. */
          u->status = GRPC_STATUS_CANCELLED;
          snprintf(u->details, sizeof u->details, "interrupted");
          done++;
          if (o->done)
            o->done(u, o->ctx);
          continue;
        }
        if (start_unary(u, cq, o) != 0) {
          u->status = GRPC_STATUS_INTERNAL;
          snprintf(u->details, sizeof u->details, "could not start the call");
          complete_unary(u);
          if (!rc)
            rc = CM_ERPC;
          done++;
          if (o->done)
            o->done(u, o->ctx);
          continue;
        }
        sl->inflight++;
      }
    }
    if (done >= n)
      break;
    int wait_ms = o->tick && o->tick_ms > 0 ? o->tick_ms : -1;
    if (o->interrupted && !cancelled && (wait_ms < 0 || wait_ms > POLL_MS))
      wait_ms = POLL_MS;
    gpr_timespec until =
        wait_ms > 0 ? gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                   gpr_time_from_millis(wait_ms, GPR_TIMESPAN))
                    : gpr_inf_future(GPR_CLOCK_REALTIME);
    grpc_event ev = grpc_completion_queue_next(cq, until, NULL);
    if (ev.type == GRPC_QUEUE_TIMEOUT) {
      if (o->tick && o->tick_ms > 0 && cm_mono_ms() >= next_tick) {
        o->tick(o->tick_ctx);
        next_tick = cm_mono_ms() + o->tick_ms;
      }
      if (o->interrupted && !cancelled && o->interrupted(o->interrupt_ctx)) {
        cancelled = 1;
        for (int i = 0; i < n; i++)
          if (calls[i].call)
            grpc_call_cancel_with_status(calls[i].call, GRPC_STATUS_CANCELLED,
                                         "interrupted", NULL);
      }
    }
    if (ev.type != GRPC_OP_COMPLETE)
      continue;
    struct cm_unary *u = ev.tag;
    complete_unary(u);
    if (!ev.success && u->status == GRPC_STATUS_OK)
      u->status = GRPC_STATUS_INTERNAL;
    if (u->status != GRPC_STATUS_OK && !rc)
      rc = cm_rpc_status_rc(u->status);
    for (int k = 0; k < nslots; k++)
      if (slots[k].ch == u->channel)
        slots[k].inflight--;
    done++;
    if (o->done)
      o->done(u, o->ctx);
  }
  if (!o->cq)
    cm_queue_free(cq);
  return cancelled ? CM_ECANCELED : rc;
}

void cm_queue_free(grpc_completion_queue *cq) {
  if (!cq)
    return;
  grpc_completion_queue_shutdown(cq);
  while (
      grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL)
          .type != GRPC_QUEUE_SHUTDOWN) {
  }
  grpc_completion_queue_destroy(cq);
}

void cm_unary_release(struct cm_unary *u) {
  if (u->response) {
    grpc_byte_buffer_destroy(u->response);
    u->response = NULL;
  }
  if (u->request) {
    grpc_byte_buffer_destroy(u->request);
    u->request = NULL;
  }
}
