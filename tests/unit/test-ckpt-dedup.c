/* Unit tests for the table of applied pushes in a checkpoint (async;
 * ps-server/psd/ckpt/ckpt_write.c and ckpt_verify.c with dedup.h): it
 * round-trips, a manifest without one loads with an empty table, a damaged
 * or malformed one refuses the checkpoint naming the file and the field;
 * written while pushes go on, the table saved names exactly the pushes the
 * values saved hold. */
#include <check.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt.h"
#include "ckpt_fixture.h"
#include "dedup.h"
#include "err.h"
#include "store.h"
#include "unit.h"

static char err[4096];

/* Loads into *s and *d with the log (stderr) captured into log. */
static int load_logged(struct psd_ckpt *c, struct psd_store **s,
                       struct psd_dedup **d, struct psd_ckpt_result *r,
                       char *log, size_t loglen) {
  char path[128];
  int fd, saved, rc;
  ssize_t n;

  snprintf(path, sizeof path, "%s/log", root);
  ck_assert_int_ge(fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644), 0);
  fflush(stderr);
  saved = dup(2);
  dup2(fd, 2);
  rc = psd_ckpt_load(c, s, d, r, err, sizeof err);
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  n = pread(fd, log, loglen - 1, 0);
  log[n > 0 ? n : 0] = 0;
  close(fd);
  return rc;
}

/* A table: client 0x5eed at seq 3 with chunks 0, 64 and 3000 applied,
 * client 7 at seq 9 with chunk 1. */
static struct psd_dedup *make_table(void) {
  struct psd_dedup *d;
  ck_assert_int_eq(psd_dedup_new(&d, 16), 0);
  ck_assert_int_eq(psd_dedup_claim(d, 0x5eed, 3, 0), 0);
  ck_assert_int_eq(psd_dedup_claim(d, 0x5eed, 3, 64), 0);
  ck_assert_int_eq(psd_dedup_claim(d, 0x5eed, 3, 3000), 0);
  ck_assert_int_eq(psd_dedup_claim(d, 7, 9, 1), 0);
  return d;
}

/* Asserts that d answers as make_table's does. */
static void same_answers(struct psd_dedup *d) {
  ck_assert_int_eq(psd_dedup_claim(d, 0x5eed, 3, 0), 1);
  ck_assert_int_eq(psd_dedup_claim(d, 0x5eed, 3, 64), 1);
  ck_assert_int_eq(psd_dedup_claim(d, 0x5eed, 3, 3000), 1);
  ck_assert_int_eq(psd_dedup_claim(d, 0x5eed, 2, 5), 1);
  ck_assert_int_eq(psd_dedup_claim(d, 0x5eed, 3, 1), 0);
  ck_assert_int_eq(psd_dedup_claim(d, 7, 9, 1), 1);
  ck_assert_int_eq(psd_dedup_claim(d, 7, 10, 1), 0);
  ck_assert_int_eq(psd_dedup_claim(d, 8, 1, 0), 0);
}

START_TEST(test_dedup_roundtrip) {
  struct psd_ckpt *c = open_ckpt("job", 0, 2, &momentum, 3);
  struct psd_store *s = make_store(0, &momentum, 1), *t = NULL;
  struct psd_dedup *d = make_table(), *back = NULL;
  struct psd_ckpt_result r;
  char p[1400];
  json_t *m;

  ck_assert_msg(psd_ckpt_write(c, s, d, 6, 1, &r, err, sizeof err) == 0, "%s",
                err);
  ck_assert_int_eq(r.clients, 2);
  ck_assert_int_eq(r.nvars, 3);
  /* In the manifest, as dedup.h describes it. */
  ckpt_file(c, 6, "manifest.json", p, sizeof p);
  ck_assert_ptr_nonnull(m = json_load_file(p, 0, NULL));
  ck_assert_int_eq(json_array_size(json_object_get(m, "dedup")), 2);
  ck_assert_str_eq(
      json_string_value(json_object_get(
          json_array_get(json_object_get(m, "dedup"), 0), "client")),
      "0000000000005eed");
  json_decref(m);
  ck_assert_msg(psd_ckpt_load(c, &t, &back, &r, err, sizeof err) == 0, "%s",
                err);
  ck_assert_ptr_nonnull(back);
  ck_assert_int_eq(r.clients, 2);
  same_store(s, t);
  same_answers(back);
  /* Without a table (sync): none in the manifest, an empty one loaded. */
  psd_dedup_free(back);
  psd_store_free(t);
  write_ok(c, s, 7);
  ck_assert_msg(psd_ckpt_load(c, &t, &back, &r, err, sizeof err) == 0, "%s",
                err);
  ck_assert_uint_eq(r.step, 7);
  ck_assert_int_eq(r.clients, -1);
  ck_assert_ptr_nonnull(back);
  ck_assert_int_eq(psd_dedup_claim(back, 0x5eed, 3, 0), 0);
  psd_dedup_free(back);
  psd_store_free(t);
  psd_dedup_free(d);
  psd_store_free(s);
  psd_ckpt_free(c);
}
END_TEST

static void drop_dedup(json_t *m) { json_object_del(m, "dedup"); }

/* A manifest as psd wrote it before it saved the table loads, with an
 * empty table. */
START_TEST(test_manifest_without_dedup_loads) {
  struct psd_ckpt *c = open_ckpt("job", 0, 2, &momentum, 3);
  struct psd_store *s = make_store(0, &momentum, 1), *t = NULL;
  struct psd_dedup *d = make_table(), *back = NULL;
  struct psd_ckpt_result r;

  ck_assert_int_eq(psd_ckpt_write(c, s, d, 6, 1, &r, err, sizeof err), 0);
  rewrite_manifest(c, 6, drop_dedup);
  ck_assert_msg(psd_ckpt_load(c, &t, &back, &r, err, sizeof err) == 0, "%s",
                err);
  ck_assert_uint_eq(r.step, 6);
  ck_assert_int_eq(r.refused, 0);
  ck_assert_int_eq(r.clients, -1);
  same_store(s, t);
  struct psd_dedup_stats st;
  psd_dedup_stats(back, &st);
  ck_assert_uint_eq(st.clients, 0);
  psd_dedup_free(back);
  psd_store_free(t);
  psd_dedup_free(d);
  psd_store_free(s);
  psd_ckpt_free(c);
}
END_TEST

static void bad_client(json_t *m) {
  json_t *e = json_array_get(json_object_get(m, "dedup"), 1);
  json_object_set_new(e, "client", json_string("00000000000007zz"));
}

static void bad_chunks(json_t *m) {
  json_t *e = json_array_get(json_object_get(m, "dedup"), 0);
  json_object_set_new(e, "chunks", json_integer(1));
}

/* A damaged table fails the checksum, a malformed one (checksum right) is
 * refused naming the file and the field; either way the checkpoint before
 * it loads, with its own table. */
START_TEST(test_corrupt_dedup_is_refused) {
  struct psd_ckpt *c = open_ckpt("job", 0, 2, &momentum, 5);
  struct psd_store *s = make_store(0, &momentum, 1), *t = NULL;
  struct psd_dedup *d = make_table(), *back = NULL;
  struct psd_ckpt_result r;
  char p[1400], want[1500], log[8192], *text;
  FILE *f;
  long n;

  ck_assert_int_eq(psd_ckpt_write(c, s, d, 4, 1, &r, err, sizeof err), 0);
  ck_assert_int_eq(psd_dedup_claim(d, 7, 10, 0), 0);
  ck_assert_int_eq(psd_ckpt_write(c, s, d, 5, 1, &r, err, sizeof err), 0);
  /* One changed hex digit of a chunk word: fails the checksum. */
  ckpt_file(c, 5, "manifest.json", p, sizeof p);
  f = fopen(p, "r+b");
  n = file_size(p);
  text = calloc(1, n + 1);
  ck_assert_int_eq(fread(text, 1, n, f), n);
  char *at = strstr(text, "\"000000000000000");
  ck_assert_ptr_nonnull(at);
  fseek(f, at - text + 2, SEEK_SET);
  fputc('8', f);
  fclose(f);
  free(text);
  ck_assert_int_eq(load_logged(c, &t, &back, &r, log, sizeof log), 0);
  ck_assert_uint_eq(r.step, 4);
  ck_assert_int_eq(r.refused, 1);
  ck_assert_msg(strstr(log, "fails its checksum"), "%s", log);
  same_answers(back); /* step 4's table: client 7 at seq 9 */
  psd_dedup_free(back);
  psd_store_free(t);
  /* Malformed, with a right checksum: a client that is not hex. */
  ck_assert_int_eq(psd_ckpt_write(c, s, d, 5, 1, &r, err, sizeof err), 0);
  rewrite_manifest(c, 5, bad_client);
  ck_assert_int_eq(load_logged(c, &t, &back, &r, log, sizeof log), 0);
  ck_assert_uint_eq(r.step, 4);
  ck_assert_int_eq(r.refused, 1);
  snprintf(want, sizeof want, "%s: dedup[1].client", p);
  ck_assert_msg(strstr(log, want), "'%s' lacks '%s'", log, want);
  psd_dedup_free(back);
  psd_store_free(t);
  /* chunks not an array; and with no checkpoint to fall back on, none
   * verifies. */
  ck_assert_int_eq(psd_ckpt_write(c, s, d, 5, 1, &r, err, sizeof err), 0);
  rewrite_manifest(c, 5, bad_chunks);
  rewrite_manifest(c, 4, bad_chunks);
  t = (struct psd_store *)1;
  ck_assert_int_eq(load_logged(c, &t, &back, &r, log, sizeof log), CM_EFORMAT);
  ck_assert_ptr_null(t);
  ck_assert_ptr_null(back);
  ck_assert_msg(strstr(log, "dedup[0].chunks"), "%s", log);
  psd_dedup_free(d);
  psd_store_free(s);
  psd_ckpt_free(c);
}
END_TEST

/* A pusher as async on_push is: gate, claim, apply, gate. Client k + 1
 * pushes seq 1, 2, ... MAX_PUSHES; each adds 1 to element k (a float counts
 * exactly to 2^24). */
#define MAX_PUSHES (1u << 22)
struct pusher {
  struct psd_dedup *d;    /* the shard's table */
  struct psd_var *v;      /* the variable pushed to */
  int k;                  /* its element, and client k + 1 */
  atomic_int *stop;       /* set when the test is done */
  atomic_uint_fast64_t n; /* pushes applied */
};

static void *push_loop(void *arg) {
  struct pusher *p = arg;
  for (uint64_t seq = 1; seq <= MAX_PUSHES && !atomic_load(p->stop); seq++) {
    psd_dedup_apply_begin(p->d);
    int rc = psd_dedup_claim(p->d, (uint64_t)p->k + 1, seq, 0);
    pthread_mutex_lock(&p->v->lock);
    p->v->value[p->k] += rc == 0 ? 1.0f : 1000.0f; /* a claim must be new */
    p->v->version++;
    pthread_mutex_unlock(&p->v->lock);
    psd_dedup_apply_end(p->d);
    atomic_fetch_add(&p->n, 1);
  }
  return NULL;
}

/* Checkpoints written while pushes go on: each one's table holds exactly
 * the pushes its values hold (element k == client k + 1's newest seq). */
START_TEST(test_dedup_matches_values_under_pushes) {
  enum { NP = 3, NCKPT = 4 };
  static const int64_t shape[1] = {NP};
  struct cm_optim_set sgd;
  struct psd_ckpt *c;
  struct psd_store *s;
  struct psd_dedup *d;
  struct psd_var *v;
  struct pusher p[NP];
  pthread_t th[NP];
  atomic_int stop = 0;
  int created;

  set_of(&sgd, CM_OPT_SGD, 0.1);
  c = open_ckpt("job", 0, 1, &sgd, 2);
  ck_assert_int_eq(psd_store_new(&s, 0, 1, &sgd), 0);
  ck_assert_int_eq(psd_store_declare(s, "n", 1, shape, -1, PSD_INIT_ZEROS, 0, 0,
                                     NULL, &v, &created, err, sizeof err),
                   0);
  ck_assert_int_eq(psd_dedup_new(&d, 16), 0);
  for (int k = 0; k < NP; k++) {
    p[k] = (struct pusher){.d = d, .v = v, .k = k, .stop = &stop};
    ck_assert_int_eq(pthread_create(&th[k], NULL, push_loop, &p[k]), 0);
  }
  for (int i = 0; i < NCKPT; i++) {
    struct psd_ckpt_result r;
    struct psd_store *t = NULL;
    struct psd_dedup *back = NULL;
    uint64_t seen[NP];
    /* Let every pusher get further than at the last checkpoint. */
    for (int k = 0; k < NP; k++)
      seen[k] = atomic_load(&p[k].n);
    for (int k = 0; k < NP; k++)
      while (atomic_load(&p[k].n) <= seen[k] && seen[k] < MAX_PUSHES)
        sched_yield();
    ck_assert_msg(
        psd_ckpt_write(c, s, d, 1 + (uint64_t)i, 1, &r, err, sizeof err) == 0,
        "%s", err);
    ck_assert_int_eq(r.clients, NP);
    ck_assert_msg(psd_ckpt_load(c, &t, &back, &r, err, sizeof err) == 0, "%s",
                  err);
    struct psd_var *w = psd_store_at(t, 0);
    uint64_t sum = 0;
    for (int k = 0; k < NP; k++) {
      float x = w->value[k];
      uint64_t seq = (uint64_t)x;
      ck_assert_msg((float)seq == x && seq >= 1, "element %d is %g", k, x);
      sum += seq;
      /* Its newest seq is a duplicate, the next one is new. */
      ck_assert_msg(psd_dedup_claim(back, (uint64_t)k + 1, seq, 0) == 1,
                    "checkpoint %d: client %d's seq %llu is in the values "
                    "but not in the table",
                    i, k + 1, (unsigned long long)seq);
      ck_assert_msg(psd_dedup_claim(back, (uint64_t)k + 1, seq + 1, 0) == 0,
                    "checkpoint %d: client %d's seq %llu is in the table "
                    "but not in the values",
                    i, k + 1, (unsigned long long)seq + 1);
    }
    ck_assert_uint_eq(w->version, sum);
    psd_dedup_free(back);
    psd_store_free(t);
  }
  atomic_store(&stop, 1);
  for (int k = 0; k < NP; k++)
    pthread_join(th[k], NULL);
  psd_dedup_free(d);
  psd_store_free(s);
  psd_ckpt_free(c);
}
END_TEST

static Suite *ckpt_dedup_suite(void) {
  Suite *s = suite_create("ckpt-dedup");
  TCase *tc = ckf_tcase();
  tcase_add_test(tc, test_dedup_roundtrip);
  tcase_add_test(tc, test_manifest_without_dedup_loads);
  tcase_add_test(tc, test_corrupt_dedup_is_refused);
  tcase_add_test(tc, test_dedup_matches_values_under_pushes);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(ckpt_dedup_suite(), 0); }
