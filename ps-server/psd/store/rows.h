/* The storage engine of psd's rows, one stripe of them: fixed-size records
 * in slabs that never move, found by an open-addressing index of record
 * numbers (linear probing, backward-shift deletion), the index grown by
 * doubling, removed records kept on a free list for the next row. A
 * training shard's table (table.h) holds one per stripe under the
 * stripe's lock, a serving task's (serve_table.h) one per stripe under
 * its table-wide lock: there are no locks here, the caller holds one.
 *
 * A record is rsize bytes (a multiple of 8) and begins with its row's id
 * (a uint64_t); the rest is the caller's (its value, state, statistics).
 * Records are numbered from 0 in the order they were first handed out; a
 * record's address never changes while the engine lives.
 *
 * Every call takes the id's hash (psd_rows_hash), computed once by the
 * caller, who also picks a stripe by its top bits (psd_rows_stripe). */
#ifndef PSD_ROWS_H
#define PSD_ROWS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "rand.h"

/* Records per slab: small, so a stripe's last slab wastes little. */
#define PSD_ROWS_SLAB 256

/* Stripes of a striped table (table.c, serve_table.c): psd_rows_stripe's
 * range. */
#define PSD_ROWS_NSTRIPES 64

/* One stripe's rows. Embedded by its caller (psd_rows_init and
 * psd_rows_release); the fields are read by the inline lookups below and
 * changed only by this module's functions. */
struct psd_rows {
  size_t rsize;           /* bytes per record, its id first */
  uint8_t **slabs;        /* owned: slabs of PSD_ROWS_SLAB records, which
                             never move */
  size_t nslabs, slabcap; /* slabs allocated, and entries in slabs */
  size_t nrec, cap;       /* records handed out (removed ones included) and
                             allocated (nslabs x PSD_ROWS_SLAB) */
  uint32_t *index;        /* owned: icap slots (a power of 2, or 0):
                             record number + 1, 0 empty */
  size_t icap, nlive;     /* slots, and records indexed (rows held) */
  uint32_t *freel;        /* owned: numbers of removed records, reused
                             last-removed first */
  size_t nfree, freecap;  /* entries used and allocated in freel */
};

/* The hash rows are indexed and striped by: splitmix64's finalizer over a
 * constant, independent of the shard rule (cm_layout_map_id_shard). */
static inline uint64_t psd_rows_hash(uint64_t id) {
  return cm_mix64(id ^ 0x6a09e667f3bcc908ull);
}

/* The stripe of an id whose hash is h: the top 6 bits, which the index
 * (the low bits) never reaches. */
static inline int psd_rows_stripe(uint64_t h) { return (int)(h >> 58); }

/* An empty engine of records of rsize bytes (a multiple of 8, at least 8);
 * allocates nothing. */
void psd_rows_init(struct psd_rows *r, size_t rsize);
/* Frees everything r holds; r is then as after psd_rows_init. */
void psd_rows_release(struct psd_rows *r);

/* Record k (k < nrec): inline, every row of a batch passes through it. */
static inline uint8_t *psd_rows_at(const struct psd_rows *r, size_t k) {
  return r->slabs[k / PSD_ROWS_SLAB] + (k % PSD_ROWS_SLAB) * r->rsize;
}

/* The id at the head of record k. */
static inline uint64_t psd_rows_id(const struct psd_rows *r, size_t k) {
  uint64_t id;
  memcpy(&id, psd_rows_at(r, k), sizeof id);
  return id;
}

/* The record number of id (hash h), or -1 when r does not hold it. */
static inline long psd_rows_find(const struct psd_rows *r, uint64_t id,
                                 uint64_t h) {
  if (!r->icap)
    return -1;
  size_t m = r->icap - 1;
  for (size_t i = (size_t)h & m;; i = (i + 1) & m) {
    uint32_t v = r->index[i];
    if (!v)
      return -1;
    if (psd_rows_id(r, v - 1) == id)
      return (long)v - 1;
  }
}

/* For a batch of lookups of the hashes h[0..n): fetches ahead the index
 * slots they start at, then the first `bytes` bytes of the records in
 * those slots (where most lookups end), so that their memory is on its way
 * while the batch is read. Always inlined: GCC counts a prefetch as no
 * side effect, so a call of a function of only loads and prefetches is
 * dropped as useless (gcc 12 -O2 dropped every one of them). */
static inline __attribute__((always_inline)) void
psd_rows_prefetch(const struct psd_rows *r, const uint64_t *h, size_t n,
                  size_t bytes) {
  if (!r->icap)
    return;
  const uint32_t *ix = r->index;
  size_t m = r->icap - 1;
  for (size_t i = 0; i < n; i++)
    __builtin_prefetch(&ix[(size_t)h[i] & m]);
  for (size_t i = 0; i < n; i++) {
    uint32_t v = ix[(size_t)h[i] & m];
    if (v) {
      const uint8_t *rec = psd_rows_at(r, v - 1);
      __builtin_prefetch(rec);
      if (bytes > 64)
        __builtin_prefetch(rec + 64);
      __builtin_prefetch(rec + bytes - 1);
    }
  }
}

/* A record for id (hash h), which r must not hold: a removed one reused,
 * else the next, in a new slab when the last is full; indexed, its id
 * written, the rest of its bytes the caller's to set. Returns its number,
 * or -1 when out of memory (nothing changed). */
long psd_rows_add(struct psd_rows *r, uint64_t id, uint64_t h);

/* Takes id (hash h) out of the index and puts its record on the free list
 * for the next psd_rows_add (its bytes stay as they were until then).
 * Returns the record's number, or -1 when r does not hold id. Without
 * memory to grow the free list the record is not reused before
 * psd_rows_clear; the row is gone either way. */
long psd_rows_remove(struct psd_rows *r, uint64_t id, uint64_t h);

/* Drops every row, keeping the slabs and the index for the rows that
 * follow. */
void psd_rows_clear(struct psd_rows *r);

/* Rows held. */
static inline size_t psd_rows_live(const struct psd_rows *r) {
  return r->nlive;
}

/* Records handed out, removed ones included: iterate records 0..this-1
 * (psd_rows_at); a caller that iterates marks its removed records in their
 * bytes (table.c's rec.live). */
static inline size_t psd_rows_used(const struct psd_rows *r) { return r->nrec; }

/* The memory r holds: slabs, the slab list, the index, the free list. */
uint64_t psd_rows_bytes(const struct psd_rows *r);

#endif
