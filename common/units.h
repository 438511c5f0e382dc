/* Human units for logs and tables: bytes in B, KiB, MiB, GiB, TiB. */
#ifndef CM_UNITS_H
#define CM_UNITS_H

#include <stddef.h>

/* Writes "842 B", "1.2 KiB", "256.0 MiB" into buf; returns buf. */
const char *cm_fmt_bytes(double bytes, char *buf, size_t len);

#endif
