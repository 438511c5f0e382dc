/* Row ids for psctl's table commands (rowids.h): --ids parsed, and the
 * shards' sorted runs merged by id. */
#include "rowids.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"

/* Parses the id in tok[0..len): decimal digits only, at most 2^64-1.
 * strtoull alone would take " 7", "+7" and "-1" (as 2^64-1). */
static int parse_one(const char *tok, size_t len, uint64_t *out) {
  uint64_t v = 0;
  if (len == 0)
    return CM_EINVAL;
  for (size_t i = 0; i < len; i++) {
    unsigned d = (unsigned)(tok[i] - '0');
    if (d > 9 || v > (UINT64_MAX - d) / 10)
      return CM_EINVAL;
    v = v * 10 + d;
  }
  *out = v;
  return 0;
}

int psctl_parse_ids(const char *text, uint64_t **ids, size_t *n, char *err,
                    size_t errlen) {
  size_t cap = 1, k = 0;
  const char *tok = text;
  uint64_t *v = NULL;
  int rc = 0;
  *ids = NULL;
  *n = 0;
  if (!*text) {
    snprintf(err, errlen, "--ids: no ids given (expected like 1,5,9)");
    return CM_EINVAL;
  }
  for (const char *c = text; *c; c++)
    cap += *c == ',';
  if (!(v = malloc(cap * sizeof *v))) {
    snprintf(err, errlen, "--ids: out of memory for %zu ids", cap);
    return CM_ENOMEM;
  }
  for (;;) {
    size_t len = strcspn(tok, ",");
    if (len == 0) {
      snprintf(err, errlen,
               "--ids: an empty entry at byte %zu of '%.64s' (expected like "
               "1,5,9)",
               (size_t)(tok - text), text);
      rc = CM_EINVAL;
      goto out;
    }
    if (parse_one(tok, len, &v[k])) {
      snprintf(err, errlen, "--ids: '%.*s' is not an unsigned 64-bit id",
               (int)(len > 64 ? 64 : len), tok);
      rc = CM_EINVAL;
      goto out;
    }
    k++;
    if (!tok[len])
      break;
    tok += len + 1;
  }
  *ids = v;
  *n = k;
  v = NULL;
out:
  free(v);
  return rc;
}

int psctl_merge_pick(const struct psctl_run *runs, int nruns,
                     const size_t *at) {
  int best = -1;
  for (int r = 0; r < nruns; r++)
    if (at[r] < runs[r].n &&
        (best < 0 || runs[r].ids[at[r]] < runs[best].ids[at[best]]))
      best = r;
  return best;
}

size_t psctl_ids_unordered(const uint64_t *ids, size_t n, int has_after,
                           uint64_t after) {
  for (size_t i = 0; i < n; i++)
    if ((i > 0 || has_after) && ids[i] <= (i ? ids[i - 1] : after))
      return i;
  return n;
}
