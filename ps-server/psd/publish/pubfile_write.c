/* Writing a shard's publications (pubfile.h): the dense file, one file per
 * table, the manifest, as one file set (ckpt/'s fileset.h: a temporary
 * directory renamed into place whole); the shard's directory made and
 * cleaned of what a crash left; pruning to the newest full chains. The
 * reader is pubfile.c. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "err.h"
#include "fileset.h" /* ckpt/: a directory written whole */
#include "layout.h"
#include "log.h"
#include "pubfile.h"
#include "pubfile_internal.h"
#include "safetensors.h"

void psd_pub_dir(const char *root, const char *job, int shard, char *buf,
                 size_t len) {
  snprintf(buf, len, "%s/%s/ps-%d", root, job, shard);
}

int psd_pub_prepare(const char *dir, char *err, size_t errlen) {
  return psd_fileset_prepare(dir, "publication", err, errlen);
}

/* Table t as table-<i>.bin of the set f; its size and CRC. */
static int write_table(struct psd_fileset *f, int i, uint64_t version,
                       const struct psd_pub_table *t, uint64_t *size,
                       uint32_t *crc, char *err, size_t errlen) {
  char file[32], path[1300];
  uint64_t h[PSD__PUB_NHEAD] = {t->dim, t->nrows, t->nremoved, version,
                                strlen(t->name)};
  const void *part[6] = {PSD__PUB_MAGIC, h,         t->name,
                         t->ids,         t->values, t->removed};
  size_t len[6] = {8,
                   sizeof h,
                   strlen(t->name),
                   t->nrows * 8,
                   t->nrows * t->dim * 4,
                   t->nremoved * 8};
  int fd, rc;
  snprintf(file, sizeof file, "table-%d.bin", i);
  if ((rc = psd_fileset_create(f, file, &fd, path, sizeof path, err, errlen)))
    return rc;
  *crc = 0;
  *size = 4;
  for (int k = 0; k < 6 && !rc; k++) {
    if (!len[k])
      continue;
    *crc = cm_st_crc32(*crc, part[k], len[k]);
    *size += len[k];
    rc = psd_fileset_put(fd, part[k], len[k], path, err, errlen);
  }
  if (!rc)
    rc = psd_fileset_put(fd, crc, 4, path, err, errlen);
  return psd_fileset_close(f, path, fd, rc, err, errlen);
}

/* The dense file of the set f; its size, each tensor's CRC in crcs. */
static int write_dense(struct psd_fileset *f, const struct psd_pub *p,
                       uint64_t *size, uint32_t *crcs, char *err,
                       size_t errlen) {
  char path[1300];
  struct cm_st_desc *desc = calloc((size_t)p->ndense + 1, sizeof *desc);
  int64_t(*shapes)[8] = calloc((size_t)p->ndense + 1, sizeof *shapes);
  struct cm_st_writer *w = NULL;
  int fd = -1, rc = 0;
  if (!desc || !shapes) {
    rc = CM_ENOMEM;
    goto out;
  }
  for (int i = 0; i < p->ndense; i++) {
    const struct psd_pub_dense *d = &p->dense[i];
    memcpy(shapes[i], d->shape, sizeof shapes[i]);
    shapes[i][0] = d->row_end - d->row_begin;
    desc[i] = (struct cm_st_desc){d->name, d->ndim, shapes[i], "F32"};
  }
  struct cm_st_meta meta[] = {{"format", PSD_PUB_FORMAT}};
  if ((rc = psd_fileset_create(f, PSD__PUB_DENSE, &fd, path, sizeof path, err,
                               errlen)) ||
      (rc = cm_st_writer_new(&w, fd, path, desc, p->ndense, meta, 1, err,
                             errlen)))
    goto out;
  for (int i = 0; i < p->ndense && !rc; i++) {
    uint64_t n = (uint64_t)(p->dense[i].row_end - p->dense[i].row_begin) * 4;
    for (int k = 1; k < p->dense[i].ndim; k++)
      n *= (uint64_t)p->dense[i].shape[k];
    rc = cm_st_writer_write(w, p->dense[i].values, n, err, errlen);
  }
  if (!rc)
    rc = cm_st_writer_finish(w, err, errlen);
  for (int i = 0; !rc && i < p->ndense; i++)
    crcs[i] = cm_st_writer_crc(w, i);
  if (!rc)
    *size = cm_st_writer_size(w);
out:
  if (fd >= 0)
    rc = psd_fileset_close(f, path, fd, rc, err, errlen);
  cm_st_writer_free(w);
  free(desc);
  free(shapes);
  return rc;
}

/* The manifest of p, with the files' sizes and CRCs; its own CRC is set
 * as it is written (psd_fileset_write_manifest). */
static json_t *manifest(const struct psd_pub *p, const char *mode,
                        uint64_t dense_bytes, const uint32_t *dcrc,
                        const uint64_t *tbytes, const uint32_t *tcrc) {
  json_t *dense = json_array(), *tables = json_array();
  char file[32];
  for (int i = 0; dense && i < p->ndense; i++) {
    const struct psd_pub_dense *d = &p->dense[i];
    json_array_append_new(
        dense, json_pack("{s:s, s:o, s:I, s:I, s:I}", "name", d->name, "shape",
                         psd_fileset_json_shape(d->ndim, d->shape), "row_begin",
                         (json_int_t)d->row_begin, "row_end",
                         (json_int_t)d->row_end, "crc", (json_int_t)dcrc[i]));
  }
  for (int i = 0; tables && i < p->ntables; i++) {
    const struct psd_pub_table *t = &p->tables[i];
    snprintf(file, sizeof file, "table-%d.bin", i);
    json_array_append_new(
        tables,
        json_pack("{s:s, s:I, s:s, s:I, s:I, s:I, s:I}", "name", t->name, "dim",
                  (json_int_t)t->dim, "file", file, "rows",
                  (json_int_t)t->nrows, "removed", (json_int_t)t->nremoved,
                  "bytes", (json_int_t)tbytes[i], "crc", (json_int_t)tcrc[i]));
  }
  if (!dense || !tables || json_array_size(dense) != (size_t)p->ndense ||
      json_array_size(tables) != (size_t)p->ntables) {
    json_decref(dense);
    json_decref(tables);
    return NULL;
  }
  json_t *m = json_pack(
      "{s:s, s:s, s:i, s:i, s:I, s:b, s:I, s:I, s:I, s:s, s:I, s:s, s:I, s:o, "
      "s:o}",
      "format", PSD_PUB_FORMAT, "job", p->job, "shard", p->shard, "shards",
      p->shards, "version", (json_int_t)p->version, "full", p->full, "base",
      (json_int_t)p->base, "prev", (json_int_t)p->prev, "step",
      (json_int_t)p->step, "mode", mode, "time_unix_ms",
      (json_int_t)p->time_unix_ms, "dense_file", PSD__PUB_DENSE, "dense_bytes",
      (json_int_t)dense_bytes, "dense", dense, "tables", tables);
  /* How the layout places rows; a manifest without it is modulo's. The
   * layout's version and live move, where there is one (docs/serving.md). */
  if (m &&
      (json_object_set_new(m, "rows",
                           json_string(cm_layout_rule_name(p->rows))) ||
       json_object_set_new(m, "layout", json_integer((json_int_t)p->layout)) ||
       (p->move_to > 0 &&
        json_object_set_new(
            m, "move",
            json_pack("{s:i, s:i}", "to", p->move_to, "moved", p->moved))))) {
    json_decref(m);
    return NULL;
  }
  return m;
}

int psd_pub_write(const char *dir, const struct psd_pub *p, const char *mode,
                  uint64_t *bytes, char *err, size_t errlen) {
  char final[1200];
  uint32_t *dcrc = calloc((size_t)p->ndense + 1, sizeof *dcrc);
  uint32_t *tcrc = calloc((size_t)p->ntables + 1, sizeof *tcrc);
  uint64_t *tbytes = calloc((size_t)p->ntables + 1, sizeof *tbytes);
  uint64_t dense_bytes = 0;
  struct psd_fileset f = {0};
  json_t *m = NULL;
  struct stat st;
  int rc = 0;
  err[0] = 0;
  snprintf(final, sizeof final, "%s/pub-%010llu", dir,
           (unsigned long long)p->version);
  if (!dcrc || !tcrc || !tbytes) {
    rc = CM_ENOMEM;
    goto out;
  }
  if (p->full ? (p->base != p->version || p->prev)
              : (p->prev + 1 != p->version || p->base > p->prev || !p->base)) {
    snprintf(err, errlen,
             "publication %llu: base %llu and prev %llu are not "
             "a chain's link",
             (unsigned long long)p->version, (unsigned long long)p->base,
             (unsigned long long)p->prev);
    rc = CM_EINVAL;
    goto out;
  }
  if (stat(final, &st) == 0) {
    snprintf(err, errlen, "%s exists already: a version is never reused",
             final);
    rc = CM_EEXIST;
    goto out;
  }
  if ((rc = psd_fileset_begin(&f, final, p->version, err, errlen)) ||
      (rc = write_dense(&f, p, &dense_bytes, dcrc, err, errlen)))
    goto out;
  for (int i = 0; i < p->ntables; i++)
    if ((rc = write_table(&f, i, p->version, &p->tables[i], &tbytes[i],
                          &tcrc[i], err, errlen)))
      goto out;
  if (!(m = manifest(p, mode, dense_bytes, dcrc, tbytes, tcrc))) {
    rc = CM_ENOMEM;
    goto out;
  }
  if ((rc = psd_fileset_write_manifest(&f, PSD__PUB_MANIFEST, m, PSD__PUB_CRC,
                                       err, errlen)) ||
      (rc = psd_fileset_commit(&f, 0, err, errlen)))
    goto out;
  if (bytes)
    *bytes = f.bytes;
out:
  psd_fileset_end(&f);
  json_decref(m);
  free(dcrc);
  free(tcrc);
  free(tbytes);
  return rc;
}

int psd_pub_prune(const char *dir, int keep) {
  uint64_t *v = NULL;
  size_t n = 0;
  char e[256], p[1300];
  int fulls = 0, removed = 0;
  if (keep < 1 || psd_pub_list(dir, &v, &n, e, sizeof e))
    return 0;
  size_t cut = 0; /* versions below v[cut] go */
  for (size_t i = n; i-- > 0 && !cut;) {
    snprintf(p, sizeof p, "%s/pub-%010llu/%s", dir, (unsigned long long)v[i],
             PSD__PUB_MANIFEST);
    json_t *m = json_load_file(p, 0, NULL);
    if (json_is_true(json_object_get(m, "full")) && ++fulls == keep)
      cut = i;
    json_decref(m);
  }
  for (size_t i = 0; i < cut; i++) {
    snprintf(p, sizeof p, "%s/pub-%010llu", dir, (unsigned long long)v[i]);
    psd_fileset_remove_tree(p);
    removed++;
  }
  if (removed)
    psd_fileset_sync_dir(dir);
  free(v);
  return removed;
}
