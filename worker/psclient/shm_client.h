/* libpsclient's side of the same-host shared-memory arenas (docs/wire.md,
 * "Same host, shared memory"; the hello in common/rpc/shm.h): one arena
 * per shard on this host, registered with the shard at the first transfer
 * (or psc__client_shm_bytes), sized to the shard's share of the plan twice
 * over (the push part, then the pull part, so that one push_pull fits).
 * Each planned message has its fixed place in each part (psc__msg.shm_at).
 *
 * A transfer takes each arena with a trylock (psc__shm_begin): a shard
 * whose arena another thread holds, or that has none, gets bytes as
 * before. A failed call to a shard retires its arena (psc__shm_retire):
 * the retries go as bytes, and the next transfer registers a new one, so a
 * late call of the old one can never meet the next transfer's bytes. */
#ifndef PSC__SHM_CLIENT_H
#define PSC__SHM_CLIENT_H

#include <pthread.h>
#include <stdint.h>

struct psc__client;

/* One shard's arena, as the client holds it. */
struct psc__shm {
  int conn;             /* the hello's connection (its end drops the arena at
                           the shard), -1: none */
  uint8_t *base;        /* the client's mapping, NULL: none */
  uint64_t size;        /* bytes of the arena */
  uint64_t half;        /* where the pull part begins */
  uint64_t key[2];      /* the key the shard answered */
  uint64_t boot;        /* the shard's boot id when registered */
  uint64_t refused_at;  /* the boot id a refusal came from (not tried again
                           until the shard restarts), 0: none */
  int said;             /* the fallback to bytes was logged */
  int using;            /* the current transfer sends through it */
  int held;             /* the current transfer holds busy */
  pthread_mutex_t busy; /* held by the transfer that uses it */
};

/* Frees every arena of c (their connections closed: the shards drop
 * theirs). */
void psc__shm_free(struct psc__client *c);

/* Takes the arena of every shard that can have one (registering it first
 * when needed) for the transfer about to run; sets each one's `using`.
 * Returns how many are in use. */
int psc__shm_begin(struct psc__client *c);

/* Lets go of the arenas the transfer used. */
void psc__shm_end(struct psc__client *c);

/* Retires shard s's arena (a call to it failed): unmapped, its connection
 * closed; the next transfer registers a new one. Keeps the transfer's hold. */
void psc__shm_retire(struct psc__client *c, int s);

/* Copies every pushed piece of the messages to shards in use into their
 * arenas; with `scan`, finds the first NaN or infinity of the whole push
 * (in the copy's pass where a piece is copied, by a scan elsewhere): the
 * first variable in declaration order that has one, and its first element,
 * into *var and *elem (*var -1: none). */
void psc__shm_fill(struct psc__client *c, int scan, int *var, uint64_t *elem);

/* Where the shard of message index `msg` reads its push (pull 0) or writes
 * its pull (pull 1) in the arena. */
uint64_t psc__shm_at(const struct psc__client *c, int msg, int pull);

#endif
