/* sd_notify(3), or nothing without libsystemd (notify.h). */
#include "notify.h"

#include <stdlib.h>

#include "psd_config.h"
#if PSD_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

void cm_notify(const char *state) {
#if PSD_HAVE_SYSTEMD
  sd_notify(0, state);
#else
  (void)state;
#endif
}

uint64_t cm_notify_watchdog_usec(void) {
  uint64_t usec = 0;
#if PSD_HAVE_SYSTEMD
  if (sd_watchdog_enabled(0, &usec) <= 0)
    usec = 0;
#endif
  return usec;
}

int cm_notify_listening(void) {
  return PSD_HAVE_SYSTEMD && getenv("NOTIFY_SOCKET") != NULL;
}
