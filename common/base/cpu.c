/* OpenBLAS's core type from CPUID (cpu.h). */
#include "cpu.h"

#include <stddef.h>
#include <string.h>

int cm_cpu_blas_level(const char *core) {
  static const struct {
    const char *name; /* OpenBLAS's name for the core type */
    int level;        /* its ISA, as cm_cpu_blas_level returns it */
  } known[] = {{"Haswell", 2},
               {"Zen", 2},
               {"SkylakeX", 3},
               {"Cooperlake", 3},
               {"SapphireRapids", 3}};

  for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
    if (core && !strcmp(core, known[i].name))
      return known[i].level;
  return 0;
}

const char *cm_cpu_blas_core(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2"))
    return "Haswell";
#endif
  return NULL;
}

const char *cm_cpu_blas_env(const char *inherited, const char *forced) {
  const char *core;

  if (forced && forced[0])
    return forced;
  core = cm_cpu_blas_core();
  if (!core || (inherited && inherited[0] &&
                cm_cpu_blas_level(inherited) >= cm_cpu_blas_level(core)))
    return NULL;
  return core;
}
