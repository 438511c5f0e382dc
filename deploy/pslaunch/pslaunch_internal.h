/* pslaunch's internals, shared by its files and by nothing else: the
 * launcher's state (struct pl_launch, one per run, which main owns and
 * every libuv callback reaches through its handle's data), the tasks and
 * their output streams, and the functions each file gives the others.
 * Names shared between pslaunch's files take the pl_ prefix; names used in
 * one file only are static there.
 *
 *   pslaunch.c  main: from the command line to the exit status
 *   cmdline.c   the command line and --help
 *   binaries.c  finding the psd and dworker binaries to run, or the
 *               spec's job.worker_command instead of dworker
 *   command.c   the environment a job.worker_command runs in (TF_CONFIG,
 *               PSD_SPEC, PSD_TASK, PYTHONPATH)
 *   tasks.c     picking this host's tasks from the spec, checking ports
 *   output.c    what pslaunch writes: its own "pslaunch:" lines, and the
 *               children's output, line by line with the task's prefix
 *   children.c  spawning and supervising the children: exits, signals,
 *               the stop and its timers, the summary
 *   exec_task.c the child's side of a spawn: the parent-death signal, then
 *               the task's program
 *   watch.c     waiting for the cluster's other workers: ps:0's Status,
 *               asked until every worker has finished or is gone
 *   jobrate.c   the job's measured rate (ps:0's Status), printed as the
 *               stdout line "job: ..." once every worker is done
 *   export.c    --export DIR: every table and the variables written by
 *               psctl export once every worker is done, before the ps
 *               tasks stop */
#ifndef PL_PSLAUNCH_INTERNAL_H
#define PL_PSLAUNCH_INTERNAL_H

#include <jansson.h>
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "spec.h"

/* Longest output line passed on whole; a longer one is cut into pieces of
 * this size, each printed with the prefix. */
#define PL_LINE_CAP 65536

/* Exit codes, as documented in --help. */
enum { PL_EXIT_OK = 0, PL_EXIT_FAILED = 1, PL_EXIT_USAGE = 2 };

/* The hidden first argument that makes pslaunch the child's side of a
 * spawn (exec_task.c): "pslaunch --exec-task PID PROGRAM ARGS...". */
#define PL_EXEC_TASK "--exec-task"

/* How often ps:0 is asked for the workers' state while pslaunch waits for
 * the cluster's other workers, and the deadline of each ask. */
#define PL_WATCH_EVERY_MS 1000
#define PL_WATCH_DEADLINE_MS 2000

/* What the command line asked for. Strings point into argv. */
struct pl_options {
  const char *spec_path;  /* FILE, or --cluster's "slurm[:FILE]" (or k8s,
                             tf_config) */
  int engine;             /* spec_path names an engine (cm_spec_is_engine):
                             start only the task its environment names */
  int print_spec;         /* --print-spec: print the spec, start nothing */
  const char *psd;        /* --psd, NULL for the default */
  const char *dworker;    /* --dworker, NULL for the default */
  const char *psctl;      /* --psctl, NULL for the default */
  int want_ps;            /* start local ps tasks (not --only worker) */
  int want_worker;        /* start local workers (not --only ps) */
  double stop_timeout;    /* --stop-timeout, seconds */
  const char *export_dir; /* --export DIR, NULL when not given */
  char **extra;           /* arguments after "--", passed to every dworker */
  int nextra;             /* entries in extra */
};

struct pl_launch;
struct pl_task;

/* One of a child's output streams, cut into lines. */
struct pl_stream {
  struct pl_task *task; /* the task whose output this is */
  uv_pipe_t pipe;       /* read end of the child's stdout or stderr */
  int fd;               /* where its lines go: STDOUT_FILENO or STDERR_FILENO */
  int state;            /* 0 closed (or never opened), 1 open, 2 closing */
  size_t len;           /* bytes in buf: the start of a line not yet ended */
  char buf[PL_LINE_CAP]; /* the partial line */
};

/* One local task and the child process that runs it. */
struct pl_task {
  struct pl_launch *l;        /* the launcher it belongs to */
  char name[32];              /* "ps:0", "worker:1": its output prefix */
  enum cm_task_type type;     /* CM_TASK_PS, CM_TASK_SERVE or CM_TASK_WORKER */
  int index;                  /* I of ps:I, serve:I or worker:I */
  const struct cm_addr *addr; /* its address in the spec (spec-owned) */
  uv_process_t proc;          /* the child, once spawn was tried */
  int proc_open;              /* proc needs (or is waiting for) uv_close */
  struct pl_stream out;       /* the child's stdout */
  struct pl_stream err;       /* the child's stderr */
  int started;                /* uv_spawn succeeded */
  int running;                /* started and not reaped: safe to signal */
  int pid;                    /* the child's PID, once started */
  int64_t exit_status;        /* exit status, when it exited normally */
  int term_signal;            /* signal that ended it, or 0 */
  int sent_term;              /* pslaunch sent it SIGTERM */
  int sent_kill;              /* pslaunch sent it SIGKILL */
  uint64_t t_start;           /* uv_hrtime() at spawn */
  uint64_t t_end;             /* uv_hrtime() when reaped */
  int xport;                  /* a psctl export run of --export (export.c),
                                 not a task of the spec */
  char xtable[CM_TABLE_MAX_NAME + 1]; /* with xport: the table it exports,
                                         "" for the variables */
  char xout[PATH_MAX];                /* with xport: the file it writes */
};

/* What watch.c last made of a worker of the cluster. */
enum pl_worker_state {
  PL_W_UNKNOWN = 0, /* ps:0 has not answered yet */
  PL_W_MINE,        /* this launcher ran it, and it exited 0 */
  PL_W_NOT_JOINED,  /* not joined the job yet: not started, or still loading */
  PL_W_TRAINING,    /* joined and live */
  PL_W_FINISHING,   /* left the job (Join leave) but still connected: worker 0
                       pulls the final parameters after leaving */
  PL_W_FINISHED,    /* left and silent: its process has let go of the job */
  PL_W_DEAD,        /* declared dead by the coordinator (silent, not left) */
};

/* Waiting for the cluster's other workers (watch.c): once this launcher's
 * own workers are done (at once when it runs none), ps:0's Status is asked
 * every PL_WATCH_EVERY_MS on libuv's thread pool, since libpsclient's calls
 * block, until every worker of the spec has finished or is gone. Each ask
 * has a client (a connection) of its own: an idle connection held between
 * asks would hold up ps:0's graceful stop until gRPC's backup poller
 * noticed the shard's goodbye, seconds later. */
struct pl_watch {
  int active;                  /* waiting has begun: the timer needs uv_close,
                                  gRPC is initialised until pl_watch_free */
  uv_timer_t timer;            /* the next ask */
  uv_work_t work;              /* the ask in flight, on the thread pool */
  int busy;                    /* work is queued or running */
  char *json;                  /* the ask's answer (free()), NULL on failure */
  int rc;                      /* the ask's result: 0 or a negative code */
  char err[1024];              /* its error in words, when rc < 0 */
  enum pl_worker_state *state; /* owned, one per worker of the spec */
  int answered;                /* ps:0 has answered at least once */
  int all_leaving;             /* its last answer: every worker left or gone */
  int fails;                   /* asks failed in a row */
  uint64_t said_fail_at;       /* uv_now when that was last said */
  char said[1024];             /* the last "waiting for ..." line printed */
};

/* The launcher's whole state, passed to every callback through handle data. */
struct pl_launch {
  uv_loop_t loop;               /* the one loop */
  const struct pl_options *opt; /* the command line */
  const struct cm_spec *spec;   /* the cluster spec, main's */
  char self[PATH_MAX];          /* pslaunch itself: each child starts as it */
  char psd[PATH_MAX];           /* resolved psd binary */
  char dworker[PATH_MAX];       /* resolved dworker binary */
  char psctl[PATH_MAX];         /* with --export: the psctl that writes the
                                   files */
  /* With job.worker_command (l->command[0] != '\0' once settled): its
   * program, resolved, which each worker task runs instead of dworker */
  char command[PATH_MAX];
  char spec_abs[PATH_MAX];      /* the spec file's absolute path (PSD_SPEC) */
  const char *derived;          /* under an engine (--cluster slurm, k8s,
                                   tf_config): the derived spec's text, main's;
                                   else NULL */
  char spec_tmp[PATH_MAX];      /* the file it was written to for PSD_SPEC
                                   (removed at the end), "" when none */
  char spec_dir[PATH_MAX];      /* its directory, the command's working one */
  char pythonpath[PATH_MAX];    /* BUILD/worker/python when pslaunch runs from a
                                   build tree and it exists, else "" */
  struct pl_task *tasks;        /* owned array: local ps tasks, serving
                                   tasks, then workers */
  int ntasks;                   /* entries in tasks */
  int nps;                      /* local ps tasks among them */
  int nserve;                   /* local serving tasks (serve:J) among them */
  int nworkers;                 /* local workers among them */
  int nforeign;                 /* workers of the spec not run here */
  int nworkers_done;            /* workers that exited with status 0 */
  struct pl_task *xtasks;       /* with --export, once every worker is done:
                                   one psctl run per file (owned), the
                                   tables' then the variables' */
  int nxtasks;                  /* entries in xtasks */
  int xnext;                    /* the next of them to start */
  struct pl_watch watch;        /* waiting for the other workers */
  int width;                    /* longest task name, for aligned prefixes */
  int stopping;                 /* 0 running; 1 once the stop has begun */
  int result;                   /* exit code, settled when the stop begins */
  int interrupted_by;           /* the signal that began the stop, or 0 */
  const struct pl_task *failed; /* the failure that began the stop, or NULL */
  int finishing;                /* own handles are being closed */
  uv_signal_t sig_int;          /* SIGINT watcher */
  uv_signal_t sig_term;         /* SIGTERM watcher */
  uv_signal_t sig_hup;          /* SIGHUP watcher */
  uv_timer_t kill_timer;        /* SIGKILL to survivors after stop_timeout */
  uv_timer_t drain_timer;       /* closes pipes kept open by grandchildren */
  int drain_started;            /* drain_timer has been started */
  char scratch[PL_LINE_CAP + 64]; /* one prefixed line being written */
};

/* ---- cmdline.c ---- */

/* Parses argv into *o. Returns -1 to go on, or the exit code to leave with
 * (0 after --help, 2 after a usage error, both already reported). */
int pl_parse_args(int argc, char **argv, struct pl_options *o);

/* ---- binaries.c ---- */

/* Settles l->self (pslaunch's own binary, which every child runs first),
 * l->psctl with --export, l->psd when this host has ps tasks and
 * l->dworker when it has workers:
 * the path given with --psd or --dworker (a name without a slash is looked
 * up in PATH), else the first that exists beside pslaunch itself. When the
 * spec sets job.worker_command and this host has workers, settles
 * l->command, l->spec_abs, l->spec_dir and l->pythonpath instead of
 * l->dworker. Returns 0, or CM_ENOENT (or CM_EINVAL for --dworker given
 * with job.worker_command) with a message in err. */
int pl_find_binaries(struct pl_launch *l, char *err, size_t errlen);

/* ---- tasks.c ---- */

/* Fills l->tasks with the spec's tasks on this host that the options ask
 * for, ps tasks first, then serving tasks, and counts the spec's workers it
 * leaves to others. Returns 0 or CM_ENOMEM. */
int pl_select_tasks(struct pl_launch *l, const struct cm_spec *spec);

/* Binds and listens on every local ps and serving task's address, all at once
 * (so two tasks given the same port clash too), then lets them all go.
 * SO_REUSEADDR is on, as in gRPC's own listener: a socket that is listening
 * still clashes, but connections in TIME_WAIT from an earlier run do not.
 * Returns 0, or CM_EADDRINUSE / CM_ESYS with "ps:0: cannot listen on HOST:PORT:
 * why" in err. */
int pl_check_ports(const struct pl_launch *l, char *err, size_t errlen);

/* ---- output.c ---- */

/* Writes all of buf[0..len) to fd in as few write() calls as the kernel
 * allows, so a line from one child is never split by another's. */
void pl_write_all(int fd, const char *buf, size_t len);

/* Prints one "pslaunch: ..." line on stderr with a single write. */
void pl_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Prints every line of a multi-line message, each as a "pslaunch:" line. */
void pl_say_lines(const char *text);

/* Readies s to carry task t's output to fd (STDOUT_FILENO or
 * STDERR_FILENO): its pipe, for uv_spawn to connect. Returns 0 or a
 * negative libuv code. */
int pl_stream_open(struct pl_launch *l, struct pl_task *t, struct pl_stream *s,
                   int fd);

/* Starts reading s's pipe once the child runs: each line is written with
 * the task's prefix as it arrives. Returns 0 or a negative libuv code. */
int pl_stream_read_start(struct pl_stream *s);

/* Prints what is left of an unfinished line and closes the pipe. */
void pl_close_stream(struct pl_stream *s);

/* ---- children.c ---- */

/* Once every child is reaped and every pipe closed, closes the launcher's
 * own handles so uv_run returns. Pipes that a child's own children still
 * hold open get one second to drain. */
void pl_check_done(struct pl_launch *l);

/* Runs the selected tasks to the end. Returns pslaunch's exit code. */
int pl_launch_run(struct pl_launch *l);

/* Begins stopping every task: SIGTERM now, SIGKILL after the stop timeout.
 * The first caller settles the exit code (result). */
void pl_stop_all(struct pl_launch *l, int result);

/* Every worker of the cluster has finished with status 0: with --export
 * the export runs first (pl_export_begin), then the tasks stop with exit
 * 0. */
void pl_job_done(struct pl_launch *l);

/* Starts task t's child (a task of the spec, or an export run) with its
 * output piped back. Returns 0, or a negative libuv code (reported). */
int pl_spawn_task(struct pl_launch *l, struct pl_task *t);

/* ---- command.c ---- */

/* The environment worker task t's job.worker_command runs in: pslaunch's
 * own, with TF_CONFIG (the spec's cluster and t as the task), PSD_SPEC,
 * PSD_TASK and, when l->pythonpath is set, PYTHONPATH (l->pythonpath, then
 * what it was) set. On success *env is a NULL-terminated array, every
 * string and the array itself the caller's to free with
 * pl_command_env_free. Returns 0 or CM_ENOMEM. */
int pl_command_env(const struct pl_launch *l, const struct pl_task *t,
                   char ***env);

/* Frees what pl_command_env made; NULL is fine. */
void pl_command_env_free(char **env);

/* ---- exec_task.c ---- */

/* The child's side of a spawn, "pslaunch --exec-task PID PROGRAM ARGS...":
 * asks the kernel for SIGTERM when the launcher (PID) dies, then runs
 * PROGRAM. Returns (an exit code) only when that failed. */
int pl_exec_task(int argc, char **argv);

/* ---- watch.c ---- */

/* Begins waiting for the spec's workers that this launcher does not run:
 * prints what it waits for as ps:0 answers, and calls pl_stop_all once
 * every worker of the cluster has finished or is gone. Returns 0, or a
 * negative code (reported) when ps:0 cannot be asked at all. */
int pl_watch_start(struct pl_launch *l);

/* One Status call to ps:0 (blocks up to timeout_ms, no retries), on a
 * connection of its own closed before it returns: 0 and *json (caller
 * frees with free()), or a negative code and err saying why. */
int pl_ask_status(const struct pl_launch *l, int timeout_ms, char **json,
                  char *err, size_t len);

/* Closes the watch's timer, for pl_check_done. */
void pl_watch_close(struct pl_launch *l);

/* Frees what the watch owns, once the loop has ended. */
void pl_watch_free(struct pl_launch *l);

/* ---- jobrate.c ---- */

/* Prints the job's rate from ps:0's Status answer (parsed JSON, borrowed)
 * as the stdout line "job: workers=N reported=N examples=N wall_s=S
 * examples_per_s=R", or says on stderr why there is none. */
void pl_job_rate_print(const struct pl_launch *l, json_t *status);

/* Asks ps:0 for its Status (one call, a short deadline; blocks) and prints
 * the job's rate as pl_job_rate_print does, or says why it cannot. */
void pl_job_rate_ask(const struct pl_launch *l);

/* ---- export.c ---- */

/* Before anything starts: --export's DIR made, or found empty (CM_EEXIST
 * when it holds a file), and refused under an engine. Returns 0, or a
 * negative code with err. */
int pl_export_prepare(struct pl_launch *l, char *err, size_t errlen);

/* Lists the shards' tables and starts the first psctl export; the last
 * one's end stops the job (pl_stop_all). A failure is said and stops the
 * job with exit 1. */
void pl_export_begin(struct pl_launch *l);

/* Export run t was reaped: the next starts, or the job stops. */
void pl_export_exited(struct pl_launch *l, struct pl_task *t);

#endif
