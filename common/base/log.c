/* Line-at-a-time logging (log.h). Each line is formatted into one buffer and
 * written with a single write() so lines from threads never interleave; a
 * sink gets them one at a time, under a lock. */
#include "log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static char log_name[64] = "psd";
/* The threshold; -1 until set or read from PSD_LOG. */
static atomic_int log_level = -1;
/* Guards sink and sink_arg, and serialises the sink's calls. */
static pthread_mutex_t sink_lock = PTHREAD_MUTEX_INITIALIZER;
static cm_log_sink sink;
static void *sink_arg;

void cm_log_set_name(const char *name) {
  snprintf(log_name, sizeof log_name, "%s", name);
}

void cm_log_set_level(enum cm_log_level level) {
  atomic_store(&log_level, (int)level);
}

enum cm_log_level cm_log_level(void) {
  int level = atomic_load(&log_level);
  if (level < 0) {
    static const char *names[] = {"debug", "info", "warn", "error", "off"};
    const char *env = getenv("PSD_LOG");
    int want = CM_LOG_INFO;
    for (int i = 0; env && i < 5; i++)
      if (strcmp(env, names[i]) == 0)
        want = i;
    /* An explicit level set meanwhile wins. */
    atomic_compare_exchange_strong(&log_level, &level, want);
    level = atomic_load(&log_level);
  }
  return (enum cm_log_level)level;
}

void cm_log_set_sink(cm_log_sink s, void *arg) {
  pthread_mutex_lock(&sink_lock);
  sink = s;
  sink_arg = arg;
  pthread_mutex_unlock(&sink_lock);
}

void cm_log(enum cm_log_level level, const char *fmt, ...) {
  static const char *names[] = {"debug", "info", "warn", "error"};
  char buf[2048];
  struct timespec ts;
  struct tm tm;
  va_list ap;
  int n, head;

  if (level < cm_log_level() || level >= CM_LOG_OFF)
    return;
  clock_gettime(CLOCK_REALTIME, &ts);
  localtime_r(&ts.tv_sec, &tm);
  n = snprintf(buf, sizeof buf, "%02d:%02d:%02d.%03ld %s %s: ", tm.tm_hour,
               tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000, log_name,
               names[level]);
  if (n < 0 || (size_t)n >= sizeof buf)
    return;
  head = n;
  va_start(ap, fmt);
  n += vsnprintf(buf + n, sizeof buf - n, fmt, ap);
  va_end(ap);
  if (n < head)
    return;
  if ((size_t)n >= sizeof buf - 1)
    n = sizeof buf - 2;
  buf[n] = 0;
  pthread_mutex_lock(&sink_lock);
  if (sink) {
    sink(sink_arg, level, buf + head);
    pthread_mutex_unlock(&sink_lock);
    return;
  }
  pthread_mutex_unlock(&sink_lock);
  buf[n++] = '\n';
  if (write(STDERR_FILENO, buf, n) < 0) {
    /* nowhere left to report a failed log write */
  }
}
