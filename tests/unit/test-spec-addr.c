/* Unit tests for common/spec/addr.c and local.c: cluster.ps and
 * cluster.worker missing or malformed, every kind of bad "host:port", an
 * address given to two tasks, and cm_addr_is_local on literals that send no
 * traffic; job.metrics_listen (job_metrics.c) in both forms, and
 * cm_addr_parse for a command line's address. */
#include <check.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "err.h"
#include "spec.h"
#include "spec_fixture.h"
#include "unit.h"

START_TEST(test_cluster_missing) {
  parse_bad("{\"cluster\": {\"worker\": [\"127.0.0.1:7200\"]}}");
  has_line("t.json: cluster.ps: missing; expected an array of \"host:port\" "
           "strings");
  parse_bad("{\"job\": {}}");
  has_text("t.json: cluster: missing; expected an object");
  parse_bad("{\"cluster\": {\"ps\": [], \"worker\": \"127.0.0.1:7200\"}}");
  has_line("t.json: cluster.ps: empty; expected at least one \"host:port\" "
           "string");
  has_line("t.json: cluster.worker: expected an array of \"host:port\" "
           "strings, got \"127.0.0.1:7200\"");
}
END_TEST

START_TEST(test_bad_addresses) {
  parse_bad("{\"cluster\": {\"ps\": [\"127.0.0.1:7100\", \"127.0.0.1\"],"
            " \"worker\": [\"127.0.0.1:70000\", \"::1:7000\", 7000,"
            " \"[::1]\", \"[nope]:7000\", \"h:7x\", \":7000\", \"1.2.3:7\","
            " \"a b:7\", \"h:0\"]}}");
  has_line("t.json: cluster.ps[1]: \"127.0.0.1\" has no port; expected "
           "\"host:port\"");
  has_line("t.json: cluster.worker[0]: port 70000 out of range; expected "
           "1..65535");
  has_line("t.json: cluster.worker[1]: \"::1:7000\": an IPv6 address needs "
           "brackets; expected \"[host]:port\", e.g. \"[::1]:7000\"");
  has_line("t.json: cluster.worker[2]: expected a \"host:port\" string, got "
           "7000");
  has_line("t.json: cluster.worker[3]: \"[::1]\" has no port; expected "
           "\"[IPv6]:port\"");
  has_text("t.json: cluster.worker[4]: \"[nope]:7000\": \"nope\" is not an "
           "IPv6 address");
  has_line("t.json: cluster.worker[5]: \"h:7x\": port \"7x\" is not a number; "
           "expected 1..65535");
  has_line("t.json: cluster.worker[6]: \":7000\" has no host; expected "
           "\"host:port\"");
  has_text("t.json: cluster.worker[7]: \"1.2.3:7\": \"1.2.3\" is not an IPv4 "
           "address");
  has_text("t.json: cluster.worker[8]: \"a b:7\": \"a b\" is not a valid host "
           "name");
  has_line("t.json: cluster.worker[9]: port 0 out of range; expected "
           "1..65535");
  ck_assert_int_eq(count_lines(err), 11);
}
END_TEST

START_TEST(test_duplicates) {
  parse_bad("{\"cluster\": {\"ps\": [\"127.0.0.1:7100\", \"[::1]:7100\"],"
            " \"worker\": [\"127.0.0.1:7100\", \"[0:0::1]:7100\","
            " \"LOCALHOST:7000\", \"localhost:7000\"]}}");
  has_line("t.json: cluster.worker[0]: \"127.0.0.1:7100\" is also "
           "cluster.ps[0]; expected every task to have its own address");
  has_line("t.json: cluster.worker[1]: \"[0:0::1]:7100\" is also "
           "cluster.ps[1]; expected every task to have its own address");
  has_line("t.json: cluster.worker[3]: \"localhost:7000\" is also "
           "cluster.worker[2]; expected every task to have its own address");
  ck_assert_int_eq(count_lines(err), 3);
}
END_TEST

#define CLUSTER3                                                               \
  "{\"cluster\": {\"ps\": [\"127.0.0.1:7100\", \"127.0.0.1:7101\", "           \
  "\"127.0.0.1:7102\"], \"worker\": [\"127.0.0.1:7200\"]}, "

START_TEST(test_metrics_listen) {
  struct cm_spec *spec = NULL;

  ck_assert_int_eq(parse(CLUSTER3 "\"job\": {}}", &spec), 0);
  ck_assert_ptr_null(spec->metrics); /* off by default */
  cm_spec_free(spec);
  /* A base: shard i on port + i, each with its own text. */
  ck_assert_int_eq(
      parse(CLUSTER3 "\"job\": {\"metrics_listen\": \"[::1]:9100\"}}", &spec),
      0);
  ck_assert_ptr_nonnull(spec->metrics);
  for (int i = 0; i < 3; i++) {
    char want[32];
    snprintf(want, sizeof want, "[::1]:%d", 9100 + i);
    ck_assert_str_eq(spec->metrics[i].host, "::1");
    ck_assert_int_eq(spec->metrics[i].port, 9100 + i);
    ck_assert_str_eq(spec->metrics[i].text, want);
  }
  cm_spec_free(spec);
  /* One per shard, as written. */
  ck_assert_int_eq(parse(CLUSTER3
                         "\"job\": {\"metrics_listen\": [\"10.0.0.1:9100\", "
                         "\"10.0.0.2:9100\", \"localhost:80\"]}}",
                         &spec),
                   0);
  ck_assert_str_eq(spec->metrics[1].text, "10.0.0.2:9100");
  ck_assert_int_eq(spec->metrics[2].port, 80);
  cm_spec_free(spec);
}
END_TEST

START_TEST(test_metrics_listen_mistakes) {
  parse_bad(CLUSTER3 "\"job\": {\"metrics_listen\": \"127.0.0.1:65534\"}}");
  has_line("t.json: job.metrics_listen: \"127.0.0.1:65534\": shard 2 would "
           "listen on port 65536; expected a base port of at most 65533 "
           "(shard i listens on port + i)");
  parse_bad(CLUSTER3 "\"job\": {\"metrics_listen\": [\"a:1\", \"b:1\"]}}");
  has_line("t.json: job.metrics_listen: 2 addresses for 3 shards; expected "
           "one \"host:port\" per entry of cluster.ps, or one \"host:port\" "
           "string (shard i then listens on port + i)");
  parse_bad(CLUSTER3 "\"job\": {\"metrics_listen\": [\"a:1\", \"a:0\", "
                     "\"a:1\"]}}");
  has_line("t.json: job.metrics_listen[1]: port 0 out of range; expected "
           "1..65535");
  has_line("t.json: job.metrics_listen[2]: \"a:1\" is also "
           "job.metrics_listen[0]; expected one per shard");
  ck_assert_int_eq(count_lines(err), 2);
  parse_bad(CLUSTER3 "\"job\": {\"metrics_listen\": 9100}}");
  has_line("t.json: job.metrics_listen: expected a \"host:port\" string or an "
           "array of them (one per shard), got 9100");
  parse_bad(CLUSTER3 "\"job\": {\"metrics_listen\": \"9100\"}}");
  has_line("t.json: job.metrics_listen: \"9100\" has no port; expected "
           "\"host:port\"");
}
END_TEST

START_TEST(test_addr_parse) {
  struct cm_addr a;
  char e[256];

  ck_assert_int_eq(cm_addr_parse("127.0.0.1:9100", "--x", &a, e, sizeof e), 0);
  ck_assert_str_eq(a.host, "127.0.0.1");
  ck_assert_int_eq(a.port, 9100);
  ck_assert_int_eq(cm_addr_parse("[::1]:1", "--x", &a, e, sizeof e), 0);
  ck_assert_str_eq(a.host, "::1");
  ck_assert_int_eq(cm_addr_parse("host", "--x", &a, e, sizeof e), CM_EINVAL);
  ck_assert_str_eq(e, "--x: \"host\" has no port; expected \"host:port\"");
  ck_assert_int_eq(a.port, 0);
  ck_assert_int_eq(cm_addr_parse("h:70000", "--x", &a, e, sizeof e), CM_EINVAL);
  ck_assert_str_eq(e, "--x: port 70000 out of range; expected 1..65535");
}
END_TEST

/* Builds an address the way the parser would, without a spec. */
static int is_local(const char *host) {
  struct cm_addr a;

  memset(&a, 0, sizeof a);
  snprintf(a.host, sizeof a.host, "%s", host);
  a.port = 7000;
  return cm_addr_is_local(&a);
}

START_TEST(test_addr_is_local) {
  char me[256];

  ck_assert_int_eq(is_local("127.0.0.1"), 1);
  ck_assert_int_eq(is_local("127.1.2.3"), 1);
  ck_assert_int_eq(is_local("localhost"), 1);
  ck_assert_int_eq(is_local("LocalHost."), 1);
  ck_assert_int_eq(is_local("::1"), 1);
  ck_assert_int_eq(is_local("::ffff:127.0.0.1"), 1);
  /* TEST-NET-1 and the IPv6 documentation prefix belong to no host. */
  ck_assert_int_eq(is_local("192.0.2.1"), 0);
  ck_assert_int_eq(is_local("2001:db8::1"), 0);
  ck_assert_int_eq(is_local(""), 0);
  ck_assert_int_eq(cm_addr_is_local(NULL), 0);
  if (gethostname(me, sizeof me) == 0) {
    me[sizeof me - 1] = '\0';
    ck_assert_int_eq(is_local(me), 1);
  }
}
END_TEST

static Suite *spec_addr_suite(void) {
  Suite *s = suite_create("spec-addr");
  TCase *tc;

  tc = tcase_create("parse");
  tcase_add_test(tc, test_cluster_missing);
  tcase_add_test(tc, test_bad_addresses);
  tcase_add_test(tc, test_duplicates);
  tcase_add_test(tc, test_metrics_listen);
  tcase_add_test(tc, test_metrics_listen_mistakes);
  tcase_add_test(tc, test_addr_parse);
  suite_add_tcase(s, tc);

  tc = tcase_create("local");
  tcase_add_test(tc, test_addr_is_local);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(spec_addr_suite(), 0); }
