/* The device probe of a CPU-only build: there is never a CUDA device. */
#include "device.h"

#include "err.h"

#include <stdio.h>

int kn_cuda_use_device(int dev) {
  (void)dev;
  return CM_ENODEV;
}

int kn_cuda_probe(char *why, size_t len) {
  if (why && len)
    snprintf(why, len, "built without CUDA support");
  return CM_ENODEV;
}
