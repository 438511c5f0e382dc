/* Embedding tables through the public API (psd/client.h): declare, and
 * sparse pulls and pushes of rows, one table's or many tables' in one run,
 * async or staged for a sync step. */
#include "api_internal.h"

#include <stdlib.h>

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

/* The public psc_rows as the internal client's (the same fields), into
 * *out, a fresh array (caller frees), after checking each entry. Returns 0,
 * or PSC_EINVAL naming the entry missing a table, ids or its rows. */
static int many_take(psc_client *c, const struct psc_rows *r, int n, int push,
                     struct psc__rows **out) {
  const char *what = push ? "push_rows_many" : "pull_rows_many";
  struct psc__rows *in;
  *out = NULL;
  if (n < 0 || (n > 0 && !r))
    return psc__fail(c, PSC_EINVAL, "%s: %d tables and no psc_rows", what, n);
  if (!(in = calloc((size_t)n + 1, sizeof *in)))
    return psc__fail(c, PSC_ENOMEM, "%s: out of memory", what);
  for (int i = 0; i < n; i++) {
    if (!r[i].table ||
        (r[i].n > 0 && (!r[i].ids || !(push ? (const void *)r[i].grads
                                            : (const void *)r[i].rows)))) {
      psc__fail(c, PSC_EINVAL, "%s: entry %d ('%s') has no %s", what, i,
                r[i].table ? r[i].table : "(null)",
                !r[i].table ? "table"
                : !r[i].ids ? "ids"
                : push      ? "gradients"
                            : "rows");
      free(in);
      return PSC_EINVAL;
    }
    in[i] = (struct psc__rows){.table = r[i].table,
                               .ids = r[i].ids,
                               .n = r[i].n,
                               .rows = r[i].rows,
                               .grads = r[i].grads};
  }
  *out = in;
  return 0;
}

int psc_pull_rows_many(psc_client *c, struct psc_rows *r, int n,
                       uint64_t min_version) {
  struct psc__rows *in;
  int rc;
  psc__begin(c);
  if ((rc = many_take(c, r, n, 0, &in)))
    return rc;
  rc = min_version ? psc__client_pull_rows_at(c->cl, in, n, min_version)
                   : psc__client_pull_rows(c->cl, in, n);
  free(in);
  return rc;
}

int psc_push_rows_many(psc_client *c, const struct psc_rows *r, int n,
                       uint64_t step, int *closed) {
  struct psc__rows *in;
  int cl = 0, rc;
  psc__begin(c);
  if ((rc = many_take(c, r, n, 1, &in)))
    return rc;
  rc = step ? psc__client_push_rows_step(c->cl, in, n, step, &cl)
            : psc__client_push_rows(c->cl, in, n);
  free(in);
  if (closed)
    *closed = cl;
  return rc;
}
