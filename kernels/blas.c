/* Chooses OpenBLAS's kernels from CPUID. Debian's DYNAMIC_ARCH OpenBLAS
 * 0.3.21 predates some CPUs (and virtual machines hide others) and then
 * falls back to generic Prescott kernels, with about a fifth of SkylakeX's
 * sgemm speed on an AVX-512 machine. The library reads OPENBLAS_CORETYPE
 * once, while it loads, so the only way to change its mind is to set the
 * variable and re-execute the program. Where OpenBLAS's own choice already
 * uses the best vector ISA the CPU has, nothing is re-executed. An inherited
 * OPENBLAS_CORETYPE that leaves vector width unused is replaced as well;
 * PSD_OPENBLAS_CORETYPE forces a core type whatever the CPU. */
#include "blas.h"

#include "cpu.h"
#include "err.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Names the program that set OPENBLAS_CORETYPE; its presence also stops a
 * second re-exec should something clear OPENBLAS_CORETYPE again. */
#define KN__MARKER "PSD_BLAS_SET_BY"
/* The OPENBLAS_CORETYPE the program inherited and replaced, for the log. */
#define KN__REPLACED "PSD_BLAS_REPLACED"

/* OpenBLAS extensions, repeated here because a netlib cblas.h (Debian's
 * alternatives system may install one) does not declare them. */
void openblas_set_num_threads(int num_threads);
int openblas_get_num_threads(void);
char *openblas_get_config(void);
char *openblas_get_corename(void);

/* Valgrind preloads its vgpreload_*.so; re-executing /proc/self/exe there
 * would run the program outside the tool, so it keeps OpenBLAS's choice. */
static int kn__under_valgrind(void) {
  const char *preload = getenv("LD_PRELOAD");
  return preload && strstr(preload, "vgpreload");
}

int kn_blas_init(char **argv, int threads) {
  const char *core = NULL, *name, *forced = getenv("PSD_OPENBLAS_CORETYPE");
  const char *inherited = getenv("OPENBLAS_CORETYPE");
  int rc = 0;

  if (!getenv(KN__MARKER) && !kn__under_valgrind()) {
    if (forced && forced[0]) {
      /* The operator's word wins: load exactly that core. */
      if (!inherited || strcmp(inherited, forced) != 0)
        core = forced;
    } else {
      /* An inherited OPENBLAS_CORETYPE (some images set one globally) is
       * replaced too when it leaves vector width unused. */
      core = cm_cpu_blas_core();
      if (core &&
          cm_cpu_blas_level(openblas_get_corename()) >= cm_cpu_blas_level(core))
        core = NULL;
    }
  }
  if (core) {
    if (!argv || !argv[0]) {
      rc = CM_EINVAL;
      goto out;
    }
    name = strrchr(argv[0], '/');
    name = name ? name + 1 : argv[0];
    if ((inherited && setenv(KN__REPLACED, inherited, 1)) ||
        setenv("OPENBLAS_CORETYPE", core, 1) || setenv(KN__MARKER, name, 1)) {
      rc = CM_ENOMEM;
      goto out;
    }
    fflush(NULL);
    {
      /* Run the resolved path, not /proc/self/exe itself: the process name
       * (ps, pgrep, top) comes from the file executed and must stay psd. */
      char self[4096];
      ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
      if (n > 0) {
        self[n] = 0;
        execv(self, argv);
      }
      execv("/proc/self/exe", argv);
    }
    rc = CM_ESYS;
  }
out:
  /* This image loaded OpenBLAS without the new setting; put the old one
   * back so the log tells the truth, and keep the marker against loops. */
  if (rc < 0) {
    if (inherited)
      setenv("OPENBLAS_CORETYPE", inherited, 1);
    else
      unsetenv("OPENBLAS_CORETYPE");
    unsetenv(KN__REPLACED);
  }
  if (threads > 0)
    openblas_set_num_threads(threads);
  return rc;
}

void kn_blas_describe(char *buf, unsigned len) {
  const char *config = openblas_get_config(), *end;
  const char *env = getenv("OPENBLAS_CORETYPE"), *by = getenv(KN__MARKER);
  const char *was = getenv(KN__REPLACED),
             *forced = getenv("PSD_OPENBLAS_CORETYPE");
  char origin[160];

  if (!buf || !len)
    return;
  /* The config string starts "OpenBLAS 0.3.21 ..."; keep those two words. */
  end = strchr(config, ' ');
  end = end ? strchr(end + 1, ' ') : NULL;
  if (env && by && forced && !strcmp(env, forced))
    snprintf(origin, sizeof origin,
             "OPENBLAS_CORETYPE=%s set by %s from PSD_OPENBLAS_CORETYPE", env,
             by);
  else if (env && by && was)
    snprintf(origin, sizeof origin,
             "OPENBLAS_CORETYPE=%s set by %s from CPUID, replacing the "
             "inherited %s",
             env, by, was);
  else if (env && by)
    snprintf(origin, sizeof origin, "OPENBLAS_CORETYPE=%s set by %s from CPUID",
             env, by);
  else if (env)
    snprintf(origin, sizeof origin, "OPENBLAS_CORETYPE=%s from the environment",
             env);
  else
    snprintf(origin, sizeof origin,
             "OPENBLAS_CORETYPE unset: OpenBLAS's choice");
  snprintf(buf, len, "%.*s core=%s threads=%d (%s)",
           end ? (int)(end - config) : (int)strlen(config), config,
           openblas_get_corename(), openblas_get_num_threads(), origin);
}
