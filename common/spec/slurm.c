/* The cluster spec derived from Slurm's environment (slurm.h): what is
 * Slurm's own in the frame of resolve.h, the job file's "slurm" settings,
 * the step's layout from the environment, and each task's address. */
#include "slurm.h"

#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "errs.h"
#include "hostlist.h"
#include "jcheck.h"
#include "resolve.h"

/* The job step's layout, from the environment. */
struct layout {
  const char *nodes_var; /* the host list's variable, for messages */
  const char *tasks_var; /* the tasks per node's variable */
  char **hosts;          /* owned, nhosts names in Slurm's order */
  int nhosts;            /* entries in hosts */
  int *per_node;         /* owned, tasks on each host (nper entries) */
  int nper;              /* entries in per_node */
  int ntasks;            /* tasks in all */
  int procid;            /* SLURM_PROCID: this process's task */
  int nps;               /* the first nps tasks are shards */
  int port;              /* the first task's port on each host */
};

#define env_get cm__env_get

/* Reads variable name as an integer in [min, max] into *dst, when set.
 * Returns 1 when set and valid, 0 when unset, -1 after reporting it. */
static int env_int(struct cm__errs *e, char *const *envp, const char *name,
                   long long min, long long max, int *dst) {
  return cm__env_int(e, envp, name, min, max, 1, dst);
}

/* Checks the job file's value root: an object holding "job", "auth" and
 * "slurm", whose ps and port it takes into the layout ctx and deletes.
 * Returns 0, or -1 when root is not an object. */
static int check_file(struct cm__errs *e, json_t *root, const char *word,
                      void *ctx) {
  static const char *const keys[] = {"job", "auth", "slurm"};
  static const char *const slurm_keys[] = {"ps", "port"};
  static const char *const given[] = {"cluster", "task"};
  struct layout *L = ctx;
  char got[CM__SPEC_QUOTE_MAX];
  json_t *slurm;

  if (!json_is_object(root)) {
    cm__report(e, NULL, "expected a JSON object with \"job\", got %s",
               cm__describe(got, sizeof got, root));
    return -1;
  }
  for (size_t i = 0; i < sizeof given / sizeof given[0]; i++) {
    if (!json_object_get(root, given[i]))
      continue;
    cm__report(e, given[i],
               "not allowed with --cluster %s: Slurm's environment gives "
               "it; remove it, or name the file without \"%s:\"",
               word, word);
    json_object_del(root, given[i]);
  }
  cm__check_keys(e, root, "", keys, sizeof keys / sizeof keys[0]);
  slurm = cm__opt_object(e, root, "", "slurm",
                         "an object with \"ps\" and \"port\"");
  if (slurm) {
    cm__check_keys(e, slurm, "slurm", slurm_keys, 2);
    cm__opt_int(e, slurm, "slurm", "ps", 1, CM_HOSTLIST_MAX, &L->nps);
    cm__opt_int(e, slurm, "slurm", "port", 1, 65535, &L->port);
  }
  json_object_del(root, "slurm");
  return 0;
}

/* Expands the list in variable name into L: task counts when counts is
 * set, else hosts. Returns 0, or -1 after reporting it. */
static int read_list(struct cm__errs *e, char *const *envp, const char *name,
                     struct layout *L, int counts) {
  const char *v = env_get(envp, name);
  char why[256], q[CM__SPEC_QUOTE_MAX];
  int rc;

  if (!v && strncmp(name, "SLURM_STEP_", 11) == 0) {
    cm__report(e, NULL, "%s is not set, though SLURM_STEP_NODELIST is", name);
    return -1;
  }
  if (!v) {
    cm__report(e, NULL,
               "%s is not set: not inside a Slurm job (run under sbatch, "
               "salloc or srun)",
               name);
    return -1;
  }
  rc = counts ? cm_hostlist_counts(v, &L->per_node, &L->nper, why, sizeof why)
              : cm_hostlist_expand(v, &L->hosts, &L->nhosts, why, sizeof why);
  if (rc == CM_ENOMEM) {
    cm__report(e, NULL, "%s: out of memory", name);
    return -1;
  }
  if (rc < 0) {
    cm__report(e, NULL, "%s=%s: %s", name, cm__quote(q, sizeof q, v), why);
    return -1;
  }
  return 0;
}

/* Task k's host index and its index among that host's tasks. */
static void place(const struct layout *L, int k, int *node, int *local) {
  int n = 0;

  while (n < L->nper - 1 && k >= L->per_node[n])
    k -= L->per_node[n++];
  *node = n;
  *local = k;
}

/* Reads the step's layout from the environment into the layout ctx (whose
 * nps and port hold the file's values or the defaults). Returns 0 or -1
 * after reporting every mistake. */
static int read_layout(struct cm__errs *e, char *const *envp, void *ctx) {
  struct layout *L = ctx;
  int before = e->count, in_step, node, local, v, bad = 0;

  in_step = env_get(envp, "SLURM_STEP_NODELIST") != NULL;
  L->nodes_var = in_step                               ? "SLURM_STEP_NODELIST"
                 : env_get(envp, "SLURM_JOB_NODELIST") ? "SLURM_JOB_NODELIST"
                 : env_get(envp, "SLURM_NODELIST")     ? "SLURM_NODELIST"
                                                       : "SLURM_JOB_NODELIST";
  L->tasks_var = in_step ? "SLURM_STEP_TASKS_PER_NODE" : "SLURM_TASKS_PER_NODE";
  env_int(e, envp, "PSD_SLURM_PS", 1, CM_HOSTLIST_MAX, &L->nps);
  env_int(e, envp, "PSD_SLURM_PORT", 1, 65535, &L->port);
  bad |= read_list(e, envp, L->nodes_var, L, 0);
  bad |= read_list(e, envp, L->tasks_var, L, 1);
  if (env_int(e, envp, "SLURM_PROCID", 0, INT_MAX, &L->procid) == 0) {
    cm__report(e, NULL,
               "SLURM_PROCID is not set: not a task of a Slurm job "
               "(run under sbatch or srun)");
    bad = 1;
  }
  if (bad || e->count > before)
    return -1;
  if (L->nhosts != L->nper) {
    cm__report(e, NULL, "%s names %d host%s but %s gives %d count%s",
               L->nodes_var, L->nhosts, L->nhosts == 1 ? "" : "s", L->tasks_var,
               L->nper, L->nper == 1 ? "" : "s");
    return -1;
  }
  for (int i = 0; i < L->nper; i++)
    L->ntasks += L->per_node[i];
  if (L->ntasks > CM_HOSTLIST_MAX) {
    cm__report(e, NULL, "%s: more than %d tasks", L->tasks_var,
               CM_HOSTLIST_MAX);
    return -1;
  }
  if (L->procid >= L->ntasks)
    cm__report(e, NULL, "SLURM_PROCID=%d: out of range; %s gives %d tasks",
               L->procid, L->tasks_var, L->ntasks);
  if (L->nps >= L->ntasks)
    cm__report(e, NULL,
               "%d ps tasks (PSD_SLURM_PS or slurm.ps) leave no worker among "
               "the %d tasks %s gives; expected 1..%d",
               L->nps, L->ntasks, L->tasks_var, L->ntasks - 1);
  for (int i = 0; i < L->nper; i++)
    if (L->port + L->per_node[i] - 1 > 65535)
      cm__report(e, NULL,
                 "port %d (PSD_SLURM_PORT or slurm.port) + %d tasks on %s "
                 "passes 65535",
                 L->port, L->per_node[i], L->hosts[i]);
  if (e->count > before)
    return -1;
  /* Tasks in blocks, as srun lays them out by default: a cyclic or plane
   * distribution puts them elsewhere, and Slurm says so here. */
  place(L, L->procid, &node, &local);
  if (in_step && env_int(e, envp, "SLURM_NODEID", 0, INT_MAX, &v) > 0 &&
      v != node)
    cm__report(e, NULL,
               "SLURM_NODEID=%d but task %d of %s is on node %d: the tasks "
               "are not laid out in blocks; run srun with --distribution=block",
               v, L->procid, L->tasks_var, node);
  else if (in_step && env_int(e, envp, "SLURM_LOCALID", 0, INT_MAX, &v) > 0 &&
           v != local)
    cm__report(e, NULL,
               "SLURM_LOCALID=%d but task %d of %s is task %d on its node: the "
               "tasks are not laid out in blocks; run srun with "
               "--distribution=block",
               v, L->procid, L->tasks_var, local);
  return e->count > before ? -1 : 0;
}

/* Makes the spec document: the cluster from the layout ctx, the task,
 * then the job file's settings. Returns a new reference or NULL when out of
 * memory. */
static json_t *make_doc(void *ctx, json_t *settings) {
  const struct layout *L = ctx;
  json_t *ps = json_array(), *worker = json_array();
  int k = 0;

  for (int n = 0; n < L->nper; n++)
    for (int j = 0; j < L->per_node[n]; j++, k++)
      cm__spec_add(k < L->nps ? &ps : &worker, "%s:%d", L->hosts[n],
                   L->port + j);
  return cm__spec_doc(ps, worker, L->procid < L->nps ? "ps" : "worker",
                      L->procid < L->nps ? L->procid : L->procid - L->nps,
                      settings);
}

int cm_slurm_spec(const char *file, char *const *envp, struct cm_spec **out,
                  char **json, char *err, size_t errlen) {
  static const struct cm__resolver slurm = {
      .word = "slurm",
      .check_file = check_file,
      .read_env = read_layout,
      .make_doc = make_doc,
  };
  struct layout L = {.nps = CM_SLURM_DEFAULT_PS, .port = CM_SLURM_DEFAULT_PORT};
  int rc = cm__resolve(&slurm, &L, file, envp, out, json, err, errlen);

  cm_hostlist_free(L.hosts, L.nhosts);
  free(L.per_node);
  return rc;
}
