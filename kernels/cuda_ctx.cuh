/* What the CUDA twins share inside kernels/ (not an API): the context
 * behind the opaque struct kn_cuda of dense_cuda.h, the error checks that
 * log a failed CUDA or cuBLAS call with its file and line, and the launch
 * shape of the elementwise kernels. Included by the .cu files only. */
#ifndef KN_CUDA_CTX_CUH
#define KN_CUDA_CTX_CUH

#include "dense_cuda.h"

#include "err.h"
extern "C" {
#include "log.h"
}

#include <cublas_v2.h>
#include <cuda_runtime.h>

/* Threads per block everywhere; the reductions rely on a power of two. */
#define KN__THREADS 256

struct kn_cuda {
  cublasHandle_t blas;  /* cuBLAS handle, bound to stream */
  cudaStream_t stream;  /* every op of this context runs here, in order */
  void *scratch;        /* device memory for reductions, or NULL */
  size_t scratch_bytes; /* size of scratch */
};

static inline bool kn__ok(cudaError_t e) { return e == cudaSuccess; }
static inline bool kn__ok(cublasStatus_t s) {
  return s == CUBLAS_STATUS_SUCCESS;
}
static inline const char *kn__str(cudaError_t e) {
  return cudaGetErrorString(e);
}
static inline const char *kn__str(cublasStatus_t s) {
  return cublasGetStatusString(s);
}

/* Logs a failed CUDA or cuBLAS call with where it was made; 0 or CM_ECUDA. */
template <typename T>
static inline int kn__check(T r, const char *call, const char *file, int line) {
  if (kn__ok(r))
    return 0;
  cm_error("%s:%d: %s: %s", file, line, call, kn__str(r));
  return CM_ECUDA;
}

#define KN__CHECK(call) kn__check((call), #call, __FILE__, __LINE__)

/* Checks call; on failure sets rc and leaves through out. */
#define KN__TRY(call)                                                          \
  do {                                                                         \
    if ((rc = KN__CHECK(call)) < 0)                                            \
      goto out;                                                                \
  } while (0)

/* A grid-stride loop over i in [0, n), so any n fits a capped grid. */
#define KN__FOR(i, n)                                                          \
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n);      \
       i += (size_t)gridDim.x * blockDim.x)

/* Blocks for n elements, capped: KN__FOR covers the rest. */
static inline unsigned kn__blocks(size_t n) {
  size_t b = (n + KN__THREADS - 1) / KN__THREADS;
  return b < 65536 ? (unsigned)b : 65536u;
}

/* Makes ctx's scratch at least bytes long (dense_cuda.cu). cudaFree waits
 * for the device, so no queued kernel still uses the old block when it
 * goes. */
int kn__cuda_scratch(struct kn_cuda *ctx, size_t bytes);

/* Row-major C (m, n) = op(A) op(B) + beta C with op(A) (m, k) on ctx's
 * stream (dense_cuda.cu); 0 or CM_ECUDA. */
int kn__gemm(struct kn_cuda *ctx, int ta, int tb, int m, int n, int k,
             const float *a, const float *b, float beta, float *c);

#endif
