/* sparse-mem: the in-memory baseline of bench sparse. One process, one
 * thread, psd's own table (ps-server/psd/store/table.h) and no network: fills a
 * table of dim D (adagrad, the spec's settings for bench/D) with ROWS ids,
 * then pulls batches of BATCH Zipf-distributed ids (zipf.h, the stream
 * pstool sparse draws) for S seconds, then pushes such batches for S
 * seconds. Prints
 *   sparse_mem dim=D rows=N batch=B pull_rows_per_s=P push_rows_per_s=Q
 *     bytes=M raw_bytes=R overhead=M/R
 * Usage: sparse-mem DIM ROWS SECONDS [BATCH] */
#include <stdio.h>
#include <stdlib.h>

#include "clock.h"
#include "table.h"
#include "zipf.h"

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: sparse-mem DIM ROWS SECONDS [BATCH]\n");
    return 2;
  }
  uint32_t dim = (uint32_t)strtoul(argv[1], NULL, 10);
  uint64_t nrows = strtoull(argv[2], NULL, 10), state = 0x5eed;
  double secs = atof(argv[3]);
  size_t batch = argc > 4 ? strtoull(argv[4], NULL, 10) : 1024, fill = 8192;
  struct cm_table_conf conf;
  struct psd_table *t = NULL;
  struct psd_table_stats st;
  char err[256];
  cm_table_conf_defaults(&conf);
  snprintf(conf.name, sizeof conf.name, "bench/%u", dim);
  conf.dim = dim;
  conf.opt.type = CM_ROWOPT_ADAGRAD;
  uint64_t *ids = malloc((fill > batch ? fill : batch) * sizeof *ids);
  float *rows = malloc((fill > batch ? fill : batch) * dim * sizeof *rows);
  if (!dim || !nrows || secs <= 0 || !ids || !rows ||
      psd_table_new(&t, &conf, 1, err, sizeof err)) {
    fprintf(stderr, "sparse-mem: bad arguments or out of memory\n");
    return 1;
  }
  for (size_t i = 0; i < batch * dim; i++)
    rows[i] = 1e-3f * (float)((i % 7) + 1);
  for (uint64_t r = 1; r <= nrows;) {
    size_t n = 0;
    for (; n < fill && r <= nrows; r++)
      ids[n++] = zipf_id(r);
    if (psd_table_pull(t, ids, n, rows))
      return 1;
  }
  double rate[2];
  uint64_t *pool = zipf_pool(state, nrows, 1.1);
  size_t at = 0;
  if (!pool)
    return 1;
  for (int ph = 0; ph < 2; ph++) {
    uint64_t moved = 0;
    double t0 = cm_mono_ms(), until = t0 + secs * 1000.0;
    while (cm_mono_ms() < until) {
      for (size_t i = 0; i < batch; i++, at++)
        ids[i] = pool[at % ZIPF_POOL];
      if (ph == 0 ? psd_table_pull(t, ids, batch, rows)
                  : psd_table_push(t, ids, batch, rows, 1.0f, 1))
        return 1;
      moved += batch;
    }
    rate[ph] = (double)moved / ((cm_mono_ms() - t0) / 1000.0);
  }
  psd_table_stats(t, &st);
  printf("sparse_mem dim=%u rows=%llu batch=%zu pull_rows_per_s=%.0f "
         "push_rows_per_s=%.0f bytes=%llu raw_bytes=%llu overhead=%.3f\n",
         dim, (unsigned long long)st.rows, batch, rate[0], rate[1],
         (unsigned long long)st.bytes, (unsigned long long)st.raw_bytes,
         st.raw_bytes ? (double)st.bytes / (double)st.raw_bytes : 0.0);
  psd_table_free(t);
  free(pool);
  free(ids);
  free(rows);
  return 0;
}
