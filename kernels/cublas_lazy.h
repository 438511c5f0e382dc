/* cuBLAS mapped on first use (the CUDA build's cublas_lazy.c). The CUDA
 * twins call cuBLAS by its own names; cublas_lazy.c defines the few they
 * call and forwards each to libcublas, which it dlopens the first time one
 * is called, or kn_cublas_load is. A process that never drives a GPU (a CPU
 * job's dworker, every test program linking the kernels) never maps
 * libcublas and libcublasLt: linked directly, their constructors cost every
 * start 0.4 s of CPU and 25,000 page faults though nothing used them. */
#ifndef KN_CUBLAS_LAZY_H
#define KN_CUBLAS_LAZY_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Maps libcublas (KN_CUBLAS_SONAME, the soname of the version built
 * against) and resolves every entry point the kernels call, once per
 * process; later calls return the first call's result. 0, or CM_ENODEV
 * with dlopen's or dlsym's words written to why (len bytes, may be 0).
 * kn_cuda_probe calls it, so a machine with a GPU but no loadable cuBLAS
 * is told so and trains on the CPU. */
int kn_cublas_load(char *why, size_t len);

/* 1 once libcublas is mapped by this process, else 0. */
int kn_cublas_mapped(void);

#ifdef __cplusplus
}
#endif

#endif
