/* Where clients reach a shard on its host: the Unix socket path (sanitised,
 * bounded), listening over a stale socket but never
 * over another file, and a tuned connection that carries bytes. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "endpoint.h"
#include "err.h"
#include "spec.h"
#include "unit.h"

START_TEST(unix_path_is_sanitised_and_bounded) {
  char buf[200], longname[300];
  struct cm_addr a = {.host = "127.0.0.1", .port = 7100},
                 b = {.host = "::1", .port = 7101};
  setenv("PSD_SOCKET_DIR", "/run/x", 1);
  ck_assert_int_eq(cm_endpoint_unix_path("my job/1", &a, buf, sizeof buf), 0);
  ck_assert_str_eq(buf, "/run/x/psd-my_job_1-7100.sock");
  unsetenv("PSD_SOCKET_DIR");
  ck_assert_int_eq(cm_endpoint_unix_path("j", &b, buf, sizeof buf), 0);
  ck_assert_str_eq(buf, "/tmp/psd-j-7101.sock");
  memset(longname, 'a', sizeof longname - 1);
  longname[sizeof longname - 1] = 0;
  setenv("PSD_SOCKET_DIR", longname, 1);
  ck_assert_int_eq(cm_endpoint_unix_path("j", &a, buf, sizeof buf), CM_EINVAL);
  unsetenv("PSD_SOCKET_DIR");
}
END_TEST

START_TEST(listen_connect_and_refusals) {
  char dir[] = "/tmp/psd-test-endpoint-XXXXXX", path[200], why[300];
  int lfd, cfd, afd;
  struct stat st;

  ck_assert_ptr_nonnull(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/s.sock", dir);
  /* Nobody listens yet. */
  ck_assert_int_lt(cm_endpoint_unix_connect(path, &cfd), 0);

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

  /* A stale socket is replaced. */
  int stale = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  strcpy(sa.sun_path, path);
  ck_assert_int_eq(bind(stale, (struct sockaddr *)&sa, sizeof sa), 0);
  close(stale);
  ck_assert_int_eq(cm_endpoint_unix_listen(path, &lfd, why, sizeof why), 0);

  if (cm_endpoint_unix_usable(why, sizeof why) == 0) {
    char out[4096], in[4096];
    ck_assert_int_eq(cm_endpoint_unix_connect(path, &cfd), 0);
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
    ck_assert_int_eq(cm_endpoint_unix_connect(path, &cfd), CM_EUNAVAIL);
  }
  close(lfd);
  unlink(path);
  rmdir(dir);
}
END_TEST

static Suite *endpoint_suite(void) {
  Suite *s = suite_create("endpoint");
  TCase *tc = tcase_create("endpoint");
  tcase_add_test(tc, unix_path_is_sanitised_and_bounded);
  tcase_add_test(tc, listen_connect_and_refusals);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(endpoint_suite(), 0); }
