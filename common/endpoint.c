#include "endpoint.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "err.h"

/* Splits "host:port" or "[v6]:port" into host (brackets removed) and port.
 * Returns 0 or CM_EINVAL. */
static int split(const char *hostport, char *host, size_t hlen,
                 const char **port) {
  const char *colon = strrchr(hostport, ':');
  const char *h = hostport;
  size_t n;

  if (!colon || !colon[1])
    return CM_EINVAL;
  n = (size_t)(colon - hostport);
  if (n >= 2 && h[0] == '[' && h[n - 1] == ']') {
    h++;
    n -= 2;
  }
  if (n >= hlen)
    return CM_EINVAL;
  memcpy(host, h, n);
  host[n] = 0;
  *port = colon + 1;
  return 0;
}

/* 1 when addr (of family fam) is one of this host's interface addresses. */
static int is_interface_addr(int fam, const void *addr) {
  struct ifaddrs *ifs = NULL, *i;
  int found = 0;

  if (getifaddrs(&ifs))
    return 0;
  for (i = ifs; i && !found; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != fam)
      continue;
    if (fam == AF_INET)
      found = !memcmp(&((struct sockaddr_in *)i->ifa_addr)->sin_addr, addr,
                      sizeof(struct in_addr));
    else
      found = !memcmp(&((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr, addr,
                      sizeof(struct in6_addr));
  }
  freeifaddrs(ifs);
  return found;
}

int cm_endpoint_is_local(const char *hostport) {
  char host[256];
  const char *port;
  struct in_addr a4;
  struct in6_addr a6;

  if (split(hostport, host, sizeof host, &port))
    return 0;
  if (!strcmp(host, "localhost"))
    return 1;
  if (inet_pton(AF_INET, host, &a4) == 1) {
    uint32_t ip = ntohl(a4.s_addr);
    if ((ip >> 24) == 127 || ip == 0)
      return 1;
    return is_interface_addr(AF_INET, &a4);
  }
  if (inet_pton(AF_INET6, host, &a6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&a6) || IN6_IS_ADDR_UNSPECIFIED(&a6))
      return 1;
    return is_interface_addr(AF_INET6, &a6);
  }
  return 0;
}

int cm_endpoint_unix_path(const char *job, const char *hostport, char *buf,
                          size_t len) {
  char host[256], name[80];
  const char *port, *dir = getenv("PSD_SOCKET_DIR");
  size_t i;
  int n;

  if (split(hostport, host, sizeof host, &port))
    return CM_EINVAL;
  for (i = 0; job[i] && i < sizeof name - 1; i++) {
    char ch = job[i];
    int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
             (ch >= '0' && ch <= '9') || ch == '-' || ch == '_' || ch == '.';
    name[i] = ok ? ch : '_';
  }
  name[i] = 0;
  if (!dir || !*dir)
    dir = "/tmp";
  n = snprintf(buf, len, "%s/psd-%s-%s.sock", dir, name, port);
  if (n < 0 || (size_t)n >= len ||
      (size_t)n >= sizeof(((struct sockaddr_un *)0)->sun_path))
    return CM_EINVAL;
  return 0;
}

int cm_endpoint_unix_candidate(const char *job, const char *hostport,
                               int use_unix, char *buf, size_t len) {
  struct stat st;
  return use_unix && cm_endpoint_is_local(hostport) &&
         !cm_endpoint_unix_path(job, hostport, buf, len) && !stat(buf, &st) &&
         S_ISSOCK(st.st_mode);
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
