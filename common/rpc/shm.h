/* The same-host shared-memory arena's hello, which both its ends share
 * (docs/wire.md, "Same host, shared memory").
 *
 * A client on a shard's host makes a memfd (cm_shm_memfd_new: sealed
 * against shrinking, so the shard's mapping can never SIGBUS), connects to
 * the shard's second Unix socket, `<the .sock path>.shm`
 * (cm_shm_socket_path), and sends one hello: the job's name, the spec's
 * token ("" without auth) and the arena's size, the memfd riding along in
 * SCM_RIGHTS (cm_shm_hello_send). The shard reads it (cm_shm_hello_recv),
 * checks the peer, the token, the seals and the size, maps the arena and
 * answers a random 128-bit key that names it in Pull and Push requests
 * (ShmRef in ps.proto), or a refusal with its reason (cm_shm_answer_*).
 * The connection stays open for the client's life: its end tells the shard
 * to drop the arena. */
#ifndef CM_SHM_H
#define CM_SHM_H

#include <stddef.h>
#include <stdint.h>

/* The name every arena's memfd has: /proc/PID/maps shows its mappings as
 * "/memfd:psd-shm (deleted)". */
#define CM_SHM_NAME "psd-shm"

/* The largest arena a shard maps. */
#define CM_SHM_MAX_BYTES (1ull << 40)

/* Longest job name and token a hello carries. */
#define CM_SHM_MAX_JOB 256
#define CM_SHM_MAX_TOKEN 4096

/* A hello, as the shard received it. */
struct cm_shm_hello {
  char job[CM_SHM_MAX_JOB + 1];     /* the job's name */
  char token[CM_SHM_MAX_TOKEN + 1]; /* the client's token, "" without auth */
  uint64_t size;                    /* bytes of the arena, as claimed */
};

/* The shard's answer. */
struct cm_shm_answer {
  int ok;           /* 1: registered under key */
  uint64_t key[2];  /* the arena's key (hi, lo) */
  char reason[512]; /* ok 0: why the shard refused */
};

/* Writes `unix_path` + ".shm" to buf. 0, or CM_EINVAL when it would not
 * fit in a Unix socket's address. */
int cm_shm_socket_path(const char *unix_path, char *buf, size_t len);

/* Makes a memfd of size bytes named CM_SHM_NAME, close-on-exec, sealed
 * against shrinking and against further seals, into *fd. 0 or CM_ESYS (why
 * says which call failed). */
int cm_shm_memfd_new(uint64_t size, int *fd, char *why, size_t len);

/* 0 when memfd is a memfd sealed against shrinking (F_SEAL_SHRINK) and
 * further seals (F_SEAL_SEAL) and holds at least size bytes; else
 * CM_EINVAL with why saying what is wrong. */
int cm_shm_check_memfd(int memfd, uint64_t size, char *why, size_t len);

/* Client: sends the hello on the connected socket sock, memfd attached.
 * 0 or CM_ESYS / CM_EINVAL. */
int cm_shm_hello_send(int sock, const char *job, const char *token,
                      uint64_t size, int memfd);

/* Shard: reads one hello from sock (blocking; a receive timeout on sock
 * bounds it) into *h and the memfd it carried into *memfd (-1 when none).
 * 0, CM_EPROTO for a malformed hello, CM_ESYS on a socket error or EOF. */
int cm_shm_hello_recv(int sock, struct cm_shm_hello *h, int *memfd);

/* Shard: sends an answer. 0 or CM_ESYS. */
int cm_shm_answer_send(int sock, const struct cm_shm_answer *a);

/* Client: reads the answer (blocking, bounded by sock's receive timeout).
 * 0, CM_EPROTO or CM_ESYS. */
int cm_shm_answer_recv(int sock, struct cm_shm_answer *a);

/* 1 when a and b (NUL-terminated) are equal, in time that depends only on
 * their lengths. */
int cm_shm_token_equal(const char *a, const char *b);

#endif
