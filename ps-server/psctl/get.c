/* psctl get: a variable's values, read from every shard that holds the
 * rows asked for (psc__client_read, all shards at once) and assembled in
 * row order; or, with --stats, their count, min, max, mean, L2 norm and
 * NaNs. Rows of a shard that is down are named as missing. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "err.h"
#include "grid.h"
#include "psclient.h"
#include "psctl.h"

/* `get` fits its value lines into this many columns (at least one value). */
#define LINE_WIDTH 80

/* "# rows [a, b) missing: ps:S (address) did not answer" per entry of a
 * `missing` list. */
static void print_missing(json_t *missing) {
  json_t *e;
  size_t i;
  json_array_foreach(missing, i, e) {
    json_t *r = json_object_get(e, "rows");
    printf("# rows [%lld, %lld) missing: ps:%lld (%s) did not answer\n",
           json_integer_value(json_array_get(r, 0)),
           json_integer_value(json_array_get(r, 1)), cm_status_int(e, "shard"),
           cm_status_str(e, "address"));
  }
}

/* Parses "A:B", "A:" or ":B" into [*a, *b) (*b = -1 when open). */
static int parse_rows(const char *s, int64_t *a, int64_t *b) {
  const char *colon = strchr(s, ':');
  char *end;
  *a = 0;
  *b = -1;
  if (!colon || strchr(colon + 1, ':'))
    return CM_EINVAL;
  if (colon > s) {
    if (s[0] < '0' || s[0] > '9')
      return CM_EINVAL;
    errno = 0;
    *a = strtoll(s, &end, 10);
    if (errno || end != colon)
      return CM_EINVAL;
  }
  if (colon[1]) {
    if (colon[1] < '0' || colon[1] > '9')
      return CM_EINVAL;
    errno = 0;
    *b = strtoll(colon + 1, &end, 10);
    if (errno || *end || *b <= *a)
      return CM_EINVAL;
  }
  return 0;
}

/* A float as JSON: a number, or "NaN" / "Infinity" / "-Infinity". */
static json_t *num_json(double x) {
  if (isnan(x))
    return json_string("NaN");
  if (isinf(x))
    return json_string(x > 0 ? "Infinity" : "-Infinity");
  return json_real(x);
}

/* Nested lists of a row's elements, shaped like shape[dim..]. */
static json_t *row_json(const float *x, json_t *shape, size_t dim) {
  json_t *a = json_array();
  size_t n = json_integer_value(json_array_get(shape, dim)), stride = 1;
  for (size_t d = dim + 1; d < json_array_size(shape); d++)
    stride *= json_integer_value(json_array_get(shape, d));
  for (size_t i = 0; i < n; i++)
    json_array_append_new(a, dim + 1 < json_array_size(shape)
                                 ? row_json(x + i * stride, shape, dim + 1)
                                 : num_json(x[i]));
  return a;
}

/* What --stats prints. */
struct stats {
  uint64_t elements; /* elements read */
  uint64_t nan;      /* of them NaN */
  double min, max;   /* over the others */
  double sum, sumsq; /* over the others, in element order, in double */
};

static void stats_add(struct stats *st, const float *x, uint64_t n) {
  for (uint64_t i = 0; i < n; i++) {
    double v = x[i];
    st->elements++;
    if (isnan(v)) {
      st->nan++;
      continue;
    }
    if (st->elements - st->nan == 1 || v < st->min)
      st->min = v;
    if (st->elements - st->nan == 1 || v > st->max)
      st->max = v;
    st->sum += v;
    st->sumsq += v * v;
  }
}

int psctl_cmd_get(struct psctl *p) {
  const struct cm_spec *spec = p->spec;
  struct psctl_var_map m = {0};
  struct psc__read *reads = NULL;
  unsigned char *have = NULL; /* per row in [a, b): it arrived */
  float *x = NULL;
  json_t *root = NULL, *missing;
  int64_t a, b;
  int nreads = 0, rc = 0;
  const char *name;

  if (p->argc != 1) {
    fprintf(stderr, "psctl: get takes one variable name (got %d operands)\n",
            p->argc);
    return PSCTL_EXIT_USAGE;
  }
  name = p->argv[0];
  if (p->rows && parse_rows(p->rows, &a, &b)) {
    fprintf(stderr,
            "psctl: --rows '%s': expected A:B, rows A (included) to B "
            "(excluded) with 0 <= A < B; A or B may be left out\n",
            p->rows);
    return PSCTL_EXIT_USAGE;
  }
  if (!p->rows) {
    a = 0;
    b = -1; /* every row */
  }
  if ((rc = psctl_map_var(p, name, &m)) == CM_ENOENT)
    return psctl_no_such_var(p, name);
  if (rc)
    goto out;
  if (b < 0)
    b = m.rows;
  if (b > m.rows || a >= b) {
    fprintf(stderr,
            "psctl: --rows '%s': variable '%s' has %lld rows; expected A:B "
            "with 0 <= A < B <= %lld\n",
            p->rows ? p->rows : ":", name, (long long)m.rows,
            (long long)m.rows);
    rc = PSCTL_EXIT_USAGE;
    goto out;
  }
  if (!(x = calloc((size_t)((b - a) * m.row_len) + 1, sizeof *x)) ||
      !(have = calloc((size_t)(b - a), 1)) ||
      !(reads = calloc(spec->nps, sizeof *reads))) {
    rc = CM_ENOMEM;
    goto out;
  }
  for (int s = 0; s < spec->nps; s++) {
    int64_t lo = m.begin[s] > a ? m.begin[s] : a;
    int64_t hi = m.end[s] < b ? m.end[s] : b;
    if (lo >= hi || !m.slice[s])
      continue;
    reads[nreads++] =
        (struct psc__read){.shard = s,
                           .name = m.name,
                           .offset = (uint64_t)lo * m.row_len,
                           .count = (uint64_t)(hi - lo) * m.row_len,
                           .dst = x + (uint64_t)(lo - a) * m.row_len};
  }
  psc__client_read(p->client, reads, nreads);
  for (int i = 0; i < nreads; i++) {
    const struct psc__read *r = &reads[i];
    int64_t lo = (int64_t)(r->offset / m.row_len);
    if (r->rc) {
      fprintf(stderr, "psctl: %s\n", r->err);
      continue;
    }
    memset(have + (lo - a), 1, (size_t)(r->count / m.row_len));
  }
  /* Missing runs of rows, each with the shard that holds it. */
  missing = json_array();
  for (int s = 0; s < spec->nps; s++) {
    int64_t lo = m.begin[s] > a ? m.begin[s] : a;
    int64_t hi = m.end[s] < b ? m.end[s] : b;
    if (lo < hi && !have[lo - a])
      json_array_append_new(missing,
                            json_pack("{s:[I, I], s:i, s:s}", "rows",
                                      (json_int_t)lo, (json_int_t)hi, "shard",
                                      s, "address", spec->ps[s].text));
  }
  root = json_pack("{s:s, s:O, s:s, s:[I, I], s:o}", "name", m.name, "shape",
                   m.shape, "dtype", "f32", "rows", (json_int_t)a,
                   (json_int_t)b, "missing", missing);
  if (p->stats) {
    struct stats st = {0};
    uint64_t finite;
    for (int64_t r = a; r < b; r++)
      if (have[r - a])
        stats_add(&st, x + (uint64_t)(r - a) * m.row_len, m.row_len);
    finite = st.elements - st.nan;
    json_object_set_new(
        root, "stats",
        json_pack("{s:I, s:I, s:o, s:o, s:o, s:o}", "elements",
                  (json_int_t)st.elements, "nan", (json_int_t)st.nan, "min",
                  finite ? num_json(st.min) : json_null(), "max",
                  finite ? num_json(st.max) : json_null(), "mean",
                  finite ? num_json(st.sum / finite) : json_null(), "l2",
                  num_json(sqrt(st.sumsq))));
    if (!p->json) {
      struct psctl_grid t;
      psctl_grid_init(&t, 8, "VARIABLE", "ROWS", ">ELEMENTS", ">MIN", ">MAX",
                      ">MEAN", ">L2 NORM", ">NAN");
      psctl_grid_cell(&t, "%s", m.name);
      psctl_grid_cell(&t, "[%lld, %lld)", (long long)a, (long long)b);
      psctl_grid_cell(&t, "%llu", (unsigned long long)st.elements);
      psctl_grid_cell(&t, "%.9g", finite ? st.min : NAN);
      psctl_grid_cell(&t, "%.9g", finite ? st.max : NAN);
      psctl_grid_cell(&t, "%.9g", finite ? st.sum / finite : NAN);
      psctl_grid_cell(&t, "%.9g", sqrt(st.sumsq));
      psctl_grid_cell(&t, "%llu", (unsigned long long)st.nan);
      rc = psctl_grid_print(&t);
      print_missing(missing);
    }
  } else if (p->json) {
    json_t *vals = json_array();
    int one_d = json_array_size(m.shape) == 1;
    for (int64_t r = a; r < b; r++) {
      const float *row = x + (uint64_t)(r - a) * m.row_len;
      json_array_append_new(vals, !have[r - a] ? json_null()
                                  : one_d      ? num_json(row[0])
                                               : row_json(row, m.shape, 1));
    }
    json_object_set_new(root, "values", vals);
  } else {
    char shape[64], buf[32];
    int w = 1, per_line, one_d = json_array_size(m.shape) == 1;
    int iw = snprintf(buf, sizeof buf, "%lld", (long long)(b - 1));
    psctl_shape_text(m.shape, shape, sizeof shape);
    printf("# %s %s f32, rows [%lld, %lld), ", m.name, shape, (long long)a,
           (long long)b);
    if (one_d)
      printf("each line led by its first value's index\n");
    else
      printf("each row led by its index\n");
    for (int64_t r = a; r < b; r++)
      for (uint64_t k = 0; have[r - a] && k < m.row_len; k++) {
        int len = snprintf(buf, sizeof buf, "%.9g",
                           x[(uint64_t)(r - a) * m.row_len + k]);
        w = len > w ? len : w;
      }
    /* As many right-aligned values per line as fit LINE_WIDTH; a long row
     * goes on over indented lines. */
    per_line = (LINE_WIDTH - iw - 1) / (w + 1);
    if (per_line < 1)
      per_line = 1;
    for (int64_t r = a; r < b;) {
      if (!have[r - a]) {
        /* A run of missing rows, one line per shard that holds them. */
        int s = 0;
        int64_t e = r;
        while (s < spec->nps && !(m.begin[s] <= r && r < m.end[s]))
          s++;
        while (e < b && !have[e - a] && (s == spec->nps || e < m.end[s]))
          e++;
        printf("# rows [%lld, %lld) missing: ps:%d (%s) did not answer\n",
               (long long)r, (long long)e, s,
               s < spec->nps ? spec->ps[s].text : "?");
        r = e;
        continue;
      }
      if (one_d) {
        int64_t e = r + per_line;
        printf("%*lld:", iw, (long long)r);
        for (; r < e && r < b && have[r - a]; r++)
          printf(" %*.9g", w, x[r - a]);
        printf("\n");
        continue;
      }
      printf("%*lld:", iw, (long long)r);
      for (uint64_t k = 0; k < m.row_len; k++) {
        if (k > 0 && k % per_line == 0)
          printf("\n%*s", iw + 1, "");
        printf(" %*.9g", w, x[(uint64_t)(r - a) * m.row_len + k]);
      }
      printf("\n");
      r++;
    }
  }
  if (p->json && !rc) {
    json_object_set_new(root, "down", psctl_down_json(p));
    rc = psctl_print_json(root);
  } else if (!rc) {
    psctl_print_down(p);
  }
  for (int i = 0; i < nreads && !rc; i++)
    if (reads[i].rc)
      rc = 1;
out:
  json_decref(root);
  free(reads);
  free(have);
  free(x);
  psctl_map_free(&m);
  return psctl_finish(p, rc);
}
