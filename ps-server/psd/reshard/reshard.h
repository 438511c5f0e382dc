/* Room ps-server/psd/reshard/, resharding: a checkpoint cut onto another
 * shard count offline (psd --reshard, this header) and the live reshard
 * (live.h); reshard_internal.h and live_internal.h are the room's own.
 * Rooms it calls: psd/ (psd.h, the daemon's state), shard/, store/,
 * ckpt/, coord/, peer/ (ps:0's calls to the shards).
 *
 * Restoring a job's checkpoint onto another number of shards (psd
 * --reshard; docs/reshard.md).
 *
 * A checkpoint of N shards (<root>/<job>/ps-0 .. ps-N-1, each its newest
 * checkpoint; sync: the newest step every shard has) is cut again for the
 * M shards of the spec, exactly as a job started with M shards lays its
 * state out (the layout's rules, common/layout/layout.h): table rows go
 * to its bucket's shard in the bucket map of M (cm_layout_map_id_shard),
 * and each variable where
 * its declaration's placement puts it among M (cm_layout_replace, the rule
 * a client that follows the move uses too): split to M row ranges
 * (cm_layout_rows), one declared on shard k stays there (by name while M
 * has no shard k), any other held whole goes where its name hashes among M
 * (cm_layout_by_name, the placement clients give by default: dworker's
 * models and psc_declare's PSC_PLACE_AUTO). Values,
 * optimizer slots, per-row state and statistics, versions and step counts
 * are copied bit for bit. Async checkpoints' tables of applied pushes are
 * not carried: the workers of the resharded job start anew.
 *
 * Memory: one old shard and as many new shards as fit in o->memory at a
 * time: all M when they fit (each old shard read once), else fewer, down
 * to one (each new shard reads every old one: N x M loads). The new checkpoints
 * are written into <root>/.reshard-<job>-<pid>/<job>/, each read back and
 * checked (every tensor's CRC, every variable's rows, every table row's shard,
 * and the totals against the old ones), then swapped with <root>/<job> in one
 * rename (RENAME_EXCHANGE): a crash leaves either the old layout or the
 * new one, never a mix. The old one is kept beside it as
 * <root>/<job>.<N>-shards-<time>. Onto the same count it re-cuts all the
 * same: rows stay, variables move to where clients place them now. */
#ifndef PSD_RESHARD_H
#define PSD_RESHARD_H

#include <stddef.h>
#include <stdint.h>

#include "spec.h"

/* What to restore, onto how many shards. */
struct psd_reshard_opts {
  const char *root;         /* the job's checkpoint root */
  const struct cm_job *job; /* the spec's job (borrowed): name, mode,
                               optimizers, tables, seed, keep */
  int nshards;              /* M, the spec's shards */
  uint64_t memory;          /* bytes it may hold at once; 0: half of
                               MemAvailable (see psd_reshard_run) */
};

/* What a reshard did, for its closing lines and tests. */
struct psd_reshard_report {
  int from;             /* N: shards of the old checkpoint */
  int to;               /* M */
  uint64_t layout;      /* the new layout's version (the old one's + 1) */
  uint64_t step;        /* the new checkpoints' step */
  int nvars;            /* variables */
  int ntables;          /* tables */
  uint64_t rows;        /* table rows (the same before and after) */
  uint64_t rows_moved;  /* ... now on another shard index than before */
  uint64_t elems;       /* dense elements */
  uint64_t elems_moved; /* ... now on another shard index than before */
  uint64_t bytes;       /* bytes of the new checkpoints' files */
  double ms;            /* wall time */
  char kept[1200];      /* where the old layout was set aside */
};

/* Restores the newest checkpoint of o->job under o->root onto o->nshards
 * shards (see above), saying what it does on the log. Returns 0; CM_ENOENT
 * when there is no checkpoint; CM_EFORMAT when an old shard's checkpoint is
 * missing, damaged or of another shard count, or the old shards disagree;
 * CM_EIO, CM_ENOMEM. err says which, naming the directory. On failure
 * <root>/<job> is untouched. */
int psd_reshard_run(const struct psd_reshard_opts *o,
                    struct psd_reshard_report *r, char *err, size_t errlen);

/* psd at start: the job's layout under root, from its shards' newest
 * checkpoints: the newest layout among them (a live switch that one shard
 * checkpointed was committed everywhere; shards whose newest is older did
 * not checkpoint since), *nshards, *layout and how it places rows, *rows
 * (CM_LAYOUT_RULE_*; all 0 when there is none). Returns 0;
 * CM_EEXIST, err saying why, when one was written by more shards than
 * max_shards (the spec's addresses; naming the command that restores it
 * onto them), when the newest layout's checkpoints disagree on their
 * count or rule, or when an interrupted psd --reshard must be finished
 * first. */
int psd_reshard_layout(const char *root, const char *job, int max_shards,
                       int *nshards, uint64_t *layout, int *rows, char *err,
                       size_t errlen);

#endif
