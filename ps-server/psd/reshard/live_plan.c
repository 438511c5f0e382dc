/* A live reshard's plan directory (live.h): its files, written whole and
 * read back, and what a shard does after its graceful stop: mark the plan,
 * cut (ps:0) or wait for the result, then execute itself again; and, at
 * start, a plan that a killed process left without a result. */
#include "live_internal.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "clock.h"
#include "coord.h"
#include "err.h"
#include "log.h"
#include "reshard.h"

/* <root>/.live-<job>-L<version> into buf. */
void psd__live_plan_dir(const char *root, const char *job, uint64_t v,
                        char *buf, size_t len) {
  snprintf(buf, len, "%s/.live-%s-L%" PRIu64, root, job, v);
}

/* Writes text (one line) to dir/name whole: a temporary file, fsync,
 * rename. Returns 0 or CM_EIO (errno kept). */
int psd__live_put(const char *dir, const char *name, const char *text) {
  char tmp[1400], path[1400];
  FILE *f;
  int ok;
  snprintf(tmp, sizeof tmp, "%s/.%s.tmp", dir, name);
  snprintf(path, sizeof path, "%s/%s", dir, name);
  if (!(f = fopen(tmp, "w")))
    return CM_EIO;
  ok = fprintf(f, "%s\n", text) >= 0 && fflush(f) == 0 && fsync(fileno(f)) == 0;
  ok &= fclose(f) == 0;
  if (!ok || rename(tmp, path))
    return CM_EIO;
  return 0;
}

/* Reads dir/name's line into buf (its newline dropped). Returns 0, or
 * CM_ENOENT when it is not there. */
int psd__live_get(const char *dir, const char *name, char *buf, size_t len) {
  char path[1400];
  FILE *f;
  snprintf(path, sizeof path, "%s/%s", dir, name);
  if (!(f = fopen(path, "r")))
    return CM_ENOENT;
  if (!fgets(buf, (int)len, f))
    buf[0] = 0;
  fclose(f);
  buf[strcspn(buf, "\n")] = 0;
  return 0;
}

int psd__live_is_dir(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Removes a finished plan directory and its files (best effort). */
void psd__live_remove_plan(const char *dir) {
  DIR *d = opendir(dir);
  struct dirent *e;
  char path[1400];
  while (d && (e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
      continue;
    if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) < (int)sizeof path)
      unlink(path);
  }
  if (d)
    closedir(d);
  rmdir(dir);
}

/* Waits until plan has a result (or is gone), saying so every 10 s. */
static void wait_result(const char *plan, const char *why) {
  char res[1200];
  double from = cm_mono_ms(), said = from;
  while (psd__live_is_dir(plan) &&
         psd__live_get(plan, "result", res, sizeof res) == CM_ENOENT) {
    if (cm_mono_ms() - said >= LIVE_SAY_EVERY_S * 1000.0) {
      said = cm_mono_ms();
      cm_info("reshard: still waiting for ps:0 %s (%.0f s)", why,
              (said - from) / 1000);
    }
    usleep(LIVE_POLL_MS * 1000);
  }
}

/* ps:0: waits for the old shards' marks, then cuts. Writes the result. */
static void cut(struct psd_live *l) {
  struct psd_server *srv = l->srv;
  char mark[600], res[4600], err[4096];
  double from = cm_mono_ms(), said = from;
  int missing = 0;

  if (psd__live_get(l->plan, "result", res, sizeof res) == 0)
    return; /* aborted before the shards stopped for it */
  for (int s = 1; s < l->from; s++) {
    while (psd__live_get(l->plan,
                         (snprintf(mark, sizeof mark, "ps-%d", s), mark), res,
                         sizeof res) == CM_ENOENT) {
      if (cm_mono_ms() - from > LIVE_MARK_WAIT_S * 1000.0) {
        missing = s;
        break;
      }
      if (cm_mono_ms() - said >= LIVE_SAY_EVERY_S * 1000.0) {
        said = cm_mono_ms();
        cm_info("reshard: waiting for ps:%d's final checkpoint (%.0f s of "
                "up to %d)",
                s, (said - from) / 1000, LIVE_MARK_WAIT_S);
      }
      usleep(LIVE_POLL_MS * 1000);
    }
    if (missing)
      break;
    if (!strncmp(res, "failed", 6)) {
      snprintf(err, sizeof err, "ps:%d's %.1000s", s, res);
      missing = -s;
      break;
    }
  }
  if (missing > 0)
    snprintf(res, sizeof res,
             "aborted: ps:%d left no mark of its final checkpoint within %d "
             "s; the job stays in layout %llu of %d shards",
             missing, LIVE_MARK_WAIT_S, (unsigned long long)srv->layout,
             l->from);
  else if (missing < 0)
    snprintf(res, sizeof res,
             "aborted: %s; the job stays in layout %llu of %d shards", err,
             (unsigned long long)srv->layout, l->from);
  if (missing) {
    cm_error("reshard: %s", res);
  } else {
    struct psd_reshard_opts o = {
        .root = srv->root, .job = &srv->spec->job, .nshards = l->to};
    struct psd_reshard_report r;
    if (psd_reshard_run(&o, &r, err, sizeof err)) {
      snprintf(res, sizeof res,
               "aborted: %s; the job stays in layout %llu of %d shards", err,
               (unsigned long long)srv->layout, l->from);
      cm_error("reshard: %s", res);
    } else {
      snprintf(res, sizeof res,
               "done: layout %llu of %d shards from %d, step %llu, %llu of "
               "%llu table rows and %llu of %llu dense elements moved, cut "
               "in %.2f s",
               (unsigned long long)r.layout, r.to, r.from,
               (unsigned long long)r.step, (unsigned long long)r.rows_moved,
               (unsigned long long)r.rows, (unsigned long long)r.elems_moved,
               (unsigned long long)r.elems, r.ms / 1000);
      cm_info("reshard: %s", res);
    }
  }
  if (psd__live_put(l->plan, "result", res))
    cm_error("reshard: cannot write %s/result: %s (the other shards wait "
             "for it)",
             l->plan, strerror(errno));
}

enum psd_exit psd_live_finish(struct psd_live *l, enum psd_exit rc,
                              char **argv) {
  struct psd_server *srv = l->srv;
  char name[32], text[200];
  snprintf(name, sizeof name, "ps-%d", srv->shard);
  snprintf(text, sizeof text, "%s",
           rc == PSD_EXIT_OK ? "stopped: final checkpoint written"
                             : "failed: its final checkpoint was not written");
  if (psd__live_put(l->plan, name, text))
    cm_warn("reshard: cannot mark %s/%s: %s", l->plan, name, strerror(errno));
  if (srv->shard == 0)
    cut(l);
  else
    wait_result(l->plan, "to cut the checkpoint");
  /* ps:0: the workers stay joined when no step was cut in two. */
  if (srv->coord && l->clean) {
    char members[4096];
    if (psd_coord_members(srv->coord, members, sizeof members) > 0)
      setenv(PSD_LIVE_MEMBERS_ENV, members, 1);
  }
  cm_info("reshard: starting again (same process, pid %d)", (int)getpid());
  fflush(stdout);
  fflush(stderr);
  execv("/proc/self/exe", argv);
  cm_error("reshard: cannot execute psd again: %s", strerror(errno));
  return PSD_EXIT_FAILED;
}

int psd_live_startup(struct psd_server *srv, const char *root, char *last,
                     size_t lastlen) {
  char prefix[200], plan[1200], res[1200], name[32];
  uint64_t newest = 0;
  struct dirent *e;
  DIR *d;
  int rc = 0;
  if (!root || !(d = opendir(root)))
    return 0;
  snprintf(prefix, sizeof prefix, ".live-%s-L", srv->spec->job.name);
  snprintf(name, sizeof name, "ps-%d", srv->shard);
  while ((e = readdir(d))) {
    uint64_t v;
    char *end;
    if (strncmp(e->d_name, prefix, strlen(prefix)))
      continue;
    v = strtoull(e->d_name + strlen(prefix), &end, 10);
    if (*end)
      continue;
    snprintf(plan, sizeof plan, "%s/%s", root, e->d_name);
    if (psd__live_get(plan, "result", res, sizeof res) == 0) {
      if (v >= newest) { /* the newest reshard's result is the last */
        newest = v;
        snprintf(last, lastlen, "%s", res);
      }
      continue;
    }
    if (srv->shard == 0) {
      cm_warn("reshard: %s has no result: ps:0 stopped before it finished; "
              "the job goes on in the layout its checkpoints hold",
              plan);
      if (psd__live_put(plan, "result", INTERRUPTED)) {
        cm_error("reshard: cannot write %s/result: %s", plan, strerror(errno));
        rc = CM_EIO;
      }
      if (v >= newest) {
        newest = v;
        snprintf(last, lastlen, "%s", INTERRUPTED);
      }
      continue;
    }
    if (psd__live_get(plan, name, res, sizeof res) == CM_ENOENT)
      psd__live_put(plan, name, "restarted: its newest checkpoint stands");
    cm_info("reshard: %s is under way: waiting for ps:0 to finish it before "
            "loading a layout",
            plan);
    wait_result(plan, "to finish the reshard");
  }
  closedir(d);
  return rc;
}
