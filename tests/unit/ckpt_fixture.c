/* The checkpoint suites' shared fixture (ckpt_fixture.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* mkdtemp */
#endif

#include "ckpt_fixture.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "safetensors.h"

char root[64];
struct cm_optim_set momentum;
/* What the helpers below were told when they failed (in their assertion). */
static char err[4096];

/* A set giving every variable type t with lr. */
void set_of(struct cm_optim_set *set, enum cm_optim_type t, double lr) {
  memset(set, 0, sizeof *set);
  cm_optim_defaults(&set->def);
  set->def.type = t;
  set->def.lr = lr;
}

/* Adds rule pattern -> type t to set. */
void add_rule(struct cm_optim_set *set, const char *pattern,
              enum cm_optim_type t) {
  struct cm_optim_rule *r = &set->rules[set->nrules++];
  snprintf(r->pattern, sizeof r->pattern, "%s", pattern);
  r->opt = set->def;
  r->opt.type = t;
}

static void rm_rf(const char *p) {
  char cmd[256];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", p);
  ck_assert_int_eq(system(cmd), 0);
}

void ckf_setup(void) {
  set_of(&momentum, CM_OPT_MOMENTUM, 0.1);
  snprintf(root, sizeof root, "/tmp/test-ckpt-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(root));
}

void ckf_teardown(void) { rm_rf(root); }

TCase *ckf_tcase(void) {
  TCase *tc = tcase_create("disk");
  tcase_add_checked_fixture(tc, ckf_setup, ckf_teardown);
  tcase_set_timeout(tc, 60);
  return tc;
}

struct psd_ckpt *open_ckpt(const char *job, int shard, int nshards,
                           const struct cm_optim_set *opt, int keep) {
  struct psd_ckpt *c = NULL;
  struct psd_ckpt_opts o = {root, job, shard, nshards, "sync", opt, keep};
  ck_assert_msg(psd_ckpt_new(&c, &o, err, sizeof err) == 0, "%s", err);
  return c;
}

/* Shard `shard` of 2 with: "w" (5, 3) split (rows [0,3) or [3,5)), "b" (4)
 * placed on shard 1, "one" (1, 2) split (its row on shard 0 only). Values
 * and slots are a function of (tag, variable, slot, element); versions
 * 10+i, optimizer steps 20+i. */
struct psd_store *make_store(int shard, const struct cm_optim_set *opt,
                             float tag) {
  struct psd_store *s = NULL;
  static const int64_t w[2] = {5, 3}, b[1] = {4}, one[2] = {1, 2};
  const char *names[3] = {"w", "b", "one"};
  const int64_t *shapes[3] = {w, b, one};
  int ndims[3] = {2, 1, 2}, place[3] = {-1, 1, -1};

  ck_assert_int_eq(psd_store_new(&s, shard, 2, opt), 0);
  for (int i = 0; i < 3; i++) {
    struct psd_var *v;
    int created;
    ck_assert_int_eq(psd_store_declare(s, names[i], ndims[i], shapes[i],
                                       place[i], PSD_INIT_UNIFORM, 0.5f, 7,
                                       NULL, &v, &created, err, sizeof err),
                     0);
    for (uint64_t e = 0; e < v->elem_end - v->elem_begin; e++) {
      v->value[e] = tag + 100.0f * i + (float)(e + v->elem_begin);
      for (int k = 0; k < v->nslots; k++)
        v->slots[k][e] = -tag - 0.5f * (float)e - 1000.0f * k;
    }
    v->version = 10 + (uint64_t)i;
    v->applied = (20 + (uint64_t)i) * (v->elem_end - v->elem_begin);
  }
  return s;
}

/* Asserts that b holds exactly a's variables. */
void same_store(struct psd_store *a, struct psd_store *b) {
  ck_assert_int_eq(psd_store_count(a), psd_store_count(b));
  for (int i = 0; i < psd_store_count(a); i++) {
    struct psd_var *x = psd_store_at(a, i), *y = psd_store_at(b, i);
    uint64_t n = x->elem_end - x->elem_begin;
    ck_assert_str_eq(x->name, y->name);
    ck_assert_int_eq(x->ndim, y->ndim);
    for (int d = 0; d < x->ndim; d++)
      ck_assert_int_eq(x->shape[d], y->shape[d]);
    ck_assert_int_eq(x->placement, y->placement);
    ck_assert_int_eq(x->row_begin, y->row_begin);
    ck_assert_int_eq(x->row_end, y->row_end);
    ck_assert_int_eq(x->index, y->index);
    ck_assert_uint_eq(x->version, y->version);
    ck_assert_uint_eq(psd_var_steps(x), psd_var_steps(y));
    ck_assert_int_eq(memcmp(x->value, y->value, n * sizeof(float)), 0);
    ck_assert_int_eq(x->opt.type, y->opt.type);
    ck_assert_int_eq(x->nslots, y->nslots);
    for (int k = 0; k < x->nslots; k++)
      ck_assert_int_eq(memcmp(x->slots[k], y->slots[k], n * sizeof(float)), 0);
  }
}

void write_ok(struct psd_ckpt *c, struct psd_store *s, uint64_t step) {
  struct psd_ckpt_result r;
  ck_assert_msg(psd_ckpt_write(c, s, NULL, step, 1, &r, err, sizeof err) == 0,
                "%s", err);
  ck_assert_uint_eq(r.step, step);
}

/* Loads and returns the store (caller frees), asserting the step. */
struct psd_store *load_step(struct psd_ckpt *c, uint64_t step, int refused) {
  struct psd_store *s = NULL;
  struct psd_ckpt_result r;
  ck_assert_msg(psd_ckpt_load(c, &s, NULL, &r, err, sizeof err) == 0, "%s",
                err);
  ck_assert_ptr_nonnull(s);
  ck_assert_uint_eq(r.step, step);
  ck_assert_int_eq(r.refused, refused);
  return s;
}

void ckpt_file(struct psd_ckpt *c, uint64_t step, const char *name, char *buf,
               size_t len) {
  snprintf(buf, len, "%s/ckpt-%010llu/%s", psd_ckpt_dir(c),
           (unsigned long long)step, name);
}

long file_size(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 ? (long)st.st_size : -1;
}

/* Rewrites checkpoint step's manifest with edit applied, and a new
 * checksum (as a writer would have written it). */
void rewrite_manifest(struct psd_ckpt *c, uint64_t step,
                      void (*edit)(json_t *m)) {
  char p[1400], *text;
  json_t *m;
  uint32_t crc;

  ckpt_file(c, step, "manifest.json", p, sizeof p);
  ck_assert_ptr_nonnull(m = json_load_file(p, 0, NULL));
  json_object_del(m, "checksum");
  edit(m);
  text = json_dumps(m, JSON_COMPACT | JSON_SORT_KEYS);
  crc = cm_st_crc32(0, text, strlen(text));
  free(text);
  json_object_set_new(m, "checksum", json_integer(crc));
  ck_assert_int_eq(json_dump_file(m, p, JSON_INDENT(1)), 0);
  json_decref(m);
}
