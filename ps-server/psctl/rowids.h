/* Row ids for psctl's table commands (tables.c): the --ids list of
 * `get TABLE` parsed strictly, and the shards' id-sorted runs of `export
 * TABLE` merged into one ascending order. Plain functions on plain data,
 * so the unit suite (tests/unit/test-psctl-rowids.c) reaches them without
 * a cluster. */
#ifndef PSCTL_ROWIDS_H
#define PSCTL_ROWIDS_H

#include <stddef.h>
#include <stdint.h>

/* Parses "1,5,9" (decimal u64 ids, comma-separated, nothing else: no sign,
 * space, empty entry or value past 2^64-1) into a new array *ids of *n
 * entries, in the order given (the caller frees it). Returns 0; CM_EINVAL
 * with err saying what is wrong, e.g. "--ids: 'x' is not an unsigned 64-bit
 * id"; CM_ENOMEM. *ids is NULL on failure. */
int psctl_parse_ids(const char *text, uint64_t **ids, size_t *n, char *err,
                    size_t errlen);

/* One shard's ids, ascending (borrowed). */
struct psctl_run {
  const uint64_t *ids; /* n ids, strictly ascending */
  size_t n;            /* ids in the run */
};

/* The run whose next id (runs[r].ids[at[r]]) is the smallest, or -1 when
 * every run is spent (at[r] == runs[r].n). Ties go to the lower run. */
int psctl_merge_pick(const struct psctl_run *runs, int nruns, const size_t *at);

/* The index of the first of ids[0..n) that is not above the id before it
 * (or above `after`, for the first, when has_after); n when none: a page of
 * Admin/Export is strictly ascending and starts past its request's after. */
size_t psctl_ids_unordered(const uint64_t *ids, size_t n, int has_after,
                           uint64_t after);

#endif
