/* The fixture the checkpoint suites share (test-ckpt.c, test-ckpt-verify.c,
 * test-ckpt-dedup.c): a temporary checkpoint root made and removed around
 * each test (ckf_setup, ckf_teardown), stores of known contents to write,
 * and helpers that open, write, load and rewrite checkpoints, asserting as
 * they go. The names are the ones the cases were written with in one file
 * (root, momentum, open_ckpt...), kept so that each case reads as before. */
#ifndef CKPT_FIXTURE_H
#define CKPT_FIXTURE_H

#include <check.h>
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "ckpt.h"
#include "store.h"

/* The test's checkpoint root, a fresh directory under /tmp (ckf_setup). */
extern char root[64];
/* Every variable with momentum (lr 0.1, momentum 0.9); set up by
 * ckf_setup. */
extern struct cm_optim_set momentum;

/* The checked fixture of every checkpoint test case. */
void ckf_setup(void);
void ckf_teardown(void);

/* A test case ("disk") that runs its tests inside ckf_setup and
 * ckf_teardown, 60 s each at most. */
TCase *ckf_tcase(void);

/* A set giving every variable type t with lr. */
void set_of(struct cm_optim_set *set, enum cm_optim_type t, double lr);

/* Adds rule pattern -> type t to set. */
void add_rule(struct cm_optim_set *set, const char *pattern,
              enum cm_optim_type t);

/* Opens shard `shard` of nshards of job in root, as a sync job keeping
 * `keep` checkpoints (the caller frees it). */
struct psd_ckpt *open_ckpt(const char *job, int shard, int nshards,
                           const struct cm_optim_set *opt, int keep);

/* Shard `shard` of 2 with: "w" (5, 3) split (rows [0,3) or [3,5)), "b" (4)
 * placed on shard 1, "one" (1, 2) split (its row on shard 0 only). Values
 * and slots are a function of (tag, variable, slot, element); versions
 * 10+i, optimizer steps 20+i. The caller frees it. */
struct psd_store *make_store(int shard, const struct cm_optim_set *opt,
                             float tag);

/* Asserts that b holds exactly a's variables. */
void same_store(struct psd_store *a, struct psd_store *b);

/* Writes s as checkpoint step (variables under their locks, no table). */
void write_ok(struct psd_ckpt *c, struct psd_store *s, uint64_t step);

/* Loads and returns the store (caller frees), asserting the step and how
 * many newer checkpoints were refused. */
struct psd_store *load_step(struct psd_ckpt *c, uint64_t step, int refused);

/* The path of file `name` of checkpoint step, into buf. */
void ckpt_file(struct psd_ckpt *c, uint64_t step, const char *name, char *buf,
               size_t len);

/* The size of file p, or -1. */
long file_size(const char *p);

/* Rewrites checkpoint step's manifest with edit applied, and a new
 * checksum (as a writer would have written it). */
void rewrite_manifest(struct psd_ckpt *c, uint64_t step,
                      void (*edit)(json_t *m));

#endif
