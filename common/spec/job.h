/* Internal to common/spec: the "job" and "auth" objects of a spec, parsed
 * for cm_spec_parse (spec.c) into struct cm_job and struct cm_auth
 * (spec.h). */
#ifndef CM_SPEC_JOB_H
#define CM_SPEC_JOB_H

#include <jansson.h>

#include "errs.h"
#include "spec.h"

/* Fills *job with every default, before the spec is read. */
void cm__job_defaults(struct cm_job *job);

/* Parses "job" into *out, which holds the defaults; nworker is the size of
 * cluster.worker, which bounds job.sync.replicas_to_aggregate. */
void cm__parse_job(struct cm__errs *e, json_t *root, int nworker,
                   struct cm_job *out);

/* Parses "auth": a token file and/or TLS material. Inline secrets are
 * refused: a spec is copied around and printed, a token file is not. */
void cm__parse_auth(struct cm__errs *e, json_t *root, struct cm_auth *out);

/* Parses "job.metrics_listen" into spec->metrics (job_metrics.c); needs
 * spec->nps. Returns 0 or CM_ENOMEM; mistakes go to e. */
int cm__parse_metrics(struct cm__errs *e, json_t *root, struct cm_spec *spec);

#endif
