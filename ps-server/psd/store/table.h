/* An embedding table's rows held by this shard (DESIGN.md, "Embedding
 * tables").
 *
 * A row is keyed by a u64 id. The shard that holds an id is the layout's
 * (common/layout/layout.h, cm_layout_map_id_shard): its bucket's in the
 * job's bucket map, so consecutive ids spread. A row is one record: its id, its
 * statistics (pushes that touched it, the last step one did, its optimizer's
 * update count, the checkpoint generation it last changed in), its value (dim
 * floats) and its optimizer state (cm_rowopt_nstate floats), together.
 * Records live in fixed-size slabs that never move; an open-addressing
 * index maps ids to records, and a bucket index lists them by bucket
 * (table_internal.h) for a live move's copies and drop. The table is split into
 * stripes by a hash of the id, each with its own lock, index and slabs, so a
 * resize locks one stripe and never races a writer of another; a batch takes
 * each stripe's lock once. Memory held, everything counted, is at most
 * about 1.5x the rows' value and state bytes at dim 16 with adagrad
 * (psd_table_stats).
 *
 * Rows are created on first touch, filled by cm_table_init_row
 * (common/vars/init.h) from (job seed, table name, id), so every shard,
 * run and restart agrees, and so do the serving task and the export.
 * Admission (tabconf.h) may keep an id out: its pulls get the initializer's
 * row without storing it, its pushes are counted, not applied, until it
 * is admitted.
 *
 * Checkpoints: psd_table_snapshot copies the rows (all, or only those
 * changed since the previous snapshot, plus the ids evicted since) while
 * every stripe is held, so value, state and statistics come from one
 * instant of the whole table. The copy is then written without holding
 * anything (table_file.c).
 *
 * Publications (pubfile.h): psd_table_pub_snapshot copies the values only
 * of the rows changed since the previous publication snapshot, and the ids
 * evicted since, at one instant too. Its change cursor is its own: both
 * kinds of snapshot compare a row's generation with the generation their
 * previous one was taken at, and each keeps its own list of evicted ids,
 * so neither consumer takes changes from the other. */
#ifndef PSD_TABLE_H
#define PSD_TABLE_H

#include <stddef.h>
#include <stdint.h>

#include "tabconf.h"

struct psd_table;

/* A row's statistics. */
struct psd_row_stats {
  uint32_t count;     /* pushes that named the row, each once however many
                         times it named it (admission counts them before
                         it is stored) */
  uint32_t t;         /* optimizer updates applied (Adam's t) */
  uint64_t last_step; /* the shard's step at the last push that touched it */
};

/* What a table holds and did, for psctl tables and the metrics. */
struct psd_table_stats {
  uint64_t rows;         /* rows stored */
  uint64_t pending;      /* ids counted but not yet admitted */
  uint64_t bytes;        /* memory held: slabs, indexes, pending counters */
  uint64_t raw_bytes;    /* rows x (dim + nstate) x 4: value and state */
  uint64_t admitted;     /* rows stored since the table was created or
                            restored (first touch or admission) */
  uint64_t not_admitted; /* pulls answered with the initializer's row, and
                            pushes counted but not applied, for ids not
                            admitted */
  uint64_t evicted;      /* rows evicted since creation */
  uint64_t rows_pulled;  /* ids answered by pulls */
  uint64_t rows_pushed;  /* unique ids applied by pushes */
  uint64_t pushes;       /* pushes applied (each run of psd_table_push_runs
                            naming at least one id), restored with a
                            checkpoint: an async shard's table version */
};

/* Creates an empty table (conf copied). seed is the job's. Returns 0,
 * CM_EINVAL for a bad conf (err says which field), CM_ENOMEM. */
int psd_table_new(struct psd_table **out, const struct cm_table_conf *conf,
                  uint64_t seed, char *err, size_t errlen);
void psd_table_free(struct psd_table *t);

/* The table's configuration (the table's own copy). */
const struct cm_table_conf *psd_table_conf(const struct psd_table *t);

/* Floats of optimizer state per row. */
uint32_t psd_table_nstate(const struct psd_table *t);

/* Sparse pull: copies the rows of ids[0..n) into out (n x dim floats, in
 * request order; duplicates answered each time). An id never seen is
 * created (and admitted when its admission allows it at zero pushes, i.e.
 * CM_ADMIT_ALWAYS); otherwise answered with its initial row, not stored.
 * Thread-safe. Returns 0 or CM_ENOMEM (out is then unspecified; rows
 * created before the failure stay). */
int psd_table_pull(struct psd_table *t, const uint64_t *ids, size_t n,
                   float *out);

/* Sparse push: gradients g (n x dim floats) for ids[0..n), one push.
 * Duplicate ids are summed (in array order), the sum multiplied by scale,
 * and the optimizer applied once per unique id; count += 1 (a push names
 * an id once however often it repeats it), last_step = step. An id not
 * admitted is counted towards its admission and, once admitted by this
 * push, created and updated. The table's pushes grow by 1 (by 0 when n is
 * 0: an empty push changes nothing). Thread-safe: concurrent pushes and
 * pulls of any ids, resizes included, are safe. Returns 0 or CM_ENOMEM
 * (the rows applied before it stay applied). */
int psd_table_push(struct psd_table *t, const uint64_t *ids, size_t n,
                   const float *g, float scale, uint64_t step);

/* Several pushes applied as one (a sync step's, sstage.c): run k is
 * ids[ends[k - 1]..ends[k]) (ends[-1] = 0; ends ascending, ends[nruns - 1]
 * = n). As psd_table_push over the concatenation, except that each id's
 * count grows by the number of runs naming it, and pushes by the number of
 * non-empty runs. */
int psd_table_push_runs(struct psd_table *t, const uint64_t *ids, size_t n,
                        const float *g, float scale, uint64_t step,
                        const size_t *ends, size_t nruns);

/* Evicts, by conf's rules, the rows untouched for evict_after_steps steps
 * before now_step, and those pushed fewer than evict_min_count times.
 * *evicted (may be NULL) gets how many. Evicted ids are remembered for the
 * next delta snapshot, and the next publication snapshot. Returns 0. */
int psd_table_shrink(struct psd_table *t, uint64_t now_step, uint64_t *evicted);

/* Reads one stored row: value (dim floats), state (nstate floats) and
 * stats, each may be NULL. Returns 0, or CM_ENOENT when the id is not
 * stored (pending ids included). */
int psd_table_get(struct psd_table *t, uint64_t id, float *value, float *state,
                  struct psd_row_stats *stats);

/* The k rows with the highest push counts, highest first (ties: lower id
 * first): ids[0..*n) and their stats. ids and stats hold k entries. */
int psd_table_top(struct psd_table *t, size_t k, uint64_t *ids,
                  struct psd_row_stats *stats, size_t *n);

void psd_table_stats(struct psd_table *t, struct psd_table_stats *out);

/* Sets the table's count of pushes applied (a checkpoint's, on restore). */
void psd_table_set_pushes(struct psd_table *t, uint64_t pushes);

/* ---- snapshots (checkpoints) ---- */

/* A copy of rows taken at one instant. Owned by the caller; free with
 * psd_table_snap_free. Rows are sorted by id. */
struct psd_table_snap {
  uint32_t dim;                /* floats per row */
  uint32_t nstate;             /* state floats per row */
  int delta;                   /* 1: rows changed since the previous snapshot */
  uint64_t gen;                /* this snapshot's generation (1, 2, ...) */
  uint64_t base_gen;           /* delta: the generation it follows; full: 0 */
  size_t nrows;                /* rows in it */
  uint64_t *ids;               /* nrows ids, ascending */
  struct psd_row_stats *stats; /* nrows */
  float *values;               /* nrows x dim */
  float *state;                /* nrows x nstate */
  size_t nevicted;             /* delta: ids evicted since base_gen */
  uint64_t *evicted;           /* nevicted ids, ascending */
  int pub; /* a publication's (psd_table_pub_snapshot, or prepared as
              one): values only, no stats */
};

/* Copies the table, with every stripe held at once (one instant): all
 * rows (delta 0), or those changed since the previous snapshot and the ids
 * evicted since (delta 1; with no previous snapshot, all rows). Either way
 * the table then counts changes from this snapshot on. The stripes are
 * held while the rows are copied as they lie in memory, not while they
 * are sorted. Returns 0 or CM_ENOMEM (the table is unchanged). */
int psd_table_snapshot(struct psd_table *t, int delta,
                       struct psd_table_snap **out);
void psd_table_snap_free(struct psd_table_snap *s);

/* psd_table_snapshot (pub 0) or psd_table_pub_snapshot (pub 1, delta
 * = !full) in three calls, for a caller that holds more than the table
 * still at the snapshot's instant (a checkpoint or an async publication:
 * the shard's apply gate) and would hold it for the copy alone: */
/* 1. Before the instant: a snapshot to take (*out, the caller's, freed
 * with psd_table_snap_free), its arrays allocated and touched for the
 * rows it would copy now and some more. Holds each stripe only to count
 * them. Returns 0 or CM_ENOMEM. */
int psd_table_snap_prepare(struct psd_table *t, int pub, int delta,
                           struct psd_table_snap **out);
/* 2. At the instant: copies the rows into s (prepared by the call above,
 * for this table, taken once), every stripe held, unsorted; as the
 * snapshot it stands for otherwise (s->delta then says what it is).
 * Returns 0 or CM_ENOMEM (the table unchanged; s is only to be freed). */
int psd_table_snap_take(struct psd_table *t, struct psd_table_snap *s);
/* 3. After: sorts s's rows and evicted ids by id (a publication's evicted
 * ids then leave out those it holds as rows, and repeats). Returns 0 or
 * CM_ENOMEM (s unsorted; the table already counts changes from its
 * instant on, so a caller that drops s must take the next one full). */
int psd_table_snap_sort(struct psd_table_snap *s);

/* A publication's copy (values only: nstate 0, no stats), with every
 * stripe held at once: all rows (full, or no publication snapshot since
 * the table was made or restored; delta 0, no evicted ids), else the rows
 * changed since the previous publication snapshot and the ids evicted
 * since (delta 1; an id evicted and stored again is a row, not evicted).
 * The table then counts changes, and keeps evicted ids, for the next one.
 * Checkpoints' snapshots neither see nor change this cursor. Returns 0 or
 * CM_ENOMEM (the table is unchanged). */
int psd_table_pub_snapshot(struct psd_table *t, int full,
                           struct psd_table_snap **out);

/* ---- A live move of some buckets to another shard ---- */

/* A live move's copy of the rows in a set of buckets (a bitset of
 * CM_LAYOUT_BUCKETS bits, bucket b at bit b % 8 of byte b / 8): every
 * such row, or with delta (and a move snapshot taken before) those of
 * them changed since the previous one and the ids of them evicted since;
 * with state and stats, as a checkpoint's, for the destination's
 * psd_table_move_install. It visits the rows of those buckets alone (a
 * bucket index), one stripe at a time, each stripe's rows at one instant:
 * a row changed in a stripe already copied is in the next delta (perhaps
 * in this one too). The move's place then moves to now; its evictions
 * are kept until psd_table_move_end. One call of a table's move at a time
 * (this and psd_table_move_end). Returns 0 or CM_ENOMEM (the next one is
 * then a full copy, delta 0). */
int psd_table_move_snapshot(struct psd_table *t, const uint8_t *buckets,
                            int delta, struct psd_table_snap **out);

/* Ends the move: its snapshots start over, its evictions are not kept. */
void psd_table_move_end(struct psd_table *t);

/* Drops every row of the buckets in the set (handed over to another
 * shard), as evictions: the next checkpoint and publication deltas say
 * they are gone. Visits those rows alone, one stripe at a time. *dropped:
 * the rows dropped. Returns 0 or CM_ENOMEM (the rows before are
 * dropped). */
int psd_table_drop_buckets(struct psd_table *t, const uint8_t *buckets,
                           uint64_t *dropped);

/* The destination's side of a move: installs a move snapshot s (the
 * source's psd_table_move_snapshot, its rows all in the set buckets) into
 * this live table, one stripe at a time. Without s->delta it replaces the
 * set's rows (those held here before are dropped); with it, its evicted
 * ids are removed and its rows upserted. Either way the rows count as
 * changed now, and the rows removed as evictions, so that this table's
 * next checkpoint and publication deltas carry them; the table's other
 * rows and its pending evictions are untouched (psd_table_restore is a
 * checkpoint's: it starts the table over). *rows: the rows written.
 * Returns 0, CM_EINVAL when dim or nstate differ from the table's,
 * CM_ENOMEM (the rows before are in). */
int psd_table_move_install(struct psd_table *t, const struct psd_table_snap *s,
                           const uint8_t *buckets, uint64_t *rows);

/* A page for export: the up to max_rows stored rows with the smallest ids
 * above `after` (all ids without has_after), sorted, copied with every
 * stripe held. delta 0, gen 0, no evicted ids. Returns 0 or CM_ENOMEM. */
int psd_table_page(struct psd_table *t, int has_after, uint64_t after,
                   size_t max_rows, struct psd_table_snap **out);

/* Restores: a full snapshot replaces every row; a delta one upserts its
 * rows and removes its evicted ids. Stats come with the rows. Returns 0,
 * CM_EINVAL when dim or nstate differ from the table's, CM_ENOMEM. */
int psd_table_restore(struct psd_table *t, const struct psd_table_snap *s);

/* Writes s to path as one file (table_file.c): a header with the table's
 * name, dim, nstate, optimizer type, delta, gen, base_gen, counts, then
 * the arrays, then a CRC-32 of everything before it; fsynced. Returns 0 or
 * CM_EIO (err: path and strerror). */
int psd_table_snap_write(const struct psd_table_snap *s,
                         const struct cm_table_conf *conf, const char *path,
                         char *err, size_t errlen);

/* Reads such a file; checks its CRC, that the name and dim match conf and
 * the optimizer type too. Returns 0, CM_ENOENT, CM_EFORMAT (damaged or of
 * another table; err says which), CM_ENOMEM. */
int psd_table_snap_read(const char *path, const struct cm_table_conf *conf,
                        struct psd_table_snap **out, char *err, size_t errlen);

#endif
