/* A serving task's values-only table (serve_table.h): a stripe of rows
 * (rows.h, the training table's storage engine) per top bits of the id's
 * hash, each record an id and dim floats. No locks here: the caller holds
 * the serving task's table-wide lock (serve.h). */
#include "serve_table.h"

#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "rows.h"

struct psd_serve_table {
  uint32_t dim;                          /* floats per row */
  struct psd_rows st[PSD_ROWS_NSTRIPES]; /* by psd_rows_stripe: records of
                                            the id, then dim floats */
};

/* A record's floats. */
static inline float *rec_val(uint8_t *rec) {
  return (float *)(void *)(rec + sizeof(uint64_t));
}

int psd_serve_table_new(struct psd_serve_table **out, uint32_t dim) {
  struct psd_serve_table *t;
  if (!dim)
    return CM_EINVAL;
  if (!(t = calloc(1, sizeof *t)))
    return CM_ENOMEM;
  t->dim = dim;
  for (int i = 0; i < PSD_ROWS_NSTRIPES; i++)
    psd_rows_init(&t->st[i],
                  (sizeof(uint64_t) + dim * sizeof(float) + 7) & ~(size_t)7);
  *out = t;
  return 0;
}

void psd_serve_table_free(struct psd_serve_table *t) {
  if (!t)
    return;
  for (int i = 0; i < PSD_ROWS_NSTRIPES; i++)
    psd_rows_release(&t->st[i]);
  free(t);
}

uint32_t psd_serve_table_dim(const struct psd_serve_table *t) { return t->dim; }

int psd_serve_table_upsert(struct psd_serve_table *t, const uint64_t *ids,
                           size_t n, const float *values) {
  size_t row = t->dim * sizeof(float);
  for (size_t i = 0; i < n; i++) {
    uint64_t h = psd_rows_hash(ids[i]);
    struct psd_rows *s = &t->st[psd_rows_stripe(h)];
    long k = psd_rows_find(s, ids[i], h);
    if (k < 0 && (k = psd_rows_add(s, ids[i], h)) < 0)
      return CM_ENOMEM;
    memcpy(rec_val(psd_rows_at(s, (size_t)k)), values + i * t->dim, row);
  }
  return 0;
}

void psd_serve_table_remove(struct psd_serve_table *t, const uint64_t *ids,
                            size_t n) {
  for (size_t i = 0; i < n; i++) {
    uint64_t h = psd_rows_hash(ids[i]);
    psd_rows_remove(&t->st[psd_rows_stripe(h)], ids[i], h);
  }
}

void psd_serve_table_clear(struct psd_serve_table *t) {
  for (int i = 0; i < PSD_ROWS_NSTRIPES; i++)
    psd_rows_clear(&t->st[i]);
}

uint64_t psd_serve_table_drop_if(struct psd_serve_table *t,
                                 int (*drop)(void *ctx, uint64_t id),
                                 void *ctx) {
  uint64_t n = 0;
  for (int i = 0; i < PSD_ROWS_NSTRIPES; i++) {
    struct psd_rows *s = &t->st[i];
    for (size_t k = 0; k < psd_rows_used(s); k++) {
      /* The records in order (their ids read in sequence); the index only
       * for those to drop: a removed record keeps its bytes, and is live
       * only where the index says. */
      uint64_t id = psd_rows_id(s, k), h;
      if (!drop(ctx, id) ||
          psd_rows_find(s, id, h = psd_rows_hash(id)) != (long)k)
        continue;
      psd_rows_remove(s, id, h);
      n++;
    }
  }
  return n;
}

size_t psd_serve_table_lookup(const struct psd_serve_table *t,
                              const uint64_t *ids, size_t n, float *out,
                              uint8_t *found) {
  size_t row = t->dim * sizeof(float), missing = 0;
  for (size_t i = 0; i < n; i++) {
    uint64_t h = psd_rows_hash(ids[i]);
    const struct psd_rows *s = &t->st[psd_rows_stripe(h)];
    long k = psd_rows_find(s, ids[i], h);
    found[i] = k >= 0;
    if (k >= 0)
      memcpy(out + i * t->dim, rec_val(psd_rows_at(s, (size_t)k)), row);
    else
      missing++;
  }
  return missing;
}

uint64_t psd_serve_table_rows(const struct psd_serve_table *t) {
  uint64_t n = 0;
  for (int i = 0; i < PSD_ROWS_NSTRIPES; i++)
    n += psd_rows_live(&t->st[i]);
  return n;
}

uint64_t psd_serve_table_bytes(const struct psd_serve_table *t) {
  uint64_t b = sizeof *t;
  for (int i = 0; i < PSD_ROWS_NSTRIPES; i++)
    b += psd_rows_bytes(&t->st[i]);
  return b;
}
