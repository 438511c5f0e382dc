/* A serving task's rows of one embedding table (docs/serving.md): values
 * only. A row is its id and dim floats, nothing else: no optimizer state,
 * no statistics, no change generation, so that a serving shard holds at
 * most about 0.6x the bytes a training shard (table.h) holds for the same
 * rows (0.5x at dim 16 with adagrad; tests/unit/test-serve-table.c).
 *
 * Stored as table.c's, by the same engine (rows.h): records in fixed-size
 * slabs that never move, and an open-addressing index of record numbers,
 * split into stripes by a hash of the id so that an index grows one stripe
 * at a time. Unlike table.c the stripes hold no lock: a serving task
 * changes its rows only while it applies a publication, and it does so
 * holding its one table-wide lock
 * exclusively (serve.h), while every Lookup holds it shared; every call
 * here needs the caller to hold that lock (shared for the readers,
 * exclusively for the writers). */
#ifndef PSD_SERVE_TABLE_H
#define PSD_SERVE_TABLE_H

#include <stddef.h>
#include <stdint.h>

struct psd_serve_table;

/* An empty table of rows of dim floats. Returns 0, CM_EINVAL for dim 0,
 * CM_ENOMEM. */
int psd_serve_table_new(struct psd_serve_table **out, uint32_t dim);
void psd_serve_table_free(struct psd_serve_table *t);

uint32_t psd_serve_table_dim(const struct psd_serve_table *t);

/* Writer: sets the rows of ids[0..n) to values (n x dim floats), creating
 * those not held. Returns 0, or CM_ENOMEM (the rows before the failing one
 * are set). */
int psd_serve_table_upsert(struct psd_serve_table *t, const uint64_t *ids,
                           size_t n, const float *values);

/* Writer: drops the rows of ids[0..n); ids not held are ignored. Their
 * records are reused by later upserts. */
void psd_serve_table_remove(struct psd_serve_table *t, const uint64_t *ids,
                            size_t n);

/* Writer: drops every row, keeping the memory for the rows that follow (a
 * full publication replaces the table). */
void psd_serve_table_clear(struct psd_serve_table *t);

/* Writer: drops the rows whose id drop(ctx, id) says to (nonzero). Returns
 * the rows dropped. */
uint64_t psd_serve_table_drop_if(struct psd_serve_table *t,
                                 int (*drop)(void *ctx, uint64_t id),
                                 void *ctx);

/* Reader: copies the rows of ids[0..n) into out (n x dim floats, in
 * request order); found[i] gets 1 for a row held, 0 (its out row left as
 * it was) for one that is not. Returns the number not held. */
size_t psd_serve_table_lookup(const struct psd_serve_table *t,
                              const uint64_t *ids, size_t n, float *out,
                              uint8_t *found);

/* Reader: rows held, and the memory held for them (slabs, indexes, free
 * lists: everything allocated). */
uint64_t psd_serve_table_rows(const struct psd_serve_table *t);
uint64_t psd_serve_table_bytes(const struct psd_serve_table *t);

#endif
