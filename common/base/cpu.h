/* Which OpenBLAS kernels this CPU runs fastest. Debian's DYNAMIC_ARCH
 * OpenBLAS 0.3.21 predates some CPUs (and virtual machines hide others) and
 * then falls back to its generic Prescott kernels, with about a fifth of
 * SkylakeX's sgemm speed on an AVX-512 machine; OPENBLAS_CORETYPE, read
 * when the library loads, overrides its choice. kernels/blas.c sets it for
 * psd's own programs, pslaunch for a spec's worker_command (PyTorch links
 * the same OpenBLAS). */
#ifndef CM_CPU_H
#define CM_CPU_H

/* The OpenBLAS core type for this CPU from CPUID: "SkylakeX" with the
 * AVX-512 subsets Skylake-X has (F, BW, DQ, VL: not a Xeon Phi), "Haswell"
 * with AVX2, else NULL (OpenBLAS's own choice stands). A static string. */
const char *cm_cpu_blas_core(void);

/* How wide a vector ISA an OpenBLAS core type's kernels use: 2 for AVX2
 * (Haswell, Zen), 3 for AVX-512 (SkylakeX, Cooperlake, SapphireRapids), 0
 * for anything older, unknown, or NULL. */
int cm_cpu_blas_level(const char *core);

/* The OPENBLAS_CORETYPE a child program should get, given the variable's
 * value now (inherited, may be NULL) and PSD_OPENBLAS_CORETYPE's (forced,
 * may be NULL or empty): forced when set; else this CPU's core when
 * inherited is unset or uses a narrower ISA; else NULL (keep inherited). */
const char *cm_cpu_blas_env(const char *inherited, const char *forced);

#endif
