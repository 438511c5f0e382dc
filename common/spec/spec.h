/* The cluster spec: one JSON file shaped like TensorFlow's TF_CONFIG,
 *   {"cluster": {"ps": ["host:port", ...], "worker": ["host:port", ...]},
 *    "task": {"type": "worker", "index": 0},
 *    "job": {...training settings...}}
 * Kubeflow's TFJob TF_CONFIG is accepted as it is: a "chief" runs as worker
 * 0 (cluster.chief first in the worker list), "evaluator" entries are noted
 * and ignored, "environment" is accepted and ignored.
 * Every mistake is reported with the file name, its JSON path and what was
 * expected; a spec with any mistake is refused whole (CM_ESPEC).
 *
 * The public header of common/spec: spec.c (parse, load, free) calls on
 * addr.c (cluster), task.c (task, TF_CONFIG), job.c and job_optim.c (job,
 * auth), jcheck.c (typed JSON reads) and errs.c (the mistakes), whose
 * shared internals have headers of their own; addr_local.c says whether an
 * address is this host, fingerprint.c tells two specs' clusters apart;
 * slurm.c derives a spec from Slurm's environment (hostlist.c expands its
 * lists), k8s.c from a Kubernetes pod's or TF_CONFIG, both in the frame of
 * resolve.c. */
#ifndef CM_SPEC_H
#define CM_SPEC_H

#include <stddef.h>
#include <stdint.h>

#include "optconf.h"
#include "tabconf.h"

#define CM_SPEC_MAX_LAYERS 16
#define CM_SPEC_MAX_COMMAND 32 /* most strings in job.worker_command */
#define CM_SPEC_MAX_ARG 1024   /* bytes of one of them, with its NUL */

/* CM_TASK_CHIEF is Kubeflow's "chief", which psd runs as a worker: the
 * parser maps it to CM_TASK_WORKER (the chief is worker 0), so a settled
 * task is never CM_TASK_CHIEF. */
enum cm_task_type {
  CM_TASK_NONE = 0,
  CM_TASK_PS,
  CM_TASK_WORKER,
  CM_TASK_CHIEF,
  CM_TASK_SERVE /* a serving task of cluster.serve (docs/serving.md) */
};

/* One task's network address, split from "host:port". */
struct cm_addr {
  char host[256]; /* host name or IPv4/IPv6 literal, without brackets */
  int port;       /* 1..65535 */
  char text[300]; /* the address as written in the spec, "host:port" */
};

/* Which task this process is. */
struct cm_task {
  enum cm_task_type type; /* CM_TASK_NONE when not given anywhere */
  int index;              /* index into cluster.ps or cluster.worker */
};

/* The click-through-rate model's settings (job.model "ctr", job.ctr;
 * docs/ctr.md). */
struct cm_ctr_conf {
  char format[8];       /* "format": the data's, "libsvm" (default:
                           train.svm, test.svm) or "criteo" (train.tsv[.gz],
                           test.tsv[.gz]: 26 categorical and 13 integer
                           features, 39 fields) */
  int fields;           /* "fields": categorical fields per example, 1..64,
                           default 8; 39 with format "criteo" */
  char pooling[8];      /* "pooling": "sum" (default) or "mean" of a field's
                           embeddings */
  char emb_table[201];  /* "embedding_table": default "emb" */
  char wide_table[201]; /* "wide_table" (dim 1): default "wide" */
  long long train;      /* "generate.train": examples generated, default
                           500000 */
  long long test;       /* "generate.test": held-out examples, default
                           50000 */
  uint64_t data_seed;   /* "generate.seed": the data's seed, default 7 */
  double zipf;          /* "generate.zipf": the ids' exponent, default 1.6 */
  /* "stream" (docs/ctr.md "Training on a stream"): train on parts as they
   * land instead of train.svm, until the end marker or SIGTERM. */
  char stream_dir[1024];   /* "stream.dir": a directory of time-ordered parts
                              (relative: to the spec file's directory); ""
                              when not streaming from a directory */
  char stream_file[1024];  /* "stream.file": one growing LIBSVM file (as
                              stream.dir); "" when not given */
  char stream_end[256];    /* "stream.end": the end marker's file name (in
                              the directory; for a file, beside it), default
                              "END" */
  double stream_poll_s;    /* "stream.poll_s": seconds between looks for new
                              data, (0, 60), default 0.5 */
  long long stream_window; /* "stream.window": stream.file only, lines per
                              window, default 10000 */
};

/* Training settings from the spec's "job" object; every field has a default,
 * filled by the parser (the sync fields too, whatever the mode). */
struct cm_job {
  char name[64];  /* "job.name", default "psd-job"; also the job id */
  char model[32]; /* "job.model": "softmax", "mlp" (default), "cnn" or
                     "ctr" (click-through rate over embedding tables) */
  int hidden[CM_SPEC_MAX_LAYERS]; /* "job.hidden" (mlp and ctr), default
                                     [256, 128] */
  int nhidden;                    /* entries used in hidden */
  char data_dir[512];             /* "job.data_dir", default
                                     /usr/share/datasets/fashion-mnist */
  int epochs;                     /* "job.epochs", default 3, >= 1 */
  int batch_size; /* "job.batch_size" per worker, default 64, >= 1 */
  /* "job.optimizer" (optim.def, defaults from cm_optim_defaults) and
   * "job.optimizer_overrides" (optim.rules): each variable's optimizer is
   * cm_optim_pick(&optim, name) */
  struct cm_optim_set optim;
  /* "job.optimizer.clip_norm" > 0: a worker scales its whole gradient
   * (every variable, every shard) down to this global L2 norm before
   * pushing it; 0 (default) = no clipping */
  double clip_norm;
  char mode[16]; /* "job.sync.mode": "async" (default) or "sync" */
  /* async only: "job.sync.staleness" s >= 0, the stale-synchronous bound (a
   * worker at clock c waits until the slowest live one reaches c - s);
   * -1 = unbounded (default) */
  int staleness;
  /* sync only: "job.sync.replicas_to_aggregate" k in 1..nworker, the
   * gradients applied per step (nworker - k are backups); default nworker */
  int replicas_to_aggregate;
  /* sync only: "job.sync.min_replicas" m in 1..k, the fewest gradients a
   * step may close with at its deadline; default k */
  int min_replicas;
  /* sync only: "job.sync.deadline.multiple" > 0, default 3.0: admission to
   * a step closes at this multiple of the median recent step time */
  double deadline_multiple;
  /* sync only: "job.sync.deadline.floor_ms" >= 1, default 1000: the
   * deadline is never shorter than this */
  int deadline_floor_ms;
  /* sync only: "job.sync.deterministic" (a JSON boolean), default 0: never
   * close a step at its deadline, and wait for every worker's first join
   * however long it takes (shards always sum a step's gradients in worker
   * order), so that a run's result does not depend on timing */
  int deterministic;
  /* "job.heartbeat_ms" >= 1, default 500: how often workers tell the
   * coordinator they live */
  int heartbeat_ms;
  /* "job.dead_after_ms" > heartbeat_ms, default 5000: a worker silent this
   * long is declared dead and leaves the live count */
  int dead_after_ms;
  uint64_t seed; /* "job.seed", default 1 */
  int log_every; /* "job.log_every" steps between progress lines, default 100 */
  int timeout_ms; /* "job.rpc_timeout_ms", per-call deadline, default 30000 */
  int max_steps;  /* "job.max_steps", 0 = no limit (tests use it) */
  /* "job.checkpoint.dir": where the shards checkpoint ("" when not set);
   * cm_spec_load makes a relative path relative to the spec file's
   * directory (cm_spec_parse leaves it as written) */
  char ckpt_dir[1024];
  /* "job.checkpoint.every_steps" >= 0, default 0 (never): checkpoint after
   * every N steps (sync: commits; async: pushes a shard applied) */
  int ckpt_every_steps;
  /* "job.checkpoint.every_s" >= 0, default 0 (never): checkpoint every S
   * seconds when something changed */
  double ckpt_every_s;
  int ckpt_keep; /* "job.checkpoint.keep" >= 1, default 3: newest kept */
  /* "job.publish.dir": where training shards publish what changed for the
   * serving tasks ("" = off, the default); cm_spec_load makes a relative
   * path relative to the spec file's directory (docs/serving.md) */
  char publish_dir[1024];
  /* "job.publish.interval_s" > 0, default 5: seconds between publications */
  double publish_interval_s;
  /* "job.publish.full_every" >= 1, default 10: the first publication of a
   * shard's process and every full_every-th after it hold every row; the
   * others only what changed (1: every one full) */
  int publish_full_every;
  /* "job.publish.keep" >= 1, default 2: full publications kept on disk,
   * each with the deltas that follow it */
  int publish_keep;
  /* "job.unix_sockets" (a JSON boolean), default 1: a client on the same
   * host as a shard dials the shard's Unix-domain socket instead of TCP */
  int unix_sockets;
  /* "job.shared_memory" (a JSON boolean), default 1: where a client uses a
   * shard's Unix socket, tensor bytes go through a memfd arena it hands the
   * shard (common/rpc/shm.h), gRPC carrying only the control messages */
  int shared_memory;
  /* "job.exit_when_done" (a JSON boolean), default 0: a shard stops by
   * itself (final checkpoint, exit 0) once every worker of the job has
   * finished, so an engine waiting for every process of the job (a
   * Kubernetes Job, a TFJob) sees it complete */
  int exit_when_done;
  /* "job.shards" in 1..nps, default 0 (= nps): the shards a new job starts
   * with; the others stand by for a live reshard (psctl reshard). A job
   * that has a checkpoint keeps the count of its layout instead
   * (docs/reshard.md "Live") */
  int shards;
  /* "job.socket_owner": a user name or numeric uid (a JSON string, or an
   * integer 0..4294967294) whose same-host sockets clients trust besides
   * their own user's and root's (common/rpc/endpoint.h); "" = none */
  char socket_owner[33];
  /* "job.channels" (cnn only): the output channels of the CNN's two
   * convolutions, each in 1..1024, default [16, 32] */
  int channels[2];
  /* "job.max_message_mb" in CM_SPEC_MIN_MESSAGE_MB..2047, default 64: the
   * largest gRPC message (MiB) shards and clients send or accept */
  int max_message_mb;
  /* "job.nonfinite": what a shard does with a push whose gradient holds NaN
   * or an infinity: "reject" (default; INVALID_ARGUMENT, nothing applied),
   * "skip" (acknowledged, not applied) or "apply" (applied as it is); each
   * counted */
  char nonfinite[8];
  /* "job.wire_dtype": how pulls and pushes carry tensors: "f32" (default)
   * or "bf16" (half the bytes, rounded to nearest even; shards keep f32
   * values and optimizer state) */
  char wire_dtype[8];
  /* "job.retry_s" >= 0, default 120: how long a worker retries calls to a
   * shard that fails UNAVAILABLE, DEADLINE_EXCEEDED or CANCELLED (down,
   * restarting, stopped, cut off) before giving up; 0: never retry */
  double retry_s;
  /* "job.tables": the job's embedding tables (docs/tables.md), each a
   * cm_table_conf; psd creates them when it starts */
  struct cm_table_conf tables[CM_TABLE_MAX];
  int ntables; /* entries used in tables */
  /* "job.table_defaults": the settings (init, init_scale, optimizer,
   * admission, eviction; name, dim and id_bound unused) of a table a client
   * declares that job.tables does not list, and of what a job.tables entry
   * leaves out; cm_table_conf_defaults' where the spec gives none */
  struct cm_table_conf table_defaults;
  struct cm_ctr_conf ctr; /* "job.ctr", with job.model "ctr" */
  /* "job.worker_command": the program (worker_command[0]) and arguments
   * pslaunch runs for each worker task instead of dworker, as written (a
   * relative program path is pslaunch's to resolve); 1..CM_SPEC_MAX_COMMAND
   * non-empty strings */
  char worker_command[CM_SPEC_MAX_COMMAND][CM_SPEC_MAX_ARG];
  int nworker_command; /* entries used in worker_command, 0 when not set */
  /* "job.tensorboard_dir": where dworker writes TensorBoard event files of
   * its progress (one file per worker; "" = none, the default);
   * cm_spec_load makes a relative path relative to the spec file's
   * directory */
  char tensorboard_dir[1024];
};

/* Smallest job.max_message_mb: a 2 MiB chunk, its head and headroom. */
#define CM_SPEC_MIN_MESSAGE_MB 4

/* The spec's "auth" object: who may talk to the shards (common/rpc/auth.h).
 * cm_spec_load makes relative paths relative to the spec file's directory;
 * the files themselves are read by cm_creds_load, each role only what it
 * needs. */
struct cm_auth {
  char token_file[1024];  /* "auth.token_file": the bearer token, "" = none */
  int tls;                /* "auth.tls" is present */
  char ca[1024];          /* "auth.tls.ca": the CA certificates that signed the
                             shards' (and with mutual, the clients') certificates */
  char cert[1024];        /* "auth.tls.cert": the shards' certificate chain */
  char key[1024];         /* "auth.tls.key": its private key */
  int mutual;             /* "auth.tls.mutual" (boolean, default false): shards
                             require a client certificate signed by auth.tls.ca */
  char client_cert[1024]; /* "auth.tls.client_cert": with mutual */
  char client_key[1024];  /* "auth.tls.client_key": its private key */
  char server_name[256];  /* "auth.tls.server_name": the name clients expect
                             in a shard's certificate, "" = its host */
};

/* A parsed spec. Owned by the caller of cm_spec_load/cm_spec_parse; free
 * with cm_spec_free. */
struct cm_spec {
  char source[512];       /* file name used in error messages */
  int nps;                /* entries in ps, >= 1 */
  struct cm_addr *ps;     /* owned array of nps shard addresses */
  int nworker;            /* entries in worker, >= 1 */
  struct cm_addr *worker; /* owned array of nworker worker addresses */
  int nserve;             /* entries in serve: 0 when cluster.serve is absent;
                             else a multiple of nps */
  struct cm_addr *serve;  /* owned array of nserve serving task addresses
                             (cluster.serve): serve:J follows shard J % nps,
                             as its replica J / nps; NULL when absent */
  struct cm_task task;    /* from "task", CM_TASK_NONE when absent */
  struct cm_job job;      /* from "job", defaults filled in */
  struct cm_auth auth;    /* from "auth"; all empty when absent */
  int nchief;       /* entries of Kubeflow's cluster.chief: the first nchief of
                       worker (a task "worker" index i is worker nchief + i) */
  char notes[1024]; /* what was accepted and ignored (cluster.evaluator,
                       an unknown task type), one line each, "" when
                       nothing: the programs log it */
  /* "job.metrics_listen": owned array of nps addresses, shard i's HTTP
   * endpoint for GET /metrics at metrics[i]; NULL when not set (off, the
   * default). A "host:port" string gives shard i host:port+i, an array
   * one address per shard (job_metrics.c). */
  struct cm_addr *metrics;
};

/* Parses the JSON text json[0..len) named `source` in messages. On success
 * stores a new spec in *out and returns 0. On failure returns CM_ESPEC and
 * writes every mistake, one per line, into err (each line like
 * "local.json: cluster.ps[1]: \"127.0.0.1\" has no port; expected
 * \"host:port\""), or a JSON syntax error with its line and column. */
int cm_spec_parse(const char *json, size_t len, const char *source,
                  struct cm_spec **out, char *err, size_t errlen);

/* Reads and parses the file at path; a missing or unreadable file is
 * reported in err with the path and strerror, returning CM_ENOENT or CM_EIO. */
int cm_spec_load(const char *path, struct cm_spec **out, char *err,
                 size_t errlen);

/* Opens the spec a --cluster argument names: "slurm" or "slurm:FILE"
 * derive it from Slurm's environment with FILE's job settings (slurm.h,
 * cm_slurm_spec), "k8s" or "k8s:FILE" from a Kubernetes pod's, and
 * "tf_config" or "tf_config:FILE" from a Kubeflow TFJob's TF_CONFIG (k8s.h),
 * anything else is a spec file (cm_spec_load; "./slurm" is
 * a file named slurm). With json not NULL, *json receives the spec's JSON
 * text, NUL-terminated (free with free()): the derived one, or the file's
 * own. Returns 0, or what those return with the mistakes in err. */
int cm_spec_open(const char *cluster, struct cm_spec **out, char **json,
                 char *err, size_t errlen);

/* 1 when a --cluster argument asks for Slurm ("slurm" or "slurm:FILE"). */
int cm_spec_is_slurm(const char *cluster);

/* Writes spec->notes to stderr, a line each as "prog: note: ...". */
void cm_spec_say_notes(const struct cm_spec *spec, const char *prog);

/* 1 when a --cluster argument names an engine whose environment gives the
 * cluster and this process's task: "slurm", "k8s" or "tf_config", each
 * alone or with ":FILE" (cm_spec_open derives the spec). */
int cm_spec_is_engine(const char *cluster);

void cm_spec_free(struct cm_spec *spec);

/* Parses "ps:1" or "worker:0" into *out; CM_EINVAL with a message otherwise. */
int cm_task_parse(const char *text, struct cm_task *out, char *err,
                  size_t errlen);

/* Settles which task this process is: `cli` (from --task, may be NULL) wins,
 * then the spec's own "task", then the TF_CONFIG environment variable's
 * "task". Checks the index against the cluster (e.g. "--task worker:5: index
 * out of range; cluster.worker has 2 entries"). Returns 0 or CM_ESPEC. */
int cm_spec_resolve_task(struct cm_spec *spec, const char *cli, char *err,
                         size_t errlen);

/* "ps" or "worker". */
const char *cm_task_type_name(enum cm_task_type type);

/* A fingerprint of what every task of a job must agree on: the job's name
 * and the cluster's shard and worker addresses, in order, as written
 * (fingerprint.c). Never 0. Specs that differ only in other settings (the
 * task, training settings, auth) have the same one. */
uint64_t cm_spec_fingerprint(const struct cm_spec *spec);

/* Parses "host:port" text (IPv4, "[IPv6]", a host name; a port in
 * 1..65535) into *out, as cluster.ps entries are. Returns 0, or CM_EINVAL
 * with one line "what: ...: expected ..." in err. */
int cm_addr_parse(const char *text, const char *what, struct cm_addr *out,
                  char *err, size_t errlen);

/* Returns 1 when the host names this machine (localhost, 127.0.0.0/8, ::1,
 * this host's name or one of its interface addresses), else 0. */
int cm_addr_is_local(const struct cm_addr *addr);

#endif
