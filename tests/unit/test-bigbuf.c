/* Large buffers (common/base/bigbuf.h): below CM_BIGBUF_MIN plain malloc's
 * memory; from it up, aligned to 2 MiB and, where the kernel's THP mode
 * is "madvise" or "always", in a mapping the kernel counts as eligible for
 * huge pages (/proc/self/smaps, THPeligible), with every byte writable and
 * freed by free(). */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bigbuf.h"
#include "unit.h"

/* The kernel's THP mode is one that honours madvise: 1, or 0 when off or
 * unknown (no THP in the kernel). */
static int thp_advisable(void) {
  char line[128] = "";
  FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");

  if (!f)
    return 0;
  if (!fgets(line, sizeof line, f))
    line[0] = '\0';
  fclose(f);
  return strstr(line, "[madvise]") || strstr(line, "[always]");
}

/* smaps' THPeligible for the mapping holding p: 0 or 1, -1 when absent. */
static int thp_eligible(const void *p) {
  char line[256];
  uintptr_t a = (uintptr_t)p, lo, hi;
  int in = 0, v = -1;
  FILE *f = fopen("/proc/self/smaps", "r");

  ck_assert_ptr_nonnull(f);
  while (fgets(line, sizeof line, f)) {
    if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') &&
        line[0] != ' ')
      in = a >= lo && a < hi;
    else if (in && sscanf(line, "THPeligible: %d", &v) == 1)
      break;
  }
  fclose(f);
  return v;
}

START_TEST(big_is_aligned_and_advised) {
  size_t n = CM_BIGBUF_MIN + 12345;
  unsigned char *p = cm_bigbuf_alloc(n);

  ck_assert_ptr_nonnull(p);
  ck_assert_uint_eq((uintptr_t)p % ((size_t)2 << 20), 0);
  memset(p, 0xab, n);
  ck_assert_uint_eq(p[n - 1], 0xab);
  if (thp_advisable())
    ck_assert_int_eq(thp_eligible(p), 1);
  free(p);
}
END_TEST

START_TEST(small_is_malloc) {
  unsigned char *p = cm_bigbuf_alloc(1000);

  ck_assert_ptr_nonnull(p);
  memset(p, 1, 1000);
  free(p);
  p = cm_bigbuf_alloc(0);
  free(p);
}
END_TEST

int main(void) {
  Suite *s = suite_create("bigbuf");
  TCase *tc = tcase_create("alloc");

  tcase_add_test(tc, big_is_aligned_and_advised);
  tcase_add_test(tc, small_is_malloc);
  suite_add_tcase(s, tc);
  return tu_run(s, 0);
}
