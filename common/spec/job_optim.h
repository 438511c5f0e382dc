/* Internal to common/spec: the job's optimizer settings, parsed for
 * cm__parse_job (job.c), and one optimizer object's parser, shared with
 * optjson.c. */
#ifndef CM_SPEC_JOB_OPTIM_H
#define CM_SPEC_JOB_OPTIM_H

#include <jansson.h>

#include "errs.h"
#include "spec.h"

/* Parses job.optimizer into out->optim.def and out->clip_norm, then
 * job.optimizer_overrides into out->optim.rules; out holds the defaults. */
void cm__parse_optimizer(struct cm__errs *e, json_t *job, struct cm_job *out);

/* Parses one optimizer object at path `parent` (job.optimizer, an entry
 * of job.optimizer_overrides, or a variable's own) onto *o, which holds what
 * it starts from: the defaults, or the job's optimizer. A "schedule"
 * replaces the one *o holds whole. clip_norm is NULL where clipping is not
 * taken (it is per job): then a "clip_norm" key is a mistake. */
void cm__parse_optim_obj(struct cm__errs *e, json_t *opt, const char *parent,
                         struct cm_optim *o, double *clip_norm);

#endif
