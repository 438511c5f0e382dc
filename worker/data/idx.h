/* Reader for IDX files (the MNIST / Fashion-MNIST container), gzipped or
 * plain: a big-endian header (magic 0x0000 08 <ndim>, then ndim uint32
 * dimensions) followed by unsigned bytes. */
#ifndef DW_IDX_H
#define DW_IDX_H

#include <stddef.h>
#include <stdint.h>

#define DW_IDX_MAX_DIMS 4

/* A loaded IDX array; data is owned, free with dw_idx_free. */
struct dw_idx {
  int ndim;                       /* number of dimensions, 1..DW_IDX_MAX_DIMS */
  uint32_t dims[DW_IDX_MAX_DIMS]; /* size of each dimension */
  size_t count;                   /* product of dims: bytes in data */
  uint8_t *data;                  /* owned, count bytes */
};

/* Loads path into *out. Errors (returned as CM_E*, explained in err with the
 * path): CM_ENOENT/CM_EIO when unreadable, CM_EFORMAT for a bad magic, a
 * dtype other than unsigned byte, zero or too many dimensions,
 * CM_ETRUNC when the file ends before the data the header promises. */
int dw_idx_load(const char *path, struct dw_idx *out, char *err, size_t errlen);

void dw_idx_free(struct dw_idx *idx);

/* A labelled image set: n images of `dim` pixels scaled to [0, 1]. */
struct dw_dataset {
  int n;      /* number of examples */
  int dim;    /* pixels per example (784 for 28x28) */
  float *x;   /* owned, (n, dim) */
  uint8_t *y; /* owned, (n), labels 0..9 */
};

/* Loads "<dir>/<prefix>-images-idx3-ubyte.gz" and the matching labels file
 * (prefix "train" or "t10k"), checking that their counts agree and labels
 * are < 10. Keeps only examples i with i % nparts == part (a worker's 1/n
 * share; part 0 of 1 keeps all). */
int dw_dataset_load(const char *dir, const char *prefix, int part, int nparts,
                    struct dw_dataset *out, char *err, size_t errlen);

void dw_dataset_free(struct dw_dataset *ds);

#endif
