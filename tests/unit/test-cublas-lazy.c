/* cuBLAS mapped on first use (kernels/cublas_lazy.h). This program links
 * every CUDA twin that calls cuBLAS, as dworker does (kept[] below): a call
 * of one that cublas_lazy.c does not define would make the linker name
 * libcublas, and libcublas must not be mapped when main starts,
 * must map on kn_cublas_load, which must resolve every entry point the
 * kernels call (a misspelt name fails it here, with no GPU needed), and a
 * forwarder must then reach the library (cublasGetStatusString answers
 * with cuBLAS's own words). Exits 77 (skipped) in a build without CUDA. */
#include "psd_config.h"

#include "unit.h"

#if !PSD_HAVE_CUDA

int main(void) { return tu_skip("built without CUDA support"); }

#else

#include "conv_cuda.h"
#include "cublas_lazy.h"
#include "dense_cuda.h"

#include <check.h>
#include <cublas_v2.h>
#include <stdio.h>
#include <string.h>

/* The twins that call cuBLAS, linked in as dworker links them. */
static void *volatile kept[] = {(void *)kn_cuda_create,
                                (void *)kn_dense_forward_cuda,
                                (void *)kn_conv2d_forward_cuda};

/* Whether /proc/self/maps has a mapping of a file named libcublas. */
static int maps_cublas(void) {
  char line[512];
  int found = 0;
  FILE *f = fopen("/proc/self/maps", "r");

  ck_assert_ptr_nonnull(f);
  while (fgets(line, sizeof line, f))
    if (strstr(line, "/libcublas.so") || strstr(line, "/libcublasLt.so"))
      found = 1;
  fclose(f);
  return found;
}

START_TEST(mapped_on_first_use) {
  char why[256] = "";

  ck_assert_ptr_nonnull(kept[0]);
  ck_assert_int_eq(maps_cublas(), 0);
  ck_assert_int_eq(kn_cublas_mapped(), 0);
  ck_assert_msg(kn_cublas_load(why, sizeof why) == 0, "load: %s", why);
  ck_assert_int_eq(kn_cublas_mapped(), 1);
  ck_assert_int_eq(maps_cublas(), 1);
  /* Loaded once: a second call answers the same. */
  ck_assert_int_eq(kn_cublas_load(why, sizeof why), 0);
  /* cuBLAS's own words for its own status, through the forwarder. */
  ck_assert_str_eq(cublasGetStatusString(CUBLAS_STATUS_SUCCESS), "success");
}
END_TEST

int main(void) {
  Suite *s = suite_create("cublas-lazy");
  TCase *tc = tcase_create("load");

  tcase_add_test(tc, mapped_on_first_use);
  suite_add_tcase(s, tc);
  return tu_run(s, 0);
}

#endif
