/* Human units (units.h). */
#include "units.h"

#include <stdio.h>

const char *cm_fmt_bytes(double bytes, char *buf, size_t len) {
  static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (bytes >= 1024 && i < 4) {
    bytes /= 1024;
    i++;
  }
  snprintf(buf, len, i ? "%.1f %s" : "%.0f %s", bytes, unit[i]);
  return buf;
}
