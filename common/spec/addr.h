/* Internal to common/spec: the cluster's addresses. Parses the spec's
 * "cluster" object into cm_spec's ps and worker arrays (spec.h), reporting
 * through errs.h every entry that is not a usable "host:port" and every
 * address given to two tasks. */
#ifndef CM_SPEC_ADDR_H
#define CM_SPEC_ADDR_H

#include <jansson.h>

#include "errs.h"
#include "spec.h"

/* Whether s (without a zone) is an IPv6 literal; fills bin when it is. */
int cm__parse_ipv6(const char *s, unsigned char bin[16]);

/* Parses one "host:port" string v (cluster.ps[i], job.metrics_listen, ...)
 * at JSON path `path` into *out. Returns 1 when valid; reports and returns
 * 0 otherwise (out->port stays 0). */
int cm__parse_addr(struct cm__errs *e, const json_t *v, const char *path,
                   struct cm_addr *out);

/* Parses root's "cluster" into spec->ps and spec->worker (new arrays owned
 * by spec, freed by cm_spec_free). Each list's length is set even when
 * entries are wrong, so that task.index can still be checked; wrong entries
 * keep port 0. Returns 0 or CM_ENOMEM; mistakes go to e. */
int cm__parse_cluster(struct cm__errs *e, json_t *root, struct cm_spec *spec);

#endif
