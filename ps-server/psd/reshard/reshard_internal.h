/* psd --reshard (reshard.h): what its two files share.
 *   reshard.c      finding the old shards, the order of the work, checking
 *                  what was written, swapping the job's directory
 *   reshard_cut.c  one new shard's state cut from the old shards'
 *   reshard_dir.c  the job's directory: an earlier run's leftovers, the
 *                  swap, the check at a shard's start */
#ifndef PSD_RESHARD_INTERNAL_H
#define PSD_RESHARD_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "reshard.h"
#include "store.h"
#include "tables.h"

/* The old layout: N shards, each's checkpoint to read. */
struct psd__reshard_src {
  const struct psd_reshard_opts *o; /* what was asked */
  int n;                            /* N */
  uint64_t layout;                  /* the old layout's version (ps-0's
                                       manifest); the new one is one more */
  int sync;                         /* the job is sync */
  uint64_t steps[4096];             /* the step read from each old shard */
  uint64_t step;                    /* the new checkpoints' step: sync the
                                       common one, async the largest */
};

/* One new shard's state, cut from the old shards. Owned by the caller:
 * free with psd__reshard_cut_free. */
struct psd__reshard_cut {
  int shard;                 /* the new shard's index */
  struct psd_store *store;   /* its variables */
  struct psd_tables *tables; /* its tables */
  uint64_t rows;             /* table rows it holds */
  uint64_t rows_moved;       /* ... of which an old shard of another index
                                held */
  uint64_t elems;            /* dense elements it holds */
  uint64_t elems_moved;      /* ... of which came from another index */
};

/* Cuts new shards first..first+count-1 of o->nshards into out[0..count)
 * from every old shard of src, each loaded once, read only. Returns 0 or a
 * code with err naming the old shard, variable or table at fault (out is
 * then freed). */
int psd__reshard_cut(const struct psd__reshard_src *src, int first, int count,
                     struct psd__reshard_cut *out, char *err, size_t errlen);
void psd__reshard_cut_free(struct psd__reshard_cut *c);

/* Loads old shard k of src (read only) into *store and *tables (new; the
 * caller frees both). Returns 0 or a code, err naming the directory. */
int psd__reshard_load(const struct psd__reshard_src *src, int k,
                      struct psd_store **store, struct psd_tables **tables,
                      char *err, size_t errlen);

/* Deals with what an earlier run left in root: finishes a swap it left
 * half done (no job directory, its new layout whole and marked COMPLETE),
 * renames anything else aside as <job>.unfinished-reshard-<pid>. */
void psd__reshard_tidy(const char *root, const char *job);

/* Makes the checked new layout in moved (tmp/<job>) the job's directory
 * jobdir, the old one going to kept: one RENAME_EXCHANGE, or two renames
 * where the file system refuses it, after marking tmp COMPLETE. Returns 0
 * or CM_EIO (err says which rename); *kept_ok: 1 the old layout is in
 * kept, 0 it stayed in moved, -1 (on failure) tmp holds the only copy of
 * the new layout and must stay. */
int psd__reshard_swap_in(const char *root, const char *tmp, const char *moved,
                         const char *jobdir, const char *kept, int *kept_ok,
                         char *err, size_t errlen);

#endif
