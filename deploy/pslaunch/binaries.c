/* Finding the binaries pslaunch runs: psd for the ps tasks and dworker for
 * the workers, from --psd and --dworker (a path, or a name looked up in
 * PATH), else beside pslaunch itself, in a build tree or an installed
 * one; and pslaunch's own binary, through which each child starts. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "err.h"
#include "pslaunch_internal.h"

/* 1 when path is a regular file this process may execute. */
static int is_executable(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

/* Looks a name without a slash up in PATH, as execvp would. Returns 0 and
 * the full path in out, or CM_ENOENT. */
static int search_path(const char *name, char *out, size_t outlen) {
  const char *path = getenv("PATH");
  const char *p = path ? path : "/usr/local/bin:/usr/bin:/bin";

  while (*p) {
    const char *colon = strchr(p, ':');
    int n = colon ? (int)(colon - p) : (int)strlen(p);
    if (snprintf(out, outlen, "%.*s/%s", n ? n : 1, n ? p : ".", name) <
            (int)outlen &&
        is_executable(out))
      return 0;
    p += n + (colon ? 1 : 0);
  }
  return CM_ENOENT;
}

/* Settles which binary runs a kind of task: the path given on the command
 * line (option names it, e.g. "--psd"), or the first of rel[] (relative to
 * the directory holding pslaunch itself, whose path is self) that exists.
 * out must hold PATH_MAX bytes (realpath writes it). Returns 0, or CM_ENOENT
 * with a message in err. */
static int find_binary(const char *given, const char *option,
                       const char *const *rel, const char *self_path, char *out,
                       size_t outlen, char *err, size_t errlen) {
  char self[PATH_MAX], cand[PATH_MAX], tried[2 * PATH_MAX] = "";
  char *slash;
  int i, rc = CM_ENOENT;

  if (given) {
    if (!strchr(given, '/')) {
      rc = search_path(given, out, outlen);
      if (rc < 0)
        snprintf(err, errlen, "%s %s: not found in PATH", option, given);
      goto out;
    }
    if (!is_executable(given)) {
      snprintf(err, errlen, "%s %s: %s", option, given,
               access(given, F_OK) == 0 ? "not an executable file"
                                        : strerror(errno));
      goto out;
    }
    snprintf(out, outlen, "%s", given);
    rc = 0;
    goto out;
  }
  snprintf(self, sizeof self, "%s", self_path);
  slash = strrchr(self, '/');
  if (slash)
    *slash = '\0';
  for (i = 0; rel[i]; i++) {
    size_t used = strlen(tried);
    if (snprintf(cand, sizeof cand, "%s/%s", self, rel[i]) >= (int)sizeof cand)
      continue;
    if (is_executable(cand) && realpath(cand, out)) {
      rc = 0;
      goto out;
    }
    if (snprintf(tried + used, sizeof tried - used, "%s%s", i ? ", " : "",
                 cand) < 0)
      break;
  }
  snprintf(err, errlen, "%s not found (tried %s); give its path with %s PATH",
           strrchr(rel[0], '/') ? strrchr(rel[0], '/') + 1 : rel[0], tried,
           option);
out:
  return rc;
}

/* pslaunch's own binary, which each child runs first (exec_task.c), and
 * beside which psd and dworker are looked for. Returns 0, or CM_ENOENT with
 * a message in err. */
static int find_self(char *out, size_t outlen, char *err, size_t errlen) {
  ssize_t n = readlink("/proc/self/exe", out, outlen - 1);

  if (n < 0) {
    snprintf(err, errlen,
             "cannot find pslaunch's own binary: /proc/self/exe: %s",
             strerror(errno));
    return CM_ENOENT;
  }
  out[n] = '\0';
  return 0;
}

int pl_find_binaries(struct pl_launch *l, char *err, size_t errlen) {
  /* psd lives in sbin when installed, beside pslaunch's bin. */
  static const char *const psd_rel[] = {"psd", "../ps-server/psd",
                                        "../sbin/psd", NULL};
  static const char *const dworker_rel[] = {"dworker", "../worker/dworker",
                                            NULL};
  int rc = find_self(l->self, sizeof l->self, err, errlen);

  if (rc == 0 && l->nps > 0)
    rc = find_binary(l->opt->psd, "--psd", psd_rel, l->self, l->psd,
                     sizeof l->psd, err, errlen);
  if (rc == 0 && l->nworkers > 0)
    rc = find_binary(l->opt->dworker, "--dworker", dworker_rel, l->self,
                     l->dworker, sizeof l->dworker, err, errlen);
  return rc;
}
