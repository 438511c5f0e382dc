/* Slurm's compressed lists, as its environment gives them to a job step:
 * host lists ("node[009-011],gpu[1-2]", SLURM_STEP_NODELIST) and task counts
 * per node ("2(x3),1", SLURM_STEP_TASKS_PER_NODE). Expanded in Slurm's own
 * order, never sorted: the n-th host of a list runs the n-th count's tasks.
 * Plain functions over strings, so the unit tests feed them recorded
 * values; slurm.c reads the variables. */
#ifndef CM_HOSTLIST_H
#define CM_HOSTLIST_H

#include <stddef.h>

/* Most hosts (or tasks) one list may expand to: a bound on what a typo such
 * as "n[1-99999999]" would allocate. */
#define CM_HOSTLIST_MAX 65536

/* Expands a Slurm host list: comma-separated items, each a name with any
 * number of bracketed groups of numbers and ranges ("n[01-03,07]",
 * "rack[1-2]-n[1-2]"; a group repeats its item once per number, the first
 * group outermost). A range keeps the zero padding of its lower bound
 * (node[009-011] -> node009 node010 node011). On success *hosts is an array
 * of *n strings, the array and each string the caller's to free with
 * cm_hostlist_free. Returns 0, or CM_EINVAL with what is wrong in err
 * ("unbalanced '[' at character 5", ...) and *hosts NULL. */
int cm_hostlist_expand(const char *text, char ***hosts, int *n, char *err,
                       size_t errlen);

/* Frees what cm_hostlist_expand made; NULL is fine. */
void cm_hostlist_free(char **hosts, int n);

/* Expands Slurm's tasks per node: comma-separated counts, each N or N(xR)
 * for N repeated R times ("2(x3),1" -> 2 2 2 1), every N and R >= 1. On
 * success *counts (caller frees with free()) holds *n counts. Returns 0, or
 * CM_EINVAL with what is wrong in err and *counts NULL. */
int cm_hostlist_counts(const char *text, int **counts, int *n, char *err,
                       size_t errlen);

#endif
