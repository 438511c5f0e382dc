/* libpsclient's public layer (include/psd/client.h) over the internal client
 * (worker/psclient/psclient.h), shared by its files and by nothing else:
 *
 *   api_open.c    psc_open*, the options, close, errors, the job's settings
 *   api_dense.c   variables: declare, pull, push, the sync and staleness calls
 *   api_rows.c    embedding tables
 *   api_lookup.c  psc_serving: lookups from the serving tasks, over the
 *                 internal serving client (serving.h), not this header's
 *
 * The public layer owns the spec the internal client borrows, and names
 * variables by handle (their declaration index in the internal client). */
#ifndef PSC_API_INTERNAL_H
#define PSC_API_INTERNAL_H

#include "psclient.h"
#include "psd/client.h"
#include "spec.h"

struct psc_client {
  struct cm_spec *spec;     /* owned: the job's spec (or one made from the
                               addresses) */
  struct psc__client *cl;   /* owned: the internal client */
  int task;                 /* this client's worker index, -1: none */
  char name[64];            /* its identity in the shards' logs */
  char err[1024];           /* psc_error when set here; else the client's */
  int own_err;              /* 1: err holds the last error, not cl's */
  int (*interrupt)(void *); /* psc_set_interrupt's poll, or NULL */
  void *interrupt_arg;      /* passed to interrupt */
};

/* The helpers below are the library's own: never exported. */
#pragma GCC visibility push(hidden)

/* Starts a call: clears the last error and re-arms the interrupt poll. */
void psc__begin(psc_client *c);

/* Sets the error text for a failure found here (not in the internal
 * client); returns rc. */
int psc__fail(psc_client *c, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Points the internal client at the buffers of vars[0..n) (value and/or
 * grad may be NULL) and selects them for the next transfer. Returns 0 or
 * an error naming the bad handle. */
int psc__bind(psc_client *c, const int *vars, float *const *dst,
              const float *const *grads, int n, const char *what);

#pragma GCC visibility pop

#endif
