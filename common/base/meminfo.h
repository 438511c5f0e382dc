/* What memory the machine has free: the kernel's MemAvailable, read from
 * /proc/meminfo. psd refuses a Declare larger than it (service_declare.c)
 * and sizes psd --reshard's passes by it (reshard.c). */
#ifndef CM_MEMINFO_H
#define CM_MEMINFO_H

#include <stdint.h>

/* Memory the kernel says it can give without swapping (MemAvailable), in
 * bytes; UINT64_MAX when it cannot be read. Inside a container this is the
 * host's, not the container's limit. */
uint64_t cm_mem_available(void);

#endif
