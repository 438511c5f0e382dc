/* What the files of an embedding table share (table.h): the record
 * layout, the stripes, and the lookups under a stripe's lock.
 *   table.c       stripes, index, records, pull, push, admission, stats
 *   table_snap.c  snapshots (checkpoints' and publications'), restore,
 *                 pages, shrink, top
 *   table_file.c  a snapshot's file */
#ifndef PSD_TABLE_INTERNAL_H
#define PSD_TABLE_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "rand.h"
#include "table.h"

/* Records per slab: small, so a stripe's last slab wastes little. */
#define PSD__SLAB 256

/* Stripes per table: each its own lock, index and records. */
#define PSD__NSTRIPES 64

/* A record's head; dim value floats and nstate state floats follow. */
struct rec {
  uint64_t id;        /* the row's id */
  uint64_t last_step; /* the shard's step at its last push */
  uint64_t gen;       /* the generation it last changed in (t->gen then):
                         checkpoints' and publications' snapshots each
                         keep the generation they were taken at */
  uint32_t count;     /* pushes that touched it */
  uint32_t t;         /* optimizer updates */
  uint32_t live;      /* 0: a free record */
  uint32_t pad;       /* keeps the floats 8-aligned */
};

struct pend {
  uint64_t id;    /* an id counted towards admission */
  uint32_t count; /* its pushes so far; 0: empty slot */
};

struct stripe {
  pthread_mutex_t lock;   /* guards everything below */
  uint8_t **slabs;        /* owned: slabs of PSD__SLAB records of rsize bytes,
                             which never move */
  size_t nslabs, slabcap; /* slabs allocated, and entries in slabs */
  size_t nrec, cap;       /* records used and allocated (nslabs x PSD__SLAB) */
  uint32_t *index;        /* icap slots: record number + 1, 0 empty */
  size_t icap, nlive;     /* slots, live records */
  uint32_t *freel;        /* free record numbers */
  size_t nfree, freecap;
  struct pend *pend; /* pcap slots */
  size_t pcap, npend;
  uint64_t *evicted; /* ids evicted since the last snapshot */
  size_t nev, evcap;
  uint64_t *pevicted; /* ids evicted since the last publication snapshot,
                         kept once one was taken (pub_snapped) */
  size_t npev, pevcap;
};

struct psd_table {
  struct cm_table_conf conf; /* settings */
  uint64_t seed;             /* the job's */
  uint32_t nstate;           /* state floats per row */
  size_t rsize;              /* bytes per record */
  uint64_t gen;              /* current change generation */
  int snapped;               /* a snapshot has been taken */
  uint64_t snap_gen;         /* the generation of the last snapshot */
  int pub_snapped;           /* a publication snapshot has been taken since the
                                table was made or restored: evictions are kept */
  uint64_t pub_gen; /* the generation of the last publication snapshot */
  struct stripe st[PSD__NSTRIPES]; /* by stripe_of(id) */
  pthread_mutex_t stat_lock;       /* guards the counters */
  uint64_t admitted, not_admitted, evicted, rows_pulled, rows_pushed;
  uint64_t pushes; /* pushes applied (psd_table_stats) */
};

/* A hash of an id independent of the shard function (splitmix64). */
static inline uint64_t hash_id(uint64_t id) {
  return cm_mix64(id ^ 0x6a09e667f3bcc908ull);
}
/* The stripe of an id: the hash's top 6 bits. */
static inline int stripe_of(uint64_t id) { return (int)(hash_id(id) >> 58); }

/* Record k of stripe s, and its floats (value, then state); inline: a
 * batch's every row passes through them. */
static inline struct rec *psd__rec_at(const struct psd_table *t,
                                      const struct stripe *s, size_t k) {
  return (struct rec *)(void *)(s->slabs[k / PSD__SLAB] +
                                (k % PSD__SLAB) * t->rsize);
}
static inline float *psd__rec_val(struct rec *r) {
  return (float *)(void *)(r + 1);
}

/* Under s's lock: the record number of id, whose hash_id is h, or -1. */
static inline long psd__table_find_h(const struct psd_table *t,
                                     const struct stripe *s, uint64_t id,
                                     uint64_t h) {
  if (!s->icap)
    return -1;
  size_t m = s->icap - 1, i = (size_t)h & m;
  for (;; i = (i + 1) & m) {
    uint32_t v = s->index[i];
    if (!v)
      return -1;
    if (psd__rec_at(t, s, v - 1)->id == id)
      return (long)v - 1;
  }
}

/* Under s's lock: the record number of id, or -1. */
long psd__table_find(const struct psd_table *t, const struct stripe *s,
                     uint64_t id);
/* Under s's lock: creates id's record with its initial row and state;
 * returns its number, or -1 when out of memory. */
long psd__table_create(struct psd_table *t, struct stripe *s, uint64_t id);
/* Under s's lock: takes id out of the index (its record stays). */
void psd__table_unindex(const struct psd_table *t, struct stripe *s,
                        uint64_t id);

#endif
