/* The table part of pstool load (pstool.h; tests/integration/test_faults.py,
 * make soak): when the spec names a table (job.tables[0], sgd), each load
 * client also pushes and pulls rows of it every round, so that the shards'
 * sparse calls, admission and eviction run under the load and its restarts.
 *
 * Each client has ids of its own, in two kinds:
 * - hot ids (ROWLOAD_HOT of them), pushed every round after a warm-up that
 *   takes them past the table's admission count and eviction min_count
 *   before the load (and any checkpoint, hence eviction) begins, so they are
 *   never evicted: each pull must then show exactly the pushes applied so
 *   far (start minus applied x lr x 2^-10, f32 as psd's sgd computes it),
 *   and so must the final pull. Nothing lost, nothing applied twice.
 * - cold ids, a pool of ROWLOAD_COLD: round k pushes pool[k] and pool[k-1],
 *   so each is pushed in two rounds running, then left alone until the pool
 *   comes round again: a count-2 admission stores it on the second push, and
 *   an eviction by min_count 3 removes it at the next checkpoint (the pool
 *   bounds the rows and pending ids, so memory stays flat). Their pulls are
 *   not checked: what they hold depends on when checkpoints fell. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "psclient.h"
#include "pstool.h"

/* The gradient every push carries: 2^-10, so that with an sgd learning rate
 * of a power of two every update and every sum of them is exact. */
#define ROWLOAD_GRAD (1.0f / 1024)

/* Pushes of a hot id that the load client's round would apply: the first
 * admit-1 are only counted by a count admission. */
static uint64_t applied(const struct cm_table_conf *conf, uint64_t pushes) {
  uint64_t a = conf->admit == CM_ADMIT_COUNT ? conf->admit_count : 1;
  return pushes >= a ? pushes - a + 1 : 0;
}

int pstool_rowload_usable(const struct cm_spec *spec, const char **why) {
  const struct cm_table_conf *t = &spec->job.tables[0];
  if (spec->job.ntables == 0)
    return 0;
  if (t->opt.type != CM_ROWOPT_SGD)
    *why = "its first table's optimizer is not sgd";
  else if (t->admit == CM_ADMIT_PROB)
    *why = "its first table admits by probability";
  else if (t->evict_after_steps)
    *why = "its first table evicts by age (a hot row could go)";
  else if (t->dim > 64)
    *why = "its first table's rows are wider than 64";
  else
    return 1;
  return -1;
}

/* Sets the round's ids: the hot ones, then the two cold ones. */
static void round_ids(struct rowload *r) {
  uint64_t k = r->rounds;
  r->ids[ROWLOAD_HOT] = r->cold_base + k % ROWLOAD_COLD;
  r->ids[ROWLOAD_HOT + 1] =
      r->cold_base + (k + ROWLOAD_COLD - 1) % ROWLOAD_COLD;
}

/* Pulls the round's rows; 0, or 1 with the error printed. */
static int pull(struct rowload *r, struct psc__client *cl, size_t n) {
  struct psc__rows q = {r->conf->name, r->ids, n, r->rows, NULL};
  if (psc__client_pull_rows(cl, &q, 1)) {
    fprintf(stderr, "pstool: %s pull of table %s: %s\n", r->who, r->conf->name,
            psc__client_error(cl));
    return 1;
  }
  r->pulls++;
  return 0;
}

/* Pushes ROWLOAD_GRAD to ids[0..n); 0, or 1 with the error printed. */
static int push(struct rowload *r, struct psc__client *cl, size_t n) {
  struct psc__rows q = {r->conf->name, r->ids, n, NULL, r->grad};
  if (psc__client_push_rows(cl, &q, 1)) {
    fprintf(stderr, "pstool: %s push to table %s: %s\n", r->who, r->conf->name,
            psc__client_error(cl));
    return 1;
  }
  r->pushes++;
  uint64_t before = applied(r->conf, r->hot_pushes++);
  if (applied(r->conf, r->hot_pushes) > before)
    for (size_t i = 0; i < ROWLOAD_HOT * (size_t)r->conf->dim; i++)
      r->want[i] -= (float)r->conf->opt.lr * ROWLOAD_GRAD;
  return 0;
}

/* Compares the hot rows pulled with what was pushed; returns the elements
 * that differ (the first few printed). */
static int64_t compare(struct rowload *r, const char *when) {
  int64_t bad = 0;
  for (size_t i = 0; i < ROWLOAD_HOT * (size_t)r->conf->dim; i++) {
    if (r->rows[i] == r->want[i])
      continue;
    if (bad++ < 3)
      fprintf(stderr,
              "%s: table %s id %" PRIu64 " element %u %s: %.9g, want %.9g "
              "(%" PRIu64 " pushes)\n",
              r->who, r->conf->name, r->ids[i / r->conf->dim],
              (unsigned)(i % r->conf->dim), when, r->rows[i], r->want[i],
              r->hot_pushes);
  }
  return bad;
}

int pstool_rowload_open(struct rowload *r, struct psc__client *cl,
                        const struct cm_spec *spec, int client) {
  memset(r, 0, sizeof *r);
  r->conf = &spec->job.tables[0];
  uint32_t dim = r->conf->dim;
  snprintf(r->who, sizeof r->who, "load:%d", client);
  r->rows = calloc((ROWLOAD_HOT + 2) * (size_t)dim, sizeof *r->rows);
  r->grad = malloc((ROWLOAD_HOT + 2) * (size_t)dim * sizeof *r->grad);
  r->want = malloc(ROWLOAD_HOT * (size_t)dim * sizeof *r->want);
  if (!r->rows || !r->grad || !r->want) {
    fprintf(stderr, "pstool: out of memory\n");
    return 1;
  }
  for (size_t i = 0; i < (ROWLOAD_HOT + 2) * (size_t)dim; i++)
    r->grad[i] = ROWLOAD_GRAD;
  /* Ids of this client alone, spread over the shards by their hash. */
  uint64_t base = (uint64_t)(client + 1) << 40;
  for (int k = 0; k < ROWLOAD_HOT; k++)
    r->ids[k] = base + (uint64_t)k;
  r->cold_base = base + (1u << 20);
  struct psc__table t = {r->conf->name, dim, r->conf->id_bound};
  if (psc__client_declare_tables(cl, &t, 1)) {
    fprintf(stderr, "pstool: %s: table %s: %s\n", r->who, t.name,
            psc__client_error(cl));
    return 1;
  }
  /* The start: a pull of ids never pushed answers their initial rows. */
  if (pull(r, cl, ROWLOAD_HOT))
    return 1;
  memcpy(r->want, r->rows, ROWLOAD_HOT * (size_t)dim * sizeof *r->want);
  /* Warm-up, before any checkpoint: past admission, and pushed at least
   * min_count times however a row's count is kept. */
  uint32_t warm =
      (r->conf->admit == CM_ADMIT_COUNT ? r->conf->admit_count : 1) +
      r->conf->evict_min_count;
  for (uint32_t w = 0; w < warm; w++)
    if (push(r, cl, ROWLOAD_HOT))
      return 1;
  if (pull(r, cl, ROWLOAD_HOT))
    return 1;
  r->bad += compare(r, "after the warm-up");
  return 0;
}

int pstool_rowload_round(struct rowload *r, struct psc__client *cl) {
  round_ids(r);
  if (push(r, cl, ROWLOAD_HOT + 2) || pull(r, cl, ROWLOAD_HOT + 2))
    return 1;
  r->bad += compare(r, "pulled");
  r->rounds++;
  return 0;
}

int64_t pstool_rowload_check(struct rowload *r, struct psc__client *cl) {
  if (pull(r, cl, ROWLOAD_HOT))
    return -1;
  return r->bad + compare(r, "at the end");
}

void pstool_rowload_free(struct rowload *r) {
  free(r->rows);
  free(r->grad);
  free(r->want);
}
