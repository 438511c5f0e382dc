/* pubwrite: writes one publication (pubfile.h) with psd's own writer, for
 * tests of the serving tasks (tests/integration/test_serve.py) that need
 * publications of known contents, versions and chains, which a training
 * job cannot be made to write on cue.
 *
 *   pubwrite DIR JOB SHARD SHARDS VERSION full|delta BASE STEP < LINES
 *
 * DIR is the shard's ps-<I> directory. Each line of stdin is one of
 *   table NAME DIM              a table (the rows that follow are its)
 *   row ID V1 .. VDIM           a row of the last table
 *   removed ID                  an id removed from the last table
 *   dense NAME BEGIN END D0,D1,.. V ...   a dense variable's rows
 * Values are C floats (hexadecimal ones are exact). Exits 0, or 1 with
 * the writer's words. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pubfile.h"

#define MAX_TABLES 16
#define MAX_DENSE 16

/* Makes room for need elements of elem bytes in p, whose room is *cap,
   doubling it (ASan's realloc always copies: growing by one element each
   time made writing 10,000 rows quadratic, 2 minutes under make asan). */
static void *grow(void *p, size_t *cap, size_t need, size_t elem) {
  if (p && need <= *cap)
    return p;
  size_t c = *cap < 64 ? 64 : *cap;
  while (c < need)
    c *= 2;
  void *q = realloc(p, c * elem);
  if (!q) {
    fprintf(stderr, "pubwrite: out of memory\n");
    exit(1);
  }
  *cap = c;
  return q;
}

int main(int argc, char **argv) {
  static struct psd_pub_table tabs[MAX_TABLES];
  static struct psd_pub_dense dense[MAX_DENSE];
  struct psd_pub p = {0};
  char line[1 << 16], err[1024];
  struct timespec now;
  /* the room of each table's ids, values and removed ids (grow) */
  static size_t ids_cap[MAX_TABLES], values_cap[MAX_TABLES],
      removed_cap[MAX_TABLES];
  if (argc != 9) {
    fprintf(stderr, "usage: pubwrite DIR JOB SHARD SHARDS VERSION full|delta "
                    "BASE STEP < LINES\n");
    return 2;
  }
  snprintf(p.job, sizeof p.job, "%s", argv[2]);
  p.shard = atoi(argv[3]);
  p.shards = atoi(argv[4]);
  p.version = strtoull(argv[5], NULL, 10);
  p.full = !strcmp(argv[6], "full");
  p.base = strtoull(argv[7], NULL, 10);
  p.prev = p.full ? 0 : p.version - 1;
  p.step = strtoull(argv[8], NULL, 10);
  clock_gettime(CLOCK_REALTIME, &now);
  p.time_unix_ms = (int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000;
  p.tables = tabs;
  p.dense = dense;
  while (fgets(line, sizeof line, stdin)) {
    char *save, *w = strtok_r(line, " \t\n", &save);
    if (!w)
      continue;
    struct psd_pub_table *t = p.ntables ? &tabs[p.ntables - 1] : NULL;
    if (!strcmp(w, "table") && p.ntables < MAX_TABLES) {
      t = &tabs[p.ntables++];
      snprintf(t->name, sizeof t->name, "%s", strtok_r(NULL, " \t\n", &save));
      t->dim = (uint32_t)atoi(strtok_r(NULL, " \t\n", &save));
    } else if (!strcmp(w, "row") && t) {
      size_t k = (size_t)(t - tabs);
      t->ids = grow(t->ids, &ids_cap[k], t->nrows + 1, sizeof *t->ids);
      t->values = grow(t->values, &values_cap[k], (t->nrows + 1) * t->dim,
                       sizeof(float));
      t->ids[t->nrows] = strtoull(strtok_r(NULL, " \t\n", &save), NULL, 10);
      for (uint32_t j = 0; j < t->dim; j++)
        t->values[t->nrows * t->dim + j] =
            strtof(strtok_r(NULL, " \t\n", &save), NULL);
      t->nrows++;
    } else if (!strcmp(w, "removed") && t) {
      t->removed = grow(t->removed, &removed_cap[t - tabs], t->nremoved + 1,
                        sizeof *t->removed);
      t->removed[t->nremoved++] =
          strtoull(strtok_r(NULL, " \t\n", &save), NULL, 10);
    } else if (!strcmp(w, "dense") && p.ndense < MAX_DENSE) {
      struct psd_pub_dense *d = &dense[p.ndense++];
      char *shape, *s, *v;
      size_t n = 0, cap = 0;
      snprintf(d->name, sizeof d->name, "%s", strtok_r(NULL, " \t\n", &save));
      d->row_begin = atoll(strtok_r(NULL, " \t\n", &save));
      d->row_end = atoll(strtok_r(NULL, " \t\n", &save));
      shape = strtok_r(NULL, " \t\n", &save);
      for (s = strtok(shape, ","); s && d->ndim < 8; s = strtok(NULL, ","))
        d->shape[d->ndim++] = atoll(s);
      while ((v = strtok_r(NULL, " \t\n", &save))) {
        d->values = grow(d->values, &cap, n + 1, sizeof(float));
        d->values[n++] = strtof(v, NULL);
      }
    } else {
      fprintf(stderr, "pubwrite: bad line starting '%s'\n", w);
      return 2;
    }
  }
  if (psd_pub_prepare(argv[1], err, sizeof err) ||
      psd_pub_write(argv[1], &p, "async", NULL, err, sizeof err)) {
    fprintf(stderr, "pubwrite: %s\n", err);
    return 1;
  }
  return 0;
}
