/* Embedding tables through the public API (psd/client.h): declare, and
 * sparse pulls and pushes of one table's rows, async or staged for a sync
 * step. */
#include "api_internal.h"

#include "err.h"

int psc_declare_table(psc_client *c, const char *name, uint32_t dim,
                      uint64_t id_bound) {
  struct psc__table t = {.name = name, .dim = dim, .id_bound = id_bound};
  psc__begin(c);
  return psc__client_declare_tables(c->cl, &t, 1);
}

int psc_table_dim(const psc_client *c, const char *table) {
  return psc__client_table_dim(c->cl, table);
}

int psc_pull_rows(psc_client *c, const char *table, const uint64_t *ids,
                  size_t n, float *rows, uint64_t min_version) {
  struct psc__rows r = {.table = table, .ids = ids, .n = n, .rows = rows};
  psc__begin(c);
  if (!table || (n > 0 && (!ids || !rows)))
    return psc__fail(c, PSC_EINVAL, "pull_rows: no table, ids or rows");
  if (n == 0)
    return 0;
  return min_version ? psc__client_pull_rows_at(c->cl, &r, 1, min_version)
                     : psc__client_pull_rows(c->cl, &r, 1);
}

int psc_push_rows(psc_client *c, const char *table, const uint64_t *ids,
                  size_t n, const float *grads, uint64_t step, int *closed) {
  struct psc__rows r = {.table = table, .ids = ids, .n = n, .grads = grads};
  int cl = 0, rc;
  psc__begin(c);
  if (!table || (n > 0 && (!ids || !grads)))
    return psc__fail(c, PSC_EINVAL, "push_rows: no table, ids or gradients");
  if (n == 0)
    return 0;
  rc = step ? psc__client_push_rows_step(c->cl, &r, 1, step, &cl)
            : psc__client_push_rows(c->cl, &r, 1);
  if (closed)
    *closed = cl;
  return rc;
}
