/* Internal to common/spec: the job's embedding tables (job.tables) and the
 * model that needs them (job.ctr), parsed for cm__parse_job (job.c). */
#ifndef CM_SPEC_JOB_TABLES_H
#define CM_SPEC_JOB_TABLES_H

#include <jansson.h>

#include "errs.h"
#include "spec.h"

/* Parses job.tables into out->tables and out->ntables (0 when absent). */
void cm__parse_tables(struct cm__errs *e, json_t *job, struct cm_job *out);

/* Parses job.ctr into out->ctr (defaults when absent; a mistake when given
 * with another model). job_ctr.c. */
void cm__parse_ctr(struct cm__errs *e, json_t *job, struct cm_job *out);

/* Parses job.publish: where and how often training shards publish for
 * serving (defaults when absent). job_publish.c. */
void cm__parse_publish(struct cm__errs *e, json_t *job, struct cm_job *out);

#endif
