/* The LIBSVM reader (libsvm.h): one pass with getline, arrays grown by
 * doubling. */
#include "libsvm.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"

void dw_svm_free(struct dw_svm *d) {
  free(d->y);
  free(d->start);
  free(d->idx);
  free(d->val);
  memset(d, 0, sizeof *d);
}

int dw_svm_grow(void **p, size_t *cap, size_t need, size_t sz) {
  if (need <= *cap)
    return 0;
  size_t c = *cap ? *cap : 1024;
  while (c < need)
    c *= 2;
  void *q = realloc(*p, c * sz);
  if (!q)
    return CM_ENOMEM;
  *p = q;
  *cap = c;
  return 0;
}

int dw_svm_load(const char *path, int share, int nshares, struct dw_svm *out,
                char *err, size_t errlen) {
  FILE *f = fopen(path, "r");
  int rc;
  memset(out, 0, sizeof *out);
  if (!f) {
    snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno));
    return errno == ENOENT ? CM_ENOENT : CM_EIO;
  }
  rc = dw_svm_read(f, path, 0, share, nshares, out, err, errlen);
  fclose(f);
  return rc;
}

int dw_svm_read(FILE *f, const char *path, unsigned long long line0, int share,
                int nshares, struct dw_svm *out, char *err, size_t errlen) {
  char *line = NULL;
  size_t linecap = 0, ncap = 0, scap = 0, fcap = 0, vcap = 0;
  unsigned long long lineno = line0, example = 0;
  int rc = 0;
  memset(out, 0, sizeof *out);
  if (dw_svm_grow((void **)&out->start, &scap, 1, sizeof *out->start))
    goto nomem;
  out->start[0] = 0;
  while (getline(&line, &linecap, f) >= 0) {
    char *p = line, *end;
    lineno++;
    while (*p == ' ' || *p == '\t')
      p++;
    if (*p == '\n' || *p == '\r' || *p == '#' || *p == 0)
      continue;
    int mine = (int)(example++ % (unsigned long long)nshares) == share;
    long label = strtol(p, &end, 10);
    if (end == p || (label != 0 && label != 1 && label != -1) ||
        (*end != ' ' && *end != '\t' && *end != '\n' && *end != '\r' &&
         *end != 0)) {
      snprintf(err, errlen, "%s:%llu: the label is not 0 or 1 (nor -1/+1)",
               path, lineno);
      rc = CM_EFORMAT;
      goto out;
    }
    if (!mine)
      continue;
    if (dw_svm_grow((void **)&out->y, &ncap, out->n + 1, 1) ||
        dw_svm_grow((void **)&out->start, &scap, out->n + 2,
                    sizeof *out->start))
      goto nomem;
    out->y[out->n] = label == 1;
    p = end;
    for (;;) {
      while (*p == ' ' || *p == '\t')
        p++;
      if (*p == '\n' || *p == '\r' || *p == 0 || *p == '#')
        break;
      if (*p == '-') {
        snprintf(err, errlen, "%s:%llu: a negative feature index", path,
                 lineno);
        rc = CM_EFORMAT;
        goto out;
      }
      errno = 0;
      unsigned long long idx = strtoull(p, &end, 10);
      if (end == p || *end != ':' || errno) {
        int len = (int)strcspn(p, " \t\r\n");
        snprintf(err, errlen, "%s:%llu: '%.*s' is not idx:val", path, lineno,
                 len < 40 ? len : 40, p);
        rc = CM_EFORMAT;
        goto out;
      }
      p = end + 1;
      float v = strtof(p, &end);
      if (end == p || !isfinite(v)) {
        snprintf(err, errlen,
                 "%s:%llu: the value of feature %llu is not a "
                 "finite number",
                 path, lineno, idx);
        rc = CM_EFORMAT;
        goto out;
      }
      p = end;
      if (dw_svm_grow((void **)&out->idx, &fcap, out->nnz + 1,
                      sizeof *out->idx) ||
          dw_svm_grow((void **)&out->val, &vcap, out->nnz + 1,
                      sizeof *out->val))
        goto nomem;
      out->idx[out->nnz] = idx;
      out->val[out->nnz++] = v;
    }
    out->start[++out->n] = out->nnz;
  }
  if (ferror(f)) {
    snprintf(err, errlen, "read %s: %s", path, strerror(errno));
    rc = CM_EIO;
  }
  goto out;
nomem:
  snprintf(err, errlen, "%s: out of memory at line %llu", path, lineno);
  rc = CM_ENOMEM;
out:
  free(line);
  if (rc)
    dw_svm_free(out);
  return rc;
}
