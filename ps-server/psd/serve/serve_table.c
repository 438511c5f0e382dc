/* A serving task's values-only table (serve_table.h): stripes of slabs of
 * records (an id, then dim floats) under an open-addressing index of
 * record numbers, with backward-shift deletion, as table.c lays out a
 * training shard's, minus everything training needs. No locks here: the
 * caller holds the serving task's table-wide lock (serve.h). */
#include "serve_table.h"

#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "rand.h"

/* Records per slab: small, so a stripe's last slab wastes little. */
#define SLAB 256
/* Stripes: each its own index and slabs, so an index grows a 64th of the
 * table at a time. */
#define NSTRIPES 64

struct stripe {
  uint8_t **slabs;        /* owned: slabs of SLAB records of rsize bytes */
  size_t nslabs, slabcap; /* slabs allocated, and entries in slabs */
  size_t nrec, cap;       /* records used (ever) and allocated */
  uint32_t *index;        /* icap slots: record number + 1, 0 empty */
  size_t icap, nlive;     /* slots, rows held */
  uint32_t *freel;        /* record numbers of removed rows, for reuse */
  size_t nfree, freecap;  /* entries used and allocated in freel */
};

struct psd_serve_table {
  uint32_t dim;               /* floats per row */
  size_t rsize;               /* bytes per record: the id, dim floats */
  struct stripe st[NSTRIPES]; /* by the top bits of hash_id */
};

/* The hash table.c indexes by (its own, independent of the shard's). */
static inline uint64_t hash_id(uint64_t id) {
  return cm_mix64(id ^ 0x6a09e667f3bcc908ull);
}

static inline uint8_t *rec_at(const struct psd_serve_table *t,
                              const struct stripe *s, size_t k) {
  return s->slabs[k / SLAB] + (k % SLAB) * t->rsize;
}

static inline uint64_t rec_id(const uint8_t *r) {
  uint64_t id;
  memcpy(&id, r, sizeof id);
  return id;
}

int psd_serve_table_new(struct psd_serve_table **out, uint32_t dim) {
  struct psd_serve_table *t;
  if (!dim)
    return CM_EINVAL;
  if (!(t = calloc(1, sizeof *t)))
    return CM_ENOMEM;
  t->dim = dim;
  t->rsize = (sizeof(uint64_t) + dim * sizeof(float) + 7) & ~(size_t)7;
  *out = t;
  return 0;
}

void psd_serve_table_free(struct psd_serve_table *t) {
  if (!t)
    return;
  for (int i = 0; i < NSTRIPES; i++) {
    struct stripe *s = &t->st[i];
    for (size_t k = 0; k < s->nslabs; k++)
      free(s->slabs[k]);
    free(s->slabs);
    free(s->index);
    free(s->freel);
  }
  free(t);
}

uint32_t psd_serve_table_dim(const struct psd_serve_table *t) { return t->dim; }

/* The record number of id (hash h) in s, or -1. */
static long find(const struct psd_serve_table *t, const struct stripe *s,
                 uint64_t id, uint64_t h) {
  if (!s->icap)
    return -1;
  size_t m = s->icap - 1;
  for (size_t i = (size_t)h & m;; i = (i + 1) & m) {
    uint32_t v = s->index[i];
    if (!v)
      return -1;
    if (rec_id(rec_at(t, s, v - 1)) == id)
      return (long)v - 1;
  }
}

static int grow_index(const struct psd_serve_table *t, struct stripe *s) {
  size_t cap = s->icap ? s->icap * 2 : 64;
  uint32_t *ix = calloc(cap, sizeof *ix);
  if (!ix)
    return CM_ENOMEM;
  for (size_t k = 0; k < s->icap; k++) {
    uint32_t v = s->index[k];
    if (!v)
      continue;
    size_t i = (size_t)hash_id(rec_id(rec_at(t, s, v - 1))) & (cap - 1);
    while (ix[i])
      i = (i + 1) & (cap - 1);
    ix[i] = v;
  }
  free(s->index);
  s->index = ix;
  s->icap = cap;
  return 0;
}

/* A record for a new row of id (hash h), indexed. Returns its number, or
 * -1 when out of memory. */
static long create(struct psd_serve_table *t, struct stripe *s, uint64_t id,
                   uint64_t h) {
  size_t k;
  if ((s->nlive + 1) * 2 > s->icap && grow_index(t, s))
    return -1;
  if (s->nfree) {
    k = s->freel[--s->nfree];
  } else {
    if (s->nrec == s->cap) {
      if (s->nslabs == s->slabcap) {
        size_t cap = s->slabcap ? s->slabcap * 2 : 16;
        uint8_t **sl = realloc(s->slabs, cap * sizeof *sl);
        if (!sl)
          return -1;
        s->slabs = sl;
        s->slabcap = cap;
      }
      if (!(s->slabs[s->nslabs] = malloc(SLAB * t->rsize)))
        return -1;
      s->nslabs++;
      s->cap += SLAB;
    }
    k = s->nrec++;
  }
  memcpy(rec_at(t, s, k), &id, sizeof id);
  size_t m = s->icap - 1, i = (size_t)h & m;
  while (s->index[i])
    i = (i + 1) & m;
  s->index[i] = (uint32_t)k + 1;
  s->nlive++;
  return (long)k;
}

int psd_serve_table_upsert(struct psd_serve_table *t, const uint64_t *ids,
                           size_t n, const float *values) {
  size_t row = t->dim * sizeof(float);
  for (size_t i = 0; i < n; i++) {
    uint64_t h = hash_id(ids[i]);
    struct stripe *s = &t->st[h >> 58];
    long k = find(t, s, ids[i], h);
    if (k < 0 && (k = create(t, s, ids[i], h)) < 0)
      return CM_ENOMEM;
    memcpy(rec_at(t, s, (size_t)k) + sizeof(uint64_t), values + i * t->dim,
           row);
  }
  return 0;
}

/* Takes slot i's record out of s's index (backward-shift deletion: an
 * entry after the hole moves into it unless its home lies cyclically in
 * (hole, entry]). */
static void unindex(const struct psd_serve_table *t, struct stripe *s,
                    size_t i) {
  size_t m = s->icap - 1, j = i;
  for (;;) {
    j = (j + 1) & m;
    if (!s->index[j])
      break;
    size_t home = (size_t)hash_id(rec_id(rec_at(t, s, s->index[j] - 1))) & m;
    int stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
    if (stays)
      continue;
    s->index[i] = s->index[j];
    i = j;
  }
  s->index[i] = 0;
  s->nlive--;
}

void psd_serve_table_remove(struct psd_serve_table *t, const uint64_t *ids,
                            size_t n) {
  for (size_t i = 0; i < n; i++) {
    uint64_t h = hash_id(ids[i]);
    struct stripe *s = &t->st[h >> 58];
    if (!s->icap)
      continue;
    size_t m = s->icap - 1, at = (size_t)h & m;
    uint32_t v;
    while ((v = s->index[at]) && rec_id(rec_at(t, s, v - 1)) != ids[i])
      at = (at + 1) & m;
    if (!v)
      continue;
    if (s->nfree == s->freecap) {
      size_t cap = s->freecap ? s->freecap * 2 : 64;
      uint32_t *fl = realloc(s->freel, cap * sizeof *fl);
      if (fl) {
        s->freel = fl;
        s->freecap = cap;
      }
    }
    /* Without room in the free list the record is only lost for reuse
     * until the next clear: the row is gone either way. */
    if (s->nfree < s->freecap)
      s->freel[s->nfree++] = v - 1;
    unindex(t, s, at);
  }
}

void psd_serve_table_clear(struct psd_serve_table *t) {
  for (int i = 0; i < NSTRIPES; i++) {
    struct stripe *s = &t->st[i];
    if (s->icap)
      memset(s->index, 0, s->icap * sizeof *s->index);
    s->nlive = s->nrec = s->nfree = 0;
  }
}

size_t psd_serve_table_lookup(const struct psd_serve_table *t,
                              const uint64_t *ids, size_t n, float *out,
                              uint8_t *found) {
  size_t row = t->dim * sizeof(float), missing = 0;
  for (size_t i = 0; i < n; i++) {
    uint64_t h = hash_id(ids[i]);
    const struct stripe *s = &t->st[h >> 58];
    long k = find(t, s, ids[i], h);
    found[i] = k >= 0;
    if (k >= 0)
      memcpy(out + i * t->dim, rec_at(t, s, (size_t)k) + sizeof(uint64_t), row);
    else
      missing++;
  }
  return missing;
}

uint64_t psd_serve_table_rows(const struct psd_serve_table *t) {
  uint64_t n = 0;
  for (int i = 0; i < NSTRIPES; i++)
    n += t->st[i].nlive;
  return n;
}

uint64_t psd_serve_table_bytes(const struct psd_serve_table *t) {
  uint64_t b = sizeof *t;
  for (int i = 0; i < NSTRIPES; i++) {
    const struct stripe *s = &t->st[i];
    b += s->nslabs * (uint64_t)SLAB * t->rsize + s->slabcap * sizeof(void *) +
         s->icap * sizeof(uint32_t) + s->freecap * sizeof(uint32_t);
  }
  return b;
}
