/* Writing a shard's publications (pubfile.h): the dense file, one file per
 * table, the manifest, all in a temporary directory renamed into place
 * whole; the shard's directory made and cleaned of what a crash left;
 * pruning to the newest full chains. The reader is pubfile.c. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt.h" /* psd_ckpt_sync_dir, psd_ckpt_remove_tree */
#include "err.h"
#include "log.h"
#include "pubfile.h"
#include "pubfile_internal.h"
#include "safetensors.h"

void psd_pub_dir(const char *root, const char *job, int shard, char *buf,
                 size_t len) {
  snprintf(buf, len, "%s/%s/ps-%d", root, job, shard);
}

int psd_pub_prepare(const char *dir, char *err, size_t errlen) {
  char p[1024];
  size_t n = strlen(dir);
  DIR *d;
  struct dirent *e;
  if (n >= sizeof p) {
    snprintf(err, errlen, "%s: path too long", dir);
    return CM_EIO;
  }
  memcpy(p, dir, n + 1);
  for (size_t i = 1; i <= n; i++) {
    if (p[i] != '/' && p[i] != 0)
      continue;
    char c = p[i];
    struct stat st;
    p[i] = 0;
    if ((mkdir(p, 0755) != 0 && errno != EEXIST) || stat(p, &st) != 0 ||
        !S_ISDIR(st.st_mode)) {
      snprintf(err, errlen, "cannot use %s as a directory: %s", p,
               errno == EEXIST ? "it is not a directory" : strerror(errno));
      return CM_EIO;
    }
    p[i] = c;
  }
  if (!(d = opendir(dir))) {
    snprintf(err, errlen, "cannot read %s: %s", dir, strerror(errno));
    return CM_EIO;
  }
  while ((e = readdir(d))) {
    if (strncmp(e->d_name, ".tmp-", 5) != 0)
      continue;
    char t[1400];
    snprintf(t, sizeof t, "%s/%s", dir, e->d_name);
    cm_warn("removing %s: an unfinished publication (psd stopped while "
            "writing it)",
            t);
    psd_ckpt_remove_tree(t);
  }
  closedir(d);
  return 0;
}

/* Writes n bytes at p to fd. */
static int put(int fd, const void *p, size_t n) {
  const char *b = p;
  while (n) {
    ssize_t k = write(fd, b, n);
    if (k < 0 && errno == EINTR)
      continue;
    if (k <= 0)
      return CM_EIO;
    b += k;
    n -= (size_t)k;
  }
  return 0;
}

/* Creates path (truncated) for writing into *fd. */
static int create(const char *path, int *fd, char *err, size_t errlen) {
  if ((*fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) < 0) {
    snprintf(err, errlen, "cannot create %s: %s", path, strerror(errno));
    return CM_EIO;
  }
  return 0;
}

/* Ends a file's write: fsyncs it (when rc, the writes' outcome, is 0) and
 * closes fd. Returns rc, or CM_EIO with err naming path. */
static int finish(const char *path, int fd, int rc, char *err, size_t errlen) {
  if (!rc && fsync(fd) != 0)
    rc = CM_EIO;
  if (close(fd) != 0 && !rc)
    rc = CM_EIO;
  if (rc == CM_EIO && !err[0])
    snprintf(err, errlen, "write %s: %s", path, strerror(errno));
  return rc;
}

/* Table t as table-<i>.bin of tmp; its size and CRC. */
static int write_table(const char *tmp, int i, uint64_t version,
                       const struct psd_pub_table *t, uint64_t *size,
                       uint32_t *crc, char *err, size_t errlen) {
  char path[1300];
  uint64_t h[PSD__PUB_NHEAD] = {t->dim, t->nrows, t->nremoved, version,
                                strlen(t->name)};
  const void *part[5] = {PSD__PUB_MAGIC, h, t->name, t->ids, t->values};
  size_t len[5] = {8, sizeof h, strlen(t->name), t->nrows * 8,
                   t->nrows * t->dim * 4};
  int fd, rc;
  snprintf(path, sizeof path, "%s/table-%d.bin", tmp, i);
  if ((rc = create(path, &fd, err, errlen)))
    return rc;
  *crc = 0;
  *size = 4;
  for (int k = 0; k < 5 && !rc; k++) {
    *crc = cm_st_crc32(*crc, part[k], len[k]);
    *size += len[k];
    rc = len[k] ? put(fd, part[k], len[k]) : 0;
  }
  if (!rc && t->nremoved) {
    *crc = cm_st_crc32(*crc, t->removed, t->nremoved * 8);
    *size += t->nremoved * 8;
    rc = put(fd, t->removed, t->nremoved * 8);
  }
  if (!rc)
    rc = put(fd, crc, 4);
  return finish(path, fd, rc, err, errlen);
}

/* The dense file of tmp; its size, each tensor's CRC in crcs. */
static int write_dense(const char *tmp, const struct psd_pub *p, uint64_t *size,
                       uint32_t *crcs, char *err, size_t errlen) {
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
  snprintf(path, sizeof path, "%s/%s", tmp, PSD__PUB_DENSE);
  struct cm_st_meta meta[] = {{"format", PSD_PUB_FORMAT}};
  if ((rc = create(path, &fd, err, errlen)) ||
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
  rc = finish(path, fd, rc, err, errlen);
  fd = -1;
out:
  if (fd >= 0)
    close(fd);
  cm_st_writer_free(w);
  free(desc);
  free(shapes);
  return rc;
}

static json_t *json_shape(int ndim, const int64_t *shape) {
  json_t *a = json_array();
  for (int i = 0; a && i < ndim; i++)
    json_array_append_new(a, json_integer(shape[i]));
  return a;
}

/* The manifest of p, with the files' sizes and CRCs. */
static json_t *manifest(const struct psd_pub *p, const char *mode,
                        uint64_t dense_bytes, const uint32_t *dcrc,
                        const uint64_t *tbytes, const uint32_t *tcrc) {
  json_t *dense = json_array(), *tables = json_array(), *m;
  char file[32];
  for (int i = 0; dense && i < p->ndense; i++) {
    const struct psd_pub_dense *d = &p->dense[i];
    json_array_append_new(
        dense, json_pack("{s:s, s:o, s:I, s:I, s:I}", "name", d->name, "shape",
                         json_shape(d->ndim, d->shape), "row_begin",
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
  m = json_pack("{s:s, s:s, s:i, s:i, s:I, s:b, s:I, s:I, s:I, s:s, s:I, "
                "s:s, s:I, s:o, s:o}",
                "format", PSD_PUB_FORMAT, "job", p->job, "shard", p->shard,
                "shards", p->shards, "version", (json_int_t)p->version, "full",
                p->full, "base", (json_int_t)p->base, "prev",
                (json_int_t)p->prev, "step", (json_int_t)p->step, "mode", mode,
                "time_unix_ms", (json_int_t)p->time_unix_ms, "dense_file",
                PSD__PUB_DENSE, "dense_bytes", (json_int_t)dense_bytes, "dense",
                dense, "tables", tables);
  uint32_t crc;
  if (m && (psd__pub_manifest_crc(m, &crc) ||
            json_object_set_new(m, "crc", json_integer(crc)))) {
    json_decref(m);
    return NULL;
  }
  return m;
}

int psd_pub_write(const char *dir, const struct psd_pub *p, const char *mode,
                  uint64_t *bytes, char *err, size_t errlen) {
  char tmp[1200], final[1200], path[1300];
  uint32_t *dcrc = calloc((size_t)p->ndense + 1, sizeof *dcrc);
  uint32_t *tcrc = calloc((size_t)p->ntables + 1, sizeof *tcrc);
  uint64_t *tbytes = calloc((size_t)p->ntables + 1, sizeof *tbytes);
  uint64_t total = 0, dense_bytes = 0;
  json_t *m = NULL;
  char *text = NULL;
  struct stat st;
  int rc = 0, made = 0, fd;
  err[0] = 0;
  snprintf(tmp, sizeof tmp, "%s/.tmp-%llu-%d", dir,
           (unsigned long long)p->version, (int)getpid());
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
  if (mkdir(tmp, 0755) != 0) {
    snprintf(err, errlen, "cannot create %s: %s", tmp, strerror(errno));
    rc = CM_EIO;
    goto out;
  }
  made = 1;
  if ((rc = write_dense(tmp, p, &dense_bytes, dcrc, err, errlen)))
    goto out;
  total += dense_bytes;
  for (int i = 0; i < p->ntables; i++) {
    if ((rc = write_table(tmp, i, p->version, &p->tables[i], &tbytes[i],
                          &tcrc[i], err, errlen)))
      goto out;
    total += tbytes[i];
  }
  if (!(m = manifest(p, mode, dense_bytes, dcrc, tbytes, tcrc)) ||
      !(text = json_dumps(m, JSON_INDENT(1) | JSON_PRESERVE_ORDER))) {
    rc = CM_ENOMEM;
    goto out;
  }
  snprintf(path, sizeof path, "%s/%s", tmp, PSD__PUB_MANIFEST);
  if ((rc = create(path, &fd, err, errlen)))
    goto out;
  rc = finish(path, fd, put(fd, text, strlen(text)), err, errlen);
  if (rc)
    goto out;
  total += strlen(text);
  if (psd_ckpt_sync_dir(tmp) || rename(tmp, final) != 0) {
    snprintf(err, errlen, "cannot rename %s to %s: %s", tmp, final,
             strerror(errno));
    rc = CM_EIO;
    goto out;
  }
  made = 0;
  if (psd_ckpt_sync_dir(dir)) {
    snprintf(err, errlen, "fsync %s: %s", dir, strerror(errno));
    rc = CM_EIO;
    goto out;
  }
  if (bytes)
    *bytes = total;
out:
  if (made)
    psd_ckpt_remove_tree(tmp);
  free(text);
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
    psd_ckpt_remove_tree(p);
    removed++;
  }
  if (removed)
    psd_ckpt_sync_dir(dir);
  free(v);
  return removed;
}
