/* Telling systemd how a daemon is doing (sd_notify(3)): READY=1, STATUS=,
 * WATCHDOG=1, STOPPING=1, for psd and dworker run as Type=notify units.
 * Compiled against libsystemd when the build found it; without it, and
 * outside a Type=notify unit, every call is a no-op. A library of its own
 * (psnotify), so that the rest of common/base stays libc only. */
#ifndef CM_NOTIFY_H
#define CM_NOTIFY_H

#include <stdint.h>

/* Sends one message to systemd, e.g. "READY=1" or "STATUS=step 200". */
void cm_notify(const char *state);

/* The unit's watchdog timeout in microseconds (WatchdogSec=), or 0 when
 * there is none; ping with cm_notify("WATCHDOG=1") at half of it. */
uint64_t cm_notify_watchdog_usec(void);

/* 1 when systemd listens (a Type=notify unit and libsystemd built in), so
 * that periodic STATUS= work can be skipped elsewhere; else 0. */
int cm_notify_listening(void);

#endif
