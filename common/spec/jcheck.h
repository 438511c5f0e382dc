/* Internal to common/spec: reading the spec's JSON into typed values. Every
 * check reports its mistake through errs.h and leaves the default in place,
 * so that one parse finds every mistake; the callers (addr.c, job.c,
 * job_optim.c, task.c, spec.c) say which members exist and what they mean. */
#ifndef CM_SPEC_JCHECK_H
#define CM_SPEC_JCHECK_H

#include <stddef.h>

#include <jansson.h>

#include "errs.h"

/* Parses JSON text with duplicate keys refused; on a syntax error reports
 * "source:line:column: JSON syntax error: ..." and returns NULL with *rc set
 * (CM_ENOMEM when jansson ran out of memory, else CM_ESPEC). The caller owns
 * the tree returned (json_decref). */
json_t *cm__load_json(struct cm__errs *e, const char *text, size_t len,
                      int *rc);

/* Checks that v is an integer in [min, max] and stores it in *val; reports
 * and returns 0 otherwise. */
int cm__want_int(struct cm__errs *e, const json_t *v, const char *path,
                 long long min, long long max, long long *val);

/* Stores the optional integer member obj.key in *dst when it is present and
 * in [min, max]; leaves the default in *dst when absent. */
void cm__opt_int(struct cm__errs *e, json_t *obj, const char *parent,
                 const char *key, long long min, long long max, int *dst);

/* Stores the optional non-empty string member obj.key in dst[0..cap);
 * returns 1 when it was present and valid, 0 otherwise. */
int cm__opt_string(struct cm__errs *e, json_t *obj, const char *parent,
                   const char *key, char *dst, size_t cap);

/* Stores the optional boolean member obj.key in *dst as 0 or 1. */
void cm__opt_bool(struct cm__errs *e, json_t *obj, const char *parent,
                  const char *key, int *dst);

/* Checks the optional string member obj.key against the choices in `one_of`
 * (a NULL-terminated list) and stores it in dst[0..cap). */
void cm__opt_choice(struct cm__errs *e, json_t *obj, const char *parent,
                    const char *key, const char *const *one_of, char *dst,
                    size_t cap);

/* Stores the optional number member obj.key in *dst when it lies in
 * (lo, hi) with lo included when lo_in; `expect` says so in words. */
void cm__opt_number(struct cm__errs *e, json_t *obj, const char *parent,
                    const char *key, double lo, int lo_in, double hi,
                    const char *expect, double *dst);

/* Returns the member obj.key (borrowed from obj) when it is an object;
 * reports and returns NULL when it is present but something else. */
json_t *cm__opt_object(struct cm__errs *e, json_t *obj, const char *parent,
                       const char *key, const char *expect);

/* Whether v (at path) is an object: when it is, reports each member whose
 * key is not in keys[0..nkeys) (cm__check_keys) and returns 1; else reports
 * "expected an object like EXAMPLE, got ..." and returns 0. */
int cm__want_object(struct cm__errs *e, json_t *v, const char *path,
                    const char *example, const char *const *keys, size_t nkeys);

/* Returns the member obj.key (borrowed from obj) when it is an array of
 * min..max entries; reports "expected EXPECT, got ..." (expect formatted as
 * printf does) and returns NULL when it is present but something else. */
json_t *cm__opt_array(struct cm__errs *e, json_t *obj, const char *parent,
                      const char *key, size_t min, size_t max,
                      const char *expect, ...)
    __attribute__((format(printf, 7, 8)));

#endif
