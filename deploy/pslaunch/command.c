/* The environment a spec's job.worker_command runs in: pslaunch's own, plus
 * what tells the command which task it is and where the job is, the way
 * TensorFlow's launchers tell theirs:
 *
 *   TF_CONFIG   {"cluster": {"ps": [...], "worker": [...]},
 *                "task": {"type": "worker", "index": I}}
 *               (the spec's addresses as written)
 *   PSD_SPEC    the spec file's absolute path
 *   PSD_TASK    "worker:I"
 *   PYTHONPATH  BUILD/worker/python first, when pslaunch runs from a build
 *               tree where it exists (binaries.c), then what it was
 *   OPENBLAS_CORETYPE  the OpenBLAS kernels this CPU runs fastest (cpu.h),
 *               as psd's own programs pick them: PSD_OPENBLAS_CORETYPE
 *               when set, else SkylakeX or Haswell from CPUID when the
 *               inherited value is unset or narrower (PyTorch's OpenBLAS
 *               would otherwise fall back to its generic kernels here)
 *
 * A value pslaunch was given for any of them is replaced, never merged
 * (PYTHONPATH aside). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "err.h"
#include "pslaunch_internal.h"

extern char **environ;

/* The variables set here, which pslaunch's own values of are dropped. */
static const char *const set_here[] = {"TF_CONFIG", "PSD_SPEC", "PSD_TASK",
                                       "PYTHONPATH"};
#define NSET (sizeof set_here / sizeof set_here[0])

/* A new "NAME=VALUE" string (malloc), or NULL when out of memory. */
static char *var(const char *name, const char *value) {
  size_t n = strlen(name) + strlen(value) + 2;
  char *s = malloc(n);

  if (s)
    snprintf(s, n, "%s=%s", name, value);
  return s;
}

/* 1 when entry ("NAME=VALUE") sets name. */
static int sets(const char *entry, const char *name) {
  size_t n = strlen(name);
  return strncmp(entry, name, n) == 0 && entry[n] == '=';
}

/* TF_CONFIG for worker index: the spec's cluster and this task, as one line
 * of JSON (malloc), or NULL when out of memory. */
static char *tf_config(const struct cm_spec *spec, int index) {
  json_t *ps = json_array(), *worker = json_array(), *root = NULL;
  char *text = NULL;
  int i, bad = !ps || !worker;

  for (i = 0; !bad && i < spec->nps; i++)
    bad = json_array_append_new(ps, json_string(spec->ps[i].text)) < 0;
  for (i = 0; !bad && i < spec->nworker; i++)
    bad = json_array_append_new(worker, json_string(spec->worker[i].text)) < 0;
  if (bad)
    goto out;
  /* "o" takes over ps and worker, even when json_pack fails. */
  root = json_pack("{s:{s:o,s:o},s:{s:s,s:i}}", "cluster", "ps", ps, "worker",
                   worker, "task", "type", "worker", "index", index);
  ps = worker = NULL;
  if (root)
    text = json_dumps(root, 0);
out:
  json_decref(ps);
  json_decref(worker);
  json_decref(root);
  return text;
}

int pl_command_env(const struct pl_launch *l, const struct pl_task *t,
                   char ***env) {
  const char *old_pythonpath = getenv("PYTHONPATH");
  const char *blas = cm_cpu_blas_env(getenv("OPENBLAS_CORETYPE"),
                                     getenv("PSD_OPENBLAS_CORETYPE"));
  char **vars = NULL, *text = NULL, *pythonpath = NULL, task[32];
  size_t n = 0, cap = 0, i, k;
  int rc = CM_ENOMEM;

  *env = NULL;
  for (i = 0; environ[i]; i++)
    cap++;
  vars = calloc(cap + NSET + 2, sizeof *vars);
  if (!vars)
    goto out;
  for (i = 0; environ[i]; i++) {
    int mine = 0;
    for (k = 0; k < NSET; k++)
      mine |= sets(environ[i], set_here[k]);
    /* PYTHONPATH is only replaced when pslaunch has something to add. */
    if (mine && !(sets(environ[i], "PYTHONPATH") && !l->pythonpath[0]))
      continue;
    if (blas && sets(environ[i], "OPENBLAS_CORETYPE"))
      continue;
    if (!(vars[n++] = strdup(environ[i])))
      goto out;
  }
  snprintf(task, sizeof task, "worker:%d", t->index);
  if (!(text = tf_config(l->spec, t->index)) ||
      !(vars[n++] = var("TF_CONFIG", text)) ||
      !(vars[n++] = var("PSD_SPEC", l->spec_abs)) ||
      !(vars[n++] = var("PSD_TASK", task)) ||
      (blas && !(vars[n++] = var("OPENBLAS_CORETYPE", blas))))
    goto out;
  if (l->pythonpath[0]) {
    size_t len = strlen(l->pythonpath) +
                 (old_pythonpath ? strlen(old_pythonpath) : 0) + 2;
    if (!(pythonpath = malloc(len)))
      goto out;
    snprintf(pythonpath, len, "%s%s%s", l->pythonpath,
             old_pythonpath && *old_pythonpath ? ":" : "",
             old_pythonpath ? old_pythonpath : "");
    if (!(vars[n++] = var("PYTHONPATH", pythonpath)))
      goto out;
  }
  *env = vars;
  vars = NULL;
  rc = 0;
out:
  pl_command_env_free(vars);
  free(text);
  free(pythonpath);
  return rc;
}

void pl_command_env_free(char **env) {
  size_t i;

  if (!env)
    return;
  for (i = 0; env[i]; i++)
    free(env[i]);
  free(env);
}
