/* The shard's variable store (store.h): a name table, per-variable slices
 * with their optimizer's slots, and the optimizer update. Initial values
 * come from common/vars/init.h, so a variable's initial values do not depend on
 * how it is sharded. */
#include "store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "err.h"
#include "init.h"
#include "layout.h"
#include "log.h"
#include "optstep.h"
#include "shape.h"

struct psd_store {
  int shard;                  /* this shard's index */
  int nshards;                /* shards in the job */
  struct cm_optim_set optims; /* where each variable's optimizer comes from */
  pthread_rwlock_t lock; /* guards vars and nvars (the table, not values) */
  struct psd_var **vars; /* owned, in declaration order */
  int nvars;             /* entries used */
  int cap;               /* entries allocated */
  int *index;            /* owned hash table of positions in vars, -1 for an
                            empty entry: a name is found in constant time
                            however many variables a request names */
  size_t icap;           /* entries in index: 0 or a power of two > 2 nvars */
  /* The switch gate (store.h): read-held by every call and snapshot that
   * uses the variables, written by a layout switch's freeze and commit. */
  pthread_rwlock_t gate;
  pthread_mutex_t frozen_lock; /* guards frozen's changes, for thawed */
  pthread_cond_t thawed;       /* broadcast when frozen goes to 0 */
  int frozen; /* 1: a layout switch froze the dense calls; written under
                 gate (write) and frozen_lock, read with __atomic loads */
};

int psd_store_new(struct psd_store **out, int shard, int nshards,
                  const struct cm_optim_set *optims) {
  struct psd_store *s = calloc(1, sizeof *s);
  if (!s)
    return CM_ENOMEM;
  s->shard = shard;
  s->nshards = nshards;
  s->optims = *optims;
  pthread_rwlock_init(&s->lock, NULL);
  pthread_rwlock_init(&s->gate, NULL);
  pthread_mutex_init(&s->frozen_lock, NULL);
  pthread_cond_init(&s->thawed, NULL);
  *out = s;
  return 0;
}

void psd_store_free(struct psd_store *s) {
  if (!s)
    return;
  for (int i = 0; i < s->nvars; i++) {
    pthread_mutex_destroy(&s->vars[i]->lock);
    free(s->vars[i]->value);
    free(s->vars[i]);
  }
  free(s->vars);
  free(s->index);
  pthread_rwlock_destroy(&s->lock);
  pthread_rwlock_destroy(&s->gate);
  pthread_mutex_destroy(&s->frozen_lock);
  pthread_cond_destroy(&s->thawed);
  free(s);
}

int psd_store_hold(struct psd_store *s) {
  pthread_rwlock_rdlock(&s->gate);
  return __atomic_load_n(&s->frozen, __ATOMIC_ACQUIRE);
}

void psd_store_release(struct psd_store *s) { pthread_rwlock_unlock(&s->gate); }

int psd_store_hold_thawed(struct psd_store *s, long wait_ms) {
  double until = cm_mono_ms() + (double)wait_ms;
  for (;;) {
    pthread_mutex_lock(&s->frozen_lock);
    while (s->frozen && cm_mono_ms() < until) {
      long left = (long)(until - cm_mono_ms()) + 1;
      struct timespec t = cm_abstime_after_ms(left < 100 ? left : 100);
      pthread_cond_timedwait(&s->thawed, &s->frozen_lock, &t);
    }
    int frozen = s->frozen;
    pthread_mutex_unlock(&s->frozen_lock);
    if (frozen)
      return CM_ETIMEDOUT;
    /* Frozen between the look and the lock: wait again. */
    if (!psd_store_hold(s))
      return 0;
    psd_store_release(s);
  }
}

/* Sets frozen (the caller holds the gate for writing). */
static void set_frozen(struct psd_store *s, int frozen) {
  pthread_mutex_lock(&s->frozen_lock);
  __atomic_store_n(&s->frozen, frozen, __ATOMIC_RELEASE);
  if (!frozen)
    pthread_cond_broadcast(&s->thawed);
  pthread_mutex_unlock(&s->frozen_lock);
}

void psd_store_freeze(struct psd_store *s, int frozen) {
  pthread_rwlock_wrlock(&s->gate);
  set_frozen(s, frozen);
  pthread_rwlock_unlock(&s->gate);
}

int psd_store_frozen(struct psd_store *s) {
  return __atomic_load_n(&s->frozen, __ATOMIC_ACQUIRE);
}

void psd_store_exclusive(struct psd_store *s) {
  pthread_rwlock_wrlock(&s->gate);
}

void psd_store_exclusive_end(struct psd_store *s, int thaw) {
  if (thaw)
    set_frozen(s, 0);
  pthread_rwlock_unlock(&s->gate);
}

void psd_store_replace(struct psd_store *s, struct psd_store *staged) {
  struct psd_store old = *s;
  pthread_rwlock_wrlock(&s->lock);
  s->nshards = staged->nshards;
  s->vars = staged->vars;
  s->nvars = staged->nvars;
  s->cap = staged->cap;
  s->index = staged->index;
  s->icap = staged->icap;
  pthread_rwlock_unlock(&s->lock);
  staged->nshards = old.nshards;
  staged->vars = old.vars;
  staged->nvars = old.nvars;
  staged->cap = old.cap;
  staged->index = old.index;
  staged->icap = old.icap;
}

int psd_store_nshards(const struct psd_store *s) { return s->nshards; }

void psd_shape_format(int ndim, const int64_t *shape, char *buf, size_t len) {
  size_t n = 0;
  n += snprintf(buf + n, len - n, "[");
  for (int i = 0; i < ndim && n < len; i++)
    n += snprintf(buf + n, len - n, "%s%lld", i ? ", " : "",
                  (long long)shape[i]);
  if (n < len)
    snprintf(buf + n, len - n, "]");
}

const struct cm_optim_set *psd_store_optims(const struct psd_store *s) {
  return &s->optims;
}

/* The index's hash of a name: the one name hash (the layout's). */
static size_t name_hash(const char *name) {
  return (size_t)cm_layout_name_hash(name);
}

/* The index is never more than half full, so every probe ends at an empty
 * entry. */
static struct psd_var *find_locked(struct psd_store *s, const char *name) {
  if (!s->icap)
    return NULL;
  for (size_t i = name_hash(name) & (s->icap - 1);;
       i = (i + 1) & (s->icap - 1)) {
    int k = s->index[i];
    if (k < 0)
      return NULL;
    if (strcmp(s->vars[k]->name, name) == 0)
      return s->vars[k];
  }
}

/* Puts position k in the index, which has room. */
static void index_put(struct psd_store *s, int k) {
  size_t i = name_hash(s->vars[k]->name) & (s->icap - 1);
  while (s->index[i] >= 0)
    i = (i + 1) & (s->icap - 1);
  s->index[i] = k;
}

/* Makes room in the index for one more variable, keeping it at most half
 * full. Caller holds the write lock. */
static int index_reserve(struct psd_store *s) {
  if ((size_t)(s->nvars + 1) * 2 <= s->icap)
    return 0;
  size_t cap = s->icap ? s->icap * 2 : 64;
  int *index = malloc(cap * sizeof *index);
  if (!index)
    return CM_ENOMEM;
  memset(index, 0xff, cap * sizeof *index); /* every entry -1 */
  free(s->index);
  s->index = index;
  s->icap = cap;
  for (int j = 0; j < s->nvars; j++)
    index_put(s, j);
  return 0;
}

struct psd_var *psd_store_find(struct psd_store *s, const char *name) {
  pthread_rwlock_rdlock(&s->lock);
  struct psd_var *v = find_locked(s, name);
  pthread_rwlock_unlock(&s->lock);
  return v;
}

int psd_store_count(struct psd_store *s) {
  pthread_rwlock_rdlock(&s->lock);
  int n = s->nvars;
  pthread_rwlock_unlock(&s->lock);
  return n;
}

struct psd_var *psd_store_at(struct psd_store *s, int i) {
  pthread_rwlock_rdlock(&s->lock);
  struct psd_var *v = i >= 0 && i < s->nvars ? s->vars[i] : NULL;
  pthread_rwlock_unlock(&s->lock);
  return v;
}

const struct cm_optim *psd_store_want(const struct psd_store *s,
                                      const char *name,
                                      const struct cm_optim *own, int *rule) {
  if (own) {
    if (rule)
      *rule = -1;
    return own;
  }
  return cm_optim_pick(&s->optims, name, rule);
}

void psd_store_optim_clash(const struct psd_var *v, const struct cm_optim *want,
                           int own, char *err, size_t errlen) {
  char desc[PSD_OPTIM_DESC];

  cm_optim_describe(want, desc, sizeof desc);
  snprintf(err, errlen,
           "variable '%s' already exists with optimizer %s (%s); this "
           "declaration asks for %s (%s)",
           v->name, v->optim_desc, v->own ? "its own, declared" : "the spec's",
           desc, own ? "its own" : "the spec's");
}

uint64_t psd_store_elem_bytes(const struct psd_store *s, const char *name,
                              const struct cm_optim *own) {
  const struct cm_optim *o = psd_store_want(s, name, own, NULL);
  return (uint64_t)(1 + cm_optim_nslots(o->type)) * sizeof(float);
}

uint64_t psd_var_bytes(const struct psd_store *s, const struct psd_var *v) {
  (void)s;
  return (uint64_t)(1 + v->nslots) * (v->elem_end - v->elem_begin) *
         sizeof(float);
}

uint64_t psd_var_steps(const struct psd_var *v) {
  uint64_t len = v->elem_end - v->elem_begin;
  return len ? (v->applied + len - 1) / len : 0;
}

static void init_values(struct psd_var *v, enum psd_init init, float scale,
                        uint64_t seed) {
  cm_init_fill(v->value, v->elem_begin, v->elem_end - v->elem_begin,
               init == PSD_INIT_UNIFORM ? CM_INIT_UNIFORM : CM_INIT_ZEROS,
               scale, seed, v->name);
}

/* psd_store_declare and psd_store_declare_values: given, when not NULL,
 * fills a variable this creates instead of init. */
static int declare(struct psd_store *s, const char *name, int ndim,
                   const int64_t *shape, int placement, enum psd_init init,
                   float init_scale, uint64_t seed, const float *given,
                   const struct cm_optim *own, struct psd_var **out,
                   int *created, char *err, size_t errlen) {
  char want[128], have[128];
  struct psd_var *v = NULL;
  const struct cm_optim *opt;
  int rule, bad;
  uint64_t numel, row_elems;
  int rc = 0;

  *created = 0;
  *out = NULL;
  if (!name[0] || strlen(name) > PSD_VAR_MAX_NAME) {
    snprintf(err, errlen, "variable name must be 1..%d bytes",
             PSD_VAR_MAX_NAME);
    return CM_EINVAL;
  }
  if (ndim < 1 || ndim > PSD_VAR_MAX_DIMS) {
    snprintf(err, errlen, "variable '%s': %d dimensions; expected 1..%d", name,
             ndim, PSD_VAR_MAX_DIMS);
    return CM_EINVAL;
  }
  if (!(numel = cm_numel(ndim, shape, PSD_VAR_MAX_ELEMS, &bad))) {
    psd_shape_format(ndim, shape, want, sizeof want);
    snprintf(err, errlen,
             "variable '%s': shape %s: dimension %d must be positive and the "
             "total under 2^40 elements",
             name, want, bad);
    return CM_EINVAL;
  }
  row_elems = cm_numel(ndim - 1, shape + 1, UINT64_MAX, NULL);
  if (placement < -1 || placement >= s->nshards) {
    snprintf(err, errlen,
             "variable '%s': placement %d; expected -1 (split) or a shard "
             "index 0..%d",
             name, placement, s->nshards - 1);
    return CM_EINVAL;
  }
  opt = psd_store_want(s, name, own, &rule);
  pthread_rwlock_wrlock(&s->lock);
  if ((v = find_locked(s, name))) {
    int same = v->ndim == ndim && v->placement == placement;
    for (int i = 0; same && i < ndim; i++)
      same = v->shape[i] == shape[i];
    if (!same) {
      psd_shape_format(v->ndim, v->shape, have, sizeof have);
      psd_shape_format(ndim, shape, want, sizeof want);
      snprintf(err, errlen,
               "variable '%s' already exists with shape %s placement %d; this "
               "declaration asks for shape %s placement %d",
               name, have, v->placement, want, placement);
      rc = CM_EEXIST;
      v = NULL;
    } else if (!cm_optim_same(&v->opt, opt)) {
      psd_store_optim_clash(v, opt, own != NULL, err, errlen);
      rc = CM_EEXIST;
      v = NULL;
    }
    goto out;
  }
  if ((rc = index_reserve(s)))
    goto out;
  if (s->nvars == s->cap) {
    int cap = s->cap ? s->cap * 2 : 16;
    struct psd_var **vars = realloc(s->vars, cap * sizeof *vars);
    if (!vars) {
      rc = CM_ENOMEM;
      goto out;
    }
    s->vars = vars;
    s->cap = cap;
  }
  if (!(v = calloc(1, sizeof *v))) {
    rc = CM_ENOMEM;
    goto out;
  }
  snprintf(v->name, sizeof v->name, "%s", name);
  v->ndim = ndim;
  memcpy(v->shape, shape, ndim * sizeof *shape);
  v->placement = placement;
  v->asked = CM_LAYOUT_UNSAID;
  v->numel = numel;
  cm_layout_rows(shape[0], placement, s->nshards, s->shard, &v->row_begin,
                 &v->row_end);
  v->elem_begin = (uint64_t)v->row_begin * row_elems;
  v->elem_end = (uint64_t)v->row_end * row_elems;
  v->opt = *opt;
  v->rule = rule;
  v->own = own != NULL;
  v->nslots = cm_optim_nslots(v->opt.type);
  cm_optim_describe(&v->opt, v->optim_desc, sizeof v->optim_desc);
  {
    /* Values, then each slot, each rounded up to 64 bytes so that every
     * tensor starts on a cache line. */
    uint64_t n = v->elem_end - v->elem_begin;
    size_t bytes = ((n ? n : 1) * sizeof(float) + 63) & ~(size_t)63;
    size_t total = (size_t)(1 + v->nslots) * bytes;
    void *mem = NULL;
    if (posix_memalign(&mem, 64, total) != 0) {
      snprintf(err, errlen, "variable '%s': cannot allocate %zu bytes", name,
               total);
      free(v);
      v = NULL;
      rc = CM_ENOMEM;
      goto out;
    }
    v->value = mem;
    for (int i = 0; i < v->nslots; i++) {
      v->slots[i] = (float *)((char *)mem + (size_t)(1 + i) * bytes);
      memset(v->slots[i], 0, n * sizeof(float));
    }
  }
  if (v->own)
    cm_info("'%s': optimizer %s (its own, declared)", v->name, v->optim_desc);
  else if (v->rule >= 0)
    cm_info("'%s': optimizer %s (job.optimizer_overrides[\"%s\"])", v->name,
            v->optim_desc, s->optims.rules[v->rule].pattern);
  /* Filled before the variable is in the table: no other thread (a pull, a
   * checkpoint) sees it without its values. */
  if (given)
    memcpy(v->value, given, (v->elem_end - v->elem_begin) * sizeof(float));
  else
    init_values(v, init, init_scale, seed);
  pthread_mutex_init(&v->lock, NULL);
  v->index = s->nvars;
  s->vars[s->nvars] = v;
  index_put(s, s->nvars++);
  *created = 1;
out:
  pthread_rwlock_unlock(&s->lock);
  *out = v;
  return rc;
}

void psd_store_set_asked(struct psd_var *v, int asked, uint64_t creator) {
  pthread_mutex_lock(&v->lock);
  v->asked = asked;
  v->creator = creator;
  pthread_mutex_unlock(&v->lock);
}

int psd_store_created_by(struct psd_var *v, uint64_t client) {
  pthread_mutex_lock(&v->lock);
  int mine = client && v->creator == client;
  pthread_mutex_unlock(&v->lock);
  return mine;
}

int psd_store_declare(struct psd_store *s, const char *name, int ndim,
                      const int64_t *shape, int placement, enum psd_init init,
                      float init_scale, uint64_t seed,
                      const struct cm_optim *own, struct psd_var **out,
                      int *created, char *err, size_t errlen) {
  return declare(s, name, ndim, shape, placement, init, init_scale, seed, NULL,
                 own, out, created, err, errlen);
}

int psd_store_declare_values(struct psd_store *s, const char *name, int ndim,
                             const int64_t *shape, int placement,
                             const float *values, const struct cm_optim *own,
                             struct psd_var **out, int *created, char *err,
                             size_t errlen) {
  return declare(s, name, ndim, shape, placement, PSD_INIT_ZEROS, 0, 0, values,
                 own, out, created, err, errlen);
}

/* Runs v's update on elements [off, off + n) as update `step` (1-based). */
static void apply(struct psd_var *v, uint64_t off, const float *g, size_t n,
                  uint64_t step) {
  float *slots[CM_OPTIM_MAX_SLOTS];

  for (int i = 0; i < CM_OPTIM_MAX_SLOTS; i++)
    slots[i] = v->slots[i] ? v->slots[i] + off : NULL;
  cm_optim_apply(&v->opt, step - 1, v->value + off, slots, g, n);
}

void psd_store_apply(struct psd_store *s, struct psd_var *v, uint64_t off,
                     const float *g, size_t n) {
  uint64_t len = v->elem_end - v->elem_begin;
  (void)s;
  if (!n || !len)
    return;
  v->applied += n;
  apply(v, off, g, n, (v->applied + len - 1) / len);
}

void psd_store_apply_step(struct psd_store *s, struct psd_var *v,
                          const float *g, uint64_t step) {
  uint64_t len = v->elem_end - v->elem_begin;
  (void)s;
  if (!len)
    return;
  v->applied = (step + 1) * len;
  apply(v, 0, g, len, step + 1);
}
