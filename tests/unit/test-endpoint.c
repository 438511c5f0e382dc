/* Where clients reach a shard on its host: the socket directory's rule and
 * psd's checks of it (made 0700; another user's, an open one or a link
 * refused), the Unix socket path (sanitised, bounded), listening over a
 * stale socket but never over a live one or another file, a tuned
 * connection that carries bytes, and a client that refuses a socket file
 * or a listening process of a user it does not trust. The checks that need
 * another uid run only as root. */
#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "endpoint.h"
#include "err.h"
#include "spec.h"
#include "unit.h"

/* A uid no test process runs as (nobody's on Debian). */
#define OTHER_UID 65534

START_TEST(unix_dir_follows_the_rule) {
  char buf[300], want[300], xdg[] = "/tmp/psd-test-xdg-XXXXXX";
  const char *from;
  unsigned uid = (unsigned)geteuid();
  struct stat st;

  setenv("PSD_SOCKET_DIR", "/run/x", 1);
  setenv("RUNTIME_DIRECTORY", "/run/psd", 1);
  ck_assert_int_eq(cm_endpoint_unix_dir(buf, sizeof buf, &from), 0);
  ck_assert_str_eq(buf, "/run/x");
  ck_assert_str_eq(from, "PSD_SOCKET_DIR");
  /* An empty override counts as unset; the first of several directories. */
  setenv("PSD_SOCKET_DIR", "", 1);
  setenv("RUNTIME_DIRECTORY", "/run/psd:/run/other", 1);
  ck_assert_int_eq(cm_endpoint_unix_dir(buf, sizeof buf, &from), 0);
  ck_assert_str_eq(buf, "/run/psd");
  ck_assert_str_eq(from, "RUNTIME_DIRECTORY");
  unsetenv("RUNTIME_DIRECTORY");

  ck_assert_ptr_nonnull(mkdtemp(xdg));
  setenv("XDG_RUNTIME_DIR", xdg, 1);
  ck_assert_int_eq(cm_endpoint_unix_dir(buf, sizeof buf, &from), 0);
  snprintf(want, sizeof want, "%s/psd", xdg);
  ck_assert_str_eq(buf, want);
  ck_assert_str_eq(from, "XDG_RUNTIME_DIR");

  /* A runtime directory that is not this user's is passed over. */
  snprintf(want, sizeof want, "/run/user/%u", uid);
  if (!lstat(want, &st) && S_ISDIR(st.st_mode) && st.st_uid == uid)
    snprintf(want, sizeof want, "/run/user/%u/psd", uid);
  else
    snprintf(want, sizeof want, "/tmp/psd-%u", uid);
  setenv("XDG_RUNTIME_DIR", "/nonexistent", 1);
  ck_assert_int_eq(cm_endpoint_unix_dir(buf, sizeof buf, NULL), 0);
  ck_assert_str_eq(buf, want);
  if (uid == 0) {
    ck_assert_int_eq(chown(xdg, OTHER_UID, OTHER_UID), 0);
    setenv("XDG_RUNTIME_DIR", xdg, 1);
    ck_assert_int_eq(cm_endpoint_unix_dir(buf, sizeof buf, NULL), 0);
    ck_assert_str_eq(buf, want);
  }
  unsetenv("XDG_RUNTIME_DIR");
  ck_assert_int_eq(cm_endpoint_unix_dir(buf, sizeof buf, NULL), 0);
  ck_assert_str_eq(buf, want);
  rmdir(xdg);
}
END_TEST

START_TEST(unix_path_is_sanitised_and_bounded) {
  char buf[200], dir[200], want[300], longname[300];
  struct cm_addr a = {.host = "127.0.0.1", .port = 7100},
                 b = {.host = "::1", .port = 7101};
  setenv("PSD_SOCKET_DIR", "/run/x", 1);
  ck_assert_int_eq(cm_endpoint_unix_path("my job/1", &a, buf, sizeof buf), 0);
  ck_assert_str_eq(buf, "/run/x/psd-my_job_1-7100.sock");
  unsetenv("PSD_SOCKET_DIR");
  unsetenv("RUNTIME_DIRECTORY");
  ck_assert_int_eq(cm_endpoint_unix_path("j", &b, buf, sizeof buf), 0);
  ck_assert_int_eq(cm_endpoint_unix_dir(dir, sizeof dir, NULL), 0);
  snprintf(want, sizeof want, "%s/psd-j-7101.sock", dir);
  ck_assert_str_eq(buf, want);
  memset(longname, 'a', sizeof longname - 1);
  longname[sizeof longname - 1] = 0;
  setenv("PSD_SOCKET_DIR", longname, 1);
  ck_assert_int_eq(cm_endpoint_unix_path("j", &a, buf, sizeof buf), CM_EINVAL);
  unsetenv("PSD_SOCKET_DIR");
}
END_TEST

START_TEST(claim_dir_makes_a_private_one_and_refuses_others) {
  char top[] = "/tmp/psd-test-claim-XXXXXX", dir[200], link[200], why[600];
  struct stat st;

  ck_assert_ptr_nonnull(mkdtemp(top));
  snprintf(dir, sizeof dir, "%s/sockets", top);
  /* Missing: made, 0700 whatever the umask lets through. */
  umask(022);
  ck_assert_int_eq(cm_endpoint_unix_claim_dir(dir, why, sizeof why), 0);
  ck_assert_int_eq(lstat(dir, &st), 0);
  ck_assert(S_ISDIR(st.st_mode));
  ck_assert_int_eq(st.st_mode & 0777, 0700);
  /* Existing and ours: accepted again. */
  ck_assert_int_eq(cm_endpoint_unix_claim_dir(dir, why, sizeof why), 0);

  /* Open to others: refused, with the fix. */
  ck_assert_int_eq(chmod(dir, 0755), 0);
  ck_assert_int_eq(cm_endpoint_unix_claim_dir(dir, why, sizeof why), CM_EEXIST);
  ck_assert_ptr_nonnull(strstr(why, "has mode 755"));
  ck_assert_ptr_nonnull(strstr(why, "chmod 700"));
  ck_assert_int_eq(chmod(dir, 0700), 0);

  /* A link to our own directory is still a link. */
  snprintf(link, sizeof link, "%s/link", top);
  ck_assert_int_eq(symlink(dir, link), 0);
  ck_assert_int_eq(cm_endpoint_unix_claim_dir(link, why, sizeof why),
                   CM_EEXIST);
  ck_assert_ptr_nonnull(strstr(why, "symbolic link"));
  unlink(link);

  /* A file in the way. */
  FILE *f = fopen(link, "w");
  ck_assert_ptr_nonnull(f);
  fclose(f);
  ck_assert_int_eq(cm_endpoint_unix_claim_dir(link, why, sizeof why),
                   CM_EEXIST);
  ck_assert_ptr_nonnull(strstr(why, "not a directory"));
  unlink(link);

  /* Another user's: refused, naming the owner. */
  if (geteuid() == 0) {
    ck_assert_int_eq(chown(dir, OTHER_UID, OTHER_UID), 0);
    ck_assert_int_eq(cm_endpoint_unix_claim_dir(dir, why, sizeof why),
                     CM_EEXIST);
    ck_assert_ptr_nonnull(strstr(why, "belongs to uid 65534"));
    ck_assert_ptr_nonnull(strstr(why, "PSD_SOCKET_DIR"));
  }
  rmdir(dir);
  rmdir(top);
}
END_TEST

/* Binds a socket at path; listening too when listen_too. Returns the fd. */
static int bound(const char *path, int listen_too) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  ck_assert_int_ge(fd, 0);
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
  ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
  if (listen_too)
    ck_assert_int_eq(listen(fd, 4), 0);
  return fd;
}

START_TEST(listen_connect_and_refusals) {
  char dir[] = "/tmp/psd-test-endpoint-XXXXXX", path[200], why[1024];
  int lfd, cfd, afd;
  struct stat st;

  ck_assert_ptr_nonnull(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/s.sock", dir);
  /* Nobody listens yet. */
  ck_assert_int_lt(cm_endpoint_unix_connect(path, NULL, &cfd, why, sizeof why),
                   0);
  ck_assert_str_eq(why, "");

  /* A regular file at the path is not ours to remove. */
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fclose(f);
  ck_assert_int_eq(cm_endpoint_unix_listen(path, &lfd, why, sizeof why),
                   CM_EEXIST);
  ck_assert_ptr_nonnull(strstr(why, "not a socket"));
  ck_assert_int_eq(stat(path, &st), 0);
  ck_assert(S_ISREG(st.st_mode));
  unlink(path);

  /* A live socket is another server's: left alone. */
  int live = bound(path, 1);
  ck_assert_int_eq(cm_endpoint_unix_listen(path, &lfd, why, sizeof why),
                   CM_EADDRINUSE);
  ck_assert_ptr_nonnull(strstr(why, "another process listens on"));
  close(live);

  /* A stale socket (that one, now closed) is replaced, by a file only its
   * owner may use. */
  ck_assert_int_eq(cm_endpoint_unix_listen(path, &lfd, why, sizeof why), 0);
  ck_assert_int_eq(lstat(path, &st), 0);
  ck_assert(S_ISSOCK(st.st_mode));
  ck_assert_int_eq(st.st_mode & 0777, 0600);

  if (cm_endpoint_unix_usable(why, sizeof why) == 0) {
    char out[4096], in[4096];
    ck_assert_int_eq(cm_endpoint_unix_connect(path, "", &cfd, why, sizeof why),
                     0);
    afd = accept(lfd, NULL, NULL);
    ck_assert_int_ge(afd, 0);
    memset(out, 7, sizeof out);
    ck_assert_int_eq(write(cfd, out, sizeof out), sizeof out);
    size_t got = 0;
    while (got < sizeof in) {
      ssize_t n = read(afd, in + got, sizeof in - got);
      ck_assert_int_gt(n, 0);
      got += (size_t)n;
    }
    ck_assert_int_eq(memcmp(in, out, sizeof in), 0);
    close(afd);
    close(cfd);
  } else {
    /* Small socket buffers: connecting refuses, so clients keep TCP. */
    ck_assert_int_eq(
        cm_endpoint_unix_connect(path, NULL, &cfd, why, sizeof why),
        CM_EUNAVAIL);
    ck_assert_str_eq(why, "");
  }
  close(lfd);
  unlink(path);
  rmdir(dir);
}
END_TEST

/* A socket another user made is refused before connecting, unless the
 * spec names that user; one whose file is ours but whose listener runs as
 * another user is refused after connecting (the file may have been
 * swapped). Needs root to act as another uid. */
START_TEST(client_trusts_only_its_owners) {
  char dir[] = "/tmp/psd-test-owner-XXXXXX", path[200], why[1024];
  int lfd, cfd, ready[2];
  pid_t child;

  ck_assert_ptr_nonnull(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/s.sock", dir);

  /* The file belongs to another user. */
  lfd = bound(path, 1);
  ck_assert_int_eq(chown(path, OTHER_UID, OTHER_UID), 0);
  ck_assert_int_eq(cm_endpoint_unix_connect(path, NULL, &cfd, why, sizeof why),
                   CM_EEXIST);
  ck_assert_ptr_nonnull(strstr(why, "the socket file "));
  ck_assert_ptr_nonnull(strstr(why, "belongs to uid 65534"));
  ck_assert_ptr_nonnull(strstr(why, "job.socket_owner names (none"));
  ck_assert_int_eq(
      cm_endpoint_unix_connect(path, "nosuchuser-x", &cfd, why, sizeof why),
      CM_EEXIST);
  ck_assert_ptr_nonnull(strstr(why, "names no user on this host"));
  /* Named in the spec (as a uid): trusted; the listener is root's. */
  int rc = cm_endpoint_unix_connect(path, "65534", &cfd, why, sizeof why);
  ck_assert(rc == 0 || rc == CM_EUNAVAIL); /* EUNAVAIL: small buffers */
  if (rc == 0)
    close(cfd);
  close(lfd);
  unlink(path);

  /* The file is root's, the process listening another user's. */
  lfd = bound(path, 0);
  ck_assert_int_eq(pipe(ready), 0);
  child = fork();
  ck_assert_int_ge(child, 0);
  if (child == 0) {
    /* SO_PEERCRED reports who called listen. */
    if (setgid(OTHER_UID) || setuid(OTHER_UID) || listen(lfd, 4) ||
        write(ready[1], "x", 1) != 1)
      _exit(1);
    pause();
    _exit(0);
  }
  char byte;
  ck_assert_int_eq(read(ready[0], &byte, 1), 1);
  ck_assert_int_eq(cm_endpoint_unix_connect(path, NULL, &cfd, why, sizeof why),
                   CM_EEXIST);
  ck_assert_ptr_nonnull(strstr(why, "the process listening on "));
  ck_assert_ptr_nonnull(strstr(why, "belongs to uid 65534"));
  kill(child, SIGKILL);
  waitpid(child, NULL, 0);
  close(ready[0]);
  close(ready[1]);
  close(lfd);
  unlink(path);
  rmdir(dir);
}
END_TEST

static Suite *endpoint_suite(void) {
  Suite *s = suite_create("endpoint");
  TCase *tc = tcase_create("endpoint");
  tcase_add_test(tc, unix_dir_follows_the_rule);
  tcase_add_test(tc, unix_path_is_sanitised_and_bounded);
  tcase_add_test(tc, claim_dir_makes_a_private_one_and_refuses_others);
  tcase_add_test(tc, listen_connect_and_refusals);
  if (geteuid() == 0)
    tcase_add_test(tc, client_trusts_only_its_owners);
  else
    fprintf(stderr, "SKIP client_trusts_only_its_owners: needs root to act "
                    "as another uid\n");
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(endpoint_suite(), 0); }
