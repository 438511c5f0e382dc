/* The shared-memory arena's hello (common/rpc/shm.h): a hello and its
 * answer over a socket pair carry the job, the token, the size and the
 * memfd; a memfd of the client's is sealed and of its size, one without
 * seals or smaller than claimed is refused by its check, as is a plain
 * file; malformed hellos are CM_EPROTO; the token comparison; and the copy
 * with its NaN scan in one pass finds the first non-finite element at
 * every position and copies every element whatever it finds. */
#include <check.h>
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "err.h"
#include "finite.h"
#include "shm.h"
#include "unit.h"

START_TEST(hello_and_answer_carry_everything) {
  int sv[2], memfd, got = -1;
  struct cm_shm_hello h;
  struct cm_shm_answer a = {.ok = 1, .key = {0x1122334455667788ull, 42}}, b;
  char why[300];

  ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  ck_assert_int_eq(cm_shm_memfd_new(8192, &memfd, why, sizeof why), 0);
  ck_assert_int_eq(cm_shm_check_memfd(memfd, 8192, why, sizeof why), 0);
  ck_assert_int_eq(cm_shm_hello_send(sv[0], "job.x", "tok", 8192, memfd), 0);
  ck_assert_int_eq(cm_shm_hello_recv(sv[1], &h, &got), 0);
  ck_assert_str_eq(h.job, "job.x");
  ck_assert_str_eq(h.token, "tok");
  ck_assert_uint_eq(h.size, 8192);
  ck_assert_int_ge(got, 0);
  /* The same memory: written through one, read through the other. */
  uint8_t *p = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
  uint8_t *q = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, got, 0);
  ck_assert_ptr_ne(p, MAP_FAILED);
  ck_assert_ptr_ne(q, MAP_FAILED);
  p[8191] = 7;
  ck_assert_int_eq(q[8191], 7);
  munmap(p, 8192);
  munmap(q, 8192);
  ck_assert_int_eq(cm_shm_check_memfd(got, 8192, why, sizeof why), 0);
  /* A sealed memfd cannot shrink. */
  ck_assert_int_ne(ftruncate(got, 4096), 0);
  ck_assert_int_eq(cm_shm_answer_send(sv[1], &a), 0);
  ck_assert_int_eq(cm_shm_answer_recv(sv[0], &b), 0);
  ck_assert_int_eq(b.ok, 1);
  ck_assert_uint_eq(b.key[0], a.key[0]);
  ck_assert_uint_eq(b.key[1], 42);
  a.ok = 0;
  snprintf(a.reason, sizeof a.reason, "wrong token");
  ck_assert_int_eq(cm_shm_answer_send(sv[1], &a), 0);
  ck_assert_int_eq(cm_shm_answer_recv(sv[0], &b), 0);
  ck_assert_int_eq(b.ok, 0);
  ck_assert_str_eq(b.reason, "wrong token");
  close(got);
  close(memfd);
  close(sv[0]);
  close(sv[1]);
}
END_TEST

START_TEST(unsealed_small_and_plain_files_are_refused) {
  char why[300], path[] = "/tmp/psd-test-shm-XXXXXX";
  int fd = memfd_create("psd-shm", MFD_CLOEXEC | MFD_ALLOW_SEALING), plain;
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(ftruncate(fd, 4096), 0);
  ck_assert_int_eq(cm_shm_check_memfd(fd, 4096, why, sizeof why), CM_EINVAL);
  ck_assert_ptr_ne(strstr(why, "not sealed against shrinking"), NULL);
  ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL), 0);
  ck_assert_int_eq(cm_shm_check_memfd(fd, 4096, why, sizeof why), 0);
  ck_assert_int_eq(cm_shm_check_memfd(fd, 4097, why, sizeof why), CM_EINVAL);
  ck_assert_ptr_ne(strstr(why, "holds 4096 bytes, fewer than the 4097"), NULL);
  close(fd);
  plain = mkstemp(path);
  ck_assert_int_ge(plain, 0);
  unlink(path);
  ck_assert_int_eq(cm_shm_check_memfd(plain, 0, why, sizeof why), CM_EINVAL);
  ck_assert_ptr_ne(strstr(why, "not a memfd"), NULL);
  close(plain);
}
END_TEST

START_TEST(malformed_hellos_are_refused) {
  int sv[2], got;
  struct cm_shm_hello h;
  static const char bad_magic[24] = "PSDSHM99";
  ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  ck_assert_int_eq(write(sv[0], bad_magic, sizeof bad_magic), 24);
  ck_assert_int_eq(cm_shm_hello_recv(sv[1], &h, &got), CM_EPROTO);
  ck_assert_int_eq(got, -1);
  /* A job longer than any, then a truncated one (EOF). */
  struct {
    char magic[8];
    uint32_t jl, tl;
    uint64_t size;
  } head = {{'P', 'S', 'D', 'S', 'H', 'M', '0', '1'}, CM_SHM_MAX_JOB + 1, 0, 1};
  ck_assert_int_eq(write(sv[0], &head, sizeof head), (ssize_t)sizeof head);
  ck_assert_int_eq(cm_shm_hello_recv(sv[1], &h, &got), CM_EPROTO);
  head.jl = 10;
  ck_assert_int_eq(write(sv[0], &head, sizeof head), (ssize_t)sizeof head);
  ck_assert_int_eq(write(sv[0], "abc", 3), 3);
  close(sv[0]);
  ck_assert_int_eq(cm_shm_hello_recv(sv[1], &h, &got), CM_ESYS);
  close(sv[1]);
  /* Too long to send. */
  char job[CM_SHM_MAX_JOB + 2];
  memset(job, 'j', sizeof job - 1);
  job[sizeof job - 1] = 0;
  ck_assert_int_eq(cm_shm_hello_send(-1, job, "", 1, -1), CM_EINVAL);
}
END_TEST

START_TEST(tokens_compare_whole) {
  ck_assert(cm_shm_token_equal("", ""));
  ck_assert(cm_shm_token_equal("abc", "abc"));
  ck_assert(!cm_shm_token_equal("abc", "abd"));
  ck_assert(!cm_shm_token_equal("abc", "abcd"));
  ck_assert(!cm_shm_token_equal("abc", ""));
  ck_assert(!cm_shm_token_equal("", "x"));
}
END_TEST

START_TEST(copy_scan_finds_the_first_and_copies_all) {
  enum { N = 300 };
  float src[N], dst[N];
  const float bad[] = {NAN, INFINITY, -INFINITY};
  for (int i = 0; i < N; i++)
    src[i] = (float)i * 0.5f - 7.0f;
  memset(dst, 0, sizeof dst);
  ck_assert_uint_eq(cm_copy_first_nonfinite(dst, src, N), N);
  ck_assert_int_eq(memcmp(dst, src, sizeof src), 0);
  for (int at = 0; at < N; at += 7) {
    for (int k = 0; k < 3; k++) {
      float s2[N];
      memcpy(s2, src, sizeof s2);
      s2[at] = bad[k];
      if (at + 70 < N)
        s2[at + 70] = NAN; /* a later one is not the first */
      memset(dst, 0, sizeof dst);
      ck_assert_uint_eq(cm_copy_first_nonfinite(dst, s2, N), (size_t)at);
      ck_assert_int_eq(memcmp(dst, s2, sizeof s2), 0);
    }
  }
  ck_assert_uint_eq(cm_copy_first_nonfinite(dst, src, 0), 0);
}
END_TEST

static Suite *shm_suite(void) {
  Suite *s = suite_create("shm");
  TCase *tc = tcase_create("shm");
  tcase_add_test(tc, hello_and_answer_carry_everything);
  tcase_add_test(tc, unsealed_small_and_plain_files_are_refused);
  tcase_add_test(tc, malformed_hellos_are_refused);
  tcase_add_test(tc, tokens_compare_whole);
  tcase_add_test(tc, copy_scan_finds_the_first_and_copies_all);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(shm_suite(), 0); }
