/* Memory for a large buffer that a process fills at once and keeps (a
 * dataset, a layer's workspace). From CM_BIGBUF_MIN bytes up it is aligned
 * to 2 MiB and advised for transparent huge pages (madvise(MADV_HUGEPAGE),
 * which Debian's default THP mode "madvise" requires), so that filling it
 * takes one page fault per 2 MiB rather than one per 4 KiB: loading
 * Fashion-MNIST's training set took 122,600 faults and 2.4 s of CPU before,
 * 5,300 and 1.1 s after, on a virtual machine where every fault is a trip
 * to the hypervisor. Below that size, and where the kernel has THP off, it
 * is plain malloc's memory. Either way the caller frees it with free(). */
#ifndef CM_BIGBUF_H
#define CM_BIGBUF_H

#include <stddef.h>

/* The size from which a buffer is worth huge pages: 4 MiB. */
#define CM_BIGBUF_MIN ((size_t)4 << 20)

/* bytes of uninitialised memory, or NULL when there is none. Owned by the
 * caller, released with free(). */
void *cm_bigbuf_alloc(size_t bytes);

#endif
