/* Finds out whether this process can run the CUDA twins. The CUDA build
 * (device_cuda.cu) asks the runtime; the CPU-only build (device_none.c)
 * always says no, so callers need no #if around the probe. */
#ifndef KN_DEVICE_H
#define KN_DEVICE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Returns the number of usable CUDA devices (> 0), or CM_ENODEV with a
 * reason written to why (len bytes, may be 0), e.g. "cudaGetDeviceCount: no
 * CUDA-capable device is detected" or "built without CUDA support". */
int kn_cuda_probe(char *why, size_t len);

/* Makes CUDA device dev current for the calling thread (each thread that
 * drives a GPU calls it before creating or using its kn_cuda context).
 * 0, CM_ECUDA (logged), or CM_ENODEV in a build without CUDA. */
int kn_cuda_use_device(int dev);

#ifdef __cplusplus
}
#endif

#endif
