/* A serving task's values-only table (serve_table.h): rows set, looked up
 * (found flags, rows not held left alone, duplicates answered each time),
 * a full publication's clear and refill, a delta's upserts and removes
 * (over every stripe, with the index's backward shifts, against a plain
 * model), and the memory it holds against a training shard's table of the
 * same rows (adagrad, dim 16): at most 0.6x. And the storage engine both
 * tables stand on (rows.h) at its edges: records removed either side of a
 * slab boundary reused first, the index grown after removals, a clear, a
 * removal in a probe run that wraps past the index's end. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "rows.h"
#include "serve_table.h"
#include "table.h"
#include "unit.h"

/* Row j of id: a value that names both. */
static float val(uint64_t id, uint32_t j) {
  return (float)(id % 100003) + (float)j / 64.0f;
}

static void rows_of(const uint64_t *ids, size_t n, uint32_t dim, float *out) {
  for (size_t i = 0; i < n; i++)
    for (uint32_t j = 0; j < dim; j++)
      out[i * dim + j] = val(ids[i], j);
}

START_TEST(upsert_and_lookup) {
  struct psd_serve_table *t;
  uint64_t ids[3] = {7, 1ull << 63, 42}, ask[4] = {42, 5, 7, 42};
  float v[12], out[16];
  uint8_t found[4];
  ck_assert_int_eq(psd_serve_table_new(&t, 0), CM_EINVAL);
  ck_assert_int_eq(psd_serve_table_new(&t, 4), 0);
  ck_assert_uint_eq(psd_serve_table_dim(t), 4);
  rows_of(ids, 3, 4, v);
  ck_assert_int_eq(psd_serve_table_upsert(t, ids, 3, v), 0);
  ck_assert_uint_eq(psd_serve_table_rows(t), 3);
  for (int i = 0; i < 16; i++)
    out[i] = -1;
  ck_assert_uint_eq(psd_serve_table_lookup(t, ask, 4, out, found), 1);
  ck_assert(found[0] && !found[1] && found[2] && found[3]);
  ck_assert(!memcmp(out, v + 8, 16));
  ck_assert(!memcmp(out + 12, v + 8, 16)); /* a duplicate, answered again */
  ck_assert(!memcmp(out + 8, v, 16));
  ck_assert(out[4] == -1 && out[7] == -1); /* not held: left alone */
  /* An upsert of a held row replaces its value, one row still. */
  v[8] = 0.5f;
  ck_assert_int_eq(psd_serve_table_upsert(t, ids + 2, 1, v + 8), 0);
  ck_assert_uint_eq(psd_serve_table_rows(t), 3);
  psd_serve_table_lookup(t, ask, 1, out, found);
  ck_assert(found[0] && out[0] == 0.5f);
  psd_serve_table_free(t);
}
END_TEST

/* A full publication: clear, then the new rows; the old ones are gone. */
START_TEST(full_replaces) {
  struct psd_serve_table *t;
  enum { N = 5000 };
  uint64_t *ids = malloc(N * sizeof *ids);
  float *v = malloc(N * 8 * sizeof *v), *out = malloc(N * 8 * sizeof *out);
  uint8_t *found = malloc(N);
  ck_assert_int_eq(psd_serve_table_new(&t, 8), 0);
  for (size_t i = 0; i < N; i++)
    ids[i] = i * 3;
  rows_of(ids, N, 8, v);
  ck_assert_int_eq(psd_serve_table_upsert(t, ids, N, v), 0);
  uint64_t bytes = psd_serve_table_bytes(t);
  psd_serve_table_clear(t);
  ck_assert_uint_eq(psd_serve_table_rows(t), 0);
  ck_assert_uint_eq(psd_serve_table_lookup(t, ids, N, out, found), N);
  for (size_t i = 0; i < N; i++)
    ids[i] = i * 3 + 1;
  rows_of(ids, N, 8, v);
  ck_assert_int_eq(psd_serve_table_upsert(t, ids, N, v), 0);
  ck_assert_uint_eq(psd_serve_table_rows(t), N);
  /* the memory of the rows before is reused, not added to (a stripe may
   * take a slab more: the new ids spread over the stripes otherwise) */
  ck_assert_uint_le(psd_serve_table_bytes(t), bytes + bytes / 10);
  ck_assert_uint_eq(psd_serve_table_lookup(t, ids, N, out, found), 0);
  ck_assert(!memcmp(out, v, N * 8 * sizeof *v));
  ids[0] = 0;
  ck_assert_uint_eq(psd_serve_table_lookup(t, ids, 1, out, found), 1);
  psd_serve_table_free(t);
  free(ids);
  free(v);
  free(out);
  free(found);
}
END_TEST

/* Deltas: random upserts and removes against a model (an array by id);
 * after each, every id's found flag and row agree with the model. */
START_TEST(delta_against_model) {
  enum { IDS = 20000, ROUNDS = 30, DIM = 3 };
  struct psd_serve_table *t;
  uint8_t *held = calloc(IDS, 1), *found = malloc(IDS);
  float *model = calloc((size_t)IDS * DIM, sizeof *model);
  float *out = malloc((size_t)IDS * DIM * sizeof *out);
  uint64_t *all = malloc(IDS * sizeof *all), *ids = malloc(IDS * sizeof *ids);
  float *v = malloc((size_t)IDS * DIM * sizeof *v);
  unsigned seed = 11;
  ck_assert_int_eq(psd_serve_table_new(&t, DIM), 0);
  for (size_t i = 0; i < IDS; i++)
    all[i] = i * 0x9e3779b97f4a7c15ull; /* spread over every stripe */
  for (int r = 0; r < ROUNDS; r++) {
    size_t n = 0;
    for (size_t i = 0; i < IDS; i++)
      if (rand_r(&seed) % 4 == 0)
        ids[n++] = i;
    /* first half upserted, second half removed */
    size_t up = n / 2;
    for (size_t k = 0; k < up; k++) {
      size_t i = ids[k];
      for (int j = 0; j < DIM; j++)
        v[k * DIM + j] = model[i * DIM + j] = (float)(r * 7 + j) + i;
      held[i] = 1;
      ids[k] = all[i];
    }
    ck_assert_int_eq(psd_serve_table_upsert(t, ids, up, v), 0);
    for (size_t k = up; k < n; k++) {
      held[ids[k]] = 0;
      ids[k] = all[ids[k]];
    }
    psd_serve_table_remove(t, ids + up, n - up);
    size_t nheld = 0;
    for (size_t i = 0; i < IDS; i++)
      nheld += held[i];
    ck_assert_uint_eq(psd_serve_table_rows(t), nheld);
    ck_assert_uint_eq(psd_serve_table_lookup(t, all, IDS, out, found),
                      IDS - nheld);
    for (size_t i = 0; i < IDS; i++) {
      ck_assert_int_eq(found[i], held[i]);
      if (held[i])
        ck_assert(!memcmp(out + i * DIM, model + i * DIM, DIM * sizeof *out));
    }
  }
  psd_serve_table_free(t);
  free(held);
  free(found);
  free(model);
  free(out);
  free(all);
  free(ids);
  free(v);
}
END_TEST

/* The bound: a serving shard holds at most 0.6x its training
 * shard's bytes for the same rows (adagrad, dim 16), at several sizes (a
 * stripe's index doubles at different points). */
START_TEST(memory_ratio) {
  static const size_t sizes[] = {10000, 60000, 200000};
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
    size_t n = sizes[s];
    struct cm_table_conf c;
    struct psd_table *train;
    struct psd_serve_table *serve;
    struct psd_table_stats st;
    char err[256];
    uint64_t *ids = malloc(n * sizeof *ids);
    float *v = malloc(n * 16 * sizeof *v);
    cm_table_conf_defaults(&c);
    strcpy(c.name, "emb");
    c.dim = 16;
    c.opt.type = CM_ROWOPT_ADAGRAD;
    ck_assert_int_eq(psd_table_new(&train, &c, 1, err, sizeof err), 0);
    ck_assert_int_eq(psd_serve_table_new(&serve, 16), 0);
    for (size_t i = 0; i < n; i++)
      ids[i] = i * 7 + 3;
    ck_assert_int_eq(psd_table_pull(train, ids, n, v), 0); /* creates them */
    ck_assert_int_eq(psd_serve_table_upsert(serve, ids, n, v), 0);
    psd_table_stats(train, &st);
    ck_assert_uint_eq(st.rows, n);
    ck_assert_uint_eq(psd_serve_table_rows(serve), n);
    double ratio = (double)psd_serve_table_bytes(serve) / (double)st.bytes;
    ck_assert_msg(ratio <= 0.6,
                  "%zu rows: serving %llu bytes, training %llu: "
                  "%.3f > 0.6",
                  n, (unsigned long long)psd_serve_table_bytes(serve),
                  (unsigned long long)st.bytes, ratio);
    psd_table_free(train);
    psd_serve_table_free(serve);
    free(ids);
    free(v);
  }
}
END_TEST

/* id's record in r, or -1 (its hash computed here). */
static long rows_find(const struct psd_rows *r, uint64_t id) {
  return psd_rows_find(r, id, psd_rows_hash(id));
}

/* The engine alone (one stripe, records of an id and a u64): rows 0..299
 * take records 0..299 (two slabs); removing 255 and 256 (the last of slab
 * 0, the first of slab 1) and 10 frees those records, and the next rows
 * take exactly them, last removed first, in no new slab. Then a third of
 * the rows are removed and new ones added until the index has doubled
 * twice: every freed record is taken before a new one, the removed rows
 * stay gone, every held row is found in its own record. A clear keeps the
 * memory and starts again from record 0. */
START_TEST(engine_slab_reuse_and_growth) {
  enum { N = 300, MORE = 1200 };
  struct psd_rows r;
  static uint64_t id[N + MORE];
  static uint8_t held[N + MORE];
  psd_rows_init(&r, 16);
  for (size_t i = 0; i < N + MORE; i++)
    id[i] = i * 0x9e3779b97f4a7c15ull + 1;
  for (size_t i = 0; i < N; i++) {
    ck_assert_int_eq(psd_rows_add(&r, id[i], psd_rows_hash(id[i])), (long)i);
    memcpy(psd_rows_at(&r, i) + 8, &i, sizeof i);
    held[i] = 1;
  }
  ck_assert_uint_eq(psd_rows_used(&r), N);
  uint64_t bytes = psd_rows_bytes(&r);
  ck_assert_uint_eq(bytes,
                    2 * PSD_ROWS_SLAB * 16 + 16 * sizeof(void *) + r.icap * 4);
  static const size_t gone[3] = {255, 256, 10};
  for (int g = 0; g < 3; g++) {
    uint64_t x = id[gone[g]];
    ck_assert_int_eq(psd_rows_remove(&r, x, psd_rows_hash(x)), (long)gone[g]);
    held[gone[g]] = 0;
  }
  ck_assert_int_eq(psd_rows_remove(&r, id[255], psd_rows_hash(id[255])), -1);
  ck_assert_uint_eq(psd_rows_live(&r), N - 3);
  for (size_t i = 0; i < N; i++) {
    ck_assert_int_eq(rows_find(&r, id[i]), held[i] ? (long)i : -1);
    if (held[i]) /* the others' bytes untouched */
      ck_assert(!memcmp(psd_rows_at(&r, i) + 8, &i, sizeof i));
  }
  for (int g = 2; g >= 0; g--) {
    size_t i = N + (size_t)(2 - g);
    ck_assert_int_eq(psd_rows_add(&r, id[i], psd_rows_hash(id[i])),
                     (long)gone[g]);
    held[i] = 1;
  }
  ck_assert_uint_eq(psd_rows_used(&r), N);
  ck_assert_uint_eq(psd_rows_bytes(&r), bytes + 64 * 4); /* the free list */
  /* A third removed, then rows added until the index is 4x as large. */
  size_t icap = r.icap, next = N + 3, freed = 0;
  for (size_t i = 0; i < N + 3; i += 3)
    if (held[i]) {
      ck_assert_int_ge(psd_rows_remove(&r, id[i], psd_rows_hash(id[i])), 0);
      held[i] = 0;
      freed++;
    }
  for (; r.icap < 4 * icap; next++) {
    ck_assert_uint_lt(next, N + MORE);
    long k = psd_rows_add(&r, id[next], psd_rows_hash(id[next]));
    ck_assert_int_ge(k, 0);
    ck_assert_int_eq(k >= N, next - (N + 3) >= freed);
    held[next] = 1;
  }
  size_t live = 0;
  for (size_t i = 0; i < next; i++) {
    long k = rows_find(&r, id[i]);
    ck_assert_int_eq(k >= 0, held[i]);
    if (k >= 0)
      ck_assert_uint_eq(psd_rows_id(&r, (size_t)k), id[i]);
    live += held[i];
  }
  ck_assert_uint_eq(psd_rows_live(&r), live);
  bytes = psd_rows_bytes(&r);
  psd_rows_clear(&r);
  ck_assert_uint_eq(psd_rows_live(&r), 0);
  ck_assert_uint_eq(psd_rows_used(&r), 0);
  ck_assert_int_eq(rows_find(&r, id[1]), -1);
  ck_assert_int_eq(psd_rows_add(&r, id[1], psd_rows_hash(id[1])), 0);
  ck_assert_uint_eq(psd_rows_bytes(&r), bytes);
  psd_rows_release(&r);
}
END_TEST

/* The first id from *from on whose home slot in a 64-slot index is home. */
static uint64_t id_at_home(uint64_t *from, size_t home) {
  while ((psd_rows_hash(*from) & 63) != home)
    ++*from;
  return (*from)++;
}

/* A removal in a probe run that wraps past the index's end: A at home 62,
 * B and C at home 63 (slots 63 and 0), D at home 0 (slot 1, pushed on by
 * C). Removing A leaves C and D where they are (their homes lie
 * cyclically between the hole and them); removing B then moves C to 63
 * and D to 0. Every row held is found after each. */
START_TEST(engine_wrapped_removal) {
  struct psd_rows r;
  uint64_t from = 1, a = id_at_home(&from, 62), b = id_at_home(&from, 63),
           c = id_at_home(&from, 63), d = id_at_home(&from, 0);
  uint64_t ids[4] = {a, b, c, d};
  psd_rows_init(&r, 8);
  for (int i = 0; i < 4; i++)
    ck_assert_int_eq(psd_rows_add(&r, ids[i], psd_rows_hash(ids[i])), i);
  ck_assert_uint_eq(r.icap, 64);
  ck_assert(r.index[62] == 1 && r.index[63] == 2 && r.index[0] == 3 &&
            r.index[1] == 4);
  ck_assert_int_eq(psd_rows_remove(&r, a, psd_rows_hash(a)), 0);
  ck_assert_int_eq(rows_find(&r, a), -1);
  for (int i = 1; i < 4; i++)
    ck_assert_int_eq(rows_find(&r, ids[i]), i);
  ck_assert_int_eq(psd_rows_remove(&r, b, psd_rows_hash(b)), 1);
  ck_assert(r.index[63] == 3 && r.index[0] == 4 && !r.index[1]);
  ck_assert_int_eq(rows_find(&r, c), 2);
  ck_assert_int_eq(rows_find(&r, d), 3);
  psd_rows_release(&r);
}
END_TEST

static Suite *suite(void) {
  Suite *s = suite_create("serve-table");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, upsert_and_lookup);
  tcase_add_test(tc, full_replaces);
  tcase_add_test(tc, delta_against_model);
  tcase_add_test(tc, memory_ratio);
  tcase_add_test(tc, engine_slab_reuse_and_growth);
  tcase_add_test(tc, engine_wrapped_removal);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(suite(), 0); }
