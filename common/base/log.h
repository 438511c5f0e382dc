/* Logging, one line per event: "<time> <who> <level>: <message>" on stderr,
 * or the message alone to a sink a program installs (libpsclient's
 * psc_set_log). The process name ("psd ps:0", "dworker worker:1") is set
 * once by main; a program that only links libpsclient keeps "psd". */
#ifndef CM_LOG_H
#define CM_LOG_H

enum cm_log_level {
  CM_LOG_DEBUG = 0,
  CM_LOG_INFO,
  CM_LOG_WARN,
  CM_LOG_ERROR,
  CM_LOG_OFF /* as a threshold: nothing is logged */
};

/* Sets the name printed on every line; the string is copied. */
void cm_log_set_name(const char *name);

/* Sets the lowest level logged (default CM_LOG_INFO, or PSD_LOG's: debug,
 * info, warn, error or off); once set, PSD_LOG no longer counts. Any
 * thread, any time. */
void cm_log_set_level(enum cm_log_level level);

/* The lowest level logged now. */
enum cm_log_level cm_log_level(void);

/* Where lines go instead of stderr: sink(arg, level, message), the message
 * without time, name or newline, called from the thread that logs (one at
 * a time: calls never overlap). NULL: stderr again. A line being logged by
 * another thread as this is called may still reach the previous sink. */
typedef void (*cm_log_sink)(void *arg, enum cm_log_level level,
                            const char *msg);
void cm_log_set_sink(cm_log_sink sink, void *arg);

void cm_log(enum cm_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define cm_debug(...) cm_log(CM_LOG_DEBUG, __VA_ARGS__)
#define cm_info(...) cm_log(CM_LOG_INFO, __VA_ARGS__)
#define cm_warn(...) cm_log(CM_LOG_WARN, __VA_ARGS__)
#define cm_error(...) cm_log(CM_LOG_ERROR, __VA_ARGS__)

#endif
