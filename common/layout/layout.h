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

/* The size from which clients split a variable across all shards unless
 * told otherwise (PSC_PLACE_AUTO), and psd --reshard places by it too. */
#define CM_SHARD_SPLIT_BYTES (256u << 10)

/* Placement value meaning "rows split across all shards". */
#define CM_SHARD_SPLIT (-1)

/* How a declaration chose a variable's placement (its intent, "asked"),
 * kept by the shards and their checkpoints through reshards: CM_SHARD_SPLIT,
 * a shard index (named by the declaration), or one of these. */
#define CM_SHARD_AUTO (-2)   /* the least-loaded shard of its declare */
#define CM_SHARD_NAME (-3)   /* by name (cm_shard_by_name) */
#define CM_SHARD_UNSAID (-4) /* not said: an older client or checkpoint */

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

/* VarSpec.asked on the wire (0 not said, k + 1 for shard k, the negative
 * values as they are) to CM_SHARD_* or a shard index, and back. */
int cm_shard_asked_from_wire(int32_t wire);
int32_t cm_shard_asked_to_wire(int asked);

/* Where a variable goes when the job's layout moves from `from` shards to
 * `to`: the one rule of psd's reshard cut and of a client that follows a
 * moved layout. `asked` is how its declaration placed it (CM_SHARD_*, or a
 * shard index), `held` its placement among `from`, bytes its size. Split
 * stays split; a variable declared on shard k stays there, and goes by
 * name while the layout has no shard k (back on k when it has again);
 * any other (AUTO, by name, or not said) stays split when it was split
 * among more than one shard, else goes by name (cm_shard_by_name). */
int cm_shard_replace(int asked, int held, int from, const char *name,
                     uint64_t bytes, int to);

#endif
