/* Finding the binaries pslaunch runs: psd for the ps tasks and dworker for
 * the workers (and psctl for --export), from --psd, --dworker and --psctl (a
 * path, or a name looked up in PATH), else beside pslaunch itself, in a build
 * tree or an installed one; or, when the spec sets job.worker_command, that
 * command's program for the workers (a name looked up in PATH, a relative path
 * relative to the spec file's directory), with the directory it runs in and the
 * build tree's Python package to put on its PYTHONPATH; and pslaunch's own
 * binary, through which each child starts. */
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

/* 1 when path is a directory. */
static int is_dir(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* The spec file's absolute path and its directory. */
static int find_spec_dir(struct pl_launch *l, char *err, size_t errlen) {
  char *slash;

  if (!realpath(l->opt->spec_path, l->spec_abs)) {
    snprintf(err, errlen, "%s: %s", l->opt->spec_path, strerror(errno));
    return CM_ENOENT;
  }
  snprintf(l->spec_dir, sizeof l->spec_dir, "%s", l->spec_abs);
  slash = strrchr(l->spec_dir, '/');
  slash[slash == l->spec_dir ? 1 : 0] = '\0'; /* "/x.json" is in "/" */
  return 0;
}

/* Under an engine (--cluster slurm:FILE, k8s:FILE, tf_config:FILE) the
 * spec exists only as derived text: it is written to a file of its own
 * (under $TMPDIR, else /tmp; removed when pslaunch ends) for PSD_SPEC, and
 * the command runs in FILE's directory (without FILE, the current one). */
static int write_derived(struct pl_launch *l, char *err, size_t errlen) {
  const char *tmp = getenv("TMPDIR"), *colon = strchr(l->opt->spec_path, ':');
  size_t n = strlen(l->derived);
  int fd;
  snprintf(l->spec_tmp, sizeof l->spec_tmp, "%s/psd-spec-%s-XXXXXX.json",
           tmp && *tmp ? tmp : "/tmp", l->spec->job.name);
  if ((fd = mkstemps(l->spec_tmp, 5)) < 0) {
    snprintf(err, errlen, "%s: cannot write the derived spec for PSD_SPEC: %s",
             l->spec_tmp, strerror(errno));
    l->spec_tmp[0] = '\0';
    return CM_EIO;
  }
  if (write(fd, l->derived, n) != (ssize_t)n || close(fd) != 0) {
    snprintf(err, errlen, "%s: cannot write the derived spec: %s", l->spec_tmp,
             strerror(errno));
    return CM_EIO;
  }
  snprintf(l->spec_abs, sizeof l->spec_abs, "%s", l->spec_tmp);
  if (colon && colon[1]) {
    if (!realpath(colon + 1, l->spec_dir)) {
      snprintf(err, errlen, "%s: %s", colon + 1, strerror(errno));
      return CM_ENOENT;
    }
    char *slash = strrchr(l->spec_dir, '/');
    slash[slash == l->spec_dir ? 1 : 0] = '\0';
  } else if (!getcwd(l->spec_dir, sizeof l->spec_dir)) {
    snprintf(err, errlen, "the current directory: %s", strerror(errno));
    return CM_EIO;
  }
  return 0;
}

/* Where the psd Python package is built, when pslaunch runs from a build
 * tree (BUILD/deploy/pslaunch, BUILD holding meson-info): BUILD/worker/python
 * if it exists; else "". An installed pslaunch adds nothing. */
static void find_pythonpath(struct pl_launch *l) {
  char cand[PATH_MAX + 32], build[PATH_MAX];
  char *slash;

  l->pythonpath[0] = '\0';
  snprintf(cand, sizeof cand, "%s", l->self);
  slash = strrchr(cand, '/');
  if (!slash)
    return;
  snprintf(slash, sizeof cand - (size_t)(slash - cand), "/..");
  if (!realpath(cand, build))
    return;
  snprintf(cand, sizeof cand, "%s/meson-info", build);
  if (!is_dir(cand))
    return;
  snprintf(cand, sizeof cand, "%s/worker/python", build);
  if (is_dir(cand) && strlen(cand) < sizeof l->pythonpath)
    snprintf(l->pythonpath, sizeof l->pythonpath, "%s", cand);
}

/* job.worker_command[0], the program each worker task runs: a name without
 * a slash is looked up in PATH, a relative path with one is relative to the
 * spec file's directory. The result is absolute, since the command runs in
 * that directory. Returns 0, or CM_ENOENT with a message in err. */
static int find_command(struct pl_launch *l, char *err, size_t errlen) {
  const char *prog = l->spec->job.worker_command[0];
  char found[PATH_MAX], cwd[PATH_MAX];
  int rc = 0;

  if (!strchr(prog, '/')) {
    if (search_path(prog, found, sizeof found) < 0) {
      snprintf(err, errlen, "%s: job.worker_command[0]: %s: not found in PATH",
               l->opt->spec_path, prog);
      return CM_ENOENT;
    }
    /* PATH may name relative directories ("", "."). */
    if (found[0] != '/' && getcwd(cwd, sizeof cwd))
      rc = snprintf(l->command, sizeof l->command, "%s/%s", cwd, found);
    else
      rc = snprintf(l->command, sizeof l->command, "%s", found);
  } else if (prog[0] == '/') {
    rc = snprintf(l->command, sizeof l->command, "%s", prog);
  } else {
    rc = snprintf(l->command, sizeof l->command, "%s/%s", l->spec_dir, prog);
  }
  if (rc < 0 || (size_t)rc >= sizeof l->command) {
    snprintf(err, errlen, "%s: job.worker_command[0]: %s: path too long",
             l->opt->spec_path, prog);
    return CM_ENOENT;
  }
  if (!is_executable(l->command)) {
    const char *why = access(l->command, F_OK) == 0 ? "not an executable file"
                                                    : strerror(errno);
    if (strcmp(prog, l->command) == 0)
      snprintf(err, errlen, "%s: job.worker_command[0]: %s: %s",
               l->opt->spec_path, prog, why);
    else
      snprintf(err, errlen, "%s: job.worker_command[0]: %s (%s): %s",
               l->opt->spec_path, prog, l->command, why);
    return CM_ENOENT;
  }
  return 0;
}

int pl_find_binaries(struct pl_launch *l, char *err, size_t errlen) {
  /* psd lives in sbin when installed, beside pslaunch's bin. */
  static const char *const psd_rel[] = {"psd", "../ps-server/psd",
                                        "../sbin/psd", NULL};
  static const char *const dworker_rel[] = {"dworker", "../worker/dworker",
                                            NULL};
  /* psctl lives in bin when installed, beside pslaunch. */
  static const char *const psctl_rel[] = {"psctl", "../ps-server/psctl", NULL};
  int rc = find_self(l->self, sizeof l->self, err, errlen);

  if (rc == 0 && l->opt->export_dir)
    rc = find_binary(l->opt->psctl, "--psctl", psctl_rel, l->self, l->psctl,
                     sizeof l->psctl, err, errlen);
  if (rc == 0 && l->nps + l->nserve > 0)
    rc = find_binary(l->opt->psd, "--psd", psd_rel, l->self, l->psd,
                     sizeof l->psd, err, errlen);
  if (rc < 0 || l->nworkers == 0)
    return rc;
  if (l->spec->job.nworker_command == 0)
    return find_binary(l->opt->dworker, "--dworker", dworker_rel, l->self,
                       l->dworker, sizeof l->dworker, err, errlen);

  if (l->opt->dworker) {
    snprintf(err, errlen,
             "--dworker %s: %s sets job.worker_command, which the workers "
             "run instead of dworker",
             l->opt->dworker, l->opt->spec_path);
    return CM_EINVAL;
  }
  rc = l->derived ? write_derived(l, err, errlen)
                  : find_spec_dir(l, err, errlen);
  if (rc == 0)
    rc = find_command(l, err, errlen);
  if (rc == 0)
    find_pythonpath(l);
  return rc;
}
