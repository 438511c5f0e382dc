/* Which task this process is (spec.h, task.h): the spec's "task" object,
 * --task TYPE:INDEX, and TF_CONFIG's "task", settled in that precedence
 * (--task, then the spec, then TF_CONFIG) and checked against the spec's
 * cluster. */
#include "task.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "jcheck.h"

int cm__parse_task_obj(struct cm__errs *e, json_t *task, int strict,
                       struct cm_task *out, const char **unknown) {
  static const char *const keys[] = {"type", "index"};
  char got[CM__SPEC_QUOTE_MAX];
  json_t *type, *index;
  struct cm_task t = {CM_TASK_NONE, 0};
  long long x;
  int ok = 1;

  if (!json_is_object(task)) {
    cm__report(
        e, "task",
        "expected an object like {\"type\": \"worker\", \"index\": 0}, got "
        "%s",
        cm__describe(got, sizeof got, task));
    return 0;
  }
  if (strict) {
    int before = e->count;
    cm__check_keys(e, task, "task", keys, sizeof keys / sizeof keys[0]);
    ok = e->count == before;
  }
  type = json_object_get(task, "type");
  if (!type) {
    cm__report(e, "task.type",
               "missing; expected \"ps\", \"worker\" or \"serve\"");
    ok = 0;
  } else if (json_is_string(type) &&
             strcmp(json_string_value(type), "ps") == 0) {
    t.type = CM_TASK_PS;
  } else if (json_is_string(type) &&
             strcmp(json_string_value(type), "worker") == 0) {
    t.type = CM_TASK_WORKER;
  } else if (json_is_string(type) &&
             strcmp(json_string_value(type), "serve") == 0) {
    t.type = CM_TASK_SERVE;
  } else if (json_is_string(type) &&
             strcmp(json_string_value(type), "chief") == 0) {
    t.type = CM_TASK_CHIEF; /* Kubeflow's: settled to worker 0 */
  } else if (json_is_string(type) && unknown) {
    /* Kubeflow's "evaluator", or a type of some other engine: not a psd
     * task, noted by the caller rather than refused. */
    *unknown = json_string_value(type);
    t.type = CM_TASK_NONE;
  } else {
    cm__report(e, "task.type",
               "expected \"ps\", \"worker\" or \"serve\", got %s",
               cm__describe(got, sizeof got, type));
    ok = 0;
  }
  index = json_object_get(task, "index");
  if (!index) {
    cm__report(e, "task.index", "missing; expected a non-negative integer");
    ok = 0;
  } else if (cm__want_int(e, index, "task.index", 0, INT_MAX, &x)) {
    t.index = (int)x;
  } else {
    ok = 0;
  }
  if (ok)
    *out = t;
  return ok;
}

void cm__task_settle(const struct cm_spec *spec, struct cm_task *t) {
  if (t->type == CM_TASK_CHIEF) {
    t->type = CM_TASK_WORKER;
    t->index = 0; /* the chief is worker 0 */
  } else if (t->type == CM_TASK_WORKER && t->index <= INT_MAX - spec->nchief) {
    t->index += spec->nchief;
  }
}

void cm__spec_note(struct cm_spec *spec, const char *fmt, ...) {
  size_t at = strlen(spec->notes);
  va_list ap;
  if (at + 2 >= sizeof spec->notes)
    return;
  va_start(ap, fmt);
  vsnprintf(spec->notes + at, sizeof spec->notes - at, fmt, ap);
  va_end(ap);
  at = strlen(spec->notes);
  if (at + 1 < sizeof spec->notes) {
    spec->notes[at] = '\n';
    spec->notes[at + 1] = '\0';
  }
}

int cm__task_count(const struct cm_spec *spec, const struct cm_task *t) {
  if (t->type == CM_TASK_SERVE)
    return spec->nserve;
  return t->type == CM_TASK_PS ? spec->nps : spec->nworker;
}

int cm__check_task_index(struct cm__errs *e, const struct cm_spec *spec,
                         const struct cm_task *t, const char *path,
                         const char *what) {
  int n = cm__task_count(spec, t);

  if (t->index < n)
    return 1;
  cm__report(e, path, "%s%d out of range; cluster.%s has %d entr%s", what,
             t->index, cm_task_type_name(t->type), n, n == 1 ? "y" : "ies");
  return 0;
}

int cm_task_parse(const char *text, struct cm_task *out, char *err,
                  size_t errlen) {
  char q[CM__SPEC_QUOTE_MAX], qi[CM__SPEC_QUOTE_MAX],
      prefix[CM__SPEC_QUOTE_MAX + 16];
  struct cm__errs e;
  struct cm_task t = {CM_TASK_NONE, 0};
  const char *colon, *p;
  long long x = 0;
  size_t tlen;
  int rc = 0;

  cm__errs_init(&e, NULL, err, errlen);
  if (!text || !out) {
    cm__report(&e, NULL, "--task: missing; expected TYPE:INDEX, e.g. worker:0");
    rc = CM_EINVAL;
    goto out;
  }
  snprintf(prefix, sizeof prefix, "--task %s", cm__quote(q, sizeof q, text));
  e.source = prefix;
  colon = strchr(text, ':');
  if (!colon) {
    cm__report(&e, NULL, "expected TYPE:INDEX, e.g. worker:0");
    rc = CM_EINVAL;
    goto out;
  }
  tlen = (size_t)(colon - text);
  if (tlen == 2 && strncmp(text, "ps", 2) == 0) {
    t.type = CM_TASK_PS;
  } else if (tlen == 6 && strncmp(text, "worker", 6) == 0) {
    t.type = CM_TASK_WORKER;
  } else if (tlen == 5 && strncmp(text, "serve", 5) == 0) {
    t.type = CM_TASK_SERVE;
  } else if (tlen == 5 && strncmp(text, "chief", 5) == 0) {
    t.type = CM_TASK_WORKER; /* Kubeflow's chief is worker 0 */
    if (strcmp(colon + 1, "0") != 0) {
      cm__report(&e, NULL, "index %s; a job has one chief, chief:0",
                 cm__quote(qi, sizeof qi, colon + 1));
      rc = CM_EINVAL;
      goto out;
    }
  } else {
    char type[CM__SPEC_QUOTE_MAX];
    snprintf(type, sizeof type, "%.*s", tlen < 64 ? (int)tlen : 64, text);
    cm__report(&e, NULL, "unknown type %s; expected ps, worker, serve or chief",
               cm__quote(qi, sizeof qi, type));
    rc = CM_EINVAL;
    goto out;
  }
  p = colon + 1;
  if (*p == '\0' || strspn(p, "0123456789") != strlen(p)) {
    cm__report(&e, NULL, "index %s is not a non-negative integer",
               cm__quote(qi, sizeof qi, p));
    rc = CM_EINVAL;
    goto out;
  }
  for (; *p; p++) {
    x = x * 10 + (*p - '0');
    if (x > INT_MAX) {
      cm__report(&e, NULL, "index out of range; expected at most %d", INT_MAX);
      rc = CM_EINVAL;
      goto out;
    }
  }
  t.index = (int)x;
  *out = t;
out:
  cm__errs_finish(&e);
  return rc;
}

/* Takes the task from the TF_CONFIG environment variable, text tf, into *t.
 * Returns 1 when found, 0 when TF_CONFIG has no "task" (nothing reported),
 * or -1 after reporting a mistake. */
static int task_from_tf_config(struct cm__errs *e, const char *tf,
                               struct cm_task *t, int *rc, char *unknown,
                               size_t unknown_len) {
  const char *type = NULL;
  char got[CM__SPEC_QUOTE_MAX];
  json_t *root, *task;
  int found = 0;

  e->source = "TF_CONFIG";
  root = cm__load_json(e, tf, strlen(tf), rc);
  if (!root)
    return -1;
  if (!json_is_object(root)) {
    cm__report(e, NULL, "expected a JSON object with \"task\", got %s",
               cm__describe(got, sizeof got, root));
    found = -1;
    goto out;
  }
  task = json_object_get(root, "task");
  if (!task)
    goto out;
  found = cm__parse_task_obj(e, task, 0, t, &type) ? 1 : -1;
  if (found == 1 && t->type == CM_TASK_NONE) {
    /* A task of a type psd does not run: the caller says so. */
    snprintf(unknown, unknown_len, "%s", type ? type : "?");
    found = 0;
  }
out:
  json_decref(root);
  return found;
}

int cm_spec_resolve_task(struct cm_spec *spec, const char *cli, char *err,
                         size_t errlen) {
  char q[CM__SPEC_QUOTE_MAX], prefix[CM__SPEC_QUOTE_MAX + 16];
  struct cm__errs e;
  struct cm_task t = {CM_TASK_NONE, 0};
  const char *tf;
  char unknown[80] = "";
  int rc = 0, found;

  cm__errs_init(&e, NULL, err, errlen);
  if (!spec) {
    cm__report(&e, NULL, "no spec given");
    rc = CM_EINVAL;
    goto out;
  }
  if (cli) {
    if (cm_task_parse(cli, &t, err, errlen) < 0) {
      e.buf = NULL; /* cm_task_parse wrote err */
      rc = CM_ESPEC;
      goto out;
    }
    snprintf(prefix, sizeof prefix, "--task %s", cm__quote(q, sizeof q, cli));
    e.source = prefix;
    if (!cm__check_task_index(&e, spec, &t, NULL, "index ")) {
      rc = CM_ESPEC;
      goto out;
    }
  } else if (spec->task.type != CM_TASK_NONE) {
    t = spec->task;
    e.source = spec->source;
    if (!cm__check_task_index(&e, spec, &t, "task.index", "")) {
      rc = CM_ESPEC;
      goto out;
    }
  } else {
    tf = getenv("TF_CONFIG");
    found = tf && *tf
                ? task_from_tf_config(&e, tf, &t, &rc, unknown, sizeof unknown)
                : 0;
    if (found < 0) {
      if (rc == 0)
        rc = CM_ESPEC;
      goto out;
    }
    if (found == 0 && unknown[0]) {
      e.source = NULL;
      cm__report(
          &e, NULL,
          "TF_CONFIG's task is of type %s, which is not a psd task "
          "(psd runs \"ps\", \"worker\", \"serve\" and Kubeflow's \"chief\"); "
          "pass --task TYPE:INDEX to run this process as one",
          cm__quote(q, sizeof q, unknown));
      rc = CM_ESPEC;
      goto out;
    }
    if (found == 0) {
      e.source = NULL;
      cm__report(
          &e, NULL,
          "no task given: pass --task TYPE:INDEX, set \"task\" in %s, or "
          "TF_CONFIG%s",
          spec->source, tf && *tf ? " (TF_CONFIG has no \"task\")" : "");
      rc = CM_ESPEC;
      goto out;
    }
    cm__task_settle(spec, &t); /* TF_CONFIG counts chief apart */
    /* The index is checked against this spec's cluster, not TF_CONFIG's. */
    if (!cm__check_task_index(&e, spec, &t, "task.index", "")) {
      rc = CM_ESPEC;
      goto out;
    }
  }
  spec->task = t;
out:
  cm__errs_finish(&e);
  return rc;
}

const char *cm_task_type_name(enum cm_task_type type) {
  switch (type) {
  case CM_TASK_PS:
    return "ps";
  case CM_TASK_WORKER:
    return "worker";
  case CM_TASK_CHIEF:
    return "chief";
  case CM_TASK_SERVE:
    return "serve";
  case CM_TASK_NONE:
    return "none";
  }
  return "unknown";
}
