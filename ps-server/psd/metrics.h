/* The shard's HTTP endpoint for Prometheus: GET /metrics on the address
 * job.metrics_listen gives this shard (or psd --metrics-listen), answered
 * with the same families psctl metrics renders for it (common/metrics/
 * prom.h), from the shard's own Admin/Status answer. libmicrohttpd serves
 * it from a thread of its own, one request at a time.
 *
 *   GET or HEAD /metrics  200, text/plain; version=0.0.4
 *   another path          404
 *   another method        405 (Allow: GET, HEAD)
 *   no or a wrong token   401 when the spec has auth.token_file
 *                         ("Authorization: Bearer <token>"), before
 *                         anything else is looked at
 * With auth.tls it serves HTTPS with the shard's certificate and key
 * (client certificates are not asked for: the token is the check). */
#ifndef PSD_METRICS_H
#define PSD_METRICS_H

#include <stddef.h>

#include "auth.h"
#include "service.h"
#include "spec.h"

/* What the endpoint serves, and for whom; every pointer borrowed for the
 * call only, except creds and service (until psd_metrics_stop). */
struct psd_metrics_conf {
  const struct cm_addr *listen; /* the address to listen on, nothing else */
  struct psd_service *service;  /* whose Admin/Status is rendered */
  const char *job;              /* the job's name (the Status call's) */
  int shard;                    /* the shard's index: the "shard" label */
  const char *address;          /* its gRPC address: psd_up's "address" */
  const struct cm_creds *creds; /* token and TLS material */
};

struct psd_metrics;

/* Listens and starts serving. Returns 0, CM_EADDRINUSE, CM_ESYS (cannot
 * resolve or bind the address; say why in err) or CM_ENOMEM. */
int psd_metrics_start(struct psd_metrics **out,
                      const struct psd_metrics_conf *conf, char *err,
                      size_t errlen);

/* "http://127.0.0.1:9100/metrics" (https with TLS), for the log. */
const char *psd_metrics_url(const struct psd_metrics *m);

/* Stops serving (a request being answered finishes first) and frees m;
 * NULL is ignored. */
void psd_metrics_stop(struct psd_metrics *m);

#endif
