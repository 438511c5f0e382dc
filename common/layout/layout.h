/* The layout: every rule of where things live, the one copy that the
 * client library, the training shard, the serving task, the reshard (the
 * offline cut and the live one), psctl and the export ask. Nothing else
 * computes a shard: tests/docs/test_layout_rule.py fails naming the
 * file and line of a copy.
 *
 * - A table's row lives on shard cm_layout_hash_shard(cm_layout_id_hash(id),
 *   nshards), splitmix64(id) % nshards, so consecutive ids spread evenly
 *   (cm_layout_id_shard does both steps; a caller that hashes ids ahead,
 *   the client's plan, keeps the hash and takes its shard later).
 * - A variable is split into contiguous row ranges across all shards
 *   (balanced: every shard's range differs by at most one row) or placed
 *   whole on one shard; every worker and every shard computes the same
 *   ranges from (rows, placement, number of shards) alone, so they never
 *   travel (cm_layout_rows). The placement is chosen by size and load
 *   (cm_layout_auto), by name (cm_layout_by_name) or by hand (a shard
 *   index), and re-chosen after a reshard from what the declaration asked
 *   (cm_layout_replace).
 * - Serving task serve:J follows training shard J % nps as its replica
 *   J / nps (cm_layout_serve_*).
 * - A name's hash is FNV-1a 64 of its bytes (cm_layout_name_hash): the
 *   placement by name, and the name's part of every initial value's key
 *   (common/vars/init.c).
 *
 * Pure functions of their arguments: no state, no allocation, no errors;
 * every pointer is the caller's and only read. The row rule is inline:
 * it runs once per id of every sparse call. */
#ifndef CM_LAYOUT_H
#define CM_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "rand.h"

/* ---- A table's rows ---- */

/* The hash of a row's id that places it (splitmix64, common/base/rand.h). */
static inline uint64_t cm_layout_id_hash(uint64_t id) {
  return cm_splitmix64_at(id);
}

/* The shard among nshards (> 0) of a row whose id hashes to h
 * (cm_layout_id_hash). */
static inline int cm_layout_hash_shard(uint64_t h, int nshards) {
  return (int)(h % (uint64_t)nshards);
}

/* The shard among nshards (> 0) that holds the row of id. */
static inline int cm_layout_id_shard(uint64_t id, int nshards) {
  return cm_layout_hash_shard(cm_layout_id_hash(id), nshards);
}

/* The row rule in words for a message, a printf format taking nshards
 * (an int): "... belongs to shard 1, not shard 0 (splitmix64(id) % 2)". */
#define CM_LAYOUT_ID_RULE "splitmix64(id) %% %d"

/* ---- A name's hash ---- */

/* FNV-1a 64 of a name's bytes (up to its NUL): the placement by name
 * (cm_layout_by_name), the name's part of every initial value's key and of
 * a table's admission by probability, and psd's index of variables. */
uint64_t cm_layout_name_hash(const char *name);

/* ---- Variables ---- */

/* The size from which clients split a variable across all shards unless
 * told otherwise (PSC_PLACE_AUTO), and psd --reshard places by it too. */
#define CM_LAYOUT_SPLIT_BYTES (256u << 10)

/* Placement value meaning "rows split across all shards". */
#define CM_LAYOUT_SPLIT (-1)

/* How a declaration chose a variable's placement (its intent, "asked"),
 * kept by the shards and their checkpoints through reshards:
 * CM_LAYOUT_SPLIT, a shard index (named by the declaration), or one of
 * these. */
#define CM_LAYOUT_AUTO (-2)   /* the least-loaded shard of its declare */
#define CM_LAYOUT_NAME (-3)   /* by name (cm_layout_by_name) */
#define CM_LAYOUT_UNSAID (-4) /* not said: an older client or checkpoint */

/* Rows [*begin, *end) of a `rows`-row variable that shard `shard` of
 * `nshards` holds under `placement` (CM_LAYOUT_SPLIT or a shard index).
 * An empty range (begin == end) means the shard holds none of it, as when
 * there are more shards than rows. */
void cm_layout_rows(int64_t rows, int placement, int nshards, int shard,
                    int64_t *begin, int64_t *end);

/* Chooses placements for n variables of bytes[i] bytes, in order: a
 * variable of at least split_bytes is split across all shards; a smaller
 * one goes whole to the shard holding the fewest bytes so far (lowest index
 * on ties). Writes placement[i]. Deterministic, so every worker that
 * declares the same list gets the same map. */
void cm_layout_auto(const uint64_t *bytes, int n, int nshards,
                    uint64_t split_bytes, int *placement);

/* The placement of one variable of `bytes` bytes called name that does not
 * depend on any other variable: split across all shards when at least
 * split_bytes (or with one shard), else whole on shard
 * cm_layout_name_hash(name) % nshards. Any client declaring any subset of
 * a job's variables, in any order, agrees with every other. */
int cm_layout_by_name(const char *name, uint64_t bytes, int nshards,
                      uint64_t split_bytes);

/* VarSpec.asked on the wire (0 not said, k + 1 for shard k, the negative
 * values as they are) to CM_LAYOUT_* or a shard index, and back. */
int cm_layout_asked_from_wire(int32_t wire);
int32_t cm_layout_asked_to_wire(int asked);

/* Where a variable goes when the job's layout moves from `from` shards to
 * `to`: the one rule of psd's reshard cut and of a client that follows a
 * moved layout. `asked` is how its declaration placed it (CM_LAYOUT_*, or a
 * shard index), `held` its placement among `from`, bytes its size. Split
 * stays split; a variable declared on shard k stays there, and goes by
 * name while the layout has no shard k (back on k when it has again);
 * any other (AUTO, by name, or not said) stays split when it was split
 * among more than one shard, else goes by name (cm_layout_by_name). */
int cm_layout_replace(int asked, int held, int from, const char *name,
                      uint64_t bytes, int to);

/* ---- Serving tasks ---- */

/* The training shard that serving task serve:J follows among nps (> 0)
 * shards, J % nps, and which of its replicas J is, J / nps. */
static inline int cm_layout_serve_shard(int task, int nps) {
  return task % nps;
}
static inline int cm_layout_serve_replica(int task, int nps) {
  return task / nps;
}

/* The serving task J that is replica r of training shard `shard`. */
static inline int cm_layout_serve_task(int shard, int replica, int nps) {
  return replica * nps + shard;
}

/* The replicas each of nps (> 0) shards gets from nserve serving tasks,
 * or 0 when nserve is not a multiple of nps (every shard has as many). */
static inline int cm_layout_serve_replicas(int nserve, int nps) {
  return nserve % nps ? 0 : nserve / nps;
}

#endif
