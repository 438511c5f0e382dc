/* The shard's /metrics endpoint (metrics.h) on libmicrohttpd. Each scrape
 * runs the shard's own Admin/Status handler as a local call
 * (cm_rpc_call_local: no network, no token, the handler gRPC calls), turns
 * its answer into the status document (status_json.h) and renders it with
 * the renderer psctl metrics uses (prom.h), so that the two can never
 * disagree. The Status handler only reads, under the locks the
 * coordinator's and the saver's threads already share with gRPC's. */
#include "metrics.h"

#include <errno.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <microhttpd.h>

#include "err.h"
#include "log.h"
#include "prom.h"
#include "ps.pb-c.h"
#include "rpc.h"
#include "rpc_server.h"
#include "status_json.h"

struct psd_metrics {
  struct MHD_Daemon *d;        /* libmicrohttpd's daemon and its thread */
  struct cm_rpc_method status; /* the shard's Admin/Status handler */
  char job[64];                /* caller.job of the local Status call */
  int shard;                   /* the "shard" label */
  char address[300];           /* psd_up's "address" label */
  const char *token;           /* required bearer token, "" for none;
                                  borrowed from the creds */
  char url[340];               /* where it serves, for the log */
  char lasterr[256];           /* libmicrohttpd's last complaint */
  int started; /* 1 once serving: complaints are logged; before, a failed
                  start reports the last one */
};

/* libmicrohttpd's own complaints: kept for a failed start, logged once
 * serving. */
static void on_mhd_log(void *cls, const char *fmt, va_list ap) {
  struct psd_metrics *m = cls;
  int n;
  vsnprintf(m->lasterr, sizeof m->lasterr, fmt, ap);
  n = (int)strlen(m->lasterr);
  while (n > 0 && (m->lasterr[n - 1] == '\n' || m->lasterr[n - 1] == '\r'))
    m->lasterr[--n] = '\0';
  if (m->started)
    cm_warn("metrics: %s", m->lasterr);
}

/* Renders the shard's metrics into *text (malloc'd). Returns 0, or a
 * negative code with why filled. */
static int render(struct psd_metrics *m, char **text, char *why,
                  size_t whylen) {
  Psd__V1__Caller caller = PSD__V1__CALLER__INIT;
  Psd__V1__StatusRequest req = PSD__V1__STATUS_REQUEST__INIT;
  Psd__V1__StatusResponse *resp = NULL;
  struct cm_rpc_answer ans;
  grpc_byte_buffer *bb;
  json_t *doc = NULL, *fams = NULL;
  int rc;

  *text = NULL;
  caller.job = m->job;
  caller.worker = "metrics";
  req.caller = &caller;
  memset(&ans, 0, sizeof ans);
  if (!(bb = cm_rpc_pack(&req.base))) {
    rc = CM_ENOMEM;
    goto out;
  }
  if ((rc = cm_rpc_call_local(&m->status, bb, &ans)))
    goto out;
  if (!ans.answered || ans.status != GRPC_STATUS_OK) {
    snprintf(why, whylen, "status: %s", ans.details);
    rc = CM_ERPC;
    goto out;
  }
  resp = (Psd__V1__StatusResponse *)cm_rpc_unpack(
      ans.response, &psd__v1__status_response__descriptor);
  if (!resp || !(doc = cm_status_json(resp))) {
    rc = resp ? CM_ENOMEM : CM_EPROTO;
    goto out;
  }
  struct cm_prom_shard sh = {m->shard, m->address, doc};
  if (!(fams = cm_prom_families(&sh, 1)) || !(*text = cm_prom_text(fams)))
    rc = CM_ENOMEM;
out:
  if (rc && !why[0])
    snprintf(why, whylen, "%s", cm_strerror(rc));
  json_decref(fams);
  json_decref(doc);
  if (resp)
    psd__v1__status_response__free_unpacked(resp, NULL);
  cm_rpc_answer_release(&ans);
  if (bb)
    grpc_byte_buffer_destroy(bb);
  return rc;
}

/* Queues an answer with a text body (copied); header may be NULL. */
static enum MHD_Result reply(struct MHD_Connection *c, unsigned code,
                             const char *body, const char *header,
                             const char *value) {
  struct MHD_Response *r = MHD_create_response_from_buffer(
      strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
  enum MHD_Result ret;
  if (!r)
    return MHD_NO;
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
                          "text/plain; charset=utf-8");
  if (header)
    MHD_add_response_header(r, header, value);
  ret = MHD_queue_response(c, code, r);
  MHD_destroy_response(r);
  return ret;
}

/* Whether the request carries the token, when one is required. */
static int authorized(struct psd_metrics *m, struct MHD_Connection *c) {
  const char *got;
  if (!m->token[0])
    return 1;
  got = MHD_lookup_connection_value(c, MHD_HEADER_KIND,
                                    MHD_HTTP_HEADER_AUTHORIZATION);
  return got && cm_auth_bearer_ok(m->token, got, strlen(got));
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c,
                                  const char *url, const char *method,
                                  const char *version, const char *upload,
                                  size_t *upload_size, void **state) {
  static int seen; /* marks a request whose headers were seen */
  struct psd_metrics *m = cls;
  struct MHD_Response *r;
  char *text, why[1100] = "", body[1200];
  enum MHD_Result ret;

  /* The first call has the headers only; a body (never wanted) comes in
   * later calls and is dropped; the last call answers. */
  if (!*state) {
    *state = &seen;
    return MHD_YES;
  }
  if (*upload_size) {
    *upload_size = 0;
    return MHD_YES;
  }
  if (!authorized(m, c))
    return reply(c, MHD_HTTP_UNAUTHORIZED,
                 "unauthorized: send \"Authorization: Bearer <token>\" with "
                 "the token of the spec's auth.token_file\n",
                 MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer realm=\"psd\"");
  if (strcmp(url, "/metrics") != 0)
    return reply(c, MHD_HTTP_NOT_FOUND, "not found: psd serves /metrics\n",
                 NULL, NULL);
  if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 &&
      strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
    return reply(c, MHD_HTTP_METHOD_NOT_ALLOWED,
                 "method not allowed: /metrics answers GET and HEAD\n",
                 MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
  if (render(m, &text, why, sizeof why)) {
    snprintf(body, sizeof body, "cannot render the metrics: %s\n", why);
    return reply(c, MHD_HTTP_INTERNAL_SERVER_ERROR, body, NULL, NULL);
  }
  r = MHD_create_response_from_buffer(strlen(text), text,
                                      MHD_RESPMEM_MUST_FREE);
  if (!r) {
    free(text);
    return MHD_NO;
  }
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
                          CM_PROM_CONTENT_TYPE);
  ret = MHD_queue_response(c, MHD_HTTP_OK, r);
  MHD_destroy_response(r);
  return ret;
}

/* The one address conf->listen names, resolved (a host name: its first
 * address). Returns 0 or CM_ESYS with err filled. */
static int resolve(const struct cm_addr *a, struct sockaddr_storage *ss,
                   char *err, size_t errlen) {
  struct addrinfo hints, *res = NULL;
  char port[8];
  int g;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  snprintf(port, sizeof port, "%d", a->port);
  if ((g = getaddrinfo(a->host, port, &hints, &res)) || !res) {
    snprintf(err, errlen, "metrics: cannot resolve %s: %s", a->text,
             gai_strerror(g));
    return CM_ESYS;
  }
  memcpy(ss, res->ai_addr, res->ai_addrlen);
  freeaddrinfo(res);
  return 0;
}

int psd_metrics_start(struct psd_metrics **out,
                      const struct psd_metrics_conf *conf, char *err,
                      size_t errlen) {
  const struct cm_creds *cr = conf->creds;
  const struct cm_rpc_method *methods;
  struct sockaddr_storage ss;
  struct psd_metrics *m;
  unsigned flags =
      MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ERROR_LOG;
  int n, rc;

  *out = NULL;
  if (!(m = calloc(1, sizeof *m)))
    return CM_ENOMEM;
  methods = psd_service_methods(conf->service, &n);
  for (int i = 0; i < n; i++)
    if (!strcmp(methods[i].path, "/psd.v1.Admin/Status"))
      m->status = methods[i];
  if (!m->status.handler) {
    snprintf(err, errlen, "metrics: the service has no Admin/Status");
    rc = CM_EINVAL;
    goto out;
  }
  snprintf(m->job, sizeof m->job, "%s", conf->job);
  m->shard = conf->shard;
  snprintf(m->address, sizeof m->address, "%s", conf->address);
  m->token = cr->token;
  snprintf(m->url, sizeof m->url, "%s://%s/metrics", cr->tls ? "https" : "http",
           conf->listen->text);
  if ((rc = resolve(conf->listen, &ss, err, errlen)))
    goto out;
  if (ss.ss_family == AF_INET6)
    flags |= MHD_USE_IPv6;
  if (cr->tls)
    flags |= MHD_USE_TLS;
  errno = 0;
  /* Without TLS the key and certificate options are cut off by the
   * MHD_OPTION_END in their place. */
  m->d = MHD_start_daemon(
      flags, (uint16_t)conf->listen->port, NULL, NULL, on_request, m,
      MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, m, MHD_OPTION_SOCK_ADDR,
      (struct sockaddr *)&ss, MHD_OPTION_CONNECTION_LIMIT, (unsigned)16,
      MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)30,
      cr->tls ? MHD_OPTION_HTTPS_MEM_KEY : MHD_OPTION_END, cr->key_pem,
      MHD_OPTION_HTTPS_MEM_CERT, cr->cert_pem, MHD_OPTION_END);
  if (!m->d) {
    rc = errno == EADDRINUSE ? CM_EADDRINUSE : CM_ESYS;
    snprintf(err, errlen, "metrics: cannot serve %s: %s", m->url,
             m->lasterr[0] ? m->lasterr : "libmicrohttpd failed to start");
    goto out;
  }
  m->started = 1;
  *out = m;
  m = NULL;
out:
  free(m);
  return rc;
}

const char *psd_metrics_url(const struct psd_metrics *m) { return m->url; }

void psd_metrics_stop(struct psd_metrics *m) {
  if (!m)
    return;
  MHD_stop_daemon(m->d);
  free(m);
}
