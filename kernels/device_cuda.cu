/* The device probe of a CUDA build. Without a GPU or driver the runtime
 * reports an error from cudaGetDeviceCount rather than a count of zero;
 * both end up as CM_ENODEV with the runtime's words as the reason. A
 * machine with a device maps cuBLAS here (cublas_lazy.h), so one whose
 * libcublas cannot be loaded is told why too, and trains on the CPU. */
#include "cublas_lazy.h"
#include "device.h"

#include "err.h"

#include <cuda_runtime.h>
#include <stdio.h>

extern "C" {
#include "log.h"
}

int kn_cuda_use_device(int dev) {
  cudaError_t e = cudaSetDevice(dev);

  if (e == cudaSuccess)
    return 0;
  cm_error("cudaSetDevice(%d): %s", dev, cudaGetErrorString(e));
  return CM_ECUDA;
}

int kn_cuda_probe(char *why, size_t len) {
  char reason[160] = "";
  int count = 0, usable = 0, mode;
  cudaError_t e = cudaGetDeviceCount(&count);

  if (e != cudaSuccess) {
    snprintf(reason, sizeof reason, "cudaGetDeviceCount: %s",
             cudaGetErrorString(e));
    goto out;
  }
  /* A device in prohibited compute mode accepts no contexts. */
  for (int i = 0; i < count; i++)
    if (cudaDeviceGetAttribute(&mode, cudaDevAttrComputeMode, i) ==
            cudaSuccess &&
        mode != cudaComputeModeProhibited)
      usable++;
  if (!usable && count)
    snprintf(reason, sizeof reason,
             "cudaGetDeviceCount: %d device(s), all in prohibited mode", count);
  else if (!usable)
    snprintf(reason, sizeof reason, "cudaGetDeviceCount: no devices");
  else if (kn_cublas_load(reason, sizeof reason))
    usable = 0;
out:
  if (!usable && why && len)
    snprintf(why, len, "%s", reason);
  return usable ? usable : CM_ENODEV;
}
