/* The cluster spec derived from a Kubernetes pod's environment (k8s.h), or
 * from a Kubeflow TFJob's TF_CONFIG: what is their own in the frame of
 * resolve.h. For k8s, the addresses the headless Service's DNS gives every
 * pod and this pod's task from its hostname; for TF_CONFIG, the document
 * the variable holds. Both take only "job" and "auth" from the job file. */
#include "k8s.h"

#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "errs.h"
#include "jcheck.h"
#include "resolve.h"

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
  int got = cm__env_int(e, envp, name, min, max, 0, dst);

  if (got != 0)
    return got < 0 ? -1 : 0;
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

/* Checks the job file's value root: an object with only "job" and
 * "auth". Returns 0, or -1 when root is not an object. */
static int check_file(struct cm__errs *e, json_t *root, const char *word,
                      void *ctx) {
  static const char *const keys[] = {"job", "auth"};

  (void)ctx;
  if (!json_is_object(root)) {
    cm__report(e, NULL, "expected a JSON object with \"job\" (and \"auth\")");
    return -1;
  }
  if (json_object_get(root, "cluster") || json_object_get(root, "task"))
    cm__report(e, json_object_get(root, "cluster") ? "cluster" : "task",
               "not allowed with --cluster %s, which derives it from the "
               "pod's environment; keep only \"job\" and \"auth\"",
               word);
  else
    cm__check_keys(e, root, "", keys, sizeof keys / sizeof keys[0]);
  return 0;
}

/* Reads the pod's layout from envp into the layout ctx. Returns 0; the
 * mistakes are reported. */
static int read_layout(struct cm__errs *e, char *const *envp, void *ctx) {
  struct layout *L = ctx;

  env_int(e, envp, "PSD_K8S_SHARDS", 1, 4096, -1, &L->nps);
  env_int(e, envp, "PSD_K8S_WORKERS", 1, 65536, -1, &L->nworker);
  env_int(e, envp, "PSD_K8S_PORT", 1, 65535, 7100, &L->port);
  env_int(e, envp, "PSD_K8S_WORKER_PORT", 1, 65535, 7200, &L->worker_port);
  env_label(e, envp, "PSD_K8S_SERVICE", "psd", &L->service);
  env_label(e, envp, "PSD_K8S_SHARD_SET", "psd", &L->shard_set);
  env_label(e, envp, "PSD_K8S_WORKER_JOB", "psd-worker", &L->worker_job);
  read_namespace(e, envp, L);
  if (e->count == 0)
    read_task(e, envp, L);
  return 0;
}

/* The spec document: the cluster from the layout ctx, the task, the job
 * file's settings. */
static json_t *make_doc(void *ctx, json_t *settings) {
  const struct layout *L = ctx;
  json_t *ps = json_array(), *worker = json_array();

  for (int i = 0; i < L->nps; i++)
    cm__spec_add(&ps, "%s-%d.%s.%s.svc:%d", L->shard_set, i, L->service, L->ns,
                 L->port);
  for (int i = 0; i < L->nworker; i++)
    cm__spec_add(&worker, "%s-%d.%s.%s.svc:%d", L->worker_job, i, L->service,
                 L->ns, L->worker_port);
  return cm__spec_doc(ps, worker, L->type, L->index, settings);
}

int cm_k8s_spec(const char *file, char *const *envp, struct cm_spec **out,
                char **json, char *err, size_t errlen) {
  static const struct cm__resolver k8s = {
      .word = "k8s",
      .check_file = check_file,
      .read_env = read_layout,
      .make_doc = make_doc,
  };
  struct layout L = {0};

  return cm__resolve(&k8s, &L, file, envp, out, json, err, errlen);
}

/* A TFJob pod's environment: the TF_CONFIG text, then the document. */
struct tf_config {
  const char *text; /* the variable's value, NULL: envp's */
  json_t *doc;      /* owned: the text parsed, NULL until then */
};

/* Parses TF_CONFIG (ctx's text, else envp's) into ctx's doc. Returns 0, or
 * -1 after reporting why there is none. */
static int read_tf_config(struct cm__errs *e, char *const *envp, void *ctx) {
  struct tf_config *t = ctx;
  const char *text = t->text ? t->text : cm__env_get(envp, "TF_CONFIG");
  int rc;

  if (!text || !*text) {
    cm__report(e, NULL,
               "not set; --cluster tf_config takes the cluster "
               "and the task from it (Kubeflow's TFJob sets it)");
  } else if ((t->doc = cm__load_json(e, text, strlen(text), &rc)) &&
             !json_is_object(t->doc)) {
    cm__report(e, NULL, "expected a JSON object with \"cluster\"");
  }
  return t->doc ? 0 : -1;
}

/* TF_CONFIG as it is (cluster, task, environment), FILE's job and auth. */
static json_t *tf_config_doc(void *ctx, json_t *settings) {
  struct tf_config *t = ctx;

  return cm__spec_settings(t->doc, settings) < 0 ? NULL : json_incref(t->doc);
}

/* The spec psd runs, as text: Kubeflow's chief folded into the workers,
 * the task counted as psd counts it, the evaluators gone; FILE's job and
 * auth. NULL when out of memory. */
static char *normalized(const struct cm_spec *spec, json_t *settings) {
  json_t *ps = json_array(), *worker = json_array(), *doc;
  char *text = NULL;

  for (int i = 0; i < spec->nps; i++)
    cm__spec_add(&ps, "%s", spec->ps[i].text);
  for (int i = 0; i < spec->nworker; i++)
    cm__spec_add(&worker, "%s", spec->worker[i].text);
  doc = cm__spec_doc(ps, worker,
                     spec->task.type != CM_TASK_NONE
                         ? cm_task_type_name(spec->task.type)
                         : NULL,
                     spec->task.index, settings);
  if (doc)
    text = json_dumps(doc, CM__SPEC_DUMP_FLAGS);
  json_decref(doc);
  return text;
}

int cm_tf_config_spec(const char *file, const char *tf_config,
                      struct cm_spec **out, char **json, char *err,
                      size_t errlen) {
  static const struct cm__resolver tf = {
      .word = "tf_config",
      .env = "TF_CONFIG",
      .check_file = check_file,
      .read_env = read_tf_config,
      .make_doc = tf_config_doc,
      .text = normalized,
  };
  struct tf_config t = {.text = tf_config};
  int rc = cm__resolve(&tf, &t, file, NULL, out, json, err, errlen);

  json_decref(t.doc);
  return rc;
}
