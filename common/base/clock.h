/* Time helpers shared by the modules that wait: monotonic milliseconds for
 * measuring, and absolute CLOCK_REALTIME times for pthread_cond_timedwait. */
#ifndef CM_CLOCK_H
#define CM_CLOCK_H

#include <time.h>

/* Milliseconds on the monotonic clock. */
double cm_mono_ms(void);

/* Seconds on the monotonic clock. */
double cm_mono_s(void);

/* Sleeps ms milliseconds, resuming after a signal handler runs. */
void cm_sleep_ms(long ms);

/* The CLOCK_REALTIME time `ms` milliseconds from now. */
struct timespec cm_abstime_after_ms(long ms);

#endif
