/* The same-host Unix socket of a shard: its private directory, its path,
 * listening, and connecting only to a socket of a trusted owner
 * (endpoint.h). */
#include "endpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "err.h"
#include "spec.h"

/* Whether path is a directory (not a link to one) that belongs to uid. */
static int own_dir(const char *path, uid_t uid) {
  struct stat st;
  return !lstat(path, &st) && S_ISDIR(st.st_mode) && st.st_uid == uid;
}

int cm_endpoint_unix_dir(char *buf, size_t len, const char **from) {
  const char *env = getenv("PSD_SOCKET_DIR"), *why = "PSD_SOCKET_DIR";
  unsigned uid = (unsigned)geteuid();
  char run[64];
  int n;

  if (env && *env) {
    n = snprintf(buf, len, "%s", env);
  } else if ((env = getenv("RUNTIME_DIRECTORY")) && *env) {
    /* systemd's RuntimeDirectory=; several are separated by ':'. */
    n = snprintf(buf, len, "%.*s", (int)strcspn(env, ":"), env);
    why = "RUNTIME_DIRECTORY";
  } else if ((env = getenv("XDG_RUNTIME_DIR")) && *env && own_dir(env, uid)) {
    n = snprintf(buf, len, "%s/psd", env);
    why = "XDG_RUNTIME_DIR";
  } else if (snprintf(run, sizeof run, "/run/user/%u", uid) > 0 &&
             own_dir(run, uid)) {
    n = snprintf(buf, len, "%s/psd", run);
    why = "/run/user/<uid>";
  } else {
    n = snprintf(buf, len, "/tmp/psd-%u", uid);
    why = "the private fallback";
  }
  if (from)
    *from = why;
  return n < 0 || (size_t)n >= len ? CM_EINVAL : 0;
}

/* Writes "uid N (name)", or "uid N" for a uid with no name here. */
static void describe_uid(uid_t uid, char *buf, size_t len) {
  struct passwd pw, *found = NULL;
  char tmp[1024];
  if (!getpwuid_r(uid, &pw, tmp, sizeof tmp, &found) && found)
    snprintf(buf, len, "uid %u (%s)", (unsigned)uid, found->pw_name);
  else
    snprintf(buf, len, "uid %u", (unsigned)uid);
}

int cm_endpoint_unix_claim_dir(const char *dir, char *why, size_t len) {
  struct stat st;
  uid_t me = geteuid();
  char owner[80];

  if (mkdir(dir, 0700) && errno != EEXIST) {
    snprintf(why, len, "cannot make the socket directory %s: %s", dir,
             strerror(errno));
    return CM_ESYS;
  }
  if (lstat(dir, &st)) {
    snprintf(why, len, "cannot inspect the socket directory %s: %s", dir,
             strerror(errno));
    return CM_ESYS;
  }
  if (S_ISLNK(st.st_mode)) {
    snprintf(why, len,
             "the socket directory %s is a symbolic link; psd uses only a "
             "real directory of its own (remove the link, or set "
             "PSD_SOCKET_DIR)",
             dir);
    return CM_EEXIST;
  }
  if (!S_ISDIR(st.st_mode)) {
    snprintf(why, len, "%s exists and is not a directory", dir);
    return CM_EEXIST;
  }
  if (st.st_uid != me) {
    describe_uid(st.st_uid, owner, sizeof owner);
    snprintf(why, len,
             "the socket directory %s belongs to %s, not to this user "
             "(uid %u): whoever owns it could receive the clients' token; "
             "psd will not use it (remove it, or set PSD_SOCKET_DIR to a "
             "directory of this user's with mode 0700)",
             dir, owner, (unsigned)me);
    return CM_EEXIST;
  }
  if (st.st_mode & 077) {
    snprintf(why, len,
             "the socket directory %s has mode %03o; psd uses it only when "
             "no one but its owner may enter it (chmod 700 %s)",
             dir, (unsigned)(st.st_mode & 0777), dir);
    return CM_EEXIST;
  }
  return 0;
}

int cm_endpoint_unix_path(const char *job, const struct cm_addr *shard,
                          char *buf, size_t len) {
  char name[80], dir[200];
  size_t i;
  int n;

  for (i = 0; job[i] && i < sizeof name - 1; i++) {
    char ch = job[i];
    int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
             (ch >= '0' && ch <= '9') || ch == '-' || ch == '_' || ch == '.';
    name[i] = ok ? ch : '_';
  }
  name[i] = 0;
  if (cm_endpoint_unix_dir(dir, sizeof dir, NULL))
    return CM_EINVAL;
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
         !lstat(buf, &st) && S_ISSOCK(st.st_mode) && cm_addr_is_local(shard);
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
             "(net.core.wmem_max), where Unix sockets are slower than TCP; "
             "sysctl -w net.core.wmem_max=%d (or psd's sysctl.d file, "
             "60-psd.conf) lifts the cap",
             CM_ENDPOINT_MIN_SOCKBUF >> 10, CM_ENDPOINT_SOCKBUF);
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

/* Whether a process listens on the socket at sa: a socket file left by a
 * psd that was killed refuses connections. */
static int someone_listens(const struct sockaddr_un *sa) {
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0), live;
  if (s < 0)
    return 0;
  live =
      !connect(s, (const struct sockaddr *)sa, sizeof *sa) || errno == EAGAIN;
  close(s);
  return live;
}

int cm_endpoint_unix_listen(const char *path, int *fd, char *why, size_t len) {
  struct sockaddr_un sa;
  struct stat st;
  char dir[sizeof sa.sun_path];
  char *slash;
  int s = -1, rc;

  *fd = -1;
  if ((rc = unix_addr(path, &sa))) {
    snprintf(why, len, "%s: path too long for a Unix socket", path);
    return rc;
  }
  snprintf(dir, sizeof dir, "%s", path);
  if ((slash = strrchr(dir, '/')))
    *(slash == dir ? slash + 1 : slash) = 0;
  else
    snprintf(dir, sizeof dir, ".");
  if ((rc = cm_endpoint_unix_claim_dir(dir, why, len)))
    return rc;
  if (!lstat(path, &st)) {
    if (!S_ISSOCK(st.st_mode)) {
      snprintf(why, len, "%s exists and is not a socket", path);
      return CM_EEXIST;
    }
    if (someone_listens(&sa)) {
      snprintf(why, len,
               "another process listens on %s (a second psd of job and port?)",
               path);
      return CM_EADDRINUSE;
    }
    unlink(path); /* left by a psd that died */
  }
  s = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (s < 0 || bind(s, (struct sockaddr *)&sa, sizeof sa) ||
      chmod(path, 0600) || listen(s, 128)) {
    snprintf(why, len, "cannot listen on %s: %s", path, strerror(errno));
    if (s >= 0)
      close(s);
    return CM_ESYS;
  }
  *fd = s;
  return 0;
}

/* Resolves the spec's job.socket_owner (a user name or a numeric uid) to
 * *uid; 0, or CM_ENOENT when it names no user of this host. */
static int owner_uid(const char *owner, uid_t *uid) {
  struct passwd pw, *found = NULL;
  char tmp[1024], *end;
  unsigned long n;

  if (*owner && strspn(owner, "0123456789") == strlen(owner)) {
    errno = 0;
    n = strtoul(owner, &end, 10);
    if (errno || *end || n != (uid_t)n)
      return CM_ENOENT;
    *uid = (uid_t)n;
    return 0;
  }
  if (getpwnam_r(owner, &pw, tmp, sizeof tmp, &found) || !found)
    return CM_ENOENT;
  *uid = found->pw_uid;
  return 0;
}

int cm_endpoint_check_owner(const char *what, uid_t uid, const char *owner,
                            char *why, size_t len) {
  uid_t me = geteuid(), named;
  char got[80], hint[160];

  if (uid == me || uid == 0 ||
      (owner && *owner && !owner_uid(owner, &named) && uid == named))
    return 0;
  describe_uid(uid, got, sizeof got);
  if (!owner || !*owner)
    snprintf(hint, sizeof hint,
             "the user job.socket_owner names (none: name that user there if "
             "psd runs as it on purpose)");
  else
    snprintf(hint, sizeof hint, "job.socket_owner \"%.40s\"%s", owner,
             owner_uid(owner, &named) ? " (which names no user on this host)"
                                      : "");
  snprintf(why, len, "%s belongs to %s, not to this user (uid %u), root or %s",
           what, got, (unsigned)me, hint);
  return CM_EEXIST;
}

int cm_endpoint_unix_connect(const char *path, const char *owner, int *fd,
                             char *why, size_t len) {
  struct sockaddr_un sa;
  struct ucred cred;
  socklen_t cl = sizeof cred;
  struct stat st;
  char what[300];
  int s = -1, rc;

  *fd = -1;
  why[0] = 0;
  if ((rc = unix_addr(path, &sa)))
    return rc;
  if (lstat(path, &st) || !S_ISSOCK(st.st_mode))
    return CM_EUNAVAIL;
  snprintf(what, sizeof what, "the socket file %s", path);
  if ((rc = cm_endpoint_check_owner(what, st.st_uid, owner, why, len)))
    return rc;
  s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0)
    return CM_ESYS;
  if (connect(s, (struct sockaddr *)&sa, sizeof sa)) {
    rc = CM_EUNAVAIL;
    goto out;
  }
  /* The file may have been swapped since lstat: the process that listens
   * is the one that would receive the token. */
  snprintf(what, sizeof what, "the process listening on %s", path);
  if (getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cred, &cl)) {
    rc = CM_ESYS;
    goto out;
  }
  if ((rc = cm_endpoint_check_owner(what, cred.uid, owner, why, len)))
    goto out;
  if ((rc = cm_endpoint_tune(s)))
    goto out;
  *fd = s;
  s = -1;
out:
  if (s >= 0)
    close(s);
  return rc;
}
