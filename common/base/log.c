/* Line-at-a-time logging to stderr. Each line is formatted into one buffer and
 * written with a single write() so lines from threads never interleave. */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static char log_name[64] = "psd";
static enum cm_log_level log_level = CM_LOG_INFO;
static int log_level_from_env = 0;

void cm_log_set_name(const char *name) {
  snprintf(log_name, sizeof log_name, "%s", name);
}

void cm_log_set_level(enum cm_log_level level) { log_level = level; }

void cm_log(enum cm_log_level level, const char *fmt, ...) {
  static const char *names[] = {"debug", "info", "warn", "error"};
  char buf[2048];
  struct timespec ts;
  struct tm tm;
  va_list ap;
  int n;

  if (!log_level_from_env) {
    const char *env = getenv("PSD_LOG");
    log_level_from_env = 1;
    if (env && strcmp(env, "debug") == 0)
      log_level = CM_LOG_DEBUG;
  }
  if (level < log_level)
    return;
  clock_gettime(CLOCK_REALTIME, &ts);
  localtime_r(&ts.tv_sec, &tm);
  n = snprintf(buf, sizeof buf, "%02d:%02d:%02d.%03ld %s %s: ", tm.tm_hour,
               tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000, log_name,
               names[level]);
  va_start(ap, fmt);
  if (n > 0 && (size_t)n < sizeof buf)
    n += vsnprintf(buf + n, sizeof buf - n, fmt, ap);
  va_end(ap);
  if (n < 0)
    return;
  if ((size_t)n >= sizeof buf - 1)
    n = sizeof buf - 2;
  buf[n++] = '\n';
  if (write(STDERR_FILENO, buf, n) < 0) {
    /* nowhere left to report a failed log write */
  }
}
