/* cm_random_id (rand.h): the random ids that tell apart what must never be
 * confused, a client's pushes (PushRequest.client_id) and a psd process
 * (its boot id, DeclareResponse.boot). */
#include "rand.h"

#include <stdint.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

uint64_t cm_random_id(const void *salt) {
  uint64_t id = 0;
  if (getrandom(&id, sizeof id, GRND_NONBLOCK) != (ssize_t)sizeof id) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t st = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    st ^= (uint64_t)getpid() << 32 ^ (uint64_t)(uintptr_t)salt;
    id = cm_splitmix64(&st);
  }
  return id ? id : 1;
}
