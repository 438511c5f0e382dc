/* An embedding table's rows on one shard (table.h): stripes, each a mutex
 * over its records, their index (rows.h), their bucket index (records
 * linked by bucket group: created, removed, cleared here) and a map of
 * pending (not admitted) ids; pull, push, admission and the statistics. */
#include "table.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "init.h"
#include "layout.h"
#include "optstep.h"
#include "rand.h"
#include "table_internal.h"

int psd_table_new(struct psd_table **out, const struct cm_table_conf *conf,
                  uint64_t seed, char *err, size_t errlen) {
  if (conf->dim < 1 || conf->dim > CM_TABLE_MAX_DIM) {
    snprintf(err, errlen, "table '%s': dim %u; expected 1..%d", conf->name,
             conf->dim, CM_TABLE_MAX_DIM);
    return CM_EINVAL;
  }
  struct psd_table *t = calloc(1, sizeof *t);
  if (!t)
    return CM_ENOMEM;
  t->conf = *conf;
  t->seed = seed;
  t->nstate = cm_rowopt_nstate(conf->opt.type, conf->dim);
  size_t rsize = sizeof(struct rec) + (conf->dim + t->nstate) * sizeof(float);
  t->gen = 1;
  for (int i = 0; i < PSD__NSTRIPES; i++) {
    pthread_mutex_init(&t->st[i].lock, NULL);
    psd_rows_init(&t->st[i].rows, (rsize + 7) & ~(size_t)7);
    t->st[i].hbits = PSD__HBITS_MIN;
  }
  pthread_mutex_init(&t->stat_lock, NULL);
  *out = t;
  return 0;
}

void psd_table_free(struct psd_table *t) {
  if (!t)
    return;
  for (int i = 0; i < PSD__NSTRIPES; i++) {
    struct stripe *s = &t->st[i];
    psd_rows_release(&s->rows);
    free(s->heads);
    free(s->pend);
    for (int c = 0; c < PSD__NCURSORS; c++)
      free(s->ev[c].ids);
    free(s->changed.ids);
    pthread_mutex_destroy(&s->lock);
  }
  pthread_mutex_destroy(&t->stat_lock);
  free(t);
}

const struct cm_table_conf *psd_table_conf(const struct psd_table *t) {
  return &t->conf;
}

uint32_t psd_table_nstate(const struct psd_table *t) { return t->nstate; }

/* Under s's lock: puts record k (live, its id set) first on its group's
 * list. */
static void link_rec(struct stripe *s, uint32_t k) {
  struct rec *r = psd__rec_at(s, k);
  uint32_t *head = &s->heads[psd__group_of(s, psd__bucket_of(r->id))];
  r->prev = 0;
  r->next = *head;
  if (*head)
    psd__rec_at(s, *head - 1)->prev = k + 1;
  *head = k + 1;
}

/* Under s's lock: twice the heads, every live record linked again (as
 * the rows' index grows: amortized, a few visits a row). Out of memory,
 * the index stays as it was, right but coarser. */
static void regroup(struct stripe *s) {
  uint32_t *heads = calloc((size_t)1 << (s->hbits + 1), sizeof *heads);
  if (!heads)
    return;
  free(s->heads);
  s->heads = heads;
  s->hbits++;
  for (size_t k = 0; k < psd_rows_used(&s->rows); k++)
    if (psd__rec_live(psd__rec_at(s, k)))
      link_rec(s, (uint32_t)k);
}

/* Creates id's record in s (initial row and state). Returns its number or
 * -1 when out of memory. */
long psd__table_create(struct psd_table *t, struct stripe *s, uint64_t id,
                       uint64_t h) {
  if (!s->heads &&
      !(s->heads = calloc((size_t)1 << s->hbits, sizeof *s->heads)))
    return -1;
  long k = psd_rows_add(&s->rows, id, h);
  if (k < 0)
    return -1;
  struct rec *r = psd__rec_at(s, (size_t)k);
  memset(r, 0, sizeof *r);
  r->id = id;
  r->gen = psd__gen_now(t);
  psd__note_change(t, s, id);
  link_rec(s, (uint32_t)k);
  cm_table_init_row(&t->conf, t->seed, id, psd__rec_val(r));
  cm_rowopt_init_state(&t->conf.opt, t->conf.dim, psd__rec_val(r),
                       psd__rec_val(r) + t->conf.dim);
  if (psd_rows_live(&s->rows) > ((size_t)PSD__GROUP_ROWS << s->hbits) &&
      s->hbits < CM_LAYOUT_BUCKET_BITS)
    regroup(s);
  return k;
}

void psd__table_remove(struct stripe *s, size_t k) {
  struct rec *r = psd__rec_at(s, k);
  if (r->prev)
    psd__rec_at(s, r->prev - 1)->next = r->next;
  else
    s->heads[psd__group_of(s, psd__bucket_of(r->id))] = r->next;
  if (r->next)
    psd__rec_at(s, r->next - 1)->prev = r->prev;
  psd_rows_remove(&s->rows, r->id, psd_rows_hash(r->id));
  r->prev = PSD__REC_FREE;
}

void psd__table_clear(struct stripe *s) {
  psd_rows_clear(&s->rows);
  if (s->heads)
    memset(s->heads, 0, ((size_t)1 << s->hbits) * sizeof *s->heads);
}

/* The pending slot of id in s (NULL when none and create is 0). */
static struct pend *pend_of(struct stripe *s, uint64_t id, int create_) {
  if (!s->pcap) {
    if (!create_)
      return NULL;
    if (!(s->pend = calloc(64, sizeof *s->pend)))
      return NULL;
    s->pcap = 64;
  }
  if (create_ && (s->npend + 1) * 2 > s->pcap) {
    size_t cap = s->pcap * 2;
    struct pend *p = calloc(cap, sizeof *p);
    if (!p)
      return NULL;
    for (size_t k = 0; k < s->pcap; k++)
      if (s->pend[k].count) {
        size_t i = (size_t)psd_rows_hash(s->pend[k].id) & (cap - 1);
        while (p[i].count)
          i = (i + 1) & (cap - 1);
        p[i] = s->pend[k];
      }
    free(s->pend);
    s->pend = p;
    s->pcap = cap;
  }
  size_t m = s->pcap - 1, i = (size_t)psd_rows_hash(id) & m;
  for (;; i = (i + 1) & m) {
    if (!s->pend[i].count)
      return create_ ? &s->pend[i] : NULL;
    if (s->pend[i].id == id)
      return &s->pend[i];
  }
}

/* A batch's positions grouped by stripe, with their ids' hashes: ord[j]
 * is a position, h[j] its id's psd_rows_hash (h: 2n entries),
 * first[k]..first[k + 1] stripe k's run (a counting sort; each hash
 * computed once). */
static void group_hashed(const uint64_t *ids, size_t n, uint32_t *ord,
                         uint64_t *h, size_t first[PSD__NSTRIPES + 1]) {
  size_t at[PSD__NSTRIPES];
  memset(first, 0, (PSD__NSTRIPES + 1) * sizeof *first);
  /* h holds the hashes in position order first, then moves them into
   * stripe order behind the sort, through ord's spare upper half of h. */
  for (size_t i = 0; i < n; i++)
    first[psd_rows_stripe(h[n + i] = psd_rows_hash(ids[i])) + 1]++;
  for (int k = 0; k < PSD__NSTRIPES; k++)
    first[k + 1] += first[k];
  memcpy(at, first, sizeof at);
  for (size_t i = 0; i < n; i++) {
    size_t j = at[psd_rows_stripe(h[n + i])]++;
    ord[j] = (uint32_t)i;
    h[j] = h[n + i];
  }
}

int psd_table_pull(struct psd_table *t, const uint64_t *ids, size_t n,
                   float *out) {
  uint32_t dim = t->conf.dim;
  uint64_t na = 0, adm = 0;
  size_t first[PSD__NSTRIPES + 1], nmiss = 0;
  /* Positions, and hashes (2n: position order, then stripe order). */
  uint32_t *ord = malloc((n + 1) * sizeof *ord);
  uint64_t *h = malloc((2 * n + 1) * sizeof *h);
  int rc = 0;
  if (!ord || !h) {
    rc = CM_ENOMEM;
    goto out;
  }
  /* A stripe's ids under one hold of its lock, in three passes so that the
   * memory of the next ids is on its way while one is read: the index
   * slots, then the records (head and value), then the rows copied
   * straight into out. */
  group_hashed(ids, n, ord, h, first);
  for (int k = 0; k < PSD__NSTRIPES && !rc; k++) {
    struct stripe *s = &t->st[k];
    size_t a = first[k], b = first[k + 1];
    if (a == b)
      continue;
    pthread_mutex_lock(&s->lock);
    size_t vend = sizeof(struct rec) + dim * sizeof(float);
    psd_rows_prefetch(&s->rows, h + a, b - a, vend);
    for (size_t j = a; j < b; j++) {
      uint64_t id = ids[ord[j]];
      long r = psd_rows_find(&s->rows, id, h[j]);
      if (r < 0 && t->conf.admit == CM_ADMIT_ALWAYS) {
        if ((r = psd__table_create(t, s, id, h[j])) < 0) {
          rc = CM_ENOMEM;
          break;
        }
        adm++;
      }
      if (r >= 0)
        memcpy(out + (size_t)ord[j] * dim,
               psd__rec_val(psd__rec_at(s, (size_t)r)), dim * sizeof(float));
      else
        ord[nmiss++] = ord[j]; /* j >= nmiss: that entry is read already */
    }
    pthread_mutex_unlock(&s->lock);
  }
  /* Ids not admitted get their initial row, made outside any lock. */
  for (size_t i = 0; !rc && i < nmiss; i++) {
    cm_table_init_row(&t->conf, t->seed, ids[ord[i]],
                      out + (size_t)ord[i] * dim);
    na++;
  }
  pthread_mutex_lock(&t->stat_lock);
  t->rows_pulled += n;
  t->not_admitted += na;
  t->admitted += adm;
  pthread_mutex_unlock(&t->stat_lock);
out:
  free(ord);
  free(h);
  return rc;
}

/* Whether a push of id (its count-th, 1-based) admits it. */
static int admits(const struct psd_table *t, uint64_t id, uint32_t count) {
  switch (t->conf.admit) {
  case CM_ADMIT_COUNT:
    return count >= t->conf.admit_count;
  case CM_ADMIT_PROB: {
    uint64_t h =
        cm_mix64(cm_splitmix64_at(t->seed ^ cm_layout_name_hash(t->conf.name)) ^
                 cm_splitmix64_at(id) ^ count);
    return (double)(h >> 11) * (1.0 / 9007199254740992.0) < t->conf.admit_prob;
  }
  default:
    return 1;
  }
}

/* What one push counted. */
struct pushed {
  uint64_t applied; /* rows updated */
  uint64_t na;      /* ids counted, not applied (not admitted) */
  uint64_t adm;     /* rows admitted */
};

/* Under s's lock: applies the summed gradient gs of id (hash h; carried by
 * occ of the pushes applied together, each counted once however many times
 * it names id), or counts it towards its admission. */
static int apply_one(struct psd_table *t, struct stripe *s, uint64_t id,
                     uint64_t h, const float *gs, uint32_t occ, uint64_t step,
                     struct pushed *c) {
  uint32_t dim = t->conf.dim;
  long k = psd_rows_find(&s->rows, id, h);
  uint32_t before = 0;
  if (k < 0) {
    struct pend *p =
        t->conf.admit == CM_ADMIT_ALWAYS ? NULL : pend_of(s, id, 0);
    before = p ? p->count : 0;
    if (admits(t, id, before + occ)) {
      if (p) {
        p->count = 0; /* leaves the map: rebuild lazily */
        s->npend--;
        /* Re-insert the others of the probe run. */
        size_t m = s->pcap - 1, i = (size_t)(p - s->pend);
        for (size_t j = (i + 1) & m; s->pend[j].count; j = (j + 1) & m) {
          struct pend e = s->pend[j];
          s->pend[j].count = 0;
          s->npend--;
          struct pend *q = pend_of(s, e.id, 1);
          *q = e;
          s->npend++;
        }
      }
      if ((k = psd__table_create(t, s, id, h)) < 0)
        return CM_ENOMEM;
      c->adm++;
    } else {
      if (!p && (p = pend_of(s, id, 1))) {
        p->id = id;
        s->npend++;
      }
      if (p)
        p->count = before + occ;
      c->na++;
    }
  }
  if (k >= 0) {
    struct rec *r = psd__rec_at(s, (size_t)k);
    cm_rowopt_apply(&t->conf.opt, dim, psd__rec_val(r), psd__rec_val(r) + dim,
                    &r->t, gs);
    r->count += before + occ;
    r->last_step = step;
    r->gen = psd__gen_now(t);
    psd__note_change(t, s, id);
    c->applied++;
  }
  return 0;
}

int psd_table_push(struct psd_table *t, const uint64_t *ids, size_t n,
                   const float *g, float scale, uint64_t step) {
  return psd_table_push_runs(t, ids, n, g, scale, step, &n, 1);
}

int psd_table_push_runs(struct psd_table *t, const uint64_t *ids, size_t n,
                        const float *g, float scale, uint64_t step,
                        const size_t *ends, size_t nruns) {
  uint32_t dim = t->conf.dim;
  /* Unique ids with their summed gradients, first occurrence order; occ
   * counts the runs naming each, last the latest of them. */
  size_t cap = 16, run = 0, pushes = 0;
  while (cap < 2 * n)
    cap *= 2;
  long *slot = malloc(cap * sizeof *slot);
  size_t *uniq = malloc((n + 1) * sizeof *uniq), nu = 0;
  uint32_t *occ = malloc((n + 1) * sizeof *occ);
  size_t *last = malloc((n + 1) * sizeof *last);
  float *sum = malloc(((n + 1) * dim) * sizeof *sum);
  uint64_t *ids_u = malloc((n + 1) * sizeof *ids_u);
  uint32_t *ord = malloc((n + 1) * sizeof *ord);
  uint64_t *hu = malloc((2 * n + 1) * sizeof *hu); /* group_hashed's */
  size_t first[PSD__NSTRIPES + 1];
  struct pushed c = {0};
  int rc = 0;
  if (!slot || !uniq || !occ || !last || !sum || !ids_u || !ord || !hu) {
    rc = CM_ENOMEM;
    goto out;
  }
  for (size_t i = 0; i < cap; i++)
    slot[i] = -1;
  /* Runs that name ids: the pushes this call applies. */
  for (size_t r = 0, from = 0; r < nruns; from = ends[r++])
    pushes += ends[r] > from;
  for (size_t i = 0; i < n; i++) {
    while (run < nruns && i >= ends[run])
      run++;
    size_t h = (size_t)psd_rows_hash(ids[i]) & (cap - 1);
    while (slot[h] >= 0 && ids[uniq[slot[h]]] != ids[i])
      h = (h + 1) & (cap - 1);
    if (slot[h] < 0) {
      slot[h] = (long)nu;
      uniq[nu] = i;
      occ[nu] = 1;
      last[nu] = run;
      memcpy(sum + nu * dim, g + i * dim, dim * sizeof *sum);
      nu++;
    } else {
      size_t u = (size_t)slot[h];
      if (last[u] != run) {
        occ[u]++;
        last[u] = run;
      }
      for (uint32_t j = 0; j < dim; j++)
        sum[u * dim + j] += g[i * dim + j];
    }
  }
  for (size_t u = 0; u < nu; u++) {
    ids_u[u] = ids[uniq[u]];
    if (scale != 1.0f)
      for (uint32_t j = 0; j < dim; j++)
        sum[u * dim + j] *= scale;
  }
  /* Each stripe's rows under one hold of its lock, their index slots and
   * records' heads fetched ahead. */
  group_hashed(ids_u, nu, ord, hu, first);
  for (int k = 0; k < PSD__NSTRIPES && !rc; k++) {
    struct stripe *s = &t->st[k];
    if (first[k] == first[k + 1])
      continue;
    pthread_mutex_lock(&s->lock);
    psd_rows_prefetch(&s->rows, hu + first[k], first[k + 1] - first[k],
                      sizeof(struct rec));
    for (size_t j = first[k]; !rc && j < first[k + 1]; j++) {
      size_t u = ord[j];
      rc = apply_one(t, s, ids_u[u], hu[j], sum + u * dim, occ[u], step, &c);
    }
    pthread_mutex_unlock(&s->lock);
  }
  if (rc)
    goto out;
  pthread_mutex_lock(&t->stat_lock);
  t->rows_pushed += c.applied;
  t->pushes += pushes;
  t->not_admitted += c.na;
  t->admitted += c.adm;
  pthread_mutex_unlock(&t->stat_lock);
out:
  free(slot);
  free(uniq);
  free(occ);
  free(last);
  free(sum);
  free(ids_u);
  free(ord);
  free(hu);
  return rc;
}

int psd_table_get(struct psd_table *t, uint64_t id, float *value, float *state,
                  struct psd_row_stats *stats) {
  struct stripe *s = &t->st[stripe_of(id)];
  int rc = CM_ENOENT;
  pthread_mutex_lock(&s->lock);
  long k = psd__table_find(s, id);
  if (k >= 0) {
    struct rec *r = psd__rec_at(s, (size_t)k);
    if (value)
      memcpy(value, psd__rec_val(r), t->conf.dim * sizeof(float));
    if (state)
      memcpy(state, psd__rec_val(r) + t->conf.dim, t->nstate * sizeof(float));
    if (stats)
      *stats = (struct psd_row_stats){r->count, r->t, r->last_step};
    rc = 0;
  }
  pthread_mutex_unlock(&s->lock);
  return rc;
}

void psd_table_stats(struct psd_table *t, struct psd_table_stats *out) {
  memset(out, 0, sizeof *out);
  for (int i = 0; i < PSD__NSTRIPES; i++) {
    struct stripe *s = &t->st[i];
    pthread_mutex_lock(&s->lock);
    out->rows += psd_rows_live(&s->rows);
    out->pending += s->npend;
    out->bytes += psd_rows_bytes(&s->rows) + s->pcap * sizeof(struct pend) +
                  s->ev[PSD__CKPT].cap * sizeof(uint64_t) +
                  (s->heads ? ((size_t)1 << s->hbits) * sizeof *s->heads : 0);
    pthread_mutex_unlock(&s->lock);
  }
  out->raw_bytes = out->rows * (t->conf.dim + t->nstate) * sizeof(float);
  pthread_mutex_lock(&t->stat_lock);
  out->admitted = t->admitted;
  out->not_admitted = t->not_admitted;
  out->evicted = t->evicted;
  out->rows_pulled = t->rows_pulled;
  out->rows_pushed = t->rows_pushed;
  out->pushes = t->pushes;
  pthread_mutex_unlock(&t->stat_lock);
}

void psd_table_set_pushes(struct psd_table *t, uint64_t pushes) {
  pthread_mutex_lock(&t->stat_lock);
  t->pushes = pushes;
  pthread_mutex_unlock(&t->stat_lock);
}
