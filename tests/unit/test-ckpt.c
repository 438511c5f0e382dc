/* Unit tests for ps-server/psd/ckpt.c: a checkpoint loads back into a store
 * with the same variables, rows, values, slots and versions; the newest one
 * that verifies is taken, and one with a flipped byte, cut short, with a
 * damaged or missing manifest, or from another job or shard is refused for the
 * one before it; no checkpoint gives an empty start, only bad ones an error;
 * pruning keeps exactly `keep`; a crash's .tmp-* is removed; the same step
 * written twice keeps the second; a write that fails (a file where the
 * directory should be, the file size limit mid-write) leaves the previous
 * checkpoint intact and no temporary behind; --resume-step loads the newest
 * at or below it and renames the newer ones. Each variable's optimizer and
 * all its slots round-trip; a checkpoint whose optimizer type differs from
 * the spec's is refused without falling back; format 1 checkpoints (one
 * momentum slot, no step counts) still load. The table of applied pushes
 * (async) round-trips, a manifest without one loads with an empty table, a
 * damaged or malformed one refuses the checkpoint naming the file and the
 * field; written while pushes go on, the table saved names exactly the
 * pushes the values saved hold. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* mkdtemp */
#endif

#include <check.h>
#include <dirent.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt.h"
#include "dedup.h"
#include "err.h"
#include "safetensors.h"
#include "store.h"
#include "unit.h"

static char root[64];
static char err[4096];
/* Every variable with momentum (lr 0.1, momentum 0.9); set up by setup. */
static struct cm_optim_set momentum;

/* A set giving every variable type t with lr. */
static void set_of(struct cm_optim_set *set, enum cm_optim_type t, double lr) {
  memset(set, 0, sizeof *set);
  cm_optim_defaults(&set->def);
  set->def.type = t;
  set->def.lr = lr;
}

/* Adds rule pattern -> type t to set. */
static void add_rule(struct cm_optim_set *set, const char *pattern,
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

static void setup(void) {
  set_of(&momentum, CM_OPT_MOMENTUM, 0.1);
  snprintf(root, sizeof root, "/tmp/test-ckpt-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(root));
}

static void teardown(void) { rm_rf(root); }

static struct psd_ckpt *open_ckpt(const char *job, int shard, int nshards,
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
static struct psd_store *make_store(int shard, const struct cm_optim_set *opt,
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
                                       place[i], PSD_INIT_UNIFORM, 0.5f, 7, &v,
                                       &created, err, sizeof err),
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
static void same_store(struct psd_store *a, struct psd_store *b) {
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

static void write_ok(struct psd_ckpt *c, struct psd_store *s, uint64_t step) {
  struct psd_ckpt_result r;
  ck_assert_msg(psd_ckpt_write(c, s, NULL, step, 1, &r, err, sizeof err) == 0,
                "%s", err);
  ck_assert_uint_eq(r.step, step);
}

/* Loads and returns the store (caller frees), asserting the step. */
static struct psd_store *load_step(struct psd_ckpt *c, uint64_t step,
                                   int refused) {
  struct psd_store *s = NULL;
  struct psd_ckpt_result r;
  ck_assert_msg(psd_ckpt_load(c, &s, NULL, &r, err, sizeof err) == 0, "%s",
                err);
  ck_assert_ptr_nonnull(s);
  ck_assert_uint_eq(r.step, step);
  ck_assert_int_eq(r.refused, refused);
  return s;
}

static void ckpt_file(struct psd_ckpt *c, uint64_t step, const char *name,
                      char *buf, size_t len) {
  snprintf(buf, len, "%s/ckpt-%010llu/%s", psd_ckpt_dir(c),
           (unsigned long long)step, name);
}

static long file_size(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 ? (long)st.st_size : -1;
}

/* Flips one byte of the file at offset off (negative: from the end). */
static void flip(const char *p, long off) {
  FILE *f = fopen(p, "r+b");
  ck_assert_ptr_nonnull(f);
  fseek(f, off, off < 0 ? SEEK_END : SEEK_SET);
  int ch = fgetc(f);
  fseek(f, -1, SEEK_CUR);
  fputc(ch ^ 0x10, f);
  fclose(f);
}

/* Entries of the shard directory whose name starts with prefix. */
static int count_entries(struct psd_ckpt *c, const char *prefix) {
  DIR *d = opendir(psd_ckpt_dir(c));
  struct dirent *e;
  int n = 0;
  while ((e = readdir(d)))
    n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
  closedir(d);
  return n;
}

START_TEST(test_roundtrip) {
  for (int shard = 0; shard < 2; shard++) {
    struct psd_ckpt *c = open_ckpt("job", shard, 2, &momentum, 3);
    struct psd_store *s = make_store(shard, &momentum, 1), *t;
    struct psd_ckpt_result r;
    char p[1400], q[1400], want[1200];

    ck_assert_int_eq(psd_ckpt_write(c, s, NULL, 42, 1, &r, err, sizeof err), 0);
    snprintf(want, sizeof want, "%s/job/ps-%d/ckpt-0000000042", root, shard);
    ck_assert_str_eq(r.path, want);
    ck_assert_int_eq(r.nvars, 3);
    ckpt_file(c, 42, "shard.safetensors", p, sizeof p);
    ckpt_file(c, 42, "manifest.json", q, sizeof q);
    ck_assert_uint_eq(r.bytes, (uint64_t)(file_size(p) + file_size(q)));
    t = load_step(c, 42, 0);
    same_store(s, t);
    psd_store_free(t);
    psd_store_free(s);
    psd_ckpt_free(c);
  }
}
END_TEST

/* Sync rollback: a store reloaded in place from its checkpoint of one step
 * holds exactly what was written then (values, slots, versions, optimizer
 * steps); the newer checkpoint is set aside; a step without a checkpoint is
 * CM_ENOENT and changes nothing. */
START_TEST(test_restore_in_place) {
  struct psd_ckpt *c = open_ckpt("job", 0, 2, &momentum, 3);
  struct psd_store *s100 = make_store(0, &momentum, 1);
  struct psd_store *live = make_store(0, &momentum, 2);
  struct psd_store *s150 = make_store(0, &momentum, 2);
  struct psd_ckpt_result r;
  uint64_t steps[8];

  write_ok(c, s100, 100);
  write_ok(c, s150, 150);
  /* Moved on past 150: other values, versions and step counts. */
  for (int i = 0; i < psd_store_count(live); i++) {
    struct psd_var *v = psd_store_at(live, i);
    v->value[0] = 1e6f;
    v->version = 99;
    v->applied = 7;
  }
  ck_assert_int_eq(psd_ckpt_restore(c, 120, live, &r, err, sizeof err),
                   CM_ENOENT);
  ck_assert_msg(strstr(err, "no checkpoint of step 120"), "%s", err);
  ck_assert_float_eq(psd_store_at(live, 0)->value[0], 1e6f);
  ck_assert_msg(psd_ckpt_restore(c, 100, live, &r, err, sizeof err) == 0, "%s",
                err);
  ck_assert_uint_eq(r.step, 100);
  same_store(s100, live);
  ck_assert_int_eq(psd_ckpt_list(c, steps, 8), 1);
  ck_assert_uint_eq(steps[0], 100);
  ck_assert_int_eq(count_entries(c, "superseded-ckpt-"), 1);
  psd_store_free(s100);
  psd_store_free(s150);
  psd_store_free(live);
  psd_ckpt_free(c);
}
END_TEST

START_TEST(test_empty_dir_is_a_fresh_start) {
  struct psd_ckpt *c = open_ckpt("job", 0, 2, &momentum, 3);
  struct psd_store *s = (struct psd_store *)1;
  struct psd_ckpt_result r;
  ck_assert_int_eq(psd_ckpt_load(c, &s, NULL, &r, err, sizeof err), 0);
  ck_assert_ptr_null(s);
  psd_ckpt_free(c);
}
END_TEST

/* Writes steps 1, 2, 3 with different values; returns the ckpt. */
static struct psd_ckpt *three(struct psd_store **s2) {
  struct psd_ckpt *c = open_ckpt("job", 0, 2, &momentum, 5);
  for (int step = 1; step <= 3; step++) {
    struct psd_store *s = make_store(0, &momentum, (float)step);
    write_ok(c, s, step);
    if (step == 2)
      *s2 = s;
    else
      psd_store_free(s);
  }
  return c;
}

START_TEST(test_flipped_byte_falls_back) {
  struct psd_store *s2, *t;
  struct psd_ckpt *c = three(&s2);
  char p[1400];
  ckpt_file(c, 3, "shard.safetensors", p, sizeof p);
  flip(p, -5); /* in the last tensor's data */
  t = load_step(c, 2, 1);
  same_store(s2, t);
  psd_store_free(t);
  /* Now the header of step 2's file: refused too, step 1 loads. */
  ckpt_file(c, 2, "shard.safetensors", p, sizeof p);
  flip(p, 20);
  t = load_step(c, 1, 2);
  psd_store_free(t);
  psd_store_free(s2);
  psd_ckpt_free(c);
}
END_TEST

START_TEST(test_truncated_falls_back) {
  struct psd_store *s2, *t;
  struct psd_ckpt *c = three(&s2);
  char p[1400];
  ckpt_file(c, 3, "shard.safetensors", p, sizeof p);
  ck_assert_int_eq(truncate(p, file_size(p) - 7), 0);
  t = load_step(c, 2, 1);
  same_store(s2, t);
  psd_store_free(t);
  psd_store_free(s2);
  psd_ckpt_free(c);
}
END_TEST

START_TEST(test_bad_manifest_falls_back) {
  struct psd_store *s2, *t;
  struct psd_ckpt *c = three(&s2);
  char p[1400], *text;
  FILE *f;
  long n;

  /* A changed digit in a version: still valid JSON, fails the checksum. */
  ckpt_file(c, 3, "manifest.json", p, sizeof p);
  f = fopen(p, "r+b");
  n = file_size(p);
  text = calloc(1, n + 1);
  ck_assert_int_eq(fread(text, 1, n, f), n);
  char *at = strstr(text, "\"version\": 10");
  ck_assert_ptr_nonnull(at);
  fseek(f, at - text + strlen("\"version\": 1"), SEEK_SET);
  fputc('9', f);
  fclose(f);
  free(text);
  t = load_step(c, 2, 1);
  same_store(s2, t);
  psd_store_free(t);
  /* A missing manifest. */
  ckpt_file(c, 2, "manifest.json", p, sizeof p);
  unlink(p);
  t = load_step(c, 1, 2);
  psd_store_free(t);
  psd_store_free(s2);
  psd_ckpt_free(c);
}
END_TEST

START_TEST(test_none_verifies_is_an_error) {
  struct psd_store *s2, *t = (struct psd_store *)1;
  struct psd_ckpt *c = three(&s2);
  struct psd_ckpt_result r;
  char p[1400];
  for (int step = 1; step <= 3; step++) {
    ckpt_file(c, step, "shard.safetensors", p, sizeof p);
    ck_assert_int_eq(truncate(p, 3), 0);
  }
  ck_assert_int_eq(psd_ckpt_load(c, &t, NULL, &r, err, sizeof err), CM_EFORMAT);
  ck_assert_ptr_null(t);
  ck_assert_ptr_nonnull(strstr(err, "none of the 3 checkpoints"));
  psd_store_free(s2);
  psd_ckpt_free(c);
}
END_TEST

START_TEST(test_other_job_or_shard_is_refused) {
  struct psd_store *s = make_store(0, &momentum, 1), *t = NULL;
  struct psd_ckpt *c = open_ckpt("job", 0, 2, &momentum, 3), *d;
  struct psd_ckpt_result r;
  char from[1400], to[1400];
  write_ok(c, s, 5);
  /* Shard 0's checkpoint moved into shard 1's directory. */
  d = open_ckpt("job", 1, 2, &momentum, 3);
  snprintf(from, sizeof from, "%s/ckpt-0000000005", psd_ckpt_dir(c));
  snprintf(to, sizeof to, "%s/ckpt-0000000005", psd_ckpt_dir(d));
  ck_assert_int_eq(rename(from, to), 0);
  ck_assert_int_eq(psd_ckpt_load(d, &t, NULL, &r, err, sizeof err), CM_EFORMAT);
  ck_assert_ptr_null(t);
  psd_ckpt_free(d);
  /* Another shard count. */
  d = open_ckpt("job", 1, 3, &momentum, 3);
  ck_assert_int_eq(psd_ckpt_load(d, &t, NULL, &r, err, sizeof err), CM_EFORMAT);
  psd_ckpt_free(d);
  psd_store_free(s);
  psd_ckpt_free(c);
}
END_TEST

/* Each variable's own optimizer and all its slots come back, under the
 * tensor names "<name>/<slot>". */
START_TEST(test_per_variable_optimizers_roundtrip) {
  struct cm_optim_set set;
  struct cm_st_file *f = NULL;
  struct psd_store *s, *t;
  struct psd_ckpt *c;
  char p[1400];
  static const char *const tensors[] = {"w",   "w/m",          "w/v",
                                        "one", "one/momentum", NULL};

  set_of(&set, CM_OPT_ADAM, 0.001);
  add_rule(&set, "b", CM_OPT_SGD);
  add_rule(&set, "o*", CM_OPT_MOMENTUM);
  c = open_ckpt("job", 0, 2, &set, 3);
  s = make_store(0, &set, 1);
  ck_assert_int_eq(psd_store_at(s, 0)->nslots, 2);
  ck_assert_int_eq(psd_store_at(s, 1)->nslots, 0);
  ck_assert_int_eq(psd_store_at(s, 2)->nslots, 1);
  write_ok(c, s, 7);
  t = load_step(c, 7, 0);
  same_store(s, t);
  ck_assert_uint_eq(psd_var_steps(psd_store_at(t, 0)), 20);
  ckpt_file(c, 7, "shard.safetensors", p, sizeof p);
  ck_assert_int_eq(cm_st_open(&f, p, err, sizeof err), 0);
  for (int i = 0; tensors[i]; i++)
    ck_assert_msg(cm_st_find(f, tensors[i]), "no tensor %s", tensors[i]);
  ck_assert_ptr_null(cm_st_find(f, "w/momentum"));
  cm_st_close(f);
  psd_store_free(t);
  psd_store_free(s);
  psd_ckpt_free(c);
}
END_TEST

/* Another optimizer type is refused loudly, and no older checkpoint is
 * tried (one of an earlier run could have the spec's type); other
 * hyper-parameters of the same type load. */
START_TEST(test_optimizer_change_is_refused) {
  struct cm_optim_set sgd, momentum2, adam_b;
  struct psd_store *s = make_store(0, &momentum, 1), *old, *t = NULL;
  struct psd_ckpt *c, *d;
  struct psd_ckpt_result r;

  set_of(&sgd, CM_OPT_SGD, 0.1);
  /* Step 3 by an sgd run, step 5 by a momentum run. */
  c = open_ckpt("job", 0, 2, &sgd, 5);
  old = make_store(0, &sgd, 2);
  write_ok(c, old, 3);
  psd_ckpt_free(c);
  c = open_ckpt("job", 0, 2, &momentum, 5);
  write_ok(c, s, 5);
  d = open_ckpt("job", 0, 2, &sgd, 5);
  ck_assert_int_eq(psd_ckpt_load(d, &t, NULL, &r, err, sizeof err), CM_EEXIST);
  ck_assert_ptr_null(t);
  ck_assert_int_eq(r.refused, 1);
  ck_assert_msg(strstr(err, "older checkpoints are not tried"), "%s", err);
  psd_ckpt_free(d);
  /* Only "b" differs (an override): refused too. */
  set_of(&adam_b, CM_OPT_MOMENTUM, 0.1);
  add_rule(&adam_b, "b", CM_OPT_ADAM);
  d = open_ckpt("job", 0, 2, &adam_b, 5);
  ck_assert_int_eq(psd_ckpt_load(d, &t, NULL, &r, err, sizeof err), CM_EEXIST);
  psd_ckpt_free(d);
  /* The same type with another lr and momentum loads. */
  set_of(&momentum2, CM_OPT_MOMENTUM, 0.5);
  momentum2.def.momentum = 0.5;
  d = open_ckpt("job", 0, 2, &momentum2, 5);
  t = load_step(d, 5, 0);
  same_store(s, t);
  ck_assert_double_eq(psd_store_at(t, 0)->opt.lr, 0.5);
  psd_store_free(t);
  psd_ckpt_free(d);
  psd_store_free(old);
  psd_store_free(s);
  psd_ckpt_free(c);
}
END_TEST

/* Rewrites checkpoint step's manifest as format 1 wrote it: one optimizer
 * for the job, momentum's tensor as "slot", no per-variable optimizer or
 * step count; a new checksum. */
static void make_format_1(struct psd_ckpt *c, uint64_t step) {
  char p[1400];
  json_t *m, *vars, *e;
  size_t i;
  uint32_t crc;
  char *text;

  ckpt_file(c, step, "manifest.json", p, sizeof p);
  ck_assert_ptr_nonnull(m = json_load_file(p, 0, NULL));
  json_object_del(m, "checksum");
  json_object_set_new(m, "format", json_string("psd-checkpoint-1"));
  json_object_del(json_object_get(m, "optimizer"), "describe");
  vars = json_object_get(m, "vars");
  json_array_foreach(vars, i, e) {
    json_t *slot = json_array_get(json_object_get(e, "slots"), 0);
    json_object_set(e, "slot", slot);
    json_object_del(e, "slots");
    json_object_del(e, "optimizer");
    json_object_del(e, "opt_step");
  }
  text = json_dumps(m, JSON_COMPACT | JSON_SORT_KEYS);
  crc = cm_st_crc32(0, text, strlen(text));
  free(text);
  json_object_set_new(m, "checksum", json_integer(crc));
  ck_assert_int_eq(json_dump_file(m, p, JSON_INDENT(1)), 0);
  json_decref(m);
}

START_TEST(test_format_1_loads) {
  struct psd_store *s = make_store(0, &momentum, 1), *t;
  struct psd_ckpt *c = open_ckpt("job", 0, 2, &momentum, 3);

  write_ok(c, s, 5);
  make_format_1(c, 5);
  t = load_step(c, 5, 0);
  /* Values, momentum and versions as written; the step count was not
   * kept, so it is the version. */
  for (int i = 0; i < psd_store_count(s); i++) {
    struct psd_var *v = psd_store_at(s, i);
    v->applied = v->version * (v->elem_end - v->elem_begin);
  }
  same_store(s, t);
  psd_store_free(t);
  psd_store_free(s);
  psd_ckpt_free(c);
}
END_TEST

START_TEST(test_prune_keeps_exactly_k) {
  struct psd_ckpt *c = open_ckpt("job", 0, 2, &momentum, 2);
  struct psd_store *s = make_store(0, &momentum, 1);
  uint64_t steps[8];
  for (uint64_t step = 10; step <= 50; step += 10) {
    write_ok(c, s, step);
    ck_assert_int_eq(count_entries(c, "ckpt-"), step < 20 ? 1 : 2);
  }
  ck_assert_int_eq(psd_ckpt_list(c, steps, 8), 2);
  ck_assert_uint_eq(steps[0], 50);
  ck_assert_uint_eq(steps[1], 40);
  /* keep 1 leaves the newest only. */
  psd_ckpt_free(c);
  c = open_ckpt("job", 0, 2, &momentum, 1);
  write_ok(c, s, 60);
  ck_assert_int_eq(psd_ckpt_list(c, steps, 8), 1);
  ck_assert_uint_eq(steps[0], 60);
  psd_store_free(s);
  psd_ckpt_free(c);
}
END_TEST

START_TEST(test_stale_tmp_is_removed) {
  struct psd_ckpt *c = open_ckpt("job", 0, 2, &momentum, 3);
  char p[1400];
  snprintf(p, sizeof p, "%s/.tmp-7-12345", psd_ckpt_dir(c));
  ck_assert_int_eq(mkdir(p, 0755), 0);
  snprintf(p, sizeof p, "%s/.tmp-7-12345/shard.safetensors", psd_ckpt_dir(c));
  fclose(fopen(p, "w"));
  psd_ckpt_free(c);
  c = open_ckpt("job", 0, 2, &momentum, 3);
  ck_assert_int_eq(count_entries(c, ".tmp-"), 0);
  psd_ckpt_free(c);
}
END_TEST

START_TEST(test_same_step_twice_keeps_the_second) {
  struct psd_ckpt *c = open_ckpt("job", 0, 2, &momentum, 3);
  struct psd_store *a = make_store(0, &momentum, 1);
  struct psd_store *b = make_store(0, &momentum, 2), *t;
  write_ok(c, a, 9);
  write_ok(c, b, 9);
  ck_assert_int_eq(count_entries(c, "ckpt-"), 1);
  ck_assert_int_eq(count_entries(c, ".tmp-"), 0);
  t = load_step(c, 9, 0);
  same_store(b, t);
  psd_store_free(t);
  psd_store_free(a);
  psd_store_free(b);
  psd_ckpt_free(c);
}
END_TEST

START_TEST(test_failed_write_keeps_the_previous) {
  struct psd_ckpt *c = open_ckpt("job", 0, 2, &momentum, 3);
  struct psd_store *a = make_store(0, &momentum, 1), *t;
  struct psd_store *big = NULL;
  struct psd_ckpt_result r;
  static const int64_t shape[2] = {1 << 12, 1 << 10}; /* 16 MiB + slot */
  struct psd_var *v;
  int created;

  write_ok(c, a, 1);
  /* A write that fails half way: the file size limit (as a full disk). */
  signal(SIGXFSZ, SIG_IGN);
  struct rlimit lim = {4 << 20, 4 << 20};
  ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
  ck_assert_int_eq(psd_store_new(&big, 0, 1, &momentum), 0);
  ck_assert_int_eq(psd_store_declare(big, "big", 2, shape, -1, PSD_INIT_ZEROS,
                                     0, 0, &v, &created, err, sizeof err),
                   0);
  ck_assert_int_eq(psd_ckpt_write(c, big, NULL, 2, 1, &r, err, sizeof err),
                   CM_EIO);
  ck_assert_msg(strstr(err, "File too large") && strstr(err, "/.tmp-2-"), "%s",
                err);
  ck_assert_int_eq(count_entries(c, ".tmp-"), 0);
  ck_assert_int_eq(count_entries(c, "ckpt-"), 1);
  t = load_step(c, 1, 0);
  same_store(a, t);
  psd_store_free(t);
  psd_store_free(big);
  psd_ckpt_free(c);
  /* A regular file where the shard's directory should be. */
  char p[256];
  snprintf(p, sizeof p, "%s/job2", root);
  fclose(fopen(p, "w"));
  struct psd_ckpt_opts o = {root, "job2", 0, 2, "sync", &momentum, 3};
  c = (struct psd_ckpt *)1;
  ck_assert_int_eq(psd_ckpt_new(&c, &o, err, sizeof err), CM_EIO);
  ck_assert_ptr_null(c);
  ck_assert_msg(strstr(err, "job2") && strstr(err, "not a directory"), "%s",
                err);
  psd_store_free(a);
}
END_TEST

START_TEST(test_resume_step) {
  struct psd_ckpt *c = open_ckpt("job", 0, 2, &momentum, 5), *d;
  struct psd_store *s = make_store(0, &momentum, 1), *t = NULL;
  struct psd_ckpt_result r;
  uint64_t steps[8];
  for (uint64_t step = 10; step <= 30; step += 10)
    write_ok(c, s, step);
  /* Nothing at or below 5: an error, and nothing is set aside. */
  struct psd_ckpt_opts o = {root, "job", 0, 2, "sync", &momentum, 5, 1, 5};
  ck_assert_int_eq(psd_ckpt_new(&d, &o, err, sizeof err), 0);
  ck_assert_int_eq(psd_ckpt_load(d, &t, NULL, &r, err, sizeof err), CM_ENOENT);
  ck_assert_ptr_nonnull(strstr(err, "--resume-step 5"));
  ck_assert_int_eq(psd_ckpt_list(d, steps, 8), 3);
  psd_ckpt_free(d);
  /* At or below 25: step 20, and 30 is renamed out of the way. */
  o.resume_step = 25;
  ck_assert_int_eq(psd_ckpt_new(&d, &o, err, sizeof err), 0);
  t = load_step(d, 20, 0);
  psd_store_free(t);
  ck_assert_int_eq(psd_ckpt_list(d, steps, 8), 2);
  ck_assert_uint_eq(steps[0], 20);
  ck_assert_int_eq(count_entries(d, "superseded-ckpt-0000000030-"), 1);
  psd_ckpt_free(d);
  psd_store_free(s);
  psd_ckpt_free(c);
}
END_TEST

/* ---- the table of applied pushes ---- */

/* Rewrites checkpoint step's manifest with edit applied, and a new
 * checksum (as a writer would have written it). */
static void rewrite_manifest(struct psd_ckpt *c, uint64_t step,
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
                                     &v, &created, err, sizeof err),
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

static Suite *ckpt_suite(void) {
  Suite *s = suite_create("ckpt");
  TCase *tc = tcase_create("disk");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_roundtrip);
  tcase_add_test(tc, test_restore_in_place);
  tcase_add_test(tc, test_empty_dir_is_a_fresh_start);
  tcase_add_test(tc, test_flipped_byte_falls_back);
  tcase_add_test(tc, test_truncated_falls_back);
  tcase_add_test(tc, test_bad_manifest_falls_back);
  tcase_add_test(tc, test_none_verifies_is_an_error);
  tcase_add_test(tc, test_other_job_or_shard_is_refused);
  tcase_add_test(tc, test_per_variable_optimizers_roundtrip);
  tcase_add_test(tc, test_optimizer_change_is_refused);
  tcase_add_test(tc, test_format_1_loads);
  tcase_add_test(tc, test_prune_keeps_exactly_k);
  tcase_add_test(tc, test_stale_tmp_is_removed);
  tcase_add_test(tc, test_same_step_twice_keeps_the_second);
  tcase_add_test(tc, test_failed_write_keeps_the_previous);
  tcase_add_test(tc, test_resume_step);
  tcase_add_test(tc, test_dedup_roundtrip);
  tcase_add_test(tc, test_manifest_without_dedup_loads);
  tcase_add_test(tc, test_corrupt_dedup_is_refused);
  tcase_add_test(tc, test_dedup_matches_values_under_pushes);
  tcase_set_timeout(tc, 60);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(ckpt_suite(), 0); }
