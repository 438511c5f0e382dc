/* The runner every unit suite shares (tests/unit/test-<module>.c): each file
 * builds its Suite and hands it to tu_run from a main of a line or two. */
#ifndef TU_UNIT_H
#define TU_UNIT_H

#include <check.h>
#include <sys/resource.h>

/* How tu_run runs a suite. */
enum tu_flags {
  TU_NOFORK = 1, /* run the tests in this process (CUDA, gRPC, shared
                    state do not survive check's fork) */
  TU_ENV = 2,    /* print as CK_VERBOSITY says (default: CK_NORMAL) */
};

/* Runs s (and frees it) with flags from enum tu_flags. Returns the exit
 * status: EXIT_SUCCESS when every test passed, else EXIT_FAILURE. */
int tu_run(Suite *s, unsigned flags);

/* What a GPU suite returns when it cannot run: prints "SKIP: why" and
 * returns 77, meson's exit status for a skipped test. */
int tu_skip(const char *why);

/* Limits every file this process writes to `bytes` (the soft
 * RLIMIT_FSIZE, with SIGXFSZ ignored: a write past it fails with EFBIG,
 * "File too large", as on a full disk) and returns the limits before it,
 * for tu_file_size_restore. Only around the call under test: check's own
 * result file is bound by the limit too. */
struct rlimit tu_file_size_limit(rlim_t bytes);
void tu_file_size_restore(const struct rlimit *was);

/* Entries of directory dir whose name starts with prefix (the directory
 * must open). */
int tu_count_entries(const char *dir, const char *prefix);

#endif
