/* pstool's low-level commands (pstool.h): declare, push, pushfill, pull and
 * raw each build one request by hand, send it to one shard and print "OK
 * ..." or "ERROR <gRPC status>: <message>", so that tests can send psd what
 * libpsclient never would. nanpush checks the other side: libpsclient
 * itself must refuse a gradient holding NaN before any shard sees it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth.h"
#include "ps.pb-c.h"
#include "psclient.h"
#include "pstool.h"
#include "rpc.h"
#include "rpc_client.h"
#include "wire.h"

static int parse_list_i64(const char *s, int64_t *out, int max) {
  int n = 0;
  char *end;
  while (*s && n < max) {
    out[n++] = strtoll(s, &end, 10);
    if (end == s)
      return -1;
    s = *end == ',' ? end + 1 : end;
  }
  return n;
}

/* Sends one call and prints the outcome; returns the exit status. */
static int one_call(struct cm_channel *ch, const char *method,
                    grpc_byte_buffer *req, int timeout,
                    grpc_byte_buffer **resp) {
  struct cm_unary u;
  struct cm_run_opts o = {.timeout_ms = timeout, .inflight = 1};
  memset(&u, 0, sizeof u);
  u.channel = ch;
  u.method = method;
  u.request = req;
  cm_client_run(&u, 1, &o);
  if (u.status != GRPC_STATUS_OK) {
    printf("ERROR %s: %s\n", cm_rpc_status_name(u.status), u.details);
    cm_unary_release(&u);
    return 1;
  }
  *resp = u.response;
  u.response = NULL;
  cm_unary_release(&u);
  return 0;
}

int pstool_low(struct cm_spec *spec, const struct pstool_args *a, int argc,
               char **argv) {
  Psd__V1__Caller caller = PSD__V1__CALLER__INIT;
  Psd__V1__Segment seg = PSD__V1__SEGMENT__INIT, *segs[1] = {&seg};
  struct cm_channel *ch = NULL;
  grpc_byte_buffer *req = NULL, *resp = NULL;
  const char *method = NULL;
  int64_t shape[8];
  float *vals = NULL;
  int rc = 2, nshape = 0;

  struct cm_creds creds;
  char err[1024];

  caller.job = spec->job.name;
  caller.worker = "pstool";
  if (cm_creds_load(&spec->auth, 0, &creds, err, sizeof err)) {
    fprintf(stderr, "pstool: %s\n", err);
    return 2;
  }
  cm_channel_new(&ch, spec->ps[a->shard].text, &creds);
  cm_creds_free(&creds); /* the channel keeps what it needs */
  if (!strcmp(argv[0], "declare") && argc >= 3) {
    Psd__V1__DeclareRequest r = PSD__V1__DECLARE_REQUEST__INIT;
    Psd__V1__VarSpec vs = PSD__V1__VAR_SPEC__INIT, *vp[1] = {&vs};
    nshape = parse_list_i64(argv[2], shape, 8);
    vs.name = argv[1];
    vs.n_shape = nshape > 0 ? nshape : 0;
    vs.shape = shape;
    vs.placement = argc >= 4 ? atoi(argv[3]) : -1;
    r.caller = &caller;
    r.n_vars = 1;
    r.vars = vp;
    method = "/psd.v1.Data/Declare";
    req = cm_rpc_pack(&r.base);
  } else if ((!strcmp(argv[0], "push") && argc >= 5) ||
             (!strcmp(argv[0], "pushfill") && argc >= 6)) {
    Psd__V1__PushRequest r = PSD__V1__PUSH_REQUEST__INIT;
    size_t n = 0, cap = 1;
    if (!strcmp(argv[0], "pushfill")) {
      float x = strtof(argv[5], NULL);
      cap = n = strtoull(argv[4], NULL, 10);
      if (!(vals = malloc((n ? n : 1) * sizeof *vals)))
        goto out;
      for (size_t i = 0; i < n; i++)
        vals[i] = x;
    } else {
      for (const char *p = argv[4]; *p; p++)
        cap += *p == ',';
      vals = calloc(cap, sizeof *vals);
      for (char *p = argv[4], *end; *p; p = *end == ',' ? end + 1 : end) {
        vals[n++] = strtof(p, &end);
        if (end == p)
          break;
      }
    }
    if (a->step >= 0) {
      r.step = (uint64_t)a->step;
      r.worker = a->worker;
    }
    nshape = parse_list_i64(argv[2], shape, 8);
    seg.name = argv[1];
    seg.offset = strtoull(argv[3], NULL, 10);
    seg.count = n;
    seg.n_shape = nshape > 0 ? nshape : 0;
    seg.shape = shape;
    r.caller = &caller;
    r.n_segments = 1;
    r.segments = segs;
    r.examples = 1;
    r.client_id = a->client_id;
    r.seq = a->seq;
    r.chunk = a->chunk_id;
    size_t len = psd__v1__push_request__get_packed_size(&r);
    uint8_t *head = malloc(len + 1);
    psd__v1__push_request__pack(&r, head);
    struct cm_wire_piece piece = {(const uint8_t *)vals, n * sizeof(float)};
    req = cm_wire_build(head, len, &piece, 1, NULL, NULL);
    free(head);
    method = "/psd.v1.Data/Push";
  } else if (!strcmp(argv[0], "pull") && argc >= 4) {
    Psd__V1__PullRequest r = PSD__V1__PULL_REQUEST__INIT;
    seg.name = argv[1];
    seg.offset = strtoull(argv[2], NULL, 10);
    seg.count = strtoull(argv[3], NULL, 10);
    r.caller = &caller;
    r.n_segments = 1;
    r.segments = segs;
    /* What this tool accepts (--max-message-mb, else the spec's), as
     * libpsclient says; a larger answer comes partial. */
    r.max_answer_bytes = (uint64_t)cm_rpc_max_message();
    req = cm_rpc_pack(&r.base);
    method = "/psd.v1.Data/Pull";
  } else if (!strcmp(argv[0], "raw") && argc >= 3) {
    size_t n = strlen(argv[2]) / 2;
    uint8_t *buf = malloc(n + 1);
    for (size_t i = 0; i < n; i++)
      sscanf(argv[2] + 2 * i, "%2hhx", &buf[i]);
    grpc_slice sl = grpc_slice_from_copied_buffer((const char *)buf, n);
    req = grpc_raw_byte_buffer_create(&sl, 1);
    grpc_slice_unref(sl);
    free(buf);
    method = argv[1];
  } else {
    fprintf(stderr, "pstool: bad arguments for '%s'\n", argv[0]);
    goto out;
  }
  rc = one_call(ch, method, req, a->timeout, &resp);
  if (rc)
    goto out;
  if (!strcmp(argv[0], "pull")) {
    struct cm_wire_msg m;
    Psd__V1__PullResponse *pr = NULL;
    if (cm_wire_parse(&m, resp) == 0)
      pr = psd__v1__pull_response__unpack(NULL, m.head_len, m.head);
    printf("OK version=%llu ",
           pr && pr->n_versions ? (unsigned long long)pr->versions[0] : 0ULL);
    if (pr && pr->partial) /* the answer would not fit: the first ones only */
      printf("partial elements=%llu ", (unsigned long long)pr->elements);
    printf("values=");
    for (size_t i = 0; i < m.bulk_len / 4; i++) {
      float f;
      cm_wire_bulk_read(&m, i * 4, &f, 4);
      printf("%s%.9g", i ? "," : "", f);
    }
    printf("\n");
    if (pr)
      psd__v1__pull_response__free_unpacked(pr, NULL);
    cm_wire_msg_release(&m);
  } else {
    printf("OK\n");
  }
out:
  if (resp)
    grpc_byte_buffer_destroy(resp);
  free(vals);
  cm_channel_free(ch);
  return rc;
}

/* nanpush K: a variable of --bytes split across every shard, a gradient of
 * ones with a NaN at element K pushed through libpsclient. With
 * job.nonfinite "reject" the client refuses it before sending anything:
 * prints "refused: <the client's error>", then pulls and prints "OK
 * unchanged" when no element moved on any shard (exit 0), else the first
 * element that did (exit 1). */
int pstool_nanpush(struct cm_spec *spec, const struct pstool_args *a,
                   uint64_t at) {
  struct psc__client_opts o = {.worker = "pstool", .timeout_ms = a->timeout};
  struct psc__client *c = NULL;
  uint64_t n = a->bytes / sizeof(float);
  float *value = NULL, *grad = NULL, *before = NULL;
  int rc = 1;

  if (n == 0 || at >= n) {
    fprintf(stderr, "pstool: nanpush: element %llu is not below --bytes/4\n",
            (unsigned long long)at);
    return 2;
  }
  value = malloc(n * sizeof(float));
  grad = malloc(n * sizeof(float));
  before = malloc(n * sizeof(float));
  if (!value || !grad || !before) {
    fprintf(stderr, "pstool: out of memory\n");
    goto out;
  }
  for (uint64_t i = 0; i < n; i++)
    grad[i] = 1.0f;
  grad[at] = NAN;
  struct psc__var v = {.name = "nanpush",
                       .ndim = 1,
                       .shape = {(int64_t)n},
                       .placement = PSC__PLACE_SPLIT,
                       .init = PSC__INIT_ZEROS,
                       .value = value,
                       .grad = grad};
  if (psc__client_new(&c, spec, &o) || psc__client_declare(c, &v, 1) ||
      psc__client_pull(c)) {
    fprintf(stderr, "pstool: %s\n", c ? psc__client_error(c) : "no client");
    goto out;
  }
  memcpy(before, value, n * sizeof(float));
  if (psc__client_push(c) == 0) {
    printf("pushed: the client sent a gradient holding NaN\n");
    goto out;
  }
  printf("refused: %s\n", psc__client_error(c));
  if (psc__client_pull(c)) {
    fprintf(stderr, "pstool: %s\n", psc__client_error(c));
    goto out;
  }
  for (uint64_t i = 0; i < n; i++)
    if (value[i] != before[i]) {
      printf("APPLIED element %llu: %.9g, was %.9g\n", (unsigned long long)i,
             value[i], before[i]);
      goto out;
    }
  printf("OK unchanged\n");
  rc = 0;
out:
  psc__client_free(c);
  free(value);
  free(grad);
  free(before);
  return rc;
}
