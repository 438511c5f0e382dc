/* pstool's exactly-once checks (pstool.h; tests/integration/test_faults.py):
 * count pushes one variable K times with libpsclient, which retries through
 * faults, and load does so from many client threads at once for a while;
 * both then pull and check that every element moved by exactly its pushes
 * (job.optimizer sgd, a gradient of 2^-10, so every sum is exact). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "psclient.h"
#include "pstool.h"

/* The gradient count and load push: 2^-10, so that with an sgd learning
 * rate of a power of two every update and every sum of them is exact. */
#define COUNT_GRAD (1.0f / 1024)

/* One variable of n floats split across the shards, with the start values
 * (pulled), for count and load. */
struct counted {
  struct psc__var v; /* declared */
  float *value;      /* pull destination */
  float *grad;       /* COUNT_GRAD everywhere */
  float *start;      /* values before the first push */
  char name[64];     /* v.name */
  uint64_t n;        /* elements */
  uint64_t pushes;   /* logical pushes that succeeded */
  uint64_t pulls;    /* pulls that succeeded */
};

/* Declares and pulls c's variable; returns 0 or prints why and returns 1. */
static int counted_open(struct psc__client *cl, struct counted *c,
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
  c->v = (struct psc__var){
      .name = c->name,
      .ndim = 2,
      .shape = {(int64_t)(c->n % 256 == 0 ? c->n / 256 : c->n),
                c->n % 256 == 0 ? 256 : 1},
      .placement = PSC__PLACE_SPLIT,
      .init = PSC__INIT_ZEROS,
      .value = c->value,
      .grad = c->grad};
  if (psc__client_declare(cl, &c->v, 1) || psc__client_pull(cl)) {
    fprintf(stderr, "pstool: %s: %s\n", name, psc__client_error(cl));
    return 1;
  }
  memcpy(c->start, c->value, c->n * sizeof(float));
  return 0;
}

/* Pulls c's variable and counts the elements that are not exactly their
 * start minus pushes x lr x COUNT_GRAD (f32, as psd's sgd computes it);
 * returns that count, or -1 when the pull failed. */
static int64_t counted_check(struct psc__client *cl, struct counted *c,
                             float lr) {
  int64_t bad = 0;
  if (psc__client_pull(cl)) {
    fprintf(stderr, "pstool: final pull of %s: %s\n", c->name,
            psc__client_error(cl));
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

int pstool_count(struct cm_spec *spec, const struct pstool_args *a) {
  struct psc__client_opts o = {
      .worker = "pstool", .timeout_ms = a->timeout, .chunk_bytes = a->chunk};
  struct psc__client *cl = NULL;
  struct psc__client_stats st;
  struct counted c;
  char name[64];
  int rc = 1;

  memset(&c, 0, sizeof c);
  if (need_sgd(spec, "count"))
    return 2;
  snprintf(name, sizeof name, "count/%d", a->worker);
  if (psc__client_new(&cl, spec, &o)) {
    fprintf(stderr, "pstool: no client\n");
    goto out;
  }
  if (counted_open(cl, &c, name, a->bytes ? a->bytes : 4096))
    goto out;
  for (int r = 0; r < a->rounds; r++) {
    if (psc__client_push(cl)) {
      fprintf(stderr, "pstool: push %d: %s\n", r + 1, psc__client_error(cl));
      goto out;
    }
    c.pushes++;
    if ((r + 1) % 25 == 0) {
      printf("count pushes=%d\n", r + 1);
      fflush(stdout);
    }
  }
  int64_t bad = counted_check(cl, &c, (float)spec->job.optim.def.lr);
  psc__client_stats(cl, &st);
  printf("count pushes=%llu elements=%llu value0=%.9g mismatches=%lld "
         "calls=%llu failed_calls=%llu retries=%llu outages=%llu "
         "client_id=%016llx\n",
         (unsigned long long)c.pushes, (unsigned long long)c.n, c.value[0],
         (long long)bad, (unsigned long long)st.calls,
         (unsigned long long)st.failed, (unsigned long long)st.retries,
         (unsigned long long)st.outages,
         (unsigned long long)psc__client_id(cl));
  rc = bad == 0 ? 0 : 1;
out:
  psc__client_free(cl);
  counted_free(&c);
  return rc;
}

/* One load client: its own libpsclient client and variable, and its rows of
 * the spec's first table when it names one. */
struct loader {
  struct psc__client *cl; /* owned */
  struct counted c;       /* its variable */
  struct rowload rl;      /* its table rows, when has_rows */
  int has_rows;           /* the spec names a table: rounds load it too */
  double until;           /* cm_mono_s() at which it stops */
  int64_t bad;            /* elements wrong at the end, -1: final pull failed */
  int failed;             /* a push or pull failed */
  _Atomic uint64_t done;  /* calls so far, for the progress line */
};

static void *load_thread(void *arg) {
  struct loader *l = arg;
  while (cm_mono_s() < l->until) {
    if (psc__client_push(l->cl)) {
      fprintf(stderr, "pstool: %s push: %s\n", l->c.name,
              psc__client_error(l->cl));
      l->failed = 1;
      break;
    }
    l->c.pushes++;
    if (psc__client_pull(l->cl)) {
      fprintf(stderr, "pstool: %s pull: %s\n", l->c.name,
              psc__client_error(l->cl));
      l->failed = 1;
      break;
    }
    l->c.pulls++;
    atomic_fetch_add(&l->done, 2);
    if (l->has_rows) {
      if (pstool_rowload_round(&l->rl, l->cl)) {
        l->failed = 1;
        break;
      }
      atomic_fetch_add(&l->done, 2);
    }
  }
  return NULL;
}

int pstool_load(struct cm_spec *spec, const struct pstool_args *a) {
  int n = a->clients > 0 ? a->clients : 16;
  struct loader *l = calloc(n, sizeof *l);
  pthread_t *th = calloc(n, sizeof *th);
  int started = 0, rc = 1;
  char name[64], who[32];
  const char *why = NULL;
  int rows = pstool_rowload_usable(spec, &why);

  if (need_sgd(spec, "load") || rows < 0) {
    if (rows < 0)
      fprintf(stderr, "pstool load: cannot check the spec's table: %s\n", why);
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
    struct psc__client_opts o = {.worker = who, .timeout_ms = a->timeout};
    snprintf(name, sizeof name, "load/%d", i);
    if (psc__client_new(&l[i].cl, spec, &o)) {
      fprintf(stderr, "pstool: no client\n");
      goto out;
    }
    if (counted_open(l[i].cl, &l[i].c, name, a->bytes ? a->bytes : 65536))
      goto out;
    l[i].has_rows = rows;
    if (rows && pstool_rowload_open(&l[i].rl, l[i].cl, spec, i))
      goto out;
  }
  double t0 = cm_mono_s(), until = t0 + (a->seconds > 0 ? a->seconds : 10);
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
  for (int t = 1; cm_mono_s() < until; t++) {
    double wake = t0 + t;
    while (cm_mono_s() < wake && cm_mono_s() < until) {
      struct timespec ts = {0, 50 * 1000000L};
      nanosleep(&ts, NULL);
    }
    uint64_t done = 0;
    for (int i = 0; i < started; i++)
      done += atomic_load(&l[i].done);
    printf("load t=%.1f calls_done=%llu\n", cm_mono_s() - t0,
           (unsigned long long)done);
    fflush(stdout);
  }
  for (int i = 0; i < started; i++)
    pthread_join(th[i], NULL);
  double t1 = cm_mono_s();
  uint64_t pushes = 0, pulls = 0, calls = 0, failed = 0, retries = 0;
  uint64_t row_pushes = 0, row_pulls = 0;
  int64_t bad = 0, row_bad = 0;
  int broken = started < n;
  for (int i = 0; i < started; i++) {
    struct psc__client_stats st;
    int64_t b = counted_check(l[i].cl, &l[i].c, (float)spec->job.optim.def.lr);
    int64_t rb = rows ? pstool_rowload_check(&l[i].rl, l[i].cl) : 0;
    psc__client_stats(l[i].cl, &st);
    pushes += l[i].c.pushes;
    pulls += l[i].c.pulls;
    row_pushes += l[i].rl.pushes;
    row_pulls += l[i].rl.pulls;
    calls += st.calls;
    failed += st.failed;
    retries += st.retries;
    broken |= l[i].failed || b < 0 || rb < 0;
    bad += b > 0 ? b : 0;
    row_bad += rb > 0 ? rb : 0;
  }
  printf("load clients=%d seconds=%.1f pushes=%llu pulls=%llu "
         "row_pushes=%llu row_pulls=%llu calls=%llu failed_calls=%llu "
         "retries=%llu mismatches=%lld row_mismatches=%lld "
         "calls_per_s=%.0f\n",
         n, t1 - t0, (unsigned long long)pushes, (unsigned long long)pulls,
         (unsigned long long)row_pushes, (unsigned long long)row_pulls,
         (unsigned long long)calls, (unsigned long long)failed,
         (unsigned long long)retries, (long long)bad, (long long)row_bad,
         calls / (t1 - t0));
  rc =
      !broken && bad == 0 && row_bad == 0 && (failed == 0 || a->faults) ? 0 : 1;
out:
  for (int i = 0; l && i < n; i++) {
    psc__client_free(l[i].cl);
    counted_free(&l[i].c);
    if (l[i].has_rows)
      pstool_rowload_free(&l[i].rl);
  }
  free(l);
  free(th);
  return rc;
}
