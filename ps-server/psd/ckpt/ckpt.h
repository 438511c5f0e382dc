/* Room ps-server/psd/ckpt/, a training shard's checkpoints on disk: this
 * header, and fileset.h, the one writer of a directory written whole
 * (a checkpoint; publish/'s publications; reshard/ uses its helpers);
 * ckpt_internal.h is the room's own. Rooms it calls: store/.
 *
 * A shard's checkpoints on disk (DESIGN.md, "State on disk").
 *
 * A shard's directory, <dir>/<job>/ps-<I>/, holds one directory per
 * checkpoint, ckpt-<step, zero-padded>, with two files:
 *   shard.safetensors  each variable's rows held by this shard (tensor name =
 *                      variable name) and its optimizer's slots
 *                      ("<name>/momentum", "<name>/m", "<name>/v", ...)
 *   manifest.json      job, shard, nshards, step, mode, the job's optimizer;
 *                      per variable its whole shape, placement, rows,
 *                      version, optimizer type and steps (opt_step) and the
 *                      CRC-32 of each tensor; async only, the push messages
 *                      the values hold ("dedup": dedup.h's table, see
 *                      psd_dedup_save); the CRC-32 of the manifest itself
 *                      ("checksum")
 * A checkpoint is a file set (fileset.h): written into .tmp-<step>-<pid>,
 * every file fsynced, the directory fsynced, renamed to ckpt-<step>
 * (swapped atomically with an older one of the same step), and the parent
 * fsynced: a ckpt-* directory is complete or absent. Then all but the
 * newest `keep` are removed.
 *
 * Loading takes the newest ckpt-* whose manifest and every tensor verify;
 * one that does not is refused loudly (an error line naming the file and
 * what is wrong) and the one before it is tried. A variable trained with
 * another optimizer type than the spec now gives it is refused too, and
 * then no older checkpoint is tried. Format 1 checkpoints (one optimizer,
 * momentum or sgd, for the job) still load, and so do format 2 ones
 * without "dedup" (written before psd saved it, or by a sync shard): their
 * table is empty. "dedup" did not change the format's number: a reader
 * that ignores it loads what it loaded before (the checksum covers it).
 * ckpt_internal.h lists the files that make it. */
#ifndef PSD_CKPT_H
#define PSD_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "dedup.h"
#include "store.h"

/* Where and how a shard checkpoints (strings copied by psd_ckpt_new). */
struct psd_ckpt_opts {
  const char *root; /* the job's checkpoint dir (spec or flag) */
  const char *job;  /* job name: <root>/<job>/ps-<shard> */
  int shard;        /* this shard */
  int nshards;      /* shards in the job */
  const char *mode; /* "sync" or "async", recorded */
  const struct cm_optim_set *optims; /* the job's optimizers (copied): each
                                        variable's, recorded and checked */
  int keep;                          /* checkpoints kept, >= 1 */
  int has_resume_step;  /* 1: load the newest at or below resume_step */
  uint64_t resume_step; /* (psd --resume-step) */
  int read_only;        /* 1: only read (psd --reshard reading the old shards;
                           a standby shard): nothing is made, cleaned or set
                           aside, but a move file's directory */
  uint64_t layout;      /* the layout version its manifests record (0: none
                           recorded; docs/reshard.md "Live") */
  int rows;             /* how that layout places rows (CM_LAYOUT_RULE_*),
                           recorded as "rows"; 0: buckets */
};

/* What one write or load did. */
struct psd_ckpt_result {
  uint64_t step;    /* the checkpoint's step */
  char path[1100];  /* its directory */
  uint64_t bytes;   /* bytes of its two files */
  int nvars;        /* variables in it */
  double ms;        /* time taken */
  double hold_ms;   /* write: the longest a variable's lock was held */
  double freeze_ms; /* write with a dedup table: how long pushes were held
                       (its apply gate frozen); 0 without */
  int clients;      /* clients in its table of applied pushes, -1 when it
                       has none (sync, or an older checkpoint) */
  int refused;      /* load: newer checkpoints refused before this one */
  int move_to;      /* load: the live move state its manifest records */
  int moved;        /* ("move": to, moved; 0, 0 when none) */
};

struct psd_ckpt;

/* Creates the shard's directory (and its parents) and removes stale .tmp-*
 * directories left by a crash. Returns 0, or CM_EIO with err naming the path
 * and strerror (e.g. a regular file where a directory should be). */
int psd_ckpt_new(struct psd_ckpt **out, const struct psd_ckpt_opts *o,
                 char *err, size_t errlen);
void psd_ckpt_free(struct psd_ckpt *c);

/* Checkpoints the embedding tables ts too (borrowed; must outlive c), and
 * restores them on load (ckpt_tables.c: full and delta files, a table's
 * chain named in each manifest). Call before psd_ckpt_load. */
struct psd_tables;
void psd_ckpt_set_tables(struct psd_ckpt *c, struct psd_tables *ts);

/* A live layout switch's COMMIT (reshard/switch.h): the checkpoints
 * written from now on record layout `layout` of nshards shards. With
 * serves (the shard is one of the nshards), a handle opened read_only (a
 * standby shard taken in) becomes one that writes: its directory is made
 * now (an error is logged when it cannot be). The caller holds the
 * store's switch gate for writing, so that no write runs. */
void psd_ckpt_set_layout(struct psd_ckpt *c, int nshards, uint64_t layout,
                         int serves);

/* A standby shard that a live move gave buckets: a handle opened read_only
 * writes checkpoints from now on, in the layout it has (its directory is
 * made now; an error is logged when it cannot be). Call before the saver
 * may write (psd_server.holding). */
void psd_ckpt_take_rows(struct psd_ckpt *c);

/* ---- A live move (docs/reshard.md "What a kill does to a live move",
 * ckpt_move.c) ---- */

/* The shard's live move state (move_to shards after `moved` moves; both
 * borrowed, read with __atomic builtins, must outlive c): each checkpoint
 * reads it just before its tables are taken (pushes held) and records it
 * as "move"; afterwards the move files it holds are removed. */
void psd_ckpt_set_move(struct psd_ckpt *c, const int *move_to,
                       const int *moved);

/* A move's destination writes the rows it takes as move file
 * move-L<layout>-<moved> (a file set: complete or absent) in two parts,
 * so that the hand-over waits on disk for its own changes alone:
 *
 *   psd_ckpt_move_begin   after the copies, before the hand-over: every
 *                         table's rows of the buckets of set
 *                         (PSD_MOVE_SET_BYTES), as the copies left them
 *                         here, written and fsynced into the set's
 *                         temporary directory (nothing in place yet)
 *   psd_ckpt_move_add     once the buckets are owned here: a table's
 *                         hand-over copy (a delta of rows and evicted ids,
 *                         or a full copy), one call a table it holds
 *   psd_ckpt_move_finish  the manifest, naming the source `from` and the
 *                         move's id `move`, and the set put in place,
 *                         before the source drops the rows
 *   psd_ckpt_move_abandon a move that failed or was cancelled: the
 *                         temporary directory removed, nothing in place
 *
 * At start the files are applied in that order (psd_ckpt_move_apply). The
 * writer (opaque) is the caller's from begin until finish or abandon,
 * which free it; one writer a shard at a time. Each returns 0, CM_ENOMEM
 * or CM_EIO (err names the path); a failure leaves the writer to
 * abandon (finish abandons it itself). */
struct psd_ckpt_move_file;
struct cm_table_conf;
struct psd_table_snap;
int psd_ckpt_move_begin(struct psd_ckpt *c, const uint8_t *set, int moved,
                        struct psd_ckpt_move_file **out, char *err,
                        size_t errlen);
int psd_ckpt_move_add(struct psd_ckpt_move_file *f,
                      const struct cm_table_conf *conf,
                      const struct psd_table_snap *s, char *err, size_t errlen);
int psd_ckpt_move_finish(struct psd_ckpt_move_file *f, int from, uint64_t move,
                         int to, char *err, size_t errlen);
void psd_ckpt_move_abandon(struct psd_ckpt_move_file *f);

/* What a move file says of its move (psd_ckpt_move_last). */
struct psd_ckpt_move {
  int moved;        /* the job's moves after it */
  int to;           /* the count the move goes to */
  int from;         /* its source shard (-1: not said) */
  uint64_t id;      /* the move's id (0: not said, an older file) */
  uint8_t set[512]; /* its buckets (PSD_MOVE_SET_BYTES), as MoveRows's */
};

/* The newest move file of c's layout (of a move to `to` shards; 0: to
 * any count), checked, into *out. Returns 0, CM_ENOENT when there is none,
 * CM_ENOMEM, or CM_EFORMAT with err naming the file. */
int psd_ckpt_move_last(struct psd_ckpt *c, int to, struct psd_ckpt_move *out,
                       char *err, size_t errlen);

/* The most moves of a move file of c's layout (0: none). Returns 0 or
 * CM_ENOMEM. */
int psd_ckpt_move_newest(struct psd_ckpt *c, int *moved);

/* Applies the move files of c's layout and of moves in (after, upto] to
 * the tables (psd_ckpt_set_tables), in order of their moves: each file's
 * rows replace its buckets'. *files and *rows: how many were applied.
 * Returns 0, or CM_EFORMAT / CM_EIO / CM_ENOMEM with err naming the file
 * (a damaged one, or one of a move to another count than `to`). */
int psd_ckpt_move_apply(struct psd_ckpt *c, int to, int after, int upto,
                        int *files, uint64_t *rows, char *err, size_t errlen);

/* The shard's directory, <root>/<job>/ps-<shard> (owned by c). */
const char *psd_ckpt_dir(const struct psd_ckpt *c);

/* Writes the store's variables as checkpoint `step`. With lock_vars each
 * variable is taken under its lock; without, the caller guarantees that
 * nothing changes the values meanwhile (sync: commits are held). With
 * dedup (borrowed; async mode), its apply gate is frozen while the
 * variables are taken and the table is saved with them, so the checkpoint
 * is one instant of the whole shard whose table names exactly the push
 * messages its values hold; pushes wait meanwhile (res->freeze_ms), not
 * while the file is finished and fsynced. Sync passes NULL: its table
 * claims pushes staged for the open step, which no checkpoint holds. On
 * failure nothing is renamed into place, the temporary directory is
 * removed, older checkpoints are untouched; err says what failed (path and
 * strerror). Not thread-safe: one writer at a time. */
int psd_ckpt_write(struct psd_ckpt *c, struct psd_store *store,
                   struct psd_dedup *dedup, uint64_t step, int lock_vars,
                   struct psd_ckpt_result *res, char *err, size_t errlen);

/* Loads the newest checkpoint that verifies into a new store (*out; the
 * caller frees it), logging each refused one as an error, and, when dedup
 * is not NULL, its table of applied pushes into a new table (*dedup,
 * PSD_DEDUP_CLIENTS clients, the caller frees it; empty when the
 * checkpoint has none, res->clients -1). A malformed "dedup" refuses the
 * checkpoint like any other damage. *out (and *dedup) are NULL and 0 is
 * returned when the directory holds no checkpoint. When checkpoints
 * exist but none verifies, returns CM_EFORMAT and err says so. With
 * has_resume_step, checkpoints newer than resume_step are not loaded; once
 * one is, they are renamed to superseded-ckpt-<step> so that later
 * checkpoints of the resumed run are never mistaken for older than them.
 * CM_EEXIST: the newest checkpoint has a variable whose optimizer type is
 * not the spec's (logged, naming it and what to do). */
int psd_ckpt_load(struct psd_ckpt *c, struct psd_store **out,
                  struct psd_dedup **dedup, struct psd_ckpt_result *res,
                  char *err, size_t errlen);

/* Sync rollback: reloads this shard's checkpoint of exactly `step` into
 * store, in place: every variable's values, slots, version and optimizer
 * step count, each under its lock. The checkpoint must hold every variable
 * of store with the same rows; nothing is changed unless it does. Newer
 * checkpoints are renamed superseded-ckpt-<step>-<time> (their steps will
 * be redone). The caller holds commits and checkpoint writes (saver.h).
 * Returns 0; CM_ENOENT when there is no checkpoint of that step, another
 * code when it does not verify or match (err says which). */
int psd_ckpt_restore(struct psd_ckpt *c, uint64_t step, struct psd_store *store,
                     struct psd_ckpt_result *res, char *err, size_t errlen);

/* What the newest checkpoint's manifest says of who wrote it, unverified
 * (psd --reshard and the layout found at start): *step, *nshards, mode
 * ("sync"/"async", modelen bytes) and, when layout is not NULL, *layout (0
 * when not recorded), and when rows is not NULL how its rows are placed,
 * *rows (CM_LAYOUT_RULE_*: "rows" in the manifest; none recorded, a
 * checkpoint written before buckets, is CM_LAYOUT_RULE_MODULO). Returns 0,
 * CM_ENOENT when there is no checkpoint, CM_EFORMAT when its manifest cannot be
 * read (err says why). */
int psd_ckpt_peek(struct psd_ckpt *c, uint64_t *step, int *nshards, char *mode,
                  size_t modelen, uint64_t *layout, int *rows, char *err,
                  size_t errlen);

/* Steps of the newest checkpoints present, newest first; returns how many
 * (at most max). For status and the choice of a rollback step. */
int psd_ckpt_list(struct psd_ckpt *c, uint64_t *steps, int max);

#endif
