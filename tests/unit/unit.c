/* The shared check runner (unit.h). */
#include "unit.h"

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int tu_run(Suite *s, unsigned flags) {
  SRunner *sr = srunner_create(s);
  int failed;

  if (flags & TU_NOFORK)
    srunner_set_fork_status(sr, CK_NOFORK);
  srunner_run_all(sr, (flags & TU_ENV) ? CK_ENV : CK_NORMAL);
  failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

int tu_count_entries(const char *dir, const char *prefix) {
  DIR *d = opendir(dir);
  struct dirent *e;
  int n = 0;
  ck_assert_ptr_nonnull(d);
  while ((e = readdir(d)))
    n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
  closedir(d);
  return n;
}

int tu_skip(const char *why) {
  printf("SKIP: %s\n", why);
  return 77;
}

struct rlimit tu_file_size_limit(rlim_t bytes) {
  struct rlimit was, lim;
  signal(SIGXFSZ, SIG_IGN);
  ck_assert_int_eq(getrlimit(RLIMIT_FSIZE, &was), 0);
  lim = (struct rlimit){bytes, was.rlim_max};
  ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
  return was;
}

void tu_file_size_restore(const struct rlimit *was) {
  ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, was), 0);
}
