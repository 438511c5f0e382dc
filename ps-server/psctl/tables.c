/* psctl's embedding-table commands (docs/tables.md):
 *   tables                  per table and shard: rows, memory, admission
 *                           and eviction counters (Status's tables)
 *   get TABLE --ids A,B,C   each id's value, optimizer state and stats, from
 *                           the shard that holds it (Admin/Rows)
 *   top TABLE [--top K]     the K rows with the most pushes, all shards
 *   shrink TABLE            evicts by the table's rules on every shard
 *   export TABLE --out F    every stored row, gathered from all shards and
 *                           sorted by id, as safetensors: "ids" (U64, [n])
 *                           and "values" (F32, [n, dim]) */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "clock.h"
#include "err.h"
#include "grid.h"
#include "psctl.h"
#include "rowids.h"
#include "safetensors.h"
#include "units.h"

/* The table's entries in every shard's status (down shards skipped), as
 * one array; NULL (said on stderr) when no shard knows it. name NULL: every
 * table. */
static json_t *table_entries(struct psctl *p, const char *name) {
  json_t *all = json_array(), *t;
  size_t i;
  for (int s = 0; s < p->spec->nps; s++) {
    if (!p->st[s])
      continue;
    json_array_foreach(json_object_get(p->st[s], "tables"), i, t) {
      if (name && strcmp(cm_status_str(t, "name"), name))
        continue;
      json_t *e = json_deep_copy(t);
      json_object_set_new(e, "shard", json_integer(s));
      json_array_append_new(all, e);
    }
  }
  if (name && !json_array_size(all)) {
    fprintf(stderr, "psctl: no table '%s' in job '%s'%s\n", name,
            p->spec->job.name, p->down ? " on the shards that answered" : "");
    json_decref(all);
    return NULL;
  }
  return all;
}

int psctl_cmd_tables(struct psctl *p) {
  json_t *all = NULL, *root = NULL, *t;
  struct psctl_grid tb;
  size_t i;
  int rc;
  if ((rc = psctl_no_operands(p, "tables")))
    return rc;
  all = table_entries(p, NULL);
  if (p->json) {
    root = json_pack("{s:s, s:O, s:o}", "job", p->spec->job.name, "tables", all,
                     "down", psctl_down_json(p));
    rc = psctl_print_json(root);
    goto out;
  }
  psctl_grid_init(&tb, 12, "TABLE", ">DIM", "SHARD", ">ROWS", ">HELD", ">RAW",
                  ">RATIO", ">ADMITTED", ">NOT ADMITTED", ">EVICTED",
                  ">PENDING", "OPTIMIZER");
  json_array_foreach(all, i, t) {
    char held[32], raw[32];
    long long h = cm_status_int(t, "bytes"), r = cm_status_int(t, "raw_bytes");
    cm_fmt_bytes((double)h, held, sizeof held);
    cm_fmt_bytes((double)r, raw, sizeof raw);
    psctl_grid_cell(&tb, "%s", cm_status_str(t, "name"));
    psctl_grid_cell(&tb, "%lld", cm_status_int(t, "dim"));
    psctl_grid_cell(&tb, "ps:%lld", cm_status_int(t, "shard"));
    psctl_grid_cell(&tb, "%lld", cm_status_int(t, "rows"));
    psctl_grid_cell(&tb, "%s", held);
    psctl_grid_cell(&tb, "%s", raw);
    if (r > 0)
      psctl_grid_cell(&tb, "%.2f", (double)h / (double)r);
    else
      psctl_grid_cell(&tb, "-");
    psctl_grid_cell(&tb, "%lld", cm_status_int(t, "admitted"));
    psctl_grid_cell(&tb, "%lld", cm_status_int(t, "not_admitted"));
    psctl_grid_cell(&tb, "%lld", cm_status_int(t, "evicted"));
    psctl_grid_cell(&tb, "%lld", cm_status_int(t, "pending"));
    psctl_grid_cell(&tb, "%s", cm_status_str(t, "optimizer"));
  }
  rc = psctl_grid_print(&tb);
  /* Admission and eviction once per table (every shard has the same). */
  const char *last = "";
  json_array_foreach(all, i, t) {
    if (!strcmp(last, cm_status_str(t, "name")))
      continue;
    last = cm_status_str(t, "name");
    printf("%s: admission %s, eviction %s\n", last,
           cm_status_str(t, "admission"), cm_status_str(t, "eviction"));
  }
  psctl_print_down(p);
out:
  json_decref(all);
  json_decref(root);
  return psctl_finish(p, rc);
}

/* Prints one row of a Rows answer. */
static void print_row(json_t *row, json_t *state_names, int shard) {
  printf("id %llu (ps:%d): ", (unsigned long long)cm_status_int(row, "id"),
         shard);
  if (!json_is_true(json_object_get(row, "found"))) {
    printf("not stored (never pushed, not admitted yet, or evicted)\n");
    return;
  }
  printf(
      "count=%lld t=%lld last_step=%lld\n  value:", cm_status_int(row, "count"),
      cm_status_int(row, "t"), cm_status_int(row, "last_step"));
  json_t *v, *st = json_object_get(row, "state");
  size_t i, nst = json_array_size(st), parts = json_array_size(state_names);
  json_array_foreach(json_object_get(row, "value"), i, v)
      printf(" %.9g", json_real_value(v));
  printf("\n");
  /* Each part is dim floats, or one (rowwise_adagrad). */
  size_t per = parts ? nst / parts : 0;
  for (size_t k = 0; k < parts; k++) {
    printf("  %s:", json_string_value(json_array_get(state_names, k)));
    for (size_t j = 0; j < per; j++)
      printf(" %.9g", json_real_value(json_array_get(st, k * per + j)));
    printf("\n");
  }
}

int psctl_table_get(struct psctl *p) {
  json_t *out = NULL, *all;
  int rc = 0;
  if (p->argc != 1) {
    fprintf(stderr, "psctl: get TABLE --ids A,B,C takes one table name\n");
    return PSCTL_EXIT_USAGE;
  }
  if (!(all = table_entries(p, p->argv[0])))
    return 1;
  json_decref(all);
  out = json_array();
  /* Every id is asked of its home shard; one that cannot be answered is
   * said (and makes the exit status 1) without hiding the others. */
  for (size_t i = 0; i < p->nids; i++) {
    int s = psc__client_shard_of(p->client, p->idv[i]);
    char *text = NULL;
    if (!p->st[s]) {
      fprintf(stderr, "psctl: id %llu: its shard ps:%d is down (%s)\n",
              (unsigned long long)p->idv[i], s,
              p->why[s] ? p->why[s] : "no answer");
      rc = 1;
      continue;
    }
    if (psc__client_rows(p->client, s, p->argv[0], &p->idv[i], 1, 0, &text)) {
      fprintf(stderr, "psctl: id %llu: %s\n", (unsigned long long)p->idv[i],
              psc__client_error(p->client));
      rc = 1;
      continue;
    }
    json_t *doc = json_loads(text, 0, NULL);
    free(text);
    json_t *row = json_array_get(json_object_get(doc, "rows"), 0);
    if (p->json && row) {
      json_t *e = json_deep_copy(row);
      json_object_set_new(e, "shard", json_integer(s));
      json_object_set(e, "state_parts", json_object_get(doc, "state"));
      json_array_append_new(out, e);
    } else if (row) {
      print_row(row, json_object_get(doc, "state"), s);
    }
    json_decref(doc);
  }
  if (p->json) {
    json_t *root = json_pack("{s:s, s:O, s:o}", "table", p->argv[0], "rows",
                             out, "down", psctl_down_json(p));
    int prc = psctl_print_json(root);
    rc = rc ? rc : prc;
    json_decref(root);
  }
  json_decref(out);
  return rc ? rc : psctl_finish(p, 0);
}

/* Orders rows (JSON objects) by count, highest first, then by id. */
static int cmp_hot(const void *a, const void *b) {
  json_t *x = *(json_t *const *)a, *y = *(json_t *const *)b;
  long long cx = cm_status_int(x, "count"), cy = cm_status_int(y, "count");
  if (cx != cy)
    return cx > cy ? -1 : 1;
  unsigned long long ix = (unsigned long long)cm_status_int(x, "id"),
                     iy = (unsigned long long)cm_status_int(y, "id");
  return ix < iy ? -1 : ix > iy;
}

int psctl_cmd_top(struct psctl *p) {
  int k = p->top > 0 ? p->top : 10, rc = 0, nrows = 0;
  json_t *rows = json_array(), *all;
  json_t **v = NULL;
  if (p->argc != 1) {
    fprintf(stderr, "psctl: top takes one table name\n");
    return PSCTL_EXIT_USAGE;
  }
  if (!(all = table_entries(p, p->argv[0])))
    return 1;
  json_decref(all);
  for (int s = 0; s < p->spec->nps; s++) {
    char *text = NULL;
    if (!p->st[s])
      continue;
    if (psc__client_rows(p->client, s, p->argv[0], NULL, 0, (uint32_t)k,
                         &text)) {
      fprintf(stderr, "psctl: %s\n", psc__client_error(p->client));
      rc = 1;
      continue;
    }
    json_t *doc = json_loads(text, 0, NULL), *r;
    free(text);
    size_t i;
    json_array_foreach(json_object_get(doc, "rows"), i, r) {
      json_t *e =
          json_pack("{s:O, s:O, s:i, s:O}", "id", json_object_get(r, "id"),
                    "count", json_object_get(r, "count"), "shard", s,
                    "last_step", json_object_get(r, "last_step"));
      json_array_append_new(rows, e);
    }
    json_decref(doc);
  }
  nrows = (int)json_array_size(rows);
  v = calloc((size_t)nrows + 1, sizeof *v);
  for (int i = 0; v && i < nrows; i++)
    v[i] = json_array_get(rows, (size_t)i);
  if (v)
    qsort(v, (size_t)nrows, sizeof *v, cmp_hot);
  if (nrows > k)
    nrows = k;
  if (p->json) {
    json_t *list = json_array();
    for (int i = 0; v && i < nrows; i++)
      json_array_append(list, v[i]);
    json_t *root = json_pack("{s:s, s:o, s:o}", "table", p->argv[0], "top",
                             list, "down", psctl_down_json(p));
    psctl_print_json(root);
    json_decref(root);
  } else {
    struct psctl_grid tb;
    psctl_grid_init(&tb, 4, ">RANK", ">ID", ">PUSHES", "SHARD");
    for (int i = 0; v && i < nrows; i++) {
      psctl_grid_cell(&tb, "%d", i + 1);
      psctl_grid_cell(&tb, "%llu",
                      (unsigned long long)cm_status_int(v[i], "id"));
      psctl_grid_cell(&tb, "%lld", cm_status_int(v[i], "count"));
      psctl_grid_cell(&tb, "ps:%lld", cm_status_int(v[i], "shard"));
    }
    psctl_grid_print(&tb);
    psctl_print_down(p);
  }
  free(v);
  json_decref(rows);
  return psctl_finish(p, rc);
}

int psctl_cmd_shrink(struct psctl *p) {
  json_t *list = json_array(), *all;
  int rc = 0;
  if (p->argc != 1) {
    fprintf(stderr, "psctl: shrink takes one table name\n");
    return PSCTL_EXIT_USAGE;
  }
  if (!(all = table_entries(p, p->argv[0])))
    return 1;
  json_decref(all);
  for (int s = 0; s < p->spec->nps; s++) {
    uint64_t ev = 0, rows = 0;
    if (!p->st[s])
      continue;
    if (psc__client_shrink(p->client, s, p->argv[0], &ev, &rows)) {
      fprintf(stderr, "psctl: %s\n", psc__client_error(p->client));
      rc = 1;
      continue;
    }
    json_array_append_new(list,
                          json_pack("{s:i, s:I, s:I}", "shard", s, "evicted",
                                    (json_int_t)ev, "rows", (json_int_t)rows));
    if (!p->json)
      printf("ps:%d: %llu rows evicted, %llu left\n", s, (unsigned long long)ev,
             (unsigned long long)rows);
  }
  if (p->json) {
    json_t *root = json_pack("{s:s, s:O, s:o}", "table", p->argv[0], "shards",
                             list, "down", psctl_down_json(p));
    psctl_print_json(root);
    json_decref(root);
  } else {
    psctl_print_down(p);
  }
  json_decref(list);
  return psctl_finish(p, rc);
}

/* One shard's rows, paged in (sorted by id). */
struct rows {
  uint32_t dim;  /* floats per row */
  size_t n, cap; /* rows held and allocated */
  uint64_t *ids; /* owned */
  float *values; /* owned, n x dim */
};

/* Reads every stored row of table on shard s into r. */
static int read_shard(struct psctl *p, int s, const char *table,
                      struct rows *r) {
  int has_after = 0;
  uint64_t after = 0;
  for (;;) {
    struct psc__table_page pg;
    if (psc__client_export_page(p->client, s, table, has_after, after, &pg)) {
      fprintf(stderr, "psctl: %s\n", psc__client_error(p->client));
      return 1;
    }
    size_t bad = psctl_ids_unordered(pg.ids, pg.n, has_after, after);
    if (bad < pg.n || (r->n && pg.dim != r->dim)) {
      if (bad < pg.n)
        fprintf(stderr,
                "psctl: export '%s': ps:%d sent id %llu after %llu (a page "
                "must be ascending); not exported\n",
                table, s, (unsigned long long)pg.ids[bad],
                (unsigned long long)(bad ? pg.ids[bad - 1] : after));
      else
        fprintf(stderr,
                "psctl: export '%s': ps:%d changed the width from %u to %u "
                "between pages; not exported\n",
                table, s, r->dim, pg.dim);
      free(pg.ids);
      free(pg.values);
      return 1;
    }
    r->dim = pg.dim;
    if (r->n + pg.n > r->cap) {
      size_t cap = r->cap ? r->cap : 1024;
      while (cap < r->n + pg.n)
        cap *= 2;
      uint64_t *ids = realloc(r->ids, cap * sizeof *ids);
      float *v = ids ? realloc(r->values, cap * pg.dim * sizeof *v) : NULL;
      if (ids)
        r->ids = ids;
      if (!ids || !v) {
        free(pg.ids);
        free(pg.values);
        fprintf(stderr, "psctl: export: out of memory\n");
        return 1;
      }
      r->values = v;
      r->cap = cap;
    }
    if (pg.n) { /* r's arrays are NULL until a page brings rows */
      memcpy(r->ids + r->n, pg.ids, pg.n * sizeof *pg.ids);
      memcpy(r->values + r->n * pg.dim, pg.values,
             pg.n * pg.dim * sizeof(float));
      r->n += pg.n;
      after = pg.ids[pg.n - 1];
      has_after = 1;
    }
    free(pg.ids);
    free(pg.values);
    if (pg.done || !pg.n)
      return 0;
    if (!p->json && r->n % (1u << 20) < pg.n)
      fprintf(stderr, "psctl: export '%s': %zu rows from ps:%d so far\n", table,
              r->n, s);
  }
}

int psctl_table_export(struct psctl *p) {
  const char *table = p->argv[0];
  struct rows *per = calloc((size_t)p->spec->nps, sizeof *per);
  struct psctl_run *runs = calloc((size_t)p->spec->nps, sizeof *runs);
  size_t total = 0, *at = calloc((size_t)p->spec->nps, sizeof *at);
  uint64_t id_prev = 0;
  uint32_t dim = 0;
  char tmp[4200], err[1024];
  int fd = -1, rc = 1;
  double t0 = cm_mono_ms();
  struct cm_st_writer *w = NULL;
  if (!per || !runs || !at)
    goto out;
  if (!p->out) {
    fprintf(stderr, "psctl: export TABLE needs --out FILE.safetensors\n");
    rc = PSCTL_EXIT_USAGE;
    goto out;
  }
  for (int s = 0; s < p->spec->nps; s++) {
    if (read_shard(p, s, table, &per[s]))
      goto out;
    total += per[s].n;
    if (per[s].n && dim && per[s].dim != dim) {
      fprintf(stderr,
              "psctl: export '%s': ps:%d has rows of %u floats, "
              "another shard %u; not exported\n",
              table, s, per[s].dim, dim);
      goto out;
    }
    dim = per[s].dim ? per[s].dim : dim;
    runs[s].ids = per[s].ids;
    runs[s].n = per[s].n;
  }
  int64_t ishape[1] = {(int64_t)total}, vshape[2] = {(int64_t)total, dim};
  struct cm_st_desc desc[2] = {{"ids", 1, ishape, "U64"},
                               {"values", 2, vshape, NULL}};
  char rows_text[32];
  snprintf(rows_text, sizeof rows_text, "%zu", total);
  struct cm_st_meta meta[] = {
      {"table", table}, {"job", p->spec->job.name}, {"rows", rows_text}};
  snprintf(tmp, sizeof tmp, "%s.tmp-%d", p->out, (int)getpid());
  if ((fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) < 0) {
    fprintf(stderr, "psctl: cannot create %s: %s\n", tmp, strerror(errno));
    goto out;
  }
  if (cm_st_writer_new(&w, fd, tmp, desc, 2, meta, 3, err, sizeof err))
    goto fail;
  /* Merge the shards' sorted runs by id: ids first, then values. An id
   * has one home shard, so one in two runs is refused, not written twice. */
  for (int pass = 0; pass < 2; pass++) {
    memset(at, 0, (size_t)p->spec->nps * sizeof *at);
    for (size_t k = 0; k < total; k++) {
      int best = psctl_merge_pick(runs, p->spec->nps, at);
      const uint64_t *id = &per[best].ids[at[best]];
      if (!pass && k > 0 && *id == id_prev) {
        snprintf(err, sizeof err, "id %llu is on two shards (ps:%d is one)",
                 (unsigned long long)*id, best);
        goto fail;
      }
      id_prev = *id;
      const void *src =
          pass ? (const void *)(per[best].values + at[best] * per[best].dim)
               : (const void *)id;
      size_t len = pass ? dim * sizeof(float) : sizeof(uint64_t);
      at[best]++;
      if (cm_st_writer_write(w, src, len, err, sizeof err))
        goto fail;
    }
  }
  if (cm_st_writer_finish(w, err, sizeof err))
    goto fail;
  if (fsync(fd) != 0 || close(fd) != 0 || rename(tmp, p->out) != 0) {
    fd = -1;
    snprintf(err, sizeof err, "%s: %s", p->out, strerror(errno));
    goto fail;
  }
  fd = -1;
  if (p->json) {
    json_t *root = json_pack("{s:s, s:s, s:I, s:i, s:f}", "table", table,
                             "file", p->out, "rows", (json_int_t)total, "dim",
                             (int)dim, "ms", cm_mono_ms() - t0);
    psctl_print_json(root);
    json_decref(root);
  } else {
    printf("exported table '%s': %zu rows of dim %u, sorted by id, to %s "
           "(\"ids\" U64, \"values\" F32) in %.0f ms\n",
           table, total, dim, p->out, cm_mono_ms() - t0);
  }
  rc = 0;
  goto out;
fail:
  fprintf(stderr, "psctl: export '%s': %s\n", table, err);
  unlink(tmp);
out:
  cm_st_writer_free(w);
  if (fd >= 0)
    close(fd);
  for (int s = 0; per && s < p->spec->nps; s++) {
    free(per[s].ids);
    free(per[s].values);
  }
  free(per);
  free(runs);
  free(at);
  return rc;
}
