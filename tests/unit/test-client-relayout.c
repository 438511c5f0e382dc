/* Unit tests for libpsclient's re-plan when the job's shard layout moved
 * (worker/psclient/relayout.c, and the sparse regroup in sparse_plan.c):
 * the "layout moved" message read (good, malformed, a count outside the
 * pool), the variables re-placed as psd --reshard places them, and what a
 * transfer re-sends: only the pieces no shard acknowledged, split at the
 * new shards' row ranges, with chunk indexes past the plan's; a table
 * push's pending ids regrouped by the new count, rows intact, none
 * acknowledged among them. No shard is reached: channels dial lazily. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"
#include "err.h"
#include "layout.h"
#include "psclient.h"
#include "rand.h"
#include "sparse_plan.h"
#include "spec.h"
#include "status_json.h"
#include "unit.h"

#define MOVED3 "layout moved: ps:1 holds layout 4 of 3 shards; re-plan"

START_TEST(parse_good) {
  struct psc__moved m;
  ck_assert_int_eq(psc__moved_parse(MOVED3, &m), 0);
  ck_assert_int_eq(m.shard, 1);
  ck_assert_uint_eq(m.layout, 4);
  ck_assert_int_eq(m.nshards, 3);
  /* Without a rule: a shard before rules, whose rows are modulo's. */
  ck_assert_int_eq(m.rows, CM_LAYOUT_RULE_MODULO);
  ck_assert_int_eq(m.move_to, 0);
  ck_assert_int_eq(m.bucket, -1);
  ck_assert_int_eq(psc__moved_parse("layout moved: ps:1 holds layout 4 of 3 "
                                    "shards, rows by buckets; Pull was "
                                    "planned for layout 4 of 3 shards, rows "
                                    "by modulo (...)",
                                    &m),
                   0);
  ck_assert_int_eq(m.rows, CM_LAYOUT_RULE_BUCKETS);
  ck_assert_int_eq(m.nshards, 3);
  ck_assert_int_eq(psc__moved_parse("layout moved: ps:0 holds layout 1 of 1 "
                                    "shard, rows by modulo",
                                    &m),
                   0);
  ck_assert_int_eq(m.rows, CM_LAYOUT_RULE_MODULO);
  ck_assert_int_eq(m.nshards, 1);
  /* A standby shard's words, and nothing after the counts. */
  ck_assert_int_eq(
      psc__moved_parse("layout moved: ps:2 holds layout 18446744073709551615 "
                       "of 2 shards; ps:2 is standby",
                       &m),
      0);
  ck_assert_uint_eq(m.layout, UINT64_MAX);
  ck_assert_int_eq(psc__moved_parse("layout moved: ps:0 holds layout 0 of 1 "
                                    "shards",
                                    &m),
                   0);
  ck_assert_int_eq(m.nshards, 1);
  /* psd's words for one shard. */
  ck_assert_int_eq(
      psc__moved_parse("layout moved: ps:1 holds layout 3 of 1 shard; Pull "
                       "was planned for layout 2 of 2 shards (...)",
                       &m),
      0);
  ck_assert_int_eq(m.shard, 1);
  ck_assert_uint_eq(m.layout, 3);
  ck_assert_int_eq(m.nshards, 1);
  /* A live move's words: its count, the moves made, the bucket. */
  ck_assert_int_eq(psc__moved_parse("layout moved: ps:0 holds layout 5 of 2 "
                                    "shards, rows by buckets, moving to 3 "
                                    "shards after 17 moves; bucket 4095 "
                                    "(table 'emb' row 77) is no longer here; "
                                    "the client re-plans and calls again",
                                    &m),
                   0);
  ck_assert_int_eq(m.shard, 0);
  ck_assert_uint_eq(m.layout, 5);
  ck_assert_int_eq(m.nshards, 2);
  ck_assert_int_eq(m.rows, CM_LAYOUT_RULE_BUCKETS);
  ck_assert_int_eq(m.move_to, 3);
  ck_assert_int_eq(m.moves, 17);
  ck_assert_int_eq(m.bucket, 4095);
  /* None made yet, one made; all of them; shrinking to one shard. */
  uint16_t b[CM_LAYOUT_BUCKETS];
  int all = cm_layout_moves(3, 1, b);
  char text[256];
  snprintf(text, sizeof text,
           "layout moved: ps:2 holds layout 1 of 3 shards, rows by buckets, "
           "moving to 1 shard after %d moves; bucket 0 (table 't' row 1) is "
           "no longer here",
           all);
  ck_assert_int_eq(psc__moved_parse(text, &m), 0);
  ck_assert_int_eq(m.move_to, 1);
  ck_assert_int_eq(m.moves, all);
  ck_assert_int_eq(m.bucket, 0);
  ck_assert_int_eq(psc__moved_parse("layout moved: ps:0 holds layout 5 of 2 "
                                    "shards, rows by buckets, moving to 3 "
                                    "shards after 1 move",
                                    &m),
                   0);
  ck_assert_int_eq(m.moves, 1);
  ck_assert_int_eq(m.bucket, -1);
  ck_assert_int_eq(psc__moved_parse("layout moved: ps:0 holds layout 5 of 2 "
                                    "shards, rows by buckets, moving to 3 "
                                    "shards after 0 moves; x",
                                    &m),
                   0);
  ck_assert_int_eq(m.move_to, 3);
  ck_assert_int_eq(m.moves, 0);
}
END_TEST

START_TEST(parse_malformed) {
  char past[256];
  uint16_t b[CM_LAYOUT_BUCKETS];
  /* One move past the last of 2 -> 3. */
  snprintf(past, sizeof past,
           "layout moved: ps:0 holds layout 1 of 2 shards, rows by buckets, "
           "moving to 3 shards after %d moves; x",
           cm_layout_moves(2, 3, b) + 1);
  const char *bad[] = {
      "",
      "layout moved:",
      "Layout moved: ps:1 holds layout 4 of 3 shards; x",
      " layout moved: ps:1 holds layout 4 of 3 shards; x",
      "ps:1 restarted without a checkpoint: layout moved: ps:1 holds layout 4 "
      "of 3 shards",
      "layout moved: ps:1 holds layout of 3 shards; x",
      "layout moved: ps:1 holds layout -4 of 3 shards; x",
      "layout moved: ps:-1 holds layout 4 of 3 shards; x",
      "layout moved: ps:1 holds layout 4 of 3 shar",
      "layout moved: ps:1 holds layout 4 of 3 shardss; x",
      "layout moved: ps:1 holds layout 4 of 3 shardsX",
      "layout moved: ps:1 holds version 4 of 3 shards; x",
      "layout moved: ps:1 holds layout 4 of 3 shards, rows by bogus; x",
      "layout moved: ps:1 holds layout 4 of 3 shards, rows by bucketsX; x",
      /* A move: by buckets, to another count, at most its moves made. */
      past,
      "layout moved: ps:0 holds layout 1 of 2 shards, rows by buckets, "
      "moving to 0 shards after 0 moves; x",
      "layout moved: ps:0 holds layout 1 of 2 shards, rows by buckets, "
      "moving to 2 shards after 0 moves; x",
      "layout moved: ps:0 holds layout 1 of 2 shards, rows by buckets, "
      "moving to 4097 shards after 0 moves; x",
      "layout moved: ps:0 holds layout 1 of 2 shards, rows by modulo, "
      "moving to 3 shards after 0 moves; x",
      "layout moved: ps:0 holds layout 1 of 2 shards, moving to 3 shards "
      "after 0 moves; x",
      "layout moved: ps:0 holds layout 1 of 2 shards, rows by buckets, "
      "moving to -3 shards after 0 moves; x",
      "layout moved: ps:0 holds layout 1 of 2 shards, rows by buckets, "
      "moving to 3 shards after -1 moves; x",
      "layout moved: ps:0 holds layout 1 of 2 shards, rows by buckets, "
      "moving to 3 shards after  1 moves; x",
      "layout moved: ps:0 holds layout 1 of 2 shards, rows by buckets, "
      "moving to 3 shards after 1 movesX; x",
      "layout moved: ps:0 holds layout 1 of 2 shards, rows by buckets, "
      "moving to 3 shards; x",
      "layout moved: ps:0 holds layout 1 of 2 shards, rows by buckets, "
      "moving to 3 shards after 1 moves; bucket 4096 (table 't' row 1)",
      "layout moved: ps:0 holds layout 1 of 2 shards, rows by buckets, "
      "moving to 3 shards after 1 moves; bucket (table 't' row 1)",
  };
  struct psc__moved m = {7, 7, 7, 7, 7, 7, 7};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    ck_assert_msg(psc__moved_parse(bad[i], &m) == CM_EPROTO, "taken: '%s'",
                  bad[i]);
  ck_assert_int_eq(psc__moved_parse(NULL, &m), CM_EPROTO);
  /* Untouched on failure. */
  ck_assert_int_eq(m.shard, 7);
  ck_assert_int_eq(m.nshards, 7);
  ck_assert_uint_eq(m.layout, 7);
  ck_assert_int_eq(m.move_to, 7);
}
END_TEST

START_TEST(is_moved) {
  struct cm_unary u;
  memset(&u, 0, sizeof u);
  u.status = GRPC_STATUS_FAILED_PRECONDITION;
  strcpy(u.details, MOVED3);
  ck_assert(psc__is_moved(&u));
  /* Another refusal of the same status is no move, nor is an outage. */
  strcpy(u.details, "ps:1 restarted without a checkpoint: ...");
  ck_assert(!psc__is_moved(&u));
  u.status = GRPC_STATUS_UNAVAILABLE;
  strcpy(u.details, MOVED3);
  ck_assert(!psc__is_moved(&u));
}
END_TEST

/* ---- a client of a pool of 3 addresses, its job started on 2 ---- */

static struct cm_spec *spec;
static struct psc__client *c;

/* Variables: "w" of 10 rows of 3, split; "b" of 4 floats, whole on
 * shard 1; "e" of 100 rows of 2 split across the shards. */
static void open_client(void) {
  static const char text[] =
      "{\"cluster\": {\"ps\": [\"127.0.0.1:1\", \"127.0.0.1:2\", "
      "\"127.0.0.1:3\"], \"worker\": [\"127.0.0.1:4\"]}, \"job\": {\"name\": "
      "\"rl\", \"shards\": 2, \"unix_sockets\": false}}";
  static const struct {
    const char *name;
    int64_t rows, cols;
    int placement;
  } v[] = {{"w", 10, 3, PSC__PLACE_SPLIT},
           {"b", 4, 1, 1},
           {"e", 100, 2, PSC__PLACE_SPLIT}};
  char err[1024];
  struct psc__client_opts o = {.worker = "worker:0", .chunk_bytes = 64};
  ck_assert_msg(
      cm_spec_parse(text, strlen(text), "t.json", &spec, err, sizeof err) == 0,
      "%s", err);
  ck_assert_int_eq(psc__client_new(&c, spec, &o), 0);
  /* At open: the job's count, not the pool's. */
  ck_assert_int_eq(c->nshards, 2);
  ck_assert_uint_eq(c->layout, 0);
  c->cap_vars = 4;
  c->vars = calloc(4, sizeof *c->vars);
  c->var_names = calloc(4, sizeof *c->var_names);
  for (int i = 0; i < 3; i++) {
    c->var_names[i] = strdup(v[i].name);
    c->vars[i] = (struct psc__var){.name = c->var_names[i],
                                   .ndim = 2,
                                   .shape = {v[i].rows, v[i].cols},
                                   .placement = v[i].placement,
                                   .asked = v[i].placement};
  }
  c->nvars = 3;
  ck_assert_int_eq(psc__plan(c), 0);
}

static void close_client(void) {
  psc__client_free(c);
  cm_spec_free(spec);
  c = NULL;
}

/* The Caller carries the layout planned for. */
START_TEST(caller_names_layout) {
  Psd__V1__Caller k = psc__caller(c, 0);
  ck_assert_uint_eq(k.layout, 0);
  ck_assert_int_eq(k.shards, 2);
  ck_assert_int_eq(k.rows, CM_LAYOUT_RULE_BUCKETS);
  ck_assert_int_eq(k.spec_ps, 3);
  ck_assert_int_eq(psc__relayout(c, MOVED3, "pull"), 0);
  k = psc__caller(c, 2);
  ck_assert_uint_eq(k.layout, 4);
  ck_assert_int_eq(k.shards, 3);
  ck_assert_int_eq(k.rows, CM_LAYOUT_RULE_MODULO); /* no rule said */
  ck_assert_uint_eq(k.boot, 0);
}
END_TEST

/* A client opens on a fresh job's buckets; a shard that resumed from a
 * checkpoint written before buckets answers "rows by modulo", and the
 * client places ids so from then on (the same count and version). */
START_TEST(rows_rule_followed) {
  static struct cm_layout_map m2;
  cm_layout_map_init(&m2, CM_LAYOUT_RULE_BUCKETS, 2);
  ck_assert_int_eq(c->map.rule, CM_LAYOUT_RULE_BUCKETS);
  for (uint64_t id = 0; id < 200; id++)
    ck_assert_int_eq(psc__client_shard_of(c, id),
                     cm_layout_map_id_shard(&m2, id));
  ck_assert_int_eq(psc__relayout(c,
                                 "layout moved: ps:0 holds layout 0 of 2 "
                                 "shards, rows by modulo; x",
                                 "pull"),
                   0);
  ck_assert_int_eq(c->map.rule, CM_LAYOUT_RULE_MODULO);
  ck_assert_int_eq(c->nshards, 2);
  for (uint64_t id = 0; id < 200; id++)
    ck_assert_int_eq(psc__client_shard_of(c, id),
                     (int)(cm_splitmix64_at(id) % 2));
  /* And back, named by a shard cut into buckets. */
  ck_assert_int_eq(psc__relayout(c,
                                 "layout moved: ps:0 holds layout 1 of 2 "
                                 "shards, rows by buckets; x",
                                 "pull"),
                   0);
  ck_assert_int_eq(c->map.rule, CM_LAYOUT_RULE_BUCKETS);
}
END_TEST

START_TEST(count_out_of_range) {
  ck_assert_int_eq(
      psc__relayout(c, "layout moved: ps:0 holds layout 2 of 4 shards; x",
                    "push"),
      CM_ERANGE);
  ck_assert_str_eq(psc__client_error(c),
                   "push: ps:0 says the job moved to layout 2 of 4 shards, "
                   "but this client's spec lists 3 ps addresses (a layout "
                   "holds 1..3 shards); start every task from the job's spec");
  ck_assert_int_eq(
      psc__relayout(c, "layout moved: ps:1 holds layout 2 of 0 shards; x",
                    "pull"),
      CM_ERANGE);
  ck_assert_ptr_nonnull(strstr(psc__client_error(c), "layout 2 of 0 shards"));
  ck_assert_int_eq(
      psc__relayout(c, "layout moved: ps:1 holds 2 shards", "pull"), CM_EPROTO);
  ck_assert_ptr_nonnull(strstr(psc__client_error(c), "does not understand"));
  /* The layout planned for is no move. */
  ck_assert_int_eq(
      psc__relayout(c,
                    "layout moved: ps:1 holds layout 0 of 2 shards, rows by "
                    "buckets; x",
                    "pull"),
      CM_EPROTO);
  /* Nothing taken. */
  ck_assert_int_eq(c->nshards, 2);
  ck_assert_uint_eq(c->layout, 0);
}
END_TEST

/* Placement follows psd's reshard (cm_layout_replace): split stays split,
 * a variable declared on a shard stays there, the default goes by name. */
START_TEST(replaced_like_reshard) {
  c->boot[0] = c->boot[1] = 77;
  ck_assert_int_eq(psc__relayout(c, MOVED3, "pull"), 0);
  ck_assert_int_eq(c->nshards, 3);
  ck_assert_uint_eq(c->layout, 4);
  ck_assert_uint_eq(c->boot[0], 0);
  ck_assert_uint_eq(c->boot[1], 0);
  ck_assert_int_eq(c->vars[0].placement, PSC__PLACE_SPLIT);
  ck_assert_int_eq(c->vars[1].placement, 1);
  /* From one shard, where everything is held split: split when declared
   * so, else by name. */
  struct psc__var one = c->vars[0];
  ck_assert_int_eq(psc__replace(&one, 1, 3), PSC__PLACE_SPLIT);
  one.asked = PSC__PLACE_NAME;
  ck_assert_int_eq(psc__replace(&one, 1, 3),
                   cm_layout_by_name("w", 120, 3, CM_LAYOUT_SPLIT_BYTES));
  /* The plan is for 3 shards now. */
  int seen[3] = {0};
  for (int i = 0; i < c->nmsgs; i++)
    seen[c->msgs[i].shard] = 1;
  ck_assert(seen[0] && seen[1] && seen[2]);
}
END_TEST

/* Per variable, how often each element is in pieces p[0..n). */
static void count_elems(const struct psc__piece *p, int n, int *w, int *b,
                        int *e) {
  for (int k = 0; k < n; k++) {
    int *cnt = p[k].var == 0 ? w : p[k].var == 1 ? b : e;
    for (uint64_t j = p[k].offset; j < p[k].offset + p[k].count; j++)
      cnt[j]++;
  }
}

/* A push whose messages to ps:0 were acknowledged and those to ps:1 not:
 * only ps:1's pieces are sent again, cut at the 3 shards' rows. */
START_TEST(only_pending_recut) {
  int want_w[30] = {0}, want_b[4] = {0}, want_e[200] = {0};
  int got_w[30] = {0}, got_b[4] = {0}, got_e[200] = {0};
  int old_msgs = c->nmsgs;
  for (int i = 0; i < c->nmsgs; i++) {
    int pend = c->msgs[i].shard == 1;
    c->pending[2 * i] = (unsigned char)pend;
    if (pend)
      count_elems(&c->pieces[c->msgs[i].first], c->msgs[i].npieces, want_w,
                  want_b, want_e);
  }
  c->chunk_next = (uint32_t)old_msgs;
  ck_assert_int_eq(psc__relayout_transfer(c, MOVED3, "push"), 0);
  ck_assert(c->full.held);
  ck_assert_int_gt(c->nmsgs, 0);
  for (int i = 0; i < c->nmsgs; i++) {
    const struct psc__msg *m = &c->msgs[i];
    ck_assert_int_eq(m->kinds, PSC__KIND_PUSH);
    ck_assert(c->pending[2 * i] && !c->pending[2 * i + 1]);
    /* Past every chunk index of the push's plan. */
    ck_assert_uint_ge(m->chunk, (uint32_t)old_msgs);
    ck_assert_uint_le(m->bytes, 64);
    for (int k = 0; k < m->npieces; k++) {
      const struct psc__piece *p = &c->pieces[m->first + k];
      const struct psc__var *v = &c->vars[p->var];
      int64_t rb, re;
      uint64_t row = (uint64_t)v->shape[1];
      cm_layout_rows(v->shape[0], v->placement, 3, m->shard, &rb, &re);
      ck_assert_uint_ge(p->offset, (uint64_t)rb * row);
      ck_assert_uint_le(p->offset + p->count, (uint64_t)re * row);
    }
    count_elems(&c->pieces[m->first], m->npieces, got_w, got_b, got_e);
  }
  /* Exactly the pending elements, each once: nothing acknowledged. */
  ck_assert_mem_eq(got_w, want_w, sizeof want_w);
  ck_assert_mem_eq(got_b, want_b, sizeof want_b);
  ck_assert_mem_eq(got_e, want_e, sizeof want_e);
  /* Chunk indexes are distinct. */
  for (int i = 0; i < c->nmsgs; i++)
    for (int j = i + 1; j < c->nmsgs; j++)
      ck_assert_uint_ne(c->msgs[i].chunk, c->msgs[j].chunk);
  /* The transfer's end puts the full plan for 3 shards back. */
  psc__plan_restore(c);
  ck_assert(!c->full.held);
  memset(got_w, 0, sizeof got_w);
  memset(got_e, 0, sizeof got_e);
  memset(got_b, 0, sizeof got_b);
  count_elems(c->pieces, c->npieces, got_w, got_b, got_e);
  for (int j = 0; j < 200; j++)
    ck_assert_int_eq(got_e[j], 1);
}
END_TEST

/* A push and pull: the pull's pending pieces come back as pull messages,
 * the push's as push messages; a second move re-cuts the remainder. */
START_TEST(moved_twice) {
  int want[200] = {0}, got[200] = {0}, w[30] = {0}, b[4] = {0};
  for (int i = 0; i < c->nmsgs; i++) {
    c->pending[2 * i] = 0;                          /* pushes acknowledged */
    c->pending[2 * i + 1] = (unsigned char)(i % 2); /* half the pulls */
  }
  for (int i = 0; i < c->nmsgs; i++)
    if (i % 2)
      count_elems(&c->pieces[c->msgs[i].first], c->msgs[i].npieces, w, b, want);
  ck_assert_int_eq(psc__relayout_transfer(c, MOVED3, "push and pull"), 0);
  for (int i = 0; i < c->nmsgs; i++) {
    ck_assert_int_eq(c->msgs[i].kinds, PSC__KIND_PULL);
    ck_assert(!c->pending[2 * i] && c->pending[2 * i + 1]);
  }
  /* Half of the remainder answered, then the layout moves back to 2. */
  for (int i = 0; i < c->nmsgs; i += 2)
    c->pending[2 * i + 1] = 0;
  memset(want, 0, sizeof want);
  for (int i = 1; i < c->nmsgs; i += 2)
    count_elems(&c->pieces[c->msgs[i].first], c->msgs[i].npieces, w, b, want);
  ck_assert_int_eq(
      psc__relayout_transfer(
          c, "layout moved: ps:0 holds layout 5 of 2 shards; x", "pull"),
      0);
  ck_assert_int_eq(c->nshards, 2);
  for (int i = 0; i < c->nmsgs; i++)
    count_elems(&c->pieces[c->msgs[i].first], c->msgs[i].npieces, w, b, got);
  ck_assert_mem_eq(got, want, sizeof want);
  psc__plan_restore(c);
  for (int i = 0; i < c->nmsgs; i++)
    ck_assert_int_lt(c->msgs[i].shard, 2);
}
END_TEST

/* A table push planned for 2 shards, every other message acknowledged:
 * the rest regrouped for 3, each id once, on a fresh job's map of 3, its summed
 * row with it. */
START_TEST(table_ids_regrouped) {
  enum { NID = 40, DIM = 2 };
  uint64_t ids[NID];
  float grads[NID * DIM];
  struct psc__rows r = {.table = "t", .ids = ids, .n = NID, .grads = grads};
  c->tables = calloc(1, sizeof *c->tables);
  strcpy(c->tables[0].name, "t");
  c->tables[0].dim = DIM;
  c->ntables = 1;
  for (int i = 0; i < NID; i++) {
    ids[i] = (uint64_t)(i % 30) * 7919; /* 10 repeats, summed */
    grads[i * DIM] = (float)i;
    grads[i * DIM + 1] = 1.0f;
  }
  struct psc__scall sc = {.c = c, .push = 1, .rows = &r, .seq = 1};
  ck_assert_int_eq(psc__sparse_plan(&sc, 1), 0);
  psc__sparse_sum_rows(&sc, 1);
  int old = sc.nmsgs, acked[30] = {0}, seen[30] = {0};
  ck_assert_int_gt(old, 2); /* chunk_bytes 64: 8 rows a message */
  for (int k = 0; k < sc.nmsgs; k++) {
    ck_assert_int_eq(sc.msgs[k].shard,
                     cm_layout_map_id_shard(&c->map, sc.uid[sc.msgs[k].first]));
    if (k % 2 == 1) {
      sc.msgs[k].pending = 0;
      for (size_t j = 0; j < sc.msgs[k].n; j++)
        acked[sc.uid[sc.msgs[k].first + j] / 7919] = 1;
    }
  }
  sc.chunk_next = (uint32_t)old;
  static struct cm_layout_map m3;
  cm_layout_map_init(&m3, CM_LAYOUT_RULE_BUCKETS, 3);
  ck_assert_int_eq(psc__sparse_regroup(&sc, &m3, 64), 0);
  for (int k = 0; k < sc.nmsgs; k++) {
    const struct psc__smsg *m = &sc.msgs[k];
    ck_assert(m->pending);
    ck_assert_uint_ge(m->chunk, (uint32_t)old);
    ck_assert_uint_le(m->n, 8);
    for (size_t j = 0; j < m->n; j++) {
      uint64_t id = sc.uid[m->first + j];
      int u = (int)(id / 7919);
      ck_assert_int_eq(m->shard, cm_layout_map_id_shard(&m3, id));
      ck_assert_msg(!acked[u], "id %llu was acknowledged, and sent again",
                    (unsigned long long)id);
      seen[u]++;
      /* Its summed row: positions u and u + 30 (when < NID). */
      float want = (float)u + (u + 30 < NID ? (float)(u + 30) : 0.0f);
      ck_assert_float_eq(m->urow[j * DIM], want);
      ck_assert_float_eq(m->urow[j * DIM + 1], u + 30 < NID ? 2.0f : 1.0f);
    }
  }
  for (int u = 0; u < 30; u++)
    ck_assert_int_eq(seen[u], acked[u] ? 0 : 1);
  psc__sparse_plan_free(&sc);
}
END_TEST

/* "layout moved" with a move: layout V of 2 shards moving to 3 after K. */
static const char *moving(char *buf, size_t len, int v, int k) {
  snprintf(buf, len,
           "layout moved: ps:0 holds layout %d of 2 shards, rows by buckets, "
           "moving to 3 shards after %d moves; bucket 9 (table 't' row 4) "
           "is no longer here; the client re-plans and calls again",
           v, k);
  return buf;
}

/* A live move's steps: table ids by the partway map (of both counts'
 * shards), the variables and boot ids where they were, every call's
 * Caller naming the move; an answer with the same or fewer moves, or none
 * in the same version, is no newer; the move's end (the version's step)
 * is. */
START_TEST(move_steps_followed) {
  static struct cm_layout_map want;
  char text[512];
  int placement[3];
  for (int i = 0; i < 3; i++)
    placement[i] = c->vars[i].placement;
  c->boot[0] = 0x77;
  ck_assert_int_eq(psc__relayout(c, moving(text, sizeof text, 0, 5), "push"),
                   0);
  ck_assert_int_eq(c->nshards, 2);
  ck_assert_int_eq(c->move_to, 3);
  ck_assert_int_eq(c->moves, 5);
  ck_assert_int_eq(c->map.nshards, 3);
  cm_layout_map_moving(&want, 2, 3, 5);
  ck_assert_mem_eq(c->map.shard, want.shard, sizeof want.shard);
  for (uint64_t id = 0; id < 5000; id++)
    ck_assert_int_eq(psc__client_shard_of(c, id),
                     cm_layout_map_id_shard(&want, id));
  for (int i = 0; i < 3; i++)
    ck_assert_int_eq(c->vars[i].placement, placement[i]);
  ck_assert_uint_eq(c->boot[0], 0x77); /* the same processes */
  Psd__V1__Caller k = psc__caller(c, 0);
  ck_assert_uint_eq(k.layout, 0);
  ck_assert_int_eq(k.shards, 2);
  ck_assert_uint_eq(k.move_to, 3);
  ck_assert_uint_eq(k.moved, 5);
  ck_assert_uint_eq(k.boot, 0x77);
  /* No newer: the same moves, fewer, none said in this version. */
  struct psc__moved m;
  ck_assert_int_eq(psc__moved_parse(moving(text, sizeof text, 0, 5), &m), 0);
  ck_assert(!psc__moved_newer(c, &m));
  ck_assert_int_eq(psc__relayout(c, text, "push"), CM_EPROTO);
  ck_assert_msg(strstr(psc__client_error(c),
                       "names no layout newer than the one this client "
                       "planned for (layout 0 of 2 shards moving to 3 after "
                       "5 of "),
                "%s", psc__client_error(c));
  ck_assert_int_eq(psc__moved_parse(moving(text, sizeof text, 0, 4), &m), 0);
  ck_assert(!psc__moved_newer(c, &m));
  ck_assert_int_eq(psc__moved_parse("layout moved: ps:1 holds layout 0 of 2 "
                                    "shards, rows by buckets; bucket 3",
                                    &m),
                   0);
  ck_assert(!psc__moved_newer(c, &m));
  ck_assert_int_eq(c->moves, 5);
  /* More moves are. */
  ck_assert_int_eq(psc__moved_parse(moving(text, sizeof text, 0, 6), &m), 0);
  ck_assert(psc__moved_newer(c, &m));
  ck_assert_int_eq(psc__relayout(c, text, "push"), 0);
  ck_assert_int_eq(c->moves, 6);
  /* The end: layout 1 of 3, plain. */
  ck_assert_int_eq(psc__relayout(c,
                                 "layout moved: ps:2 holds layout 1 of 3 "
                                 "shards, rows by buckets; x",
                                 "push"),
                   0);
  ck_assert_int_eq(c->nshards, 3);
  ck_assert_int_eq(c->move_to, 0);
  ck_assert_int_eq(c->moves, 0);
  cm_layout_map_init(&want, CM_LAYOUT_RULE_BUCKETS, 3);
  ck_assert_mem_eq(c->map.shard, want.shard, sizeof want.shard);
  ck_assert_uint_eq(c->boot[0], 0); /* a new version: boot ids again */
  k = psc__caller(c, 0);
  ck_assert_uint_eq(k.move_to, 0);
  /* An older version is no newer either. */
  ck_assert_int_eq(psc__moved_parse(moving(text, sizeof text, 0, 9), &m), 0);
  ck_assert(!psc__moved_newer(c, &m));
}
END_TEST

/* A move to more shards than the pool holds is refused, naming it; a
 * round's answers keep the newest. */
START_TEST(move_outside_pool_and_newest_kept) {
  ck_assert_int_eq(psc__relayout(c,
                                 "layout moved: ps:1 holds layout 0 of 2 "
                                 "shards, rows by buckets, moving to 4 "
                                 "shards after 1 moves; x",
                                 "push rows"),
                   CM_ERANGE);
  ck_assert_str_eq(psc__client_error(c),
                   "push rows: ps:1 says the job's layout 0 is moving to 4 "
                   "shards, but this client's spec lists 3 ps addresses (a "
                   "layout holds 1..3 shards); start every task from the "
                   "job's spec");
  ck_assert_int_eq(c->move_to, 0);
  char a[512], b[512];
  int seen = 0;
  c->moved[0] = 0;
  psc__note_moved(c, &seen, moving(a, sizeof a, 0, 3));
  ck_assert_str_eq(c->moved, a);
  psc__note_moved(c, &seen, moving(b, sizeof b, 0, 2));
  ck_assert_str_eq(c->moved, a);
  psc__note_moved(c, &seen, "layout moved: ps:2 holds layout 0 of 2 shards");
  ck_assert_str_eq(c->moved, a);
  psc__note_moved(c, &seen, moving(b, sizeof b, 0, 7));
  ck_assert_str_eq(c->moved, b);
  psc__note_moved(c, &seen, "layout moved: ps:2 holds layout 1 of 3 shards");
  ck_assert_str_eq(c->moved, "layout moved: ps:2 holds layout 1 of 3 shards");
  psc__note_moved(c, &seen, moving(b, sizeof b, 0, 9));
  ck_assert_str_eq(c->moved, "layout moved: ps:2 holds layout 1 of 3 shards");
}
END_TEST

/* A table push planned during a move: ids on the partway map's shards,
 * the destination among them (past the layout's count). */
START_TEST(table_plan_during_move) {
  enum { NID = 300 };
  uint64_t ids[NID];
  float grads[NID];
  char text[512];
  struct psc__rows r = {.table = "t", .ids = ids, .n = NID, .grads = grads};
  c->tables = calloc(1, sizeof *c->tables);
  strcpy(c->tables[0].name, "t");
  c->tables[0].dim = 1;
  c->ntables = 1;
  for (int i = 0; i < NID; i++) {
    ids[i] = (uint64_t)i;
    grads[i] = 1.0f;
  }
  uint16_t b[CM_LAYOUT_BUCKETS];
  int all = cm_layout_moves(2, 3, b);
  ck_assert_int_eq(
      psc__relayout(c, moving(text, sizeof text, 0, all / 2), "push rows"), 0);
  struct psc__scall sc = {.c = c, .push = 1, .rows = &r, .seq = 1};
  ck_assert_int_eq(psc__sparse_plan(&sc, 1), 0);
  int per[3] = {0};
  for (int k = 0; k < sc.nmsgs; k++)
    for (size_t j = 0; j < sc.msgs[k].n; j++) {
      ck_assert_int_eq(
          sc.msgs[k].shard,
          cm_layout_map_id_shard(&c->map, sc.uid[sc.msgs[k].first + j]));
      per[sc.msgs[k].shard]++;
    }
  ck_assert_int_eq(per[0] + per[1] + per[2], NID);
  ck_assert_int_gt(per[2], 0);
  psc__sparse_plan_free(&sc);
}
END_TEST

/* psctl's way in: each shard's status (its document, with the move's
 * fields) offered in turn; the client keeps the newest. */
START_TEST(status_layouts_newest_kept) {
  static const struct {
    uint64_t layout;
    int shards;
    unsigned move_to, moved;
  } st[] = {
      {0, 2, 3, 4}, {0, 2, 0, 0}, {0, 2, 3, 2}, {0, 2, 3, 6}, {0, 2, 0, 0}};
  for (size_t i = 0; i < sizeof st / sizeof *st; i++) {
    Psd__V1__StatusResponse r = PSD__V1__STATUS_RESPONSE__INIT;
    r.layout = st[i].layout;
    r.num_shards = st[i].shards;
    r.rows = "buckets";
    r.move_to = st[i].move_to;
    r.moved = st[i].moved;
    json_t *doc = cm_status_json(&r);
    ck_assert_int_eq(cm_status_int(doc, "move_to"), st[i].move_to);
    ck_assert_int_eq(cm_status_int(doc, "moved"), st[i].moved);
    ck_assert_int_eq(psc__client_take_layout(
                         c, (int)i, (uint64_t)cm_status_int(doc, "layout"),
                         (int)cm_status_int(doc, "num_shards"),
                         cm_layout_rule_parse(cm_status_str(doc, "rows")),
                         (int)cm_status_int(doc, "move_to"),
                         (int)cm_status_int(doc, "moved")),
                     0);
    json_decref(doc);
  }
  ck_assert_int_eq(c->move_to, 3);
  ck_assert_int_eq(c->moves, 6);
  /* A move that is none: refused, naming it. */
  ck_assert_int_eq(
      psc__client_take_layout(c, 1, 0, 2, CM_LAYOUT_RULE_BUCKETS, 3, 5000),
      CM_EPROTO);
  ck_assert_msg(strstr(psc__client_error(c), "moving to 3 shards after 5000 "
                                             "moves, which is no move"),
                "%s", psc__client_error(c));
  ck_assert_int_eq(c->moves, 6);
}
END_TEST

static Suite *relayout_suite(void) {
  Suite *s = suite_create("client-relayout");
  TCase *tc = tcase_create("message");
  tcase_add_test(tc, parse_good);
  tcase_add_test(tc, parse_malformed);
  tcase_add_test(tc, is_moved);
  suite_add_tcase(s, tc);
  tc = tcase_create("replan");
  tcase_add_checked_fixture(tc, open_client, close_client);
  tcase_add_test(tc, caller_names_layout);
  tcase_add_test(tc, count_out_of_range);
  tcase_add_test(tc, rows_rule_followed);
  tcase_add_test(tc, replaced_like_reshard);
  tcase_add_test(tc, only_pending_recut);
  tcase_add_test(tc, moved_twice);
  tcase_add_test(tc, table_ids_regrouped);
  tcase_add_test(tc, move_steps_followed);
  tcase_add_test(tc, move_outside_pool_and_newest_kept);
  tcase_add_test(tc, table_plan_during_move);
  tcase_add_test(tc, status_layouts_newest_kept);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(relayout_suite(), TU_NOFORK); }
