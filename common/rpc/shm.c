/* The shared-memory arena's hello, both ends (shm.h). On the wire, in the
 * host's byte order (both ends share the host): a hello is the magic
 * "PSDSHM01", the job's length and the token's (u32 each), the arena's
 * size (u64), then the job and the token; the memfd rides along with its
 * first byte. An answer is "PSDSHMA1", ok and the reason's length (u32
 * each), the key (two u64), then the reason. */
#include "shm.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "err.h"

static const char HELLO_MAGIC[8] = "PSDSHM01";
static const char ANSWER_MAGIC[8] = "PSDSHMA1";

/* The fixed part of a hello. */
struct hello_head {
  char magic[8];      /* HELLO_MAGIC */
  uint32_t job_len;   /* bytes of the job's name that follow */
  uint32_t token_len; /* bytes of the token after it */
  uint64_t size;      /* the arena's bytes */
};

/* The fixed part of an answer. */
struct answer_head {
  char magic[8];       /* ANSWER_MAGIC */
  uint32_t ok;         /* 1: registered */
  uint32_t reason_len; /* bytes of the reason that follow */
  uint64_t key[2];     /* the arena's key */
};

int cm_shm_socket_path(const char *unix_path, char *buf, size_t len) {
  int n = snprintf(buf, len, "%s.shm", unix_path);
  if (n < 0 || (size_t)n >= len ||
      (size_t)n >= sizeof(((struct sockaddr_un *)0)->sun_path))
    return CM_EINVAL;
  return 0;
}

int cm_shm_memfd_new(uint64_t size, int *fd, char *why, size_t len) {
  int f = memfd_create(CM_SHM_NAME, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  *fd = -1;
  if (f < 0) {
    snprintf(why, len, "memfd_create: %s", strerror(errno));
    return CM_ESYS;
  }
  if (ftruncate(f, (off_t)size)) {
    snprintf(why, len, "ftruncate of the arena to %llu bytes: %s",
             (unsigned long long)size, strerror(errno));
    close(f);
    return CM_ESYS;
  }
  if (fcntl(f, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL)) {
    snprintf(why, len, "sealing the arena: %s", strerror(errno));
    close(f);
    return CM_ESYS;
  }
  *fd = f;
  return 0;
}

int cm_shm_check_memfd(int memfd, uint64_t size, char *why, size_t len) {
  struct stat st;
  int seals = fcntl(memfd, F_GET_SEALS);
  if (seals < 0) {
    snprintf(why, len, "the descriptor is not a memfd that allows seals (%s)",
             strerror(errno));
    return CM_EINVAL;
  }
  if ((seals & (F_SEAL_SHRINK | F_SEAL_SEAL)) !=
      (F_SEAL_SHRINK | F_SEAL_SEAL)) {
    snprintf(why, len,
             "the memfd is not sealed against shrinking (F_SEAL_SHRINK and "
             "F_SEAL_SEAL are required, so that a mapping can never fault)");
    return CM_EINVAL;
  }
  if (fstat(memfd, &st)) {
    snprintf(why, len, "fstat of the memfd: %s", strerror(errno));
    return CM_EINVAL;
  }
  if ((uint64_t)st.st_size < size) {
    snprintf(why, len,
             "the memfd holds %lld bytes, fewer than the %llu "
             "the hello claims",
             (long long)st.st_size, (unsigned long long)size);
    return CM_EINVAL;
  }
  return 0;
}

/* Sends (out 1) or receives (out 0) exactly n bytes of buf on sock. */
static int io_all(int sock, void *buf, size_t n, int out) {
  char *p = buf;
  while (n > 0) {
    ssize_t k = out ? send(sock, p, n, MSG_NOSIGNAL) : recv(sock, p, n, 0);
    if (k < 0 && errno == EINTR)
      continue;
    if (k <= 0)
      return CM_ESYS;
    p += k;
    n -= (size_t)k;
  }
  return 0;
}

int cm_shm_hello_send(int sock, const char *job, const char *token,
                      uint64_t size, int memfd) {
  struct hello_head h;
  char ctl[CMSG_SPACE(sizeof(int))];
  struct iovec iov[3];
  struct msghdr msg = {0};
  struct cmsghdr *cm;
  size_t jl = strlen(job), tl = strlen(token), total;
  ssize_t k;

  if (jl > CM_SHM_MAX_JOB || tl > CM_SHM_MAX_TOKEN)
    return CM_EINVAL;
  memcpy(h.magic, HELLO_MAGIC, sizeof h.magic);
  h.job_len = (uint32_t)jl;
  h.token_len = (uint32_t)tl;
  h.size = size;
  iov[0] = (struct iovec){&h, sizeof h};
  iov[1] = (struct iovec){(void *)job, jl};
  iov[2] = (struct iovec){(void *)token, tl};
  total = sizeof h + jl + tl;
  memset(ctl, 0, sizeof ctl);
  msg.msg_iov = iov;
  msg.msg_iovlen = 3;
  msg.msg_control = ctl;
  msg.msg_controllen = sizeof ctl;
  cm = CMSG_FIRSTHDR(&msg);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(cm), &memfd, sizeof(int));
  do
    k = sendmsg(sock, &msg, MSG_NOSIGNAL);
  while (k < 0 && errno == EINTR);
  if (k < 0)
    return CM_ESYS;
  if ((size_t)k == total)
    return 0;
  /* The rest without the descriptor, which went with the first byte. */
  {
    char buf[sizeof h + CM_SHM_MAX_JOB + CM_SHM_MAX_TOKEN];
    memcpy(buf, &h, sizeof h);
    memcpy(buf + sizeof h, job, jl);
    memcpy(buf + sizeof h + jl, token, tl);
    return io_all(sock, buf + k, total - (size_t)k, 1);
  }
}

/* Closes every descriptor an SCM_RIGHTS message of msg carried, but the
 * first, which it returns (-1: none). */
static int take_fd(struct msghdr *msg) {
  int fd = -1;
  for (struct cmsghdr *cm = CMSG_FIRSTHDR(msg); cm; cm = CMSG_NXTHDR(msg, cm)) {
    if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
      continue;
    size_t n = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < n; i++) {
      int f;
      memcpy(&f, CMSG_DATA(cm) + i * sizeof(int), sizeof f);
      if (fd < 0)
        fd = f;
      else
        close(f);
    }
  }
  return fd;
}

int cm_shm_hello_recv(int sock, struct cm_shm_hello *h, int *memfd) {
  struct hello_head head;
  char ctl[CMSG_SPACE(4 * sizeof(int))];
  struct iovec iov = {&head, sizeof head};
  struct msghdr msg = {0};
  ssize_t k;
  int rc;

  *memfd = -1;
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = ctl;
  msg.msg_controllen = sizeof ctl;
  do
    k = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  while (k < 0 && errno == EINTR);
  if (k <= 0)
    return CM_ESYS;
  *memfd = take_fd(&msg);
  if ((size_t)k < sizeof head &&
      (rc = io_all(sock, (char *)&head + k, sizeof head - (size_t)k, 0)))
    return rc;
  if (memcmp(head.magic, HELLO_MAGIC, sizeof head.magic) ||
      head.job_len > CM_SHM_MAX_JOB || head.token_len > CM_SHM_MAX_TOKEN)
    return CM_EPROTO;
  if ((rc = io_all(sock, h->job, head.job_len, 0)) ||
      (rc = io_all(sock, h->token, head.token_len, 0)))
    return rc;
  h->job[head.job_len] = 0;
  h->token[head.token_len] = 0;
  if (strlen(h->job) != head.job_len || strlen(h->token) != head.token_len)
    return CM_EPROTO; /* a NUL inside */
  h->size = head.size;
  return 0;
}

int cm_shm_answer_send(int sock, const struct cm_shm_answer *a) {
  struct answer_head head;
  char buf[sizeof head + sizeof a->reason];
  size_t rl = a->ok ? 0 : strnlen(a->reason, sizeof a->reason - 1);
  memcpy(head.magic, ANSWER_MAGIC, sizeof head.magic);
  head.ok = a->ok ? 1 : 0;
  head.reason_len = (uint32_t)rl;
  head.key[0] = a->key[0];
  head.key[1] = a->key[1];
  memcpy(buf, &head, sizeof head);
  memcpy(buf + sizeof head, a->reason, rl);
  return io_all(sock, buf, sizeof head + rl, 1);
}

int cm_shm_answer_recv(int sock, struct cm_shm_answer *a) {
  struct answer_head head;
  int rc;
  memset(a, 0, sizeof *a);
  if ((rc = io_all(sock, &head, sizeof head, 0)))
    return rc;
  if (memcmp(head.magic, ANSWER_MAGIC, sizeof head.magic) ||
      head.reason_len >= sizeof a->reason)
    return CM_EPROTO;
  if ((rc = io_all(sock, a->reason, head.reason_len, 0)))
    return rc;
  a->reason[head.reason_len] = 0;
  a->ok = head.ok == 1;
  a->key[0] = head.key[0];
  a->key[1] = head.key[1];
  return 0;
}

int cm_shm_token_equal(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b), n = la > lb ? la : lb;
  unsigned char diff = la != lb;
  for (size_t i = 0; i < n; i++)
    diff |=
        (unsigned char)(i < la ? a[i] : 0) ^ (unsigned char)(i < lb ? b[i] : 0);
  return diff == 0;
}
