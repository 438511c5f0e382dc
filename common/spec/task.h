/* Internal to common/spec: the checks of a task that cm_spec_parse (spec.c)
 * shares with the task resolution in task.c, whose public half
 * (cm_task_parse, cm_spec_resolve_task, cm_task_type_name) is declared in
 * spec.h. */
#ifndef CM_SPEC_TASK_H
#define CM_SPEC_TASK_H

#include <jansson.h>

#include "errs.h"
#include "spec.h"

/* Checks a "task" object {"type": "ps"|"worker"|"chief", "index": N} and
 * stores it in *out (a chief as CM_TASK_CHIEF: cm__task_settle maps it).
 * With strict, keys other than type and index are mistakes (the spec file);
 * TF_CONFIG is shared with other tools that add their own keys, so there
 * they are ignored. Another type ("evaluator") is a mistake, unless unknown
 * is not NULL: then *unknown points to its name (inside task), out's type
 * is CM_TASK_NONE, and the caller notes it. Returns 1 when valid. */
int cm__parse_task_obj(struct cm__errs *e, json_t *task, int strict,
                       struct cm_task *out, const char **unknown);

/* Maps a task as TF_CONFIG numbers it onto psd's worker list, in which
 * Kubeflow's cluster.chief comes first: chief -> worker 0, worker i ->
 * worker nchief + i. */
void cm__task_settle(const struct cm_spec *spec, struct cm_task *t);

/* Appends a line to spec->notes (what was accepted and ignored). */
void cm__spec_note(struct cm_spec *spec, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Entries in the cluster list that task t indexes. */
int cm__task_count(const struct cm_spec *spec, const struct cm_task *t);

/* Reports "<index> out of range; cluster.<type> has N entries" under path
 * when t's index is past the end of its list. Returns 1 when in range. */
int cm__check_task_index(struct cm__errs *e, const struct cm_spec *spec,
                         const struct cm_task *t, const char *path,
                         const char *what);

#endif
