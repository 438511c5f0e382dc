/* The spec's "cluster" (addr.h): every "host:port" entry of cluster.ps and
 * cluster.worker checked (IPv4, bracketed IPv6, a host name; a port in
 * 1..65535) and split into a struct cm_addr, and no address given to two
 * tasks. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* strcasecmp under -std=c11 */
#endif

#include "addr.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include "err.h"
#include "layout.h"
#include "task.h"

int cm__parse_ipv6(const char *s, unsigned char bin[16]) {
  char tmp[INET6_ADDRSTRLEN + 1];
  size_t n = strcspn(s, "%"); /* drop a zone such as %eth0 */

  if (n >= sizeof tmp)
    return 0;
  memcpy(tmp, s, n);
  tmp[n] = '\0';
  return inet_pton(AF_INET6, tmp, bin) == 1;
}

/* Whether host is a plausible DNS name: dot-separated labels of letters,
 * digits, '-' and '_' (1..63 each), with an optional trailing dot. */
static int valid_hostname(const char *host) {
  size_t label = 0;
  const char *p;

  for (p = host; *p; p++) {
    if (*p == '.') {
      if (label == 0)
        return 0;
      label = 0;
    } else if (isalnum((unsigned char)*p) || *p == '-' || *p == '_') {
      if (++label > 63)
        return 0;
    } else {
      return 0;
    }
  }
  return p != host;
}

int cm__parse_addr(struct cm__errs *e, const json_t *v, const char *path,
                   struct cm_addr *out) {
  char q[CM__SPEC_QUOTE_MAX], qh[CM__SPEC_QUOTE_MAX], got[CM__SPEC_QUOTE_MAX];
  unsigned char bin[16];
  const char *s, *host, *close, *colon, *port, *p;
  size_t len, hostlen;
  long val;

  if (!json_is_string(v)) {
    cm__report(e, path, "expected a \"host:port\" string, got %s",
               cm__describe(got, sizeof got, v));
    return 0;
  }
  s = json_string_value(v);
  len = json_string_length(v);
  cm__quote(q, sizeof q, s);
  if (len == 0) {
    cm__report(e, path, "empty; expected \"host:port\"");
    return 0;
  }
  if (len >= sizeof out->text) {
    cm__report(e, path, "%s is %zu characters long; expected at most %zu", q,
               len, sizeof out->text - 1);
    return 0;
  }

  if (s[0] == '[') {
    close = strchr(s, ']');
    if (!close) {
      cm__report(e, path, "%s has no closing ']'; expected \"[IPv6]:port\"", q);
      return 0;
    }
    host = s + 1;
    hostlen = (size_t)(close - host);
    if (close[1] == '\0') {
      cm__report(e, path, "%s has no port; expected \"[IPv6]:port\"", q);
      return 0;
    }
    if (close[1] != ':') {
      cm__report(e, path,
                 "%s: expected ':' after ']'; expected \"[IPv6]:port\"", q);
      return 0;
    }
    port = close + 2;
  } else {
    colon = strrchr(s, ':');
    if (!colon) {
      cm__report(e, path, "%s has no port; expected \"host:port\"", q);
      return 0;
    }
    if (strchr(s, ':') != colon) {
      cm__report(
          e, path,
          "%s: an IPv6 address needs brackets; expected \"[host]:port\", "
          "e.g. \"[::1]:7000\"",
          q);
      return 0;
    }
    host = s;
    hostlen = (size_t)(colon - s);
    port = colon + 1;
  }

  if (hostlen == 0) {
    cm__report(e, path, "%s has no host; expected \"host:port\"", q);
    return 0;
  }
  if (hostlen >= sizeof out->host) {
    cm__report(e, path, "%s: host is %zu characters long; expected at most %zu",
               q, hostlen, sizeof out->host - 1);
    return 0;
  }
  memcpy(out->host, host, hostlen);
  out->host[hostlen] = '\0';
  cm__quote(qh, sizeof qh, out->host);

  if (s[0] == '[') {
    if (!cm__parse_ipv6(out->host, bin)) {
      cm__report(e, path,
                 "%s: %s is not an IPv6 address; expected \"[IPv6]:port\" or "
                 "\"host:port\"",
                 q, qh);
      return 0;
    }
  } else if (strspn(out->host, "0123456789.") == hostlen) {
    if (inet_pton(AF_INET, out->host, bin) != 1) {
      cm__report(e, path, "%s: %s is not an IPv4 address; expected a.b.c.d", q,
                 qh);
      return 0;
    }
  } else if (!valid_hostname(out->host)) {
    cm__report(
        e, path,
        "%s: %s is not a valid host name; expected letters, digits, '-', "
        "'_' and '.'",
        q, qh);
    return 0;
  }

  if (*port == '\0') {
    cm__report(e, path, "%s has no port; expected \"host:port\"", q);
    return 0;
  }
  for (p = port; *p; p++) {
    if (!isdigit((unsigned char)*p)) {
      cm__quote(got, sizeof got, port);
      cm__report(e, path, "%s: port %s is not a number; expected 1..65535", q,
                 got);
      return 0;
    }
  }
  val = strlen(port) > 5 ? 0 : strtol(port, NULL, 10);
  if (val < 1 || val > 65535) {
    cm__report(e, path, "port %.20s%s out of range; expected 1..65535", port,
               strlen(port) > 20 ? "..." : "");
    return 0;
  }
  out->port = (int)val;
  memcpy(out->text, s, len + 1);
  return 1;
}

/* Parses cluster.<key> (an array of addresses) into a new array *out of *n
 * entries. *n is the array's length even when entries are wrong, so that
 * task.index can still be checked; wrong entries keep port 0. Returns 0 or
 * CM_ENOMEM; mistakes go to e. */
static int parse_addrs(struct cm__errs *e, json_t *cluster, const char *key,
                       struct cm_addr **out, int *n) {
  char path[CM__SPEC_PATH_MAX], epath[CM__SPEC_PATH_MAX + 32],
      got[CM__SPEC_QUOTE_MAX];
  json_t *arr = json_object_get(cluster, key);
  json_t *v;
  size_t i, len;

  *out = NULL;
  *n = 0;
  cm__path_key(path, sizeof path, "cluster", key);
  if (!arr) {
    cm__report(e, path, "missing; expected an array of \"host:port\" strings");
    return 0;
  }
  if (!json_is_array(arr)) {
    cm__report(e, path, "expected an array of \"host:port\" strings, got %s",
               cm__describe(got, sizeof got, arr));
    return 0;
  }
  len = json_array_size(arr);
  if (len == 0) {
    cm__report(e, path, "empty; expected at least one \"host:port\" string");
    return 0;
  }
  if (len > INT_MAX) {
    cm__report(e, path, "%zu entries; expected at most %d", len, INT_MAX);
    return 0;
  }
  *out = calloc(len, sizeof **out);
  if (!*out)
    return CM_ENOMEM;
  *n = (int)len;
  json_array_foreach(arr, i, v) {
    cm__path_index(epath, sizeof epath, path, i);
    cm__parse_addr(e, v, epath, &(*out)[i]);
  }
  return 0;
}

/* Whether a and b name the same endpoint as written: same port and the same
 * host, compared case-insensitively or, for IP literals, as addresses. */
static int addr_same(const struct cm_addr *a, const struct cm_addr *b) {
  unsigned char ba[16], bb[16];

  if (a->port != b->port)
    return 0;
  if (strcasecmp(a->host, b->host) == 0)
    return 1;
  if (inet_pton(AF_INET, a->host, ba) == 1 &&
      inet_pton(AF_INET, b->host, bb) == 1)
    return memcmp(ba, bb, 4) == 0;
  if (cm__parse_ipv6(a->host, ba) && cm__parse_ipv6(b->host, bb))
    return memcmp(ba, bb, 16) == 0;
  return 0;
}

/* The j-th address of cluster.ps, cluster.worker and cluster.serve taken
 * in that order, with its list's name and index. */
static const struct cm_addr *nth_addr(const struct cm_spec *spec, int j,
                                      const char **list, int *index) {
  if (j < spec->nps) {
    *list = "ps";
    *index = j;
    return &spec->ps[j];
  }
  j -= spec->nps;
  if (j < spec->nworker) {
    *list = "worker";
    *index = j;
    return &spec->worker[j];
  }
  *list = "serve";
  *index = j - spec->nworker;
  return &spec->serve[j - spec->nworker];
}

/* Reports every address that repeats an earlier one in cluster.ps followed
 * by cluster.worker and cluster.serve. */
static void check_duplicates(struct cm__errs *e, const struct cm_spec *spec) {
  char path[CM__SPEC_PATH_MAX], q[CM__SPEC_QUOTE_MAX];
  int total = spec->nps + spec->nworker + spec->nserve;
  int i, j, ai, bi;
  const char *al, *bl;
  const struct cm_addr *a, *b;

  for (j = 0; j < total; j++) {
    b = nth_addr(spec, j, &bl, &bi);
    if (b->port == 0)
      continue;
    for (i = 0; i < j; i++) {
      a = nth_addr(spec, i, &al, &ai);
      if (a->port != 0 && addr_same(a, b))
        break;
    }
    if (i == j)
      continue;
    snprintf(path, sizeof path, "cluster.%s[%d]", bl, bi);
    cm__report(e, path,
               "%s is also cluster.%s[%d]; expected every task to have its own "
               "address",
               cm__quote(q, sizeof q, b->text), al, ai);
  }
}

/* Kubeflow's cluster.chief: its tasks go first in the worker list (a chief
 * runs as worker 0); cluster.evaluator is checked and noted, not used. A
 * spec with a chief may have no cluster.worker. Returns 0 or a negative
 * code (out of memory). */
static int parse_kubeflow(struct cm__errs *e, json_t *cluster,
                          struct cm_spec *spec) {
  struct cm_addr *chief = NULL, *eval = NULL, *all;
  int nchief = 0, neval = 0, rc = 0;
  if (json_object_get(cluster, "evaluator")) {
    if ((rc = parse_addrs(e, cluster, "evaluator", &eval, &neval)) < 0)
      return rc;
    free(eval);
    if (neval > 0)
      cm__spec_note(spec,
                    "%s: cluster.evaluator (%d task%s) is not part of a psd "
                    "job: ignored",
                    e->source ? e->source : "the spec", neval,
                    neval == 1 ? "" : "s");
  }
  if (!json_object_get(cluster, "chief"))
    return 0;
  if ((rc = parse_addrs(e, cluster, "chief", &chief, &nchief)) < 0)
    return rc;
  if (nchief == 0)
    return 0;
  all = calloc((size_t)nchief + (size_t)spec->nworker, sizeof *all);
  if (!all) {
    free(chief);
    return CM_ENOMEM;
  }
  memcpy(all, chief, (size_t)nchief * sizeof *all);
  if (spec->nworker)
    memcpy(all + nchief, spec->worker, (size_t)spec->nworker * sizeof *all);
  free(chief);
  free(spec->worker);
  spec->worker = all;
  spec->nworker += nchief;
  spec->nchief = nchief;
  return 0;
}

/* cluster.serve: the serving tasks (docs/serving.md), optional; serve:J
 * follows shard J % nps (the layout's cm_layout_serve_shard), so their
 * number must be a multiple of the shards'. Returns 0 or CM_ENOMEM; mistakes go
 * to e. */
static int parse_serve(struct cm__errs *e, json_t *cluster,
                       struct cm_spec *spec) {
  int rc;
  if (!json_object_get(cluster, "serve"))
    return 0;
  if ((rc = parse_addrs(e, cluster, "serve", &spec->serve, &spec->nserve)) < 0)
    return rc;
  if (spec->nserve > 0 && spec->nps > 0 &&
      !cm_layout_serve_replicas(spec->nserve, spec->nps))
    cm__report(e, "cluster.serve",
               "%d entr%s; expected a multiple of cluster.ps's %d (serve:J "
               "follows shard J %% %d, the same number of replicas of each)",
               spec->nserve, spec->nserve == 1 ? "y" : "ies", spec->nps,
               spec->nps);
  return 0;
}

int cm_addr_parse(const char *text, const char *what, struct cm_addr *out,
                  char *err, size_t errlen) {
  struct cm__errs e;
  json_t *v = json_string(text);
  memset(out, 0, sizeof *out);
  cm__errs_init(&e, what, err, errlen);
  if (!v)
    cm__report(&e, NULL, "expected \"host:port\" (UTF-8 text)");
  else
    cm__parse_addr(&e, v, NULL, out);
  cm__errs_finish(&e);
  json_decref(v);
  return e.count ? CM_EINVAL : 0;
}

int cm__parse_cluster(struct cm__errs *e, json_t *root, struct cm_spec *spec) {
  static const char *const keys[] = {"ps", "worker", "chief", "evaluator",
                                     "serve"};
  char got[CM__SPEC_QUOTE_MAX];
  json_t *cluster = json_object_get(root, "cluster");
  int rc;

  if (!cluster) {
    cm__report(
        e, "cluster",
        "missing; expected an object with \"ps\" and \"worker\" arrays of "
        "\"host:port\" strings");
    return 0;
  }
  if (!json_is_object(cluster)) {
    cm__report(e, "cluster",
               "expected an object with \"ps\" and \"worker\" arrays, got %s",
               cm__describe(got, sizeof got, cluster));
    return 0;
  }
  cm__check_keys(e, cluster, "cluster", keys, sizeof keys / sizeof keys[0]);
  rc = parse_addrs(e, cluster, "ps", &spec->ps, &spec->nps);
  if (rc < 0)
    return rc;
  /* With Kubeflow's chief, cluster.worker may be absent (a chief alone). */
  if (json_object_get(cluster, "worker") || !json_object_get(cluster, "chief"))
    rc = parse_addrs(e, cluster, "worker", &spec->worker, &spec->nworker);
  if (rc < 0)
    return rc;
  if ((rc = parse_kubeflow(e, cluster, spec)) < 0)
    return rc;
  if ((rc = parse_serve(e, cluster, spec)) < 0)
    return rc;
  check_duplicates(e, spec);
  return 0;
}
