/* Credentials from the spec's auth files: the token's first line trimmed,
 * clear errors naming the key and file, each role reading only its own PEM
 * files; and the bearer check. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "auth.h"
#include "err.h"
#include "unit.h"

static char dir[] = "/tmp/psd-test-auth-XXXXXX";

static const char *file(const char *name, const char *text) {
  static char path[4][256];
  static int next;
  char *p = path[next++ % 4];
  snprintf(p, 256, "%s/%s", dir, name);
  FILE *f = fopen(p, "w");
  ck_assert_ptr_nonnull(f);
  fputs(text, f);
  fclose(f);
  chmod(p, 0600);
  return p;
}

START_TEST(bearer) {
  const char *ok = "Bearer abc123";
  ck_assert(cm_auth_bearer_ok("abc123", ok, strlen(ok)));
  ck_assert(!cm_auth_bearer_ok("abc124", ok, strlen(ok)));
  ck_assert(!cm_auth_bearer_ok("abc12", ok, strlen(ok)));
  ck_assert(!cm_auth_bearer_ok("abc1234", ok, strlen(ok)));
  ck_assert(!cm_auth_bearer_ok("abc123", "bearer abc123", 13));
  ck_assert(!cm_auth_bearer_ok("abc123", "abc123", 6));
  ck_assert(!cm_auth_bearer_ok("abc123", "", 0));
  /* Only the given length counts, as with gRPC slices. */
  ck_assert(cm_auth_bearer_ok("abc123", "Bearer abc123XYZ", 13));
}
END_TEST

START_TEST(token_file) {
  struct cm_auth a = {0};
  struct cm_creds c;
  char err[1024];

  snprintf(a.token_file, sizeof a.token_file, "%s",
           file("t1", "  s3cret-token \t\nsecond line ignored\n"));
  ck_assert_int_eq(cm_creds_load(&a, 0, &c, err, sizeof err), 0);
  ck_assert_str_eq(c.token, "s3cret-token");
  ck_assert_int_eq(c.tls, 0);
  cm_creds_free(&c);

  snprintf(a.token_file, sizeof a.token_file, "%s", file("t2", " \n"));
  ck_assert_int_eq(cm_creds_load(&a, 1, &c, err, sizeof err), CM_EINVAL);
  ck_assert_ptr_nonnull(strstr(err, "auth.token_file: "));
  ck_assert_ptr_nonnull(strstr(err, "is empty"));

  snprintf(a.token_file, sizeof a.token_file, "%s", file("t3", "a\x01z\n"));
  ck_assert_int_eq(cm_creds_load(&a, 1, &c, err, sizeof err), CM_EINVAL);
  ck_assert_ptr_nonnull(strstr(err, "cannot travel in a gRPC header"));

  snprintf(a.token_file, sizeof a.token_file, "%s/missing", dir);
  ck_assert_int_eq(cm_creds_load(&a, 1, &c, err, sizeof err), CM_ENOENT);
  ck_assert_ptr_nonnull(strstr(err, "auth.token_file: cannot read "));
  ck_assert_ptr_nonnull(strstr(err, "No such file"));
  ck_assert_str_eq(c.token, ""); /* nothing half-loaded */
}
END_TEST

START_TEST(tls_roles) {
  struct cm_auth a = {0};
  struct cm_creds c;
  char err[1024];
  const char *pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END "
                    "CERTIFICATE-----\n";

  a.tls = 1;
  snprintf(a.ca, sizeof a.ca, "%s", file("ca.pem", pem));
  snprintf(a.cert, sizeof a.cert, "%s", file("s.pem", pem));
  snprintf(a.key, sizeof a.key, "%s/no-such.key", dir);
  /* A client never reads the shard's key. */
  ck_assert_int_eq(cm_creds_load(&a, 0, &c, err, sizeof err), 0);
  ck_assert_ptr_nonnull(c.ca_pem);
  ck_assert_ptr_null(c.cert_pem);
  ck_assert_ptr_null(c.key_pem);
  cm_creds_free(&c);
  /* A shard needs it. */
  ck_assert_int_eq(cm_creds_load(&a, 1, &c, err, sizeof err), CM_ENOENT);
  ck_assert_ptr_nonnull(strstr(err, "auth.tls.key: cannot read "));

  snprintf(a.key, sizeof a.key, "%s", file("s.key", "not pem at all\n"));
  ck_assert_int_eq(cm_creds_load(&a, 1, &c, err, sizeof err), CM_EINVAL);
  ck_assert_ptr_nonnull(strstr(err, "is not a PEM file"));

  /* Mutual: a client presents its own certificate. */
  snprintf(a.key, sizeof a.key, "%s", file("s.key", pem));
  a.mutual = 1;
  ck_assert_int_eq(cm_creds_load(&a, 0, &c, err, sizeof err), CM_EINVAL);
  ck_assert_ptr_nonnull(strstr(err, "auth.tls.client_cert: not set"));
  ck_assert_int_eq(cm_creds_load(&a, 1, &c, err, sizeof err), 0);
  ck_assert_int_eq(c.mutual, 1);
  ck_assert_ptr_nonnull(c.ca_pem); /* to check client certificates */
  cm_creds_free(&c);
}
END_TEST

static Suite *auth_suite(void) {
  Suite *s = suite_create("auth");
  TCase *tc = tcase_create("auth");
  tcase_add_test(tc, bearer);
  tcase_add_test(tc, token_file);
  tcase_add_test(tc, tls_roles);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  char cmd[300];
  int status;

  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return EXIT_FAILURE;
  }
  status = tu_run(auth_suite(), TU_NOFORK);
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0)
    status = EXIT_FAILURE;
  return status;
}
