/* A directory of files written whole (fileset.h): the one writer of
 * checkpoints' and publications' directories, from making the temporary
 * directory to the fsync of its parent after the rename, and the file
 * system helpers around it (mkdir -p and a crash's leftovers, a
 * directory's fsync, removing a tree). */
#include "fileset.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "err.h"
#include "log.h"
#include "safetensors.h"

/* Creates path and its missing parents (mkdir -p). */
static int mkdirs(const char *path, char *err, size_t errlen) {
  char p[1024];
  size_t n = strlen(path);
  if (n >= sizeof p) {
    snprintf(err, errlen, "%s: path too long", path);
    return CM_EINVAL;
  }
  memcpy(p, path, n + 1);
  for (size_t i = 1; i <= n; i++) {
    if (p[i] != '/' && p[i] != 0)
      continue;
    char c = p[i];
    p[i] = 0;
    if (mkdir(p, 0755) != 0 && errno != EEXIST) {
      snprintf(err, errlen, "cannot create %s: %s", p, strerror(errno));
      return CM_EIO;
    }
    struct stat st;
    if (stat(p, &st) != 0 || !S_ISDIR(st.st_mode)) {
      snprintf(err, errlen, "cannot use %s as a directory: %s", p,
               stat(p, &st) != 0 ? strerror(errno) : "it is not a directory");
      return CM_EIO;
    }
    p[i] = c;
  }
  return 0;
}

int psd_fileset_prepare(const char *dir, const char *what, char *err,
                        size_t errlen) {
  DIR *d;
  struct dirent *e;
  int rc;
  if ((rc = mkdirs(dir, err, errlen)))
    return rc;
  /* A crash mid-write leaves a .tmp-* directory: never a whole set. */
  if (!(d = opendir(dir))) {
    snprintf(err, errlen, "cannot read %s: %s", dir, strerror(errno));
    return CM_EIO;
  }
  while ((e = readdir(d))) {
    if (strncmp(e->d_name, ".tmp-", 5) != 0)
      continue;
    char p[1400];
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    cm_warn("removing %s: an unfinished %s (psd stopped while writing it)", p,
            what);
    psd_fileset_remove_tree(p);
  }
  closedir(d);
  return 0;
}

int psd_fileset_begin(struct psd_fileset *f, const char *final, uint64_t id,
                      char *err, size_t errlen) {
  const char *slash = strrchr(final, '/');
  size_t n = slash ? (size_t)(slash - final) : 0;
  memset(f, 0, sizeof *f);
  if (!slash || n >= sizeof f->dir ||
      (size_t)snprintf(f->final, sizeof f->final, "%s", final) >=
          sizeof f->final ||
      (size_t)snprintf(f->tmp, sizeof f->tmp, "%.*s/.tmp-%llu-%d", (int)n,
                       final, (unsigned long long)id,
                       (int)getpid()) >= sizeof f->tmp) {
    snprintf(err, errlen, "%s: path too long", final);
    return CM_EINVAL;
  }
  memcpy(f->dir, final, n);
  f->dir[n] = 0;
  if (mkdir(f->tmp, 0755) != 0) {
    snprintf(err, errlen, "cannot create %s: %s", f->tmp, strerror(errno));
    return CM_EIO;
  }
  f->made = 1;
  return 0;
}

void psd_fileset_path(const struct psd_fileset *f, const char *name, char *buf,
                      size_t len) {
  snprintf(buf, len, "%s/%s", f->tmp, name);
}

int psd_fileset_create(struct psd_fileset *f, const char *name, int *fd,
                       char *path, size_t pathlen, char *err, size_t errlen) {
  psd_fileset_path(f, name, path, pathlen);
  if ((*fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) < 0) {
    snprintf(err, errlen, "cannot create %s: %s", path, strerror(errno));
    return CM_EIO;
  }
  return 0;
}

int psd_fileset_put(int fd, const void *p, size_t n, const char *path,
                    char *err, size_t errlen) {
  const char *b = p;
  while (n) {
    ssize_t k = write(fd, b, n);
    if (k < 0 && errno == EINTR)
      continue;
    if (k <= 0) {
      snprintf(err, errlen, "write %s: %s", path,
               k < 0 ? strerror(errno) : "no progress");
      return CM_EIO;
    }
    b += k;
    n -= (size_t)k;
  }
  return 0;
}

int psd_fileset_close(struct psd_fileset *f, const char *path, int fd, int rc,
                      char *err, size_t errlen) {
  struct stat st;
  if (rc) {
    close(fd);
    return rc;
  }
  if (fsync(fd) != 0) {
    snprintf(err, errlen, "fsync %s: %s", path, strerror(errno));
    close(fd);
    return CM_EIO;
  }
  if (fstat(fd, &st) == 0)
    f->bytes += (uint64_t)st.st_size;
  if (close(fd) != 0) {
    snprintf(err, errlen, "close %s: %s", path, strerror(errno));
    return CM_EIO;
  }
  return 0;
}

uint64_t psd_fileset_count(struct psd_fileset *f, const char *path) {
  struct stat st;
  if (stat(path, &st) != 0)
    return 0;
  f->bytes += (uint64_t)st.st_size;
  return (uint64_t)st.st_size;
}

int psd_fileset_manifest_crc(json_t *m, const char *key, uint32_t *crc) {
  json_t *c = json_copy(m); /* shallow: only its members' list changes */
  char *text;
  if (!c)
    return CM_ENOMEM;
  json_object_del(c, key);
  text = json_dumps(c, JSON_COMPACT | JSON_SORT_KEYS);
  json_decref(c);
  if (!text)
    return CM_ENOMEM;
  *crc = cm_st_crc32(0, text, strlen(text));
  free(text);
  return 0;
}

int psd_fileset_write_manifest(struct psd_fileset *f, const char *name,
                               json_t *m, const char *key, char *err,
                               size_t errlen) {
  char path[1300], *text = NULL;
  uint32_t crc;
  int fd, rc;
  if ((rc = psd_fileset_manifest_crc(m, key, &crc)))
    return rc;
  if (json_object_set_new(m, key, json_integer(crc)) ||
      !(text = json_dumps(m, JSON_INDENT(1) | JSON_PRESERVE_ORDER)))
    return CM_ENOMEM;
  if (!(rc = psd_fileset_create(f, name, &fd, path, sizeof path, err, errlen)))
    rc = psd_fileset_close(
        f, path, fd, psd_fileset_put(fd, text, strlen(text), path, err, errlen),
        err, errlen);
  free(text);
  return rc;
}

json_t *psd_fileset_json_shape(int ndim, const int64_t *shape) {
  json_t *a = json_array();
  for (int i = 0; a && i < ndim; i++)
    if (json_array_append_new(a, json_integer(shape[i]))) {
      json_decref(a);
      a = NULL;
    }
  return a;
}

int psd_fileset_commit(struct psd_fileset *f, int replace, char *err,
                       size_t errlen) {
  struct stat st;
  if (psd_fileset_sync_dir(f->tmp) != 0) {
    snprintf(err, errlen, "fsync %s: %s", f->tmp, strerror(errno));
    return CM_EIO;
  }
  if (replace && stat(f->final, &st) == 0) {
    /* Swapped in atomically; tmp holds the old one, which end removes. */
    if (renameat2(AT_FDCWD, f->tmp, AT_FDCWD, f->final, RENAME_EXCHANGE)) {
      snprintf(err, errlen, "cannot replace %s: %s", f->final, strerror(errno));
      return CM_EIO;
    }
  } else if (rename(f->tmp, f->final) != 0) {
    snprintf(err, errlen, "cannot rename %s to %s: %s", f->tmp, f->final,
             strerror(errno));
    return CM_EIO;
  } else {
    f->made = 0;
  }
  if (psd_fileset_sync_dir(f->dir) != 0) {
    snprintf(err, errlen, "fsync %s: %s", f->dir, strerror(errno));
    return CM_EIO;
  }
  return 0;
}

void psd_fileset_end(struct psd_fileset *f) {
  if (f->made)
    psd_fileset_remove_tree(f->tmp);
  f->made = 0;
}

int psd_fileset_sync_dir(const char *path) {
  int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  int rc = 0;
  if (fd < 0)
    return CM_EIO;
  if (fsync(fd) != 0)
    rc = CM_EIO;
  close(fd);
  return rc;
}

/* nftw's visit for psd_fileset_remove_tree: children come before their
 * directory (FTW_DEPTH); a link is removed, never followed (FTW_PHYS). */
static int remove_entry(const char *path, const struct stat *st, int type,
                        struct FTW *ftw) {
  if (type == FTW_DP || type == FTW_DNR)
    rmdir(path);
  else
    unlink(path);
  return 0; /* best effort: go on with the rest */
}

/* nftw rather than readdir's d_type, which some file systems leave
 * DT_UNKNOWN: a directory is known by stat, so it is always emptied. */
void psd_fileset_remove_tree(const char *path) {
  nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}
