/* The shard's shared-memory arenas (docs/wire.md, "Same host, shared
 * memory"): a thread of its own listens on `<the .sock path>.shm`, takes
 * each client's hello (common/rpc/shm.h), checks the peer (SO_PEERCRED:
 * this user, root or job.socket_owner), the job, the token (in constant
 * time), the memfd's seals and size, maps the arena MAP_SHARED and answers
 * a random 128-bit key. It watches each hello's connection: its end (the
 * client closed or died) drops the arena, unmapped once no call uses it.
 *
 * The handlers of Pull and Push find an arena by key (psd_shm_range), use
 * its bytes, and let it go (psd_shm_put). There is one registry per
 * process, like the stop signals' pipe (stopsig.h): psd_shm_start makes
 * it, psd_shm_stop (from psd_local_stop) ends it. Nothing here runs on
 * the libuv loop. */
#ifndef PSD_SHM_H
#define PSD_SHM_H

#include <stddef.h>
#include <stdint.h>

struct psd_shm_arena;

/* Listens on unix_path + ".shm" for the clients of job (token: the spec's,
 * "" without auth; owner: job.socket_owner, "" for none) and starts the
 * thread. 0, or an error with why saying it (the shard then serves bytes
 * only). */
int psd_shm_start(const char *unix_path, const char *job, const char *token,
                  const char *owner, char *why, size_t len);

/* Stops the thread, closes every hello connection and removes the socket
 * file; arenas still in use are unmapped by their last psd_shm_put. Safe
 * when never started. */
void psd_shm_stop(void);

/* The arena named (hi, lo) and its bytes [offset, offset + length), which
 * must be exactly `want` bytes long. On success *a holds a reference
 * (psd_shm_put it) and *ptr points at offset. Returns 0; CM_ENOENT for an
 * unknown key; CM_ERANGE for a range outside the arena or not `want` long,
 * with why naming the field of ShmRef at fault. */
int psd_shm_range(uint64_t hi, uint64_t lo, uint64_t offset, uint64_t length,
                  uint64_t want, struct psd_shm_arena **a, uint8_t **ptr,
                  char *why, size_t len);

/* Lets go of a reference from psd_shm_range; NULL is ignored. */
void psd_shm_put(struct psd_shm_arena *a);

/* Arenas mapped now, and registered since start (for tests and status). */
unsigned long psd_shm_mapped(void);
unsigned long psd_shm_registered(void);

#endif
