/* The shard's registry of shared-memory arenas and the thread that takes
 * the clients' hellos (shm_arena.h). The thread poll()s the .shm listener, a
 * pipe that asks it to stop, and every registered arena's connection;
 * a hello is read with a receive timeout, after the peer's uid was
 * checked, so no untrusted process can hold the thread. */
#include "shm_arena.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "endpoint.h"
#include "err.h"
#include "log.h"
#include "shm.h"

/* Most arenas mapped at once (each is one client's connection). */
#define MAX_ARENAS 1024

/* One client's arena. */
struct psd_shm_arena {
  uint64_t key[2];            /* its random name (hi, lo) */
  uint8_t *base;              /* the mapping, MAP_SHARED */
  uint64_t size;              /* bytes mapped */
  int conn;                   /* the hello's connection; -1 once it ended */
  int refs;                   /* calls using it now (under the lock) */
  int dropped;                /* its connection ended: unmapped at refs 0 */
  struct psd_shm_arena *next; /* list link (registered ones only) */
};

/* The registry: one per process. */
static struct {
  pthread_mutex_t lock;         /* guards list, refs and the counts */
  struct psd_shm_arena *list;   /* registered arenas */
  int narenas;                  /* entries in list */
  unsigned long mapped;         /* arenas mapped (dropped ones in use too) */
  unsigned long registered;     /* hellos answered with a key */
  int started;                  /* the thread runs */
  pthread_t thread;             /* serves the listener and connections */
  int listen_fd;                /* the .shm socket */
  int wake[2];                  /* written to stop the thread */
  char path[220];               /* the .shm socket file */
  dev_t dev;                    /* its device and inode, so that stop */
  ino_t ino;                    /* never removes a file made by another */
  char job[CM_SHM_MAX_JOB + 1]; /* the job a hello must name */
  char token[CM_SHM_MAX_TOKEN + 1]; /* the token it must carry */
  char owner[64];                   /* job.socket_owner */
} R = {.lock = PTHREAD_MUTEX_INITIALIZER, .listen_fd = -1, .wake = {-1, -1}};

static void unmap(struct psd_shm_arena *a) {
  munmap(a->base, a->size);
  R.mapped--;
  free(a);
}

/* Drops a registered arena (its connection ended): out of the list, its
 * connection closed, unmapped now or by its last user. Under the lock. */
static void drop_locked(struct psd_shm_arena *a) {
  for (struct psd_shm_arena **pp = &R.list; *pp; pp = &(*pp)->next)
    if (*pp == a) {
      *pp = a->next;
      R.narenas--;
      break;
    }
  close(a->conn);
  a->conn = -1;
  a->dropped = 1;
  if (a->refs == 0)
    unmap(a);
}

/* Checks a hello on conn (a trusted peer) and maps its arena. Returns the
 * arena (not yet listed), or NULL with a->reason set. */
static struct psd_shm_arena *take_hello(int conn, struct cm_shm_answer *ans) {
  struct cm_shm_hello *h = calloc(1, sizeof *h);
  struct psd_shm_arena *a = NULL;
  int memfd = -1, rc;
  void *base;
  char why[400];

  if (!h) {
    snprintf(ans->reason, sizeof ans->reason, "out of memory");
    goto out;
  }
  if ((rc = cm_shm_hello_recv(conn, h, &memfd))) {
    snprintf(ans->reason, sizeof ans->reason, "malformed hello (%s)",
             cm_strerror(rc));
    goto out;
  }
  if (strcmp(h->job, R.job) != 0) {
    snprintf(ans->reason, sizeof ans->reason,
             "the hello names job '%.100s'; this shard serves '%.100s'", h->job,
             R.job);
    goto out;
  }
  if (!cm_shm_token_equal(h->token, R.token)) {
    snprintf(ans->reason, sizeof ans->reason,
             "wrong token: the hello's token is not the spec's auth token");
    goto out;
  }
  if (memfd < 0) {
    snprintf(ans->reason, sizeof ans->reason,
             "the hello carried no memfd (SCM_RIGHTS)");
    goto out;
  }
  if (h->size == 0 || h->size > CM_SHM_MAX_BYTES) {
    snprintf(ans->reason, sizeof ans->reason,
             "arena size %llu bytes: expected 1 to %llu",
             (unsigned long long)h->size, (unsigned long long)CM_SHM_MAX_BYTES);
    goto out;
  }
  if (cm_shm_check_memfd(memfd, h->size, why, sizeof why)) {
    snprintf(ans->reason, sizeof ans->reason, "%s", why);
    goto out;
  }
  base = mmap(NULL, h->size, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
  if (base == MAP_FAILED) {
    snprintf(ans->reason, sizeof ans->reason, "mmap of %llu bytes: %s",
             (unsigned long long)h->size, strerror(errno));
    goto out;
  }
  if (!(a = calloc(1, sizeof *a))) {
    munmap(base, h->size);
    snprintf(ans->reason, sizeof ans->reason, "out of memory");
    goto out;
  }
  a->base = base;
  a->size = h->size;
  a->conn = conn;
  while (getrandom(a->key, sizeof a->key, 0) != sizeof a->key)
    ;
out:
  if (memfd >= 0)
    close(memfd); /* the mapping keeps the memory */
  free(h);
  return a;
}

/* Accepts one connection on the listener and answers its hello. */
static void accept_one(void) {
  struct cm_shm_answer ans = {0};
  struct psd_shm_arena *a = NULL;
  struct ucred cred;
  socklen_t cl = sizeof cred;
  struct timeval tv = {2, 0};
  char why[400];
  int conn = accept4(R.listen_fd, NULL, NULL, SOCK_CLOEXEC);

  if (conn < 0)
    return;
  if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &cl) ||
      cm_endpoint_check_owner("the client", cred.uid, R.owner, why,
                              sizeof why)) {
    /* An untrusted peer gets no answer it could wait on: it is told why. */
    snprintf(ans.reason, sizeof ans.reason, "%s", why);
    cm_warn("shared memory: refused a hello on %s: %s", R.path, why);
    cm_shm_answer_send(conn, &ans);
    close(conn);
    return;
  }
  setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(conn, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  pthread_mutex_lock(&R.lock);
  int full = R.narenas >= MAX_ARENAS;
  pthread_mutex_unlock(&R.lock);
  if (full)
    snprintf(ans.reason, sizeof ans.reason, "this shard maps %d arenas already",
             MAX_ARENAS);
  else
    a = take_hello(conn, &ans);
  if (a) {
    ans.ok = 1;
    ans.key[0] = a->key[0];
    ans.key[1] = a->key[1];
  } else {
    cm_warn("shared memory: refused a hello from pid %d (uid %u): %s",
            (int)cred.pid, (unsigned)cred.uid, ans.reason);
  }
  if (cm_shm_answer_send(conn, &ans) || !a) {
    if (a) {
      munmap(a->base, a->size);
      free(a);
    }
    close(conn);
    return;
  }
  pthread_mutex_lock(&R.lock);
  a->next = R.list;
  R.list = a;
  R.narenas++;
  R.mapped++;
  R.registered++;
  pthread_mutex_unlock(&R.lock);
  cm_debug("shared memory: pid %d mapped an arena of %llu bytes", (int)cred.pid,
           (unsigned long long)a->size);
}

/* The thread: poll the listener, the wake pipe and every connection. */
static void *serve(void *arg) {
  struct pollfd *fds = calloc(MAX_ARENAS + 2, sizeof *fds);
  struct psd_shm_arena **who = calloc(MAX_ARENAS + 2, sizeof *who);
  (void)arg;
  if (!fds || !who)
    goto out;
  for (;;) {
    int n = 0;
    fds[n++] = (struct pollfd){R.wake[0], POLLIN, 0};
    fds[n++] = (struct pollfd){R.listen_fd, POLLIN, 0};
    pthread_mutex_lock(&R.lock);
    for (struct psd_shm_arena *a = R.list; a && n < MAX_ARENAS + 2;
         a = a->next) {
      who[n] = a;
      fds[n++] = (struct pollfd){a->conn, POLLIN | POLLRDHUP, 0};
    }
    pthread_mutex_unlock(&R.lock);
    if (poll(fds, (nfds_t)n, -1) < 0) {
      if (errno == EINTR)
        continue;
      break;
    }
    if (fds[0].revents)
      break;
    /* Any input or hang-up on a connection is its end: a client never
     * writes after its hello. Only this thread removes arenas. */
    pthread_mutex_lock(&R.lock);
    for (int i = 2; i < n; i++)
      if (fds[i].revents)
        drop_locked(who[i]);
    pthread_mutex_unlock(&R.lock);
    if (fds[1].revents & POLLIN)
      accept_one();
  }
out:
  free(fds);
  free(who);
  return NULL;
}

int psd_shm_start(const char *unix_path, const char *job, const char *token,
                  const char *owner, char *why, size_t len) {
  struct stat st;
  int rc;
  if (R.started)
    return 0;
  if (cm_shm_socket_path(unix_path, R.path, sizeof R.path)) {
    snprintf(why, len, "%s.shm: path too long for a Unix socket", unix_path);
    return CM_EINVAL;
  }
  snprintf(R.job, sizeof R.job, "%s", job);
  snprintf(R.token, sizeof R.token, "%s", token ? token : "");
  snprintf(R.owner, sizeof R.owner, "%s", owner ? owner : "");
  if ((rc = cm_endpoint_unix_listen(R.path, &R.listen_fd, why, len)))
    return rc;
  if (!lstat(R.path, &st)) {
    R.dev = st.st_dev;
    R.ino = st.st_ino;
  }
  if (pipe2(R.wake, O_CLOEXEC) ||
      pthread_create(&R.thread, NULL, serve, NULL)) {
    snprintf(why, len, "cannot start the shared-memory thread: %s",
             strerror(errno));
    psd_shm_stop();
    return CM_ESYS;
  }
  R.started = 1;
  return 0;
}

void psd_shm_stop(void) {
  struct stat st;
  if (R.started) {
    (void)!write(R.wake[1], "x", 1);
    pthread_join(R.thread, NULL);
    R.started = 0;
  }
  if (R.listen_fd >= 0) {
    if (!lstat(R.path, &st) && st.st_dev == R.dev && st.st_ino == R.ino)
      unlink(R.path);
    close(R.listen_fd);
    R.listen_fd = -1;
  }
  for (int i = 0; i < 2; i++)
    if (R.wake[i] >= 0) {
      close(R.wake[i]);
      R.wake[i] = -1;
    }
  pthread_mutex_lock(&R.lock);
  while (R.list)
    drop_locked(R.list);
  pthread_mutex_unlock(&R.lock);
}

int psd_shm_range(uint64_t hi, uint64_t lo, uint64_t offset, uint64_t length,
                  uint64_t want, struct psd_shm_arena **out, uint8_t **ptr,
                  char *why, size_t len) {
  struct psd_shm_arena *a;
  *out = NULL;
  *ptr = NULL;
  pthread_mutex_lock(&R.lock);
  for (a = R.list; a; a = a->next)
    if (a->key[0] == hi && a->key[1] == lo)
      break;
  if (a)
    a->refs++;
  pthread_mutex_unlock(&R.lock);
  if (!a)
    return CM_ENOENT;
  if (length != want) {
    snprintf(why, len, "shm.length is %llu bytes; the segments describe %llu",
             (unsigned long long)length, (unsigned long long)want);
    goto bad;
  }
  if (offset > a->size || length > a->size - offset) {
    snprintf(why, len,
             "shm.offset %llu + shm.length %llu lies outside the arena of "
             "%llu bytes",
             (unsigned long long)offset, (unsigned long long)length,
             (unsigned long long)a->size);
    goto bad;
  }
  if (offset % sizeof(float)) {
    snprintf(why, len, "shm.offset %llu is not a multiple of 4",
             (unsigned long long)offset);
    goto bad;
  }
  *out = a;
  *ptr = a->base + offset;
  return 0;
bad:
  psd_shm_put(a);
  return CM_ERANGE;
}

void psd_shm_put(struct psd_shm_arena *a) {
  if (!a)
    return;
  pthread_mutex_lock(&R.lock);
  if (--a->refs == 0 && a->dropped)
    unmap(a);
  pthread_mutex_unlock(&R.lock);
}

unsigned long psd_shm_mapped(void) {
  pthread_mutex_lock(&R.lock);
  unsigned long n = R.mapped;
  pthread_mutex_unlock(&R.lock);
  return n;
}

unsigned long psd_shm_registered(void) {
  pthread_mutex_lock(&R.lock);
  unsigned long n = R.registered;
  pthread_mutex_unlock(&R.lock);
  return n;
}
