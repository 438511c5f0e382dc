/* pstool: a test and benchmark client for psd (not installed).
 *
 *   pstool --cluster F [--shard S] declare NAME SHAPE [PLACEMENT]
 *   pstool --cluster F [--shard S] [--step T --worker W] push NAME SHAPE
 *          OFFSET V1,V2,...
 *   pstool --cluster F [--shard S] [--step T --worker W] pushfill NAME SHAPE
 *          OFFSET COUNT VALUE
 *   pstool --cluster F [--shard S] [--client-id ID --seq N [--chunk-id C]]
 *          push NAME SHAPE OFFSET V1,V2,...
 *   pstool --cluster F [--shard S] pull NAME OFFSET COUNT
 *   pstool --cluster F [--shard S] raw METHOD HEXBYTES
 *   pstool --cluster F roundtrip --bytes N [--rounds R] [--chunk B] [--inflight
 * K] [--join --worker W] pstool tcp --bytes N [--rounds R]
 *
 * SHAPE is "4,3". The low-level commands send exactly one call to one shard
 * and print "OK ..." or "ERROR <gRPC status>: <message>" (exit 1), so tests
 * can check psd's answers to bad input. pushfill pushes COUNT copies of
 * VALUE ("nan" and "inf" work); --step T and --worker W make a push a sync
 * one (step T, worker W); --max-message-mb M lets pstool send and receive
 * messages up to M MiB whatever the spec says, to test the shard's limit.
 * roundtrip declares a variable of N bytes split across all shards with
 * libpsclient, pushes a known gradient, pulls it back and checks every element
 * against the update formula, then times R pushes and R pulls (with each call's
 * p50 and p99); with --join it first joins the job as worker W, so its pushes
 * name it (the coordinator then times them as that worker's steps); tcp times a
 * plain loopback TCP copy, the baseline for the transport benchmark.
 * nanpush K (with --bytes N) pushes a gradient with a NaN at element K through
 * libpsclient, which must refuse it whole (job.nonfinite "reject"), and
 * checks with a pull that no shard changed.
 * syncload is a light sync worker for the scale benchmark: the demo MLP's
 * variables, no compute, S steps of pull, stage, admit.
 *
 * Faults (tests/integration/test_faults.py):
 *   push --client-id ID --seq N [--chunk-id C] names the message as libpsclient
 *     does (PushRequest.client_id, seq, chunk), so sending it twice tests
 *     that a shard applies it once.
 *   pstool --cluster F count --rounds K [--bytes N] [--chunk B] [--worker W]
 *     pushes a gradient of 2^-10 everywhere K times with libpsclient (which
 *     retries through faults), printing "count pushes=N" every 25, then
 *     pulls and checks every element equals its start minus K lr 2^-10
 *     (job.optimizer must be sgd): exactly once, whatever was retried.
 *   pstool --cluster F load --clients N --seconds S [--bytes B]
 *     N threads, each its own client and variable split across the shards,
 *     push then pull until S seconds have passed, then each checks its
 *     variable as count does; prints "load t=..." every second and a last
 *     line with pushes, pulls, calls and failed calls. */
#include <arpa/inet.h>
#include <getopt.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "auth.h"
#include "err.h"
#include "ps.pb-c.h"
#include "psclient.h"
#include "rpc.h"
#include "spec.h"
#include "wire.h"

struct args {
  const char *cluster; /* --cluster */
  int shard;           /* --shard */
  int timeout;         /* --timeout ms */
  uint64_t bytes;      /* --bytes */
  int rounds;          /* --rounds */
  size_t chunk;        /* --chunk */
  int inflight;        /* --inflight */
  int worker;          /* --worker */
  int join;            /* --join: roundtrip joins as worker --worker first */
  long long step;      /* --step: a push's sync step, -1 when not given */
  int max_message_mb;  /* --max-message-mb, 0: the spec's */
  uint64_t client_id; /* --client-id: push names its message (0: it does not) */
  uint64_t seq;       /* --seq: the push's seq */
  uint32_t chunk_id;  /* --chunk-id: the push's chunk */
  int clients;        /* --clients: load's client threads */
  double seconds;     /* --seconds: load's duration */
};

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* The q-quantile (0..1) of t[0..n), which it sorts. */
static double quantile(double *t, int n, double q) {
  qsort(t, n, sizeof *t, cmp_double);
  int i = (int)(q * (n - 1) + 0.5);
  return n ? t[i] : 0;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

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

static int cmd_low(struct cm_spec *spec, const struct args *a, int argc,
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
    printf("OK version=%llu values=",
           pr && pr->n_versions ? (unsigned long long)pr->versions[0] : 0ULL);
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
static int cmd_nanpush(struct cm_spec *spec, const struct args *a,
                       uint64_t at) {
  struct dw_client_opts o = {.worker = "pstool", .timeout_ms = a->timeout};
  struct dw_client *c = NULL;
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
  struct dw_var v = {.name = "nanpush",
                     .ndim = 1,
                     .shape = {(int64_t)n},
                     .placement = DW_PLACE_SPLIT,
                     .init = DW_INIT_ZEROS,
                     .value = value,
                     .grad = grad};
  if (dw_client_new(&c, spec, &o) || dw_client_declare(c, &v, 1) ||
      dw_client_pull(c)) {
    fprintf(stderr, "pstool: %s\n", c ? dw_client_error(c) : "no client");
    goto out;
  }
  memcpy(before, value, n * sizeof(float));
  if (dw_client_push(c) == 0) {
    printf("pushed: the client sent a gradient holding NaN\n");
    goto out;
  }
  printf("refused: %s\n", dw_client_error(c));
  if (dw_client_pull(c)) {
    fprintf(stderr, "pstool: %s\n", dw_client_error(c));
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
  dw_client_free(c);
  free(value);
  free(grad);
  free(before);
  return rc;
}

static int cmd_roundtrip(struct cm_spec *spec, const struct args *a) {
  struct dw_client_opts o = {.worker = "pstool",
                             .timeout_ms = a->timeout,
                             .chunk_bytes = a->chunk,
                             .inflight = a->inflight};
  struct dw_client *c = NULL;
  uint64_t n = a->bytes / sizeof(float);
  float *value = NULL, *grad = NULL;
  char name[64];
  int rc = 1;

  if (n == 0) {
    fprintf(stderr, "pstool: --bytes must be at least 4\n");
    return 2;
  }
  value = malloc(n * sizeof(float));
  grad = malloc(n * sizeof(float));
  if (!value || !grad) {
    fprintf(stderr, "pstool: out of memory\n");
    goto out;
  }
  for (uint64_t i = 0; i < n; i++)
    grad[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
  /* --worker tells concurrent clients' variables apart. */
  snprintf(name, sizeof name, "roundtrip/%llu/%d", (unsigned long long)a->bytes,
           a->worker);
  struct dw_var v = {
      .name = name,
      .ndim = 2,
      .shape = {(int64_t)(n % 256 == 0 ? n / 256 : n), n % 256 == 0 ? 256 : 1},
      .placement = DW_PLACE_SPLIT,
      .init = DW_INIT_ZEROS,
      .value = value,
      .grad = grad};
  uint64_t step;
  if (dw_client_new(&c, spec, &o) ||
      (a->join && dw_client_join(c, a->worker, 500, &step)) ||
      dw_client_declare(c, &v, 1) || dw_client_pull(c)) {
    fprintf(stderr, "pstool: %s\n", c ? dw_client_error(c) : "no client");
    goto out;
  }
  /* The variable is fresh only the first time; check against what it held. */
  float *before = malloc(n * sizeof(float));
  memcpy(before, value, n * sizeof(float));
  if (dw_client_push(c) || dw_client_pull(c)) {
    fprintf(stderr, "pstool: %s\n", dw_client_error(c));
    free(before);
    goto out;
  }
  /* Exactly what psd computes in f32: sgd w -= lr*g; momentum's first step
   * on a zero slot is the same (v = g, w -= lr*v). Other optimizers are
   * only timed. */
  const struct cm_optim *opt = cm_optim_pick(&spec->job.optim, name, NULL);
  float lr = (float)cm_schedule_lr(&opt->schedule, opt->lr, 0);
  uint64_t bad = 0;
  int fresh = (opt->type == CM_OPT_SGD || opt->type == CM_OPT_MOMENTUM) &&
              opt->weight_decay == 0;
  for (uint64_t i = 0; i < n; i++)
    if (before[i] != 0.0f)
      fresh = 0;
  for (uint64_t i = 0; fresh && i < n; i++) {
    float want = before[i] - lr * grad[i];
    if (value[i] != want && bad++ < 5)
      fprintf(stderr, "element %llu: got %.9g want %.9g\n",
              (unsigned long long)i, value[i], want);
  }
  /* push_pull: its pull sees each element before or after this push, and
   * the next pull sees it after (for sgd: exactly w - lr*g). */
  if (fresh && !bad) {
    int sgd = opt->type == CM_OPT_SGD;
    lr = (float)cm_schedule_lr(&opt->schedule, opt->lr, 1);
    float *mid = malloc(n * sizeof(float));
    memcpy(before, value, n * sizeof(float));
    if (!mid || dw_client_push_pull(c)) {
      fprintf(stderr, "pstool: %s\n", mid ? dw_client_error(c) : "no memory");
      free(mid);
      free(before);
      goto out;
    }
    memcpy(mid, value, n * sizeof(float));
    if (dw_client_pull(c)) {
      fprintf(stderr, "pstool: %s\n", dw_client_error(c));
      free(mid);
      free(before);
      goto out;
    }
    for (uint64_t i = 0; i < n; i++) {
      float want = sgd ? before[i] - lr * grad[i] : value[i];
      if ((value[i] != want || (grad[i] != 0.0f && value[i] == before[i]) ||
           (mid[i] != before[i] && mid[i] != value[i])) &&
          bad++ < 5)
        fprintf(stderr,
                "push_pull element %llu: before %.9g, push_pull %.9g, "
                "then pull %.9g\n",
                (unsigned long long)i, before[i], mid[i], value[i]);
    }
    free(mid);
  }
  free(before);
  if (bad) {
    printf("roundtrip bytes=%llu MISMATCH elements=%llu\n",
           (unsigned long long)a->bytes, (unsigned long long)bad);
    goto out;
  }
  double *tp = calloc(a->rounds + 1, sizeof *tp);
  double *tl = calloc(a->rounds + 1, sizeof *tl);
  if (!tp || !tl) {
    free(tp);
    free(tl);
    goto out;
  }
  double t0 = now_s(), t = t0;
  for (int r = 0; r < a->rounds; r++) {
    if (dw_client_push(c)) {
      fprintf(stderr, "pstool: %s\n", dw_client_error(c));
      free(tp);
      free(tl);
      goto out;
    }
    double u = now_s();
    tp[r] = u - t;
    t = u;
  }
  double t1 = t;
  for (int r = 0; r < a->rounds; r++) {
    if (dw_client_pull(c)) {
      fprintf(stderr, "pstool: %s\n", dw_client_error(c));
      free(tp);
      free(tl);
      goto out;
    }
    double u = now_s();
    tl[r] = u - t;
    t = u;
  }
  double t2 = t;
  double mb = (double)a->bytes * a->rounds / 1e6;
  printf("roundtrip bytes=%llu %s via=%s push_MBps=%.0f pull_MBps=%.0f "
         "push_us=%.0f pull_us=%.0f push_p50_us=%.0f push_p99_us=%.0f "
         "pull_p50_us=%.0f pull_p99_us=%.0f\n",
         (unsigned long long)a->bytes, fresh ? "verified" : "reused",
         strncmp(dw_client_target(c, 0), "unix:", 5) ? "tcp" : "unix",
         mb / (t1 - t0), mb / (t2 - t1), (t1 - t0) / a->rounds * 1e6,
         (t2 - t1) / a->rounds * 1e6, quantile(tp, a->rounds, 0.5) * 1e6,
         quantile(tp, a->rounds, 0.99) * 1e6,
         quantile(tl, a->rounds, 0.5) * 1e6,
         quantile(tl, a->rounds, 0.99) * 1e6);
  free(tp);
  free(tl);
  rc = a->join ? (dw_client_leave(c) ? 1 : 0) : 0;
out:
  dw_client_free(c);
  free(value);
  free(grad);
  return rc;
}

/* A light sync worker: the demo MLP's variables, no model compute. */
static int cmd_syncload(struct cm_spec *spec, const struct args *a) {
  static const int64_t shapes[6][2] = {{256, 784}, {256, 1},  {128, 256},
                                       {128, 1},   {10, 128}, {10, 1}};
  static const char *names[6] = {"dense0/kernel", "dense0/bias",
                                 "dense1/kernel", "dense1/bias",
                                 "dense2/kernel", "dense2/bias"};
  struct dw_client_opts o = {.worker = NULL, .timeout_ms = a->timeout};
  struct dw_client *c = NULL;
  struct dw_var v[6];
  float *buf[6] = {0}, *grad[6] = {0};
  char who[32];
  uint64_t step = 0;
  int rc = 1;

  snprintf(who, sizeof who, "worker:%d", a->worker);
  o.worker = who;
  memset(v, 0, sizeof v);
  for (int i = 0; i < 6; i++) {
    size_t n = (size_t)(shapes[i][0] * shapes[i][1]);
    buf[i] = calloc(n, sizeof(float));
    grad[i] = calloc(n, sizeof(float));
    if (!buf[i] || !grad[i])
      goto out;
    v[i] = (struct dw_var){.name = names[i],
                           .ndim = shapes[i][1] == 1 ? 1 : 2,
                           .shape = {shapes[i][0], shapes[i][1]},
                           .placement = DW_PLACE_AUTO,
                           .init = DW_INIT_ZEROS,
                           .value = buf[i],
                           .grad = grad[i]};
  }
  if (dw_client_new(&c, spec, &o) || dw_client_declare(c, v, 6) ||
      dw_client_join(c, a->worker, spec->job.heartbeat_ms, &step)) {
    fprintf(stderr, "pstool: %s\n", c ? dw_client_error(c) : "no client");
    goto out;
  }
  double t0 = now_s();
  int dropped = 0;
  for (int r = 0; r < a->rounds; r++) {
    uint64_t version, next = step + 1;
    int closed = 0, admitted = 0;
    if (dw_client_pull_at(c, step, &version) ||
        dw_client_push_step(c, version, &closed) ||
        (!closed && dw_client_admit(c, version, &admitted, &next))) {
      fprintf(stderr, "pstool: %s\n", dw_client_error(c));
      goto out;
    }
    dropped += !admitted;
    step = next > version ? next : version + 1;
  }
  double t1 = now_s();
  dw_client_leave(c);
  printf("syncload worker=%d steps=%d wall_s=%.3f dropped=%d\n", a->worker,
         a->rounds, t1 - t0, dropped);
  rc = 0;
out:
  dw_client_free(c);
  for (int i = 0; i < 6; i++) {
    free(buf[i]);
    free(grad[i]);
  }
  return rc;
}

/* The gradient count and load push: 2^-10, so that with an sgd learning
 * rate of a power of two every update and every sum of them is exact. */
#define COUNT_GRAD (1.0f / 1024)

/* One variable of n floats split across the shards, with the start values
 * (pulled), for count and load. */
struct counted {
  struct dw_var v; /* declared */
  float *value;    /* pull destination */
  float *grad;     /* COUNT_GRAD everywhere */
  float *start;    /* values before the first push */
  char name[64];   /* v.name */
  uint64_t n;      /* elements */
  uint64_t pushes; /* logical pushes that succeeded */
  uint64_t pulls;  /* pulls that succeeded */
};

/* Declares and pulls c's variable; returns 0 or prints why and returns 1. */
static int counted_open(struct dw_client *cl, struct counted *c,
                        const char *name, uint64_t bytes) {
  c->n = bytes / sizeof(float);
  if (c->n == 0)
    c->n = 1;
  snprintf(c->name, sizeof c->name, "%s", name);
  c->value = calloc(c->n, sizeof(float));
  c->grad = malloc(c->n * sizeof(float));
  c->start = malloc(c->n * sizeof(float));
  if (!c->value || !c->grad || !c->start) {
    fprintf(stderr, "pstool: out of memory\n");
    return 1;
  }
  for (uint64_t i = 0; i < c->n; i++)
    c->grad[i] = COUNT_GRAD;
  c->v =
      (struct dw_var){.name = c->name,
                      .ndim = 2,
                      .shape = {(int64_t)(c->n % 256 == 0 ? c->n / 256 : c->n),
                                c->n % 256 == 0 ? 256 : 1},
                      .placement = DW_PLACE_SPLIT,
                      .init = DW_INIT_ZEROS,
                      .value = c->value,
                      .grad = c->grad};
  if (dw_client_declare(cl, &c->v, 1) || dw_client_pull(cl)) {
    fprintf(stderr, "pstool: %s: %s\n", name, dw_client_error(cl));
    return 1;
  }
  memcpy(c->start, c->value, c->n * sizeof(float));
  return 0;
}

/* Pulls c's variable and counts the elements that are not exactly their
 * start minus pushes x lr x COUNT_GRAD (f32, as psd's sgd computes it);
 * returns that count, or -1 when the pull failed. */
static int64_t counted_check(struct dw_client *cl, struct counted *c,
                             float lr) {
  int64_t bad = 0;
  if (dw_client_pull(cl)) {
    fprintf(stderr, "pstool: final pull of %s: %s\n", c->name,
            dw_client_error(cl));
    return -1;
  }
  float want = 0;
  for (uint64_t i = 0; i < c->n; i++) {
    /* Recomputed only where the start changes (a fresh variable: once). */
    if (i == 0 || c->start[i] != c->start[i - 1]) {
      want = c->start[i];
      for (uint64_t k = 0; k < c->pushes; k++)
        want -= lr * COUNT_GRAD;
    }
    if (c->value[i] != want && bad++ < 3)
      fprintf(stderr,
              "%s element %llu: %.9g, want %.9g (%llu pushes from %.9g)\n",
              c->name, (unsigned long long)i, c->value[i], want,
              (unsigned long long)c->pushes, c->start[i]);
    if (bad > 3 && i > 16)
      break; /* wrong already; the rest would take long to recount */
  }
  return bad;
}

static void counted_free(struct counted *c) {
  free(c->value);
  free(c->grad);
  free(c->start);
}

static int need_sgd(const struct cm_spec *spec, const char *cmd) {
  if (spec->job.optim.def.type == CM_OPT_SGD && spec->job.optim.nrules == 0)
    return 0;
  fprintf(stderr,
          "pstool %s: needs job.optimizer sgd and no overrides (the spec has "
          "%s)\n",
          cmd, cm_optim_name(spec->job.optim.def.type));
  return 1;
}

static int cmd_count(struct cm_spec *spec, const struct args *a) {
  struct dw_client_opts o = {
      .worker = "pstool", .timeout_ms = a->timeout, .chunk_bytes = a->chunk};
  struct dw_client *cl = NULL;
  struct dw_client_stats st;
  struct counted c;
  char name[64];
  int rc = 1;

  memset(&c, 0, sizeof c);
  if (need_sgd(spec, "count"))
    return 2;
  snprintf(name, sizeof name, "count/%d", a->worker);
  if (dw_client_new(&cl, spec, &o)) {
    fprintf(stderr, "pstool: no client\n");
    goto out;
  }
  if (counted_open(cl, &c, name, a->bytes ? a->bytes : 4096))
    goto out;
  for (int r = 0; r < a->rounds; r++) {
    if (dw_client_push(cl)) {
      fprintf(stderr, "pstool: push %d: %s\n", r + 1, dw_client_error(cl));
      goto out;
    }
    c.pushes++;
    if ((r + 1) % 25 == 0) {
      printf("count pushes=%d\n", r + 1);
      fflush(stdout);
    }
  }
  int64_t bad = counted_check(cl, &c, (float)spec->job.optim.def.lr);
  dw_client_stats(cl, &st);
  printf("count pushes=%llu elements=%llu value0=%.9g mismatches=%lld "
         "calls=%llu failed_calls=%llu retries=%llu outages=%llu "
         "client_id=%016llx\n",
         (unsigned long long)c.pushes, (unsigned long long)c.n, c.value[0],
         (long long)bad, (unsigned long long)st.calls,
         (unsigned long long)st.failed, (unsigned long long)st.retries,
         (unsigned long long)st.outages, (unsigned long long)dw_client_id(cl));
  rc = bad == 0 ? 0 : 1;
out:
  dw_client_free(cl);
  counted_free(&c);
  return rc;
}

/* One load client: its own libpsclient client and variable. */
struct loader {
  struct dw_client *cl;  /* owned */
  struct counted c;      /* its variable */
  double until;          /* now_s() at which it stops */
  int64_t bad;           /* elements wrong at the end, -1: final pull failed */
  int failed;            /* a push or pull failed */
  _Atomic uint64_t done; /* pushes + pulls so far, for the progress line */
};

static void *load_thread(void *arg) {
  struct loader *l = arg;
  while (now_s() < l->until) {
    if (dw_client_push(l->cl)) {
      fprintf(stderr, "pstool: %s push: %s\n", l->c.name,
              dw_client_error(l->cl));
      l->failed = 1;
      break;
    }
    l->c.pushes++;
    if (dw_client_pull(l->cl)) {
      fprintf(stderr, "pstool: %s pull: %s\n", l->c.name,
              dw_client_error(l->cl));
      l->failed = 1;
      break;
    }
    l->c.pulls++;
    atomic_fetch_add(&l->done, 2);
  }
  return NULL;
}

static int cmd_load(struct cm_spec *spec, const struct args *a) {
  int n = a->clients > 0 ? a->clients : 16;
  struct loader *l = calloc(n, sizeof *l);
  pthread_t *th = calloc(n, sizeof *th);
  int started = 0, rc = 1;
  char name[64], who[32];

  if (need_sgd(spec, "load")) {
    free(l);
    free(th);
    return 2;
  }
  if (!l || !th) {
    fprintf(stderr, "pstool: out of memory\n");
    goto out;
  }
  for (int i = 0; i < n; i++) {
    snprintf(who, sizeof who, "load:%d", i);
    struct dw_client_opts o = {.worker = who, .timeout_ms = a->timeout};
    snprintf(name, sizeof name, "load/%d", i);
    if (dw_client_new(&l[i].cl, spec, &o)) {
      fprintf(stderr, "pstool: no client\n");
      goto out;
    }
    if (counted_open(l[i].cl, &l[i].c, name, a->bytes ? a->bytes : 65536))
      goto out;
  }
  double t0 = now_s(), until = t0 + (a->seconds > 0 ? a->seconds : 10);
  for (int i = 0; i < n; i++) {
    l[i].until = until;
    if (pthread_create(&th[i], NULL, load_thread, &l[i]) != 0) {
      fprintf(stderr, "pstool: cannot start thread %d\n", i);
      break;
    }
    started++;
  }
  printf("load started clients=%d\n", started);
  fflush(stdout);
  for (int t = 1; now_s() < until; t++) {
    double wake = t0 + t;
    while (now_s() < wake && now_s() < until) {
      struct timespec ts = {0, 50 * 1000000L};
      nanosleep(&ts, NULL);
    }
    uint64_t done = 0;
    for (int i = 0; i < started; i++)
      done += atomic_load(&l[i].done);
    printf("load t=%.1f calls_done=%llu\n", now_s() - t0,
           (unsigned long long)done);
    fflush(stdout);
  }
  for (int i = 0; i < started; i++)
    pthread_join(th[i], NULL);
  double t1 = now_s();
  uint64_t pushes = 0, pulls = 0, calls = 0, failed = 0, retries = 0;
  int64_t bad = 0;
  int broken = started < n;
  for (int i = 0; i < started; i++) {
    struct dw_client_stats st;
    int64_t b = counted_check(l[i].cl, &l[i].c, (float)spec->job.optim.def.lr);
    dw_client_stats(l[i].cl, &st);
    pushes += l[i].c.pushes;
    pulls += l[i].c.pulls;
    calls += st.calls;
    failed += st.failed;
    retries += st.retries;
    broken |= l[i].failed || b < 0;
    bad += b > 0 ? b : 0;
  }
  printf("load clients=%d seconds=%.1f pushes=%llu pulls=%llu calls=%llu "
         "failed_calls=%llu retries=%llu mismatches=%lld calls_per_s=%.0f\n",
         n, t1 - t0, (unsigned long long)pushes, (unsigned long long)pulls,
         (unsigned long long)calls, (unsigned long long)failed,
         (unsigned long long)retries, (long long)bad, calls / (t1 - t0));
  rc = !broken && bad == 0 && failed == 0 ? 0 : 1;
out:
  for (int i = 0; l && i < n; i++) {
    dw_client_free(l[i].cl);
    counted_free(&l[i].c);
  }
  free(l);
  free(th);
  return rc;
}

/* The loopback TCP baseline: one thread writes, another reads. */
struct tcp_job {
  int fd;         /* connected socket */
  uint64_t bytes; /* bytes to move */
};

static void *tcp_reader(void *arg) {
  struct tcp_job *j = arg;
  size_t len = 1 << 20;
  char *buf = malloc(len);
  uint64_t got = 0;
  while (got < j->bytes) {
    ssize_t k = read(j->fd, buf, len);
    if (k <= 0)
      break;
    got += k;
  }
  free(buf);
  return NULL;
}

static int cmd_tcp(const struct args *a) {
  struct sockaddr_in sa = {.sin_family = AF_INET};
  socklen_t sl = sizeof sa;
  int ls = socket(AF_INET, SOCK_STREAM, 0), cs, as;
  size_t len = 1 << 20;
  char *buf = calloc(1, len);
  uint64_t total = a->bytes * (uint64_t)a->rounds;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(ls, (struct sockaddr *)&sa, sizeof sa) || listen(ls, 1) ||
      getsockname(ls, (struct sockaddr *)&sa, &sl)) {
    perror("pstool tcp");
    return 1;
  }
  cs = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(cs, (struct sockaddr *)&sa, sizeof sa) ||
      (as = accept(ls, NULL, NULL)) < 0) {
    perror("pstool tcp");
    return 1;
  }
  struct tcp_job j = {as, total};
  pthread_t th;
  double t0 = now_s();
  pthread_create(&th, NULL, tcp_reader, &j);
  for (uint64_t sent = 0; sent < total;) {
    size_t k = total - sent < len ? total - sent : len;
    ssize_t w = write(cs, buf, k);
    if (w <= 0)
      break;
    sent += w;
  }
  pthread_join(th, NULL);
  double t1 = now_s();
  printf("tcp bytes=%llu MBps=%.0f\n", (unsigned long long)a->bytes,
         total / 1e6 / (t1 - t0));
  close(cs);
  close(as);
  close(ls);
  free(buf);
  return 0;
}

int main(int argc, char **argv) {
  static const struct option opts[] = {
      {"cluster", required_argument, 0, 'c'},
      {"shard", required_argument, 0, 's'},
      {"timeout", required_argument, 0, 't'},
      {"bytes", required_argument, 0, 'b'},
      {"rounds", required_argument, 0, 'r'},
      {"chunk", required_argument, 0, 'k'},
      {"inflight", required_argument, 0, 'i'},
      {"worker", required_argument, 0, 'w'},
      {"join", no_argument, 0, 'j'},
      {"step", required_argument, 0, 'T'},
      {"max-message-mb", required_argument, 0, 'M'},
      {"client-id", required_argument, 0, 'C'},
      {"seq", required_argument, 0, 'S'},
      {"chunk-id", required_argument, 0, 'K'},
      {"clients", required_argument, 0, 'n'},
      {"seconds", required_argument, 0, 'E'},
      {0, 0, 0, 0}};
  struct args a = {.timeout = 10000, .rounds = 5, .step = -1};
  struct cm_spec *spec = NULL;
  char err[4096];
  int ch, rc;

  while ((ch = getopt_long(argc, argv, "+", opts, NULL)) != -1) {
    switch (ch) {
    case 'c':
      a.cluster = optarg;
      break;
    case 's':
      a.shard = atoi(optarg);
      break;
    case 't':
      a.timeout = atoi(optarg);
      break;
    case 'b':
      a.bytes = strtoull(optarg, NULL, 10);
      break;
    case 'r':
      a.rounds = atoi(optarg);
      break;
    case 'k':
      a.chunk = strtoull(optarg, NULL, 10);
      break;
    case 'i':
      a.inflight = atoi(optarg);
      break;
    case 'w':
      a.worker = atoi(optarg);
      break;
    case 'j':
      a.join = 1;
      break;
    case 'T':
      a.step = strtoll(optarg, NULL, 10);
      break;
    case 'M':
      a.max_message_mb = atoi(optarg);
      break;
    case 'C':
      a.client_id = strtoull(optarg, NULL, 0);
      break;
    case 'S':
      a.seq = strtoull(optarg, NULL, 10);
      break;
    case 'K':
      a.chunk_id = (uint32_t)strtoul(optarg, NULL, 10);
      break;
    case 'n':
      a.clients = atoi(optarg);
      break;
    case 'E':
      a.seconds = atof(optarg);
      break;
    default:
      return 2;
    }
  }
  if (optind >= argc) {
    fprintf(stderr, "pstool: no command (see the comment in tests/pstool.c)\n");
    return 2;
  }
  if (!strcmp(argv[optind], "tcp"))
    return cmd_tcp(&a);
  if (!a.cluster || cm_spec_load(a.cluster, &spec, err, sizeof err)) {
    fprintf(stderr, "pstool: %s\n", a.cluster ? err : "--cluster is required");
    return 2;
  }
  if (a.shard < 0 || a.shard >= spec->nps) {
    fprintf(stderr, "pstool: --shard %d out of range\n", a.shard);
    cm_spec_free(spec);
    return 2;
  }
  cm_rpc_global_init();
  cm_rpc_set_max_message((long long)(a.max_message_mb
                                         ? a.max_message_mb
                                         : spec->job.max_message_mb)
                         << 20);
  if (!strcmp(argv[optind], "roundtrip"))
    rc = cmd_roundtrip(spec, &a);
  else if (!strcmp(argv[optind], "syncload"))
    rc = cmd_syncload(spec, &a);
  else if (!strcmp(argv[optind], "count"))
    rc = cmd_count(spec, &a);
  else if (!strcmp(argv[optind], "load"))
    rc = cmd_load(spec, &a);
  else if (!strcmp(argv[optind], "nanpush") && optind + 1 < argc)
    rc = cmd_nanpush(spec, &a, strtoull(argv[optind + 1], NULL, 10));
  else
    rc = cmd_low(spec, &a, argc - optind, argv + optind);
  cm_spec_free(spec);
  cm_rpc_global_shutdown();
  return rc;
}
