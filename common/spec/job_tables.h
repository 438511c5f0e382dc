/* Internal to common/spec: the job's embedding tables (job.tables), parsed
 * for cm__parse_job (job.c) into cm_job.tables (tabconf.h). */
#ifndef CM_SPEC_JOB_TABLES_H
#define CM_SPEC_JOB_TABLES_H

#include <jansson.h>

#include "errs.h"
#include "spec.h"

/* Parses job.tables into out->tables and out->ntables (0 when absent). */
void cm__parse_tables(struct cm__errs *e, json_t *job, struct cm_job *out);

#endif
