/* Sparse data sets in the LIBSVM / SVMlight text format, one example per
 * line: `label idx:val idx:val ...`, label 0 or 1 (-1 and +1 are read as 0
 * and 1), idx an unsigned 64-bit feature id, val a finite number; blank
 * lines and `#` comments are skipped. Every mistake is reported with the
 * file and line. */
#ifndef DW_LIBSVM_H
#define DW_LIBSVM_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* A loaded data set; owned by the caller, free with dw_svm_free. */
struct dw_svm {
  size_t n;      /* examples */
  uint8_t *y;    /* n labels, 0 or 1 */
  size_t *start; /* n + 1: example i's features are [start[i], start[i+1]) */
  uint64_t *idx; /* nnz feature ids */
  float *val;    /* nnz values */
  size_t nnz;    /* features in all */
};

/* Loads the lines i of path with i % nshares == share (0-based, blank and
 * comment lines not counted). Returns 0, CM_ENOENT/CM_EIO (err: the path
 * and strerror), CM_EFORMAT (err: "path:line: what is wrong"),
 * CM_ENOMEM. */
int dw_svm_load(const char *path, int share, int nshares, struct dw_svm *out,
                char *err, size_t errlen);

/* As dw_svm_load, from an open stream f named path in messages, its first
 * line numbered line0 + 1 (a window of a growing file: stream.h). f is
 * left open. */
int dw_svm_read(FILE *f, const char *path, unsigned long long line0, int share,
                int nshares, struct dw_svm *out, char *err, size_t errlen);

void dw_svm_free(struct dw_svm *d);

/* Grows *p (an array of *cap elements of sz bytes; NULL and 0 at first) to
 * hold at least need, doubling: 0, or CM_ENOMEM (*p kept). For the loaders
 * of a struct dw_svm (libsvm.c, criteo_svm.c). */
int dw_svm_grow(void **p, size_t *cap, size_t need, size_t sz);

#endif
