/* "job.metrics_listen" (job.h): where each shard serves GET /metrics over
 * HTTP for a Prometheus server to scrape. Off unless set. Two forms:
 *   "127.0.0.1:9100"                      shard i listens on port 9100 + i
 *                                         (several shards on one host)
 *   ["10.0.0.1:9100", "10.0.0.2:9100"]    one address per shard, in
 *                                         cluster.ps order (shards on
 *                                         several hosts)
 * An address given to two shards is refused, as in "cluster". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "addr.h"
#include "err.h"
#include "job.h"

#define PATH "job.metrics_listen"

/* Fills m[0..nps) from a base address: the port plus the shard index. */
static void from_base(struct cm__errs *e, const json_t *v, int nps,
                      struct cm_addr *m) {
  char q[CM__SPEC_QUOTE_MAX];
  struct cm_addr base;
  if (!cm__parse_addr(e, v, PATH, &base))
    return;
  if (base.port + nps - 1 > 65535) {
    cm__report(e, PATH,
               "%s: shard %d would listen on port %d; expected a base port "
               "of at most %d (shard i listens on port + i)",
               cm__quote(q, sizeof q, base.text), nps - 1, base.port + nps - 1,
               65535 - (nps - 1));
    return;
  }
  for (int i = 0; i < nps; i++) {
    m[i] = base;
    m[i].port = base.port + i;
    snprintf(m[i].text, sizeof m[i].text,
             strchr(base.host, ':') ? "[%s]:%d" : "%s:%d", base.host,
             m[i].port);
  }
}

/* Whether two addresses are the same as written (host and port). */
static int same(const struct cm_addr *a, const struct cm_addr *b) {
  return a->port && a->port == b->port && !strcmp(a->host, b->host);
}

/* Fills m[0..nps) from an array of one address per shard. */
static void from_list(struct cm__errs *e, const json_t *arr, int nps,
                      struct cm_addr *m) {
  char path[CM__SPEC_PATH_MAX], q[CM__SPEC_QUOTE_MAX];
  size_t i, n = json_array_size(arr);
  const json_t *v;
  if (n != (size_t)nps) {
    cm__report(e, PATH,
               "%zu addresses for %d shards; expected one \"host:port\" per "
               "entry of cluster.ps, or one \"host:port\" string (shard i "
               "then listens on port + i)",
               n, nps);
    return;
  }
  json_array_foreach(arr, i, v) {
    cm__path_index(path, sizeof path, PATH, i);
    if (!cm__parse_addr(e, v, path, &m[i]))
      continue;
    for (size_t k = 0; k < i; k++)
      if (same(&m[k], &m[i])) {
        cm__report(e, path, "%s is also %s[%zu]; expected one per shard",
                   cm__quote(q, sizeof q, m[i].text), PATH, k);
        break;
      }
  }
}

int cm__parse_metrics(struct cm__errs *e, json_t *root, struct cm_spec *spec) {
  char got[CM__SPEC_QUOTE_MAX];
  json_t *v = json_object_get(json_object_get(root, "job"), "metrics_listen");
  struct cm_addr *m;
  int before = e->count;

  if (!v || json_is_null(v) || spec->nps < 1)
    return 0;
  if (!json_is_string(v) && !json_is_array(v)) {
    cm__report(e, PATH,
               "expected a \"host:port\" string or an array of them (one per "
               "shard), got %s",
               cm__describe(got, sizeof got, v));
    return 0;
  }
  if (!(m = calloc((size_t)spec->nps, sizeof *m)))
    return CM_ENOMEM;
  if (json_is_string(v))
    from_base(e, v, spec->nps, m);
  else
    from_list(e, v, spec->nps, m);
  if (e->count > before) {
    free(m);
    return 0;
  }
  spec->metrics = m;
  return 0;
}
