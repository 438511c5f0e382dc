/* A sparse call's plan (sparse_plan.c), shared with the calls that run it
 * (sparse.c): the messages, and each table's ids made unique and grouped by
 * shard. Internal to libpsclient. */
#ifndef PSC_SPARSE_PLAN_H
#define PSC_SPARSE_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "client_internal.h"

/* One message of a sparse call: some unique ids of one table for one
 * shard, a run of the plan's uid and head arrays. */
struct psc__smsg {
  int r;          /* index into the call's psc__rows */
  int shard;      /* destination */
  size_t first;   /* its first unique id's index in the plan's arrays */
  size_t n;       /* unique ids in it */
  float *urow;    /* its rows in the plan's urows: a pull's answer, a
                     push's summed gradients (borrowed) */
  uint32_t dim;   /* the table's row width */
  uint32_t chunk; /* its index among the call's messages to its shard */
  int pending;    /* 1 until answered OK (or a closed step) */
};

/* A sparse call in progress. Its plan: every table's ids made unique and
 * grouped by shard in one pass (plan()): uid[u] is unique id u (by table,
 * shard, first use), head[u] the first of its positions in its table's
 * ids, uix[base[i] + k] the unique id of position k of table i (counted
 * from ufirst[i]), and urows the unique ids' rows, table i's from roff[i].
 * A pull's answers land in urows, then one pass in position order copies
 * them to the caller; a push's rows are summed into urows in one pass in
 * position order, the order the shard would sum them in. */
struct psc__scall {
  struct psc__client *c;
  int push;               /* 1: push, 0: pull */
  struct psc__rows *rows; /* the caller's (const for a push) */
  int sync;               /* sync: min_version/step and gen are sent */
  uint64_t min_version;   /* pull: the version to wait for */
  uint64_t step;          /* push: the step staged for */
  uint64_t seq;           /* push: this push's dedup seq */
  int closed;             /* push: a shard said the step is closed */
  int rolled;             /* pull: an answer said the job rolled back */
  int moved;              /* an answer said the layout moved (its message
                             in c->moved): the call re-plans */
  uint32_t chunk_next;    /* push: the next chunk index for a regrouped
                             message, past every planned one */
  struct psc__smsg *msgs; /* owned */
  int nmsgs;              /* entries in msgs */
  uint64_t *uid;          /* owned: unique ids */
  uint32_t *head;         /* owned: uid[u]'s first position in its table */
  uint32_t *uix;          /* owned: per position of every table's ids */
  size_t *base;           /* owned: per table, its positions' offset in uix */
  size_t *ufirst;         /* owned: per table, its first unique id's index */
  size_t *roff;           /* owned: per table, its rows' offset in urows */
  float *urows;           /* owned: the unique ids' rows */
};

/* Past the most ids one table's part of a call may hold. */
#define PSC__SPARSE_NO_POS UINT32_MAX

/* The declared table called name, or NULL. */
const struct psc__table_state *psc__sparse_table(const struct psc__client *c,
                                                 const char *name);

/* Plans sc's call over its rows r[0..nr): sc->msgs and the plan's arrays
 * (owned by sc: psc__sparse_plan_free). Returns 0, or an error in c->err
 * (a table not declared, an id past its bound, out of memory). */
int psc__sparse_plan(struct psc__scall *sc, int nr);

/* A push: every table's rows summed per unique id into sc->urows. */
void psc__sparse_sum_rows(struct psc__scall *sc, int nr);

/* A pull, every message answered: sc->urows copied to every position of
 * the caller's rows. */
void psc__sparse_copy_out(struct psc__scall *sc, int nr);

/* Frees what psc__sparse_plan made (sc->msgs and the arrays), which it
 * may then make again. */
void psc__sparse_plan_free(struct psc__scall *sc);

/* A push whose layout moved to map's: the ids of its messages still
 * pending (with their summed rows) regrouped by their shard in the new
 * layout (cm_layout_map_id_shard) and cut into
 * messages of at most chunk_bytes of rows, which replace sc->msgs, each
 * pending, with chunk indexes from sc->chunk_next on. An acknowledged id
 * is in none. Returns 0, or CM_ENOMEM with an error in c->err (sc as it
 * was). */
int psc__sparse_regroup(struct psc__scall *sc, const struct cm_layout_map *map,
                        size_t chunk_bytes);

#endif
