/* The client's shared-memory arenas (shm_client.h): registering one with a
 * shard over its .shm socket, taking them for a transfer, copying a push's
 * gradient in (the NaN scan in the same pass), retiring them. */
#include "shm_client.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "client_internal.h"
#include "endpoint.h"
#include "err.h"
#include "finite.h"
#include "log.h"
#include "shm.h"

/* The smallest arena, and the unit arenas are rounded up to. */
#define ARENA_UNIT 4096u

void psc__shm_retire(struct psc__client *c, int s) {
  struct psc__shm *sh = &c->shm[s];
  if (sh->base)
    munmap(sh->base, sh->size);
  if (sh->conn >= 0)
    close(sh->conn);
  sh->base = NULL;
  sh->conn = -1;
  sh->size = sh->half = 0;
  sh->using = 0;
}

void psc__shm_free(struct psc__client *c) {
  if (!c->shm)
    return;
  for (int s = 0; s < c->spec->nps; s++) {
    psc__shm_retire(c, s);
    pthread_mutex_destroy(&c->shm[s].busy);
  }
  free(c->shm);
  c->shm = NULL;
}

/* Lays the plan out in the arenas: each message's place in its shard's
 * part (messages are planned shard by shard), and each shard's part size
 * into part[s]. */
static void layout(struct psc__client *c, uint64_t *part) {
  memset(part, 0, (size_t)c->nshards * sizeof *part);
  for (int i = 0; i < c->nmsgs; i++) {
    struct psc__msg *m = &c->msgs[i];
    m->shm_at = part[m->shard];
    part[m->shard] += m->bytes;
  }
}

/* Whether shard s's arena is registered, alive and large enough for a
 * part of `part` bytes. */
static int usable(struct psc__client *c, int s, uint64_t part) {
  struct psc__shm *sh = &c->shm[s];
  struct pollfd pf = {sh->conn, POLLIN | POLLRDHUP, 0};
  if (!sh->base || sh->conn < 0 || sh->boot != c->boot[s] || sh->half < part)
    return 0;
  /* The shard never writes after its answer: anything is its end. */
  return poll(&pf, 1, 0) == 0;
}

/* Logs once per shard (until it registers again) why its bytes go over
 * the socket. */
static void say_fallback(struct psc__client *c, int s, const char *why) {
  if (c->shm[s].said)
    return;
  c->shm[s].said = 1;
  cm_warn("ps:%d (%s): no shared memory: %s; sending tensor bytes over the "
          "socket",
          s, c->spec->ps[s].text, why);
}

/* Registers a new arena of 2 * part bytes with shard s, where the shard is
 * on this host and serves its .shm socket. 0 when registered. */
static int enroll(struct psc__client *c, int s, uint64_t part) {
  struct psc__shm *sh = &c->shm[s];
  struct cm_shm_answer ans;
  struct timeval tv = {5, 0};
  char path[200], shm_path[220], why[1024];
  uint64_t half = (part + ARENA_UNIT - 1) / ARENA_UNIT * ARENA_UNIT;
  int fd = -1, memfd = -1, rc;
  void *base = MAP_FAILED;

  psc__shm_retire(c, s);
  if (sh->refused_at && sh->refused_at == c->boot[s])
    return CM_EUNAVAIL;
  if (!half)
    half = ARENA_UNIT;
  if (!cm_endpoint_unix_candidate(c->spec->job.name, &c->spec->ps[s],
                                  c->spec->job.unix_sockets && !c->creds.tls,
                                  path, sizeof path) ||
      cm_shm_socket_path(path, shm_path, sizeof shm_path))
    return CM_EUNAVAIL;
  rc = cm_endpoint_unix_connect(shm_path, c->spec->job.socket_owner, &fd, why,
                                sizeof why);
  if (rc == CM_EEXIST)
    say_fallback(c, s, why);
  if (rc)
    return rc; /* no .shm socket: a shard without shared memory */
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  if ((rc = cm_shm_memfd_new(2 * half, &memfd, why, sizeof why)))
    goto fail;
  base = mmap(NULL, 2 * half, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
  if (base == MAP_FAILED) {
    snprintf(why, sizeof why, "mmap of the arena: %s", strerror(errno));
    rc = CM_ESYS;
    goto fail;
  }
  if (cm_shm_hello_send(fd, c->spec->job.name, c->creds.token, 2 * half,
                        memfd) ||
      cm_shm_answer_recv(fd, &ans)) {
    snprintf(why, sizeof why, "the hello on %s went unanswered", shm_path);
    rc = CM_EUNAVAIL;
    goto fail;
  }
  if (!ans.ok) {
    snprintf(why, sizeof why, "the shard refused the arena: %s", ans.reason);
    sh->refused_at = c->boot[s];
    rc = CM_EUNAVAIL;
    goto fail;
  }
  close(memfd);
  sh->conn = fd;
  sh->base = base;
  sh->size = 2 * half;
  sh->half = half;
  sh->key[0] = ans.key[0];
  sh->key[1] = ans.key[1];
  sh->boot = c->boot[s];
  sh->said = 0;
  return 0;
fail:
  say_fallback(c, s, why);
  if (base != MAP_FAILED)
    munmap(base, 2 * half);
  if (memfd >= 0)
    close(memfd);
  close(fd);
  return rc;
}

/* Makes c->shm, once. */
static int ensure_array(struct psc__client *c) {
  int rc = 0;
  pthread_mutex_lock(&c->lock);
  /* For the pool: a layout that moves keeps the array. */
  if (!c->shm && (c->shm = calloc((size_t)c->spec->nps, sizeof *c->shm))) {
    for (int s = 0; s < c->spec->nps; s++) {
      c->shm[s].conn = -1;
      pthread_mutex_init(&c->shm[s].busy, NULL);
    }
  }
  if (!c->shm)
    rc = CM_ENOMEM;
  pthread_mutex_unlock(&c->lock);
  return rc;
}

int psc__shm_begin(struct psc__client *c) {
  uint64_t part_stack[64], *part = part_stack;
  int n = 0;
  if (!c->spec->job.shared_memory || c->wire_bf16 || c->creds.tls ||
      !c->spec->job.unix_sockets || ensure_array(c))
    return 0;
  if (c->nshards > 64 && !(part = calloc((size_t)c->nshards, sizeof *part)))
    return 0;
  layout(c, part);
  for (int s = 0; s < c->nshards; s++) {
    struct psc__shm *sh = &c->shm[s];
    if (!part[s] || pthread_mutex_trylock(&sh->busy))
      continue;
    sh->held = 1;
    if (usable(c, s, part[s]) || !enroll(c, s, part[s])) {
      sh->using = 1;
      n++;
    }
  }
  if (part != part_stack)
    free(part);
  return n;
}

void psc__shm_end(struct psc__client *c) {
  if (!c->shm)
    return;
  for (int s = 0; s < c->nshards; s++) {
    struct psc__shm *sh = &c->shm[s];
    if (!sh->held)
      continue;
    sh->using = sh->held = 0;
    pthread_mutex_unlock(&sh->busy);
  }
}

uint64_t psc__shm_at(const struct psc__client *c, int msg, int pull) {
  const struct psc__msg *m = &c->msgs[msg];
  return m->shm_at + (pull ? c->shm[m->shard].half : 0);
}

void psc__shm_fill(struct psc__client *c, int scan, int *var, uint64_t *elem) {
  *var = -1;
  *elem = 0;
  for (int i = 0; i < c->nmsgs; i++) {
    const struct psc__msg *m = &c->msgs[i];
    int in = c->shm && c->shm[m->shard].using;
    float *dst =
        in ? (float *)(void *)(c->shm[m->shard].base + m->shm_at) : NULL;
    if (!m->push_bytes || (!in && !scan))
      continue;
    for (int k = 0; k < m->npieces; k++) {
      const struct psc__piece *p = &c->pieces[m->first + k];
      const float *src = c->vars[p->var].grad + p->offset;
      size_t bad = p->count;
      if (!psc__pushed(c, p->var))
        continue;
      if (in && scan)
        bad = cm_copy_first_nonfinite(dst, src, p->count);
      else if (in)
        memcpy(dst, src, p->count * sizeof(float));
      else
        bad = cm_first_nonfinite(src, p->count);
      if (in)
        dst += p->count;
      if (bad < p->count && (*var < 0 || p->var < *var ||
                             (p->var == *var && p->offset + bad < *elem))) {
        *var = p->var;
        *elem = p->offset + bad;
      }
    }
  }
}

uint64_t psc__client_shm_bytes(struct psc__client *c, int shard) {
  uint64_t bytes = 0;
  if (shard < 0 || shard >= c->nshards || !psc__shm_begin(c)) {
    psc__shm_end(c);
    return 0;
  }
  if (c->shm[shard].using)
    bytes = c->shm[shard].size;
  psc__shm_end(c);
  return bytes;
}
