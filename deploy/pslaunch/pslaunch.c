/* pslaunch: starts the tasks of a cluster spec that live on this host (ps
 * tasks first, then workers), shows their output line by line prefixed with
 * the task name, and stops them all together: cleanly once every worker of
 * the cluster has finished (its own, and those it asks ps:0 about), or as
 * soon as any task fails or pslaunch is interrupted. Its tasks get SIGTERM
 * when pslaunch dies, however it dies.
 *
 * One libuv loop carries everything: the children (uv_spawn, reaped by their
 * exit callbacks), their stdout and stderr pipes, SIGINT/SIGTERM/SIGHUP, and
 * the timer that turns SIGTERM into SIGKILL. The loop ends when every child
 * has been reaped and every pipe closed; a summary then says how each task
 * ended. Only the processes started here are ever signalled, each by its own
 * PID.
 *
 * main reads top to bottom: parse the command line, load the spec, pick
 * this host's tasks, find the binaries, make --export's directory, check the
 * ps ports, run the tasks to the end. pslaunch_internal.h lists the file that
 * holds each part.
 *
 * Exit codes: 0 all local workers finished, 1 a task failed (or a ps port was
 * in use), 2 bad usage or spec, 128 + signal when interrupted. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "err.h"
#include "log.h"
#include "pslaunch_internal.h"
#include "spec.h"

int main(int argc, char **argv) {
  struct pl_options opt;
  struct cm_spec *spec = NULL;
  struct pl_launch *l = NULL;
  char err[8192] = "", host[256] = "?", *json = NULL;
  int code, rc;

  /* A child on its way to becoming a task (exec_task.c): nothing else. */
  if (argc > 1 && strcmp(argv[1], PL_EXEC_TASK) == 0)
    return pl_exec_task(argc, argv);
  cm_log_set_name("pslaunch");
  /* Writing to a closed stdout must not kill pslaunch while its children
   * run; libuv resets the disposition in each child before exec. */
  signal(SIGPIPE, SIG_IGN);

  code = pl_parse_args(argc, argv, &opt);
  if (code >= 0)
    goto out;

  code = PL_EXIT_USAGE;
  rc = cm_spec_open(opt.spec_path, &spec,
                    opt.print_spec || opt.engine ? &json : NULL, err,
                    sizeof err);
  if (rc < 0) {
    pl_say_lines(err[0] ? err : cm_strerror(rc));
    goto out;
  }
  cm_spec_say_notes(spec, "pslaunch");
  if (opt.print_spec) {
    size_t n = strlen(json);
    pl_write_all(STDOUT_FILENO, json, n);
    if (n == 0 || json[n - 1] != '\n')
      pl_write_all(STDOUT_FILENO, "\n", 1);
    code = PL_EXIT_OK;
    goto out;
  }
  l = calloc(1, sizeof *l);
  if (!l) {
    pl_say("out of memory");
    code = PL_EXIT_FAILED;
    goto out;
  }
  l->opt = &opt;
  l->spec = spec;
  l->derived = opt.engine ? json : NULL;
  if (pl_select_tasks(l, spec) < 0) {
    pl_say("out of memory");
    code = PL_EXIT_FAILED;
    goto out;
  }
  if (l->ntasks == 0) {
    gethostname(host, sizeof host - 1);
    if (opt.engine && spec->task.type == CM_TASK_NONE) {
      pl_say("%s: this process names no psd task (a task of another type, "
             "noted above); nothing to start",
             opt.spec_path);
      goto out;
    }
    if (opt.engine) {
      pl_say("%s: task %s:%d (the engine's) is not one --only %s starts",
             opt.spec_path, cm_task_type_name(spec->task.type),
             spec->task.index, opt.want_ps ? "ps" : "worker");
      goto out;
    }
    pl_say("%s: no %s task has its address on this host (%s); nothing to start",
           opt.spec_path,
           !opt.want_worker ? "ps"
           : !opt.want_ps   ? "worker"
                            : "ps or worker",
           host);
    goto out;
  }
  if (pl_find_binaries(l, err, sizeof err) < 0) {
    pl_say("%s", err);
    goto out;
  }
  if (opt.export_dir && pl_export_prepare(l, err, sizeof err) < 0) {
    pl_say("%s", err);
    goto out;
  }
  if (pl_check_ports(l, err, sizeof err) < 0) {
    pl_say("%s", err);
    code = PL_EXIT_FAILED;
    goto out;
  }
  code = pl_launch_run(l);
out:
  if (l && l->spec_tmp[0])
    unlink(l->spec_tmp);
  if (l)
    free(l->tasks);
  if (l)
    free(l->xtasks);
  free(l);
  free(json);
  if (spec)
    cm_spec_free(spec);
  return code;
}
