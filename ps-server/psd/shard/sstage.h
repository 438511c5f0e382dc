/* Sync mode's staged sparse gradients (DESIGN.md, "One synchronous step
 * t"): a sparse push for step t does not touch its table; it is kept here
 * per worker until the coordinator's Commit(t, set). Then the staged rows of
 * exactly the set's workers are applied, per table, as one push of their
 * ids and gradients concatenated in ascending worker order (so duplicate
 * ids sum in an order that does not depend on arrival), scaled by 1 / the
 * set's size as the dense gradients are averaged (steps.h). Rows staged by
 * workers left out are dropped. */
#ifndef PSD_SSTAGE_H
#define PSD_SSTAGE_H

#include <stddef.h>
#include <stdint.h>

#include "table.h"

struct psd_sstage;

int psd_sstage_new(struct psd_sstage **out, int nworkers);
void psd_sstage_free(struct psd_sstage *s);

/* Stages worker's rows ids[0..n) (gradients g, n x the table's dim) of
 * table t for step (copied). Staging for another step than the one held
 * drops what was held (a step closed without this worker). Returns 0,
 * CM_EINVAL for a bad worker, CM_ENOMEM. */
int psd_sstage_put(struct psd_sstage *s, int worker, uint64_t step,
                   struct psd_table *t, const uint64_t *ids, size_t n,
                   const float *g);

/* Applies step's staged rows of applied[0..napplied) (ascending worker
 * indices) to their tables, with the table's last-touched step `step`,
 * and drops every row staged for step or before. Returns 0 or CM_ENOMEM
 * (nothing applied). */
int psd_sstage_commit(struct psd_sstage *s, uint64_t step, const int *applied,
                      int napplied);

/* Drops everything staged (a rollback). */
void psd_sstage_clear(struct psd_sstage *s);

/* Rows staged now, all workers (status). */
uint64_t psd_sstage_rows(struct psd_sstage *s);

#endif
