/* The children: each local task is spawned in a session of its own with
 * its output piped back (output.c), through pslaunch itself so that it gets
 * SIGTERM if pslaunch dies (exec_task.c), and reaped by its exit callback,
 * which decides whether the job goes on. When the local workers are done
 * but the cluster has workers run elsewhere, the ps tasks wait for them
 * (watch.c). Stopping sends SIGTERM to every task still running, then
 * SIGKILL to survivors after --stop-timeout; SIGINT, SIGTERM and SIGHUP to
 * pslaunch begin the same stop. Once every child is reaped and every pipe
 * closed, the loop ends and the summary says how each task ended. Only the
 * processes started here are ever signalled, each by its own PID. A worker
 * is dworker, or the spec's job.worker_command (its environment made by
 * command.c): either way it is started, watched and counted the same.
 * With --export, psctl export runs (export.c) start here too, one at a
 * time, between the workers' end and the ps tasks' stop. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "pslaunch_internal.h"

/* A signal's name without "SIG" ("INT"), or "?". */
static const char *signame(int sig) {
  const char *abbrev = sigabbrev_np(sig);
  return abbrev ? abbrev : "?";
}

/* Says how a reaped task ended: "exit 3" or "killed by signal 9". */
static void describe_end(const struct pl_task *t, char *buf, size_t len) {
  if (t->term_signal)
    snprintf(buf, len, "killed by signal %d", t->term_signal);
  else
    snprintf(buf, len, "exit %lld", (long long)t->exit_status);
}

/* The i-th child of every kind: the spec's tasks, then the export runs. */
static struct pl_task *child(struct pl_launch *l, int i) {
  return i < l->ntasks ? &l->tasks[i] : &l->xtasks[i - l->ntasks];
}

/* Sends sig to every task still running; only our own children, by PID. */
static void signal_all(struct pl_launch *l, int sig) {
  int i;

  for (i = 0; i < l->ntasks + l->nxtasks; i++) {
    struct pl_task *t = child(l, i);
    int rc;

    if (!t->running)
      continue;
    if (sig == SIGKILL)
      pl_say("%s (pid %d) still running; sending SIGKILL", t->name, t->pid);
    cm_debug("sending SIG%s to %s (pid %d)", signame(sig), t->name, t->pid);
    rc = uv_process_kill(&t->proc, sig);
    if (rc < 0 && rc != UV_ESRCH)
      pl_say("%s (pid %d): kill: %s", t->name, t->pid, uv_strerror(rc));
    t->sent_term |= sig == SIGTERM;
    t->sent_kill |= sig == SIGKILL;
  }
}

static void on_kill_timer(uv_timer_t *h) { signal_all(h->data, SIGKILL); }

void pl_stop_all(struct pl_launch *l, int result) {
  if (l->stopping)
    return;
  l->stopping = 1;
  l->result = result;
  signal_all(l, SIGTERM);
  uv_timer_start(&l->kill_timer, on_kill_timer,
                 (uint64_t)(l->opt->stop_timeout * 1000), 0);
}

/* SIGINT, SIGTERM or SIGHUP to pslaunch: the first begins the stop; a
 * second SIGINT kills every task at once. */
static void on_signal(uv_signal_t *h, int signum) {
  struct pl_launch *l = h->data;

  if (l->stopping) {
    if (signum == SIGINT) {
      pl_say("SIGINT again; killing every task now");
      signal_all(l, SIGKILL);
    }
    return;
  }
  pl_say("got SIG%s; stopping every task", signame(signum));
  l->interrupted_by = signum;
  pl_stop_all(l, 128 + signum);
}

/* Every local worker has finished: the ps tasks (and serving tasks) stop,
 * unless workers run elsewhere may still need them. */
static void workers_done(struct pl_launch *l) {
  if (l->nps + l->nserve > 0 && l->nforeign > 0) {
    pl_say("all %d local workers finished; the ps tasks keep serving the "
           "cluster's %d other worker%s",
           l->nworkers, l->nforeign, l->nforeign == 1 ? "" : "s");
    if (pl_watch_start(l) < 0)
      pl_say("the ps tasks run until pslaunch is interrupted");
    return;
  }
  /* Every worker of the cluster is done: their reports are in. */
  if (l->nforeign == 0)
    pl_job_rate_ask(l);
  if (l->opt->export_dir) {
    pl_export_begin(l);
    return;
  }
  if (l->nps > 0 && l->nserve > 0)
    pl_say("all %d workers finished; stopping the ps and serving tasks",
           l->nworkers);
  else if (l->nps + l->nserve > 0)
    pl_say("all %d workers finished; stopping the %s tasks", l->nworkers,
           l->nps ? "ps" : "serving");
  pl_stop_all(l, PL_EXIT_OK);
}

void pl_job_done(struct pl_launch *l) {
  if (l->opt->export_dir)
    pl_export_begin(l);
  else
    pl_stop_all(l, PL_EXIT_OK);
}

static void on_proc_closed(uv_handle_t *h) {
  struct pl_task *t = h->data;
  t->proc_open = 0;
  pl_check_done(t->l);
}

/* A child was reaped: decide whether the job goes on. */
static void on_child_exit(uv_process_t *p, int64_t exit_status,
                          int term_signal) {
  struct pl_task *t = p->data;
  struct pl_launch *l = t->l;
  char how[64];

  t->running = 0;
  t->exit_status = exit_status;
  t->term_signal = term_signal;
  t->t_end = uv_hrtime();
  uv_close((uv_handle_t *)p, on_proc_closed);
  describe_end(t, how, sizeof how);
  cm_debug("%s (pid %d) ended: %s", t->name, t->pid, how);
  if (!l->stopping && t->xport) {
    pl_export_exited(l, t);
  } else if (!l->stopping) {
    if (t->type == CM_TASK_WORKER && term_signal == 0 && exit_status == 0) {
      if (++l->nworkers_done == l->nworkers)
        workers_done(l);
    } else {
      pl_say("%s failed (%s%s)", t->name, how,
             t->type != CM_TASK_WORKER && exit_status == 0 && !term_signal &&
                     l->nworkers > 0
                 ? " while the workers still ran"
                 : "");
      if (!l->failed)
        l->failed = t;
      pl_stop_all(l, PL_EXIT_FAILED);
    }
  }
  pl_check_done(l);
}

/* The second given to pipes held open by a child's own children is over:
 * pass on what they hold and close them. */
static void on_drain_timer(uv_timer_t *h) {
  struct pl_launch *l = h->data;
  int i;

  for (i = 0; i < l->ntasks + l->nxtasks; i++) {
    pl_close_stream(&child(l, i)->out);
    pl_close_stream(&child(l, i)->err);
  }
}

/* Once every child is reaped and every pipe closed, closes the launcher's
 * own handles so uv_run returns. Pipes that a child's own children still
 * hold open get one second to drain. */
void pl_check_done(struct pl_launch *l) {
  int i, pipes = 0;

  if (l->finishing)
    return;
  for (i = 0; i < l->ntasks + l->nxtasks; i++) {
    if (child(l, i)->proc_open)
      return;
    pipes += child(l, i)->out.state != 0 || child(l, i)->err.state != 0;
  }
  if (pipes) {
    if (!l->drain_started)
      uv_timer_start(&l->drain_timer, on_drain_timer, 1000, 0);
    l->drain_started = 1;
    return;
  }
  l->finishing = 1;
  uv_close((uv_handle_t *)&l->sig_int, NULL);
  uv_close((uv_handle_t *)&l->sig_term, NULL);
  uv_close((uv_handle_t *)&l->sig_hup, NULL);
  uv_close((uv_handle_t *)&l->kill_timer, NULL);
  uv_close((uv_handle_t *)&l->drain_timer, NULL);
  pl_watch_close(l);
}

/* Fills args (room for o->nextra + CM_SPEC_MAX_COMMAND + 8 entries, NULL
 * after the last) with what starts task t: pslaunch itself, which becomes
 * the task's program (exec_task.c), psd or dworker with the spec and the
 * task, or the spec's job.worker_command; then, for a worker, the
 * arguments given after "--". Strings are borrowed. */
static void task_args(struct pl_launch *l, const struct pl_task *t,
                      char *launcher, char **args) {
  const struct pl_options *o = l->opt;
  const struct cm_job *job = &l->spec->job;
  int n = 0, i;

  args[n++] = l->self;
  args[n++] = PL_EXEC_TASK;
  args[n++] = launcher;
  if (t->xport) {
    args[n++] = l->psctl;
    args[n++] = "--cluster";
    args[n++] = (char *)o->spec_path;
    args[n++] = "export";
    if (t->xtable[0])
      args[n++] = (char *)t->xtable;
    args[n++] = "--out";
    args[n++] = (char *)t->xout;
  } else if (t->type == CM_TASK_WORKER && l->command[0]) {
    args[n++] = l->command;
    for (i = 1; i < job->nworker_command; i++)
      args[n++] = (char *)job->worker_command[i];
  } else {
    args[n++] = t->type == CM_TASK_WORKER ? l->dworker : l->psd;
    args[n++] = "--cluster";
    args[n++] = (char *)o->spec_path;
    args[n++] = "--task";
    args[n++] = (char *)t->name;
  }
  for (i = 0; t->type == CM_TASK_WORKER && i < o->nextra; i++)
    args[n++] = o->extra[i];
  args[n] = NULL;
}

/* Starts one task's child with its output piped back to us: pslaunch
 * itself, which becomes the task once the kernel will send it SIGTERM when
 * pslaunch dies (exec_task.c). A worker of job.worker_command runs in the
 * spec file's directory with the environment command.c makes. Returns 0,
 * or a negative libuv code (reported) when it could not be started. */
int pl_spawn_task(struct pl_launch *l, struct pl_task *t) {
  const struct pl_options *o = l->opt;
  int command = t->type == CM_TASK_WORKER && l->command[0];
  uv_process_options_t po;
  uv_stdio_container_t stdio[3];
  char **args = NULL, **env = NULL, launcher[24];
  int rc;

  args = calloc((size_t)o->nextra + CM_SPEC_MAX_COMMAND + 8, sizeof *args);
  if (!args || (command && pl_command_env(l, t, &env) < 0)) {
    rc = UV_ENOMEM;
    pl_say("%s: out of memory", t->name);
    goto out;
  }
  snprintf(launcher, sizeof launcher, "%d", (int)getpid());
  task_args(l, t, launcher, args);

  if ((rc = pl_stream_open(l, t, &t->out, STDOUT_FILENO)) < 0 ||
      (rc = pl_stream_open(l, t, &t->err, STDERR_FILENO)) < 0) {
    pl_say("%s: pipe: %s", t->name, uv_strerror(rc));
    goto out;
  }
  stdio[0].flags = UV_IGNORE;
  stdio[1].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
  stdio[1].data.stream = (uv_stream_t *)&t->out.pipe;
  stdio[2].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
  stdio[2].data.stream = (uv_stream_t *)&t->err.pipe;
  memset(&po, 0, sizeof po);
  po.file = args[0];
  po.args = args;
  po.env = env; /* NULL: pslaunch's own */
  po.cwd = command ? l->spec_dir : NULL;
  po.exit_cb = on_child_exit;
  po.stdio = stdio;
  po.stdio_count = 3;
  /* A session of its own: Ctrl-C in a terminal reaches only pslaunch, which
   * stops the tasks in order, rather than racing them to the signal. */
  po.flags = UV_PROCESS_DETACHED;
  t->proc.data = t;
  t->t_start = uv_hrtime();
  rc = uv_spawn(&l->loop, &t->proc, &po);
  t->proc_open = 1; /* closed in on_child_exit, or below when spawn failed */
  if (rc < 0) {
    pl_say("%s: cannot start %s: %s", t->name, args[3], uv_strerror(rc));
    uv_close((uv_handle_t *)&t->proc, on_proc_closed);
    goto out;
  }
  t->started = t->running = 1;
  t->pid = uv_process_get_pid(&t->proc);
  pl_say("started %s (pid %d)", t->name, t->pid);
  if (command)
    cm_debug("%s: %s%s in %s", t->name, args[3],
             l->spec->job.nworker_command > 1 || o->nextra ? " ..." : "",
             l->spec_dir);
  else
    cm_debug("%s: %s --cluster %s --task %s%s", t->name, args[3], o->spec_path,
             t->name, o->nextra && t->type == CM_TASK_WORKER ? " ..." : "");
  if ((rc = pl_stream_read_start(&t->out)) < 0 ||
      (rc = pl_stream_read_start(&t->err)) < 0)
    pl_say("%s: reading its output: %s", t->name, uv_strerror(rc));
  rc = 0; /* it runs; output we cannot read is not a reason to stop it */
out:
  if (rc < 0) {
    pl_close_stream(&t->out);
    pl_close_stream(&t->err);
  }
  pl_command_env_free(env);
  free(args);
  return rc;
}

/* Prints how each task ended and why pslaunch is leaving. */
static void print_summary(const struct pl_launch *l) {
  int i;

  pl_say("summary:");
  for (i = 0; i < l->ntasks; i++) {
    const struct pl_task *t = &l->tasks[i];
    char how[96];

    if (!t->started) {
      pl_say("  %-*s  not started", l->width, t->name);
      continue;
    }
    describe_end(t, how, sizeof how);
    if (t->term_signal)
      snprintf(how + strlen(how), sizeof how - strlen(how), " (SIG%s)",
               signame(t->term_signal));
    pl_say("  %-*s  pid %-7d %7.2f s  %s%s", l->width, t->name, t->pid,
           (double)(t->t_end - t->t_start) / 1e9, how,
           t->sent_kill   ? ", SIGTERM did not stop it"
           : t->sent_term ? ", after SIGTERM"
                          : "");
  }
  if (l->nxtasks) {
    int done = 0;
    for (i = 0; i < l->nxtasks; i++)
      done += l->xtasks[i].started && !l->xtasks[i].running &&
              !l->xtasks[i].term_signal && l->xtasks[i].exit_status == 0;
    pl_say("  %-*s  %d of %d files written to %s", l->width, "export", done,
           l->nxtasks, l->opt->export_dir);
  }
  if (l->interrupted_by)
    pl_say("stopped by SIG%s", signame(l->interrupted_by));
  else if (l->result == PL_EXIT_OK && l->watch.active && l->nworkers == 0)
    pl_say("every worker of the cluster finished or is gone");
  else if (l->result == PL_EXIT_OK && l->watch.active)
    pl_say("all %d local workers finished, and every other worker of the "
           "cluster finished or is gone",
           l->nworkers);
  else if (l->result == PL_EXIT_OK)
    pl_say("all %d local workers finished", l->nworkers);
  else
    pl_say("stopped because %s failed", l->failed ? l->failed->name : "a task");
}

/* Runs the selected tasks to the end. Returns pslaunch's exit code. */
int pl_launch_run(struct pl_launch *l) {
  int i, rc;

  if ((rc = uv_loop_init(&l->loop)) < 0) {
    pl_say("uv_loop_init: %s", uv_strerror(rc));
    return PL_EXIT_FAILED;
  }
  uv_signal_init(&l->loop, &l->sig_int);
  uv_signal_init(&l->loop, &l->sig_term);
  uv_signal_init(&l->loop, &l->sig_hup);
  uv_timer_init(&l->loop, &l->kill_timer);
  uv_timer_init(&l->loop, &l->drain_timer);
  l->sig_int.data = l->sig_term.data = l->sig_hup.data = l;
  l->kill_timer.data = l->drain_timer.data = l;
  /* Watch the signals before the first spawn, so an early Ctrl-C cannot kill
   * pslaunch and leave its children behind. */
  uv_signal_start(&l->sig_int, on_signal, SIGINT);
  uv_signal_start(&l->sig_term, on_signal, SIGTERM);
  uv_signal_start(&l->sig_hup, on_signal, SIGHUP);

  for (i = 0; i < l->ntasks && !l->stopping; i++) {
    if (pl_spawn_task(l, &l->tasks[i]) < 0) {
      l->failed = &l->tasks[i];
      pl_stop_all(l, PL_EXIT_FAILED);
    }
  }
  /* No local worker to wait for: the shards serve workers run elsewhere,
   * until those are done. */
  if (!l->stopping && l->nworkers == 0 && l->nforeign > 0 &&
      pl_watch_start(l) < 0)
    pl_say("the ps tasks run until pslaunch is interrupted");
  pl_check_done(l);
  uv_run(&l->loop, UV_RUN_DEFAULT);
  rc = uv_loop_close(&l->loop);
  if (rc < 0)
    pl_say("uv_loop_close: %s", uv_strerror(rc));
  pl_watch_free(l);
  print_summary(l);
  return l->result;
}
