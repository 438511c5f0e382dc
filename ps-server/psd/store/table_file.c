/* A table snapshot's file (table.h, psd_table_snap_write/read):
 *   "PSDTAB1\n"                          magic, 8 bytes
 *   u64 x 9: dim, nstate, optimizer type, delta, gen, base_gen, nrows,
 *            nevicted, name length        little-endian
 *   name bytes
 *   ids (u64 x nrows), stats (u32 count, u32 t, u64 last_step per row),
 *   values (f32 x nrows x dim), state (f32 x nrows x nstate),
 *   evicted ids (u64 x nevicted)
 *   u32 CRC-32 (zlib) of everything before it
 * Written through a buffered stream and fsynced; read whole, CRC first. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "err.h"
#include "table.h"

#define MAGIC "PSDTAB1\n"
#define NHEAD 9

/* Writes n bytes, folding them into *crc. */
static int put(FILE *f, const void *p, size_t n, uLong *crc) {
  if (!n)
    return 0;
  *crc = crc32(*crc, p, (uInt)n);
  return fwrite(p, 1, n, f) == n ? 0 : CM_EIO;
}

int psd_table_snap_write(const struct psd_table_snap *s,
                         const struct cm_table_conf *conf, const char *path,
                         char *err, size_t errlen) {
  FILE *f = fopen(path, "wbe");
  uLong crc = crc32(0L, Z_NULL, 0);
  uint64_t head[NHEAD] = {s->dim,
                          s->nstate,
                          (uint64_t)conf->opt.type,
                          (uint64_t)s->delta,
                          s->gen,
                          s->base_gen,
                          s->nrows,
                          s->nevicted,
                          strlen(conf->name)};
  int rc = 0;
  if (!f) {
    snprintf(err, errlen, "cannot create %s: %s", path, strerror(errno));
    return CM_EIO;
  }
  rc |= put(f, MAGIC, 8, &crc);
  rc |= put(f, head, sizeof head, &crc);
  rc |= put(f, conf->name, head[8], &crc);
  rc |= put(f, s->ids, s->nrows * sizeof *s->ids, &crc);
  rc |= put(f, s->stats, s->nrows * sizeof *s->stats, &crc);
  rc |= put(f, s->values, s->nrows * s->dim * sizeof(float), &crc);
  rc |= put(f, s->state, s->nrows * s->nstate * sizeof(float), &crc);
  rc |= put(f, s->evicted, s->nevicted * sizeof *s->evicted, &crc);
  uint32_t c32 = (uint32_t)crc;
  if (!rc && fwrite(&c32, 4, 1, f) != 1)
    rc = CM_EIO;
  if (!rc && (fflush(f) != 0 || fsync(fileno(f)) != 0))
    rc = CM_EIO;
  if (fclose(f) != 0)
    rc = CM_EIO;
  if (rc) {
    snprintf(err, errlen, "write %s: %s", path, strerror(errno));
    unlink(path);
  }
  return rc ? CM_EIO : 0;
}

int psd_table_snap_read(const char *path, const struct cm_table_conf *conf,
                        struct psd_table_snap **out, char *err, size_t errlen) {
  FILE *f = fopen(path, "rbe");
  struct psd_table_snap *s = NULL;
  uint8_t *buf = NULL;
  long len;
  int rc = CM_EFORMAT;
  *out = NULL;
  if (!f) {
    snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno));
    return errno == ENOENT ? CM_ENOENT : CM_EIO;
  }
  if (fseek(f, 0, SEEK_END) != 0 || (len = ftell(f)) < 0 ||
      fseek(f, 0, SEEK_SET) != 0) {
    snprintf(err, errlen, "cannot read %s: %s", path, strerror(errno));
    fclose(f);
    return CM_EIO;
  }
  if (!(buf = malloc((size_t)len + 1))) {
    fclose(f);
    return CM_ENOMEM;
  }
  if (fread(buf, 1, (size_t)len, f) != (size_t)len) {
    snprintf(err, errlen, "cannot read %s: %s", path, strerror(errno));
    rc = CM_EIO;
    goto out;
  }
  size_t fixed = 8 + NHEAD * 8 + 4;
  if ((size_t)len < fixed || memcmp(buf, MAGIC, 8)) {
    snprintf(err, errlen, "%s: not a psd table snapshot", path);
    goto out;
  }
  uint32_t want;
  memcpy(&want, buf + len - 4, 4);
  if ((uint32_t)crc32(crc32(0L, Z_NULL, 0), buf, (uInt)(len - 4)) != want) {
    snprintf(err, errlen, "%s: fails its checksum (damaged or truncated)",
             path);
    goto out;
  }
  uint64_t h[NHEAD];
  memcpy(h, buf + 8, sizeof h);
  uint64_t dim = h[0], ns = h[1], nrows = h[6], nev = h[7], nl = h[8];
  size_t need = fixed + nl;
  if (dim < 1 || dim > CM_TABLE_MAX_DIM || ns > 2 * dim || nl > 200 ||
      nrows > (uint64_t)len || nev > (uint64_t)len) {
    snprintf(err, errlen, "%s: a malformed header", path);
    goto out;
  }
  need += nrows * (8 + sizeof(struct psd_row_stats) + (dim + ns) * 4) + nev * 8;
  if (need != (size_t)len) {
    snprintf(err, errlen, "%s: %ld bytes; its header describes %zu", path, len,
             need);
    goto out;
  }
  const char *name = (const char *)buf + 8 + NHEAD * 8;
  if (nl != strlen(conf->name) || memcmp(name, conf->name, nl) ||
      dim != conf->dim || h[2] != (uint64_t)conf->opt.type) {
    snprintf(err, errlen,
             "%s: a snapshot of table '%.*s' (dim %llu, optimizer %s); "
             "expected '%s' (dim %u, optimizer %s)",
             path, (int)nl, name, (unsigned long long)dim,
             cm_rowopt_name((enum cm_rowopt_type)h[2]), conf->name, conf->dim,
             cm_rowopt_name(conf->opt.type));
    goto out;
  }
  if (!(s = calloc(1, sizeof *s)))
    goto nomem;
  s->dim = (uint32_t)dim;
  s->nstate = (uint32_t)ns;
  s->delta = h[3] != 0;
  s->gen = h[4];
  s->base_gen = h[5];
  s->nrows = nrows;
  s->nevicted = nev;
  s->ids = malloc(nrows * 8 + 1);
  s->stats = malloc(nrows * sizeof *s->stats + 1);
  s->values = malloc(nrows * dim * 4 + 1);
  s->state = malloc(nrows * ns * 4 + 1);
  s->evicted = malloc(nev * 8 + 1);
  if (!s->ids || !s->stats || !s->values || !s->state || !s->evicted)
    goto nomem;
  const uint8_t *p = buf + 8 + NHEAD * 8 + nl;
  memcpy(s->ids, p, nrows * 8);
  p += nrows * 8;
  memcpy(s->stats, p, nrows * sizeof *s->stats);
  p += nrows * sizeof *s->stats;
  memcpy(s->values, p, nrows * dim * 4);
  p += nrows * dim * 4;
  memcpy(s->state, p, nrows * ns * 4);
  p += nrows * ns * 4;
  memcpy(s->evicted, p, nev * 8);
  *out = s;
  s = NULL;
  rc = 0;
  goto out;
nomem:
  rc = CM_ENOMEM;
out:
  psd_table_snap_free(s);
  free(buf);
  fclose(f);
  return rc;
}
