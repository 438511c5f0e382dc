/* A cluster spec derived from Slurm's environment (--cluster slurm[:FILE]),
 * as TensorFlow's SlurmClusterResolver does: every task of the job step is
 * one task of the cluster, in SLURM_PROCID order; the first P are shards
 * (ps), the rest workers. The hosts come from SLURM_STEP_NODELIST and the
 * tasks on each from SLURM_STEP_TASKS_PER_NODE (outside a step:
 * SLURM_JOB_NODELIST and SLURM_TASKS_PER_NODE), in Slurm's order: tasks
 * are laid out in blocks, the first node's tasks first (srun's default);
 * SLURM_NODEID and SLURM_LOCALID, when set, must agree. Task k, the j-th
 * task on its host, gets the address host:(PORT + j).
 *
 * The job's settings come from FILE, which holds "job", "auth" and, for the
 * layout, "slurm": {"ps": P, "port": PORT} (defaults 1 and 7100); the
 * environment variables PSD_SLURM_PS and PSD_SLURM_PORT override those.
 * Without FILE every job setting takes its default. docs/slurm.md says
 * more; hostlist.c expands Slurm's lists. */
#ifndef CM_SLURM_H
#define CM_SLURM_H

#include <stddef.h>

#include "spec.h"

#define CM_SLURM_DEFAULT_PS 1      /* shards when neither FILE nor env say */
#define CM_SLURM_DEFAULT_PORT 7100 /* the first task's port on each host */

/* Derives the spec from the environment envp (NULL-terminated "NAME=VALUE"
 * strings; NULL for this process's own) and the job file `file` (NULL for
 * none): the cluster, "task" from SLURM_PROCID, and FILE's job and auth,
 * whose relative paths are relative to FILE's directory. Checked as
 * cm_spec_parse checks a file. On success stores the spec in *out (free
 * with cm_spec_free) and, when json is not NULL, the derived spec as
 * indented JSON text in *json (free with free()), a spec file any program
 * can read. Returns 0, or CM_ESPEC (CM_ENOENT, CM_EIO for an unreadable
 * FILE) with every mistake in err, one per line: a variable's ("psd:
 * SLURM_STEP_TASKS_PER_NODE=\"2(x3\": expected ')' at character 5") or
 * FILE's ("job.json: cluster: not allowed with --cluster slurm; ..."). */
int cm_slurm_spec(const char *file, char *const *envp, struct cm_spec **out,
                  char **json, char *err, size_t errlen);

#endif
