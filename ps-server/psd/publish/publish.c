/* The publisher and its thread (publish.h). One mutex guards the queue of
 * cuts, the chain's state and the last result; it is never held while
 * copying or writing. A cut owns copies of the values (dense rows copied
 * under each variable's lock, tables' publication snapshots); the thread
 * numbers it when it writes it, so a failed write's version is the next
 * one's and the versions on disk stay contiguous. */
#include "publish.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "dedup.h"
#include "err.h"
#include "log.h"
#include "pubfile.h"
#include "saver.h"
#include "store.h"
#include "table.h"
#include "tables.h"
#include "units.h"

/* One instant of the shard, waiting to be written. */
struct cut {
  struct psd_pub pub;            /* what is written; version set then */
  struct psd_table_snap **snaps; /* owned: each table's snapshot */
  uint64_t rows;                 /* table rows and removed ids in it */
  uint64_t removed;              /* removed ids in it */
  double t0;                     /* cm_mono_ms when the cut began */
  struct cut *next;              /* queue link */
};

/* What tells an async shard that there is something new to publish. */
struct mark {
  uint64_t step;     /* pushes applied */
  uint64_t evicted;  /* rows evicted, every table */
  uint64_t admitted; /* rows stored, every table: a pull stores a row too
                        (admission "always"), which no push counts */
  int nvars;         /* variables */
  int ntables;       /* tables */
  struct psd_pub_layout layout; /* the buckets the shard owns: a live
                                   move's hand-over is published even
                                   when no push followed it */
  int idle; /* a standby shard no move gave rows: nothing to publish */
};

struct psd_publisher {
  char dir[1024];              /* <root>/<job>/ps-<shard> */
  char mode[8];                /* "sync" or "async" */
  struct psd_publisher_opts o; /* borrowed pointers; strings below */
  char job[64];                /* job name */
  pthread_mutex_t lock;        /* guards everything below */
  pthread_cond_t wake;         /* the thread: a cut queued, or stop */
  struct cut *queue, **tail;   /* sync: cuts to write, oldest first */
  int stopping;                /* psd is stopping */
  int force_full;              /* the next cut is full (start, a failure) */
  int since_full;              /* cuts taken since the last full one */
  int chain_ok;                /* the last write worked: a delta may follow */
  uint64_t next_version;       /* the version the next write takes */
  uint64_t base;               /* the version of the chain's full one */
  struct mark last;            /* async: at the last cut */
  int have_last;               /* last is set */
  struct psd_publish_state state; /* last result */
  pthread_t thread;               /* the writer */
  int started;                    /* thread must be joined */
};

static void cut_free(struct cut *c) {
  if (!c)
    return;
  for (int i = 0; c->pub.dense && i < c->pub.ndense; i++)
    free(c->pub.dense[i].values);
  for (int i = 0; c->snaps && i < c->pub.ntables; i++)
    psd_table_snap_free(c->snaps[i]);
  free(c->pub.dense);
  free(c->pub.tables);
  free(c->snaps);
  free(c);
}

static int64_t now_unix_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Whether the next cut is full. Caller holds the lock. */
static int next_full(struct psd_publisher *p) {
  return p->force_full || p->since_full >= p->o.full_every - 1;
}

/* Counts a cut taken (full or not). Caller holds the lock. */
static void count_cut(struct psd_publisher *p, int full) {
  if (full) {
    p->force_full = 0;
    p->since_full = 0;
  } else {
    p->since_full++;
  }
}

/* A new cut, before its instant: its tables' snapshots prepared
 * (psd_table_snap_prepare: arrays allocated and touched while pushes go
 * on). NULL when out of memory. */
static struct cut *cut_prepare(struct psd_publisher *p, int full) {
  struct cut *c = calloc(1, sizeof *c);
  int nt = p->o.tables ? psd_tables_count(p->o.tables) : 0;
  if (!c)
    return NULL;
  c->t0 = cm_mono_ms();
  c->pub.full = full;
  /* room for every table: one declared before the instant is taken too */
  c->pub.tables = calloc(CM_TABLE_MAX + 1, sizeof *c->pub.tables);
  c->snaps = calloc(CM_TABLE_MAX + 1, sizeof *c->snaps);
  if (!c->pub.tables || !c->snaps)
    goto fail;
  for (int i = 0; i < nt && i < CM_TABLE_MAX; i++) {
    c->pub.ntables = i + 1; /* freed by cut_free */
    if (psd_table_snap_prepare(psd_tables_at(p->o.tables, i), 1, !full,
                               &c->snaps[i]))
      goto fail;
  }
  return c;
fail:
  cut_free(c);
  return NULL;
}

/* The layout the shard holds now (hold_layout's, else layout 0 of
 * nshards), its buckets held as they are when it returns 0 (release with
 * o.release_layout); 1: nothing to publish. */
static int hold_layout(struct psd_publisher *p, struct psd_pub_layout *out) {
  memset(out, 0, sizeof *out);
  out->shards = p->o.nshards;
  return p->o.hold_layout ? p->o.hold_layout(p->o.layout_ctx, out) : 0;
}

/* Copies the shard into cut c at its instant, its buckets held (cut_take),
 * its tables unsorted. Returns 0 or CM_ENOMEM. */
static int cut_copy(struct psd_publisher *p, struct cut *c, uint64_t step) {
  int n = psd_store_count(p->o.store);
  int nt = p->o.tables ? psd_tables_count(p->o.tables) : 0;
  c->pub.step = step;
  c->pub.time_unix_ms = now_unix_ms();
  c->pub.shard = p->o.shard;
  c->pub.rows = p->o.rows;
  snprintf(c->pub.job, sizeof c->pub.job, "%s", p->job);
  if (!(c->pub.dense = calloc((size_t)n + 1, sizeof *c->pub.dense)))
    return CM_ENOMEM;
  for (int i = 0; i < n; i++) {
    struct psd_var *v = psd_store_at(p->o.store, i);
    struct psd_pub_dense *d = &c->pub.dense[i];
    size_t len = (v->elem_end - v->elem_begin) * sizeof(float);
    snprintf(d->name, sizeof d->name, "%s", v->name);
    d->ndim = v->ndim;
    for (int k = 0; k < v->ndim; k++)
      d->shape[k] = v->shape[k];
    d->row_begin = v->row_begin;
    d->row_end = v->row_end;
    if (!(d->values = malloc(len + 1)))
      return CM_ENOMEM;
    c->pub.ndense = i + 1;
    pthread_mutex_lock(&v->lock);
    if (len) /* no rows here: value may be NULL */
      memcpy(d->values, v->value, len);
    pthread_mutex_unlock(&v->lock);
  }
  for (int i = 0; i < nt && i < CM_TABLE_MAX; i++) {
    struct psd_table *t = psd_tables_at(p->o.tables, i);
    if (i >= c->pub.ntables)
      c->pub.ntables = i + 1; /* declared since cut_prepare */
    if ((!c->snaps[i] &&
         psd_table_snap_prepare(t, 1, !c->pub.full, &c->snaps[i])) ||
        psd_table_snap_take(t, c->snaps[i]))
      return CM_ENOMEM;
    snprintf(c->pub.tables[i].name, sizeof c->pub.tables[i].name, "%s",
             psd_table_conf(t)->name);
  }
  return 0;
}

/* Copies the shard into cut c (cut_prepare's) at its instant (the caller
 * holds the shard still), its tables unsorted, with the layout it holds.
 * Returns 0, CM_EUNAVAIL when the shard has nothing to publish, or
 * CM_ENOMEM: the tables' cursors may have moved, so the next cut must be
 * full. */
static int cut_take(struct psd_publisher *p, struct cut *c, uint64_t step) {
  struct psd_pub_layout lay;
  int rc;
  if (hold_layout(p, &lay))
    return CM_EUNAVAIL; /* nothing to publish: not a failure */
  c->pub.layout = lay.layout;
  c->pub.shards = lay.shards;
  c->pub.move_to = lay.move_to;
  c->pub.moved = lay.moved;
  rc = cut_copy(p, c, step);
  if (p->o.release_layout)
    p->o.release_layout(p->o.layout_ctx);
  return rc;
}

/* After the instant: sorts c's tables' snapshots and points the
 * publication at them. Returns 0 or CM_ENOMEM. */
static int cut_sort(struct cut *c) {
  for (int i = 0; i < c->pub.ntables; i++) {
    struct psd_table_snap *s = c->snaps[i];
    struct psd_pub_table *pt = &c->pub.tables[i];
    if (psd_table_snap_sort(s))
      return CM_ENOMEM;
    pt->dim = s->dim;
    pt->nrows = s->nrows;
    pt->ids = s->ids;
    pt->values = s->values;
    pt->nremoved = s->nevicted;
    pt->removed = s->evicted;
    c->rows += s->nrows + s->nevicted;
    c->removed += s->nevicted;
  }
  return 0;
}

/* Records a failure to cut or write. Caller holds the lock. */
static void failed(struct psd_publisher *p, const char *what) {
  p->state.failed++;
  snprintf(p->state.error, sizeof p->state.error, "%s", what);
  p->force_full = 1;
  p->chain_ok = 0;
  p->have_last = 0; /* async: retried at the next interval, changed or not */
  cm_error("publication failed: %s; the next one is full, and serving keeps "
           "the last one written",
           what);
}

/* Writes c as the next version (the thread; lock not held). */
static void write_cut(struct psd_publisher *p, struct cut *c) {
  char err[1024] = "", size[32];
  uint64_t bytes = 0;
  int rc;
  pthread_mutex_lock(&p->lock);
  if (!c->pub.full && !p->chain_ok) {
    /* Taken before a write failed: the full one after it holds its rows. */
    pthread_mutex_unlock(&p->lock);
    cm_debug("publication of step %llu dropped: its chain broke",
             (unsigned long long)c->pub.step);
    return;
  }
  c->pub.version = p->next_version;
  c->pub.base = c->pub.full ? c->pub.version : p->base;
  c->pub.prev = c->pub.full ? 0 : c->pub.version - 1;
  pthread_mutex_unlock(&p->lock);
  if ((rc = cut_sort(c)))
    snprintf(err, sizeof err, "out of memory sorting the cut's tables");
  else
    rc = psd_pub_write(p->dir, &c->pub, p->mode, &bytes, err, sizeof err);
  if (!rc && c->pub.full)
    psd_pub_prune(p->dir, p->o.keep);
  double ms = cm_mono_ms() - c->t0;
  pthread_mutex_lock(&p->lock);
  if (rc) {
    failed(p, err[0] ? err : cm_strerror(rc));
  } else {
    p->next_version++;
    p->chain_ok = 1;
    if (c->pub.full)
      p->base = c->pub.version;
    p->state.version = c->pub.version;
    p->state.step = c->pub.step;
    p->state.full = c->pub.full;
    p->state.rows = c->rows;
    p->state.bytes = bytes;
    p->state.ms = ms;
    p->state.written++;
    p->state.error[0] = 0;
    p->state.time_unix_ms = c->pub.time_unix_ms;
  }
  pthread_mutex_unlock(&p->lock);
  if (!rc)
    cm_info("publication %llu (%s) of step %llu: %llu rows, %llu removed, %d "
            "variables, %s in %.0f ms",
            (unsigned long long)c->pub.version, c->pub.full ? "full" : "delta",
            (unsigned long long)c->pub.step,
            (unsigned long long)(c->rows - c->removed),
            (unsigned long long)c->removed, c->pub.ndense,
            cm_fmt_bytes((double)bytes, size, sizeof size), ms);
}

/* Async: what the shard is at now. */
static struct mark mark_now(struct psd_publisher *p) {
  struct mark m = {psd_saver_step(p->o.saver),
                   0,
                   0,
                   psd_store_count(p->o.store),
                   p->o.tables ? psd_tables_count(p->o.tables) : 0,
                   {0},
                   0};
  if (!(m.idle = hold_layout(p, &m.layout)) && p->o.release_layout)
    p->o.release_layout(p->o.layout_ctx);
  for (int i = 0; i < m.ntables; i++) {
    struct psd_table_stats ts;
    psd_table_stats(psd_tables_at(p->o.tables, i), &ts);
    m.evicted += ts.evicted;
    m.admitted += ts.admitted;
  }
  return m;
}

/* Whether nothing changed from b to a (field by field: no padding). */
static int same_mark(const struct mark *a, const struct mark *b) {
  return a->step == b->step && a->evicted == b->evicted &&
         a->admitted == b->admitted && a->nvars == b->nvars &&
         a->ntables == b->ntables && a->layout.layout == b->layout.layout &&
         a->layout.shards == b->layout.shards &&
         a->layout.move_to == b->layout.move_to &&
         a->layout.moved == b->layout.moved;
}

/* Async: a cut at the apply gate, when something changed since the last.
 * Lock held on entry and exit. */
static struct cut *async_cut(struct psd_publisher *p) {
  struct mark m = mark_now(p);
  if (m.idle) {
    p->have_last = 0; /* once it holds rows, a cut */
    return NULL;
  }
  if (p->have_last && same_mark(&m, &p->last))
    return NULL;
  int full = next_full(p);
  pthread_mutex_unlock(&p->lock);
  /* Not while a layout switch holds the variables frozen (store.h): the
   * next interval cuts, after it. */
  if (psd_store_hold_thawed(p->o.store, 0)) {
    pthread_mutex_lock(&p->lock);
    return NULL;
  }
  struct cut *c = cut_prepare(p, full);
  if (c && p->o.dedup)
    psd_dedup_freeze(p->o.dedup);
  m = mark_now(p); /* under the gate: the cut's own step */
  int rc = c ? cut_take(p, c, m.step) : CM_ENOMEM;
  if (c && p->o.dedup)
    psd_dedup_thaw(p->o.dedup);
  psd_store_release(p->o.store);
  pthread_mutex_lock(&p->lock);
  if (rc == CM_EUNAVAIL) { /* a standby shard: once it holds rows, a cut */
    cut_free(c);
    p->have_last = 0;
    return NULL;
  }
  if (rc) {
    cut_free(c);
    failed(p, "out of memory taking the cut");
    return NULL;
  }
  count_cut(p, full);
  p->last = m;
  p->have_last = 1;
  return c;
}

static void *publish_thread(void *arg) {
  struct psd_publisher *p = arg;
  double due = cm_mono_ms() + p->o.interval_s * 1000;
  pthread_mutex_lock(&p->lock);
  while (!p->stopping) {
    struct cut *c = NULL;
    if (p->o.sync) {
      if (!p->queue) {
        pthread_cond_wait(&p->wake, &p->lock);
        continue;
      }
      c = p->queue;
      if (!(p->queue = c->next))
        p->tail = &p->queue;
    } else {
      double now = cm_mono_ms();
      if (now < due) {
        struct timespec until = cm_abstime_after_ms((long)(due - now) + 1);
        pthread_cond_timedwait(&p->wake, &p->lock, &until);
        continue;
      }
      due = now + p->o.interval_s * 1000;
      if (!(c = async_cut(p)))
        continue;
    }
    pthread_mutex_unlock(&p->lock);
    write_cut(p, c);
    cut_free(c);
    pthread_mutex_lock(&p->lock);
  }
  pthread_mutex_unlock(&p->lock);
  return NULL;
}

void psd_publisher_cut(struct psd_publisher *p, uint64_t step) {
  pthread_mutex_lock(&p->lock);
  int full = next_full(p);
  if (p->stopping) {
    pthread_mutex_unlock(&p->lock);
    return;
  }
  pthread_mutex_unlock(&p->lock);
  /* commits are held: nothing moves */
  struct cut *c = cut_prepare(p, full);
  int rc = c ? cut_take(p, c, step) : CM_ENOMEM;
  if (rc) {
    cut_free(c);
    c = NULL;
  }
  pthread_mutex_lock(&p->lock);
  if (rc == CM_EUNAVAIL) {
    /* nothing to publish */
  } else if (!c) {
    failed(p, "out of memory taking the cut");
  } else {
    count_cut(p, full);
    *p->tail = c;
    p->tail = &c->next;
    pthread_cond_signal(&p->wake);
  }
  pthread_mutex_unlock(&p->lock);
}

int psd_publisher_new(struct psd_publisher **out,
                      const struct psd_publisher_opts *o, char *err,
                      size_t errlen) {
  struct psd_publisher *p = calloc(1, sizeof *p);
  uint64_t *v = NULL;
  size_t n = 0;
  int rc;
  *out = NULL;
  if (!p)
    return CM_ENOMEM;
  p->o = *o;
  if (p->o.full_every < 1)
    p->o.full_every = 1;
  if (p->o.keep < 1)
    p->o.keep = 1;
  if (p->o.interval_s <= 0)
    p->o.interval_s = 5;
  snprintf(p->job, sizeof p->job, "%s", o->job);
  snprintf(p->mode, sizeof p->mode, "%s", o->sync ? "sync" : "async");
  psd_pub_dir(o->root, o->job, o->shard, p->dir, sizeof p->dir);
  if ((rc = psd_pub_prepare(p->dir, err, errlen)) ||
      (rc = psd_pub_list(p->dir, &v, &n, err, errlen))) {
    free(p);
    return rc;
  }
  /* A restarted shard goes on after what it published before. */
  p->next_version = n ? v[n - 1] + 1 : 1;
  free(v);
  p->force_full = 1;
  p->tail = &p->queue;
  snprintf(p->state.dir, sizeof p->state.dir, "%s", p->dir);
  pthread_mutex_init(&p->lock, NULL);
  pthread_cond_init(&p->wake, NULL);
  cm_info("publishing to %s every %g s (%s; a full one every %d, %d full "
          "kept), from version %llu",
          p->dir, p->o.interval_s,
          o->sync ? "at the commits the coordinator marks" : "async",
          p->o.full_every, p->o.keep, (unsigned long long)p->next_version);
  *out = p;
  return 0;
}

int psd_publisher_start(struct psd_publisher *p) {
  if (pthread_create(&p->thread, NULL, publish_thread, p) != 0)
    return CM_ESYS;
  p->started = 1;
  return 0;
}

void psd_publisher_state(struct psd_publisher *p,
                         struct psd_publish_state *st) {
  pthread_mutex_lock(&p->lock);
  *st = p->state;
  pthread_mutex_unlock(&p->lock);
}

void psd_publisher_stop(struct psd_publisher *p) {
  pthread_mutex_lock(&p->lock);
  p->stopping = 1;
  pthread_cond_broadcast(&p->wake);
  pthread_mutex_unlock(&p->lock);
  if (p->started) {
    pthread_join(p->thread, NULL);
    p->started = 0;
  }
  while (p->queue) {
    struct cut *c = p->queue;
    p->queue = c->next;
    cut_free(c);
  }
  p->tail = &p->queue;
}

void psd_publisher_free(struct psd_publisher *p) {
  if (!p)
    return;
  psd_publisher_stop(p);
  pthread_mutex_destroy(&p->lock);
  pthread_cond_destroy(&p->wake);
  free(p);
}
