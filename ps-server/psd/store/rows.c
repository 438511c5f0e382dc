/* The storage engine of one stripe of rows (rows.h): slabs, the index and
 * its growth, the free list. */
#include "rows.h"

#include <stdlib.h>
#include <string.h>

void psd_rows_init(struct psd_rows *r, size_t rsize) {
  memset(r, 0, sizeof *r);
  r->rsize = rsize;
}

void psd_rows_release(struct psd_rows *r) {
  for (size_t k = 0; k < r->nslabs; k++)
    free(r->slabs[k]);
  free(r->slabs);
  free(r->index);
  free(r->freel);
  psd_rows_init(r, r->rsize);
}

/* Doubles the index (64 slots the first time), every row placed again.
 * Returns 0, or -1 when out of memory (the old index kept). */
static int grow_index(struct psd_rows *r) {
  size_t cap = r->icap ? r->icap * 2 : 64;
  uint32_t *ix = calloc(cap, sizeof *ix);
  if (!ix)
    return -1;
  for (size_t k = 0; k < r->icap; k++) {
    uint32_t v = r->index[k];
    if (!v)
      continue;
    size_t i = (size_t)psd_rows_hash(psd_rows_id(r, v - 1)) & (cap - 1);
    while (ix[i])
      i = (i + 1) & (cap - 1);
    ix[i] = v;
  }
  free(r->index);
  r->index = ix;
  r->icap = cap;
  return 0;
}

/* The number of a record not in use: a removed one, else the next, in a
 * new slab when the last is full. -1 when out of memory. */
static long take_record(struct psd_rows *r) {
  if (r->nfree)
    return (long)r->freel[--r->nfree];
  if (r->nrec == r->cap) {
    if (r->nslabs == r->slabcap) {
      size_t cap = r->slabcap ? r->slabcap * 2 : 16;
      uint8_t **sl = realloc(r->slabs, cap * sizeof *sl);
      if (!sl)
        return -1;
      r->slabs = sl;
      r->slabcap = cap;
    }
    if (!(r->slabs[r->nslabs] = malloc(PSD_ROWS_SLAB * r->rsize)))
      return -1;
    r->nslabs++;
    r->cap += PSD_ROWS_SLAB;
  }
  return (long)r->nrec++;
}

long psd_rows_add(struct psd_rows *r, uint64_t id, uint64_t h) {
  /* The index stays at most half full: probe runs stay short. */
  if ((r->nlive + 1) * 2 > r->icap && grow_index(r))
    return -1;
  long k = take_record(r);
  if (k < 0)
    return -1;
  memcpy(psd_rows_at(r, (size_t)k), &id, sizeof id);
  size_t m = r->icap - 1, i = (size_t)h & m;
  while (r->index[i])
    i = (i + 1) & m;
  r->index[i] = (uint32_t)k + 1;
  r->nlive++;
  return k;
}

long psd_rows_remove(struct psd_rows *r, uint64_t id, uint64_t h) {
  if (!r->icap)
    return -1;
  size_t m = r->icap - 1, i = (size_t)h & m, j;
  uint32_t v;
  while ((v = r->index[i]) && psd_rows_id(r, v - 1) != id)
    i = (i + 1) & m;
  if (!v)
    return -1;
  /* Backward-shift deletion: an entry after the hole moves into it unless
   * its home lies cyclically in (hole, entry]. */
  for (j = i;;) {
    j = (j + 1) & m;
    if (!r->index[j])
      break;
    size_t home = (size_t)psd_rows_hash(psd_rows_id(r, r->index[j] - 1)) & m;
    int stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
    if (stays)
      continue;
    r->index[i] = r->index[j];
    i = j;
  }
  r->index[i] = 0;
  r->nlive--;
  if (r->nfree == r->freecap) {
    size_t cap = r->freecap ? r->freecap * 2 : 64;
    uint32_t *fl = realloc(r->freel, cap * sizeof *fl);
    if (fl) {
      r->freel = fl;
      r->freecap = cap;
    }
  }
  if (r->nfree < r->freecap)
    r->freel[r->nfree++] = v - 1;
  return (long)v - 1;
}

void psd_rows_clear(struct psd_rows *r) {
  if (r->icap)
    memset(r->index, 0, r->icap * sizeof *r->index);
  r->nrec = r->nlive = r->nfree = 0;
}

uint64_t psd_rows_bytes(const struct psd_rows *r) {
  return (uint64_t)r->cap * r->rsize + r->slabcap * sizeof *r->slabs +
         r->icap * sizeof *r->index + r->freecap * sizeof *r->freel;
}
