/* Unit tests for libpsclient's retries (worker/psclient/retry.c, with
 * transfer.c and declare.c) against a stand-in shard served in this
 * process: which statuses are sent again (CANCELLED too: a stopping shard
 * cancels the calls it never took, and this client cancels none of its
 * own), the causes said in words, a pull answered CANCELLED, then
 * UNAVAILABLE, then OK that arrives whole, carrying back the spec's
 * fingerprint and the boot id Declare answered, and a refusal that is not
 * retried. */
#include <arpa/inet.h>
#include <check.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "client_internal.h"
#include "err.h"
#include "ps.pb-c.h"
#include "psclient.h"
#include "rpc.h"
#include "rpc_server.h"
#include "spec.h"
#include "unit.h"
#include "wire.h"

#define BOOT 0x5eed0f5eed0f5eedull
#define N 4

START_TEST(retried_statuses) {
  ck_assert(psc__retryable(GRPC_STATUS_UNAVAILABLE));
  ck_assert(psc__retryable(GRPC_STATUS_DEADLINE_EXCEEDED));
  ck_assert(psc__retryable(GRPC_STATUS_CANCELLED));
  ck_assert(!psc__retryable(GRPC_STATUS_OK));
  ck_assert(!psc__retryable(GRPC_STATUS_FAILED_PRECONDITION));
  ck_assert(!psc__retryable(GRPC_STATUS_UNAUTHENTICATED));
  ck_assert(!psc__retryable(GRPC_STATUS_NOT_FOUND));
  ck_assert(!psc__retryable(GRPC_STATUS_INVALID_ARGUMENT));
}
END_TEST

/* The cause of status st with details, in words. */
static const char *cause(grpc_status_code st, const char *details,
                         int connected) {
  static char buf[512];
  buf[0] = 0;
  if (!psc__reach_cause(st, details, connected, 1.5, buf, sizeof buf))
    return NULL;
  return buf;
}

/* What gRPC 1.51 says, as seen from psctl and dworker. */
START_TEST(causes_in_words) {
  ck_assert_str_eq(
      cause(GRPC_STATUS_UNAVAILABLE,
            "failed to connect to all addresses; last error: UNKNOWN: "
            "ipv4:127.0.0.1:1: Failed to connect to remote host: Connection "
            "refused",
            0),
      "connection refused (nothing listens there?)");
  ck_assert_ptr_nonnull(
      strstr(cause(GRPC_STATUS_UNAVAILABLE,
                   "failed to connect to all addresses; last error: UNKNOWN: "
                   "ipv4:127.0.0.1:40339: Ssl handshake failed: SSL_ERROR_SSL: "
                   "error:0A000086:SSL routines::certificate verify failed",
                   0),
             "TLS handshake failed"));
  /* A TCP connect gRPC abandoned is not TLS (it said so on a job without
   * TLS when a shard restarted). */
  ck_assert_str_eq(cause(GRPC_STATUS_UNAVAILABLE,
                         "failed to connect to all addresses; last error: "
                         "UNKNOWN: ipv4:127.0.0.1:40339: tcp handshaker "
                         "shutdown",
                         0),
                   "connection attempt abandoned (the shard stopped or is "
                   "restarting)");
  ck_assert_ptr_nonnull(
      strstr(cause(GRPC_STATUS_UNAVAILABLE,
                   "DNS resolution failed for nonexistent.invalid:7000: "
                   "Domain name not found",
                   0),
             "does not resolve"));
  ck_assert_ptr_nonnull(
      strstr(cause(GRPC_STATUS_UNAVAILABLE, "No route to host", 0),
             "no route to host"));
  ck_assert_ptr_nonnull(strstr(
      cause(GRPC_STATUS_UNAUTHENTICATED, "missing or wrong bearer token", 1),
      "wrong token"));
  ck_assert_str_eq(cause(GRPC_STATUS_DEADLINE_EXCEEDED, "Deadline Exceeded", 0),
                   "no connection within 1.5 s (is the host up? a firewall "
                   "may drop the packets)");
  ck_assert_ptr_nonnull(
      strstr(cause(GRPC_STATUS_DEADLINE_EXCEEDED, "Deadline Exceeded", 1),
             "no answer within 1.5 s"));
  ck_assert_ptr_nonnull(strstr(cause(GRPC_STATUS_CANCELLED, "CANCELLED", 1),
                               "the shard cancelled the call"));
  /* The shard answered: no cause to find. */
  ck_assert_ptr_null(cause(GRPC_STATUS_FAILED_PRECONDITION, "x", 1));
  ck_assert_ptr_null(cause(GRPC_STATUS_NOT_FOUND, "no variable 'v'", 1));
  ck_assert_ptr_null(cause(GRPC_STATUS_UNIMPLEMENTED, "unknown method", 1));
}
END_TEST

/* ---- a stand-in shard ---- */

static struct {
  atomic_int pulls;          /* Pull calls seen */
  atomic_int fail_as;        /* 0: the script below; else every pull's status */
  atomic_uint_fast64_t fp;   /* the last Pull's Caller.spec_fp */
  atomic_uint_fast64_t boot; /* the last Pull's Caller.boot */
  atomic_int ps, workers;    /* the last Pull's Caller counts */
} shard;
static float values[N] = {1.5f, 2.5f, 3.5f, 4.5f};

static void on_declare(struct cm_rpc_call *call, grpc_byte_buffer *bb,
                       void *ctx) {
  Psd__V1__DeclareResponse r = PSD__V1__DECLARE_RESPONSE__INIT;
  (void)bb;
  (void)ctx;
  r.boot = BOOT;
  cm_rpc_reply(call, cm_rpc_pack(&r.base));
}

/* CANCELLED, then UNAVAILABLE, then the values. */
static void on_pull(struct cm_rpc_call *call, grpc_byte_buffer *bb, void *ctx) {
  Psd__V1__PullRequest *req = (Psd__V1__PullRequest *)cm_rpc_unpack(
      bb, &psd__v1__pull_request__descriptor);
  int n = atomic_fetch_add(&shard.pulls, 1);
  (void)ctx;
  if (req && req->caller) {
    atomic_store(&shard.fp, req->caller->spec_fp);
    atomic_store(&shard.boot, req->caller->boot);
    atomic_store(&shard.ps, req->caller->spec_ps);
    atomic_store(&shard.workers, req->caller->spec_workers);
  }
  if (req)
    psd__v1__pull_request__free_unpacked(req, NULL);
  if (atomic_load(&shard.fail_as)) {
    cm_rpc_fail(call, atomic_load(&shard.fail_as), "refused by the test");
  } else if (n == 0) {
    cm_rpc_fail(call, GRPC_STATUS_CANCELLED, "CANCELLED");
  } else if (n == 1) {
    cm_rpc_fail(call, GRPC_STATUS_UNAVAILABLE, "psd is shutting down");
  } else {
    Psd__V1__PullResponse r = PSD__V1__PULL_RESPONSE__INIT;
    uint8_t head[64];
    size_t len = psd__v1__pull_response__pack(&r, head);
    struct cm_wire_piece p = {(const uint8_t *)values, sizeof values};
    cm_rpc_reply(call, cm_wire_build(head, len, &p, 1, NULL, NULL));
  }
}

static struct cm_rpc_method methods[] = {
    {"/psd.v1.Data/Declare", on_declare, NULL},
    {"/psd.v1.Data/Pull", on_pull, NULL},
};
static struct cm_server *srv;
static struct cm_spec *spec;

/* A port nobody listens on just now. */
static int free_port(void) {
  struct sockaddr_in a = {.sin_family = AF_INET};
  socklen_t len = sizeof a;
  int fd = socket(AF_INET, SOCK_STREAM, 0), port;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
  port = ntohs(a.sin_port);
  close(fd);
  return port;
}

static void serve(void) {
  char text[512], addr[64], err[1024];
  int port = free_port();
  cm_rpc_global_init();
  memset(&shard, 0, sizeof shard);
  snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
  snprintf(text, sizeof text,
           "{\"cluster\": {\"ps\": [\"%s\"], \"worker\": [\"127.0.0.1:1\", "
           "\"127.0.0.1:2\"]}, \"job\": {\"name\": \"rt\", \"retry_s\": 10, "
           "\"unix_sockets\": false, \"rpc_timeout_ms\": 2000}}",
           addr);
  ck_assert_msg(
      cm_spec_parse(text, strlen(text), "t.json", &spec, err, sizeof err) == 0,
      "%s", err);
  ck_assert_int_eq(cm_server_new(&srv, addr, methods, 2, NULL, err, sizeof err),
                   0);
  ck_assert_int_eq(cm_server_start(srv), 0);
}

static void unserve(void) {
  cm_server_free(srv);
  cm_spec_free(spec);
  cm_rpc_global_shutdown();
}

/* A client that declared one variable of N floats on the stand-in. */
static struct psc__client *client(struct psc__var *v, float *value) {
  struct psc__client *c = NULL;
  struct psc__client_opts o = {.worker = "worker:0"};
  *v = (struct psc__var){.name = "v", .ndim = 1, .shape = {N}, .value = value};
  ck_assert_int_eq(psc__client_new(&c, spec, &o), 0);
  ck_assert_msg(psc__client_declare(c, v, 1) == 0, "%s", psc__client_error(c));
  return c;
}

START_TEST(cancelled_then_unavailable_pull_is_retried) {
  struct psc__var v;
  struct psc__client_stats st;
  float got[N] = {0};
  struct psc__client *c = client(&v, got);
  ck_assert_msg(psc__client_pull(c) == 0, "%s", psc__client_error(c));
  ck_assert_mem_eq(got, values, sizeof values);
  psc__client_stats(c, &st);
  ck_assert_int_eq(atomic_load(&shard.pulls), 3);
  ck_assert_uint_eq(st.retries, 2);
  ck_assert_uint_eq(st.outages, 1);
  /* Every call carries the spec and the boot id Declare answered. */
  ck_assert_uint_eq(atomic_load(&shard.fp), cm_spec_fingerprint(spec));
  ck_assert_uint_eq(atomic_load(&shard.boot), BOOT);
  ck_assert_int_eq(atomic_load(&shard.ps), 1);
  ck_assert_int_eq(atomic_load(&shard.workers), 2);
  psc__client_free(c);
}
END_TEST

START_TEST(refusal_is_not_retried) {
  struct psc__var v;
  float got[N] = {0};
  struct psc__client *c = client(&v, got);
  atomic_store(&shard.fail_as, GRPC_STATUS_FAILED_PRECONDITION);
  ck_assert_int_eq(psc__client_pull(c), CM_ERPC);
  ck_assert_int_eq(atomic_load(&shard.pulls), 1);
  ck_assert_msg(strstr(psc__client_error(c), "pull to ps:0 (127.0.0.1:") &&
                    strstr(psc__client_error(c),
                           "failed: FAILED_PRECONDITION: refused by the test"),
                "%s", psc__client_error(c));
  psc__client_free(c);
}
END_TEST

static Suite *client_suite(void) {
  Suite *s = suite_create("client");
  TCase *tc = tcase_create("words");
  tcase_add_test(tc, retried_statuses);
  tcase_add_test(tc, causes_in_words);
  suite_add_tcase(s, tc);
  tc = tcase_create("retries");
  tcase_add_checked_fixture(tc, serve, unserve);
  tcase_add_test(tc, cancelled_then_unavailable_pull_is_retried);
  tcase_add_test(tc, refusal_is_not_retried);
  tcase_set_timeout(tc, 30);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(client_suite(), TU_NOFORK); }
