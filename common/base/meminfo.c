/* MemAvailable from /proc/meminfo (meminfo.h). */
#include "meminfo.h"

#include <stdio.h>

uint64_t cm_mem_available(void) {
  char line[256];
  unsigned long long kib;
  uint64_t bytes = UINT64_MAX;
  FILE *f = fopen("/proc/meminfo", "re");
  if (!f)
    return bytes;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) {
      bytes = (uint64_t)kib * 1024;
      break;
    }
  fclose(f);
  return bytes;
}
