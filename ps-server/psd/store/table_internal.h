/* What the files of an embedding table share (table.h): the record
 * layout, the stripes, and the lookups under a stripe's lock.
 *   table.c       stripes (each a lock over rows.h's records and index),
 *                 pull, push, admission, stats
 *   table_snap.c  snapshots (checkpoints' and publications'), restore,
 *                 pages, shrink, top
 *   table_file.c  a snapshot's file */
#ifndef PSD_TABLE_INTERNAL_H
#define PSD_TABLE_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "rows.h"
#include "table.h"

/* Stripes per table: each its own lock and rows (rows.h). */
#define PSD__NSTRIPES PSD_ROWS_NSTRIPES

/* A record's head (rows.h: the id first); dim value floats and nstate
 * state floats follow. */
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

/* The snapshots that each keep their own place in the table's changes. */
enum psd__cursor_of {
  PSD__CKPT, /* checkpoints' (psd_table_snapshot) */
  PSD__PUB,  /* publications' (psd_table_pub_snapshot) */
  PSD__MOVE, /* a live move's (psd_table_move_snapshot): its buckets' */
  PSD__NCURSORS
};

/* Ids evicted since a cursor's last snapshot, in one stripe. */
struct evlist {
  uint64_t *ids; /* owned: n of cap, in eviction order */
  size_t n, cap; /* entries used and allocated */
};

/* Where a kind of snapshot stands (enum psd__cursor_of). */
struct cursor {
  int snapped;  /* one has been taken (the publications': since the table
                   was made or restored, evictions are kept then) */
  uint64_t gen; /* the generation the last one was taken at */
};

struct stripe {
  pthread_mutex_t lock; /* guards everything below */
  struct psd_rows rows; /* the records (struct rec, then the floats) */
  struct pend *pend;    /* pcap slots */
  size_t pcap, npend;
  struct evlist ev[PSD__NCURSORS]; /* by cursor: the checkpoints' always
                                      kept, the publications' and a move's
                                      once one was taken (cur[c].snapped;
                                      a move's until it ends) */
};

struct psd_table {
  struct cm_table_conf conf;        /* settings */
  uint64_t seed;                    /* the job's */
  uint32_t nstate;                  /* state floats per row */
  uint64_t gen;                     /* current change generation */
  struct cursor cur[PSD__NCURSORS]; /* by enum psd__cursor_of */
  struct stripe st[PSD__NSTRIPES];  /* by stripe_of(id) */
  pthread_mutex_t stat_lock;        /* guards the counters */
  uint64_t admitted, not_admitted, evicted, rows_pulled, rows_pushed;
  uint64_t pushes; /* pushes applied (psd_table_stats) */
};

/* The stripe of an id. */
static inline int stripe_of(uint64_t id) {
  return psd_rows_stripe(psd_rows_hash(id));
}

/* Record k of stripe s, and its floats (value, then state); inline: a
 * batch's every row passes through them. */
static inline struct rec *psd__rec_at(const struct stripe *s, size_t k) {
  return (struct rec *)(void *)psd_rows_at(&s->rows, k);
}
static inline float *psd__rec_val(struct rec *r) {
  return (float *)(void *)(r + 1);
}

/* Under s's lock: the record number of id, or -1. */
static inline long psd__table_find(const struct stripe *s, uint64_t id) {
  return psd_rows_find(&s->rows, id, psd_rows_hash(id));
}
/* Under s's lock: creates id's record (hash h: psd_rows_hash) with its
 * initial row and state; returns its number, or -1 when out of memory. */
long psd__table_create(struct psd_table *t, struct stripe *s, uint64_t id,
                       uint64_t h);

#endif
