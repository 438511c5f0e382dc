/* What the files of an embedding table share (table.h): the record
 * layout, the stripes, and the lookups under a stripe's lock.
 *   table.c       stripes (each a lock over rows.h's records and index),
 *                 pull, push, admission, stats
 *   table_snap.c  snapshots (checkpoints' and publications'), restore,
 *                 pages, shrink, top
 *   table_move.c  a live move's copies, drop and install of buckets
 *   table_file.c  a snapshot's file */
#ifndef PSD_TABLE_INTERNAL_H
#define PSD_TABLE_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "layout.h"
#include "rows.h"
#include "table.h"

/* Stripes per table: each its own lock and rows (rows.h). */
#define PSD__NSTRIPES PSD_ROWS_NSTRIPES

/* A record's head (rows.h: the id first); dim value floats and nstate
 * state floats follow. A live record is on its stripe's list of its
 * bucket group (struct stripe's heads); prev and next fit where a flag and
 * padding were, so the bucket index costs a row no bytes of its record. */
struct rec {
  uint64_t id;        /* the row's id */
  uint64_t last_step; /* the shard's step at its last push */
  uint64_t gen;       /* the generation it last changed in (t->gen then):
                         checkpoints' and publications' snapshots each
                         keep the generation they were taken at */
  uint32_t count;     /* pushes that touched it */
  uint32_t t;         /* optimizer updates */
  uint32_t prev;      /* the previous record of its group's list, + 1 (0:
                         the first); PSD__REC_FREE: a free record */
  uint32_t next;      /* the next record of its group's list, + 1 (0: the
                         last) */
};

/* rec.prev of a free record: no record number + 1 reaches it (rows.h
 * numbers a stripe's records in a uint32_t, + 1 in its index). */
#define PSD__REC_FREE UINT32_MAX

/* A stripe's bucket index starts with 1 << PSD__HBITS_MIN heads, and has
 * 4 times as many once it holds more than PSD__GROUP_ROWS rows a head, up
 * to one head a bucket (CM_LAYOUT_BUCKET_BITS): a small table's index is
 * small, and a walk of a group finds about PSD__GROUP_ROWS rows at most
 * of other buckets than those it wants. */
#define PSD__HBITS_MIN 4
#define PSD__GROUP_ROWS 4

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

/* A stripe: a lock over its records, their bucket index, its pending ids
 * and the ids it evicted.
 *
 * The bucket index: the live records of each group of buckets in a
 * doubly linked list (rec.prev, rec.next), so that a live move's copies
 * and drops of a set of buckets visit the rows of those buckets alone,
 * not the table. A group is the buckets b with the same b >> (12 - hbits)
 * (CM_LAYOUT_BUCKET_BITS = 12): one bucket each once the stripe has 4,096
 * heads, more while it is small. */
struct stripe {
  pthread_mutex_t lock; /* guards everything below */
  struct psd_rows rows; /* the records (struct rec, then the floats) */
  uint32_t *heads;      /* owned: 1 << hbits heads (NULL before the first
                           row), group g's first record + 1 (0: none) */
  unsigned hbits;       /* log2 of the heads */
  struct pend *pend;    /* pcap slots */
  size_t pcap, npend;   /* slots, and ids pending in them */
  struct evlist ev[PSD__NCURSORS]; /* by cursor: the checkpoints' always
                                      kept, the publications' once one
                                      was taken (cur[c].snapped), a
                                      move's once it copied this stripe
                                      (moving), until it ends */
  int moving; /* a move's snapshot has copied this stripe since the move
                 began: its evictions are kept for the move's next delta */
  struct evlist changed; /* while moving: the ids of the move's rows
                            changed since its last copy of this stripe
                            (repeats kept), so that its next delta visits
                            them alone (psd__note_change) */
  int changed_over;      /* 1: more changed than `changed` keeps
                            (PSD__CHANGED_MAX, or out of memory): the next
                            delta walks the set's rows */
};

/* A stripe's list of a move's changed rows holds this many ids at most. */
#define PSD__CHANGED_MAX 8192

struct psd_table {
  struct cm_table_conf conf; /* settings */
  uint64_t seed;             /* the job's */
  uint32_t nstate;           /* state floats per row */
  uint64_t gen; /* current change generation: read under a stripe's lock
                   and moved on by snapshots, with __atomic calls (a move's
                   snapshot holds one stripe at a time: table_snap.c) */
  struct cursor cur[PSD__NCURSORS];         /* by enum psd__cursor_of */
  uint8_t move_bits[CM_LAYOUT_BUCKETS / 8]; /* the move's buckets (its
                   first snapshot's), read under a moving stripe's lock */
  struct stripe st[PSD__NSTRIPES];          /* by stripe_of(id) */
  pthread_mutex_t stat_lock;                /* guards the counters */
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

/* Whether record r holds a row. */
static inline int psd__rec_live(const struct rec *r) {
  return r->prev != PSD__REC_FREE;
}

/* The table's generation now, for a row changed (under its stripe's
 * lock). */
static inline uint64_t psd__gen_now(struct psd_table *t) {
  return __atomic_load_n(&t->gen, __ATOMIC_RELAXED);
}

/* Under s's lock, once id's row was changed (stamped psd__gen_now): on a
 * stripe a move copies, a row of its buckets goes on the list its next
 * delta visits (table_move.c). */
void psd__note_moved_change(struct psd_table *t, struct stripe *s, uint64_t id);
static inline void psd__note_change(struct psd_table *t, struct stripe *s,
                                    uint64_t id) {
  if (s->moving && !s->changed_over)
    psd__note_moved_change(t, s, id);
}

/* The bucket of id (common/layout/layout.h), and its group in s. */
static inline unsigned psd__bucket_of(uint64_t id) {
  return cm_layout_bucket(cm_layout_id_hash(id));
}
static inline size_t psd__group_of(const struct stripe *s, unsigned b) {
  return b >> (CM_LAYOUT_BUCKET_BITS - s->hbits);
}

/* Under s's lock: the record number of id, or -1. */
static inline long psd__table_find(const struct stripe *s, uint64_t id) {
  return psd_rows_find(&s->rows, id, psd_rows_hash(id));
}
/* Under s's lock: creates id's record (hash h: psd_rows_hash) with its
 * initial row and state, on its bucket's list; returns its number, or -1
 * when out of memory. */
long psd__table_create(struct psd_table *t, struct stripe *s, uint64_t id,
                       uint64_t h);

/* Under s's lock: takes id's record k off its bucket's list and out of
 * the rows (rows.h), a free record. */
void psd__table_remove(struct stripe *s, size_t k);

/* Under s's lock: every row dropped (psd_rows_clear), the index emptied. */
void psd__table_clear(struct stripe *s);

/* ---- table_snap.c, shared with table_move.c ---- */

/* A row's id and its place in a snapshot's unsorted arrays. */
struct psd__ord {
  uint64_t id; /* the row's id (first: a uint64_t compare orders by it) */
  size_t at;   /* its place */
};

/* The scratch of a sort by id: twins of a snapshot's arrays, allocated
 * before its rows are copied, so that the sort after the locks are let go
 * cannot fail. */
struct psd__sorter {
  struct psd__ord *ord;     /* owned: n (id, place) pairs */
  uint64_t *ids;            /* owned: n ids */
  struct psd_row_stats *st; /* owned: n stats (NULL: the snapshot has none) */
  float *v, *a;             /* owned: n x dim values, n x nstate state */
};

/* Allocates w for n rows of s's shape (stats when s has them). Returns 0
 * or CM_ENOMEM (w empty). */
int psd__sorter_alloc(struct psd__sorter *w, const struct psd_table_snap *s,
                      size_t n);
/* Frees what w holds; w is then empty. */
void psd__sorter_free(struct psd__sorter *w);

/* Sorts s's rows by id, a permutation into w's arrays, which become s's
 * (its old ones go to w, for psd__sorter_free); w holds s->nrows rows at
 * least. Then its evicted ids (s->evicted not NULL), with unique their
 * repeats dropped. */
void psd__sort_snap(struct psd__sorter *w, struct psd_table_snap *s,
                    int unique);

/* Under s's lock: frees record k, its id kept by the cursors that keep
 * evictions for their next delta. Returns 0 or CM_ENOMEM (nothing
 * changed). */
int psd__evict(struct psd_table *t, struct stripe *s, size_t k);

#endif
