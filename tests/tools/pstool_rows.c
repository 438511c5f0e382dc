/* pstool rows: sparse pulls and pushes of an embedding table through
 * libpsclient (psclient.h, "embedding tables"), for the integration tests:
 *
 *   pstool --cluster F rows TABLE DIM[:BOUND] pull ID,ID,...
 *   pstool --cluster F rows TABLE DIM[:BOUND] push ID,ID,... G,G,...
 *
 * (with --chunk B, libpsclient's messages carry at most B bytes of rows,
 * so a test can cut one call into many messages)
 * declares the table (DIM floats per row, ids below BOUND when given), then
 * pulls (printing "OK rows=N" and one line per id, "ID V1 V2 ...", with
 * %.9g, enough to tell floats apart) or pushes (N x DIM gradient values,
 * row after row; prints "OK pushed=N"). Errors print "ERROR ..." and exit
 * 1. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "psclient.h"
#include "pstool.h"

/* Parses a comma-separated list: u64 ids (floats 0) or floats. Returns the
 * count, or -1 on a bad item. */
static long parse_list(const char *s, uint64_t **ids, float **vals) {
  long n = 1, k = 0;
  for (const char *p = s; *p; p++)
    n += *p == ',';
  if (ids)
    *ids = calloc((size_t)n, sizeof **ids);
  if (vals)
    *vals = calloc((size_t)n, sizeof **vals);
  char *copy = strdup(s), *save = NULL;
  for (char *tok = strtok_r(copy, ",", &save); tok;
       tok = strtok_r(NULL, ",", &save), k++) {
    char *end;
    if (ids)
      (*ids)[k] = strtoull(tok, &end, 10);
    else
      (*vals)[k] = strtof(tok, &end);
    if (*end) {
      free(copy);
      return -1;
    }
  }
  free(copy);
  return k;
}

int pstool_rows(struct cm_spec *spec, const struct pstool_args *a, int argc,
                char **argv) {
  struct psc__client *c = NULL;
  struct psc__client_opts o = {
      .worker = "pstool", .timeout_ms = a->timeout, .chunk_bytes = a->chunk};
  uint64_t *ids = NULL;
  float *vals = NULL, *rows = NULL;
  long n = 0;
  int rc = 1;
  if (argc < 5 || (strcmp(argv[3], "pull") && strcmp(argv[3], "push")) ||
      (!strcmp(argv[3], "push") && argc < 6)) {
    fprintf(stderr, "pstool rows TABLE DIM[:BOUND] pull IDS | push IDS "
                    "GRADS\n");
    return 2;
  }
  struct psc__table t = {argv[1], (uint32_t)strtoul(argv[2], NULL, 10), 0};
  const char *colon = strchr(argv[2], ':');
  if (colon)
    t.id_bound = strtoull(colon + 1, NULL, 10);
  if ((n = parse_list(argv[4], &ids, NULL)) < 0) {
    fprintf(stderr, "pstool: bad id list '%s'\n", argv[4]);
    goto out;
  }
  if (psc__client_new(&c, spec, &o) || psc__client_declare_tables(c, &t, 1)) {
    printf("ERROR %s\n", c ? psc__client_error(c) : "no client");
    goto out;
  }
  struct psc__rows r = {t.name, ids, (size_t)n, NULL, NULL};
  if (!strcmp(argv[3], "pull")) {
    rows = calloc((size_t)n * t.dim + 1, sizeof *rows);
    r.rows = rows;
    if (psc__client_pull_rows(c, &r, 1)) {
      printf("ERROR %s\n", psc__client_error(c));
      goto out;
    }
    printf("OK rows=%ld\n", n);
    for (long i = 0; i < n; i++) {
      printf("%" PRIu64, ids[i]);
      for (uint32_t j = 0; j < t.dim; j++)
        printf(" %.9g", rows[i * t.dim + j]);
      printf("\n");
    }
  } else {
    long ng = parse_list(argv[5], NULL, &vals);
    if (ng != n * (long)t.dim) {
      fprintf(stderr, "pstool: %ld gradient values for %ld ids of dim %u\n", ng,
              n, t.dim);
      goto out;
    }
    r.grads = vals;
    if (psc__client_push_rows(c, &r, 1)) {
      printf("ERROR %s\n", psc__client_error(c));
      goto out;
    }
    printf("OK pushed=%ld\n", n);
  }
  rc = 0;
out:
  psc__client_free(c);
  free(ids);
  free(vals);
  free(rows);
  return rc;
}
