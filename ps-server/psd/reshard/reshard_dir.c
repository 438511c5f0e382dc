/* psd --reshard's dealings with the job's directory (reshard_internal.h,
 * reshard.h): what an earlier run left, the swap that makes the new layout
 * the job's, and the check a shard makes at its start. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt.h"
#include "err.h"
#include "fileset.h"
#include "layout.h"
#include "log.h"
#include "reshard_internal.h"

#define COMPLETE                                                               \
  "COMPLETE" /* in a run's directory: its new layout is whole                  \
              */

/* Whether path exists. */
static int exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}

/* What an earlier run left in root (killed, or its machine down): a run
 * killed between the two renames of the fallback swap left no job
 * directory and its new layout whole: that swap is finished now. Anything
 * else is renamed aside, never removed: it may hold the old layout. */
void psd__reshard_tidy(const char *root, const char *job) {
  char prefix[128], from[2200], to[2200], jobdir[1100];
  DIR *d = opendir(root);
  struct dirent *e;
  snprintf(prefix, sizeof prefix, ".reshard-%s-", job);
  snprintf(jobdir, sizeof jobdir, "%s/%s", root, job);
  while (d && (e = readdir(d))) {
    if (strncmp(e->d_name, prefix, strlen(prefix)))
      continue;
    snprintf(from, sizeof from, "%s/%s/" COMPLETE, root, e->d_name);
    snprintf(to, sizeof to, "%s/%s/%s", root, e->d_name, job);
    if (!exists(jobdir) && exists(from) && exists(to)) {
      if (rename(to, jobdir) == 0) {
        cm_warn("reshard: finished the swap an earlier --reshard began (it "
                "stopped between its two renames): %s is its new layout",
                jobdir);
        psd_fileset_sync_dir(root);
      } else {
        cm_error("reshard: cannot move %s to %s: %s", to, jobdir,
                 strerror(errno));
      }
    }
    snprintf(from, sizeof from, "%s/%s", root, e->d_name);
    snprintf(to, sizeof to, "%s/%s.unfinished-reshard-%s", root, job,
             e->d_name + strlen(prefix));
    if (!rename(from, to))
      cm_warn("reshard: %s was left by an earlier --reshard that stopped; "
              "kept as %s (remove it once you do not need it)",
              from, to);
  }
  if (d)
    closedir(d);
}

/* Makes the checked new layout in tmp/<job> the job's directory, jobdir;
 * the old one goes to kept. One rename (RENAME_EXCHANGE) where the file
 * system has it; else two (NFS), with tmp/COMPLETE telling a later run or
 * a starting shard that a missing jobdir is in tmp. *kept_ok: 1 the old
 * layout is in kept, 0 it is in moved, -1 (failed) tmp must stay. */
int psd__reshard_swap_in(const char *root, const char *tmp, const char *moved,
                         const char *jobdir, const char *kept, int *kept_ok,
                         char *err, size_t errlen) {
  char mark[1200];
  int fd;
  snprintf(mark, sizeof mark, "%s/" COMPLETE, tmp);
  if ((fd = open(mark, O_CREAT | O_WRONLY | O_CLOEXEC, 0600)) < 0 ||
      fsync(fd) != 0 || psd_fileset_sync_dir(moved) ||
      psd_fileset_sync_dir(tmp)) {
    snprintf(err, errlen, "cannot mark %s complete: %s", tmp, strerror(errno));
    if (fd >= 0)
      close(fd);
    return CM_EIO;
  }
  close(fd);
  *kept_ok = 0;
  if (renameat2(AT_FDCWD, moved, AT_FDCWD, jobdir, RENAME_EXCHANGE) == 0) {
    psd_fileset_sync_dir(tmp);
    psd_fileset_sync_dir(root);
    *kept_ok = rename(moved, kept) == 0;
    return 0;
  }
  if (errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP) {
    snprintf(err, errlen, "cannot swap %s for %s: %s", moved, jobdir,
             strerror(errno));
    return CM_EIO;
  }
  /* No exchange here: old aside, then new in place. */
  if (rename(jobdir, kept) != 0) {
    snprintf(err, errlen, "cannot rename %s to %s: %s", jobdir, kept,
             strerror(errno));
    return CM_EIO;
  }
  if (rename(moved, jobdir) != 0) {
    snprintf(err, errlen, "cannot rename %s to %s: %s", moved, jobdir,
             strerror(errno));
    if (rename(kept, jobdir) != 0 && (*kept_ok = -1))
      cm_error("reshard: and cannot put %s back as %s: %s; %s holds the "
               "new layout, whole: run psd --reshard again to finish",
               kept, jobdir, strerror(errno), moved);
    return CM_EIO;
  }
  psd_fileset_sync_dir(root);
  *kept_ok = 1;
  return 0;
}

int psd_reshard_layout(const char *root, const char *job, int max_shards,
                       int *nshards, uint64_t *layout, int *rows, char *err,
                       size_t errlen) {
  char dir[1100], mode[16], why[1200], first[1200] = "";
  struct dirent *e;
  DIR *d;
  int rc = 0;

  *nshards = 0;
  *layout = 0;
  *rows = 0;
  snprintf(dir, sizeof dir, "%s/%s", root, job);
  if (!(d = opendir(dir))) {
    /* No job directory: new, or a reshard stopped between two renames. */
    char prefix[128], mark[2400];
    snprintf(prefix, sizeof prefix, ".reshard-%s-", job);
    if (!(d = opendir(root)))
      return 0;
    while (!rc && (e = readdir(d))) {
      snprintf(mark, sizeof mark, "%s/%s/" COMPLETE, root, e->d_name);
      if (!strncmp(e->d_name, prefix, strlen(prefix)) && exists(mark)) {
        snprintf(err, errlen,
                 "%s is missing and %s/%s holds the job's checkpoints, "
                 "restored onto another shard count by a psd --reshard that "
                 "stopped before it finished: run psd --cluster SPEC "
                 "--reshard again to finish it",
                 dir, root, e->d_name);
        rc = CM_EEXIST;
      }
    }
    closedir(d);
    return rc;
  }
  /* Every shard's newest checkpoint must be of one layout. */
  while (!rc && (e = readdir(d))) {
    char *end;
    long k;
    if (strncmp(e->d_name, "ps-", 3))
      continue;
    k = strtol(e->d_name + 3, &end, 10);
    if (*end || end == e->d_name + 3 || k < 0 || k > 100000)
      continue;
    struct psd_ckpt_opts o = {.root = root,
                              .job = job,
                              .shard = (int)k,
                              .nshards = max_shards,
                              .mode = "async",
                              .optims = NULL,
                              .read_only = 1};
    struct cm_optim_set none;
    struct psd_ckpt *c = NULL;
    uint64_t step, lay;
    int n, r;
    memset(&none, 0, sizeof none);
    o.optims = &none;
    if (psd_ckpt_new(&c, &o, why, sizeof why))
      continue;
    if (psd_ckpt_peek(c, &step, &n, mode, sizeof mode, &lay, &r, why,
                      sizeof why)) {
      psd_ckpt_free(c);
      continue;
    }
    if (n > max_shards) {
      snprintf(err, errlen,
               "%s/ckpt-%010llu was written by a job of %d shards; the spec "
               "lists %d address%s. Restore the checkpoint onto %d shard%s "
               "first: psd --cluster SPEC --reshard (docs/reshard.md)",
               psd_ckpt_dir(c), (unsigned long long)step, n, max_shards,
               max_shards == 1 ? "" : "es", max_shards,
               max_shards == 1 ? "" : "s");
      rc = CM_EEXIST;
    } else if (*nshards && lay < *layout) {
      /* Older than a layout switch another shard checkpointed since: a
       * shard switched and killed before its own checkpoint of the new
       * layout (it finds its switch directory at start, move.h). */
    } else if (*nshards && lay == *layout && (n != *nshards || r != *rows)) {
      snprintf(err, errlen,
               "%s/ckpt-%010llu is of layout %llu of %d shards (rows by %s), "
               "but %s is of layout %llu of %d (rows by %s): not one "
               "layout's checkpoints",
               psd_ckpt_dir(c), (unsigned long long)step,
               (unsigned long long)lay, n, cm_layout_rule_name(r), first,
               (unsigned long long)*layout, *nshards,
               cm_layout_rule_name(*rows));
      rc = CM_EEXIST;
    } else if (!*nshards || lay > *layout) {
      /* The newest layout is the job's: a switch that any shard
       * checkpointed was committed (its saver writes after COMMIT). */
      *nshards = n;
      *layout = lay;
      *rows = r;
      snprintf(first, sizeof first, "%s/ckpt-%010llu", psd_ckpt_dir(c),
               (unsigned long long)step);
    }
    psd_ckpt_free(c);
  }
  closedir(d);
  if (rc) {
    *nshards = 0;
    *layout = 0;
    *rows = 0;
  }
  return rc;
}
