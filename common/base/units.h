/* Human units for logs and tables: bytes in B, KiB, MiB, GiB, TiB; times
 * in us, ms, s; counts in k and M. And the other way: a number a user typed
 * on a command line, checked whole. */
#ifndef CM_UNITS_H
#define CM_UNITS_H

#include <stddef.h>

/* Writes "842 B", "1.2 KiB", "256.0 MiB" into buf; returns buf. */
const char *cm_fmt_bytes(double bytes, char *buf, size_t len);

/* Writes "850 us", "1.25 ms", "42.0 ms", "1.50 s" into buf; returns buf. */
const char *cm_fmt_ms(double ms, char *buf, size_t len);

/* Writes "842", "1.2k", "3.4M" into buf; returns buf. */
const char *cm_fmt_count(double n, char *buf, size_t len);

/* Reads text, all of it, as a decimal whole number in [lo, hi] into *out.
 * Returns 0, or CM_EINVAL (*out untouched) for text that is empty, holds
 * anything else, or is out of range: the caller names the option. */
int cm_parse_int(const char *text, long long lo, long long hi, long long *out);

/* Reads text, all of it, as a finite number into *out: 0 or CM_EINVAL. */
int cm_parse_double(const char *text, double *out);

#endif
