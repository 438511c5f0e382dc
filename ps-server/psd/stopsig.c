/* The self-pipe for psd's stop signals (stopsig.h). The handler only writes
 * one byte, the signal's number, to a non-blocking pipe (write(2) is
 * async-signal-safe); a full pipe drops the byte, which loses nothing, since
 * one stop is enough. The loop watches the read end (psd.c). */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "stopsig.h"

static int pipe_fd[2] = {-1, -1}; /* read end, write end; never closed */

static void on_signal(int signum) {
  int saved = errno;
  unsigned char b = (unsigned char)signum;
  ssize_t n = write(pipe_fd[1], &b, 1);
  (void)n;
  errno = saved;
}

int psd_stopsig_init(void) {
  int signums[] = {SIGTERM, SIGINT, SIGHUP};
  struct sigaction sa;
  if (pipe2(pipe_fd, O_CLOEXEC | O_NONBLOCK) < 0)
    return -errno;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  for (int i = 0; i < 3; i++)
    if (sigaction(signums[i], &sa, NULL) < 0)
      return -errno;
  return 0;
}

int psd_stopsig_fd(void) { return pipe_fd[0]; }

int psd_stopsig_take(int *hups) {
  unsigned char buf[64];
  int stop = 0;
  ssize_t n;
  *hups = 0;
  while ((n = read(pipe_fd[0], buf, sizeof buf)) > 0)
    for (ssize_t i = 0; i < n; i++) {
      if (buf[i] == SIGHUP)
        ++*hups;
      else if (!stop)
        stop = buf[i];
    }
  return stop;
}
