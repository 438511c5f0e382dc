/* Staged gradients and commits of a shard's synchronous steps (steps.h).
 * Each worker has one staging slot per variable, allocated on first use and
 * reused every step; a slot records which step its contents belong to, so
 * a commit ignores stale contents without clearing memory. */
#include "steps.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* One worker's staged gradient for one variable. */
struct slot {
  float *g;      /* owned, the variable's slice size; NULL until first used */
  uint64_t step; /* the step whose gradient g holds, valid when staged */
  int staged;    /* 1 when g holds a gradient for `step` */
};

/* The values at one step (steps.h). */
struct psd_steps_snap {
  atomic_int refs;    /* references: the steps' own and each answer's */
  uint64_t version;   /* steps committed when it was taken */
  uint64_t gen;       /* the job's generation then */
  int nvars;          /* variables in it: indices 0..nvars-1 */
  float **values;     /* owned array: variable i's slice, into buf */
  uint64_t *versions; /* owned array: variable i's version */
  float *buf;         /* owned: every variable's values, back to back */
};

struct psd_steps {
  struct psd_store *store;      /* borrowed */
  int nworkers;                 /* valid worker indices are 0..nworkers-1 */
  pthread_mutex_t lock;         /* guards everything below */
  uint64_t version;             /* steps committed */
  struct slot **slots;          /* owned: [worker] -> array of nslots */
  int nslots;                   /* slots allocated per worker */
  struct psd_step_record *hist; /* owned ring of PSD_STEPS_HISTORY records */
  uint64_t nhist;               /* records ever written */
  int resumed;                  /* restored from a checkpoint (resume) */
  uint64_t resumed_at;          /* the version it was restored at */
  uint64_t gen;                 /* the job's rollbacks (psd_steps_rollback) */
  uint64_t rollback_step;       /* the step of the last one, 0 when none */
  struct psd_steps_snap *snap;  /* the latest snapshot (one reference), or
                                   NULL */
  uint64_t slot_bytes;          /* bytes of every slot allocated: what a
                                   step's commit reads once every worker has
                                   staged (PSD_STEPS_STREAM_BYTES) */
};

int psd_steps_new(struct psd_steps **out, struct psd_store *store,
                  int nworkers) {
  struct psd_steps *s = calloc(1, sizeof *s);
  if (!s || nworkers > PSD_STEPS_MAX_WORKERS ||
      !(s->slots = calloc(nworkers, sizeof *s->slots)) ||
      !(s->hist = calloc(PSD_STEPS_HISTORY, sizeof *s->hist))) {
    if (s) {
      free(s->slots);
      free(s);
    }
    return nworkers > PSD_STEPS_MAX_WORKERS ? CM_EINVAL : CM_ENOMEM;
  }
  s->store = store;
  s->nworkers = nworkers;
  pthread_mutex_init(&s->lock, NULL);
  *out = s;
  return 0;
}

void psd_steps_free(struct psd_steps *s) {
  if (!s)
    return;
  for (int w = 0; w < s->nworkers; w++) {
    for (int i = 0; s->slots[w] && i < s->nslots; i++)
      free(s->slots[w][i].g);
    free(s->slots[w]);
  }
  free(s->slots);
  free(s->hist);
  psd_steps_snap_release(s->snap);
  pthread_mutex_destroy(&s->lock);
  free(s);
}

uint64_t psd_steps_version(struct psd_steps *s) {
  pthread_mutex_lock(&s->lock);
  uint64_t v = s->version;
  pthread_mutex_unlock(&s->lock);
  return v;
}

void psd_steps_resume(struct psd_steps *s, uint64_t version) {
  pthread_mutex_lock(&s->lock);
  s->version = version;
  s->resumed = 1;
  s->resumed_at = version;
  pthread_mutex_unlock(&s->lock);
}

/* After a restart, the first step's gradients staged before it are gone. A
 * worker in its set that staged nothing here since cannot be applied here
 * while the other shards apply it: returns the first such worker, or -1.
 * (A worker that staged some of its variables and not others is not told
 * apart from one that has no rows of those here.) Caller holds the lock. */
static int lost_worker(struct psd_steps *s, uint64_t step, const int *order,
                       int napplied) {
  int nvars = psd_store_count(s->store), rows = 0;
  if (!s->resumed || step != s->resumed_at)
    return -1;
  for (int i = 0; i < nvars; i++) {
    struct psd_var *v = psd_store_at(s->store, i);
    rows |= v->elem_end > v->elem_begin;
  }
  for (int k = 0; rows && k < napplied; k++) {
    int staged = 0;
    for (int i = 0; s->slots[order[k]] && i < s->nslots && !staged; i++)
      staged =
          s->slots[order[k]][i].staged && s->slots[order[k]][i].step == step;
    if (!staged)
      return order[k];
  }
  return -1;
}

/* Grows every worker's slot array to cover n variables. */
static int grow(struct psd_steps *s, int n) {
  if (n <= s->nslots)
    return 0;
  for (int w = 0; w < s->nworkers; w++) {
    struct slot *sl = realloc(s->slots[w], n * sizeof *sl);
    if (!sl)
      return CM_ENOMEM;
    memset(sl + s->nslots, 0, (n - s->nslots) * sizeof *sl);
    s->slots[w] = sl;
  }
  s->nslots = n;
  return 0;
}

/* Whether the slots are too many to stay in the caches from a worker's
 * stage to the step's commit (steps.h). Caller holds the lock. */
static int streaming(const struct psd_steps *s) {
  return s->slot_bytes > PSD_STEPS_STREAM_BYTES;
}

/* dst = src[0..n), staging a gradient. With stream, and where there are
 * (x86-64), with non-temporal stores, which write it to memory without
 * first reading dst's old contents into the caches: with many workers the
 * commit finds it in memory anyway. */
static void copy_stage(float *dst, const float *src, size_t n, int stream) {
#if defined(__x86_64__)
  size_t i = 0;
  if (!stream) {
    memcpy(dst, src, n * sizeof(float));
    return;
  }
  while (i < n && ((uintptr_t)(dst + i) & 15))
    dst[i] = src[i], i++;
  for (; i + 4 <= n; i += 4)
    _mm_stream_ps(dst + i, _mm_loadu_ps(src + i));
  for (; i < n; i++)
    dst[i] = src[i];
  _mm_sfence();
#else
  (void)stream;
  memcpy(dst, src, n * sizeof(float));
#endif
}

int psd_steps_stage(struct psd_steps *s, int worker, uint64_t step,
                    struct psd_var *v, uint64_t off, const float *g, size_t n,
                    char *err, size_t errlen) {
  uint64_t len = v->elem_end - v->elem_begin;
  int rc = 0;

  if (worker < 0 || worker >= s->nworkers) {
    snprintf(err, errlen, "push: worker %d out of range; the job has %d",
             worker, s->nworkers);
    return CM_EINVAL;
  }
  pthread_mutex_lock(&s->lock);
  if (step < s->version) {
    snprintf(err, errlen,
             "push to '%s' for step %llu from worker %d: step %llu is already "
             "closed (this shard has committed %llu steps; the open step is "
             "%llu); the gradient is dropped",
             v->name, (unsigned long long)step, worker,
             (unsigned long long)step, (unsigned long long)s->version,
             (unsigned long long)s->version);
    rc = CM_ERANGE;
    goto out;
  }
  if (step > s->version) {
    snprintf(err, errlen,
             "push to '%s' for step %llu from worker %d: this shard has "
             "committed %llu steps (the open step is %llu); pull the "
             "parameters of step %llu first",
             v->name, (unsigned long long)step, worker,
             (unsigned long long)s->version, (unsigned long long)s->version,
             (unsigned long long)step);
    rc = CM_EINVAL;
    goto out;
  }
  if ((rc = grow(s, v->index + 1)))
    goto out;
  struct slot *sl = &s->slots[worker][v->index];
  if (!sl->g) {
    if (!(sl->g = malloc((len ? len : 1) * sizeof(float)))) {
      rc = CM_ENOMEM;
      goto out;
    }
    s->slot_bytes += len * sizeof(float);
  }
  if (!sl->staged || sl->step != step) {
    /* First chunk of this step: parts not pushed count as zero. Only what
     * this chunk does not cover is cleared (a later chunk overwrites its
     * part), so a whole gradient in one chunk is written once, not twice. */
    memset(sl->g, 0, off * sizeof(float));
    memset(sl->g + off + n, 0, (len - off - n) * sizeof(float));
    sl->step = step;
    sl->staged = 1;
  }
  copy_stage(sl->g + off, g, n, streaming(s));
out:
  pthread_mutex_unlock(&s->lock);
  return rc;
}

static int cmp_int(const void *a, const void *b) {
  return *(const int *)a - *(const int *)b;
}

/* Elements summed at a time: a block of the sum and one of a gradient
 * (8 KiB each) stay in L1 while every worker's block is added. A multiple
 * of 8, so that the whole blocks' loops, of a count known here, vectorize
 * at -O2 (whose cost model vectorizes no loop that needs a scalar tail). */
#define SUM_BLOCK 2048

/* Floats in a cache line. */
#define LINE_FLOATS 16

/* acc and g are (SUM_BLOCK): acc = acc + g, element by element. next, the
 * block added after this one (NULL for none), is fetched meanwhile, a line
 * for each line added. */
static void add_block(float *restrict acc, const float *restrict g,
                      const float *next) {
  if (!next) {
    for (int e = 0; e < SUM_BLOCK; e++)
      acc[e] += g[e];
    return;
  }
  for (int e = 0; e < SUM_BLOCK; e += LINE_FLOATS) {
    __builtin_prefetch(next + e);
    for (int j = 0; j < LINE_FLOATS; j++)
      acc[e + j] += g[e + j];
  }
}

/* acc is (SUM_BLOCK): acc = acc * scale; next is fetched meanwhile, as
 * add_block's is. */
static void scale_block(float *restrict acc, float scale, const float *next) {
  if (!next) {
    for (int e = 0; e < SUM_BLOCK; e++)
      acc[e] *= scale;
    return;
  }
  for (int e = 0; e < SUM_BLOCK; e += LINE_FLOATS) {
    __builtin_prefetch(next + e);
    for (int j = 0; j < LINE_FLOATS; j++)
      acc[e + j] *= scale;
  }
}

/* Averages variable i's gradients staged for `step` by the workers of
 * order[0..napplied) (ascending), into the first staged one, and returns
 * it (NULL when none staged). Each element is summed in ascending worker
 * order, then scaled, as one loop per worker over the whole slice would;
 * block by block, so that each gradient is read once and the sum is not
 * written back to memory once per worker (with 32 workers a step's
 * gradients are larger than the caches). Caller holds the lock. */
static float *average(struct psd_steps *s, int i, uint64_t step,
                      const int *order, int napplied, uint64_t len) {
  const float *src[PSD_STEPS_MAX_WORKERS];
  float *acc = NULL, scale = 1.0f / (float)napplied;
  int stream = streaming(s);
  uint64_t b = 0;
  int nsrc = 0;
  for (int k = 0; k < napplied; k++) {
    struct slot *sl = &s->slots[order[k]][i];
    if (!sl->staged || sl->step != step)
      continue;
    if (!acc)
      acc = sl->g;
    else
      src[nsrc++] = sl->g;
  }
  if (!acc)
    return NULL;
  for (; b + SUM_BLOCK <= len; b += SUM_BLOCK) {
    /* Each block is fetched while the one before it is added: the next
     * worker's, and after the last worker's the sum's next block, then
     * (while scaling) the first worker's next block. */
    int more = stream && b + 2 * SUM_BLOCK <= len;
    for (int k = 0; k < nsrc; k++)
      add_block(acc + b, src[k] + b,
                stream && k + 1 < nsrc ? src[k + 1] + b
                : more                 ? acc + b + SUM_BLOCK
                                       : NULL);
    scale_block(acc + b, scale, more && nsrc ? src[0] + b + SUM_BLOCK : NULL);
  }
  for (int k = 0; k < nsrc; k++)
    for (uint64_t e = b; e < len; e++)
      acc[e] += src[k][e];
  for (uint64_t e = b; e < len; e++)
    acc[e] *= scale;
  return acc;
}

int psd_steps_commit(struct psd_steps *s, uint64_t step, const int *applied,
                     int napplied, const int *dropped, int ndropped, char *err,
                     size_t errlen) {
  int order[PSD_STEPS_MAX_WORKERS], rc = 0, nvars;

  if (napplied > PSD_STEPS_MAX_WORKERS || ndropped > PSD_STEPS_MAX_WORKERS) {
    snprintf(err, errlen, "commit: more workers than a job may have");
    return CM_EINVAL;
  }
  for (int i = 0; i < napplied; i++) {
    if (applied[i] < 0 || applied[i] >= s->nworkers) {
      snprintf(err, errlen, "commit: worker %d out of range", applied[i]);
      return CM_EINVAL;
    }
    order[i] = applied[i];
  }
  qsort(order, napplied, sizeof *order, cmp_int);
  pthread_mutex_lock(&s->lock);
  if (step + 1 == s->version)
    goto out; /* a retry of the last commit (its answer was lost) */
  if (step < s->version) {
    /* The coordinator waits for every shard before the next commit, so a
     * shard is never more than one step ahead of it. */
    snprintf(err, errlen,
             "commit of step %llu: this shard has committed %llu steps "
             "already",
             (unsigned long long)step, (unsigned long long)s->version);
    rc = CM_EINVAL;
    goto out;
  }
  if (step > s->version) {
    snprintf(err, errlen,
             "commit of step %llu: this shard has committed only %llu steps",
             (unsigned long long)step, (unsigned long long)s->version);
    rc = CM_EINVAL;
    goto out;
  }
  int lost = lost_worker(s, step, order, napplied);
  if (lost >= 0) {
    snprintf(err, errlen,
             "commit of step %llu: worker %d is in its set but staged nothing "
             "here since this shard resumed from its checkpoint at that step "
             "(what it pushed before was lost with the restart); refused, or "
             "the shards would differ",
             (unsigned long long)step, lost);
    rc = CM_EINVAL;
    goto out;
  }
  nvars = psd_store_count(s->store);
  for (int i = 0; i < nvars && napplied > 0; i++) {
    struct psd_var *v = psd_store_at(s->store, i);
    uint64_t len = v->elem_end - v->elem_begin;
    float *acc;
    if (len == 0 || i >= s->nslots ||
        !(acc = average(s, i, step, order, napplied, len)))
      continue;
    pthread_mutex_lock(&v->lock);
    psd_store_apply_step(s->store, v, acc, step);
    v->version = step + 1;
    pthread_mutex_unlock(&v->lock);
  }
  for (int w = 0; w < s->nworkers; w++)
    for (int i = 0; s->slots[w] && i < s->nslots; i++)
      s->slots[w][i].staged = 0;
  {
    struct psd_step_record *r = &s->hist[s->nhist % PSD_STEPS_HISTORY];
    r->step = step;
    r->napplied = napplied;
    for (int k = 0; k < napplied; k++)
      r->applied[k] = (int16_t)order[k];
    int d[PSD_STEPS_MAX_WORKERS];
    if (ndropped) /* dropped may be NULL when none are */
      memcpy(d, dropped, ndropped * sizeof *d);
    qsort(d, ndropped, sizeof *d, cmp_int);
    r->ndropped = ndropped;
    for (int k = 0; k < ndropped; k++)
      r->dropped[k] = (int16_t)d[k];
    s->nhist++;
  }
  s->version = step + 1;
out:
  pthread_mutex_unlock(&s->lock);
  return rc;
}

void psd_steps_rollback(struct psd_steps *s, uint64_t step, uint64_t gen) {
  pthread_mutex_lock(&s->lock);
  s->version = step;
  s->resumed = 0;
  s->gen = gen;
  s->rollback_step = step;
  for (int w = 0; w < s->nworkers; w++)
    for (int i = 0; s->slots[w] && i < s->nslots; i++)
      s->slots[w][i].staged = 0;
  /* Records are in step order: the newest go first. */
  while (s->nhist > 0 &&
         s->hist[(s->nhist - 1) % PSD_STEPS_HISTORY].step >= step)
    s->nhist--;
  pthread_mutex_unlock(&s->lock);
}

void psd_steps_state(struct psd_steps *s, struct psd_steps_state *out) {
  pthread_mutex_lock(&s->lock);
  out->version = s->version;
  out->gen = s->gen;
  out->rollback_step = s->rollback_step;
  out->resumed = s->resumed;
  pthread_mutex_unlock(&s->lock);
}

/* The records the ring holds; called with s->lock held. */
static uint64_t held(const struct psd_steps *s) {
  return s->nhist < PSD_STEPS_HISTORY ? s->nhist : PSD_STEPS_HISTORY;
}

int psd_steps_recorded(struct psd_steps *s) {
  pthread_mutex_lock(&s->lock);
  uint64_t n = held(s);
  pthread_mutex_unlock(&s->lock);
  return (int)n;
}

int psd_steps_history(struct psd_steps *s, struct psd_step_record *out,
                      int max) {
  pthread_mutex_lock(&s->lock);
  uint64_t n = held(s);
  if ((uint64_t)max < n)
    n = max;
  for (uint64_t i = 0; i < n; i++)
    out[i] = s->hist[(s->nhist - n + i) % PSD_STEPS_HISTORY];
  pthread_mutex_unlock(&s->lock);
  return (int)n;
}

void psd_steps_snap_hold(struct psd_steps_snap *sn, int n) {
  atomic_fetch_add(&sn->refs, n);
}

void psd_steps_snap_release(void *arg) {
  struct psd_steps_snap *sn = arg;
  if (!sn || atomic_fetch_sub(&sn->refs, 1) != 1)
    return;
  free(sn->values);
  free(sn->versions);
  free(sn->buf);
  free(sn);
}

/* Takes a snapshot of every variable. Caller holds the lock. */
static struct psd_steps_snap *snap_take(struct psd_steps *s) {
  struct psd_steps_snap *sn = calloc(1, sizeof *sn);
  int nvars = psd_store_count(s->store);
  uint64_t total = 0;
  if (!sn || !(sn->values = calloc(nvars + 1, sizeof *sn->values)) ||
      !(sn->versions = calloc(nvars + 1, sizeof *sn->versions)))
    goto fail;
  for (int i = 0; i < nvars; i++) {
    struct psd_var *v = psd_store_at(s->store, i);
    total += v->elem_end - v->elem_begin;
  }
  if (!(sn->buf = malloc((total ? total : 1) * sizeof(float))))
    goto fail;
  total = 0;
  for (int i = 0; i < nvars; i++) {
    struct psd_var *v = psd_store_at(s->store, i);
    uint64_t len = v->elem_end - v->elem_begin;
    sn->values[i] = sn->buf + total;
    pthread_mutex_lock(&v->lock);
    memcpy(sn->values[i], v->value, len * sizeof(float));
    sn->versions[i] = v->version;
    pthread_mutex_unlock(&v->lock);
    total += len;
  }
  atomic_init(&sn->refs, 1);
  sn->version = s->version;
  sn->gen = s->gen;
  sn->nvars = nvars;
  return sn;
fail:
  if (sn) {
    free(sn->values);
    free(sn->versions);
  }
  free(sn);
  return NULL;
}

struct psd_steps_snap *psd_steps_snap_get(struct psd_steps *s) {
  struct psd_steps_snap *sn;
  pthread_mutex_lock(&s->lock);
  sn = s->snap;
  /* Values change only with the version (a commit), the generation (a
   * rollback reloads them) or a declaration (a new variable). */
  if (!sn || sn->version != s->version || sn->gen != s->gen ||
      sn->nvars != psd_store_count(s->store)) {
    if ((sn = snap_take(s))) {
      psd_steps_snap_release(s->snap);
      s->snap = sn;
    }
  }
  if (sn)
    atomic_fetch_add(&sn->refs, 1);
  pthread_mutex_unlock(&s->lock);
  return sn;
}

const float *psd_steps_snap_values(const struct psd_steps_snap *sn,
                                   const struct psd_var *v, uint64_t *version) {
  if (v->index < 0 || v->index >= sn->nvars)
    return NULL;
  *version = sn->versions[v->index];
  return sn->values[v->index];
}
