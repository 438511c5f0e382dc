/* The layout: every rule of where things live, the one copy that the
 * client library, the training shard, the serving task, the reshard (the
 * offline cut and the live one), psctl and the export ask. Nothing else
 * computes a shard: tests/docs/test_layout_rule.py fails naming the
 * file and line of a copy.
 *
 * - A table's row lives where the layout's row map puts it
 *   (cm_layout_map_id_shard): its id hashed (splitmix64, so consecutive ids
 *   spread evenly) falls in one of CM_LAYOUT_BUCKETS buckets (the hash's
 *   top bits), and the map says each bucket's shard. The map of n shards
 *   (cm_layout_map_init) holds each shard's share of buckets to one, and
 *   n -> n + 1 moves 1/(n + 1) of them (all to the new shard) and
 *   n -> n - 1 only the last shard's. A
 *   checkpoint written before buckets (its manifest names no rule) keeps
 *   its rows at splitmix64(id) % n (CM_LAYOUT_RULE_MODULO) until a reshard
 *   cuts it again. A caller that hashes ids ahead, the client's plan, keeps
 *   the hash and takes its shard later (cm_layout_map_hash_shard).
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

/* The buckets a table's ids fall in: the top 12 bits of their hash. */
#define CM_LAYOUT_BUCKET_BITS 12
#define CM_LAYOUT_BUCKETS (1u << CM_LAYOUT_BUCKET_BITS)

/* The most shards a layout holds (a bucket's shard is a uint16_t). */
#define CM_LAYOUT_MAX_SHARDS 4096

/* The bucket of a row whose id hashes to h (cm_layout_id_hash). */
static inline unsigned cm_layout_bucket(uint64_t h) {
  return (unsigned)(h >> (64 - CM_LAYOUT_BUCKET_BITS));
}

/* How a layout places rows: the values are Caller.rows on the wire. */
#define CM_LAYOUT_RULE_MODULO 1  /* splitmix64(id) % n: before buckets */
#define CM_LAYOUT_RULE_BUCKETS 2 /* the bucket's shard in the map */

/* A layout's row map: the one answer to "which shard holds this row". */
struct cm_layout_map {
  int nshards; /* the layout's shards, 1..CM_LAYOUT_MAX_SHARDS */
  int rule;    /* CM_LAYOUT_RULE_BUCKETS or CM_LAYOUT_RULE_MODULO */
  uint16_t shard[CM_LAYOUT_BUCKETS]; /* buckets: each bucket's shard */
};

/* The map of a layout of nshards (1..CM_LAYOUT_MAX_SHARDS) shards placing
 * rows by rule (any rule but CM_LAYOUT_RULE_MODULO is buckets). A bucket
 * map is a function of the count alone, built from one shard up: going
 * from k shards to k + 1, each old shard keeps floor or ceil of
 * CM_LAYOUT_BUCKETS / (k + 1) buckets and gives the rest (the first in the
 * order of the buckets' own hashes) to the new shard k. So every count's
 * shards hold their share of buckets to one bucket; n -> n + 1 moves about
 * 1/(n + 1) of the buckets, each to the new shard; n + 1 -> n moves back
 * exactly those. About 50 KiB of stack; callers build maps at start and
 * when a layout changes, not per call. */
void cm_layout_map_init(struct cm_layout_map *m, int rule, int nshards);

/* ---- A move between two counts (a live reshard, bucket by bucket) ---- */

/* The buckets whose shard differs between the maps of `from` and `to`
 * shards: the moves from one to the other, in the order they are made,
 * grouped by the pair of shards (the smaller count's shard, then the
 * larger's), ascending within a pair, so that a run of moves between one
 * source and one destination is one batch. Writes them to buckets (room
 * for CM_LAYOUT_BUCKETS) and returns how many. For from < to they all go to
 * shards from..to-1; for from > to they all leave shards to..from-1; the moves
 * of from -> to are those of to -> from. */
int cm_layout_moves(int from, int to, uint16_t *buckets);

/* The map partway through the move from `from` shards to `to`: from's
 * map with its first `done` moves (cm_layout_moves) made, each bucket on
 * to's shard. Its count is the larger of the two until every move is made
 * (both layouts' shards hold rows meanwhile), then `to`. Returns the
 * number of moves; done is taken as at most that. Every party that knows
 * (from, to, done) computes the same map. */
int cm_layout_map_moving(struct cm_layout_map *m, int from, int to, int done);

/* The map of a layout of nshards shards placing rows by rule, with its
 * live move to move_to shards after `moved` moves (move_to 0, or the
 * layout's own count: none; a move is by buckets): what a "layout moved"
 * answer, a Lookup answer or a publication's manifest names. */
void cm_layout_map_of(struct cm_layout_map *m, int rule, int nshards,
                      int move_to, int moved);

/* The shard of a row whose id hashes to h (cm_layout_id_hash). */
static inline int cm_layout_map_hash_shard(const struct cm_layout_map *m,
                                           uint64_t h) {
  if (m->rule == CM_LAYOUT_RULE_MODULO)
    return (int)(h % (uint64_t)m->nshards);
  return m->shard[cm_layout_bucket(h)];
}

/* The shard that holds the row of id. */
static inline int cm_layout_map_id_shard(const struct cm_layout_map *m,
                                         uint64_t id) {
  return cm_layout_map_hash_shard(m, cm_layout_id_hash(id));
}

/* The rule's name in manifests, status documents and messages: "buckets",
 * "modulo"; and back (0 for a name that is neither). */
const char *cm_layout_rule_name(int rule);
int cm_layout_rule_parse(const char *name);

/* The row rule in words for a message: "bucket splitmix64(id) >> 52 of 3
 * shards' map" or "splitmix64(id) % 3". Returns buf. */
const char *cm_layout_map_text(const struct cm_layout_map *m, char *buf,
                               size_t len);

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
