/* The spec's settings objects (job.h): "job", the training settings (model,
 * data, sync mode, liveness, checkpoints, limits), each checked and given
 * its default, with settings of another model or sync mode refused; and
 * "auth", the token file and TLS material. job.worker_command, what
 * pslaunch runs for a worker instead of dworker, is here too. The optimizers
 * are in job_optim.c. */
#include "job.h"

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jcheck.h"
#include "job_optim.h"
#include "job_tables.h"

#define SPEC_LAYER_MAX (1 << 20) /* widest hidden layer accepted */
#define SPEC_CHANNELS_MAX 1024   /* most channels of a CNN convolution */

/* Checks one entry of an array setting at path and stores it as entry i of
 * dst. Returns 1 when it is good, 0 after reporting. */
typedef int entry_fn(struct cm__errs *e, json_t *v, const char *path, size_t i,
                     void *dst);

/* Checks every entry of the array arr, the setting key, with entry (which
 * stores it in dst); more than max entries is a mistake. Returns 1 when
 * every entry is good, 0 after reporting, so that a setting is taken whole
 * or not at all. */
static int each_entry(struct cm__errs *e, json_t *arr, const char *key,
                      size_t max, entry_fn *entry, void *dst) {
  char path[CM__SPEC_PATH_MAX];
  size_t i, n = json_array_size(arr);
  json_t *v;
  int ok = 1;

  if (n > max) {
    cm__report(e, key, "%zu entries; expected at most %zu", n, max);
    return 0;
  }
  json_array_foreach(arr, i, v) {
    cm__path_index(path, sizeof path, key, i);
    ok &= entry(e, v, path, i, dst);
  }
  return ok;
}

/* Where int_entry stores integers in 1..max. */
struct ints {
  int *v;        /* the entries */
  long long max; /* the largest accepted */
};

/* An entry_fn for an integer in 1..max (dst is a struct ints). */
static int int_entry(struct cm__errs *e, json_t *v, const char *path, size_t i,
                     void *dst) {
  struct ints *d = dst;
  long long x;

  if (!cm__want_int(e, v, path, 1, d->max, &x))
    return 0;
  d->v[i] = (int)x;
  return 1;
}

static void parse_hidden(struct cm__errs *e, json_t *job, struct cm_job *out) {
  int widths[CM_SPEC_MAX_LAYERS];
  struct ints d = {widths, SPEC_LAYER_MAX};
  json_t *arr = cm__opt_array(
      e, job, "job", "hidden", 0, SIZE_MAX,
      "an array of 1..%d positive integers (layer widths)", CM_SPEC_MAX_LAYERS);
  size_t n = json_array_size(arr);

  if (!arr)
    return;
  if (n == 0) {
    cm__report(e, "job.hidden", "empty; expected 1..%d positive integers",
               CM_SPEC_MAX_LAYERS);
    return;
  }
  if (!each_entry(e, arr, "job.hidden", CM_SPEC_MAX_LAYERS, int_entry, &d))
    return;
  memcpy(out->hidden, widths, n * sizeof widths[0]);
  out->nhidden = (int)n;
}

/* job.channels: exactly two channel counts, the CNN's convolutions. */
static void parse_channels(struct cm__errs *e, json_t *job,
                           struct cm_job *out) {
  int ch[2];
  struct ints d = {ch, SPEC_CHANNELS_MAX};
  json_t *arr = cm__opt_array(e, job, "job", "channels", 2, 2,
                              "an array of 2 integers in 1..%d (the channels "
                              "of the two convolutions)",
                              SPEC_CHANNELS_MAX);

  if (arr && each_entry(e, arr, "job.channels", 2, int_entry, &d))
    memcpy(out->channels, ch, sizeof ch);
}

/* job.name is also the job id sent on every call and used in file names, so
 * it is kept to characters that are safe everywhere. */
static void parse_name(struct cm__errs *e, json_t *job, struct cm_job *out) {
  char name[sizeof out->name], q[CM__SPEC_QUOTE_MAX];
  size_t bad;

  if (!cm__opt_string(e, job, "job", "name", name, sizeof name))
    return;
  bad = strspn(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                     "0123456789._-");
  if (name[bad] != '\0') {
    cm__report(
        e, "job.name",
        "%s has a character other than letters, digits, '.', '_' and '-'",
        cm__quote(q, sizeof q, name));
    return;
  }
  memcpy(out->name, name, sizeof name);
}

/* job.socket_owner: the user whose Unix sockets a client trusts besides its
 * own and root's (endpoint.h). A name is resolved where a client uses it,
 * not here, since a host that runs no shard may not know the user. */
static void parse_socket_owner(struct cm__errs *e, json_t *job,
                               struct cm_job *out) {
  static const char expect[] =
      "expected the user psd runs as, a user name (letters, digits, '.', "
      "'_', '-'; not starting with '-') or a numeric uid";
  char owner[sizeof out->socket_owner], got[CM__SPEC_QUOTE_MAX];
  json_t *v = json_object_get(job, "socket_owner");
  long long uid;
  size_t n;

  if (!v)
    return;
  if (json_is_integer(v)) {
    if (cm__want_int(e, v, "job.socket_owner", 0, 4294967294LL, &uid))
      snprintf(out->socket_owner, sizeof out->socket_owner, "%lld", uid);
    return;
  }
  if (!json_is_string(v) || (n = json_string_length(v)) == 0 ||
      n >= sizeof owner) {
    cm__report(e, "job.socket_owner", "%s, got %s", expect,
               cm__describe(got, sizeof got, v));
    return;
  }
  memcpy(owner, json_string_value(v), n + 1);
  if (owner[0] == '-' ||
      owner[strspn(owner, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                          "0123456789._-")] != '\0' ||
      (strspn(owner, "0123456789") == n &&
       (n > 10 || strtoll(owner, NULL, 10) > 4294967294LL))) {
    cm__report(e, "job.socket_owner", "%s, got %s", expect,
               cm__quote(got, sizeof got, owner));
    return;
  }
  memcpy(out->socket_owner, owner, n + 1);
}

/* What a JSON value that is not a string is, for "5 is a number; expected a
 * string". */
static void not_a_string(struct cm__errs *e, const char *path,
                         const json_t *v) {
  char got[CM__SPEC_QUOTE_MAX];
  const char *kind = json_is_number(v)    ? " is a number"
                     : json_is_boolean(v) ? " is a boolean"
                                          : "";

  cm__report(e, path, "%s%s; expected a string",
             cm__describe(got, sizeof got, v), kind);
}

/* An entry_fn for an argument of job.worker_command (dst is the array of
 * them). */
static int arg_entry(struct cm__errs *e, json_t *v, const char *path, size_t i,
                     void *dst) {
  char(*args)[CM_SPEC_MAX_ARG] = dst;
  size_t len;

  if (!json_is_string(v)) {
    not_a_string(e, path, v);
    return 0;
  }
  if ((len = json_string_length(v)) == 0) {
    cm__report(e, path, "empty; expected a non-empty string");
    return 0;
  }
  if (len >= CM_SPEC_MAX_ARG) {
    cm__report(e, path, "%zu bytes long; expected at most %d", len,
               CM_SPEC_MAX_ARG - 1);
    return 0;
  }
  memcpy(args[i], json_string_value(v), len + 1);
  return 1;
}

/* job.worker_command: the program pslaunch runs for each worker task
 * instead of dworker, and its arguments, as an array of strings (never one
 * string to split: no shell is involved, so nothing is quoted). */
static void parse_worker_command(struct cm__errs *e, json_t *job,
                                 struct cm_job *out) {
  char got[CM__SPEC_QUOTE_MAX];
  json_t *arr = json_object_get(job, "worker_command");
  size_t n;

  if (!arr)
    return;
  n = json_is_array(arr) ? json_array_size(arr) : 0;
  if (n == 0) {
    cm__report(e, "job.worker_command",
               "%s; expected an array of 1..%d non-empty strings, the "
               "program and its arguments (e.g. [\"python3\", "
               "\"train.py\"])",
               json_is_array(arr) ? "empty"
                                  : cm__describe(got, sizeof got, arr),
               CM_SPEC_MAX_COMMAND);
    return;
  }
  if (each_entry(e, arr, "job.worker_command", CM_SPEC_MAX_COMMAND, arg_entry,
                 out->worker_command))
    out->nworker_command = (int)n;
}

void cm__job_defaults(struct cm_job *job) {
  memset(job, 0, sizeof *job);
  snprintf(job->name, sizeof job->name, "psd-job");
  snprintf(job->model, sizeof job->model, "mlp");
  job->hidden[0] = 256;
  job->hidden[1] = 128;
  job->nhidden = 2;
  job->channels[0] = 16;
  job->channels[1] = 32;
  snprintf(job->data_dir, sizeof job->data_dir,
           "/usr/share/datasets/fashion-mnist");
  job->epochs = 3;
  job->batch_size = 64;
  cm_optim_defaults(&job->optim.def);
  snprintf(job->mode, sizeof job->mode, "async");
  job->staleness = -1;
  /* replicas_to_aggregate and min_replicas default from the cluster size;
   * parse_sync fills them. */
  job->deadline_multiple = 3.0;
  job->deadline_floor_ms = 1000;
  job->deterministic = 0;
  job->heartbeat_ms = 500;
  job->dead_after_ms = 5000;
  job->seed = 1;
  job->log_every = 100;
  job->timeout_ms = 30000;
  job->max_steps = 0;
  job->unix_sockets = 1;
  job->shared_memory = 1;
  job->ckpt_keep = 3;
  job->publish_interval_s = 5;
  job->publish_full_every = 10;
  job->publish_keep = 2;
  job->max_message_mb = 64;
  snprintf(job->nonfinite, sizeof job->nonfinite, "reject");
  snprintf(job->wire_dtype, sizeof job->wire_dtype, "f32");
  job->retry_s = 120;
}

/* Returns the member job.sync.key when present and meant for the job's mode;
 * one meant for the other mode is reported and NULL returned, since it shows
 * that the author believes the job runs in that mode. With the mode itself
 * mistaken (mode_known 0) every member is returned and checked on its own. */
static json_t *mode_member(struct cm__errs *e, json_t *sync, const char *key,
                           int mode_known, int is_sync, int for_sync) {
  char path[CM__SPEC_PATH_MAX];
  json_t *v = json_object_get(sync, key);

  if (!v || !mode_known || is_sync == for_sync)
    return v;
  cm__path_key(path, sizeof path, "job.sync", key);
  cm__report(e, path, "only meaningful with \"mode\": \"%s\"",
             for_sync ? "sync" : "async");
  return NULL;
}

/* Parses job.sync: the mode and the settings of that mode. nworker is the
 * size of cluster.worker, 0 when that is missing (the spec is refused anyway
 * and k is then not checked against it); k and m already hold their defaults
 * (nworker). */
static void parse_sync(struct cm__errs *e, json_t *job, int nworker,
                       struct cm_job *out) {
  static const char *const keys[] = {
      "mode",         "staleness", "replicas_to_aggregate",
      "min_replicas", "deadline",  "deterministic"};
  static const char *const deadline_keys[] = {"multiple", "floor_ms"};
  static const char *const modes[] = {"async", "sync", NULL};
  char got[CM__SPEC_QUOTE_MAX];
  json_t *sync, *v;
  long long x;
  int before, mode_known, is_sync, k_given = 0, k_known = nworker > 0;

  sync = cm__opt_object(e, job, "job", "sync",
                        "an object like {\"mode\": \"sync\", "
                        "\"replicas_to_aggregate\": 2}");
  if (!sync)
    return;
  cm__check_keys(e, sync, "job.sync", keys, sizeof keys / sizeof keys[0]);
  before = e->count;
  cm__opt_choice(e, sync, "job.sync", "mode", modes, out->mode,
                 sizeof out->mode);
  mode_known = e->count == before;
  is_sync = strcmp(out->mode, "sync") == 0;

  v = mode_member(e, sync, "staleness", mode_known, is_sync, 0);
  if (v && cm__want_int(e, v, "job.sync.staleness", 0, INT_MAX, &x))
    out->staleness = (int)x;

  v = mode_member(e, sync, "replicas_to_aggregate", mode_known, is_sync, 1);
  if (v) {
    if (!cm__want_int(e, v, "job.sync.replicas_to_aggregate", 1, INT_MAX, &x)) {
      k_known = 0;
    } else if (k_known && x > nworker) {
      cm__report(e, "job.sync.replicas_to_aggregate",
                 "%lld is more than the %d worker%s in cluster.worker", x,
                 nworker, nworker == 1 ? "" : "s");
      k_known = 0;
    } else {
      out->replicas_to_aggregate = (int)x;
      k_given = k_known = 1;
    }
  }
  out->min_replicas = out->replicas_to_aggregate;

  v = mode_member(e, sync, "min_replicas", mode_known, is_sync, 1);
  /* Against a k that is wrong or unknown there is nothing to compare. */
  if (v && cm__want_int(e, v, "job.sync.min_replicas", 1, INT_MAX, &x) &&
      k_known) {
    if (x > out->replicas_to_aggregate)
      cm__report(e, "job.sync.min_replicas",
                 "%lld is more than replicas_to_aggregate (%d%s)", x,
                 out->replicas_to_aggregate,
                 k_given ? "" : ", by default the number of workers");
    else
      out->min_replicas = (int)x;
  }

  if (mode_member(e, sync, "deadline", mode_known, is_sync, 1)) {
    v = cm__opt_object(
        e, sync, "job.sync", "deadline",
        "an object like {\"multiple\": 3.0, \"floor_ms\": 1000}");
    if (v) {
      cm__check_keys(e, v, "job.sync.deadline", deadline_keys,
                     sizeof deadline_keys / sizeof deadline_keys[0]);
      cm__opt_number(e, v, "job.sync.deadline", "multiple", 0, 0, HUGE_VAL,
                     "a positive number", &out->deadline_multiple);
      cm__opt_int(e, v, "job.sync.deadline", "floor_ms", 1, INT_MAX,
                  &out->deadline_floor_ms);
    }
  }

  v = mode_member(e, sync, "deterministic", mode_known, is_sync, 1);
  if (v) {
    if (json_is_boolean(v))
      out->deterministic = json_is_true(v);
    else
      cm__report(e, "job.sync.deterministic", "expected true or false, got %s",
                 cm__describe(got, sizeof got, v));
  }
}

/* Parses job.heartbeat_ms and job.dead_after_ms. A worker must be able to
 * miss a heartbeat before it is declared dead, so the second must exceed the
 * first; the mistake is reported at whichever of the two the spec sets. */
static void parse_liveness(struct cm__errs *e, json_t *job,
                           struct cm_job *out) {
  int before = e->count;
  long long hint;

  cm__opt_int(e, job, "job", "heartbeat_ms", 1, INT_MAX, &out->heartbeat_ms);
  cm__opt_int(e, job, "job", "dead_after_ms", 1, INT_MAX, &out->dead_after_ms);
  if (e->count != before || out->dead_after_ms > out->heartbeat_ms)
    return;
  hint = 10LL * out->heartbeat_ms;
  if (hint > INT_MAX)
    hint = INT_MAX;
  if (json_object_get(job, "dead_after_ms"))
    cm__report(e, "job.dead_after_ms",
               "%d is not more than job.heartbeat_ms (%d%s); expected a longer "
               "silence, e.g. %lld (10 heartbeats)",
               out->dead_after_ms, out->heartbeat_ms,
               json_object_get(job, "heartbeat_ms") ? "" : ", the default",
               hint);
  else
    cm__report(
        e, "job.heartbeat_ms",
        "%d is not less than job.dead_after_ms (%d, the default); expected "
        "less, or set job.dead_after_ms, e.g. to %lld (10 heartbeats)",
        out->heartbeat_ms, out->dead_after_ms, hint);
}

/* Parses job.checkpoint: where and how often the shards checkpoint. */
static void parse_checkpoint(struct cm__errs *e, json_t *job,
                             struct cm_job *out) {
  static const char *const keys[] = {"dir", "every_steps", "every_s", "keep"};
  json_t *ck = cm__opt_object(e, job, "job", "checkpoint",
                              "an object like {\"dir\": \"ckpt\", "
                              "\"every_steps\": 1000, \"keep\": 3}");

  if (!ck)
    return;
  cm__check_keys(e, ck, "job.checkpoint", keys, sizeof keys / sizeof keys[0]);
  cm__opt_string(e, ck, "job.checkpoint", "dir", out->ckpt_dir,
                 sizeof out->ckpt_dir);
  cm__opt_int(e, ck, "job.checkpoint", "every_steps", 0, INT_MAX,
              &out->ckpt_every_steps);
  cm__opt_number(e, ck, "job.checkpoint", "every_s", 0, 1, 1e9,
                 "a number of seconds >= 0 (0: never)", &out->ckpt_every_s);
  cm__opt_int(e, ck, "job.checkpoint", "keep", 1, INT_MAX, &out->ckpt_keep);
}

/* Parses job.max_message_mb. Below the floor a 2 MiB chunk no longer fits,
 * which would fail every large pull and push, so it is said in those words.
 * gRPC's limit is an int of bytes, hence the ceiling. */
static void parse_max_message(struct cm__errs *e, json_t *job,
                              struct cm_job *out) {
  json_t *v = json_object_get(job, "max_message_mb");
  long long x;

  if (!v || !cm__want_int(e, v, "job.max_message_mb", 1, 2047, &x))
    return;
  if (x < CM_SPEC_MIN_MESSAGE_MB) {
    cm__report(e, "job.max_message_mb",
               "%lld MiB is too small; expected at least %d (a 2 MiB chunk of "
               "tensor data plus its message head and headroom)",
               x, CM_SPEC_MIN_MESSAGE_MB);
    return;
  }
  out->max_message_mb = (int)x;
}

void cm__parse_job(struct cm__errs *e, json_t *root, int nworker,
                   struct cm_job *out) {
  static const char *const keys[] = {"name",
                                     "model",
                                     "hidden",
                                     "data_dir",
                                     "epochs",
                                     "batch_size",
                                     "optimizer",
                                     "sync",
                                     "seed",
                                     "log_every",
                                     "rpc_timeout_ms",
                                     "max_steps",
                                     "heartbeat_ms",
                                     "dead_after_ms",
                                     "unix_sockets",
                                     "shared_memory",
                                     "checkpoint",
                                     "optimizer_overrides",
                                     "channels",
                                     "max_message_mb",
                                     "nonfinite",
                                     "retry_s",
                                     "socket_owner",
                                     "wire_dtype",
                                     "tables",
                                     "table_defaults",
                                     "ctr",
                                     "worker_command",
                                     "tensorboard_dir",
                                     "metrics_listen",
                                     "exit_when_done",
                                     "publish",
                                     "shards"};
  static const char *const models[] = {"softmax", "mlp", "cnn", "ctr", NULL};
  static const char *const nonfinite[] = {"reject", "skip", "apply", NULL};
  static const char *const dtypes[] = {"f32", "bf16", NULL};
  json_t *job, *seed;
  long long x;

  out->replicas_to_aggregate = nworker;
  out->min_replicas = nworker;
  job = cm__opt_object(e, root, "", "job", "an object of training settings");
  if (!job)
    return;
  cm__check_keys(e, job, "job", keys, sizeof keys / sizeof keys[0]);
  parse_name(e, job, out);
  cm__opt_choice(e, job, "job", "model", models, out->model, sizeof out->model);
  parse_hidden(e, job, out);
  cm__opt_string(e, job, "job", "data_dir", out->data_dir,
                 sizeof out->data_dir);
  cm__opt_int(e, job, "job", "epochs", 1, INT_MAX, &out->epochs);
  cm__opt_int(e, job, "job", "batch_size", 1, INT_MAX, &out->batch_size);
  cm__parse_optimizer(e, job, out);
  parse_sync(e, job, nworker, out);
  seed = json_object_get(job, "seed");
  if (seed && cm__want_int(e, seed, "job.seed", 0, LLONG_MAX, &x))
    out->seed = (uint64_t)x;
  cm__opt_int(e, job, "job", "log_every", 1, INT_MAX, &out->log_every);
  cm__opt_int(e, job, "job", "rpc_timeout_ms", 1, INT_MAX, &out->timeout_ms);
  cm__opt_int(e, job, "job", "max_steps", 0, INT_MAX, &out->max_steps);
  parse_liveness(e, job, out);
  parse_checkpoint(e, job, out);
  cm__parse_publish(e, job, out);
  cm__opt_bool(e, job, "job", "unix_sockets", &out->unix_sockets);
  cm__opt_bool(e, job, "job", "shared_memory", &out->shared_memory);
  cm__opt_bool(e, job, "job", "exit_when_done", &out->exit_when_done);
  /* At most cluster.ps's count: checked in cm_spec_parse, which knows it. */
  cm__opt_int(e, job, "job", "shards", 1, INT_MAX, &out->shards);
  parse_socket_owner(e, job, out);
  parse_channels(e, job, out);
  /* Settings of one model given with another are a mistake, not noise. */
  if (json_object_get(job, "hidden") && strcmp(out->model, "mlp") != 0 &&
      strcmp(out->model, "ctr") != 0)
    cm__report(e, "job.hidden",
               "only for job.model \"mlp\" (this job's is \"%s\")", out->model);
  if (json_object_get(job, "channels") && strcmp(out->model, "cnn") != 0)
    cm__report(e, "job.channels",
               "only for job.model \"cnn\" (this job's is \"%s\")", out->model);
  parse_max_message(e, job, out);
  cm__opt_choice(e, job, "job", "nonfinite", nonfinite, out->nonfinite,
                 sizeof out->nonfinite);
  cm__opt_choice(e, job, "job", "wire_dtype", dtypes, out->wire_dtype,
                 sizeof out->wire_dtype);
  cm__opt_number(e, job, "job", "retry_s", 0, 1, 1e9,
                 "a number of seconds >= 0 (0: never retry)", &out->retry_s);
  cm__parse_tables(e, job, out);
  cm__parse_ctr(e, job, out);
  parse_worker_command(e, job, out);
  cm__opt_string(e, job, "job", "tensorboard_dir", out->tensorboard_dir,
                 sizeof out->tensorboard_dir);
}

void cm__parse_auth(struct cm__errs *e, json_t *root, struct cm_auth *out) {
  static const char *const keys[] = {"token_file", "tls"};
  static const char *const tls_keys[] = {
      "ca",          "cert",       "key",        "mutual",
      "client_cert", "client_key", "server_name"};
  json_t *auth, *tls;

  auth = cm__opt_object(e, root, "", "auth",
                        "an object like {\"token_file\": \"token\"}");
  if (!auth)
    return;
  if (json_object_get(auth, "token"))
    cm__report(e, "auth.token",
               "a token is never written in the spec; put it in a file (mode "
               "600) and name that file in auth.token_file");
  else
    cm__check_keys(e, auth, "auth", keys, sizeof keys / sizeof keys[0]);
  cm__opt_string(e, auth, "auth", "token_file", out->token_file,
                 sizeof out->token_file);
  tls = cm__opt_object(e, auth, "auth", "tls",
                       "an object like {\"ca\": \"ca.pem\", \"cert\": "
                       "\"server.pem\", \"key\": \"server.key\"}");
  if (!tls)
    return;
  out->tls = 1;
  cm__check_keys(e, tls, "auth.tls", tls_keys,
                 sizeof tls_keys / sizeof tls_keys[0]);
  cm__opt_string(e, tls, "auth.tls", "ca", out->ca, sizeof out->ca);
  cm__opt_string(e, tls, "auth.tls", "cert", out->cert, sizeof out->cert);
  cm__opt_string(e, tls, "auth.tls", "key", out->key, sizeof out->key);
  cm__opt_bool(e, tls, "auth.tls", "mutual", &out->mutual);
  cm__opt_string(e, tls, "auth.tls", "client_cert", out->client_cert,
                 sizeof out->client_cert);
  cm__opt_string(e, tls, "auth.tls", "client_key", out->client_key,
                 sizeof out->client_key);
  cm__opt_string(e, tls, "auth.tls", "server_name", out->server_name,
                 sizeof out->server_name);
  if (!json_object_get(tls, "ca"))
    cm__report(
        e, "auth.tls.ca",
        "missing; expected the CA certificate(s) that signed the shards' "
        "certificate, which clients check it against");
  if (!json_object_get(tls, "cert") || !json_object_get(tls, "key"))
    cm__report(e,
               json_object_get(tls, "cert") ? "auth.tls.key" : "auth.tls.cert",
               "missing; the shards need a certificate and its key");
  if (out->mutual && (!json_object_get(tls, "client_cert") ||
                      !json_object_get(tls, "client_key")))
    cm__report(e,
               json_object_get(tls, "client_cert") ? "auth.tls.client_key"
                                                   : "auth.tls.client_cert",
               "missing; with \"mutual\": true every client presents a "
               "certificate and its key");
}
