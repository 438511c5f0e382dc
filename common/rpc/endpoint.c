/* The same-host Unix socket of a shard: its path, listening, connecting
 * (endpoint.h). */
#include "endpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "err.h"
#include "spec.h"

int cm_endpoint_unix_path(const char *job, const struct cm_addr *shard,
                          char *buf, size_t len) {
  char name[80];
  const char *dir = getenv("PSD_SOCKET_DIR");
  size_t i;
  int n;

  for (i = 0; job[i] && i < sizeof name - 1; i++) {
    char ch = job[i];
    int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
             (ch >= '0' && ch <= '9') || ch == '-' || ch == '_' || ch == '.';
    name[i] = ok ? ch : '_';
  }
  name[i] = 0;
  if (!dir || !*dir)
    dir = "/tmp";
  n = snprintf(buf, len, "%s/psd-%s-%d.sock", dir, name, shard->port);
  if (n < 0 || (size_t)n >= len ||
      (size_t)n >= sizeof(((struct sockaddr_un *)0)->sun_path))
    return CM_EINVAL;
  return 0;
}

int cm_endpoint_unix_candidate(const char *job, const struct cm_addr *shard,
                               int use_unix, char *buf, size_t len) {
  struct stat st;
  return use_unix && !cm_endpoint_unix_path(job, shard, buf, len) &&
         !stat(buf, &st) && S_ISSOCK(st.st_mode) && cm_addr_is_local(shard);
}

int cm_endpoint_unix_usable(char *why, size_t len) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0), rc;
  if (fd < 0) {
    snprintf(why, len, "cannot make a Unix socket: %s", strerror(errno));
    return CM_EUNAVAIL;
  }
  rc = cm_endpoint_tune(fd);
  close(fd);
  if (rc)
    snprintf(why, len,
             "the kernel caps socket buffers below %d KiB "
             "(net.core.wmem_max), where Unix sockets are slower than TCP",
             CM_ENDPOINT_MIN_SOCKBUF >> 10);
  return rc;
}

int cm_endpoint_tune(int fd) {
  int size = CM_ENDPOINT_SOCKBUF, got = 0;
  socklen_t gl = sizeof got;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
  if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK))
    return CM_ESYS;
  /* The kernel reports twice what it granted. */
  if (getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &got, &gl) ||
      got / 2 < CM_ENDPOINT_MIN_SOCKBUF)
    return CM_EUNAVAIL;
  return 0;
}

/* Fills a sockaddr_un for path; 0 or CM_EINVAL when it does not fit. */
static int unix_addr(const char *path, struct sockaddr_un *sa) {
  memset(sa, 0, sizeof *sa);
  sa->sun_family = AF_UNIX;
  if (strlen(path) >= sizeof sa->sun_path)
    return CM_EINVAL;
  memcpy(sa->sun_path, path, strlen(path));
  return 0;
}

int cm_endpoint_unix_listen(const char *path, int *fd, char *why, size_t len) {
  struct sockaddr_un sa;
  struct stat st;
  int s = -1, rc;

  *fd = -1;
  if ((rc = unix_addr(path, &sa))) {
    snprintf(why, len, "%s: path too long for a Unix socket", path);
    return rc;
  }
  if (!lstat(path, &st)) {
    if (!S_ISSOCK(st.st_mode)) {
      snprintf(why, len, "%s exists and is not a socket", path);
      return CM_EEXIST;
    }
    unlink(path); /* left by a psd that died */
  }
  s = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (s < 0 || bind(s, (struct sockaddr *)&sa, sizeof sa) || listen(s, 128)) {
    snprintf(why, len, "cannot listen on %s: %s", path, strerror(errno));
    if (s >= 0)
      close(s);
    return CM_ESYS;
  }
  *fd = s;
  return 0;
}

int cm_endpoint_unix_connect(const char *path, int *fd) {
  struct sockaddr_un sa;
  int s, rc;

  *fd = -1;
  if ((rc = unix_addr(path, &sa)))
    return rc;
  s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0)
    return CM_ESYS;
  if (connect(s, (struct sockaddr *)&sa, sizeof sa)) {
    close(s);
    return CM_EUNAVAIL;
  }
  if ((rc = cm_endpoint_tune(s))) {
    close(s);
    return rc;
  }
  *fd = s;
  return 0;
}
