/* A shard's checkpoints (ckpt.h): the internals shared by the files they
 * are made of:
 *   ckpt.c         the handle and the shard's directory: creating it,
 *                  cleaning what a crash left, listing checkpoints
 *   ckpt_write.c   writing a checkpoint atomically (the shard file and the
 *                  manifest, as a file set: fileset.h), then pruning old
 *                  ones
 *   ckpt_verify.c  reading one checkpoint directory back into a new store,
 *                  verifying every byte and field on the way
 *   ckpt_load.c    which checkpoint to load (the newest that verifies) or
 *                  restore in place, and setting newer ones aside
 *   ckpt_tables.c  the embedding tables' files: full or delta snapshots,
 *                  their chains, and restoring a chain
 *   fileset.c      a directory written whole (fileset.h), for publish/ too
 * Nothing here is for other modules: they use ckpt.h. */
#ifndef PSD_CKPT_INTERNAL_H
#define PSD_CKPT_INTERNAL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "ckpt.h"
#include "dedup.h"
#include "store.h"
#include "tables.h"

/* Format 2 names each variable's optimizer and keeps any number of slots;
 * format 1 (momentum or sgd for the whole job, one "slot") still loads. */
#define PSD__CKPT_FORMAT "psd-checkpoint-2"
#define PSD__CKPT_FORMAT_1 "psd-checkpoint-1"
#define PSD__CKPT_SHARD_FILE "shard.safetensors"
#define PSD__CKPT_MANIFEST "manifest.json"
/* The manifest's member holding its CRC-32 (psd_fileset_manifest_crc). */
#define PSD__CKPT_CHECKSUM "checksum"
/* Checkpoint directories looked at when loading or pruning. */
#define PSD__CKPT_MAX 4096
/* A table's chain: a full checkpoint, then at most this many minus one
 * deltas before the next full one. */
#define PSD__TCHAIN_MAX 8

/* Where a table's newest checkpoint chain lies: the steps of the
 * checkpoints that hold its full snapshot and then each delta. */
struct psd__tchain {
  char name[CM_TABLE_MAX_NAME + 1]; /* the table */
  int n;                            /* entries in steps */
  uint64_t steps[PSD__TCHAIN_MAX];  /* oldest (the full one) first */
};

/* The tables' snapshots of one checkpoint, taken at its instant. */
struct psd__tsnaps {
  int n;                                     /* tables */
  struct psd_table_snap *snap[CM_TABLE_MAX]; /* owned */
  struct cm_table_conf conf[CM_TABLE_MAX];   /* each table's settings */
  int delta[CM_TABLE_MAX];                   /* 1: a delta snapshot */
  uint64_t pushes[CM_TABLE_MAX];             /* each table's pushes applied
                                                at the snapshot's instant */
  int move_to, moved; /* the shard's live move state, read just before the
                         tables were taken (0, 0: none) */
};

struct psd_ckpt {
  char dir[1024];             /* <root>/<job>/ps-<shard> */
  char job[64];               /* job name */
  int shard;                  /* this shard */
  int nshards;                /* shards in the job */
  uint64_t layout;            /* layout version its manifests record */
  int rows;                   /* its rule, CM_LAYOUT_RULE_* ("rows") */
  char mode[16];              /* "sync" or "async" */
  struct cm_optim_set optims; /* the job's: each variable's, checked on load */
  int keep;                   /* checkpoints kept */
  int has_max;                /* load nothing newer than max */
  uint64_t max;               /* --resume-step */
  int read_only;              /* psd_ckpt_opts.read_only */
  struct psd_tables *tables;  /* borrowed embedding tables, or NULL */
  struct psd__tchain chains[CM_TABLE_MAX]; /* each table's newest chain */
  int nchains;                             /* entries in chains */
  int tables_full;    /* 1: the next checkpoint's tables are full
                         (start, a failed write, a rollback) */
  const int *move_to; /* borrowed: the shard's live move state (read with
                         __atomic builtins), recorded as "move"; NULL: */
  const int *moved;   /* none (psd_ckpt_set_move) */
};

/* ---- ckpt.c */

/* The directory of checkpoint `step`, <dir>/ckpt-<step, zero-padded>, into
 * buf. */
void psd__ckpt_path(const struct psd_ckpt *c, uint64_t step, char *buf,
                    size_t len);

/* ---- ckpt_verify.c */

/* Loads checkpoint directory dir (of `step`) into a new store (*out) and a
 * new table of applied pushes (*dedup; *clients as res->clients), both the
 * caller's; verifies everything. err says what is wrong: CM_EEXIST, a
 * variable's optimizer type is not the spec's; CM_ENOMEM; another code, the
 * checkpoint is damaged or not this shard's. */
int psd__ckpt_load_one(struct psd_ckpt *c, const char *dir, uint64_t step,
                       struct psd_store **out, struct psd_dedup **dedup,
                       int *clients, int *nvars, uint64_t *bytes, char *err,
                       size_t errlen);

/* ---- ckpt_move.c */

/* After a checkpoint recording `moved` moves of layout c->layout: removes
 * the move files it holds (those of older layouts, and of at most that
 * many moves), and a layout switch's staging and decision files
 * (reshard/switch.h) of that layout or older. */
void psd__ckpt_move_prune(struct psd_ckpt *c, int moved);

/* ---- ckpt_tables.c */

/* Before checkpoint `step`'s instant: runs each table's eviction and
 * prepares its snapshot into *s (psd_table_snap_prepare): full for a
 * table with no chain, a chain at its longest or ending at this step, or
 * after tables_full; else a delta. Returns 0 or CM_ENOMEM (*s freed by
 * psd__ckpt_tables_done either way; err says which table). */
int psd__ckpt_tables_prepare(struct psd_ckpt *c, uint64_t step,
                             struct psd__tsnaps *s, char *err, size_t errlen);

/* At the instant (the caller holds the shard still: the apply gate
 * frozen, or commits held): takes every prepared snapshot (a table
 * declared since is prepared now), unsorted, and each table's pushes.
 * Returns 0 or CM_ENOMEM (err). */
int psd__ckpt_tables_take(struct psd_ckpt *c, uint64_t step,
                          struct psd__tsnaps *s, char *err, size_t errlen);

/* Sorts the snapshots and writes them into the checkpoint's file set f
 * (table-<i>.bin each, counted into f->bytes) and their manifest entries
 * into *out (a new JSON array: name, dim, id_bound, optimizer, file, delta,
 * rows, evicted, bytes, pushes and the chain of steps to restore). Returns 0,
 * CM_EIO (err), CM_ENOMEM. */
struct psd_fileset;
int psd__ckpt_tables_write(struct psd_ckpt *c, const struct psd__tsnaps *s,
                           struct psd_fileset *f, uint64_t step, json_t **out,
                           char *err, size_t errlen);

/* After a write of step: ok, the chains now end at it; else the next
 * checkpoint's tables are full. Frees the snapshots. */
void psd__ckpt_tables_done(struct psd_ckpt *c, struct psd__tsnaps *s,
                           uint64_t step, int ok);

/* Restores the tables of checkpoint `step` (manifest m) into c->tables:
 * every file of every chain is read and verified first, then each table
 * (created when missing) gets its full snapshot and deltas in order, and
 * its count of pushes applied (0 from a manifest that has none).
 * Afterwards the next checkpoint's tables are full. Returns 0, CM_ENOMEM,
 * or another code with err naming the file or table. */
int psd__ckpt_tables_load(struct psd_ckpt *c, json_t *m, uint64_t step,
                          char *err, size_t errlen);

/* Whether checkpoint `step` is in a chain that a manifest of steps[0..n)
 * names (so pruning keeps it). */
int psd__ckpt_tables_needed(struct psd_ckpt *c, const uint64_t *kept, int n,
                            uint64_t step);

#endif
