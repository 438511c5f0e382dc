/* psc_serving (psd/client.h): a client of a job's serving tasks, the spec
 * it owns and the internal serving client over it (serving.h), and the
 * lookups of rows and dense variables. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "psd/client.h"
#include "serving.h"
#include "spec.h"

struct psc_serving {
  struct cm_spec *spec;    /* owned: the job's spec */
  struct psc__serving *sv; /* owned: the internal client */
  char name[64];           /* its identity in the tasks' logs */
};

void psc_serving_options_init(struct psc_serving_options *o) {
  memset(o, 0, sizeof *o);
  o->size = sizeof *o;
  o->replica = -1;
}

int psc_serving_open(psc_serving **out, const char *spec_path,
                     const struct psc_serving_options *o, char *err,
                     size_t errlen) {
  struct psc_serving_options given;
  struct psc__serving_opts so = {0};
  char buf[8192];
  psc_serving *s = NULL;
  int rc;
  *out = NULL;
  psc_serving_options_init(&given);
  if (o)
    memcpy(&given, o,
           o->size && o->size < sizeof given ? o->size : sizeof given);
  if (!err || !errlen) {
    err = buf;
    errlen = sizeof buf;
  }
  if (!spec_path) {
    snprintf(err, errlen, "psc_serving_open: no spec path");
    return PSC_EINVAL;
  }
  if (!(s = calloc(1, sizeof *s))) {
    snprintf(err, errlen, "out of memory");
    return PSC_ENOMEM;
  }
  if ((rc = cm_spec_load(spec_path, &s->spec, buf, sizeof buf))) {
    if (err != buf)
      snprintf(err, errlen, "%s", buf);
    goto out;
  }
  snprintf(s->name, sizeof s->name, "%s", given.name ? given.name : "psc");
  so.worker = s->name;
  so.timeout_ms = given.timeout_ms;
  so.retry_s = given.retry_s;
  so.replica = given.replica;
  rc = psc__serving_new(&s->sv, s->spec, &so, err, errlen);
out:
  if (rc) {
    psc_serving_close(s);
    return rc;
  }
  *out = s;
  return 0;
}

void psc_serving_close(psc_serving *s) {
  if (!s)
    return;
  psc__serving_free(s->sv);
  cm_spec_free(s->spec);
  free(s);
}

const char *psc_serving_error(const psc_serving *s) {
  return psc__serving_error(s->sv);
}

int psc_serving_grpc_status(const psc_serving *s) {
  return (int)psc__serving_last_status(s->sv);
}

int psc_serving_shards(const psc_serving *s) {
  return psc__serving_shards(s->sv);
}

int psc_serving_replicas(const psc_serving *s) {
  return psc__serving_replicas(s->sv);
}

int psc_serving_task(const psc_serving *s, int shard) {
  if (shard < 0 || shard >= psc__serving_shards(s->sv))
    return PSC_EINVAL;
  return psc__serving_task(s->sv, shard);
}

int psc_lookup_dim(psc_serving *s, const char *table) {
  uint32_t dim = 0;
  int rc = psc__serving_dim(s->sv, table, &dim);
  return rc ? rc : (int)dim;
}

int psc_lookup(psc_serving *s, const char *table, const uint64_t *ids, size_t n,
               float *rows, uint8_t *found, uint64_t *versions) {
  return psc__serving_lookup(s->sv, table, ids, n, rows, found, versions);
}

int psc_lookup_dense(psc_serving *s, const char *name, float *out, size_t count,
                     size_t *numel, uint64_t *versions) {
  return psc__serving_dense(s->sv, name, out, count, numel, versions);
}

void psc_serving_set_interrupt(psc_serving *s, int (*interrupted)(void *arg),
                               void *arg) {
  psc__serving_set_interrupt(s->sv, interrupted, arg);
}
