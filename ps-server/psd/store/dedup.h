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
 * exceed the clients that push at once (psd uses PSD_DEDUP_CLIENTS).
 *
 * Persistence (async mode). The table is saved in each checkpoint
 * (psd_dedup_save into manifest.json) and restored at start
 * (psd_dedup_load), so a retry of a message whose effect the restored
 * checkpoint holds (a kill -9 between a push and its answer) stays a
 * duplicate. That needs the saved table to match the saved values exactly,
 * which is what the apply gate is for: async appliers hold it shared from
 * just before their claim until their values are changed
 * (psd_dedup_apply_begin/end), and the checkpoint holds it alone while it
 * takes the values and the table (psd_dedup_freeze/thaw). The gate lives
 * here because it guards the pairing of a claim with its effect, which
 * only this table's users know about; the store's per-variable locks do
 * not cover it. Sync mode never saves the table: a sync checkpoint is
 * taken between commits, and pushes staged for the open step are claimed
 * here but in no saved value, so their retries after a restart must be
 * applied (staged) again. */
#ifndef PSD_DEDUP_H
#define PSD_DEDUP_H

#include <stddef.h>
#include <stdint.h>

/* Clients a shard remembers (about 56 bytes each). */
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

/* A table for up to capacity (>= 1) clients. Returns 0 or CM_ENOMEM,
 * CM_EINVAL, CM_ESYS (the gate could not be made). */
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

/* The apply gate, a writer-preferring read-write lock (a checkpoint does
 * not starve under constant pushes). An applier takes it shared with
 * apply_begin just before its claim and gives it back with apply_end once
 * it has applied (or refused) the message; never twice on one thread (a
 * waiting freeze would deadlock it). freeze takes it alone: once it
 * returns, every claim recorded is applied and no claim or apply runs
 * until thaw. */
void psd_dedup_apply_begin(struct psd_dedup *d);
void psd_dedup_apply_end(struct psd_dedup *d);
void psd_dedup_freeze(struct psd_dedup *d);
void psd_dedup_thaw(struct psd_dedup *d);

/* The table as JSON, for a checkpoint's manifest: an array of
 *   {"client": "<16 hex digits>", "seq": "<16 hex digits>",
 *    "chunks": ["<16 hex digits>", ...]}
 * least recently used first; chunks[k] holds chunks 64k..64k+63 of seq
 * (bit c % 64), trailing zero words left out. u64s are hex strings because
 * JSON integers are int64 in jansson (a client picks its seq). Taken under
 * the table's mutex: one instant of the table; under freeze it also
 * matches the values. *out is a new reference the caller owns. Returns 0
 * or CM_ENOMEM. */
struct json_t;
int psd_dedup_save(struct psd_dedup *d, struct json_t **out);

/* Adds the clients of a psd_dedup_save array to d (meant for a new table;
 * the saved order becomes the eviction order, and a table smaller than the
 * snapshot keeps its most recent clients). snap is borrowed. Returns 0,
 * CM_ENOMEM, or CM_EFORMAT with err naming the field ("dedup[3].client:
 * ..."): not an array, an entry that is not {client, seq, chunks}, a
 * client that is 0 or twice, a value that is not 16 hex digits, more
 * chunk words than PSD_DEDUP_MAX_CHUNKS needs. On error d holds part of
 * the snapshot: free it. */
int psd_dedup_load(struct psd_dedup *d, const struct json_t *snap, char *err,
                   size_t errlen);

#endif
