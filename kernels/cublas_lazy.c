/* cuBLAS mapped on first use (cublas_lazy.h): the entry points the CUDA
 * twins call (dense_cuda.cu, conv_cuda.cu), defined under the names
 * cublas_v2.h gives them, each forwarding to libcublas's own, resolved by
 * dlsym when the first is called. Nothing links libcublas: the binaries
 * name only libcudart, which costs nothing at start. A call made when
 * libcublas cannot be mapped returns CUBLAS_STATUS_NOT_INITIALIZED, and
 * cublasGetStatusString then gives dlopen's reason. */
#include "cublas_lazy.h"

#include "err.h"
#include "log.h"

#include <cublas_v2.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#ifndef KN_CUBLAS_SONAME
#error                                                                         \
    "KN_CUBLAS_SONAME names the libcublas built against (kernels/meson.build)"
#endif

/* What the one load found. Written once, under pthread_once. */
static struct {
  void *lib;     /* dlopen's handle; NULL when the load failed */
  char why[256]; /* the failure's words; "" after a load that worked */
  cublasStatus_t (*create)(cublasHandle_t *); /* cublasCreate_v2 */
  cublasStatus_t (*destroy)(cublasHandle_t);  /* cublasDestroy_v2 */
  cublasStatus_t (*set_stream)(cublasHandle_t,
                               cudaStream_t); /* cublasSetStream_v2 */
  cublasStatus_t (*set_math)(cublasHandle_t,
                             cublasMath_t);     /* cublasSetMathMode */
  const char *(*status_string)(cublasStatus_t); /* cublasGetStatusString */
  cublasStatus_t (*sgemm)(cublasHandle_t, cublasOperation_t, cublasOperation_t,
                          int, int, int, const float *, const float *, int,
                          const float *, int, const float *, float *,
                          int); /* cublasSgemm_v2 */
  cublasStatus_t (*sgemm_batched)(cublasHandle_t, cublasOperation_t,
                                  cublasOperation_t, int, int, int,
                                  const float *, const float *, int, long long,
                                  const float *, int, long long, const float *,
                                  float *, int, long long,
                                  int); /* cublasSgemmStridedBatched */
} L;

static pthread_once_t once = PTHREAD_ONCE_INIT;

/* dlsym's answer for name into *slot; 0, or -1 with L.why set. */
static int sym(void *slot, const char *name) {
  void *p;

  dlerror();
  p = dlsym(L.lib, name);
  if (!p) {
    const char *e = dlerror();
    snprintf(L.why, sizeof L.why, "%s: %s", KN_CUBLAS_SONAME,
             e ? e : "symbol not found");
    return -1;
  }
  *(void **)slot = p;
  return 0;
}

static void load(void) {
  const char *e;

  L.lib = dlopen(KN_CUBLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
  if (!L.lib) {
    e = dlerror();
    snprintf(L.why, sizeof L.why, "%s", e ? e : KN_CUBLAS_SONAME);
    return;
  }
  if (sym(&L.create, "cublasCreate_v2") ||
      sym(&L.destroy, "cublasDestroy_v2") ||
      sym(&L.set_stream, "cublasSetStream_v2") ||
      sym(&L.set_math, "cublasSetMathMode") ||
      sym(&L.status_string, "cublasGetStatusString") ||
      sym(&L.sgemm, "cublasSgemm_v2") ||
      sym(&L.sgemm_batched, "cublasSgemmStridedBatched")) {
    dlclose(L.lib);
    L.lib = NULL;
  }
}

int kn_cublas_load(char *why, size_t len) {
  pthread_once(&once, load);
  if (L.lib)
    return 0;
  if (why && len)
    snprintf(why, len, "%s", L.why);
  return CM_ENODEV;
}

int kn_cublas_mapped(void) {
  void *h = dlopen(KN_CUBLAS_SONAME, RTLD_LAZY | RTLD_NOLOAD);

  if (!h)
    return 0;
  dlclose(h);
  return 1;
}

/* Every forwarder: load (once), or fail as cuBLAS fails an uninitialized
 * handle, with the reason logged the first time. */
static int ready(void) {
  static int told;

  if (!kn_cublas_load(NULL, 0))
    return 1;
  if (!__atomic_exchange_n(&told, 1, __ATOMIC_RELAXED))
    cm_error("cuBLAS: %s", L.why);
  return 0;
}

cublasStatus_t CUBLASWINAPI cublasCreate_v2(cublasHandle_t *handle) {
  return ready() ? L.create(handle) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasDestroy_v2(cublasHandle_t handle) {
  return ready() ? L.destroy(handle) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasSetStream_v2(cublasHandle_t handle,
                                               cudaStream_t streamId) {
  return ready() ? L.set_stream(handle, streamId)
                 : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasSetMathMode(cublasHandle_t handle,
                                              cublasMath_t mode) {
  return ready() ? L.set_math(handle, mode) : CUBLAS_STATUS_NOT_INITIALIZED;
}

const char *CUBLASWINAPI cublasGetStatusString(cublasStatus_t status) {
  if (kn_cublas_load(NULL, 0))
    return L.why;
  return L.status_string(status);
}

cublasStatus_t CUBLASWINAPI cublasSgemm_v2(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
    int m, int n, int k, const float *alpha, const float *A, int lda,
    const float *B, int ldb, const float *beta, float *C, int ldc) {
  if (!ready())
    return CUBLAS_STATUS_NOT_INITIALIZED;
  return L.sgemm(handle, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta,
                 C, ldc);
}

cublasStatus_t CUBLASWINAPI cublasSgemmStridedBatched(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
    int m, int n, int k, const float *alpha, const float *A, int lda,
    long long int strideA, const float *B, int ldb, long long int strideB,
    const float *beta, float *C, int ldc, long long int strideC,
    int batchCount) {
  if (!ready())
    return CUBLAS_STATUS_NOT_INITIALIZED;
  return L.sgemm_batched(handle, transa, transb, m, n, k, alpha, A, lda,
                         strideA, B, ldb, strideB, beta, C, ldc, strideC,
                         batchCount);
}
