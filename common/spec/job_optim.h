/* Internal to common/spec: the job's optimizer settings, parsed for
 * cm__parse_job (job.c). */
#ifndef CM_SPEC_JOB_OPTIM_H
#define CM_SPEC_JOB_OPTIM_H

#include <jansson.h>

#include "errs.h"
#include "spec.h"

/* Parses job.optimizer into out->optim.def and out->clip_norm, then
 * job.optimizer_overrides into out->optim.rules; out holds the defaults. */
void cm__parse_optimizer(struct cm__errs *e, json_t *job, struct cm_job *out);

#endif
