/* splitmix64 (Steele, Lea and Flood, 2014), the one generator of psd: the
 * initial values (counter-based, vars/init.c), the data order (dworker's
 * shuffle), the client's retry jitter, and the hash of the push-dedup
 * table. Inline: init.c and dedup.c call it once per element or lookup.
 * Also random ids (rand.c). */
#ifndef CM_RAND_H
#define CM_RAND_H

#include <stdint.h>

/* The golden-ratio increment between splitmix64's states. */
#define CM_SPLITMIX64_GAMMA 0x9e3779b97f4a7c15ull

/* splitmix64's finalizer: a bijection of 64-bit words that mixes every
 * input bit into every output bit. */
static inline uint64_t cm_mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* The next value of the generator whose state is *state (advanced). */
static inline uint64_t cm_splitmix64(uint64_t *state) {
  return cm_mix64(*state += CM_SPLITMIX64_GAMMA);
}

/* The value the generator gives from state x (x is not advanced): for
 * counter-based streams, the i-th value of a key k is cm_splitmix64_at(k + i).
 */
static inline uint64_t cm_splitmix64_at(uint64_t x) {
  return cm_mix64(x + CM_SPLITMIX64_GAMMA);
}

/* A random id, never 0 (which means "none" on the wire): the kernel's
 * random bytes, or the time, the process and salt (any address) mixed when
 * those fail. rand.c. */
uint64_t cm_random_id(const void *salt);

#endif
