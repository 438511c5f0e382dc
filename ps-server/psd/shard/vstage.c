/* Initial values staged by Declare (vstage.h): a list of entries, each a
 * buffer of one variable's rows here and the runs filled so far, kept as
 * sorted, disjoint intervals so that a run sent twice counts once. */
#include "vstage.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "store.h"

struct psd_vstage_entry {
  struct psd_vstage_entry *next;   /* the list's next entry */
  uint64_t id;                     /* DeclareRequest.stage */
  char name[PSD_VAR_MAX_NAME + 1]; /* the variable */
  uint64_t begin, end;             /* elements held here, global numbering */
  float *values;                   /* owned, end - begin floats */
  uint64_t (*runs)[2]; /* owned: filled intervals [a, b), sorted, disjoint,
                          not touching */
  size_t nruns;        /* entries in runs */
  size_t cap;          /* entries allocated in runs */
  uint64_t filled;     /* elements in runs */
  double touched;      /* when a run last came (monotonic seconds) */
};

struct psd_vstage {
  struct psd_vstage_entry *head; /* owned list */
  uint64_t bytes;                /* values bytes of every entry */
};

int psd_vstage_new(struct psd_vstage **out) {
  *out = calloc(1, sizeof **out);
  return *out ? 0 : CM_ENOMEM;
}

static void entry_free(struct psd_vstage_entry *e) {
  free(e->values);
  free(e->runs);
  free(e);
}

void psd_vstage_free(struct psd_vstage *s) {
  if (!s)
    return;
  for (struct psd_vstage_entry *e = s->head, *n; e; e = n) {
    n = e->next;
    entry_free(e);
  }
  free(s);
}

struct psd_vstage_entry *psd_vstage_find(struct psd_vstage *s, uint64_t id,
                                         const char *name) {
  for (struct psd_vstage_entry *e = s->head; e; e = e->next)
    if (e->id == id && !strcmp(e->name, name))
      return e;
  return NULL;
}

int psd_vstage_add(struct psd_vstage *s, uint64_t id, const char *name,
                   uint64_t begin, uint64_t end,
                   struct psd_vstage_entry **out) {
  struct psd_vstage_entry *e = calloc(1, sizeof *e);
  uint64_t n = end - begin;
  if (!e || !(e->values = malloc((n ? n : 1) * sizeof(float)))) {
    free(e);
    return CM_ENOMEM;
  }
  e->id = id;
  snprintf(e->name, sizeof e->name, "%s", name);
  e->begin = begin;
  e->end = end;
  e->next = s->head;
  s->head = e;
  s->bytes += n * sizeof(float);
  *out = e;
  return 0;
}

void psd_vstage_range(const struct psd_vstage_entry *e, uint64_t *begin,
                      uint64_t *end) {
  *begin = e->begin;
  *end = e->end;
}

/* Adds [a, b) to e's intervals, merging those it overlaps or touches. */
static int add_run(struct psd_vstage_entry *e, uint64_t a, uint64_t b) {
  size_t i = 0, j;
  while (i < e->nruns && e->runs[i][1] < a)
    i++;
  /* runs[i..j) overlap or touch [a, b): replaced by their union. */
  for (j = i; j < e->nruns && e->runs[j][0] <= b; j++) {
    if (e->runs[j][0] < a)
      a = e->runs[j][0];
    if (e->runs[j][1] > b)
      b = e->runs[j][1];
    e->filled -= e->runs[j][1] - e->runs[j][0];
  }
  if (j == i) { /* a new interval at i */
    if (e->nruns == e->cap) {
      size_t cap = e->cap ? 2 * e->cap : 8;
      uint64_t(*r)[2] = realloc(e->runs, cap * sizeof *r);
      if (!r)
        return CM_ENOMEM;
      e->runs = r;
      e->cap = cap;
    }
    memmove(&e->runs[i + 1], &e->runs[i], (e->nruns - i) * sizeof *e->runs);
    e->nruns++;
  } else if (j > i + 1) {
    memmove(&e->runs[i + 1], &e->runs[j], (e->nruns - j) * sizeof *e->runs);
    e->nruns -= j - i - 1;
  }
  e->runs[i][0] = a;
  e->runs[i][1] = b;
  e->filled += b - a;
  return 0;
}

void psd_vstage_put(struct psd_vstage_entry *e, uint64_t offset,
                    const void *data, uint64_t count) {
  if (!count)
    return;
  memcpy(e->values + (offset - e->begin), data, count * sizeof(float));
  /* Out of memory for the intervals: the run is not counted, so the
   * variable is not created until the client sends it again. */
  (void)add_run(e, offset, offset + count);
}

uint64_t psd_vstage_filled(const struct psd_vstage_entry *e) {
  return e->filled;
}

const float *psd_vstage_values(const struct psd_vstage_entry *e) {
  return e->values;
}

/* Unlinks and frees the entries for which drop(e, ctx) is true. */
static void drop_if(struct psd_vstage *s,
                    int (*drop)(const struct psd_vstage_entry *, const void *),
                    const void *ctx) {
  for (struct psd_vstage_entry **p = &s->head; *p;) {
    struct psd_vstage_entry *e = *p;
    if (!drop(e, ctx)) {
      p = &e->next;
      continue;
    }
    *p = e->next;
    s->bytes -= (e->end - e->begin) * sizeof(float);
    entry_free(e);
  }
}

static int named(const struct psd_vstage_entry *e, const void *name) {
  return !strcmp(e->name, name);
}

static int idle(const struct psd_vstage_entry *e, const void *now) {
  return *(const double *)now - e->touched > PSD_VSTAGE_IDLE_S;
}

void psd_vstage_drop_name(struct psd_vstage *s, const char *name) {
  drop_if(s, named, name);
}

void psd_vstage_expire(struct psd_vstage *s, double now_s) {
  drop_if(s, idle, &now_s);
}

void psd_vstage_touch(struct psd_vstage_entry *e, double now_s) {
  e->touched = now_s;
}

uint64_t psd_vstage_bytes(const struct psd_vstage *s) { return s->bytes; }
