/* The cluster spec derived from a Kubernetes pod's environment (k8s.h):
 * the addresses the headless Service's DNS gives every pod, this pod's task,
 * and the job file's settings make one spec document, which cm_spec_parse
 * checks as it checks any file. */
#include "k8s.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "err.h"
#include "errs.h"
#include "jcheck.h"
#include "load.h"

extern char **environ;

/* Where a pod finds its namespace when POD_NAMESPACE is not set. */
#define SA_NAMESPACE "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

/* The job's layout, from the environment. */
struct layout {
  int nps, nworker;       /* replica counts */
  const char *service;    /* the headless Service */
  const char *shard_set;  /* the shards' Indexed Job (or StatefulSet) */
  const char *worker_job; /* the workers' Indexed Job */
  char ns[254];           /* the namespace */
  int port, worker_port;  /* shard and worker ports */
  const char *type;       /* this pod's task: "ps" or "worker" */
  int index;              /* its index */
};

#define env_get cm__env_get

/* Variable name as an integer in [min, max] into *dst (def when unset, or
 * required). Returns 0, or -1 after reporting it. */
static int env_int(struct cm__errs *e, char *const *envp, const char *name,
                   int min, int max, int def, int *dst) {
  const char *v = env_get(envp, name);
  char *end;
  long long x;
  if (!v) {
    if (def >= min) {
      *dst = def;
      return 0;
    }
    cm__report(e, NULL,
               "%s: not set; expected an integer in %d..%d (deploy/k8s sets "
               "it from the replica counts)",
               name, min, max);
    return -1;
  }
  errno = 0;
  x = strtoll(v, &end, 10);
  if (errno || end == v || *end || x < min || x > max) {
    cm__report(e, NULL, "%s=%s: expected an integer in %d..%d", name, v, min,
               max);
    return -1;
  }
  *dst = (int)x;
  return 0;
}

/* A DNS label: 1..63 of [a-z0-9-], not starting or ending with '-'. */
static int dns_label(const char *s) {
  size_t n = strlen(s);
  if (n < 1 || n > 63 || s[0] == '-' || s[n - 1] == '-')
    return 0;
  for (; *s; s++)
    if (!((*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || *s == '-'))
      return 0;
  return 1;
}

/* Variable name as a DNS label (def when unset) into *dst. */
static void env_label(struct cm__errs *e, char *const *envp, const char *name,
                      const char *def, const char **dst) {
  const char *v = env_get(envp, name);
  *dst = v ? v : def;
  if (!dns_label(*dst))
    cm__report(e, NULL,
               "%s=%s: expected a DNS label (1..63 of a-z, 0-9 and '-', "
               "as Kubernetes names a Service, Job or StatefulSet)",
               name, *dst);
}

/* The namespace: POD_NAMESPACE, the service account's file, "default". */
static void read_namespace(struct cm__errs *e, char *const *envp,
                           struct layout *L) {
  const char *v = env_get(envp, "POD_NAMESPACE");
  FILE *f;
  snprintf(L->ns, sizeof L->ns, "default");
  if (v) {
    snprintf(L->ns, sizeof L->ns, "%s", v);
  } else if ((f = fopen(SA_NAMESPACE, "r"))) {
    if (fgets(L->ns, sizeof L->ns, f))
      L->ns[strcspn(L->ns, "\n")] = '\0';
    fclose(f);
  }
  if (!dns_label(L->ns))
    cm__report(e, NULL,
               "namespace %s (POD_NAMESPACE or %s): expected a DNS "
               "label",
               L->ns, SA_NAMESPACE);
}

/* The index in NAME when it is PREFIX-I, or PREFIX-I-SUFFIX (a pod's name,
 * which adds a random suffix to its hostname): I, or -1 when NAME is not. */
static long long name_index(const char *name, const char *prefix) {
  size_t n = strlen(prefix);
  const char *p = name + n + 1;
  long long x = 0;
  if (strncmp(name, prefix, n) != 0 || name[n] != '-' ||
      !(*p >= '0' && *p <= '9'))
    return -1;
  for (; *p >= '0' && *p <= '9'; p++)
    if ((x = x * 10 + (*p - '0')) > INT_MAX)
      return -1;
  return *p == '\0' || *p == '-' ? x : -1;
}

/* This pod's task, from its hostname (HOSTNAME, else gethostname(); a full
 * name's first label): SET-I is ps:I and JOB-I worker:I, the hostnames an
 * Indexed Job (and a StatefulSet) gives its pods. JOB_COMPLETION_INDEX,
 * which Kubernetes sets in an Indexed Job's pods, must then agree. */
static void read_task(struct cm__errs *e, char *const *envp, struct layout *L) {
  const char *job = env_get(envp, "JOB_COMPLETION_INDEX");
  const char *host = env_get(envp, "HOSTNAME");
  const char *what, *count_var;
  char name[256] = "";
  long long xs, xw, x;
  int count, index;
  if (host)
    snprintf(name, sizeof name, "%s", host);
  else if (gethostname(name, sizeof name) != 0)
    name[0] = '\0';
  name[strcspn(name, ".")] = '\0'; /* a FQDN's first label */
  xs = name_index(name, L->shard_set);
  xw = name_index(name, L->worker_job);
  /* Both match when one name extends the other ("psd", "psd-7"): the
   * longer one is meant. */
  if (xw >= 0 && (xs < 0 || strlen(L->worker_job) > strlen(L->shard_set))) {
    L->type = "worker", what = "workers", count_var = "PSD_K8S_WORKERS";
    count = L->nworker, x = xw;
  } else if (xs >= 0) {
    L->type = "ps", what = "shards", count_var = "PSD_K8S_SHARDS";
    count = L->nps, x = xs;
  } else {
    cm__report(e, NULL,
               "this pod is neither a shard nor a worker: its hostname \"%s\" "
               "is neither %s-I for I in 0..%d (PSD_K8S_SHARD_SET, "
               "PSD_K8S_SHARDS) nor %s-I for I in 0..%d (PSD_K8S_WORKER_JOB, "
               "PSD_K8S_WORKERS)",
               name, L->shard_set, L->nps - 1, L->worker_job, L->nworker - 1);
    return;
  }
  if (job) {
    if (env_int(e, envp, "JOB_COMPLETION_INDEX", 0, count - 1, -1, &index) <
        0) {
      cm__report(e, NULL,
                 "JOB_COMPLETION_INDEX: this Indexed Job's pod must be one of "
                 "the %s=%d %s",
                 count_var, count, what);
      return;
    }
    if (index != x) {
      cm__report(e, NULL,
                 "JOB_COMPLETION_INDEX=%d, but the hostname \"%s\" says %lld "
                 "(an Indexed Job names its pod JOB-INDEX)",
                 index, name, x);
      return;
    }
  } else if (x >= count) {
    cm__report(e, NULL,
               "hostname \"%s\": %s:%lld is not one of the %s=%d %s (0..%d)",
               name, L->type, x, count_var, count, what, count - 1);
    return;
  }
  L->index = (int)x;
}

/* The job file: only "job" and "auth". Returns a new reference ({} without
 * a file), or NULL with *rc set (CM_ESPEC after reporting). */
static json_t *read_file(struct cm__errs *e, const char *file, const char *how,
                         char *err, size_t errlen, int *rc) {
  static const char *const keys[] = {"job", "auth"};
  char *text = NULL;
  size_t len = 0;
  json_t *root;
  if (!file)
    return json_object();
  if ((*rc = cm__spec_read(file, &text, &len, err, errlen)) < 0)
    return NULL;
  root = cm__load_json(e, text, len, rc);
  free(text);
  if (!root) {
    *rc = CM_ESPEC;
    return NULL;
  }
  if (!json_is_object(root)) {
    cm__report(e, NULL, "expected a JSON object with \"job\" (and \"auth\")");
    json_decref(root);
    *rc = CM_ESPEC;
    return NULL;
  }
  if (json_object_get(root, "cluster") || json_object_get(root, "task"))
    cm__report(e, json_object_get(root, "cluster") ? "cluster" : "task",
               "not allowed with --cluster %s, which derives it from the "
               "pod's environment; keep only \"job\" and \"auth\"",
               how);
  else
    cm__check_keys(e, root, "", keys, sizeof keys / sizeof keys[0]);
  return root;
}

/* The spec document: the cluster, the task, FILE's job and auth. */
static json_t *make_doc(const struct layout *L, json_t *file) {
  json_t *ps = json_array(), *worker = json_array();
  char addr[600];
  int bad = !ps || !worker;
  for (int i = 0; i < L->nps && !bad; i++) {
    snprintf(addr, sizeof addr, "%s-%d.%s.%s.svc:%d", L->shard_set, i,
             L->service, L->ns, L->port);
    bad |= json_array_append_new(ps, json_string(addr)) < 0;
  }
  for (int i = 0; i < L->nworker && !bad; i++) {
    snprintf(addr, sizeof addr, "%s-%d.%s.%s.svc:%d", L->worker_job, i,
             L->service, L->ns, L->worker_port);
    bad |= json_array_append_new(worker, json_string(addr)) < 0;
  }
  if (bad) {
    json_decref(ps);
    json_decref(worker);
    return NULL;
  }
  return cm__spec_doc(ps, worker, L->type, L->index, file);
}

int cm_k8s_spec(const char *file, char *const *envp, struct cm_spec **out,
                char **json, char *err, size_t errlen) {
  struct layout L = {0};
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
  settings = read_file(&e, file, "k8s", err, errlen, &rc);
  if (!settings && rc != CM_ESPEC) {
    e.buf = NULL; /* cm__spec_read wrote err (a missing file) */
    if (rc == 0)
      rc = CM_ENOMEM;
    goto out;
  }
  e.source = NULL; /* the environment's mistakes name their variable */
  env_int(&e, envp, "PSD_K8S_SHARDS", 1, 4096, -1, &L.nps);
  env_int(&e, envp, "PSD_K8S_WORKERS", 1, 65536, -1, &L.nworker);
  env_int(&e, envp, "PSD_K8S_PORT", 1, 65535, 7100, &L.port);
  env_int(&e, envp, "PSD_K8S_WORKER_PORT", 1, 65535, 7200, &L.worker_port);
  env_label(&e, envp, "PSD_K8S_SERVICE", "psd", &L.service);
  env_label(&e, envp, "PSD_K8S_SHARD_SET", "psd", &L.shard_set);
  env_label(&e, envp, "PSD_K8S_WORKER_JOB", "psd-worker", &L.worker_job);
  read_namespace(&e, envp, &L);
  if (e.count == 0)
    read_task(&e, envp, &L);
  if (e.count > 0 || !settings) {
    rc = CM_ESPEC;
    goto out;
  }
  if (!(doc = make_doc(&L, settings))) {
    rc = CM_ENOMEM;
    goto out;
  }
  cm__errs_finish(&e);
  e.buf = NULL;
  rc =
      cm__spec_from_doc(doc, file ? file : "k8s", file, out, json, err, errlen);
out:
  cm__errs_finish(&e);
  json_decref(doc);
  json_decref(settings);
  return rc;
}

/* The spec psd runs, as text: Kubeflow's chief folded into the workers,
 * the task counted as psd counts it, the evaluators gone; FILE's job and
 * auth. NULL when out of memory. */
static char *normalized(const struct cm_spec *spec, json_t *settings) {
  json_t *doc = json_object(), *ps = json_array(), *worker = json_array(), *v;
  char *text = NULL;
  for (int i = 0; i < spec->nps; i++)
    json_array_append_new(ps, json_string(spec->ps[i].text));
  for (int i = 0; i < spec->nworker; i++)
    json_array_append_new(worker, json_string(spec->worker[i].text));
  json_object_set_new(doc, "cluster",
                      json_pack("{s:o, s:o}", "ps", ps, "worker", worker));
  if (spec->task.type != CM_TASK_NONE)
    json_object_set_new(doc, "task",
                        json_pack("{s:s, s:i}", "type",
                                  cm_task_type_name(spec->task.type), "index",
                                  spec->task.index));
  if ((v = json_object_get(settings, "job")))
    json_object_set(doc, "job", v);
  if ((v = json_object_get(settings, "auth")))
    json_object_set(doc, "auth", v);
  text = json_dumps(doc, JSON_INDENT(2) | JSON_PRESERVE_ORDER |
                             JSON_REAL_PRECISION(16));
  json_decref(doc);
  return text;
}

int cm_tf_config_spec(const char *file, const char *tf_config,
                      struct cm_spec **out, char **json, char *err,
                      size_t errlen) {
  struct cm__errs e;
  json_t *settings = NULL, *tf = NULL, *v;
  char source[512];
  int rc = 0;

  if (out)
    *out = NULL;
  if (json)
    *json = NULL;
  if (!tf_config)
    tf_config = getenv("TF_CONFIG");
  cm__errs_init(&e, file, err, errlen);
  settings = read_file(&e, file, "tf_config", err, errlen, &rc);
  if (!settings && rc != CM_ESPEC) {
    e.buf = NULL;
    if (rc == 0)
      rc = CM_ENOMEM;
    goto out;
  }
  e.source = "TF_CONFIG";
  if (!tf_config || !*tf_config) {
    cm__report(&e, NULL,
               "not set; --cluster tf_config takes the cluster "
               "and the task from it (Kubeflow's TFJob sets it)");
  } else if ((tf = cm__load_json(&e, tf_config, strlen(tf_config), &rc)) &&
             !json_is_object(tf)) {
    cm__report(&e, NULL, "expected a JSON object with \"cluster\"");
  }
  if (e.count > 0 || !settings || !tf) {
    rc = CM_ESPEC;
    goto out;
  }
  /* TF_CONFIG as it is (cluster, task, environment), FILE's job and auth. */
  if (((v = json_object_get(settings, "job")) &&
       json_object_set(tf, "job", v) < 0) ||
      ((v = json_object_get(settings, "auth")) &&
       json_object_set(tf, "auth", v) < 0)) {
    rc = CM_ENOMEM;
    goto out;
  }
  cm__errs_finish(&e);
  e.buf = NULL;
  snprintf(source, sizeof source, "TF_CONFIG%s%.400s", file ? " with " : "",
           file ? file : "");
  rc = cm__spec_from_doc(tf, source, file, out, NULL, err, errlen);
  if (rc == 0 && json && !(*json = normalized(*out, settings)))
    rc = CM_ENOMEM;
out:
  cm__errs_finish(&e);
  json_decref(tf);
  json_decref(settings);
  return rc;
}
