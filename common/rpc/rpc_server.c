/* The gRPC server half (server.h): the call objects, the queue thread that
 * drains the one completion queue, the bearer-token check before any
 * handler runs, answering a call, local calls without a network, and
 * starting and stopping in the order server.h writes down. */
#include "rpc_server.h"

#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <grpc/grpc_posix.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "auth.h"
#include "clock.h"
#include "err.h"
#include "log.h"
#include "rpc.h"
#include "rpc_internal.h"

/* Requests kept outstanding per method, so calls that arrive together do
 * not wait for the queue thread to re-arm. */
#define REQUESTS_PER_METHOD 8

enum call_state {
  CALL_WAITING,   /* requested from gRPC, no client yet */
  CALL_HANDLING,  /* handed to the handler, not yet answered */
  CALL_FINISHING, /* answer sent, waiting for gRPC to finish the batch */
};

struct cm_rpc_call {
  struct cm_server *srv;     /* the server it arrived on */
  int method;                /* index into srv->methods, -1: unregistered */
  enum call_state state;     /* where the call is; the tag is the call itself */
  grpc_call *call;           /* gRPC's call */
  gpr_timespec deadline;     /* client's deadline (registered calls) */
  grpc_call_details details; /* method and host (unregistered calls) */
  grpc_metadata_array md;    /* client's initial metadata */
  grpc_byte_buffer *request; /* the request message, may be NULL */
  grpc_byte_buffer *response;  /* the answer being sent, may be NULL */
  grpc_slice status_details;   /* the status message being sent */
  int cancelled;               /* from RECV_CLOSE_ON_SERVER */
  char *peer;                  /* gpr-allocated peer string, lazily */
  struct cm_rpc_answer *local; /* a local call's answer (no gRPC call), or
                                  NULL; borrowed */
};

/* How many peer hosts the once-a-minute refusal log remembers. */
#define REFUSED_PEERS 32

/* A peer host refused recently (queue thread only). */
struct refused {
  char host[64];  /* peer without its port, e.g. "ipv4:127.0.0.1" */
  double last_ms; /* when it was last logged (cm_mono_ms) */
};

struct cm_server {
  grpc_server *server;                 /* gRPC's server */
  grpc_completion_queue *cq;           /* the one queue, drained by thread */
  const struct cm_rpc_method *methods; /* served methods, caller-owned */
  int nmethods;                        /* entries in methods */
  void **registered;                   /* gRPC handle per method */
  pthread_t thread;                    /* the queue thread */
  int started;                         /* thread is running */
  atomic_int stopping;                 /* shutdown requested: stop re-arming */
  int shutdown_tag;                    /* address used as the shutdown tag */
  pthread_mutex_t lock;                /* guards shut_seen and stopped */
  pthread_cond_t cond;                 /* signalled when shut_seen is set */
  int shut_seen;                       /* gRPC reported the shutdown done */
  int stopped;                         /* cm_server_stop has completed */
  char token[CM_TOKEN_MAX + 1];        /* bearer token required, "" = none */
  atomic_ullong unauthenticated;       /* calls refused for the token */
  struct refused refused[REFUSED_PEERS]; /* recent refusals, for the log */
  atomic_int draining; /* cm_server_drain: answer new calls UNAVAILABLE */
  char drain_why[256]; /* the message they get; set before draining */
  atomic_int handling; /* calls handed to a handler and not yet answered */
};

static void call_free(struct cm_rpc_call *c) {
  if (c->request)
    grpc_byte_buffer_destroy(c->request);
  if (c->response)
    grpc_byte_buffer_destroy(c->response);
  grpc_slice_unref(c->status_details);
  grpc_metadata_array_destroy(&c->md);
  grpc_call_details_destroy(&c->details);
  if (c->peer)
    gpr_free(c->peer);
  if (c->call)
    grpc_call_unref(c->call);
  free(c);
}

/* Asks gRPC for the next call of method m (-1: any unregistered method). */
static int request_call(struct cm_server *s, int m) {
  struct cm_rpc_call *c = calloc(1, sizeof *c);
  grpc_call_error e;
  if (!c)
    return CM_ENOMEM;
  c->srv = s;
  c->method = m;
  c->state = CALL_WAITING;
  c->status_details = grpc_empty_slice();
  grpc_metadata_array_init(&c->md);
  grpc_call_details_init(&c->details);
  if (m >= 0)
    e = grpc_server_request_registered_call(s->server, s->registered[m],
                                            &c->call, &c->deadline, &c->md,
                                            &c->request, s->cq, s->cq, c);
  else
    e = grpc_server_request_call(s->server, &c->call, &c->details, &c->md,
                                 s->cq, s->cq, c);
  if (e != GRPC_CALL_OK) {
    call_free(c);
    return CM_ERPC;
  }
  return 0;
}

/* Hands a local call's answer to its caller and frees the call. */
static void finish_local(struct cm_rpc_call *c, grpc_status_code code) {
  struct cm_rpc_answer *a = c->local;
  size_t len = GRPC_SLICE_LENGTH(c->status_details);
  if (len >= sizeof a->details)
    len = sizeof a->details - 1;
  memcpy(a->details, GRPC_SLICE_START_PTR(c->status_details), len);
  a->details[len] = 0;
  a->status = code;
  if (code == GRPC_STATUS_OK) {
    a->response = c->response;
    c->response = NULL;
  }
  a->answered = 1;
  call_free(c);
}

static void finish(struct cm_rpc_call *c, grpc_status_code code) {
  grpc_op ops[4];
  int n = 0;
  if (c->local) {
    finish_local(c, code);
    return;
  }
  atomic_fetch_sub(&c->srv->handling, 1);
  memset(ops, 0, sizeof ops);
  ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
  if (code == GRPC_STATUS_OK && c->response) {
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n++].data.send_message.send_message = c->response;
  }
  ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
  ops[n].data.send_status_from_server.status = code;
  ops[n++].data.send_status_from_server.status_details = &c->status_details;
  ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
  ops[n++].data.recv_close_on_server.cancelled = &c->cancelled;
  c->state = CALL_FINISHING;
  if (grpc_call_start_batch(c->call, ops, n, c, NULL) != GRPC_CALL_OK) {
    cm_error("rpc: could not send an answer to %s", cm_rpc_peer(c));
    call_free(c);
  }
}

void cm_rpc_reply(struct cm_rpc_call *c, grpc_byte_buffer *response) {
  c->response = response;
  finish(c, GRPC_STATUS_OK);
}

void cm_rpc_fail(struct cm_rpc_call *c, grpc_status_code code, const char *fmt,
                 ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  grpc_slice_unref(c->status_details);
  c->status_details = grpc_slice_from_copied_string(msg);
  finish(c, code);
}

const char *cm_rpc_peer(struct cm_rpc_call *c) {
  if (c->local)
    return "local";
  if (!c->peer)
    c->peer = grpc_call_get_peer(c->call);
  return c->peer ? c->peer : "?";
}

int cm_rpc_call_local(const struct cm_rpc_method *m, grpc_byte_buffer *request,
                      struct cm_rpc_answer *ans) {
  struct cm_rpc_call *c = calloc(1, sizeof *c);
  memset(ans, 0, sizeof *ans);
  if (!c)
    return CM_ENOMEM;
  c->method = -1;
  c->state = CALL_HANDLING;
  c->status_details = grpc_empty_slice();
  grpc_metadata_array_init(&c->md);
  grpc_call_details_init(&c->details);
  c->local = ans;
  m->handler(c, request, m->ctx);
  return 0;
}

void cm_rpc_answer_release(struct cm_rpc_answer *ans) {
  if (ans->response)
    grpc_byte_buffer_destroy(ans->response);
  ans->response = NULL;
}

/* Whether the call carries the server's bearer token. */
static int authorized(struct cm_server *s, struct cm_rpc_call *c) {
  for (size_t i = 0; i < c->md.count; i++) {
    const grpc_metadata *m = &c->md.metadata[i];
    if (grpc_slice_str_cmp(m->key, "authorization") == 0)
      return cm_auth_bearer_ok(s->token,
                               (const char *)GRPC_SLICE_START_PTR(m->value),
                               GRPC_SLICE_LENGTH(m->value));
  }
  return 0;
}

/* Logs a refusal, at most once a minute per peer host. */
static void log_refusal(struct cm_server *s, struct cm_rpc_call *c) {
  char host[64];
  const char *peer = cm_rpc_peer(c), *colon = strrchr(peer, ':');
  double now = cm_mono_ms();
  struct refused *slot = &s->refused[0];
  size_t n = colon && strncmp(peer, "unix:", 5) ? (size_t)(colon - peer)
                                                : strlen(peer);

  snprintf(host, sizeof host, "%.*s", (int)n, peer);
  for (int i = 0; i < REFUSED_PEERS; i++) {
    if (!strcmp(s->refused[i].host, host)) {
      slot = &s->refused[i];
      break;
    }
    if (s->refused[i].last_ms < slot->last_ms)
      slot = &s->refused[i]; /* the least recently logged */
  }
  if (!strcmp(slot->host, host) && now - slot->last_ms < 60000)
    return;
  snprintf(slot->host, sizeof slot->host, "%s", host);
  slot->last_ms = now;
  cm_warn("refused a call from %s: missing or wrong bearer token (%llu "
          "refused in all; logged once a minute per peer)",
          host, (unsigned long long)atomic_load(&s->unauthenticated));
}

static void dispatch(struct cm_server *s, struct cm_rpc_call *c) {
  c->state = CALL_HANDLING;
  atomic_fetch_add(&s->handling, 1);
  if (atomic_load(&s->draining)) {
    cm_rpc_fail(c, GRPC_STATUS_UNAVAILABLE, "%s", s->drain_why);
    return;
  }
  if (s->token[0] && !authorized(s, c)) {
    atomic_fetch_add(&s->unauthenticated, 1);
    log_refusal(s, c);
    cm_rpc_fail(c, GRPC_STATUS_UNAUTHENTICATED,
                "missing or wrong bearer token: this job's shards require "
                "'authorization: Bearer <token>' with the token in the "
                "file named by the spec's auth.token_file");
    return;
  }
  if (c->method < 0) {
    char path[256];
    size_t len = GRPC_SLICE_LENGTH(c->details.method);
    if (len >= sizeof path)
      len = sizeof path - 1;
    memcpy(path, GRPC_SLICE_START_PTR(c->details.method), len);
    path[len] = 0;
    cm_rpc_fail(c, GRPC_STATUS_UNIMPLEMENTED,
                "psd does not serve the method %s", path);
    return;
  }
  const struct cm_rpc_method *m = &s->methods[c->method];
  m->handler(c, c->request, m->ctx);
}

static void *queue_thread(void *arg) {
  struct cm_server *s = arg;
  for (;;) {
    grpc_event ev = grpc_completion_queue_next(
        s->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (ev.type == GRPC_QUEUE_SHUTDOWN)
      break;
    if (ev.type != GRPC_OP_COMPLETE)
      continue;
    if (ev.tag == &s->shutdown_tag) {
      pthread_mutex_lock(&s->lock);
      s->shut_seen = 1;
      pthread_cond_broadcast(&s->cond);
      pthread_mutex_unlock(&s->lock);
      grpc_completion_queue_shutdown(s->cq);
      continue;
    }
    struct cm_rpc_call *c = ev.tag;
    switch (c->state) {
    case CALL_WAITING:
      if (!ev.success) { /* the server is shutting down */
        call_free(c);
        break;
      }
      if (!atomic_load(&s->stopping))
        request_call(s, c->method);
      dispatch(s, c);
      break;
    case CALL_FINISHING:
      call_free(c);
      break;
    case CALL_HANDLING:
      break; /* no batch is started in this state */
    }
  }
  return NULL;
}

/* Tries to bind addr ourselves first: gRPC only says "failed", and the user
 * deserves to know the port is taken. */
static int probe_bind(const char *addr, char *err, size_t errlen) {
  char host[300];
  const char *colon = strrchr(addr, ':');
  struct addrinfo hints = {0}, *res = NULL;
  int rc = 0;

  if (!colon || (size_t)(colon - addr) >= sizeof host) {
    snprintf(err, errlen, "cannot listen on %s: expected host:port", addr);
    return CM_EINVAL;
  }
  memcpy(host, addr, colon - addr);
  host[colon - addr] = 0;
  if (host[0] == '[') { /* [::1] */
    memmove(host, host + 1, strlen(host));
    host[strcspn(host, "]")] = 0;
  }
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  if (getaddrinfo(host, colon + 1, &hints, &res) != 0 || !res) {
    snprintf(err, errlen, "cannot listen on %s: cannot resolve host '%s'", addr,
             host);
    return CM_EINVAL;
  }
  int fd = socket(res->ai_family, SOCK_STREAM, 0), one = 1;
  /* As gRPC binds: connections of a psd that was killed linger in
   * TIME_WAIT for a minute and must not keep its restart from listening;
   * a socket that listens there still makes bind fail. */
  if (fd >= 0)
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (fd >= 0 && bind(fd, res->ai_addr, res->ai_addrlen) != 0) {
    snprintf(err, errlen, "cannot listen on %s: %s", addr, strerror(errno));
    rc = errno == EADDRINUSE ? CM_EADDRINUSE : CM_ESYS;
  }
  if (fd >= 0)
    close(fd);
  freeaddrinfo(res);
  return rc;
}

uint64_t cm_server_unauthenticated(const struct cm_server *s) {
  return atomic_load(&((struct cm_server *)s)->unauthenticated);
}

int cm_server_new(struct cm_server **out, const char *addr,
                  const struct cm_rpc_method *methods, int n,
                  const struct cm_creds *creds, char *err, size_t errlen) {
  struct cm_server *s = NULL;
  grpc_arg args[4];
  grpc_channel_args cargs;
  grpc_server_credentials *gcreds = NULL;
  int rc;

  *out = NULL;
  if ((rc = probe_bind(addr, err, errlen)))
    return rc;
  s = calloc(1, sizeof *s);
  if (!s || !(s->registered = calloc(n ? n : 1, sizeof *s->registered))) {
    rc = CM_ENOMEM;
    goto out;
  }
  pthread_mutex_init(&s->lock, NULL);
  pthread_cond_init(&s->cond, NULL);
  s->methods = methods;
  s->nmethods = n;
  cm__rpc_build_args(args, &cargs.num_args, 1);
  cargs.args = args;
  s->server = grpc_server_create(&cargs, NULL);
  s->cq = grpc_completion_queue_create_for_next(NULL);
  grpc_server_register_completion_queue(s->server, s->cq, NULL);
  for (int i = 0; i < n; i++)
    s->registered[i] = grpc_server_register_method(
        s->server, methods[i].path, NULL,
        GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER, 0);
  if (creds && creds->token[0])
    snprintf(s->token, sizeof s->token, "%s", creds->token);
  if (creds && creds->tls) {
    grpc_ssl_pem_key_cert_pair pair = {creds->key_pem, creds->cert_pem};
    gcreds = grpc_ssl_server_credentials_create_ex(
        creds->mutual ? creds->ca_pem : NULL, &pair, 1,
        creds->mutual
            ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
            : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
        NULL);
  } else {
    gcreds = grpc_insecure_server_credentials_create();
  }
  if (!gcreds) {
    snprintf(err, errlen,
             "cannot listen on %s: gRPC refused the TLS "
             "certificate or key",
             addr);
    rc = CM_EINVAL;
    goto out;
  }
  if (!grpc_server_add_http2_port(s->server, addr, gcreds)) {
    snprintf(err, errlen, "cannot listen on %s: gRPC refused the address",
             addr);
    rc = CM_EADDRINUSE;
    goto out;
  }
  rc = 0;
out:
  if (gcreds)
    grpc_server_credentials_release(gcreds);
  if (rc && s) {
    if (s->server) {
      /* never started: shut down through the queue, then destroy */
      grpc_server_shutdown_and_notify(s->server, s->cq, &s->shutdown_tag);
      grpc_completion_queue_shutdown(s->cq);
      while (grpc_completion_queue_next(
                 s->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL)
                 .type != GRPC_QUEUE_SHUTDOWN) {
      }
      grpc_server_destroy(s->server);
      grpc_completion_queue_destroy(s->cq);
    }
    free(s->registered);
    free(s);
    s = NULL;
  }
  *out = s;
  return rc;
}

void cm_server_add_fd(struct cm_server *s, int fd) {
  grpc_server_credentials *creds = grpc_insecure_server_credentials_create();
  grpc_server_add_channel_from_fd(s->server, fd, creds);
  grpc_server_credentials_release(creds);
}

int cm_server_start(struct cm_server *s) {
  grpc_server_start(s->server);
  for (int m = -1; m < s->nmethods; m++)
    for (int k = 0; k < (m < 0 ? 1 : REQUESTS_PER_METHOD); k++)
      if (request_call(s, m))
        return CM_ERPC;
  if (pthread_create(&s->thread, NULL, queue_thread, s) != 0)
    return CM_ESYS;
  s->started = 1;
  return 0;
}

void cm_server_drain(struct cm_server *s, const char *why) {
  if (!s || atomic_load(&s->draining))
    return;
  snprintf(s->drain_why, sizeof s->drain_why, "%s", why);
  atomic_store(&s->draining, 1);
}

int cm_server_wait_idle(struct cm_server *s, int grace_ms) {
  double until = cm_mono_ms() + grace_ms;
  int n;
  if (!s)
    return 0;
  /* Bounded by grace_ms; answers come from other threads, so poll. */
  while ((n = atomic_load(&s->handling)) > 0 && cm_mono_ms() < until)
    cm_sleep_ms(2);
  return n;
}

void cm_server_stop(struct cm_server *s, int grace_ms) {
  struct timespec until;
  int seen;

  pthread_mutex_lock(&s->lock);
  if (s->stopped || !s->started) {
    pthread_mutex_unlock(&s->lock);
    return;
  }
  s->stopped = 1;
  pthread_mutex_unlock(&s->lock);
  atomic_store(&s->stopping, 1);
  grpc_server_shutdown_and_notify(s->server, s->cq, &s->shutdown_tag);
  until = cm_abstime_after_ms(grace_ms);
  pthread_mutex_lock(&s->lock);
  while (!s->shut_seen)
    if (pthread_cond_timedwait(&s->cond, &s->lock, &until) != 0)
      break;
  seen = s->shut_seen;
  pthread_mutex_unlock(&s->lock);
  if (!seen) {
    /* gRPC also waits on idle connections; only unanswered calls are
     * worth a warning. */
    int n = atomic_load(&s->handling);
    if (n > 0)
      cm_warn("%d calls still in flight after %d ms; cancelling them", n,
              grace_ms);
    grpc_server_cancel_all_calls(s->server);
  }
  pthread_join(s->thread, NULL);
}

void cm_server_free(struct cm_server *s) {
  if (!s)
    return;
  cm_server_stop(s, 0);
  grpc_server_destroy(s->server);
  grpc_completion_queue_destroy(s->cq);
  pthread_mutex_destroy(&s->lock);
  pthread_cond_destroy(&s->cond);
  free(s->registered);
  free(s);
}
