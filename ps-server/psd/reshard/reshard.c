/* psd --reshard (reshard.h, reshard_internal.h): finds the old layout,
 * cuts the new shards, as many per pass over the old ones as memory allows
 * (reshard_cut.c), writes each one's checkpoint into a directory beside the
 * job's, reads it back and checks it, then swaps the job's directory for
 * the new one (reshard_dir.c). */
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
#include "clock.h"
#include "err.h"
#include "fileset.h"
#include "layout.h"
#include "log.h"
#include "meminfo.h"
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
  rc = psd_ckpt_peek(c, &src->step, &src->n, mode, sizeof mode, &src->layout,
                     NULL, err, errlen);
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
    rc = psd_ckpt_peek(c, &step, &nk, mk, sizeof mk, NULL, NULL, err, errlen);
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
                             .keep = job->ckpt_keep,
                             .layout = src->layout + 1};
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
  struct cm_layout_map map;
  cm_layout_map_init(&map, CM_LAYOUT_RULE_BUCKETS, m);
  for (int i = 0; i < psd_tables_count(ts); i++) {
    struct psd_table_snap *s = NULL;
    if (psd_table_snapshot(psd_tables_at(ts, i), 0, &s)) {
      rc = CM_ENOMEM;
      goto out;
    }
    for (size_t r = 0; r < s->nrows; r++)
      if (cm_layout_map_id_shard(&map, s->ids[r]) != cut->shard) {
        snprintf(err, errlen,
                 "new shard %d: table '%s' holds id %llu, which shard %d of "
                 "%d holds",
                 cut->shard, psd_table_conf(psd_tables_at(ts, i))->name,
                 (unsigned long long)s->ids[r],
                 cm_layout_map_id_shard(&map, s->ids[r]), m);
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

/* Bytes of every file under dir (one level of subdirectories: a shard's
 * checkpoint directories), 0 when it cannot be read. */
static uint64_t bytes_under(const char *dir, int depth) {
  DIR *d = opendir(dir);
  struct dirent *e;
  uint64_t n = 0;
  while (d && (e = readdir(d))) {
    char p[2200];
    struct stat st;
    if (e->d_name[0] == '.')
      continue;
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    if (stat(p, &st) != 0)
      continue;
    if (S_ISDIR(st.st_mode) && depth > 0)
      n += bytes_under(p, depth - 1);
    else if (S_ISREG(st.st_mode))
      n += (uint64_t)st.st_size;
  }
  if (d)
    closedir(d);
  return n;
}

/* How many new shards one pass over the old ones cuts: all of them when
 * they fit in half the available memory (each old shard is then read
 * once), else fewer, down to one (each new shard reads every old one).
 * The old shards' checkpoint directories (every checkpoint kept: more
 * than the state) bound the state; a shard in memory takes about twice
 * its bytes. */
static int group_size(const struct psd__reshard_src *src) {
  const struct psd_reshard_opts *o = src->o;
  uint64_t disk = 0, m = (uint64_t)o->nshards;
  uint64_t avail = o->memory ? 2 * o->memory : cm_mem_available();
  if (avail == UINT64_MAX) /* unknown: one new shard per pass */
    avail = 0;
  char dir[1200], a[32], b[32];
  for (int k = 0; k < src->n; k++) {
    snprintf(dir, sizeof dir, "%s/%s/ps-%d", o->root, o->job->name, k);
    disk += bytes_under(dir, 1);
  }
  uint64_t old = 3 * disk / (uint64_t)src->n, each = 2 * disk / m + 1;
  uint64_t g = avail / 2 > old ? (avail / 2 - old) / each : 1;
  if (g < 1)
    g = 1;
  if (g > m)
    g = m;
  cm_info("reshard: the old shards' checkpoints take %s on disk, %s of "
          "memory may be used (%s): %llu of the %d new shards per pass over "
          "the old ones",
          cm_fmt_bytes((double)disk, a, sizeof a),
          cm_fmt_bytes((double)(avail / 2), b, sizeof b),
          o->memory ? "--reshard-memory" : "half of MemAvailable",
          (unsigned long long)g, o->nshards);
  return (int)g;
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
  psd__reshard_tidy(o->root, o->job->name);
  if ((rc = find_old(&src, err, errlen)))
    return rc;
  r->from = src.n;
  r->to = o->nshards;
  r->layout = src.layout + 1;
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
  int group = group_size(&src);
  struct psd__reshard_cut *cuts = calloc(group, sizeof *cuts);
  if (!cuts) {
    rc = CM_ENOMEM;
    snprintf(err, errlen, "out of memory");
    goto out;
  }
  for (int first = 0; first < o->nshards; first += group) {
    int count = o->nshards - first < group ? o->nshards - first : group;
    double ts = cm_mono_ms();
    if ((rc = psd__reshard_cut(&src, first, count, cuts, err, errlen)))
      break;
    for (int j = 0; j < count; j++) {
      struct psd__reshard_cut *cut = &cuts[j];
      uint64_t bytes = 0;
      if (!rc && !(rc = write_and_check(&src, tmp, cut, &bytes, err, errlen))) {
        r->rows += cut->rows;
        r->rows_moved += cut->rows_moved;
        r->elems += cut->elems;
        r->elems_moved += cut->elems_moved;
        r->bytes += bytes;
        if (psd_store_count(cut->store) > r->nvars)
          r->nvars = psd_store_count(cut->store);
        r->ntables = psd_tables_count(cut->tables);
        cm_info(
            "reshard: new ps-%d of %d: %llu table rows (%llu from "
            "another shard index), %llu dense elements (%llu), %d "
            "variables; written (%s), read back and checked (%.0f ms "
            "since its pass began)",
            cut->shard, o->nshards, (unsigned long long)cut->rows,
            (unsigned long long)cut->rows_moved, (unsigned long long)cut->elems,
            (unsigned long long)cut->elems_moved, psd_store_count(cut->store),
            cm_fmt_bytes((double)bytes, size, sizeof size), cm_mono_ms() - ts);
      }
      psd__reshard_cut_free(cut);
    }
    if (rc)
      break;
  }
  free(cuts);
  if (rc)
    goto out;
  /* The swap: <root>/<job> becomes the new layout. */
  snprintf(moved, sizeof moved, "%s/%s", tmp, o->job->name);
  snprintf(r->kept, sizeof r->kept, "%s.%d-shards-%ld", jobdir, src.n,
           (long)time(NULL));
  if ((rc = psd__reshard_swap_in(o->root, tmp, moved, jobdir, r->kept, &kept_ok,
                                 err, errlen))) {
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
    psd_fileset_remove_tree(tmp);
  r->ms = cm_mono_ms() - t0;
  return rc;
}
