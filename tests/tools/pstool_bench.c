/* pstool's benchmark commands (pstool.h), whose key=value lines
 * tests/bench/bench.py reads: roundtrip checks one push and pull of a
 * variable split across every shard against the update formula, then times
 * pushes and pulls; syncload is a light sync worker for the scale benchmark;
 * tcp times a plain loopback TCP copy, the transport's baseline. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "clock.h"
#include "psclient.h"
#include "pstool.h"

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

int pstool_roundtrip(struct cm_spec *spec, const struct pstool_args *a) {
  struct psc__client_opts o = {.worker = "pstool",
                               .timeout_ms = a->timeout,
                               .chunk_bytes = a->chunk,
                               .inflight = a->inflight};
  struct psc__client *c = NULL;
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
  struct psc__var v = {
      .name = name,
      .ndim = 2,
      .shape = {(int64_t)(n % 256 == 0 ? n / 256 : n), n % 256 == 0 ? 256 : 1},
      .placement = PSC__PLACE_SPLIT,
      .init = PSC__INIT_ZEROS,
      .value = value,
      .grad = grad};
  uint64_t step;
  if (psc__client_new(&c, spec, &o) ||
      (a->join && psc__client_join(c, a->worker, 500, &step)) ||
      psc__client_declare(c, &v, 1) || psc__client_pull(c)) {
    fprintf(stderr, "pstool: %s\n", c ? psc__client_error(c) : "no client");
    goto out;
  }
  /* The variable is fresh only the first time; check against what it held. */
  float *before = malloc(n * sizeof(float));
  memcpy(before, value, n * sizeof(float));
  if (psc__client_push(c) || psc__client_pull(c)) {
    fprintf(stderr, "pstool: %s\n", psc__client_error(c));
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
    if (!mid || psc__client_push_pull(c)) {
      fprintf(stderr, "pstool: %s\n", mid ? psc__client_error(c) : "no memory");
      free(mid);
      free(before);
      goto out;
    }
    memcpy(mid, value, n * sizeof(float));
    if (psc__client_pull(c)) {
      fprintf(stderr, "pstool: %s\n", psc__client_error(c));
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
  int npush = a->only == 2 ? 0 : a->rounds,
      npull = a->only == 1 ? 0 : a->rounds;
  double t0 = cm_mono_s(), t = t0;
  for (int r = 0; r < npush; r++) {
    if (psc__client_push(c)) {
      fprintf(stderr, "pstool: %s\n", psc__client_error(c));
      free(tp);
      free(tl);
      goto out;
    }
    double u = cm_mono_s();
    tp[r] = u - t;
    t = u;
  }
  double t1 = t;
  for (int r = 0; r < npull; r++) {
    if (psc__client_pull(c)) {
      fprintf(stderr, "pstool: %s\n", psc__client_error(c));
      free(tp);
      free(tl);
      goto out;
    }
    double u = cm_mono_s();
    tl[r] = u - t;
    t = u;
  }
  double t2 = t;
  /* A direction left out (--only) prints 0. */
  double mbp = (double)a->bytes * npush / 1e6,
         mbl = (double)a->bytes * npull / 1e6;
  double sp = npush ? t1 - t0 : 1, sl = npull ? t2 - t1 : 1;
  printf("roundtrip bytes=%llu %s via=%s shm=%s push_MBps=%.0f pull_MBps=%.0f "
         "push_us=%.0f pull_us=%.0f push_p50_us=%.0f push_p99_us=%.0f "
         "pull_p50_us=%.0f pull_p99_us=%.0f\n",
         (unsigned long long)a->bytes, fresh ? "verified" : "reused",
         strncmp(psc__client_target(c, 0), "unix:", 5) ? "tcp" : "unix",
         psc__client_shm_bytes(c, 0) ? "yes" : "no", mbp / sp, mbl / sl,
         npush ? sp / npush * 1e6 : 0, npull ? sl / npull * 1e6 : 0,
         quantile(tp, npush, 0.5) * 1e6, quantile(tp, npush, 0.99) * 1e6,
         quantile(tl, npull, 0.5) * 1e6, quantile(tl, npull, 0.99) * 1e6);
  free(tp);
  free(tl);
  /* A joined client reports each timed push as one example, so that the
   * coordinator's job rate can be checked (test_psctl.py). */
  rc = a->join ? (psc__client_leave(c, (uint64_t)a->rounds, t1 - t0,
                                    cm_mono_s() - t1)
                      ? 1
                      : 0)
               : 0;
out:
  psc__client_free(c);
  free(value);
  free(grad);
  return rc;
}

/* A light sync worker: the demo MLP's variables, no model compute. */
int pstool_syncload(struct cm_spec *spec, const struct pstool_args *a) {
  static const int64_t shapes[6][2] = {{256, 784}, {256, 1},  {128, 256},
                                       {128, 1},   {10, 128}, {10, 1}};
  static const char *names[6] = {"dense0/kernel", "dense0/bias",
                                 "dense1/kernel", "dense1/bias",
                                 "dense2/kernel", "dense2/bias"};
  struct psc__client_opts o = {.worker = NULL, .timeout_ms = a->timeout};
  struct psc__client *c = NULL;
  struct psc__var v[6];
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
    v[i] = (struct psc__var){.name = names[i],
                             .ndim = shapes[i][1] == 1 ? 1 : 2,
                             .shape = {shapes[i][0], shapes[i][1]},
                             .placement = PSC__PLACE_AUTO,
                             .init = PSC__INIT_ZEROS,
                             .value = buf[i],
                             .grad = grad[i]};
  }
  if (psc__client_new(&c, spec, &o) || psc__client_declare(c, v, 6) ||
      psc__client_join(c, a->worker, spec->job.heartbeat_ms, &step)) {
    fprintf(stderr, "pstool: %s\n", c ? psc__client_error(c) : "no client");
    goto out;
  }
  double t0 = cm_mono_s();
  int dropped = 0;
  for (int r = 0; r < a->rounds; r++) {
    uint64_t version, next = step + 1;
    int closed = 0, admitted = 0;
    if (psc__client_pull_at(c, step, &version) ||
        psc__client_push_step(c, version, &closed) ||
        (!closed && psc__client_admit(c, version, &admitted, &next))) {
      fprintf(stderr, "pstool: %s\n", psc__client_error(c));
      goto out;
    }
    dropped += !admitted;
    uint64_t back;
    if (psc__client_rolled_back(c, &back) || psc__client_rejoined(c, &back))
      step = back; /* go on from the step the job went back to, or joined */
    else
      step = next > version ? next : version + 1;
  }
  double t1 = cm_mono_s();
  psc__client_leave(c, 0, 0, 0);
  printf("syncload worker=%d steps=%d wall_s=%.3f dropped=%d\n", a->worker,
         a->rounds, t1 - t0, dropped);
  rc = 0;
out:
  psc__client_free(c);
  for (int i = 0; i < 6; i++) {
    free(buf[i]);
    free(grad[i]);
  }
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

/* Moves exactly n bytes through fd (rd: reading, else writing); 0 or -1. */
static int tcp_full(int fd, char *buf, size_t n, int rd) {
  for (size_t done = 0; done < n;) {
    ssize_t k =
        rd ? read(fd, buf + done, n - done) : write(fd, buf + done, n - done);
    if (k <= 0)
      return -1;
    done += (size_t)k;
  }
  return 0;
}

/* The latency baseline: the other end of a ping-pong, which answers each
 * message of j->bytes with 64 bytes, as a shard answers a push. */
static void *tcp_echo(void *arg) {
  struct tcp_job *j = arg;
  char *buf = malloc(j->bytes + 64);
  while (buf && !tcp_full(j->fd, buf, j->bytes, 1) &&
         !tcp_full(j->fd, buf, 64, 0)) {
  }
  free(buf);
  return NULL;
}

/* R round trips of `bytes` out and 64 back over loopback TCP (TCP_NODELAY,
 * as gRPC sets), timed one by one: what a small call costs with no gRPC,
 * protobuf or psd, on this machine now. */
static int tcp_pingpong(int cs, int as, const struct pstool_args *a) {
  struct tcp_job j = {as, a->bytes};
  int one = 1, rc = 1;
  char *buf = malloc(a->bytes + 64);
  double *t = calloc((size_t)a->rounds + 1, sizeof *t);
  pthread_t th;
  setsockopt(cs, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  setsockopt(as, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (!buf || !t || pthread_create(&th, NULL, tcp_echo, &j))
    goto out;
  memset(buf, 1, a->bytes);
  for (int r = 0; r < a->rounds; r++) {
    double t0 = cm_mono_s();
    if (tcp_full(cs, buf, a->bytes, 0) || tcp_full(cs, buf, 64, 1))
      break;
    t[r] = cm_mono_s() - t0;
  }
  shutdown(cs, SHUT_RDWR); /* the echo thread's read ends */
  pthread_join(th, NULL);
  printf("tcp pingpong bytes=%llu rounds=%d rt_p50_us=%.0f rt_p99_us=%.0f\n",
         (unsigned long long)a->bytes, a->rounds,
         quantile(t, a->rounds, 0.5) * 1e6, quantile(t, a->rounds, 0.99) * 1e6);
  rc = 0;
out:
  free(buf);
  free(t);
  return rc;
}

int pstool_tcp(const struct pstool_args *a) {
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
  if (a->pingpong) {
    int rc = tcp_pingpong(cs, as, a);
    close(cs);
    close(as);
    close(ls);
    free(buf);
    return rc;
  }
  struct tcp_job j = {as, total};
  pthread_t th;
  double t0 = cm_mono_s();
  pthread_create(&th, NULL, tcp_reader, &j);
  for (uint64_t sent = 0; sent < total;) {
    size_t k = total - sent < len ? total - sent : len;
    ssize_t w = write(cs, buf, k);
    if (w <= 0)
      break;
    sent += w;
  }
  pthread_join(th, NULL);
  double t1 = cm_mono_s();
  printf("tcp bytes=%llu MBps=%.0f\n", (unsigned long long)a->bytes,
         total / 1e6 / (t1 - t0));
  close(cs);
  close(as);
  close(ls);
  free(buf);
  return 0;
}
