/* Large buffers in transparent huge pages (bigbuf.h). */
#include "bigbuf.h"

#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

/* The huge page size of x86-64 and arm64's 4 KiB granule. */
#define HUGE ((size_t)2 << 20)

void *cm_bigbuf_alloc(size_t bytes) {
  size_t whole;
  void *p;

  if (bytes < CM_BIGBUF_MIN || bytes > SIZE_MAX - HUGE)
    return malloc(bytes);
  /* aligned_alloc wants a multiple of the alignment; the rounding is what
   * lets the buffer's last 2 MiB be a huge page too. */
  whole = (bytes + HUGE - 1) / HUGE * HUGE;
  p = aligned_alloc(HUGE, whole);
  if (!p)
    return NULL;
  /* Advice only: where THP is off or the range cannot take it, the buffer
   * is ordinary memory, which is no error. */
  (void)madvise(p, whole, MADV_HUGEPAGE);
  return p;
}
