/* cm_spec_fingerprint (spec.h): 64 bits that tell two cluster specs apart,
 * sent with every call (psd.v1.Caller.spec_fp) so that a shard refuses a
 * task started from another spec with a message naming both, instead of
 * failing later on a placement or a variable that its own spec cannot
 * explain. FNV-1a over what the tasks must agree on: the job's name and
 * the cluster's shard and worker addresses, in order, as written. */
#include "spec.h"

#include <string.h>

#define FNV_OFFSET 0xcbf29ce484222325ull
#define FNV_PRIME 0x100000001b3ull

/* Folds len bytes of p into h. */
static uint64_t fold(uint64_t h, const void *p, size_t len) {
  const unsigned char *b = p;
  for (size_t i = 0; i < len; i++) {
    h ^= b[i];
    h *= FNV_PRIME;
  }
  return h;
}

/* Folds a string and its terminating NUL, so that "ab","c" and "a","bc"
 * differ. */
static uint64_t fold_str(uint64_t h, const char *s) {
  return fold(h, s, strlen(s) + 1);
}

/* Folds a list's length and then each address. */
static uint64_t fold_list(uint64_t h, const struct cm_addr *a, int n) {
  unsigned char len[4] = {(unsigned char)n, (unsigned char)(n >> 8),
                          (unsigned char)(n >> 16), (unsigned char)(n >> 24)};
  h = fold(h, len, sizeof len);
  for (int i = 0; i < n; i++)
    h = fold_str(h, a[i].text);
  return h;
}

uint64_t cm_spec_fingerprint(const struct cm_spec *spec) {
  uint64_t h = fold_str(FNV_OFFSET, spec->job.name);
  h = fold_list(h, spec->ps, spec->nps);
  h = fold_list(h, spec->worker, spec->nworker);
  return h ? h : 1; /* 0 means "not checked" on the wire */
}
