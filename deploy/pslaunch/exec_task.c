/* The child's side of a spawn. Every task starts as pslaunch itself,
 * "pslaunch --exec-task PID PROGRAM ARGS...", which asks the kernel to send
 * it SIGTERM when the launcher dies (PR_SET_PDEATHSIG, kept across the exec
 * that follows), and only then runs PROGRAM (psd or dworker) in its place:
 * same process, same PID. So a launcher that is killed, even by SIGKILL,
 * still stops its tasks the way Ctrl-C does: each shard gets SIGTERM and
 * writes its final checkpoint.
 *
 * Why a second exec rather than prctl in the forked child: uv_spawn runs no
 * code of ours between fork and exec. The parent-death signal fires when
 * the thread that forked exits; uv_spawn runs on pslaunch's main thread,
 * which lives as long as pslaunch. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "pslaunch_internal.h"

int pl_exec_task(int argc, char **argv) {
  char *end;
  long launcher;

  if (argc < 4) {
    fprintf(stderr,
            "pslaunch: %s is for pslaunch's own children: %s PID "
            "PROGRAM [ARGS...]\n",
            PL_EXEC_TASK, PL_EXEC_TASK);
    return PL_EXIT_USAGE;
  }
  launcher = strtol(argv[2], &end, 10);
  if (*end || launcher <= 1) {
    fprintf(stderr, "pslaunch: %s %s: expected the launcher's PID\n",
            PL_EXEC_TASK, argv[2]);
    return PL_EXIT_USAGE;
  }
  if (prctl(PR_SET_PDEATHSIG, SIGTERM) < 0)
    fprintf(stderr,
            "pslaunch: %s will not be stopped if pslaunch dies: "
            "prctl(PR_SET_PDEATHSIG): %s\n",
            argv[3], strerror(errno));
  /* The launcher died before prctl took effect: no signal will come, and
   * nobody is left to stop the task, so it must not start. */
  if (getppid() != (pid_t)launcher)
    return 128 + SIGTERM;
  execv(argv[3], argv + 3);
  fprintf(stderr, "pslaunch: cannot start %s: %s\n", argv[3], strerror(errno));
  return 127;
}
