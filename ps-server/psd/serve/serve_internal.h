/* What the files of a serving task share (serve.h), and nothing else
 * includes:
 *   serve.c         the object, its state, and a publication applied in
 *                   place
 *   serve_follow.c  the follower: which publication to read next, and the
 *                   refusals
 *   serve_lookup.c  the handlers: Serve/Lookup, Admin/Status, and every
 *                   other call refused by name
 * Every field under `lock` is read by the handlers (gRPC's thread) with it
 * held shared, and written by an apply (psd's loop) with it held
 * exclusively. */
#ifndef PSD_SERVE_INTERNAL_H
#define PSD_SERVE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "layout.h"
#include "request.h"
#include "rpc_server.h"
#include "serve.h"
#include "serve_table.h"
#include "tabconf.h"

/* Methods served: every rpc of proto/ps.proto (serve_lookup.c). */
#define PSD__SERVE_NMETHODS 24

/* A table a serving task answers for. */
struct psd__serve_tab {
  struct cm_table_conf conf;    /* its name, dim and initializer (the spec's
                                   entry or job.table_defaults; the dim as
                                   published) */
  struct psd_serve_table *rows; /* owned; NULL for a spec table no
                                   publication held yet */
};

/* A dense variable's rows on the training shard served. */
struct psd__serve_dense {
  char name[201];    /* the variable */
  int64_t shape[8];  /* its whole shape */
  int ndim;          /* dimensions in shape */
  int64_t row_begin; /* first row held here */
  int64_t row_end;   /* one past the last */
  float *values;     /* owned: (row_end - row_begin) x row size */
  size_t nvalues;    /* floats in values */
};

/* A refused call's name, for its handler (ctx). */
struct psd__serve_refusal {
  struct psd_serve *s; /* the task */
  char call[48];       /* "Data/Push" */
};

struct psd_serve {
  /* What it follows (copied from the conf). */
  char dir[1024];                    /* the shard's publications */
  char job[64];                      /* the job's name */
  int replica, shard, shards;        /* serve:J, J % nps, nps */
  uint64_t seed;                     /* the job's */
  struct cm_table_conf *spec_tables; /* owned copy of job.tables */
  int nspec;                         /* entries in spec_tables */
  struct cm_table_conf defaults;     /* job.table_defaults */
  uint64_t max_message;              /* largest answer, bytes */

  /* The version held: under lock. */
  pthread_rwlock_t lock;             /* shared: Lookup, Status; exclusive: an
                                        apply */
  struct psd__serve_tab *tabs;       /* owned, ntabs (spec tables first) */
  int ntabs;                         /* entries in tabs */
  struct psd__serve_dense *dense;    /* owned, ndense: the version's */
  int ndense;                        /* entries in dense */
  uint64_t version, base, step;      /* 0 version: nothing loaded */
  struct cm_layout_map map;          /* the version's row map: which ids are
                                        this shard's (a fresh job's buckets
                                        until one is loaded) */
  uint64_t layout;                   /* the version's layout (its version) */
  int lshards;                       /* and its shard count */
  int move_to, moved;                /* and its live move (0, 0: none) */
  double left_ms[CM_LAYOUT_BUCKETS]; /* per bucket: when (cm_mono_ms) a
                                        version gave it to another shard,
                                        its rows still answered here until
                                        keep_left_ms later; 0: not left */
  double keep_left_ms;               /* the conf's */
  int64_t time_unix_ms;              /* the version's cut */

  /* The follower (psd's loop only; the counters under stat_lock). */
  int need_full;             /* a refusal broke the chain: only a full
                                publication after floor is loaded */
  uint64_t floor;            /* versions at or below it are never read
                                again (refused, or older than held) */
  uint64_t checked;          /* the newest version looked at while waiting
                                for a full one (not read again) */
  int list_failed;           /* the directory could not be listed (said
                                once) */
  int went_back;             /* its newest version is older than the one
                                held (said once) */
  pthread_mutex_t stat_lock; /* guards the four below */
  uint64_t newest_seen;      /* newest version in the directory */
  uint64_t applied, refused; /* publications applied, refused */
  char last_refusal[1024];   /* why the last was refused */

  /* The handlers. */
  struct cm_request_host host;  /* refusals, caller checks */
  struct cm_server *rpc;        /* borrowed: unauthenticated */
  struct timespec started;      /* for uptime */
  atomic_uint_fast64_t lookups; /* Lookups answered */
  atomic_uint_fast64_t errors;  /* calls answered with an error */
  struct cm_rpc_method methods[PSD__SERVE_NMETHODS];       /* served */
  int nmethods;                                            /* entries used */
  struct psd__serve_refusal refusals[PSD__SERVE_NMETHODS]; /* their ctx */
  char paths[PSD__SERVE_NMETHODS][64]; /* methods[i].path's storage */
};

/* The table called name, or NULL (under lock). */
struct psd__serve_tab *psd__serve_find(struct psd_serve *s, const char *name);

/* Rows held and bytes of memory held (under lock). */
void psd__serve_size(struct psd_serve *s, uint64_t *rows, uint64_t *bytes);

/* Fills s->methods (serve_lookup.c). */
void psd__serve_methods_init(struct psd_serve *s);

#endif
