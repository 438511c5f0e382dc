/* The shared check runner (unit.h). */
#include "unit.h"

#include <stdio.h>
#include <stdlib.h>

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

int tu_skip(const char *why) {
  printf("SKIP: %s\n", why);
  return 77;
}
