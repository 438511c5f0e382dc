/* Picks OpenBLAS's fast kernels on CPUs that Debian's OpenBLAS 0.3.21 does
 * not recognise. OPENBLAS_CORETYPE is read only when the library loads, so
 * the choice has to be made before main's process image exists: callers run
 * kn_blas_init(argv) first thing in main, and it re-executes the program
 * once with the variable set. */
#ifndef KN_BLAS_H
#define KN_BLAS_H

#ifdef __cplusplus
extern "C" {
#endif

/* Chooses a core type from CPUID (SkylakeX with AVX-512, Haswell with
 * AVX2, else none) and, if the kernels OpenBLAS loaded (by its own choice or
 * an inherited OPENBLAS_CORETYPE) use a narrower vector ISA than that, sets
 * OPENBLAS_CORETYPE and re-executes /proc/self/exe with argv (never under
 * valgrind, never twice). PSD_OPENBLAS_CORETYPE, when set, is used as the
 * core type whatever the CPU; returns only if no re-exec was needed or it
 * failed (then returns a negative CM_E* code and the program goes on with
 * OpenBLAS's own choice). Also caps OpenBLAS's threads at `threads` (0 =
 * leave OpenBLAS's default). */
int kn_blas_init(char **argv, int threads);

/* Writes one line (truncated to len bytes) naming the kernels in use, e.g.
 * "OpenBLAS 0.3.21 core=SkylakeX threads=1 (OPENBLAS_CORETYPE=SkylakeX set
 * by psd-worker from CPUID)". */
void kn_blas_describe(char *buf, unsigned len);

#ifdef __cplusplus
}
#endif

#endif
