/* Sparse calls on embedding tables (psclient.h, "embedding tables"): a
 * STUB until the real calls land; every call fails CM_EINVAL. */
#include <stdio.h>

#include "client_internal.h"
#include "err.h"

int dw_client_declare_tables(struct dw_client *c, const struct dw_table *tables,
                             int n) {
  (void)c, (void)tables, (void)n;
  return CM_EINVAL;
}

int dw_client_shard_of(const struct dw_client *c, uint64_t id) {
  (void)c, (void)id;
  return 0;
}

int dw_client_pull_rows(struct dw_client *c, struct dw_rows *r, int nr) {
  (void)c, (void)r, (void)nr;
  return CM_EINVAL;
}

int dw_client_push_rows(struct dw_client *c, const struct dw_rows *r, int nr) {
  (void)c, (void)r, (void)nr;
  return CM_EINVAL;
}

int dw_client_pull_rows_at(struct dw_client *c, struct dw_rows *r, int nr,
                           uint64_t min_version) {
  (void)c, (void)r, (void)nr, (void)min_version;
  return CM_EINVAL;
}

int dw_client_push_rows_step(struct dw_client *c, const struct dw_rows *r,
                             int nr, uint64_t step, int *closed) {
  (void)c, (void)r, (void)nr, (void)step, (void)closed;
  return CM_EINVAL;
}
