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

/* ---- slices.c: a variable's new slice from its old holders' pieces,
 * the one rule of the offline cut and of a live layout switch ---- */

/* One old holder's rows of a variable. */
struct psd__piece {
  int64_t row_begin, row_end;             /* rows of the whole variable */
  const float *value;                     /* (row_end - row_begin) x row */
  const float *slots[CM_OPTIM_MAX_SLOTS]; /* the optimizer's, likewise */
  uint64_t version;                       /* pushes applied to it */
  uint64_t steps;                         /* optimizer steps it has taken */
};

/* The piece an old slice v is (pointing into v). */
void psd__piece_of(const struct psd_var *v, struct psd__piece *p);

/* A new shard's slice of one variable while its rows are gathered. */
struct psd__gather {
  char name[PSD_VAR_MAX_NAME + 1];  /* the variable */
  int ndim;                         /* its dimensions */
  int64_t shape[PSD_VAR_MAX_DIMS];  /* its whole shape */
  int placement;                    /* among the new shards */
  int asked;                        /* how its declaration placed it */
  int own;                          /* 1: its own optimizer (opt) */
  struct cm_optim opt;              /* its optimizer */
  int nslots;                       /* cm_optim_nslots(opt.type) */
  int64_t begin, end;               /* the rows the new shard holds */
  uint64_t row;                     /* elements per row */
  float *value;                     /* (end - begin) x row, owned */
  float *slots[CM_OPTIM_MAX_SLOTS]; /* the same, owned */
  int64_t filled;                   /* rows copied so far */
  uint64_t version;                 /* the largest version of its pieces */
  uint64_t steps_lo, steps_hi;      /* its pieces' optimizer steps */
  int pieces;                       /* pieces copied (with rows) */
};

/* Starts g: new shard `shard` of m holds rows cm_layout_rows(shape[0],
 * placement, m, shard) of it. Returns 0 or CM_ENOMEM (free g either way). */
int psd__gather_init(struct psd__gather *g, const char *name, int ndim,
                     const int64_t *shape, int placement, int asked, int own,
                     const struct cm_optim *opt, int m, int shard);

/* Copies the rows of p that g holds; returns the elements copied. */
uint64_t psd__gather_add(struct psd__gather *g, const struct psd__piece *p);

/* Creates g's variable in store (new shard `shard`'s) from the rows
 * gathered, which must be all of them: values, slots, the largest
 * version, the largest step count (a warning naming `who` when the pieces
 * differ). Returns 0 or a code with err naming the variable. */
int psd__gather_make(struct psd__gather *g, struct psd_store *store, int shard,
                     const char *who, char *err, size_t errlen);
void psd__gather_free(struct psd__gather *g);

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
