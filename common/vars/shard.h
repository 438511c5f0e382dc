/* The shard map: which rows of a variable each shard holds. A variable is
 * either split into contiguous row ranges across all shards (balanced: every
 * shard's range differs by at most one row) or placed whole on one shard.
 * Every worker and every shard computes the same map from (rows, placement,
 * number of shards) alone, so the map never travels. Beside it, how many
 * elements a variable's shape makes (cm_numel). */
#ifndef CM_SHARD_H
#define CM_SHARD_H

#include <stddef.h>
#include <stdint.h>

/* The elements of a tensor of shape[0..ndim) (1 when ndim is 0; a row's:
 * the shape past its first dimension), the one count of a variable's
 * elements that shards, the client and workers all use. 0 when a dimension
 * is not positive or the count would pass max (UINT64_MAX: no bound);
 * *bad (when not NULL) is then that dimension's index, the first one at
 * fault in order. */
uint64_t cm_numel(int ndim, const int64_t *shape, uint64_t max, int *bad);

/* Placement value meaning "rows split across all shards". */
/* The size from which clients split a variable across all shards unless
 * told otherwise (PSC_PLACE_AUTO), and psd --reshard places by it too. */
#define CM_SHARD_SPLIT_BYTES (256u << 10)

#define CM_SHARD_SPLIT (-1)

/* Rows [*begin, *end) of a `rows`-row variable that shard `shard` of
 * `nshards` holds under `placement` (CM_SHARD_SPLIT or a shard index).
 * An empty range (begin == end) means the shard holds none of it, as when
 * there are more shards than rows. */
void cm_shard_rows(int64_t rows, int placement, int nshards, int shard,
                   int64_t *begin, int64_t *end);

/* Chooses placements for n variables of bytes[i] bytes, in order: a
 * variable of at least split_bytes is split across all shards; a smaller
 * one goes whole to the shard holding the fewest bytes so far (lowest index
 * on ties). Writes placement[i]. Deterministic, so every worker that
 * declares the same list gets the same map. */
void cm_shard_auto(const uint64_t *bytes, int n, int nshards,
                   uint64_t split_bytes, int *placement);

/* The placement of one variable of `bytes` bytes called name that does not
 * depend on any other variable: split across all shards when at least
 * split_bytes (or with one shard), else whole on shard FNV-1a(name) %
 * nshards. Any client declaring any subset of a job's variables, in any
 * order, agrees with every other. */
int cm_shard_by_name(const char *name, uint64_t bytes, int nshards,
                     uint64_t split_bytes);

#endif
