/* One optimizer as JSON text, in the form of the spec's job.optimizer
 * ({"type": "adam", "lr": 0.001, ...}): read with the spec's own checks and
 * messages, and written back so that reading it gives the same optimizer.
 * For a variable that names its own optimizer (VarSpec.optimizer) and for
 * checkpoints that must keep it. */
#ifndef CM_OPTJSON_H
#define CM_OPTJSON_H

#include <stddef.h>

#include "optconf.h"

/* Longest text cm_optim_to_json writes, NUL included. */
#define CM_OPTIM_JSON_MAX 512

/* Parses the JSON object text[0..len) into *out, starting from the
 * defaults job.optimizer has (cm_optim_defaults), with every key and check
 * of job.optimizer except clip_norm (per job, refused here). Returns 0; or
 * CM_ESPEC with every mistake in err, one per line, each at its JSON path
 * under "optimizer" (e.g. "optimizer.lr: expected a positive number, got
 * -1", "optimizer:1:9: JSON syntax error: ..."); or CM_ENOMEM. *out is
 * written only on success. err may be NULL (errlen 0). */
int cm_optim_from_json(const char *text, size_t len, struct cm_optim *out,
                       char *err, size_t errlen);

/* Writes o as a JSON object that cm_optim_from_json reads back as o: every
 * hyper-parameter, each number in the fewest digits that give it back
 * exactly, and the schedule's keys of its type. Returns 0, or CM_ERANGE
 * when buf is too small (CM_OPTIM_JSON_MAX always suffices). */
int cm_optim_to_json(const struct cm_optim *o, char *buf, size_t len);

#endif
