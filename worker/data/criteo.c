/* The Criteo TSV reader (criteo.h): zlib's gzread into a buffer grown to
 * the longest line, lines found with memchr, the share's lines split at
 * their tabs and parsed in place. */
#include "criteo.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "err.h"
#include "rand.h"

/* The first buffer's size, and the most one gzread asks for. */
#define BUF0 (1u << 20)
#define READ_MAX (1u << 30)

/* Criteo Kaggle's per-field distinct counts (psd-ctrgen --format criteo's
 * cardinalities, docs/ctr.md). */
const uint64_t dw_criteo_bounds[DW_CRITEO_CATS] = {
    1460,  583,  10131227, 2202608, 305, 24,     12517,   633,   3,
    93145, 5683, 8351593,  3194,    27,  14992,  5461306, 10,    5652,
    2173,  4,    7046547,  18,      15,  286181, 105,     142572};

/* A reader's state. */
struct dw_criteo {
  gzFile g;                /* the file, plain or gzip */
  char path[1024];         /* its name, for messages */
  int share, nshares;      /* the lines this reader returns */
  char *buf;               /* bytes read, not yet consumed */
  size_t cap, pos, len;    /* buf's size; the next line's start; the end */
  int eof;                 /* gzread said the end */
  int rc;                  /* the first error, repeated after */
  char msg[1200];          /* its message */
  unsigned long long line; /* lines taken so far */
};

uint64_t dw_criteo_id(int field, const void *s, size_t len) {
  const unsigned char *p = s;
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < len; i++)
    h = (h ^ p[i]) * 0x100000001b3ull;
  return cm_splitmix64_at(h ^ cm_splitmix64_at((uint64_t)field + 1));
}

int dw_criteo_open(const char *path, int share, int nshares,
                   struct dw_criteo **out, char *err, size_t errlen) {
  struct dw_criteo *r = NULL;
  int rc = CM_ENOMEM;
  *out = NULL;
  if (nshares < 1 || share < 0 || share >= nshares) {
    snprintf(err, errlen, "%s: share %d of %d: want 0 <= share < nshares", path,
             share, nshares);
    return CM_EINVAL;
  }
  if (!(r = calloc(1, sizeof *r)) || !(r->buf = malloc(BUF0))) {
    snprintf(err, errlen, "%s: out of memory", path);
    goto out;
  }
  snprintf(r->path, sizeof r->path, "%s", path);
  r->cap = BUF0;
  r->share = share;
  r->nshares = nshares;
  errno = 0;
  if (!(r->g = gzopen(path, "rb"))) {
    snprintf(err, errlen, "cannot open %s: %s", path,
             errno ? strerror(errno) : "out of memory");
    rc = errno == ENOENT ? CM_ENOENT : errno ? CM_EIO : CM_ENOMEM;
    goto out;
  }
  gzbuffer(r->g, 1u << 18);
  *out = r;
  r = NULL;
  rc = 0;
out:
  dw_criteo_close(r);
  return rc;
}

void dw_criteo_close(struct dw_criteo *r) {
  if (!r)
    return;
  if (r->g)
    gzclose(r->g);
  free(r->buf);
  free(r);
}

unsigned long long dw_criteo_lines(const struct dw_criteo *r) {
  return r->line;
}

/* Records the reader's error (printf-like message) and returns rc. */
static int fail(struct dw_criteo *r, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(struct dw_criteo *r, int rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->msg, sizeof r->msg, fmt, ap);
  va_end(ap);
  r->rc = rc;
  return rc;
}

/* zlib's message of r's read error, without the path it puts first
 * ("PATH: unexpected end of file"): the caller names the file once. */
static const char *gz_why(struct dw_criteo *r) {
  int zerr;
  const char *why = gzerror(r->g, &zerr);
  size_t n = strlen(r->path);
  if (zerr == Z_ERRNO)
    return strerror(errno);
  if (!strncmp(why, r->path, n) && !strncmp(why + n, ": ", 2))
    why += n + 2;
  return why;
}

/* The next line (without its `\n`) in *line, *n bytes; 1 when there is
 * one, 0 at the end, or a negative code. The line stays valid until the
 * next call. */
static int next_line(struct dw_criteo *r, char **line, size_t *n) {
  for (;;) {
    char *nl = memchr(r->buf + r->pos, '\n', r->len - r->pos);
    if (nl || (r->eof && r->pos < r->len)) {
      size_t end = nl ? (size_t)(nl - r->buf) : r->len;
      *line = r->buf + r->pos;
      *n = end - r->pos;
      r->pos = nl ? end + 1 : end;
      r->line++;
      return 1;
    }
    if (r->eof)
      return 0;
    memmove(r->buf, r->buf + r->pos, r->len - r->pos);
    r->len -= r->pos;
    r->pos = 0;
    if (r->len == r->cap) {
      char *b = realloc(r->buf, 2 * r->cap);
      if (!b)
        return fail(r, CM_ENOMEM,
                    "%s:%llu: out of memory (a line of %zu "
                    "bytes and more)",
                    r->path, r->line + 1, r->len);
      r->buf = b;
      r->cap *= 2;
    }
    size_t want = r->cap - r->len < READ_MAX ? r->cap - r->len : READ_MAX;
    int got = gzread(r->g, r->buf + r->len, (unsigned)want);
    if (got < 0)
      return fail(r, CM_EIO, "read %s: %s (after line %llu)", r->path,
                  gz_why(r), r->line);
    if (got == 0) {
      int zerr;
      gzerror(r->g, &zerr);
      if (zerr != Z_OK && zerr != Z_STREAM_END)
        return fail(r, CM_EIO, "read %s: %s (after line %llu)", r->path,
                    gz_why(r), r->line);
      r->eof = 1;
    }
    r->len += (size_t)got;
  }
}

/* Parses integer feature j's text s[0..n) into *x: 0 or 1 (present). */
static int parse_int(struct dw_criteo *r, int j, const char *s, size_t n,
                     float *x, uint8_t *present) {
  size_t i = s[0] == '-' && n > 1;
  long long v = 0;
  *x = 0;
  *present = n > 0;
  if (!n)
    return 0;
  if (n - i > 18)
    goto bad;
  for (; i < n; i++) {
    if (s[i] < '0' || s[i] > '9')
      goto bad;
    v = v * 10 + (s[i] - '0');
  }
  *x = (float)(s[0] == '-' ? -v : v);
  return 0;
bad:
  return fail(r, CM_EFORMAT,
              "%s:%llu: integer feature I%d is '%.*s', not a whole number "
              "(of at most 18 digits) or empty",
              r->path, r->line, j + 1, n < 40 ? (int)n : 40, s);
}

/* Parses one line s[0..n) into example k of the batch. */
static int parse_line(struct dw_criteo *r, char *s, size_t n,
                      const uint64_t *bounds, float *label, float *dense,
                      uint8_t *present, uint64_t *ids) {
  const char *f[DW_CRITEO_FIELDS + 1];
  size_t nf = 0, at = 0;
  uint8_t pres[DW_CRITEO_INTS];
  if (n && s[n - 1] == '\r')
    n--;
  /* The fields' starts; f[nf] one past the last field's end. */
  for (;;) {
    char *tab = memchr(s + at, '\t', n - at);
    if (nf < DW_CRITEO_FIELDS)
      f[nf] = s + at;
    nf++;
    if (!tab)
      break;
    at = (size_t)(tab - s) + 1;
  }
  if (nf == DW_CRITEO_FIELDS - 1)
    return fail(r, CM_EFORMAT,
                "%s:%llu: 39 tab-separated fields, want 40: an unlabelled "
                "line (Criteo Kaggle's test.txt has no labels); train and "
                "test on labelled lines, e.g. the last lines of train.txt "
                "as test.tsv (docs/ctr.md, \"Whose data\")",
                r->path, r->line);
  if (nf != DW_CRITEO_FIELDS)
    return fail(r, CM_EFORMAT,
                "%s:%llu: %zu tab-separated fields, want 40 (the label, 13 "
                "integer and 26 categorical features)",
                r->path, r->line, nf);
  f[DW_CRITEO_FIELDS] = s + n + 1;
  if (f[1] - f[0] != 2 || (s[0] != '0' && s[0] != '1'))
    return fail(r, CM_EFORMAT, "%s:%llu: the label is '%.*s', not 0 or 1",
                r->path, r->line,
                (int)(f[1] - f[0] - 1 < 40 ? f[1] - f[0] - 1 : 40), s);
  *label = (float)(s[0] - '0');
  for (int j = 0; j < DW_CRITEO_INTS; j++) {
    int rc = parse_int(r, j, f[1 + j], (size_t)(f[2 + j] - f[1 + j] - 1),
                       &dense[j], &pres[j]);
    if (rc)
      return rc;
  }
  if (present)
    memcpy(present, pres, sizeof pres);
  for (int c = 0; c < DW_CRITEO_CATS; c++) {
    const char *v = f[1 + DW_CRITEO_INTS + c];
    size_t len = (size_t)(f[2 + DW_CRITEO_INTS + c] - v - 1);
    uint64_t id = dw_criteo_id(c, v, len);
    ids[c] = bounds && bounds[c] ? id % bounds[c] : id;
  }
  return 0;
}

int dw_criteo_read(struct dw_criteo *r, size_t n, const uint64_t *bounds,
                   float *label, float *dense, uint8_t *present, uint64_t *ids,
                   size_t *got, char *err, size_t errlen) {
  size_t k = 0;
  int rc = r->rc;
  while (!rc && k < n) {
    char *s = NULL;
    size_t len = 0;
    rc = next_line(r, &s, &len);
    if (rc <= 0)
      break;
    rc = 0;
    if ((r->line - 1) % (unsigned long long)r->nshares !=
        (unsigned long long)r->share)
      continue;
    rc = parse_line(r, s, len, bounds, &label[k], &dense[k * DW_CRITEO_INTS],
                    present ? &present[k * DW_CRITEO_INTS] : NULL,
                    &ids[k * DW_CRITEO_CATS]);
    if (!rc)
      k++;
  }
  *got = rc ? 0 : k;
  if (rc)
    snprintf(err, errlen, "%s", r->msg);
  return rc;
}
