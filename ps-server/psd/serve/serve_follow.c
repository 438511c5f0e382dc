/* A serving task's follower (serve.h): at every look at the training
 * shard's publication directory, which version to read next.
 *
 * Following: the version after the one held, then the next, as long as
 * they are there. A version missing while a later one is there is a
 * skipped version; a version the reader finds damaged (a checksum, a
 * size, a truncated file, another job or shard: pubfile.h) is refused;
 * either breaks the chain: the task keeps answering from the version it
 * holds, and loads nothing but a full publication newer than the break.
 *
 * Starting (nothing held yet), or after a break: the newest version is
 * read; a full one is loaded, a delta names the full one its chain starts
 * at (its base), which is loaded, then the deltas up to the newest. A
 * delta whose base is not newer than the break waits for the next full
 * publication (the newest version is then not read again until a newer
 * one appears).
 *
 * Every refusal is an error line naming the file or version and what is
 * wrong, counted in ServingStatus.refused, and kept as last_refusal. A
 * version refused is never read again. */
#include "serve_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "err.h"
#include "log.h"
#include "pubfile.h"

/* Logs and counts the refusal of version v (why: what is wrong), which no
 * later look reads again, and waits for a full publication after it. */
static void refuse(struct psd_serve *s, uint64_t v, const char *why) {
  char line[1024];
  snprintf(line, sizeof line,
           "publication %.300s/pub-%010llu refused: %.500s; answers stay at "
           "version %llu until a full publication after it",
           s->dir, (unsigned long long)v, why, (unsigned long long)s->version);
  cm_error("%s", line);
  pthread_mutex_lock(&s->stat_lock);
  s->refused++;
  snprintf(s->last_refusal, sizeof s->last_refusal, "%s", line);
  pthread_mutex_unlock(&s->stat_lock);
  s->need_full = 1;
  if (v > s->floor)
    s->floor = v;
}

/* Reads version v: 0 with *out, 1 when it vanished meanwhile (pruned:
 * looked at again next time), -1 once refused. */
static int read_pub(struct psd_serve *s, uint64_t v, struct psd_pub **out) {
  char err[1024];
  int rc = psd_pub_read(s->dir, v, s->job, s->shard, 0, out, err, sizeof err);
  if (rc == CM_ENOENT)
    return 1;
  if (rc == CM_ENOMEM) {
    cm_error("publication %s/pub-%010llu: out of memory reading it; tried "
             "again at the next look",
             s->dir, (unsigned long long)v);
    return 1;
  }
  if (rc) {
    refuse(s, v, err);
    return -1;
  }
  return 0;
}

/* Applies p; returns 0, or -1 once refused. Frees p. */
static int apply(struct psd_serve *s, struct psd_pub *p) {
  char err[1024];
  double t0 = cm_mono_ms();
  uint64_t rows = 0, removed = 0;
  for (int i = 0; i < p->ntables; i++) {
    rows += p->tables[i].nrows;
    removed += p->tables[i].nremoved;
  }
  int rc = psd_serve_apply(s, p, err, sizeof err);
  if (rc)
    refuse(s, p->version, err);
  else {
    pthread_mutex_lock(&s->stat_lock);
    s->applied++;
    pthread_mutex_unlock(&s->stat_lock);
    cm_info("serving version %llu (%s, step %llu): %llu rows, %llu removed, "
            "%d dense variables, applied in %.1f ms",
            (unsigned long long)p->version, p->full ? "full" : "delta",
            (unsigned long long)p->step, (unsigned long long)rows,
            (unsigned long long)removed, p->ndense, cm_mono_ms() - t0);
  }
  psd_pub_free(p);
  return rc ? -1 : 0;
}

/* Whether v is among list[0..n) (ascending). */
static int listed(const uint64_t *list, size_t n, uint64_t v) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (list[mid] == v)
      return 1;
    if (list[mid] < v)
      lo = mid + 1;
    else
      hi = mid;
  }
  return 0;
}

/* Applies the versions after the one held while they are there; refuses a
 * gap before a later one. */
static void follow(struct psd_serve *s, const uint64_t *list, size_t n) {
  while (!s->need_full) {
    uint64_t next = s->version + 1;
    struct psd_pub *p;
    if (!listed(list, n, next)) {
      if (list[n - 1] > next) {
        char why[256];
        uint64_t after = 0;
        for (size_t i = 0; i < n && !after; i++)
          if (list[i] > next)
            after = list[i];
        snprintf(why, sizeof why,
                 "version %llu is missing (skipped): the directory goes on "
                 "at version %llu",
                 (unsigned long long)next, (unsigned long long)after);
        refuse(s, next, why);
      }
      return;
    }
    if (read_pub(s, next, &p) || apply(s, p))
      return;
  }
}

/* Nothing held, or the chain broke: loads the newest full publication
 * after the break (the newest version's, or its base), then follows. */
static void start(struct psd_serve *s, const uint64_t *list, size_t n) {
  uint64_t newest = list[n - 1], base;
  struct psd_pub *p;
  int rc;
  if (newest <= s->floor || newest == s->checked)
    return;
  if ((rc = read_pub(s, newest, &p)))
    return;
  if (p->full) {
    if (!apply(s, p))
      follow(s, list, n);
    return;
  }
  base = p->base;
  psd_pub_free(p);
  if (base <= s->floor || !listed(list, n, base)) {
    /* Said once per newest version: the next full one is awaited. */
    s->checked = newest;
    cm_info("publications: the newest, version %llu, is a delta of full "
            "version %llu%s; waiting for a full publication after version "
            "%llu",
            (unsigned long long)newest, (unsigned long long)base,
            listed(list, n, base) ? "" : " (not in the directory)",
            (unsigned long long)s->floor);
    return;
  }
  if (read_pub(s, base, &p))
    return;
  if (!p->full) {
    refuse(s, base,
           "it is the base of a later delta but not a full "
           "publication");
    psd_pub_free(p);
    return;
  }
  if (!apply(s, p))
    follow(s, list, n);
}

void psd_serve_poll(struct psd_serve *s) {
  uint64_t *list = NULL;
  size_t n = 0;
  char err[1024];
  int rc = psd_pub_list(s->dir, &list, &n, err, sizeof err);
  if (rc) {
    /* Before the shard's first publication the directory may not exist:
     * said once, as any other failure to list it. */
    if (!s->list_failed)
      cm_log(rc == CM_ENOENT ? CM_LOG_INFO : CM_LOG_WARN,
             "publications: cannot list %s yet (%s); looking again every "
             "%d ms",
             s->dir, err, PSD_SERVE_POLL_MS);
    s->list_failed = 1;
    goto out;
  }
  s->list_failed = 0;
  if (!n)
    goto out;
  pthread_mutex_lock(&s->stat_lock);
  if (list[n - 1] > s->newest_seen)
    s->newest_seen = list[n - 1];
  pthread_mutex_unlock(&s->stat_lock);
  /* Versions are never reused: a directory whose newest is older than the
   * version held was emptied or replaced. Said once; answers stay. */
  if (list[n - 1] < s->version && !s->went_back)
    cm_warn("publications: the newest in %s is version %llu, older than "
            "version %llu held: were publications removed? answers stay at "
            "version %llu (restart this task to load the directory's)",
            s->dir, (unsigned long long)list[n - 1],
            (unsigned long long)s->version, (unsigned long long)s->version);
  s->went_back = list[n - 1] < s->version;
  if (s->version && !s->need_full)
    follow(s, list, n);
  else
    start(s, list, n);
out:
  free(list);
}
