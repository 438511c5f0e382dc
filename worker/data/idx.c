/* Reader for IDX files and the labelled image sets built from them.
 *
 * zlib's gzread reads gzip and plain files alike, so one path handles both.
 * Everything a file claims is checked before it is trusted: the magic, the
 * dtype, each dimension, the product of the dimensions (bounded so that a
 * hostile header cannot ask for an absurd allocation or overflow size_t), and
 * that the file really holds as many bytes as the header promises. Bytes
 * after the promised data are ignored. */
#include "idx.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "bigbuf.h"
#include "err.h"

/* Largest payload accepted: int-indexed callers stay safe, and no real IDX
 * file comes near it (Fashion-MNIST's training images are 47 MB). */
#define DW_IDX_MAX_BYTES ((size_t)INT_MAX)

/* Largest single gzread request (its length is an unsigned int). */
#define DW_IDX_READ_CHUNK (1u << 24)

/* Reads up to len bytes into buf, looping over gzread's short reads; stores
 * how many arrived in *got. Returns 0 (a short *got means end of file),
 * CM_ETRUNC for a gzip stream cut off mid-way, CM_EFORMAT for corrupt gzip
 * data, CM_EIO for a read error; err then says which. */
static int read_full(gzFile gz, const char *path, uint8_t *buf, size_t len,
                     size_t *got, char *err, size_t errlen) {
  int rc = 0;
  int zerr = Z_OK;
  const char *zmsg;

  *got = 0;
  while (*got < len) {
    size_t want = len - *got;
    int n;

    if (want > DW_IDX_READ_CHUNK)
      want = DW_IDX_READ_CHUNK;
    n = gzread(gz, buf + *got, (unsigned)want);
    if (n <= 0)
      break;
    *got += (size_t)n;
  }
  if (*got == len)
    goto out;
  zmsg = gzerror(gz, &zerr);
  if (zerr == Z_OK)
    goto out; /* a clean end of file */
  if (zerr == Z_BUF_ERROR) {
    /* zlib's "unexpected end of file": the gzip stream itself is cut off. */
    rc = CM_ETRUNC;
    goto out;
  }
  if (zerr == Z_ERRNO) {
    snprintf(err, errlen, "%s: read failed: %s", path, strerror(errno));
    rc = CM_EIO;
  } else {
    /* gzdopen names the file "<fd:N>" in zlib's message; drop that part */
    if (zmsg && strncmp(zmsg, "<fd:", 4) == 0 && strstr(zmsg, ": "))
      zmsg = strstr(zmsg, ": ") + 2;
    snprintf(err, errlen, "%s: corrupt gzip data: %s", path,
             zmsg ? zmsg : "unknown zlib error");
    rc = CM_EFORMAT;
  }
out:
  return rc;
}

/* Explains a file that ends before `want` (decompressed) bytes, of which it
 * has `have`; gz_cut when the gzip stream itself is cut off. Returns
 * CM_ETRUNC. */
static int truncated(const char *path, size_t want, size_t have, int gz_cut,
                     char *err, size_t errlen) {
  snprintf(err, errlen,
           "%s: truncated: header promises %zu bytes, file has %zu%s", path,
           want, have, gz_cut ? " (the gzip stream is cut off)" : "");
  return CM_ETRUNC;
}

static uint32_t be32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 |
         (uint32_t)p[3];
}

int dw_idx_load(const char *path, struct dw_idx *out, char *err,
                size_t errlen) {
  uint8_t head[4 + 4 * DW_IDX_MAX_DIMS];
  size_t hlen, got = 0, count = 1;
  uint8_t *data = NULL;
  gzFile gz = NULL;
  int fd = -1;
  int rc = 0;
  int ndim, i;

  memset(out, 0, sizeof *out);
  if (errlen > 0)
    err[0] = '\0';

  /* open() first so that errno reliably tells a missing file from others. */
  fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    rc = errno == ENOENT ? CM_ENOENT : CM_EIO;
    snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    goto out;
  }
  gz = gzdopen(fd, "rb");
  if (gz == NULL) {
    rc = CM_ENOMEM;
    snprintf(err, errlen, "%s: cannot start zlib reader", path);
    goto out;
  }
  fd = -1; /* gzclose closes it from here on */

  rc = read_full(gz, path, head, 4, &got, err, errlen);
  if (rc == 0 && got < 4)
    rc = CM_ETRUNC;
  if (rc == CM_ETRUNC)
    snprintf(err, errlen,
             "%s: truncated: file has %zu bytes, shorter than an IDX header",
             path, got);
  if (rc < 0)
    goto out;
  if (head[0] != 0 || head[1] != 0) {
    rc = CM_EFORMAT;
    snprintf(err, errlen,
             "%s: bad magic 0x%02x%02x%02x%02x: not an IDX file (expected "
             "0x000008 followed by the number of dimensions)",
             path, head[0], head[1], head[2], head[3]);
    goto out;
  }
  if (head[2] != 0x08) {
    rc = CM_EFORMAT;
    snprintf(err, errlen,
             "%s: dtype 0x%02x is not supported; only unsigned byte (0x08)",
             path, head[2]);
    goto out;
  }
  ndim = head[3];
  if (ndim < 1 || ndim > DW_IDX_MAX_DIMS) {
    rc = CM_EFORMAT;
    snprintf(err, errlen, "%s: %d dimensions; expected 1 to %d", path, ndim,
             DW_IDX_MAX_DIMS);
    goto out;
  }

  hlen = 4 + 4 * (size_t)ndim;
  rc = read_full(gz, path, head + 4, hlen - 4, &got, err, errlen);
  if (rc == 0 && got < hlen - 4)
    rc = truncated(path, hlen, 4 + got, 0, err, errlen);
  else if (rc == CM_ETRUNC)
    rc = truncated(path, hlen, 4 + got, 1, err, errlen);
  if (rc < 0)
    goto out;
  for (i = 0; i < ndim; i++) {
    uint32_t d = be32(head + 4 + 4 * i);

    if (d == 0) {
      rc = CM_EFORMAT;
      snprintf(err, errlen, "%s: dimension %d is zero", path, i);
      goto out;
    }
    if (count > DW_IDX_MAX_BYTES / d) {
      rc = CM_EFORMAT;
      snprintf(err, errlen,
               "%s: dimensions multiply to more than %zu bytes; not a "
               "plausible IDX file",
               path, DW_IDX_MAX_BYTES);
      goto out;
    }
    count *= d;
    out->dims[i] = d;
  }

  data = cm_bigbuf_alloc(count);
  if (data == NULL) {
    rc = CM_ENOMEM;
    snprintf(err, errlen, "%s: cannot allocate %zu bytes", path, count);
    goto out;
  }
  rc = read_full(gz, path, data, count, &got, err, errlen);
  if (rc == 0 && got < count)
    rc = truncated(path, hlen + count, hlen + got, 0, err, errlen);
  else if (rc == CM_ETRUNC)
    rc = truncated(path, hlen + count, hlen + got, 1, err, errlen);
  if (rc < 0)
    goto out;

  out->ndim = ndim;
  out->count = count;
  out->data = data;
  data = NULL;
out:
  free(data);
  if (gz != NULL)
    gzclose(gz);
  if (fd >= 0)
    close(fd);
  if (rc < 0)
    memset(out, 0, sizeof *out);
  return rc;
}

void dw_idx_free(struct dw_idx *idx) {
  if (idx == NULL)
    return;
  free(idx->data);
  memset(idx, 0, sizeof *idx);
}

int dw_dataset_load(const char *dir, const char *prefix, int part, int nparts,
                    struct dw_dataset *out, char *err, size_t errlen) {
  struct dw_idx images = {0}, labels = {0};
  char ipath[4096], lpath[4096];
  size_t total, dim, i;
  int rc = 0;
  int n, k;

  memset(out, 0, sizeof *out);
  if (errlen > 0)
    err[0] = '\0';
  if (nparts < 1 || part < 0 || part >= nparts) {
    rc = CM_EINVAL;
    snprintf(err, errlen, "data part %d of %d: expected 0 <= part < parts",
             part, nparts);
    goto out;
  }
  snprintf(ipath, sizeof ipath, "%s/%s-images-idx3-ubyte.gz", dir, prefix);
  snprintf(lpath, sizeof lpath, "%s/%s-labels-idx1-ubyte.gz", dir, prefix);

  rc = dw_idx_load(ipath, &images, err, errlen);
  if (rc < 0)
    goto out;
  rc = dw_idx_load(lpath, &labels, err, errlen);
  if (rc < 0)
    goto out;
  if (images.ndim != 3) {
    rc = CM_ESHAPE;
    snprintf(err, errlen,
             "%s: %d dimensions; images need 3 (count, rows, columns)", ipath,
             images.ndim);
    goto out;
  }
  if (labels.ndim != 1) {
    rc = CM_ESHAPE;
    snprintf(err, errlen, "%s: %d dimensions; labels need 1 (count)", lpath,
             labels.ndim);
    goto out;
  }
  if (images.dims[0] != labels.dims[0]) {
    rc = CM_ESHAPE;
    snprintf(err, errlen, "%s holds %u images but %s holds %u labels", ipath,
             images.dims[0], lpath, labels.dims[0]);
    goto out;
  }
  total = images.dims[0];
  dim = (size_t)images.dims[1] * images.dims[2];
  for (i = 0; i < total; i++) {
    if (labels.data[i] >= 10) {
      rc = CM_EFORMAT;
      snprintf(err, errlen, "%s: label %zu is %u; expected 0..9", lpath, i,
               labels.data[i]);
      goto out;
    }
  }
  if (total <= (size_t)part) {
    rc = CM_ERANGE;
    snprintf(err, errlen, "%s holds %zu examples: none left for part %d of %d",
             ipath, total, part, nparts);
    goto out;
  }
  n = (int)((total - (size_t)part + (size_t)nparts - 1) / (size_t)nparts);

  out->x = cm_bigbuf_alloc((size_t)n * dim * sizeof *out->x);
  out->y = malloc((size_t)n);
  if (out->x == NULL || out->y == NULL) {
    rc = CM_ENOMEM;
    snprintf(err, errlen, "%s: cannot allocate %d examples", ipath, n);
    goto out;
  }
  for (k = 0; k < n; k++) {
    size_t src = (size_t)part + (size_t)k * (size_t)nparts;
    const uint8_t *px = images.data + src * dim;
    float *dst = out->x + (size_t)k * dim;

    for (i = 0; i < dim; i++)
      dst[i] = px[i] / 255.f;
    out->y[k] = labels.data[src];
  }
  out->n = n;
  out->dim = (int)dim;
out:
  dw_idx_free(&labels);
  dw_idx_free(&images);
  if (rc < 0)
    dw_dataset_free(out);
  return rc;
}

void dw_dataset_free(struct dw_dataset *ds) {
  if (ds == NULL)
    return;
  free(ds->x);
  free(ds->y);
  memset(ds, 0, sizeof *ds);
}
