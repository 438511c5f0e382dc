/* The shard's Unix socket, watched by the libuv loop (local.h); stopping it
 * stops the shared-memory arenas' socket beside it (shm_arena.h). */
#include "local.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "endpoint.h"
#include "err.h"
#include "log.h"
#include "shm_arena.h"

struct psd_local {
  uv_poll_t poll;           /* readable: connections to accept */
  struct cm_server *server; /* borrowed; gets each connection */
  int fd;                   /* owned listening socket */
  char path[200];           /* the socket file, removed on stop */
  dev_t dev;                /* the socket file's device and inode, so that */
  ino_t ino;                /* stop never removes a file made by another */
  unsigned long accepted;   /* connections handed to gRPC */
};

/* Removes the socket file, unless it is no longer the one l made. */
static void remove_file(struct psd_local *l) {
  struct stat st;
  if (!lstat(l->path, &st) && st.st_dev == l->dev && st.st_ino == l->ino)
    unlink(l->path);
}

static void on_readable(uv_poll_t *h, int status, int events) {
  struct psd_local *l = h->data;
  if (status < 0)
    return;
  for (;;) {
    int fd = accept4(l->fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        cm_warn("accept on %s: %s", l->path, strerror(errno));
      if (errno != EINTR)
        return;
      continue;
    }
    /* Best effort: the listener was checked at start. */
    cm_endpoint_tune(fd);
    cm_server_add_fd(l->server, fd);
    l->accepted++;
  }
}

int psd_local_start(struct psd_local **out, uv_loop_t *loop,
                    struct cm_server *server, const char *path, char *why,
                    size_t len) {
  struct psd_local *l;
  struct stat st;
  int rc;

  *out = NULL;
  if (!(l = calloc(1, sizeof *l)))
    return CM_ENOMEM;
  l->server = server;
  l->fd = -1;
  snprintf(l->path, sizeof l->path, "%s", path);
  /* Listening first checks the directory, so that a directory psd must not
   * use is reported even where the buffers rule the socket out. */
  if ((rc = cm_endpoint_unix_listen(path, &l->fd, why, len)))
    goto out;
  if (!lstat(path, &st)) {
    l->dev = st.st_dev;
    l->ino = st.st_ino;
  }
  if ((rc = cm_endpoint_unix_usable(why, len)))
    goto out;
  if (uv_poll_init(loop, &l->poll, l->fd) ||
      uv_poll_start(&l->poll, UV_READABLE, on_readable)) {
    snprintf(why, len, "cannot watch %s", path);
    rc = CM_ESYS;
    goto out;
  }
  l->poll.data = l;
  *out = l;
  l = NULL;
out:
  if (l) {
    if (l->fd >= 0) {
      remove_file(l);
      close(l->fd);
    }
    free(l);
  }
  return rc;
}

static void on_closed(uv_handle_t *h) {
  struct psd_local *l = h->data;
  close(l->fd);
  free(l);
}

void psd_local_stop(struct psd_local *l) {
  if (!l)
    return;
  /* The arenas' socket and thread go with the socket they sit beside. */
  psd_shm_stop();
  remove_file(l);
  uv_poll_stop(&l->poll);
  uv_close((uv_handle_t *)&l->poll, on_closed);
}

unsigned long psd_local_accepted(const struct psd_local *l) {
  return l ? l->accepted : 0;
}
