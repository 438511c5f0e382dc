/* Reading a shard's publications (pubfile.h): listing the versions of a
 * shard's directory, and reading one back with every byte verified: the
 * manifest's own CRC and fields (format, job, shard, version, the chain's
 * links), the dense file's size and each tensor's CRC, each table file's
 * size, header, CRC and order. Nothing is returned unless all of it holds;
 * the message names the file and what is wrong. The writer is
 * pubfile_write.c. */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "err.h"
#include "fileset.h" /* ckpt/: the manifest's CRC-32 */
#include "layout.h"
#include "pubfile.h"
#include "pubfile_internal.h"
#include "safetensors.h"

/* The version of a "pub-<10 digits>" name, or 0. */
static uint64_t name_version(const char *name) {
  if (strncmp(name, "pub-", 4) != 0 || strlen(name + 4) != 10 ||
      strspn(name + 4, "0123456789") != 10)
    return 0;
  return strtoull(name + 4, NULL, 10);
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

int psd_pub_list(const char *dir, uint64_t **out, size_t *n, char *err,
                 size_t errlen) {
  DIR *d = opendir(dir);
  struct dirent *e;
  uint64_t *v = NULL;
  size_t cap = 0, k = 0;
  int rc = 0;
  *out = NULL;
  *n = 0;
  if (!d) {
    snprintf(err, errlen, "cannot read %s: %s", dir, strerror(errno));
    return errno == ENOENT ? CM_ENOENT : CM_EIO;
  }
  while ((e = readdir(d))) {
    uint64_t ver = name_version(e->d_name);
    if (!ver)
      continue;
    if (k == cap) {
      size_t c = cap ? 2 * cap : 64;
      uint64_t *p = realloc(v, c * sizeof *v);
      if (!p) {
        rc = CM_ENOMEM;
        goto out;
      }
      v = p;
      cap = c;
    }
    v[k++] = ver;
  }
  if (k)
    qsort(v, k, sizeof *v, cmp_u64);
out:
  closedir(d);
  if (rc) {
    free(v);
    return rc;
  }
  *out = v ? v : malloc(1);
  *n = k;
  return *out ? 0 : CM_ENOMEM;
}

void psd_pub_free(struct psd_pub *p) {
  if (!p)
    return;
  for (int i = 0; p->dense && i < p->ndense; i++)
    free(p->dense[i].values);
  for (int i = 0; p->tables && i < p->ntables; i++) {
    free(p->tables[i].ids);
    free(p->tables[i].values);
    free(p->tables[i].removed);
  }
  free(p->dense);
  free(p->tables);
  free(p);
}

/* Reads path whole into a new buffer (*len bytes). */
static int slurp(const char *path, uint8_t **buf, size_t *len, char *err,
                 size_t errlen) {
  FILE *f = fopen(path, "rbe");
  long n;
  *buf = NULL;
  if (!f) {
    snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno));
    return errno == ENOENT ? CM_ENOENT : CM_EIO;
  }
  if (fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 ||
      fseek(f, 0, SEEK_SET) != 0) {
    snprintf(err, errlen, "cannot read %s: %s", path, strerror(errno));
    fclose(f);
    return CM_EIO;
  }
  if (!(*buf = malloc((size_t)n + 1))) {
    fclose(f);
    return CM_ENOMEM;
  }
  if (fread(*buf, 1, (size_t)n, f) != (size_t)n) {
    snprintf(err, errlen, "cannot read %s: %s", path, strerror(errno));
    free(*buf);
    *buf = NULL;
    fclose(f);
    return CM_EIO;
  }
  (*buf)[n] = 0;
  *len = (size_t)n;
  fclose(f);
  return 0;
}

/* m's member key as a non-negative integer, or -1 when absent or not
 * one. */
static long long get_int(json_t *m, const char *key) {
  json_t *v = json_object_get(m, key);
  return json_is_integer(v) && json_integer_value(v) >= 0
             ? (long long)json_integer_value(v)
             : -1;
}

/* A file name a manifest may name: no directory, nothing hidden. */
static int plain_name(const char *s) {
  return s && s[0] && s[0] != '.' && !strchr(s, '/') && strlen(s) < 64;
}

/* Reads and checks table entry e (number i) of the publication in pdir
 * into t. */
static int read_table(const char *pdir, json_t *e, int i, uint64_t version,
                      struct psd_pub_table *t, char *err, size_t errlen) {
  const char *name = json_string_value(json_object_get(e, "name"));
  const char *file = json_string_value(json_object_get(e, "file"));
  long long dim = get_int(e, "dim"), rows = get_int(e, "rows"),
            removed = get_int(e, "removed"), bytes = get_int(e, "bytes"),
            crc = get_int(e, "crc");
  char path[1400];
  uint8_t *buf = NULL;
  size_t len = 0;
  int rc = CM_EFORMAT;
  if (!name || strlen(name) > 200 || !plain_name(file) || dim < 1 ||
      dim > 65536 || rows < 0 || removed < 0 || bytes < 0 || crc < 0) {
    snprintf(err, errlen, "%s/%s: tables[%d] is malformed", pdir,
             PSD__PUB_MANIFEST, i);
    return CM_EFORMAT;
  }
  snprintf(path, sizeof path, "%s/%s", pdir, file);
  if ((rc = slurp(path, &buf, &len, err, errlen))) {
    rc = rc == CM_ENOMEM ? rc : CM_EFORMAT;
    goto out;
  }
  rc = CM_EFORMAT;
  size_t nl = strlen(name);
  if (rows > (long long)len / 8 || removed > (long long)len / 8) {
    snprintf(err, errlen,
             "%s: %zu bytes cannot hold %lld rows and %lld "
             "removed ids: truncated or damaged",
             path, len, rows, removed);
    goto out;
  }
  size_t need = PSD__PUB_FIXED + nl + (size_t)rows * (8 + 4 * (size_t)dim) +
                (size_t)removed * 8;
  if (len != need || (long long)len != bytes) {
    snprintf(err, errlen,
             "%s: %zu bytes; the manifest describes %lld (%lld rows of dim "
             "%lld, %lld removed): truncated or damaged",
             path, len, (long long)need, rows, dim, removed);
    goto out;
  }
  uint32_t want, got = cm_st_crc32(0, buf, len - 4);
  memcpy(&want, buf + len - 4, 4);
  if (got != want || (long long)want != crc) {
    snprintf(err, errlen,
             "%s: fails its checksum (CRC-32 %08x; the file says %08x, the "
             "manifest %08llx)",
             path, got, want, crc);
    goto out;
  }
  uint64_t h[PSD__PUB_NHEAD];
  memcpy(h, buf + 8, sizeof h);
  if (memcmp(buf, PSD__PUB_MAGIC, 8) || h[0] != (uint64_t)dim ||
      h[1] != (uint64_t)rows || h[2] != (uint64_t)removed || h[3] != version ||
      h[4] != nl || memcmp(buf + 8 + sizeof h, name, nl)) {
    snprintf(err, errlen,
             "%s: its header does not match the manifest (table '%s', dim "
             "%lld, version %llu)",
             path, name, dim, (unsigned long long)version);
    goto out;
  }
  snprintf(t->name, sizeof t->name, "%s", name);
  t->dim = (uint32_t)dim;
  t->nrows = (size_t)rows;
  t->nremoved = (size_t)removed;
  t->ids = malloc(t->nrows * 8 + 1);
  t->values = malloc(t->nrows * t->dim * 4 + 1);
  t->removed = malloc(t->nremoved * 8 + 1);
  if (!t->ids || !t->values || !t->removed) {
    rc = CM_ENOMEM;
    goto out;
  }
  const uint8_t *p = buf + 8 + sizeof h + nl;
  memcpy(t->ids, p, t->nrows * 8);
  p += t->nrows * 8;
  memcpy(t->values, p, t->nrows * t->dim * 4);
  p += t->nrows * t->dim * 4;
  memcpy(t->removed, p, t->nremoved * 8);
  for (size_t k = 1; k < t->nrows; k++)
    if (t->ids[k] <= t->ids[k - 1]) {
      snprintf(err, errlen, "%s: ids out of order at row %zu", path, k);
      goto out;
    }
  for (size_t k = 1; k < t->nremoved; k++)
    if (t->removed[k] <= t->removed[k - 1]) {
      snprintf(err, errlen, "%s: removed ids out of order at entry %zu", path,
               k);
      goto out;
    }
  rc = 0;
out:
  free(buf);
  return rc;
}

/* Reads and checks the dense file of the publication in pdir (manifest m)
 * into p->dense. */
static int read_dense(const char *pdir, json_t *m, struct psd_pub *p, char *err,
                      size_t errlen) {
  json_t *a = json_object_get(m, "dense");
  const char *file = json_string_value(json_object_get(m, "dense_file"));
  long long bytes = get_int(m, "dense_bytes");
  struct cm_st_file *f = NULL;
  char path[1400];
  int rc = CM_EFORMAT;
  if (!json_is_array(a) || !plain_name(file) || bytes < 0 ||
      json_array_size(a) > 1000000) {
    snprintf(err, errlen,
             "%s/%s: \"dense\", \"dense_file\" or "
             "\"dense_bytes\" is malformed",
             pdir, PSD__PUB_MANIFEST);
    return CM_EFORMAT;
  }
  p->ndense = (int)json_array_size(a);
  if (!(p->dense = calloc((size_t)p->ndense + 1, sizeof *p->dense)))
    return CM_ENOMEM;
  snprintf(path, sizeof path, "%s/%s", pdir, file);
  if ((rc = cm_st_open(&f, path, err, errlen))) {
    rc = rc == CM_ENOMEM ? rc : CM_EFORMAT;
    goto out;
  }
  rc = CM_EFORMAT;
  if ((long long)cm_st_size(f) != bytes || cm_st_count(f) != p->ndense) {
    snprintf(err, errlen,
             "%s: %llu bytes and %d tensors; the manifest says %lld and %d",
             path, (unsigned long long)cm_st_size(f), cm_st_count(f), bytes,
             p->ndense);
    goto out;
  }
  for (int i = 0; i < p->ndense; i++) {
    json_t *e = json_array_get(a, i), *shape = json_object_get(e, "shape");
    struct psd_pub_dense *d = &p->dense[i];
    const char *name = json_string_value(json_object_get(e, "name"));
    long long rb = get_int(e, "row_begin"), re = get_int(e, "row_end"),
              crc = get_int(e, "crc");
    const struct cm_st_tensor *t = name ? cm_st_find(f, name) : NULL;
    size_t nd = json_array_size(shape);
    if (!name || strlen(name) > 200 || nd < 1 || nd > 8 || rb < 0 || re < rb ||
        crc < 0) {
      snprintf(err, errlen, "%s/%s: dense[%d] is malformed", pdir,
               PSD__PUB_MANIFEST, i);
      goto out;
    }
    snprintf(d->name, sizeof d->name, "%s", name);
    d->ndim = (int)nd;
    d->row_begin = rb;
    d->row_end = re;
    uint64_t per_row = 1;
    for (size_t k = 0; k < nd; k++) {
      json_t *x = json_array_get(shape, k);
      d->shape[k] = json_is_integer(x) ? (int64_t)json_integer_value(x) : -1;
      if (d->shape[k] < 0 || d->shape[k] > (1ll << 40) ||
          (k && (uint64_t)d->shape[k] > (1ull << 40) / per_row)) {
        snprintf(err, errlen, "%s/%s: dense[%d] ('%s') has a bad shape", pdir,
                 PSD__PUB_MANIFEST, i, name);
        goto out;
      }
      if (k)
        per_row *= (uint64_t)d->shape[k];
    }
    uint64_t want = (uint64_t)(re - rb) * per_row * 4;
    if (!t || strcmp(t->dtype, "F32") || re > d->shape[0] ||
        t->end - t->begin != want || t->ndim != d->ndim ||
        (t->ndim && t->shape[0] != re - rb)) {
      snprintf(err, errlen,
               "%s: tensor '%s' is missing or not the manifest's (F32, rows "
               "%lld..%lld of its shape)",
               path, name, rb, re);
      goto out;
    }
    if (!(d->values = malloc(want + 1))) {
      rc = CM_ENOMEM;
      goto out;
    }
    if ((rc = cm_st_read(f, t, 0, d->values, want, err, errlen))) {
      rc = CM_EFORMAT;
      goto out;
    }
    uint32_t got = cm_st_crc32(0, d->values, want);
    if ((long long)got != crc) {
      snprintf(err, errlen,
               "%s: tensor '%s' fails its checksum (CRC-32 %08x; the "
               "manifest says %08llx)",
               path, name, got, crc);
      rc = CM_EFORMAT;
      goto out;
    }
  }
  rc = 0;
out:
  cm_st_close(f);
  return rc;
}

/* Checks manifest m of pdir against what the caller expects and fills p's
 * scalars. */
static int check_manifest(const char *mpath, json_t *m, uint64_t version,
                          const char *job, int shard, int shards,
                          struct psd_pub *p, char *err, size_t errlen) {
  uint32_t crc;
  long long want = get_int(m, PSD__PUB_CRC);
  const char *fmt = json_string_value(json_object_get(m, "format"));
  const char *mjob = json_string_value(json_object_get(m, "job"));
  json_t *full = json_object_get(m, "full");
  int rc = psd_fileset_manifest_crc(m, PSD__PUB_CRC, &crc);
  if (rc)
    return rc;
  if (want < 0 || (long long)crc != want) {
    snprintf(err, errlen, "%s: fails its checksum (CRC-32 %08x; it says %s)",
             mpath, crc, want < 0 ? "none" : "another");
    return CM_EFORMAT;
  }
  if (!fmt || strcmp(fmt, PSD_PUB_FORMAT)) {
    snprintf(err, errlen, "%s: format '%s', not " PSD_PUB_FORMAT, mpath,
             fmt ? fmt : "(none)");
    return CM_EFORMAT;
  }
  long long ms = get_int(m, "shard"), mss = get_int(m, "shards"),
            mv = get_int(m, "version"), base = get_int(m, "base"),
            prev = get_int(m, "prev"), step = get_int(m, "step"),
            t = get_int(m, "time_unix_ms");
  if (!mjob || strcmp(mjob, job) || ms != shard ||
      (shards > 0 ? mss != shards : mss < 1 || mss > CM_LAYOUT_MAX_SHARDS)) {
    snprintf(err, errlen,
             "%s: a publication of job '%s' shard %lld of %lld; expected "
             "job '%s' shard %d of %d",
             mpath, mjob ? mjob : "(none)", ms, mss, job, shard, shards);
    return CM_EFORMAT;
  }
  if (mv != (long long)version || !json_is_boolean(full) || base < 1 ||
      prev < 0 || step < 0 || t < 0) {
    snprintf(err, errlen,
             "%s: version %lld, base, prev, step, full or time_unix_ms "
             "malformed (expected version %llu)",
             mpath, mv, (unsigned long long)version);
    return CM_EFORMAT;
  }
  p->full = json_is_true(full);
  if (p->full ? (base != mv || prev != 0)
              : (prev != mv - 1 || base >= mv || base > prev)) {
    snprintf(err, errlen,
             "%s: a %s publication of version %lld with base %lld and prev "
             "%lld: not a chain's link",
             mpath, p->full ? "full" : "delta", mv, base, prev);
    return CM_EFORMAT;
  }
  p->version = version;
  p->base = (uint64_t)base;
  p->prev = (uint64_t)prev;
  p->step = (uint64_t)step;
  p->time_unix_ms = t;
  p->shard = shard;
  p->shards = (int)mss;
  /* Rows by "buckets" or "modulo"; none recorded: before buckets. */
  const char *rows = json_string_value(json_object_get(m, "rows"));
  p->rows = rows ? cm_layout_rule_parse(rows) : CM_LAYOUT_RULE_MODULO;
  if (!p->rows) {
    snprintf(err, errlen,
             "%s: \"rows\" is \"%.40s\"; this psd places rows by "
             "\"buckets\" or \"modulo\" (a newer psd's publication?)",
             mpath, rows);
    return CM_EFORMAT;
  }
  /* The layout and its live move; none recorded: layout 0, no move. */
  json_t *lay = json_object_get(m, "layout"), *mo = json_object_get(m, "move");
  long long to = mo ? get_int(mo, "to") : 0,
            moved = mo ? get_int(mo, "moved") : 0;
  if ((lay && (!json_is_integer(lay) || json_integer_value(lay) < 0)) ||
      (mo && (to < 1 || to > CM_LAYOUT_MAX_SHARDS || moved < 0 ||
              moved > CM_LAYOUT_BUCKETS))) {
    snprintf(err, errlen,
             "%s: \"layout\" or \"move\" malformed (a layout's version; "
             "{\"to\": shards, \"moved\": bucket moves})",
             mpath);
    return CM_EFORMAT;
  }
  p->layout = lay ? (uint64_t)json_integer_value(lay) : 0;
  p->move_to = (int)to;
  p->moved = (int)moved;
  snprintf(p->job, sizeof p->job, "%s", mjob);
  return 0;
}

int psd_pub_read(const char *dir, uint64_t version, const char *job, int shard,
                 int shards, struct psd_pub **out, char *err, size_t errlen) {
  char pdir[1200], mpath[1300];
  uint8_t *text = NULL;
  size_t len;
  json_t *m = NULL, *tables;
  json_error_t je;
  struct psd_pub *p = NULL;
  int rc;
  *out = NULL;
  snprintf(pdir, sizeof pdir, "%s/pub-%010llu", dir,
           (unsigned long long)version);
  snprintf(mpath, sizeof mpath, "%s/%s", pdir, PSD__PUB_MANIFEST);
  if ((rc = slurp(mpath, &text, &len, err, errlen)))
    return rc == CM_EIO ? CM_EFORMAT : rc;
  rc = CM_EFORMAT;
  if (!(m = json_loadb((const char *)text, len, 0, &je)) ||
      !json_is_object(m)) {
    snprintf(err, errlen, "%s: not a JSON object (truncated?): %s", mpath,
             m ? "another value" : je.text);
    goto out;
  }
  if (!(p = calloc(1, sizeof *p))) {
    rc = CM_ENOMEM;
    goto out;
  }
  if ((rc = check_manifest(mpath, m, version, job, shard, shards, p, err,
                           errlen)) ||
      (rc = read_dense(pdir, m, p, err, errlen)))
    goto out;
  rc = CM_EFORMAT;
  tables = json_object_get(m, "tables");
  if (!json_is_array(tables) || json_array_size(tables) > 4096) {
    snprintf(err, errlen, "%s: \"tables\" is malformed", mpath);
    goto out;
  }
  p->ntables = (int)json_array_size(tables);
  if (!(p->tables = calloc((size_t)p->ntables + 1, sizeof *p->tables))) {
    rc = CM_ENOMEM;
    goto out;
  }
  for (int i = 0; i < p->ntables; i++)
    if ((rc = read_table(pdir, json_array_get(tables, i), i, version,
                         &p->tables[i], err, errlen)))
      goto out;
  for (int i = 0; p->full && i < p->ntables; i++)
    if (p->tables[i].nremoved) {
      snprintf(err, errlen,
               "%s: a full publication with removed ids (table "
               "'%s')",
               mpath, p->tables[i].name);
      rc = CM_EFORMAT;
      goto out;
    }
  *out = p;
  p = NULL;
  rc = 0;
out:
  psd_pub_free(p);
  json_decref(m);
  free(text);
  return rc;
}
