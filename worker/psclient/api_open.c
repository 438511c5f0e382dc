/* psc_open, psc_open_tf_config, psc_open_addrs (psd/client.h): a spec from
 * a file, a TF_CONFIG text or a list of addresses, the task this client is,
 * and the internal client over it; errors and the job's settings. */
#include "api_internal.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "log.h"
#include "rpc.h"

void psc_options_init(struct psc_options *o) {
  memset(o, 0, sizeof *o);
  o->size = sizeof *o;
}

/* Writes the reason of a failed open into err[0..errlen). */
static void say(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void say(char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;
  if (!err || !errlen)
    return;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

/* Whether the environment's TF_CONFIG names a task psd runs (not
 * Kubeflow's "evaluator", say: such a client has no task). */
static int tf_config_has_task(void) {
  const char *tf = getenv("TF_CONFIG");
  json_t *root = tf && *tf ? json_loads(tf, 0, NULL) : NULL;
  const char *type =
      json_string_value(json_object_get(json_object_get(root, "task"), "type"));
  int has = type && (!strcmp(type, "ps") || !strcmp(type, "worker") ||
                     !strcmp(type, "chief"));
  json_decref(root);
  return has;
}

/* Makes the client over spec (taken) once the task is settled. */
static int open_spec(psc_client **out, struct cm_spec *spec,
                     const struct psc_options *o, int unchecked, char *err,
                     size_t errlen) {
  struct psc__client_opts dopts = {0};
  struct psc_options given;
  char buf[4096];
  int rc = 0;
  psc_client *c = calloc(1, sizeof *c);
  /* A caller built against an older, shorter psc_options gets the
   * defaults for the fields it does not know (size 0: this version's). */
  psc_options_init(&given);
  if (o)
    memcpy(&given, o,
           o->size && o->size < sizeof given ? o->size : sizeof given);
  o = &given;
  *out = NULL;
  if (!c) {
    cm_spec_free(spec);
    return PSC_ENOMEM;
  }
  c->spec = spec;
  c->task = -1;
  if ((o && o->task) || spec->task.type != CM_TASK_NONE ||
      tf_config_has_task()) {
    if ((rc =
             cm_spec_resolve_task(spec, o ? o->task : NULL, buf, sizeof buf))) {
      say(err, errlen, "%s", buf);
      goto out;
    }
    if (spec->task.type != CM_TASK_WORKER) {
      say(err, errlen,
          "%s: task %s:%d is a shard; a client is a worker task "
          "(worker:N) or none",
          spec->source, cm_task_type_name(spec->task.type), spec->task.index);
      rc = PSC_EINVAL;
      goto out;
    }
    c->task = spec->task.index;
  }
  if (o && o->name)
    snprintf(c->name, sizeof c->name, "%s", o->name);
  else if (c->task >= 0)
    snprintf(c->name, sizeof c->name, "worker:%d", c->task);
  else
    snprintf(c->name, sizeof c->name, "psc");
  dopts.worker = c->name;
  if (o) {
    dopts.timeout_ms = o->timeout_ms;
    dopts.connect_timeout_ms = o->connect_timeout_ms;
    dopts.retry_s = o->retry_s;
  }
  dopts.no_spec_check = unchecked;
  if ((rc = psc__client_new(&c->cl, spec, &dopts))) {
    say(err, errlen, "cannot open a client for %s: %s", spec->source,
        cm_strerror(rc));
    goto out;
  }
out:
  if (rc) {
    psc_close(c);
    return rc;
  }
  *out = c;
  return 0;
}

int psc_open(psc_client **out, const char *spec_path,
             const struct psc_options *o, char *err, size_t errlen) {
  struct cm_spec *spec = NULL;
  char buf[8192];
  int rc;
  *out = NULL;
  if (!spec_path) {
    say(err, errlen, "psc_open: no spec path");
    return PSC_EINVAL;
  }
  if ((rc = cm_spec_load(spec_path, &spec, buf, sizeof buf))) {
    say(err, errlen, "%s", buf);
    return rc;
  }
  return open_spec(out, spec, o, 0, err, errlen);
}

int psc_open_tf_config(psc_client **out, const char *tf_config,
                       const struct psc_options *o, char *err, size_t errlen) {
  struct cm_spec *spec = NULL;
  char buf[8192];
  int rc;
  *out = NULL;
  if (!tf_config)
    tf_config = getenv("TF_CONFIG");
  if (!tf_config || !*tf_config) {
    say(err, errlen,
        "TF_CONFIG: not set; expected the job's cluster spec "
        "as JSON");
    return PSC_EINVAL;
  }
  if ((rc = cm_spec_parse(tf_config, strlen(tf_config), "TF_CONFIG", &spec, buf,
                          sizeof buf))) {
    say(err, errlen, "%s", buf);
    return rc;
  }
  return open_spec(out, spec, o, 0, err, errlen);
}

int psc_open_addrs(psc_client **out, const char *const *addrs, int n,
                   const struct psc_options *o, char *err, size_t errlen) {
  struct cm_spec *spec = NULL;
  char buf[8192], *text = NULL;
  int rc = PSC_ENOMEM;
  json_t *root = json_object(), *cluster = json_object(), *ps = json_array();
  json_t *job = json_object(), *workers = json_array();
  *out = NULL;
  if (!root || !cluster || !ps || !job || !workers)
    goto out;
  if (n < 1 || !addrs) {
    say(err, errlen, "psc_open_addrs: no shard addresses");
    rc = PSC_EINVAL;
    goto out;
  }
  for (int i = 0; i < n; i++)
    json_array_append_new(ps, json_string(addrs[i] ? addrs[i] : ""));
  /* The spec format needs a worker list; the shards never see this one
   * (no fingerprint is sent). */
  json_array_append_new(workers, json_string("127.0.0.1:1"));
  json_object_set(cluster, "ps", ps);
  json_object_set(cluster, "worker", workers);
  json_object_set(root, "cluster", cluster);
  json_object_set_new(job, "name",
                      json_string(o && o->job ? o->job : "psd-job"));
  json_object_set(root, "job", job);
  if (o && o->token_file)
    json_object_set_new(root, "auth",
                        json_pack("{s:s}", "token_file", o->token_file));
  if (!(text = json_dumps(root, 0)))
    goto out;
  if ((rc = cm_spec_parse(text, strlen(text), "the shard addresses", &spec, buf,
                          sizeof buf))) {
    say(err, errlen, "%s", buf);
    goto out;
  }
  rc = open_spec(out, spec, o, 1, err, errlen);
out:
  if (rc == PSC_ENOMEM)
    say(err, errlen, "out of memory");
  free(text);
  json_decref(root);
  json_decref(cluster);
  json_decref(ps);
  json_decref(job);
  json_decref(workers);
  return rc;
}

void psc_close(psc_client *c) {
  if (!c)
    return;
  psc__client_free(c->cl);
  cm_spec_free(c->spec);
  free(c);
}

void psc__begin(psc_client *c) {
  c->own_err = 0;
  c->err[0] = 0;
  psc__client_set_interrupt(c->cl, c->interrupt, c->interrupt_arg);
}

int psc__fail(psc_client *c, int rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->err, sizeof c->err, fmt, ap);
  va_end(ap);
  c->own_err = 1;
  return rc;
}

const char *psc_error(const psc_client *c) {
  return c->own_err ? c->err : psc__client_error(c->cl);
}

int psc_grpc_status(const psc_client *c) {
  return c->own_err ? 0 : psc__client_last_status(c->cl, NULL);
}

const char *psc_grpc_status_name(int status) {
  return cm_rpc_status_name((grpc_status_code)status);
}

/* The layout's count: job.shards, then what a "layout moved" answer said. */
int psc_num_shards(const psc_client *c) { return psc__client_nshards(c->cl); }
int psc_num_workers(const psc_client *c) { return c->spec->nworker; }
int psc_task_index(const psc_client *c) { return c->task; }
const char *psc_mode(const psc_client *c) { return c->spec->job.mode; }
int psc_staleness(const psc_client *c) { return c->spec->job.staleness; }

void psc_set_interrupt(psc_client *c, int (*interrupted)(void *arg),
                       void *arg) {
  c->interrupt = interrupted;
  c->interrupt_arg = arg;
  psc__client_set_interrupt(c->cl, interrupted, arg);
}

_Static_assert(PSC_LOG_DEBUG == (int)CM_LOG_DEBUG &&
                   PSC_LOG_INFO == (int)CM_LOG_INFO &&
                   PSC_LOG_WARN == (int)CM_LOG_WARN &&
                   PSC_LOG_ERROR == (int)CM_LOG_ERROR &&
                   PSC_LOG_OFF == (int)CM_LOG_OFF,
               "psd/client.h's log levels are log.h's");

/* psc_set_log's callback and its argument: read by trampoline() alone,
 * which runs under log.c's lock while it is the sink, and written while it
 * is not. */
static void (*log_cb)(void *, int, const char *);
static void *log_arg;

static void trampoline(void *unused, enum cm_log_level level,
                       const char *line) {
  (void)unused;
  log_cb(log_arg, (int)level, line);
}

int psc_set_log(int level, void (*cb)(void *arg, int level, const char *line),
                void *arg) {
  if (level > PSC_LOG_OFF)
    return PSC_EINVAL;
  if (level >= 0)
    cm_log_set_level((enum cm_log_level)level);
  cm_log_set_sink(NULL, NULL);
  log_cb = cb;
  log_arg = arg;
  if (cb)
    cm_log_set_sink(trampoline, NULL);
  return 0;
}

uint64_t psc_bytes_pulled(const psc_client *c) {
  return psc__client_bytes_pulled(c->cl);
}

uint64_t psc_bytes_pushed(const psc_client *c) {
  return psc__client_bytes_pushed(c->cl);
}
