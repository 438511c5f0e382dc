/* Criteo files as the CTR model's sparse examples (criteo.h's
 * dw_criteo_load_svm): the reader's batches turned into libsvm.h's arrays.
 * Apart from criteo.c, so that the Python extension takes the reader
 * without the LIBSVM code. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "criteo.h"
#include "ctrgen.h"
#include "err.h"

int dw_criteo_load_svm(const char *path, int share, int nshares,
                       struct dw_svm *out, char *err, size_t errlen) {
  enum { B = 4096 };
  struct dw_criteo *r = NULL;
  float *label = malloc(B * sizeof *label),
        *dense = malloc(B * DW_CRITEO_INTS * sizeof *dense);
  uint8_t *present = malloc(B * DW_CRITEO_INTS);
  uint64_t *ids = malloc(B * DW_CRITEO_CATS * sizeof *ids);
  size_t ncap = 0, scap = 0, fcap = 0, vcap = 0, got;
  int rc;
  memset(out, 0, sizeof *out);
  if ((rc = dw_criteo_open(path, share, nshares, &r, err, errlen)))
    goto out;
  rc = CM_ENOMEM;
  if (!label || !dense || !present || !ids ||
      dw_svm_grow((void **)&out->start, &scap, 1, sizeof *out->start))
    goto nomem;
  out->start[0] = 0;
  while (!(rc = dw_criteo_read(r, B, NULL, label, dense, present, ids, &got,
                               err, errlen)) &&
         got) {
    size_t most = DW_CRITEO_CATS + DW_CRITEO_INTS;
    if (dw_svm_grow((void **)&out->y, &ncap, out->n + got, 1) ||
        dw_svm_grow((void **)&out->start, &scap, out->n + got + 1,
                    sizeof *out->start) ||
        dw_svm_grow((void **)&out->idx, &fcap, out->nnz + got * most,
                    sizeof *out->idx) ||
        dw_svm_grow((void **)&out->val, &vcap, out->nnz + got * most,
                    sizeof *out->val))
      goto nomem;
    for (size_t i = 0; i < got; i++) {
      for (int c = 0; c < DW_CRITEO_CATS; c++) {
        out->idx[out->nnz] = (uint64_t)c * DW_CTR_SPAN +
                             ids[i * DW_CRITEO_CATS + c] % DW_CTR_SPAN;
        out->val[out->nnz++] = 1;
      }
      for (int j = 0; j < DW_CRITEO_INTS; j++) {
        float x = dense[i * DW_CRITEO_INTS + j];
        if (!present[i * DW_CRITEO_INTS + j])
          continue;
        out->idx[out->nnz] = (uint64_t)(DW_CRITEO_CATS + j) * DW_CTR_SPAN;
        out->val[out->nnz++] = (float)log1p(x > 0 ? x : 0);
      }
      out->y[out->n] = label[i] != 0;
      out->start[++out->n] = out->nnz;
    }
  }
  goto out;
nomem:
  rc = CM_ENOMEM;
  snprintf(err, errlen, "%s: out of memory after %zu examples", path, out->n);
out:
  dw_criteo_close(r);
  free(label);
  free(dense);
  free(present);
  free(ids);
  if (rc)
    dw_svm_free(out);
  return rc;
}
