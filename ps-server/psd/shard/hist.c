/* Fixed-bucket histograms (hist.h). Writers never wait on readers: each
 * field is an independent relaxed atomic, and a reader takes the count
 * from the buckets it copied. */
#include "hist.h"

static const double bounds[PSD_HIST_BOUNDS] = {
    50e-6, 100e-6, 250e-6, 500e-6, 1e-3,   2.5e-3, 5e-3, 10e-3,
    25e-3, 50e-3,  100e-3, 250e-3, 500e-3, 1.0,    2.5,  5.0};

const double *psd_hist_bounds(void) { return bounds; }

void psd_hist_observe(struct psd_hist *h, double seconds) {
  int i = 0;
  if (seconds < 0)
    seconds = 0;
  while (i < PSD_HIST_BOUNDS && seconds > bounds[i])
    i++;
  atomic_fetch_add_explicit(&h->counts[i], 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&h->sum_ns, (uint_fast64_t)(seconds * 1e9),
                            memory_order_relaxed);
}

uint64_t psd_hist_read(const struct psd_hist *h, uint64_t *counts,
                       double *sum) {
  uint64_t n = 0;
  for (int i = 0; i <= PSD_HIST_BOUNDS; i++) {
    /* A const atomic may still be loaded; the cast only drops const. */
    counts[i] = atomic_load_explicit((atomic_uint_fast64_t *)&h->counts[i],
                                     memory_order_relaxed);
    n += counts[i];
  }
  *sum = atomic_load_explicit((atomic_uint_fast64_t *)&h->sum_ns,
                              memory_order_relaxed) /
         1e9;
  return n;
}
