/* A directory of files written whole, with a JSON manifest that checksums
 * them: what a checkpoint (ckpt_write.c) and a publication (publish/'s
 * pubfile_write.c) both are, written one way. Part of room ckpt/ (its room
 * header is ckpt.h); publish/ and reshard/ call it too.
 *
 * A file set named <dir>/<name> is written into <dir>/.tmp-<id>-<pid>/
 * (psd_fileset_begin): each file created there, written, fsynced and
 * closed (psd_fileset_create, psd_fileset_close), the manifest last with
 * its own CRC-32 (psd_fileset_write_manifest), then that directory fsynced,
 * renamed to <name> and <dir> fsynced (psd_fileset_commit): a set in place
 * is complete or absent. psd_fileset_end removes the temporary directory
 * when the set did not get into place: only what psd_fileset_begin made.
 * A crash's .tmp-* is removed when the directory is next prepared
 * (psd_fileset_prepare). Not thread-safe: one writer per handle. */
#ifndef PSD_FILESET_H
#define PSD_FILESET_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

/* One file set being written. The caller owns it (on its stack, say):
 * psd_fileset_begin fills it, psd_fileset_end releases what it holds. */
struct psd_fileset {
  char dir[1024];   /* the directory it is renamed into */
  char tmp[1100];   /* <dir>/.tmp-<id>-<pid>: where it is written */
  char final[1100]; /* <dir>/<name>: where it goes whole */
  uint64_t bytes;   /* bytes of the files written into tmp so far */
  int made;         /* 1: tmp is this writer's, psd_fileset_end removes it */
};

/* Creates dir and its missing parents (mkdir -p) and removes the .tmp-*
 * a crash left in it, each with a warning naming it as an unfinished
 * `what` ("checkpoint", "publication"). Returns 0; CM_EINVAL, dir too
 * long; CM_EIO, err names the path and strerror (e.g. a regular file
 * where a directory should be). */
int psd_fileset_prepare(const char *dir, const char *what, char *err,
                        size_t errlen);

/* Starts the set that goes to final (<dir>/<name>; dir exists): makes
 * <dir>/.tmp-<id>-<pid>. Returns 0; CM_EINVAL, a path too long; CM_EIO,
 * err says "cannot create <tmp>: <strerror>" (nothing was made). */
int psd_fileset_begin(struct psd_fileset *f, const char *final, uint64_t id,
                      char *err, size_t errlen);

/* The path of file `name` in the set being written, into buf. */
void psd_fileset_path(const struct psd_fileset *f, const char *name, char *buf,
                      size_t len);

/* Creates file `name` in the set (truncated, 0644) for writing into *fd;
 * its path into path. Returns 0 or CM_EIO ("cannot create <path>: ..."). */
int psd_fileset_create(struct psd_fileset *f, const char *name, int *fd,
                       char *path, size_t pathlen, char *err, size_t errlen);

/* Writes n bytes at p to fd (the file path), all of them. Returns 0 or
 * CM_EIO ("write <path>: <strerror>"). */
int psd_fileset_put(int fd, const void *p, size_t n, const char *path,
                    char *err, size_t errlen);

/* Ends a file that psd_fileset_create made: when rc (the outcome of its
 * writes, whose err says why) is 0, fsyncs it and counts its size into
 * f->bytes; always closes fd. Returns rc, or CM_EIO with err naming path
 * ("fsync" or "close" and strerror). */
int psd_fileset_close(struct psd_fileset *f, const char *path, int fd, int rc,
                      char *err, size_t errlen);

/* Counts the size of file path, written into the set by a writer of its
 * own (one that fsyncs it, as psd_table_snap_write does), into f->bytes.
 * Returns its size, 0 when it cannot be read. */
uint64_t psd_fileset_count(struct psd_fileset *f, const char *path);

/* The CRC-32 (zlib's) that guards a manifest: of its compact, key-sorted
 * JSON without member `key` ("checksum" in a checkpoint, "crc" in a
 * publication). The writer and both readers ask this one rule. Returns 0
 * or CM_ENOMEM. */
int psd_fileset_manifest_crc(json_t *m, const char *key, uint32_t *crc);

/* Sets m's `key` to its CRC-32 (psd_fileset_manifest_crc; key must be
 * absent) and writes m, indented by one and in its own order, as file
 * `name` of the set, like any other (psd_fileset_create, _close). Returns
 * 0, CM_ENOMEM, or CM_EIO (err names the file). */
int psd_fileset_write_manifest(struct psd_fileset *f, const char *name,
                               json_t *m, const char *key, char *err,
                               size_t errlen);

/* A shape as the manifests write it, a JSON array of ndim integers (new
 * reference, NULL when out of memory). */
json_t *psd_fileset_json_shape(int ndim, const int64_t *shape);

/* Puts the set in place: fsyncs the temporary directory, renames it to
 * final and fsyncs dir. With replace, a final that exists (a checkpoint
 * of the same step again) is swapped with it atomically (RENAME_EXCHANGE)
 * and the old one is removed by psd_fileset_end; without, the caller has
 * made sure none exists (a rename onto a directory that is not empty
 * fails). Returns 0 or CM_EIO (err: "fsync <path>", "cannot rename <tmp>
 * to <final>" or "cannot replace <final>", and strerror). */
int psd_fileset_commit(struct psd_fileset *f, int replace, char *err,
                       size_t errlen);

/* Removes the temporary directory if it is still this writer's (the set
 * did not get into place, or it holds the set it replaced). Call once,
 * after psd_fileset_begin, whatever happened; harmless on a handle that
 * begin refused. */
void psd_fileset_end(struct psd_fileset *f);

/* fsyncs a directory so renames and new entries in it are durable; returns
 * 0 or CM_EIO (errno says why). */
int psd_fileset_sync_dir(const char *path);

/* Removes path and everything under it (best effort; files and directories
 * only, as psd writes them; a link is removed, never followed). */
void psd_fileset_remove_tree(const char *path);

#endif
