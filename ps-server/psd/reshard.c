/* psd --reshard (reshard.h, reshard_internal.h): finds the old layout,
 * cuts each new shard (reshard_cut.c), writes its checkpoint into a
 * directory beside the job's, reads it back and checks it, then swaps the
 * job's directory for the new one in one rename. */
#include "reshard.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt.h"
#include "ckpt_internal.h" /* psd__ckpt_sync_dir, psd__ckpt_remove_tree */
#include "clock.h"
#include "err.h"
#include "log.h"
#include "reshard_internal.h"
#include "table.h"
#include "units.h"

/* A read-only handle on shard k of nshards under root. */
static int open_ro(const char *root, const struct cm_job *job, int k,
                   int nshards, int has_step, uint64_t step,
                   struct psd_ckpt **c, char *err, size_t errlen) {
  struct psd_ckpt_opts o = {.root = root,
                            .job = job->name,
                            .shard = k,
                            .nshards = nshards,
                            .mode = job->mode,
                            .optims = &job->optim,
                            .keep = job->ckpt_keep,
                            .has_resume_step = has_step,
                            .resume_step = step,
                            .read_only = 1};
  return psd_ckpt_new(c, &o, err, errlen);
}

int psd__reshard_load(const struct psd__reshard_src *src, int k,
                      struct psd_store **store, struct psd_tables **tables,
                      char *err, size_t errlen) {
  const struct cm_job *job = src->o->job;
  struct psd_ckpt *c = NULL;
  struct psd_ckpt_result res;
  char why[4096];
  int rc;

  *store = NULL;
  *tables = NULL;
  if ((rc = open_ro(src->o->root, job, k, src->n, 1, src->steps[k], &c, err,
                    errlen)) ||
      (rc = psd_tables_new(tables, job->tables, job->ntables,
                           &job->table_defaults, job->seed, err, errlen)))
    goto out;
  psd_ckpt_set_tables(c, *tables);
  rc = psd_ckpt_load(c, store, NULL, &res, why, sizeof why);
  if (!rc && (!*store || res.step != src->steps[k])) {
    snprintf(why, sizeof why,
             "its checkpoint of step %llu does not verify "
             "(see above)",
             (unsigned long long)src->steps[k]);
    rc = CM_EFORMAT;
  }
  if (rc)
    snprintf(err, errlen, "old shard ps-%d (%s): %s", k, psd_ckpt_dir(c), why);
out:
  psd_ckpt_free(c);
  if (rc) {
    psd_store_free(*store);
    psd_tables_free(*tables);
    *store = NULL;
    *tables = NULL;
  }
  return rc;
}

/* Finds the old layout: N from ps-0's newest checkpoint, every old
 * shard's step (sync: the newest all have), and checks that they agree. */
static int find_old(struct psd__reshard_src *src, char *err, size_t errlen) {
  const struct psd_reshard_opts *o = src->o;
  static uint64_t lists[2][4096];
  char mode[16];
  struct psd_ckpt *c = NULL;
  int n = 0, rc;

  if ((rc = open_ro(o->root, o->job, 0, 1, 0, 0, &c, err, errlen)))
    return rc;
  rc = psd_ckpt_peek(c, &src->step, &src->n, mode, sizeof mode, err, errlen);
  if (rc == CM_ENOENT)
    snprintf(err, errlen, "no checkpoint in %s: nothing to restore",
             psd_ckpt_dir(c));
  psd_ckpt_free(c);
  if (rc)
    return rc;
  if (src->n > (int)(sizeof src->steps / sizeof src->steps[0])) {
    snprintf(err, errlen, "%d old shards: at most %zu", src->n,
             sizeof src->steps / sizeof src->steps[0]);
    return CM_EFORMAT;
  }
  src->sync = !strcmp(mode, "sync");
  src->step = 0;
  for (int k = 0; k < src->n; k++) {
    uint64_t step;
    int nk;
    char mk[16];
    if ((rc = open_ro(o->root, o->job, k, src->n, 0, 0, &c, err, errlen)))
      return rc;
    rc = psd_ckpt_peek(c, &step, &nk, mk, sizeof mk, err, errlen);
    if (rc == CM_ENOENT)
      snprintf(err, errlen,
               "%s holds no checkpoint, but ps-0's newest was written by %d "
               "shards: every old shard's checkpoint is needed",
               psd_ckpt_dir(c), src->n);
    else if (!rc && (nk != src->n || strcmp(mk, mode))) {
      snprintf(err, errlen,
               "%s's newest checkpoint was written by a %s job of %d shards; "
               "ps-0's by a %s job of %d: not one job's checkpoints",
               psd_ckpt_dir(c), mk, nk, mode, src->n);
      rc = CM_EFORMAT;
    }
    if (!rc && src->sync) {
      /* The newest step every shard has so far: lists[0] holds it. */
      int nl = psd_ckpt_list(c, lists[k ? 1 : 0], 4096), keep = 0;
      if (k == 0) {
        n = nl;
      } else {
        for (int i = 0; i < n; i++)
          for (int j = 0; j < nl; j++)
            if (lists[0][i] == lists[1][j])
              lists[0][keep++] = lists[0][i];
        n = keep;
      }
      if (!n) {
        snprintf(err, errlen,
                 "%s: no checkpoint of a step every old shard has (sync "
                 "shards restore one common step)",
                 psd_ckpt_dir(c));
        rc = CM_EFORMAT;
      }
    }
    src->steps[k] = step;
    if (step > src->step)
      src->step = step;
    psd_ckpt_free(c);
    if (rc)
      return rc;
  }
  if (src->sync) {
    src->step = lists[0][0];
    for (int k = 0; k < src->n; k++)
      src->steps[k] = src->step;
  }
  return 0;
}

/* Writes cut's checkpoint of step under tmp, reads it back and checks it
 * against cut: every tensor (CRC, rows) by the loader, then values, slots
 * and rows bit for bit, and each row's shard. */
static int write_and_check(const struct psd__reshard_src *src, const char *tmp,
                           struct psd__reshard_cut *cut, uint64_t *bytes,
                           char *err, size_t errlen) {
  const struct cm_job *job = src->o->job;
  int m = src->o->nshards, rc;
  struct psd_ckpt_opts wo = {.root = tmp,
                             .job = job->name,
                             .shard = cut->shard,
                             .nshards = m,
                             .mode = job->mode,
                             .optims = &job->optim,
                             .keep = job->ckpt_keep};
  struct psd_ckpt *c = NULL;
  struct psd_ckpt_result res;
  struct psd__reshard_src back = *src;
  struct psd_store *st = NULL;
  struct psd_tables *ts = NULL;

  if ((rc = psd_ckpt_new(&c, &wo, err, errlen)))
    return rc;
  psd_ckpt_set_tables(c, cut->tables);
  rc = psd_ckpt_write(c, cut->store, NULL, src->step, 1, &res, err, errlen);
  psd_ckpt_free(c);
  if (rc)
    return rc;
  *bytes = res.bytes;
  /* Read back as the new shard will at its start. */
  struct psd_reshard_opts bo = *src->o;
  bo.root = tmp;
  back.o = &bo;
  back.n = m;
  back.steps[cut->shard] = src->step;
  if ((rc = psd__reshard_load(&back, cut->shard, &st, &ts, err, errlen)))
    return rc;
  rc = CM_EFORMAT;
  for (int i = 0; i < psd_store_count(cut->store); i++) {
    struct psd_var *a = psd_store_at(cut->store, i);
    struct psd_var *b = psd_store_find(st, a->name);
    size_t len = (a->elem_end - a->elem_begin) * sizeof(float);
    int same = b && b->row_begin == a->row_begin && b->row_end == a->row_end &&
               !memcmp(a->value, b->value, len) &&
               psd_var_steps(a) == psd_var_steps(b);
    for (int s = 0; same && s < a->nslots; s++)
      same = !memcmp(a->slots[s], b->slots[s], len);
    if (!same) {
      snprintf(err, errlen, "new shard %d: variable '%s' reads back changed",
               cut->shard, a->name);
      goto out;
    }
  }
  uint64_t rows = 0;
  for (int i = 0; i < psd_tables_count(ts); i++) {
    struct psd_table_snap *s = NULL;
    if (psd_table_snapshot(psd_tables_at(ts, i), 0, &s)) {
      rc = CM_ENOMEM;
      goto out;
    }
    for (size_t r = 0; r < s->nrows; r++)
      if (psd_table_shard_of(s->ids[r], m) != cut->shard) {
        snprintf(err, errlen,
                 "new shard %d: table '%s' holds id %llu, which shard %d of "
                 "%d holds",
                 cut->shard, psd_table_conf(psd_tables_at(ts, i))->name,
                 (unsigned long long)s->ids[r],
                 psd_table_shard_of(s->ids[r], m), m);
        psd_table_snap_free(s);
        goto out;
      }
    rows += s->nrows;
    psd_table_snap_free(s);
  }
  if (rows != cut->rows) {
    snprintf(err, errlen, "new shard %d: %llu table rows read back of %llu",
             cut->shard, (unsigned long long)rows,
             (unsigned long long)cut->rows);
    goto out;
  }
  rc = 0;
out:
  psd_store_free(st);
  psd_tables_free(ts);
  return rc;
}

#define COMPLETE "COMPLETE" /* in a run's directory: its new layout is whole   \
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
static void finish_or_set_aside(const char *root, const char *job) {
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
        psd__ckpt_sync_dir(root);
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
static int swap_in(const char *root, const char *tmp, const char *moved,
                   const char *jobdir, const char *kept, int *kept_ok,
                   char *err, size_t errlen) {
  char mark[1200];
  int fd;
  snprintf(mark, sizeof mark, "%s/" COMPLETE, tmp);
  if ((fd = open(mark, O_CREAT | O_WRONLY | O_CLOEXEC, 0600)) < 0 ||
      fsync(fd) != 0 || psd__ckpt_sync_dir(moved) || psd__ckpt_sync_dir(tmp)) {
    snprintf(err, errlen, "cannot mark %s complete: %s", tmp, strerror(errno));
    if (fd >= 0)
      close(fd);
    return CM_EIO;
  }
  close(fd);
  *kept_ok = 0;
  if (renameat2(AT_FDCWD, moved, AT_FDCWD, jobdir, RENAME_EXCHANGE) == 0) {
    psd__ckpt_sync_dir(tmp);
    psd__ckpt_sync_dir(root);
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
  psd__ckpt_sync_dir(root);
  *kept_ok = 1;
  return 0;
}

int psd_reshard_run(const struct psd_reshard_opts *o,
                    struct psd_reshard_report *r, char *err, size_t errlen) {
  static struct psd__reshard_src src;
  char tmp[1100], jobdir[1100], moved[1200], size[32];
  double t0 = cm_mono_ms();
  int made = 0, kept_ok = 0, rc;

  memset(r, 0, sizeof *r);
  memset(&src, 0, sizeof src);
  src.o = o;
  finish_or_set_aside(o->root, o->job->name);
  if ((rc = find_old(&src, err, errlen)))
    return rc;
  r->from = src.n;
  r->to = o->nshards;
  r->step = src.step;
  /* The same count re-cuts too: variables a client placed otherwise
   * (dworker before it placed by name) go where clients now ask. */
  cm_info("reshard: job '%s': the %s checkpoint of %d shard%s (step %llu%s) "
          "onto %d shard%s",
          o->job->name, src.sync ? "sync" : "async", src.n,
          src.n == 1 ? "" : "s", (unsigned long long)src.step,
          src.sync ? ", every shard's" : ", the largest shard's", o->nshards,
          o->nshards == 1 ? "" : "s");
  snprintf(jobdir, sizeof jobdir, "%s/%s", o->root, o->job->name);
  snprintf(tmp, sizeof tmp, "%s/.reshard-%s-%ld", o->root, o->job->name,
           (long)getpid());
  if (mkdir(tmp, 0700) != 0) {
    snprintf(err, errlen, "cannot make %s: %s", tmp, strerror(errno));
    return CM_EIO;
  }
  made = 1;
  for (int i = 0; i < o->nshards; i++) {
    struct psd__reshard_cut cut;
    uint64_t bytes = 0;
    double ts = cm_mono_ms();
    if ((rc = psd__reshard_cut(&src, i, &cut, err, errlen)))
      goto out;
    rc = write_and_check(&src, tmp, &cut, &bytes, err, errlen);
    if (!rc) {
      r->rows += cut.rows;
      r->rows_moved += cut.rows_moved;
      r->elems += cut.elems;
      r->elems_moved += cut.elems_moved;
      r->bytes += bytes;
      r->nvars = psd_store_count(cut.store) > r->nvars
                     ? psd_store_count(cut.store)
                     : r->nvars;
      r->ntables = psd_tables_count(cut.tables);
      cm_info("reshard: new ps-%d of %d: %llu table rows (%llu from another "
              "shard index), %llu dense elements (%llu), %d variables; "
              "written (%s), read back and checked in %.0f ms",
              i, o->nshards, (unsigned long long)cut.rows,
              (unsigned long long)cut.rows_moved, (unsigned long long)cut.elems,
              (unsigned long long)cut.elems_moved, psd_store_count(cut.store),
              cm_fmt_bytes((double)bytes, size, sizeof size),
              cm_mono_ms() - ts);
    }
    psd__reshard_cut_free(&cut);
    if (rc)
      goto out;
  }
  /* The swap: <root>/<job> becomes the new layout. */
  snprintf(moved, sizeof moved, "%s/%s", tmp, o->job->name);
  snprintf(r->kept, sizeof r->kept, "%s.%d-shards-%ld", jobdir, src.n,
           (long)time(NULL));
  if ((rc = swap_in(o->root, tmp, moved, jobdir, r->kept, &kept_ok, err,
                    errlen))) {
    made = kept_ok >= 0;
    goto out;
  }
  if (!kept_ok) {
    cm_warn("reshard: the old layout stays in %s (cannot rename it to %s: "
            "%s)",
            moved, r->kept, strerror(errno));
    snprintf(r->kept, sizeof r->kept, "%s", moved);
    made = 0;
  }
  rc = 0;
out:
  if (made)
    psd__ckpt_remove_tree(tmp);
  r->ms = cm_mono_ms() - t0;
  return rc;
}

int psd_reshard_check(const char *root, const char *job, int nshards, char *err,
                      size_t errlen) {
  char dir[1100], mode[16], why[1200];
  struct dirent *e;
  DIR *d;
  int rc = 0;

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
                              .nshards = nshards,
                              .mode = "async",
                              .optims = NULL,
                              .read_only = 1};
    struct cm_optim_set none;
    struct psd_ckpt *c = NULL;
    uint64_t step;
    int n;
    memset(&none, 0, sizeof none);
    o.optims = &none;
    if (psd_ckpt_new(&c, &o, why, sizeof why))
      continue;
    if (!psd_ckpt_peek(c, &step, &n, mode, sizeof mode, why, sizeof why) &&
        n != nshards) {
      snprintf(err, errlen,
               "%s/ckpt-%010llu was written by a job of %d shard%s; the spec "
               "has %d. Restore the checkpoint onto %d shards first: psd "
               "--cluster SPEC --reshard (docs/reshard.md)",
               psd_ckpt_dir(c), (unsigned long long)step, n, n == 1 ? "" : "s",
               nshards, nshards);
      rc = CM_EEXIST;
    }
    psd_ckpt_free(c);
  }
  closedir(d);
  return rc;
}
