/* What the files of a live layout switch share (switch.h):
 *   switch.c       Admin/SwitchLayout's phases, the watch, the object
 *   switch_rows.c  PREPARE's staging and Admin/DenseRows
 *   switch_disk.c  the switch on disk, and resumed into at start */
#ifndef PSD_SWITCH_INTERNAL_H
#define PSD_SWITCH_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include "request.h"
#include "rpc_server.h"
#include "switch.h"

/* Where a shard is in a switch. */
enum state {
  IDLE = 0,  /* none under way */
  FROZEN,    /* FREEZE done */
  PREPARING, /* PREPARE's thread runs */
  PREPARED,  /* staging ready for COMMIT */
};

struct psd_switch {
  struct psd_server *srv;         /* borrowed */
  struct cm_request_host host;    /* how its requests are taken */
  struct cm_rpc_method method[2]; /* SwitchLayout, DenseRows */
  struct psd_peers *peers;        /* owned, made at the first PREPARE */
  pthread_mutex_t lock;           /* guards everything below */
  enum state state;               /* where this shard is */
  int busy;                       /* a FREEZE or PREPARE thread runs */
  pthread_t thread;               /* that thread, joined by the next */
  int joinable;                   /* thread is to be joined */
  struct cm_rpc_call *call;       /* the call the thread answers */
  int from, to;                   /* the switch under way: its counts */
  uint64_t layout;                /* and the layout it makes */
  double frozen_at;               /* cm_mono_ms() at its FREEZE */
  struct psd_store *staged;       /* PREPARE's new slices (owned) */
  uint64_t bytes;                 /* bytes PREPARE fetched */
  int last_from, last_to;         /* the last switch committed here */
  uint64_t last_layout;           /* its layout (0: none) */
  uint64_t last_pause_us;         /* its pause */
  pthread_t watch;                /* the watch over a frozen shard */
  int watching;                   /* watch was started (joined by the
                                     next, and by psd_switch_free) */
  int watch_done;                 /* and has ended */
  int stopping;                   /* psd_switch_free: the watch ends */
  pthread_cond_t wake;            /* wakes the watch early */
};

/* PREPARE (on its thread, w->busy): stages this shard's new slices of
 * every variable into a new store, w->staged, from its own rows and those
 * it fetches (Admin/DenseRows) from the other old shards; *nvars counts
 * them, w->bytes the bytes fetched. Returns 0 or an error code (err). */
int psd__switch_prepare(struct psd_switch *w, int *nvars, char *err,
                        size_t errlen);

/* Admin/DenseRows's handler (ctx: the switch): a frozen shard's catalog,
 * or its rows of one variable. */
void psd__switch_dense_rows(struct cm_rpc_call *call, grpc_byte_buffer *bb,
                            void *ctx);

#endif
