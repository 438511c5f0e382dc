/* Unit tests for verifying a checkpoint as it loads
 * (ps-server/psd/ckpt/ckpt_verify.c, ckpt_load.c): the newest one that verifies
 * is taken, and one with a flipped byte, cut short, with a damaged or
 * missing manifest, or from another job or shard is refused for the one
 * before it; only bad ones are an error; a checkpoint whose optimizer type
 * differs from the spec's is refused without falling back; a variable
 * declared with its own optimizer gets it back whole, whatever the spec
 * says. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt.h"
#include "ckpt_fixture.h"
#include "err.h"
#include "optjson.h"
#include "store.h"
#include "unit.h"

static char err[4096];

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

/* A variable declared with its own optimizer (every hyper-parameter and a
 * schedule the spec does not have) comes back with it from a checkpoint,
 * its slots with it; declaring it again asks for the same or is refused
 * naming both. */
START_TEST(test_own_optimizer_survives) {
  static const char own_text[] =
      "{\"type\": \"adam\", \"lr\": 0.003, \"beta1\": 0.8, \"eps\": 1e-6, "
      "\"schedule\": {\"type\": \"cosine\", \"warmup_steps\": 3, "
      "\"total_steps\": 90, \"min_lr\": 0.0001}}";
  static const int64_t shape[1] = {6};
  struct psd_ckpt *c = open_ckpt("job", 0, 1, &momentum, 3);
  struct psd_store *s = NULL, *t;
  struct cm_optim own, sgd;
  struct psd_var *v, *u;
  int created;

  ck_assert_int_eq(
      cm_optim_from_json(own_text, strlen(own_text), &own, err, sizeof err), 0);
  ck_assert_int_eq(psd_store_new(&s, 0, 1, &momentum), 0);
  ck_assert_int_eq(psd_store_declare(s, "mine", 1, shape, -1, PSD_INIT_UNIFORM,
                                     0.5f, 3, &own, &v, &created, err,
                                     sizeof err),
                   0);
  ck_assert_int_eq(v->own, 1);
  ck_assert_int_eq(v->nslots, 2);
  for (int k = 0; k < 2; k++)
    for (int i = 0; i < 6; i++)
      v->slots[k][i] = (float)(10 * k + i);
  v->version = 4;
  v->applied = 4 * 6;
  ck_assert_int_eq(psd_store_declare(s, "spec", 1, shape, -1, PSD_INIT_ZEROS, 0,
                                     0, NULL, &u, &created, err, sizeof err),
                   0);
  ck_assert_int_eq(u->own, 0);
  write_ok(c, s, 7);
  t = load_step(c, 7, 0);
  same_store(s, t);
  v = psd_store_find(t, "mine");
  ck_assert_int_eq(v->own, 1);
  ck_assert_int_eq(cm_optim_same(&v->opt, &own), 1);
  ck_assert_str_eq(v->optim_desc, psd_store_find(s, "mine")->optim_desc);
  ck_assert_uint_eq(psd_var_steps(v), 4);
  ck_assert_int_eq(psd_store_find(t, "spec")->own, 0);
  ck_assert_int_eq(psd_store_find(t, "spec")->opt.type, CM_OPT_MOMENTUM);

  /* Declared again after the restart: the same is the one that exists. */
  ck_assert_int_eq(psd_store_declare(t, "mine", 1, shape, -1, PSD_INIT_ZEROS, 0,
                                     0, &own, &u, &created, err, sizeof err),
                   0);
  ck_assert_int_eq(created, 0);
  ck_assert_ptr_eq(u, v);
  /* The spec's, or another, is refused naming both. */
  ck_assert_int_eq(psd_store_declare(t, "mine", 1, shape, -1, PSD_INIT_ZEROS, 0,
                                     0, NULL, &u, &created, err, sizeof err),
                   CM_EEXIST);
  ck_assert_msg(strstr(err, "'mine'") && strstr(err, v->optim_desc) &&
                    strstr(err, "momentum(lr=0.1, momentum=0.9) (the spec's)"),
                "%s", err);
  cm_optim_defaults(&sgd);
  sgd.type = CM_OPT_SGD;
  sgd.lr = 0.5;
  ck_assert_int_eq(psd_store_declare(t, "spec", 1, shape, -1, PSD_INIT_ZEROS, 0,
                                     0, &sgd, &u, &created, err, sizeof err),
                   CM_EEXIST);
  ck_assert_str_eq(err, "variable 'spec' already exists with optimizer "
                        "momentum(lr=0.1, momentum=0.9) (the spec's); this "
                        "declaration asks for sgd(lr=0.5) (its own)");
  psd_store_free(t);
  psd_store_free(s);
  psd_ckpt_free(c);
}
END_TEST

static Suite *ckpt_verify_suite(void) {
  Suite *s = suite_create("ckpt-verify");
  TCase *tc = ckf_tcase();
  tcase_add_test(tc, test_flipped_byte_falls_back);
  tcase_add_test(tc, test_truncated_falls_back);
  tcase_add_test(tc, test_bad_manifest_falls_back);
  tcase_add_test(tc, test_none_verifies_is_an_error);
  tcase_add_test(tc, test_other_job_or_shard_is_refused);
  tcase_add_test(tc, test_optimizer_change_is_refused);
  tcase_add_test(tc, test_own_optimizer_survives);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(ckpt_verify_suite(), 0); }
