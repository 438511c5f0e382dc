/* The seeds of Declare's initial values (proto/ps.proto: VarSpec.source,
 * DeclareRequest.values and stage; ps-server/psd/shard/service_values.c,
 * vstage.c), on shard 0 of 2 as fuzz_service.c runs it: SOURCE_VALUES
 * variables whose runs come inline (split, whole here, whole elsewhere; runs
 * out of order and overlapping), then declared again with other values;
 * runs refused (of a variable not SOURCE_VALUES, a partial element, outside
 * the rows, not covering them without a stage); values staged over two
 * Declares, sent again after the creation, and a stage's rows declared
 * otherwise; a SOURCE_AWAIT variable declared before and after the values
 * arrive; the staged and awaited ones in a sync step; and the inline and
 * staged Declares with each field left out in turn. */
#include <stdio.h>

#include "fuzz_input.h"
#include "fuzz_seeds.h"

#define DECLARE "/psd.v1.Data/Declare"

/* A [4, 3] variable: split, shard 0 holds rows [0, 2), elements [0, 6);
 * [6, 3] declared for a stage made for [4, 3] (another shape). */
static int64_t shape43[2] = {4, 3}, shape63[2] = {6, 3}, shape3[1] = {3};

/* The values every run takes its elements from (element i of a variable:
 * vals[i]). */
static const float vals[12] = {1, -2, 3.5f, 0.25f, -0.125f, 6,
                               7, 8,  -9,   10,    11,      12};

/* One variable of a values Declare. */
struct var {
  const char *name; /* its name */
  int64_t *shape;   /* [4, 3], [6, 3] or [3] */
  int ndim;         /* of shape */
  int placement;    /* -1: split; else the shard holding it whole */
  int source;       /* PSD__V1__SOURCE__SOURCE_* */
};

/* One run: elements [offset, offset + count) of the variable called name. */
struct run {
  const char *name; /* a variable of the request */
  uint64_t offset;  /* first element */
  uint64_t count;   /* elements; bytes is count * 4 unless set */
  size_t bytes;     /* 0: count * 4; else this many (a partial element) */
};

/* A Declare of nv variables with nr runs, under stage (0: none). */
static void declare_values(struct seed *s, int cut, const struct var *v, int nv,
                           const struct run *r, int nr, uint64_t stage) {
  Psd__V1__DeclareRequest q = PSD__V1__DECLARE_REQUEST__INIT;
  Psd__V1__VarSpec vs[4], *vp[4];
  Psd__V1__ValueRun rv[6], *rp[6];
  for (int i = 0; i < nv; i++) {
    psd__v1__var_spec__init(&vs[i]);
    vs[i].name = (char *)v[i].name;
    vs[i].n_shape = (size_t)v[i].ndim;
    vs[i].shape = v[i].shape;
    vs[i].placement = v[i].placement;
    vs[i].source = v[i].source;
    vp[i] = &vs[i];
  }
  for (int k = 0; k < nr; k++) {
    psd__v1__value_run__init(&rv[k]);
    rv[k].name = (char *)r[k].name;
    rv[k].offset = r[k].offset;
    rv[k].data.len = r[k].bytes ? r[k].bytes : r[k].count * sizeof(float);
    rv[k].data.data = (uint8_t *)(vals + r[k].offset % 12);
    rp[k] = &rv[k];
  }
  q.caller = &fseed_caller;
  q.n_vars = (size_t)nv;
  q.vars = vp;
  q.n_values = (size_t)nr;
  q.values = rp;
  q.stage = stage;
  fseed_add(s, DECLARE, cut, &q.base);
}

/* A pull of elements [offset, offset + count) of name. */
static void pull_of(struct seed *s, int cut, const char *name, uint64_t offset,
                    uint64_t count, uint64_t min_version) {
  Psd__V1__PullRequest r = PSD__V1__PULL_REQUEST__INIT;
  Psd__V1__Segment g = PSD__V1__SEGMENT__INIT, *sg[1] = {&g};
  g.name = (char *)name;
  g.offset = offset;
  g.count = count;
  r.caller = &fseed_caller;
  r.n_segments = 1;
  r.segments = sg;
  r.min_version = min_version;
  fseed_add(s, "/psd.v1.Data/Pull", cut, &r.base);
}

/* A push of shard 0's rows of the [4, 3] variable name by worker. */
static void push_of(struct seed *s, int cut, const char *name, int worker) {
  Psd__V1__PushRequest r = PSD__V1__PUSH_REQUEST__INIT;
  Psd__V1__Segment g = PSD__V1__SEGMENT__INIT, *sg[1] = {&g};
  g.name = (char *)name;
  g.count = 6;
  g.n_shape = 2;
  g.shape = shape43;
  r.caller = &fseed_caller;
  r.n_segments = 1;
  r.segments = sg;
  r.examples = 4;
  r.worker = worker;
  r.has_worker = 1;
  r.first = 1;
  r.data.len = 6 * sizeof(float);
  r.data.data = (uint8_t *)vals;
  fseed_add(s, "/psd.v1.Data/Push", cut, &r.base);
}

static void join_of(struct seed *s, int worker) {
  Psd__V1__JoinRequest r = PSD__V1__JOIN_REQUEST__INIT;
  r.caller = &fseed_caller;
  r.worker = worker;
  fseed_add(s, "/psd.v1.Coord/Join", 0, &r.base);
}

enum { INIT, VALUES, AWAIT };

/* Split, whole here, whole on shard 1 (nothing held here: created without
 * values), and their runs out of order, one overlapping another. */
static const struct var inline_vars[3] = {{"vv", shape43, 2, -1, VALUES},
                                          {"vb", shape3, 1, 0, VALUES},
                                          {"vn", shape43, 2, 1, VALUES}};
static const struct run inline_runs[3] = {
    {"vb", 0, 3, 0}, {"vv", 2, 4, 0}, {"vv", 0, 3, 0}};

/* A split variable staged under one id: its first half, then the rest with
 * an element sent again. */
static const struct var staged_var[1] = {{"vs", shape43, 2, -1, VALUES}};
static const struct run staged_first[1] = {{"vs", 0, 3, 0}},
                        staged_rest[2] = {{"vs", 3, 3, 0}, {"vs", 2, 1, 0}};
#define STAGE 0x5eed0001ull

/* The same variable awaited, and created from values. */
static const struct var await_var[1] = {{"va", shape43, 2, -1, AWAIT}},
                        await_values[1] = {{"va", shape43, 2, -1, VALUES}};
static const struct run all_va[1] = {{"va", 0, 6, 0}};

static void staged(struct seed *s, int cut) {
  declare_values(s, cut, staged_var, 1, staged_first, 1, STAGE);
  pull_of(s, 0, "vs", 0, 6, 0); /* not there yet */
  declare_values(s, cut ? cut + 1 : 0, staged_var, 1, staged_rest, 2, STAGE);
}

static void awaited(struct seed *s) {
  declare_values(s, 0, await_var, 1, NULL, 0, 0);
  pull_of(s, 0, "va", 0, 6, 0); /* not there yet */
  declare_values(s, 1, await_values, 1, all_va, 1, 0);
  declare_values(s, 0, await_var, 1, NULL, 0, 0);
}

void fseed_values(const char *dir) {
  static struct seed s;

  /* Inline: created from the runs, pulled, pushed, declared again with
   * other values (ignored); then each kind of bad run. */
  static const struct var init_w[1] = {{"vi", shape43, 2, -1, INIT}},
                          other[1] = {{"vo", shape43, 2, -1, VALUES}};
  static const struct run of_vi[1] = {{"vi", 0, 6, 0}},
                          partial[1] = {{"vo", 0, 1, 5}},
                          outside[1] = {{"vo", 4, 3, 0}},
                          short_[1] = {{"vo", 1, 2, 0}},
                          again[1] = {{"vv", 0, 6, 0}};
  s.len = 0;
  s.buf[s.len++] = 0;
  declare_values(&s, 1, inline_vars, 3, inline_runs, 3, 0);
  pull_of(&s, 0, "vv", 0, 6, 0);
  pull_of(&s, 0, "vb", 0, 3, 0);
  push_of(&s, 2, "vv", 0);
  declare_values(&s, 0, inline_vars, 1, again, 1, 0);
  pull_of(&s, 3, "vv", 0, 6, 0);
  declare_values(&s, 0, init_w, 1, of_vi, 1, 0);
  declare_values(&s, 0, other, 1, partial, 1, 0);
  declare_values(&s, 0, other, 1, outside, 1, 0);
  declare_values(&s, 0, other, 1, short_, 1, 0);
  fseed_write(dir, "async-values-inline", &s);

  /* Staged over two Declares, created by the second; the first sent again
   * after (the variable exists: ignored); a stage whose rows a later
   * request of it declares otherwise. */
  static const struct var wider[1] = {{"vw", shape43, 2, -1, VALUES}},
                          wider63[1] = {{"vw", shape63, 2, -1, VALUES}};
  static const struct run of_vw[1] = {{"vw", 0, 3, 0}};
  s.len = 0;
  s.buf[s.len++] = FUZZ_MOMENTUM;
  staged(&s, 2);
  pull_of(&s, 0, "vs", 0, 6, 0);
  declare_values(&s, 0, staged_var, 1, staged_first, 1, STAGE);
  push_of(&s, 0, "vs", 0);
  declare_values(&s, 0, wider, 1, of_vw, 1, STAGE + 1);
  declare_values(&s, 5, wider63, 1, of_vw, 1, STAGE + 1);
  pull_of(&s, 0, "vw", 0, 6, 0);
  fseed_write(dir, "async-values-staged", &s);

  /* Awaited: no slice, not there, created by a values Declare, then
   * awaited again (its slice now). */
  s.len = 0;
  s.buf[s.len++] = 0;
  awaited(&s);
  pull_of(&s, 0, "va", 0, 6, 0);
  push_of(&s, 0, "va", 0);
  fseed_write(dir, "async-values-await", &s);

  /* Sync: both workers join, then the staged and the awaited variables, a
   * step pushed and a pull parked for it. */
  s.len = 0;
  s.buf[s.len++] = FUZZ_SYNC | FUZZ_SMALL;
  join_of(&s, 0);
  join_of(&s, 1);
  staged(&s, 0);
  awaited(&s);
  push_of(&s, 0, "vs", 0);
  push_of(&s, 0, "va", 1);
  pull_of(&s, 0, "vs", 0, 6, 1);
  pull_of(&s, 0, "va", 0, 6, 0);
  fseed_write(dir, "sync-values", &s);

  /* The inline and the staged Declares with each field of DeclareRequest
   * left out in turn (caller, vars, tables, values, stage). */
  s.len = 0;
  s.buf[s.len++] = 0;
  for (uint32_t f = 1; f <= 5; f++) {
    fseed_drop_field = f;
    declare_values(&s, 0, inline_vars, 3, inline_runs, 3, 0);
    declare_values(&s, 0, staged_var, 1, staged_first, 1, STAGE);
  }
  fseed_drop_field = 0;
  pull_of(&s, 0, "vv", 0, 6, 0);
  fseed_write(dir, "async-values-fields", &s);
}
