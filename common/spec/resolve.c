/* The frame of every cluster resolver (resolve.h): the job file read and
 * checked, the environment read, the spec document laid out and parsed as
 * any spec file is, every mistake collected in one err buffer. slurm.c and
 * k8s.c supply the steps that are their own. */
#include "resolve.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "jcheck.h"
#include "load.h"

extern char **environ;

/* Reads the job file into a JSON object ({} without a file) and has the
 * engine check it. Returns a new reference, or NULL with *rc set: CM_ESPEC
 * after reporting, or what cm__spec_read or cm__load_json returned. */
static json_t *read_file(const struct cm__resolver *r, void *ctx,
                         struct cm__errs *e, const char *file, char *err,
                         size_t errlen, int *rc) {
  char *text = NULL;
  size_t len = 0;
  json_t *root;

  if (!file)
    return json_object();
  if ((*rc = cm__spec_read(file, &text, &len, err, errlen)) < 0)
    return NULL;
  /* cm__spec_read wrote nothing on success: keep collecting after it. */
  root = cm__load_json(e, text, len, rc);
  free(text);
  if (root && r->check_file(e, root, r->word, ctx) < 0) {
    json_decref(root);
    *rc = CM_ESPEC;
    return NULL;
  }
  return root;
}

/* The last step: dumps the document doc, parses it as any spec file is
 * (its relative paths relative to FILE's directory), and on success hands
 * its text (or r->text's) to *json when json is not NULL. Returns 0,
 * CM_ENOMEM, or what the parse returns. */
static int parse_doc(const struct cm__resolver *r, json_t *doc,
                     json_t *settings, const char *file, struct cm_spec **out,
                     char **json, char *err, size_t errlen) {
  char *text = json_dumps(doc, CM__SPEC_DUMP_FLAGS), source[512];
  const char *named = file ? file : r->word;
  int rc;

  if (!text)
    return CM_ENOMEM;
  if (r->env) {
    snprintf(source, sizeof source, "%s%s%.400s", r->env, file ? " with " : "",
             file ? file : "");
    named = source;
  }
  rc = cm__spec_parse_at(text, strlen(text), named, file, out, err, errlen);
  if (rc == 0 && json && r->text) {
    free(text);
    text = r->text(*out, settings);
    if (!text) {
      cm_spec_free(*out);
      *out = NULL;
      rc = CM_ENOMEM;
    }
  }
  if (rc == 0 && json) {
    *json = text;
    text = NULL;
  }
  free(text);
  return rc;
}

int cm__resolve(const struct cm__resolver *r, void *ctx, const char *file,
                char *const *envp, struct cm_spec **out, char **json, char *err,
                size_t errlen) {
  struct cm__errs e;
  json_t *settings = NULL, *doc = NULL;
  int rc = 0;

  if (out)
    *out = NULL;
  if (json)
    *json = NULL;
  if (!envp)
    envp = environ;
  cm__errs_init(&e, file, err, errlen);
  settings = read_file(r, ctx, &e, file, err, errlen, &rc);
  if (!settings && rc != CM_ESPEC) {
    /* cm__spec_read wrote err itself (a missing or unreadable file). */
    e.buf = NULL;
    if (rc == 0)
      rc = CM_ENOMEM;
    goto out;
  }
  e.source = r->env; /* NULL: each mistake names its variable */
  if (r->read_env(&e, envp, ctx) < 0 || e.count > 0 || !settings) {
    rc = CM_ESPEC;
    goto out;
  }
  if (!(doc = r->make_doc(ctx, settings))) {
    rc = CM_ENOMEM;
    goto out;
  }
  cm__errs_finish(&e);
  e.buf = NULL;
  rc = parse_doc(r, doc, settings, file, out, json, err, errlen);
out:
  cm__errs_finish(&e);
  json_decref(doc);
  json_decref(settings);
  return rc;
}

int cm__spec_settings(json_t *doc, json_t *file) {
  json_t *v;

  if ((v = json_object_get(file, "job")) && json_object_set(doc, "job", v) < 0)
    return -1;
  if ((v = json_object_get(file, "auth")) &&
      json_object_set(doc, "auth", v) < 0)
    return -1;
  return 0;
}

json_t *cm__spec_doc(json_t *ps, json_t *worker, const char *type, int index,
                     json_t *file) {
  json_t *doc = NULL;

  if (ps && worker)
    doc = json_pack("{s:{s:O, s:O}}", "cluster", "ps", ps, "worker", worker);
  if (doc && type &&
      json_object_set_new(
          doc, "task", json_pack("{s:s, s:i}", "type", type, "index", index)) <
          0)
    goto fail;
  if (doc && cm__spec_settings(doc, file) < 0)
    goto fail;
  json_decref(ps);
  json_decref(worker);
  return doc;
fail:
  json_decref(doc);
  json_decref(ps);
  json_decref(worker);
  return NULL;
}

void cm__spec_add(json_t **arr, const char *fmt, ...) {
  char addr[600];
  va_list ap;

  if (!*arr)
    return;
  va_start(ap, fmt);
  vsnprintf(addr, sizeof addr, fmt, ap);
  va_end(ap);
  if (json_array_append_new(*arr, json_string(addr)) < 0) {
    json_decref(*arr);
    *arr = NULL;
  }
}

const char *cm__env_get(char *const *envp, const char *name) {
  size_t n = strlen(name);

  for (; envp && *envp; envp++)
    if (strncmp(*envp, name, n) == 0 && (*envp)[n] == '=')
      return *envp + n + 1;
  return NULL;
}

int cm__env_int(struct cm__errs *e, char *const *envp, const char *name,
                long long min, long long max, int quote, int *dst) {
  const char *v = cm__env_get(envp, name);
  char q[CM__SPEC_QUOTE_MAX], *end;
  long long x;

  if (!v)
    return 0;
  errno = 0;
  x = strtoll(v, &end, 10);
  if (errno || end == v || *end || x < min || x > max) {
    cm__report(e, NULL, "%s=%s: expected an integer in %lld..%lld", name,
               quote ? cm__quote(q, sizeof q, v) : v, min, max);
    return -1;
  }
  *dst = (int)x;
  return 1;
}
