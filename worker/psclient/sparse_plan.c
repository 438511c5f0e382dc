/* A sparse call's plan (sparse_plan.h): each table's ids checked against
 * its bound, made unique and grouped by shard in one pass, cut into
 * messages; a push's repeated rows summed and a pull's answers copied to
 * every position, each in one pass in position order. */
#include "sparse_plan.h"

#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "layout.h"

/* How far ahead the plan fetches the hash set's slots (a power of 2). */
#define AHEAD 16

/* The declared table called name, or NULL. */
const struct psc__table_state *psc__sparse_table(const struct psc__client *c,
                                                 const char *name) {
  for (int i = 0; i < c->ntables; i++)
    if (!strcmp(c->tables[i].name, name))
      return &c->tables[i];
  return NULL;
}

/* A slot of the plan's hash set of one table's unique ids: a unique id's
 * index + 1, 0 when free. */
static size_t slot_of(uint64_t h, size_t mask) {
  return (size_t)((h * 0x9E3779B97F4A7C15ull) >> 32) & mask;
}

/* Plans the call: each table's ids checked against its bound, made unique
 * (a hash set over the call's largest table, cleared per table) and grouped
 * by shard, then cut into messages of at most chunk_bytes of rows. One pass
 * over the ids, one over the unique ids; arrays sized once per call.
 * Returns 0, or an error in c->err. */
int psc__sparse_plan(struct psc__scall *sc, int nr) {
  struct psc__client *c = sc->c;
  const char *what = sc->push ? "push" : "pull";
  size_t all = 0, most = 0, cap = 16, nu = 0;
  /* The shards that hold table rows: during a live move, both counts'. */
  int ns = c->map.nshards, rc = 0;
  for (int i = 0; i < nr; i++) {
    all += sc->rows[i].n;
    most = sc->rows[i].n > most ? sc->rows[i].n : most;
    if (sc->rows[i].n >= PSC__SPARSE_NO_POS) {
      psc__seterr(c, "%s rows of '%s': %zu ids in one call; at most %u", what,
                  sc->rows[i].table, sc->rows[i].n, PSC__SPARSE_NO_POS - 1);
      return CM_EINVAL;
    }
  }
  while (cap < 2 * most)
    cap *= 2;
  uint32_t *slot = malloc(cap * sizeof *slot);
  uint32_t *sorted = malloc((most + 1) * sizeof *sorted);
  /* Per table: its unique ids in first-use order and their shards, before
   * grouping. */
  uint64_t *ids = malloc((most + 1) * sizeof *ids);
  uint32_t *first = malloc((most + 1) * sizeof *first);
  int *shard = malloc((most + 1) * sizeof *shard);
  size_t *count = calloc((size_t)ns + 1, sizeof *count);
  size_t *at = calloc((size_t)ns + 1, sizeof *at);
  uint32_t *chunks = calloc((size_t)ns + 1, sizeof *chunks);
  sc->uid = malloc((all + 1) * sizeof *sc->uid);
  sc->head = malloc((all + 1) * sizeof *sc->head);
  sc->uix = malloc((all + 1) * sizeof *sc->uix);
  sc->base = calloc((size_t)nr + 1, sizeof *sc->base);
  sc->ufirst = calloc((size_t)nr + 1, sizeof *sc->ufirst);
  sc->roff = calloc((size_t)nr + 1, sizeof *sc->roff);
  if (!slot || !sorted || !ids || !first || !shard || !count || !at ||
      !chunks || !sc->uid || !sc->head || !sc->uix || !sc->base ||
      !sc->ufirst || !sc->roff)
    goto nomem;
  /* The messages: at most one per shard and table beyond the rows' own
   * count of chunks; counted exactly below, sized generously here. */
  size_t maxmsgs = 0;
  for (int i = 0; i < nr; i++) {
    const struct psc__table_state *t = psc__sparse_table(c, sc->rows[i].table);
    if (!t) {
      psc__seterr(c,
                  "%s rows of '%s': this client has declared no table '%s'; "
                  "declare it first",
                  what, sc->rows[i].table, sc->rows[i].table);
      rc = CM_ENOENT;
      goto out;
    }
    size_t per = c->o.chunk_bytes / (t->dim * sizeof(float));
    per = per ? per : 1;
    maxmsgs += sc->rows[i].n / per + (size_t)ns;
  }
  if (!(sc->msgs = calloc(maxmsgs + 1, sizeof *sc->msgs)))
    goto nomem;
  size_t pos = 0, floats = 0;
  for (int i = 0; i < nr; i++) {
    const struct psc__rows *r = &sc->rows[i];
    const struct psc__table_state *t = psc__sparse_table(c, r->table);
    uint32_t *uix = sc->uix + pos;
    size_t tcap = 16, mask, n = 0;
    while (tcap < 2 * r->n)
      tcap *= 2;
    mask = tcap - 1;
    sc->base[i] = pos;
    sc->ufirst[i] = nu;
    sc->roff[i] = floats;
    pos += r->n;
    memset(slot, 0, tcap * sizeof *slot);
    memset(count, 0, (size_t)ns * sizeof *count);
    /* The hashes of the ids AHEAD positions on, their slots fetched
     * ahead: a large call's set is past the caches. */
    uint64_t ring[AHEAD];
    for (size_t k = 0; k < AHEAD && k < r->n; k++) {
      ring[k] = cm_layout_id_hash(r->ids[k]);
      __builtin_prefetch(&slot[slot_of(ring[k], mask)]);
    }
    for (size_t k = 0; k < r->n; k++) {
      uint64_t id = r->ids[k], h = ring[k % AHEAD];
      if (k + AHEAD < r->n) {
        uint64_t ha = cm_layout_id_hash(r->ids[k + AHEAD]);
        ring[k % AHEAD] = ha;
        __builtin_prefetch(&slot[slot_of(ha, mask)]);
      }
      if (t->id_bound && id >= t->id_bound) {
        psc__seterr(c,
                    "%s rows of '%s': id %llu (position %zu) is not below "
                    "the table's id_bound %llu",
                    what, r->table, (unsigned long long)id, k,
                    (unsigned long long)t->id_bound);
        rc = CM_ERANGE;
        goto out;
      }
      size_t j = slot_of(h, mask);
      while (slot[j] && ids[slot[j] - 1] != id)
        j = (j + 1) & mask;
      if (slot[j]) {
        uix[k] = slot[j] - 1;
        continue;
      }
      slot[j] = (uint32_t)n + 1;
      uix[k] = (uint32_t)n;
      ids[n] = id;
      first[n] = (uint32_t)k;
      /* psd's placement: the layout's shard of the id's hash. */
      count[shard[n] = cm_layout_map_hash_shard(&c->map, h)]++;
      n++;
    }
    /* The unique ids grouped by shard (a counting sort), each shard's run
     * cut into messages of at most `per` rows. */
    size_t per = c->o.chunk_bytes / (t->dim * sizeof(float));
    per = per ? per : 1;
    size_t from = nu;
    for (int s = 0; s < ns; s++) {
      at[s] = from;
      for (size_t left = count[s], k = from; left > 0;) {
        size_t m = left < per ? left : per;
        sc->msgs[sc->nmsgs++] = (struct psc__smsg){.r = i,
                                                   .shard = s,
                                                   .first = k,
                                                   .n = m,
                                                   .dim = t->dim,
                                                   .chunk = chunks[s]++,
                                                   .pending = 1};
        k += m;
        left -= m;
      }
      from += count[s];
    }
    for (size_t u = 0; u < n; u++) {
      size_t to = at[shard[u]]++;
      sc->uid[to] = ids[u];
      sc->head[to] = first[u];
      sorted[u] = (uint32_t)(to - nu);
    }
    for (size_t k = 0; k < r->n; k++)
      uix[k] = sorted[uix[k]];
    nu += n;
    floats += n * t->dim;
  }
  if (!(sc->urows = malloc((floats + 1) * sizeof *sc->urows)))
    goto nomem;
  for (int k = 0; k < sc->nmsgs; k++) {
    struct psc__smsg *m = &sc->msgs[k];
    m->urow =
        sc->urows + sc->roff[m->r] + (m->first - sc->ufirst[m->r]) * m->dim;
  }
  goto out;
nomem:
  psc__seterr(c, "%s rows: out of memory", what);
  rc = CM_ENOMEM;
out:
  free(slot);
  free(sorted);
  free(ids);
  free(first);
  free(shard);
  free(count);
  free(at);
  free(chunks);
  return rc;
}

/* A push's rows summed per unique id into urows, one pass over each
 * table's positions in order: an id's first row copied, the later ones
 * added, the float32 sums the shard makes of repeats. */
void psc__sparse_sum_rows(struct psc__scall *sc, int nr) {
  for (int i = 0; i < nr; i++) {
    const struct psc__rows *r = &sc->rows[i];
    const uint32_t *uix = sc->uix + sc->base[i];
    const uint32_t *head = sc->head + sc->ufirst[i];
    uint32_t dim = (uint32_t)psc__client_table_dim(sc->c, r->table);
    float *rows = sc->urows + sc->roff[i];
    for (size_t k = 0; k < r->n; k++) {
      float *dst = rows + (size_t)uix[k] * dim;
      const float *src = r->grads + k * dim;
      if (head[uix[k]] == k)
        memcpy(dst, src, dim * sizeof(float));
      else
        for (uint32_t j = 0; j < dim; j++)
          dst[j] += src[j];
    }
  }
}

/* A pull's rows, every message answered, copied from urows to every
 * position of the caller's, in position order. */
void psc__sparse_copy_out(struct psc__scall *sc, int nr) {
  for (int i = 0; i < nr; i++) {
    struct psc__rows *r = &sc->rows[i];
    const uint32_t *uix = sc->uix + sc->base[i];
    uint32_t dim = (uint32_t)psc__client_table_dim(sc->c, r->table);
    const float *rows = sc->urows + sc->roff[i];
    for (size_t k = 0; k < r->n; k++)
      memcpy(r->rows + k * dim, rows + (size_t)uix[k] * dim,
             dim * sizeof(float));
  }
}

void psc__sparse_plan_free(struct psc__scall *sc) {
  free(sc->msgs);
  free(sc->uid);
  free(sc->head);
  free(sc->uix);
  free(sc->base);
  free(sc->ufirst);
  free(sc->roff);
  free(sc->urows);
  sc->msgs = NULL;
  sc->nmsgs = 0;
  sc->uid = NULL;
  sc->head = NULL;
  sc->uix = NULL;
  sc->base = sc->ufirst = sc->roff = NULL;
  sc->urows = NULL;
}

int psc__sparse_regroup(struct psc__scall *sc, const struct cm_layout_map *map,
                        size_t chunk_bytes) {
  int nshards = map->nshards;
  size_t ids = 0, floats = 0, nu = 0, nf = 0;
  int nm = 0;
  for (int k = 0; k < sc->nmsgs; k++)
    if (sc->msgs[k].pending) {
      ids += sc->msgs[k].n;
      floats += sc->msgs[k].n * sc->msgs[k].dim;
    }
  /* Every message holds an id at least. */
  struct psc__smsg *msgs = calloc(ids + 1, sizeof *msgs);
  uint64_t *uid = malloc((ids + 1) * sizeof *uid);
  float *urows = malloc((floats + 1) * sizeof *urows);
  if (!msgs || !uid || !urows) {
    free(msgs);
    free(uid);
    free(urows);
    psc__seterr(sc->c, "push rows: out of memory");
    return CM_ENOMEM;
  }
  /* Table by table (in the order of their first pending message), shard
   * by shard, the pending ids in the order they had. */
  for (int t = 0; t < sc->nmsgs; t++) {
    const struct psc__smsg *mt = &sc->msgs[t];
    int seen = !mt->pending;
    for (int k = 0; k < t && !seen; k++)
      seen = sc->msgs[k].pending && sc->msgs[k].r == mt->r;
    if (seen)
      continue;
    size_t per = chunk_bytes / (mt->dim * sizeof(float));
    per = per ? per : 1;
    for (int s = 0; s < nshards; s++) {
      struct psc__smsg *cur = NULL;
      for (int k = 0; k < sc->nmsgs; k++) {
        const struct psc__smsg *m = &sc->msgs[k];
        if (!m->pending || m->r != mt->r)
          continue;
        for (size_t j = 0; j < m->n; j++) {
          uint64_t id = sc->uid[m->first + j];
          if (cm_layout_map_id_shard(map, id) != s)
            continue;
          if (!cur || cur->n == per) {
            cur = &msgs[nm++];
            *cur = (struct psc__smsg){.r = m->r,
                                      .shard = s,
                                      .first = nu,
                                      .urow = urows + nf,
                                      .dim = m->dim,
                                      .chunk = sc->chunk_next++,
                                      .pending = 1};
          }
          uid[nu++] = id;
          memcpy(urows + nf, m->urow + j * m->dim, m->dim * sizeof(float));
          nf += m->dim;
          cur->n++;
        }
      }
    }
  }
  free(sc->msgs);
  free(sc->uid);
  free(sc->urows);
  sc->msgs = msgs;
  sc->nmsgs = nm;
  sc->uid = uid;
  sc->urows = urows;
  return 0;
}
