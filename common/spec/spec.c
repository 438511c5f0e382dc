/* The cluster spec's entry points (spec.h): cm_spec_parse checks a
 * TF_CONFIG-shaped JSON text whole, reporting every mistake (file, JSON
 * path, what was expected) instead of stopping at the first one;
 * cm_spec_load reads the file and makes the paths it names relative to its
 * directory. The parts of a spec are parsed by addr.c (cluster), task.c
 * (task), job.c and job_optim.c (job, auth), job_metrics.c
 * (job.metrics_listen); errs.c collects the mistakes. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* realpath under -std=c11 */
#endif

#include "spec.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "addr.h"
#include "err.h"
#include "errs.h"
#include "jcheck.h"
#include "job.h"
#include "k8s.h"
#include "load.h"
#include "slurm.h"
#include "task.h"

#define SPEC_FILE_MAX (16u << 20) /* largest spec file read */

int cm_spec_parse(const char *json, size_t len, const char *source,
                  struct cm_spec **out, char *err, size_t errlen) {
  /* "environment" is Kubeflow's TF_CONFIG ("cloud"): accepted, unused. */
  static const char *const keys[] = {"cluster", "task", "job", "auth",
                                     "environment"};
  char got[CM__SPEC_QUOTE_MAX];
  struct cm__errs e;
  struct cm_spec *spec = NULL;
  json_t *root = NULL, *task;
  int rc = 0;

  if (!source)
    source = "<spec>";
  cm__errs_init(&e, source, err, errlen);
  if (out)
    *out = NULL;
  if (!json || !out) {
    cm__report(&e, NULL, "no spec text given");
    rc = CM_EINVAL;
    goto out;
  }
  spec = calloc(1, sizeof *spec);
  if (!spec) {
    rc = CM_ENOMEM;
    goto out;
  }
  snprintf(spec->source, sizeof spec->source, "%s", source);
  cm__job_defaults(&spec->job);

  root = cm__load_json(&e, json, len, &rc);
  if (!root)
    goto out;
  if (!json_is_object(root)) {
    cm__report(
        &e, NULL,
        "expected a JSON object with \"cluster\" at the top level, got %s",
        cm__describe(got, sizeof got, root));
    rc = CM_ESPEC;
    goto out;
  }
  cm__check_keys(&e, root, "", keys, sizeof keys / sizeof keys[0]);
  rc = cm__parse_cluster(&e, root, spec);
  if (rc < 0)
    goto out;
  task = json_object_get(root, "task");
  if (task) {
    const char *unknown = NULL;
    if (cm__parse_task_obj(&e, task, 1, &spec->task, &unknown)) {
      cm__task_settle(spec, &spec->task);
      if (unknown)
        cm__spec_note(spec,
                      "%s: task.type \"%.64s\" is not a psd task (ps, worker, "
                      "serve or chief): this spec names no task",
                      source, unknown);
      else if (cm__task_count(spec, &spec->task) > 0)
        cm__check_task_index(&e, spec, &spec->task, "task.index", "");
    }
  }
  cm__parse_job(&e, root, spec->nworker, &spec->job);
  if (spec->job.shards > spec->nps)
    cm__report(&e, "job.shards",
               "%d shards, but cluster.ps lists %d addresses; expected 1..%d",
               spec->job.shards, spec->nps, spec->nps);
  cm__parse_auth(&e, root, &spec->auth);
  if ((rc = cm__parse_metrics(&e, root, spec)) < 0)
    goto out;
  if (e.count > 0) {
    rc = CM_ESPEC;
    goto out;
  }
  *out = spec;
  spec = NULL;
out:
  cm__errs_finish(&e);
  json_decref(root);
  cm_spec_free(spec);
  return rc;
}

/* Makes the path in dst[0..cap) (the spec key `key`) relative to the
 * directory `base` when it is relative, so that every program finds the
 * same file whatever its working directory. */
static void resolve_path(struct cm__errs *e, const char *base, const char *key,
                         char *dst, size_t cap) {
  char joined[PATH_MAX + 1100], q[CM__SPEC_QUOTE_MAX];
  int n;

  if (!dst[0] || dst[0] == '/')
    return;
  n = snprintf(joined, sizeof joined, "%s/%s", base, dst);
  if (n < 0 || (size_t)n >= cap) {
    cm__report(e, key,
               "%s relative to the spec's directory is %d characters long; "
               "expected at most %zu",
               cm__quote(q, sizeof q, dst), n, cap - 1);
    return;
  }
  memcpy(dst, joined, (size_t)n + 1);
}

/* Resolves every path the spec names against the spec file's directory
 * (absolute when that directory exists). Returns 0 or CM_ESPEC. */
static int resolve_paths(struct cm_spec *spec, const char *path, char *err,
                         size_t errlen) {
  struct cm_auth *a = &spec->auth;
  struct {
    const char *key; /* spec key, for messages */
    char *dst;       /* the path, rewritten in place */
    size_t cap;      /* its buffer */
  } paths[] = {
      {"job.checkpoint.dir", spec->job.ckpt_dir, sizeof spec->job.ckpt_dir},
      {"job.publish.dir", spec->job.publish_dir, sizeof spec->job.publish_dir},
      {"job.tensorboard_dir", spec->job.tensorboard_dir,
       sizeof spec->job.tensorboard_dir},
      {"auth.token_file", a->token_file, sizeof a->token_file},
      {"auth.tls.ca", a->ca, sizeof a->ca},
      {"auth.tls.cert", a->cert, sizeof a->cert},
      {"auth.tls.key", a->key, sizeof a->key},
      {"auth.tls.client_cert", a->client_cert, sizeof a->client_cert},
      {"auth.tls.client_key", a->client_key, sizeof a->client_key},
  };
  char base[PATH_MAX], *abs;
  const char *slash = strrchr(path, '/');
  struct cm__errs e;

  if (!slash)
    snprintf(base, sizeof base, ".");
  else
    snprintf(base, sizeof base, "%.*s", slash == path ? 1 : (int)(slash - path),
             path);
  if ((abs = realpath(base, NULL))) {
    snprintf(base, sizeof base, "%s", abs);
    free(abs);
  }
  cm__errs_init(&e, path, err, errlen);
  for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++)
    resolve_path(&e, base, paths[i].key, paths[i].dst, paths[i].cap);
  cm__errs_finish(&e);
  return e.count ? CM_ESPEC : 0;
}

int cm__spec_read(const char *path, char **text, size_t *len, char *err,
                  size_t errlen) {
  struct cm__errs e;
  FILE *f = NULL;
  char *buf = NULL, *grown;
  size_t n = 0, cap = 0, got;
  int rc = 0;

  cm__errs_init(&e, path, err, errlen);
  *text = NULL;
  *len = 0;
  f = fopen(path, "rb");
  if (!f) {
    rc = errno == ENOENT ? CM_ENOENT : CM_EIO;
    cm__report(&e, NULL, "%s", strerror(errno));
    goto out;
  }
  for (;;) {
    if (n == cap) {
      if (cap >= SPEC_FILE_MAX) {
        cm__report(&e, NULL,
                   "larger than %u MiB; a cluster spec is much smaller",
                   SPEC_FILE_MAX >> 20);
        rc = CM_ESPEC;
        goto out;
      }
      cap = cap ? cap * 2 : 4096;
      grown = realloc(buf, cap);
      if (!grown) {
        rc = CM_ENOMEM;
        goto out;
      }
      buf = grown;
    }
    got = fread(buf + n, 1, cap - n, f);
    n += got;
    if (got == 0) {
      if (ferror(f)) {
        cm__report(&e, NULL, "%s", strerror(errno)); /* e.g. Is a directory */
        rc = CM_EIO;
        goto out;
      }
      break;
    }
  }
  *text = buf;
  *len = n;
  buf = NULL;
out:
  cm__errs_finish(&e);
  if (f)
    fclose(f);
  free(buf);
  return rc;
}

int cm__spec_parse_at(const char *json, size_t len, const char *source,
                      const char *path, struct cm_spec **out, char *err,
                      size_t errlen) {
  int rc = cm_spec_parse(json, len, source, out, err, errlen);

  if (rc == 0 && path && (rc = resolve_paths(*out, path, err, errlen)) < 0) {
    cm_spec_free(*out);
    *out = NULL;
  }
  return rc;
}

int cm_spec_load(const char *path, struct cm_spec **out, char *err,
                 size_t errlen) {
  struct cm__errs e;
  char *text = NULL;
  size_t len = 0;
  int rc;

  if (out)
    *out = NULL;
  if (!path || !out) {
    cm__errs_init(&e, NULL, err, errlen);
    cm__report(&e, NULL, "no spec path given");
    cm__errs_finish(&e);
    return CM_EINVAL;
  }
  rc = cm__spec_read(path, &text, &len, err, errlen);
  if (rc == 0)
    rc = cm__spec_parse_at(text, len, path, path, out, err, errlen);
  free(text);
  return rc;
}

/* 1 when the --cluster argument cluster is WORD or WORD:FILE, with *file
 * FILE (NULL for none); 0 otherwise. */
static int names_engine(const char *cluster, const char *word,
                        const char **file) {
  size_t n = strlen(word);

  if (!cluster || strncmp(cluster, word, n) != 0 ||
      (cluster[n] != '\0' && cluster[n] != ':'))
    return 0;
  *file = cluster[n] && cluster[n + 1] ? cluster + n + 1 : NULL;
  return 1;
}

int cm_spec_is_slurm(const char *cluster) {
  const char *file;

  return names_engine(cluster, "slurm", &file);
}

int cm_spec_is_engine(const char *cluster) {
  const char *file;

  return names_engine(cluster, "slurm", &file) ||
         names_engine(cluster, "k8s", &file) ||
         names_engine(cluster, "tf_config", &file);
}

void cm_spec_say_notes(const struct cm_spec *spec, const char *prog) {
  const char *p = spec ? spec->notes : "";
  while (*p) {
    size_t n = strcspn(p, "\n");
    fprintf(stderr, "%s: note: %.*s\n", prog, (int)n, p);
    p += n + (p[n] == '\n');
  }
}

int cm_spec_open(const char *cluster, struct cm_spec **out, char **json,
                 char *err, size_t errlen) {
  const char *file;
  char *text = NULL, *z = NULL;
  size_t len = 0;
  int rc;

  if (json)
    *json = NULL;
  if (names_engine(cluster, "tf_config", &file))
    return cm_tf_config_spec(file, NULL, out, json, err, errlen);
  if (names_engine(cluster, "k8s", &file))
    return cm_k8s_spec(file, NULL, out, json, err, errlen);
  if (names_engine(cluster, "slurm", &file))
    return cm_slurm_spec(file, NULL, out, json, err, errlen);
  rc = cm_spec_load(cluster, out, err, errlen);
  if (rc < 0 || !json)
    return rc;
  rc = cm__spec_read(cluster, &text, &len, err, errlen);
  if (rc == 0 && !(z = realloc(text, len + 1)))
    rc = CM_ENOMEM;
  if (rc < 0) {
    free(text);
    cm_spec_free(*out);
    *out = NULL;
    return rc;
  }
  z[len] = '\0';
  *json = z;
  return 0;
}

void cm_spec_free(struct cm_spec *spec) {
  if (!spec)
    return;
  free(spec->ps);
  free(spec->worker);
  free(spec->serve);
  free(spec->metrics);
  free(spec);
}
