/* Latency histograms with fixed buckets, cheap enough for every call: an
 * * observation is a scan of 16 bounds and two relaxed atomic adds, with no
 * lock and no allocation. Bounds run from 50 us to 5 s (1-2.5-5 steps), as
 * Prometheus histograms expect them: a count per bucket plus a sum. */
#ifndef PSD_HIST_H
#define PSD_HIST_H

#include <stdatomic.h>
#include <stdint.h>

/* Upper bounds of the buckets, seconds; one more bucket holds the rest. */
#define PSD_HIST_BOUNDS 16

/* One histogram. Zero-initialised memory is an empty histogram; it owns
 * nothing, so it needs no free. */
struct psd_hist {
  atomic_uint_fast64_t counts[PSD_HIST_BOUNDS + 1]; /* per bucket, last +Inf */
  atomic_uint_fast64_t sum_ns; /* sum of the observations, nanoseconds */
};

/* The bucket bounds in seconds, ascending, PSD_HIST_BOUNDS of them (static
 * storage). */
const double *psd_hist_bounds(void);

/* Counts one observation of `seconds` (negative counts as 0). */
void psd_hist_observe(struct psd_hist *h, double seconds);

/* Copies the counts (PSD_HIST_BOUNDS + 1 entries) and the sum in seconds;
 * returns the number of observations, the sum of the copied counts, so a
 * snapshot is always consistent with itself. */
uint64_t psd_hist_read(const struct psd_hist *h, uint64_t *counts, double *sum);

#endif
