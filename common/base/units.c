/* Human units (units.h). */
#include "units.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "err.h"

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

const char *cm_fmt_ms(double ms, char *buf, size_t len) {
  if (ms < 1)
    snprintf(buf, len, "%.0f us", ms * 1e3);
  else if (ms < 10)
    snprintf(buf, len, "%.2f ms", ms);
  else if (ms < 1000)
    snprintf(buf, len, "%.1f ms", ms);
  else
    snprintf(buf, len, "%.2f s", ms / 1e3);
  return buf;
}

const char *cm_fmt_count(double n, char *buf, size_t len) {
  if (n >= 1e6)
    snprintf(buf, len, "%.1fM", n / 1e6);
  else if (n >= 1e3)
    snprintf(buf, len, "%.1fk", n / 1e3);
  else
    snprintf(buf, len, "%.0f", n);
  return buf;
}

int cm_parse_int(const char *text, long long lo, long long hi, long long *out) {
  char *end;
  if (!text || !*text || isspace((unsigned char)*text))
    return CM_EINVAL;
  errno = 0;
  long long v = strtoll(text, &end, 10);
  if (errno || *end || v < lo || v > hi)
    return CM_EINVAL;
  *out = v;
  return 0;
}

int cm_parse_double(const char *text, double *out) {
  char *end;
  if (!text || !*text || isspace((unsigned char)*text))
    return CM_EINVAL;
  errno = 0;
  double v = strtod(text, &end);
  if (errno || *end || !isfinite(v))
    return CM_EINVAL;
  *out = v;
  return 0;
}
