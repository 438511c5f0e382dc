/* Idempotent pushes: which push messages a shard has applied, per client.
 *
 * A client that retries a push (its answer was lost: a deadline, a broken
 * connection) sends the same message again. Every push message names
 * (client, seq, chunk): client is random per libpsclient client, seq numbers
 * its logical pushes and chunk the push's messages to this shard. A client
 * pushes one seq at a time and only moves to seq + 1 once every message of
 * seq was acknowledged, so the shard keeps, per client, the newest seq and
 * which of its chunks it applied: a message of an older seq, or a chunk
 * already applied, is a duplicate, answered OK without effect.
 *
 * Memory is bounded: at most `capacity` clients are remembered; making room
 * forgets the one heard from longest ago (a client that has stopped pushing).
 * A forgotten client's retry would be applied again, so the capacity must
 * exceed the clients that push at once (psd uses PSD_DEDUP_CLIENTS). The
 * table is not persisted: a restarted shard applies a retry of a message
 * whose effect its checkpoint holds (a kill -9 between a push and its
 * answer). */
#ifndef PSD_DEDUP_H
#define PSD_DEDUP_H

#include <stdint.h>

/* Clients a shard remembers (about 64 bytes each). */
#define PSD_DEDUP_CLIENTS 4096
/* Chunks of one push a shard can tell apart; a chunk index at or above this
 * (more than 128 GiB to one shard in 2 MiB messages) is always applied. */
#define PSD_DEDUP_MAX_CHUNKS 65536

struct psd_dedup;

/* What psd_dedup_stats reports. */
struct psd_dedup_stats {
  uint64_t duplicates; /* claims answered as duplicates */
  uint32_t clients;    /* clients remembered now */
  uint64_t evicted;    /* clients forgotten to make room */
};

/* A table for up to capacity (>= 1) clients. Returns 0 or CM_ENOMEM/EINVAL. */
int psd_dedup_new(struct psd_dedup **out, int capacity);
void psd_dedup_free(struct psd_dedup *d);

/* Claims message (client, seq, chunk) before it is applied. Returns 0 when
 * it is new (it is now recorded as applied), 1 when it is a duplicate (do
 * not apply it; counted), or CM_ENOMEM (apply it: nothing was recorded).
 * client 0 has no identity: always 0, nothing recorded. Thread-safe. */
int psd_dedup_claim(struct psd_dedup *d, uint64_t client, uint64_t seq,
                    uint32_t chunk);

/* Takes back a claim whose message was then refused (not applied), so that
 * its retry is applied. No effect when the client has moved on. */
void psd_dedup_unclaim(struct psd_dedup *d, uint64_t client, uint64_t seq,
                       uint32_t chunk);

void psd_dedup_stats(struct psd_dedup *d, struct psd_dedup_stats *out);

#endif
