/* A training shard's publications for serving (docs/serving.md,
 * "Publishing"): the values of one instant of the shard, written as a
 * directory that serving tasks read.
 *
 * A shard publishes into <publish_dir>/<job>/ps-<I>/, one directory per
 * publication, pub-<version, 10 digits>/, versions 1, 2, 3 ... never
 * reused. Each holds:
 *   manifest.json     format "psd-publication-1", job, shard, shards,
 *                     version, full, base (the full publication this chain
 *                     starts at; == version when full), prev (version - 1
 *                     for a delta, 0 for a full one), step, mode,
 *                     time_unix_ms of the cut, "dense" (per variable: name,
 *                     shape, row_begin, row_end, crc), "dense_file",
 *                     "dense_bytes", "tables" (per table: name, dim, file,
 *                     rows, removed, bytes, crc) and its own "crc": the
 *                     CRC-32 of its compact, key-sorted JSON without "crc"
 *   dense.safetensors this shard's rows of every dense variable, values
 *                     only (safetensors.h; tensor name = variable name,
 *                     shape [row_end - row_begin, ...])
 *   table-<i>.bin     "PSDPUB1\n", u64 x 5 (dim, nrows, nremoved, version,
 *                     name length), the name, ids (u64 x nrows, strictly
 *                     ascending), values (f32 x nrows x dim), removed ids
 *                     (u64 x nremoved, strictly ascending, none of them in
 *                     ids), then the CRC-32 (zlib's) of everything before
 *                     it; little-endian
 * A full publication holds every stored row of every table; a delta the
 * rows changed since prev and the ids removed (evicted) since. Applying a
 * delta: drop its removed ids, then upsert its rows. Dense variables are
 * whole in every publication.
 *
 * The writer makes .tmp-<version>-<pid>/, writes and fsyncs every file and
 * the directory, renames it to pub-<version> and fsyncs the parent (a file
 * set, ckpt/'s fileset.h, as a checkpoint is): a pub-* directory is
 * complete or absent. */
#ifndef PSD_PUBFILE_H
#define PSD_PUBFILE_H

#include <stddef.h>
#include <stdint.h>

#define PSD_PUB_FORMAT "psd-publication-1"

/* One dense variable's rows on the shard. */
struct psd_pub_dense {
  char name[201];    /* the variable */
  int64_t shape[8];  /* the whole variable's shape */
  int ndim;          /* entries of shape */
  int64_t row_begin; /* first row held by the shard */
  int64_t row_end;   /* one past the last */
  float *values;     /* (row_end-row_begin) x row size */
};

/* One table's rows in a publication. */
struct psd_pub_table {
  char name[201];    /* the table */
  uint32_t dim;      /* floats per row */
  size_t nrows;      /* rows in it */
  uint64_t *ids;     /* nrows ids, ascending */
  float *values;     /* nrows x dim */
  size_t nremoved;   /* ids removed since prev (0 in a full one) */
  uint64_t *removed; /* nremoved ids, ascending */
};

/* A publication. The reader owns every pointer (psd_pub_free); the
 * writer's caller owns what it passes. */
struct psd_pub {
  uint64_t version;     /* 1, 2, 3 ... per shard */
  uint64_t base;        /* the full publication its chain starts at */
  uint64_t prev;        /* version - 1 for a delta, 0 for a full one */
  uint64_t step;        /* the shard's step at the cut */
  int full;             /* 1: every row; 0: those changed since prev */
  int64_t time_unix_ms; /* the cut's instant */
  int shard;            /* the training shard */
  int shards;           /* training shards of the layout it was cut in */
  uint64_t layout;      /* that layout's version (0 until a reshard) */
  int move_to, moved;   /* its live move: to move_to shards after `moved`
                           bucket moves (0, 0: none); the rows are those
                           of the buckets this state gives the shard */
  int rows;             /* how they place table rows (CM_LAYOUT_RULE_*;
                           "rows", none recorded: modulo) */
  char job[64];         /* the job's name */
  int ndense;           /* entries of dense */
  struct psd_pub_dense *dense;
  int ntables; /* entries of tables */
  struct psd_pub_table *tables;
};

/* ---- reader ---- */

/* Versions present in dir (the ps-<I> directory), ascending; *out
 * malloc'd. */
int psd_pub_list(const char *dir, uint64_t **out, size_t *n, char *err,
                 size_t errlen);
/* Reads and verifies pub-<version> of dir: every CRC, sizes, the job and
 * shard given (shards > 0: the layout's count too; 0: any, read from it).
 * CM_ENOENT missing; CM_EFORMAT damaged/truncated/other job or shard (err names
 * file and what); CM_ENOMEM. */
int psd_pub_read(const char *dir, uint64_t version, const char *job, int shard,
                 int shards, struct psd_pub **out, char *err, size_t errlen);
void psd_pub_free(struct psd_pub *p);

/* ---- writer ---- */

/* The shard's directory <root>/<job>/ps-<shard> into buf. */
void psd_pub_dir(const char *root, const char *job, int shard, char *buf,
                 size_t len);

/* Creates dir (and its parents) and removes .tmp-* left by a crash
 * (psd_fileset_prepare). Returns 0; CM_EINVAL, dir too long; CM_EIO (err
 * names the path and strerror). */
int psd_pub_prepare(const char *dir, char *err, size_t errlen);

/* Writes p as pub-<p->version> of dir (mode, "sync" or "async", recorded),
 * atomically (see above); *bytes (may be NULL) gets the bytes of its files.
 * Returns 0; CM_EEXIST when pub-<version> exists; CM_EIO (err: path and
 * strerror; nothing is left behind); CM_EINVAL for an inconsistent p (err
 * says what); CM_ENOMEM. */
int psd_pub_write(const char *dir, const struct psd_pub *p, const char *mode,
                  uint64_t *bytes, char *err, size_t errlen);

/* Removes every publication older than the keep-th newest full one (keep
 * full ones, each with the deltas after it). Best effort: a manifest that
 * does not read counts as a delta. Returns how many were removed. */
int psd_pub_prune(const char *dir, int keep);

#endif
