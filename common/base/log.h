/* Logging to stderr, one line per event: "<time> <who> <level>: <message>".
 * The process name ("psd ps:0", "dworker worker:1") is set once by main. */
#ifndef CM_LOG_H
#define CM_LOG_H

enum cm_log_level { CM_LOG_DEBUG = 0, CM_LOG_INFO, CM_LOG_WARN, CM_LOG_ERROR };

/* Sets the name printed on every line; the string is copied. */
void cm_log_set_name(const char *name);

/* Sets the lowest level printed (default CM_LOG_INFO; PSD_LOG=debug lowers it).
 */
void cm_log_set_level(enum cm_log_level level);

void cm_log(enum cm_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define cm_debug(...) cm_log(CM_LOG_DEBUG, __VA_ARGS__)
#define cm_info(...) cm_log(CM_LOG_INFO, __VA_ARGS__)
#define cm_warn(...) cm_log(CM_LOG_WARN, __VA_ARGS__)
#define cm_error(...) cm_log(CM_LOG_ERROR, __VA_ARGS__)

#endif
