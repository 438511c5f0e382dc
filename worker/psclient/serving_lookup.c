/* Rows by id and dense variables by name from the serving tasks
 * (serving.h), over psc__serving_call.
 *
 * Rows: the call's ids are grouped by shard (the layout's row rule,
 * splitmix64(id) % nps, as training's sparse calls) with a counting
 * pass, so each shard gets one message of its ids in the caller's order;
 * each answer's rows are copied once, from the received slices straight to
 * the caller's positions. A table's dim is learnt from the first answer and
 * remembered; an answer of another dim is refused (EPROTO).
 *
 * Dense: every shard is asked for the variable; each answers its rows
 * (VarSlice row_begin..row_end, floats after the table's in data), or
 * NOT_FOUND / no rows when it holds none of it (a variable placed whole on
 * one shard). The rows must cover 0..N once with one row size; they are
 * copied into the caller's buffer in row order. */
#include "serving.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "err.h"
#include "layout.h"
#include "ps.pb-c.h"
#include "rpc.h"
#include "wire.h"

static const char LOOKUP[] = "/psd.v1.Serve/Lookup";

/* One lookup of rows in flight. */
struct rows_call {
  struct psc__serving *s; /* the client */
  const char *table;      /* the table */
  const char *what;       /* "lookup of table 'x'", for errors */
  Psd__V1__Caller caller; /* sent with every message */
  uint64_t *ids;          /* owned: the ids grouped by shard */
  size_t *pos;            /* owned: ids[k]'s position in the caller's */
  size_t *first;          /* owned, per shard: its first entry in ids */
  size_t *count;          /* owned, per shard: its ids */
  float *rows;            /* the caller's rows, or NULL (dim only) */
  uint8_t *found;         /* the caller's, or NULL */
  uint64_t *versions;     /* the caller's, per shard, or NULL */
  uint32_t dim;           /* the table's dim, 0 until known */
};

static grpc_byte_buffer *rows_build(int shard, void *ctx) {
  struct rows_call *rc = ctx;
  Psd__V1__LookupRequest req = PSD__V1__LOOKUP_REQUEST__INIT;
  Psd__V1__Caller caller = rc->caller;
  psc__serving_belief(rc->s, shard, &caller); /* its task's word */
  req.caller = &caller;
  req.table = (char *)rc->table;
  req.ids.data = (uint8_t *)(rc->ids + rc->first[shard]);
  req.ids.len = rc->count[shard] * sizeof(uint64_t);
  return cm_rpc_pack(&req.base);
}

/* An answer that does not fit the question: the task named. */
static int bad_answer(struct psc__serving *s, const char *what, int shard,
                      const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int bad_answer(struct psc__serving *s, const char *what, int shard,
                      const char *fmt, ...) {
  char why[256];
  int t = psc__serving_task(s, shard);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, sizeof why, fmt, ap);
  va_end(ap);
  return psc__serving_fail(s, CM_EPROTO, "%s at serve:%d (%s): %s", what, t,
                           psc__serving_addr(s, t), why);
}

static int rows_read(int shard, grpc_byte_buffer *bb, void *ctx) {
  struct rows_call *c = ctx;
  struct psc__serving *s = c->s;
  struct cm_wire_msg w;
  Psd__V1__LookupResponse *r = NULL;
  size_t n = c->count[shard], row;
  int rc = 0;
  if (cm_wire_parse(&w, bb) ||
      !(r = psd__v1__lookup_response__unpack(NULL, w.head_len, w.head))) {
    rc = bad_answer(s, c->what, shard, "malformed answer");
    goto out;
  }
  if (r->dim < 1) {
    rc = bad_answer(s, c->what, shard, "answer of dim 0");
    goto out;
  }
  if (c->dim && r->dim != c->dim) {
    rc = bad_answer(s, c->what, shard, "answer of dim %u; the table has %u",
                    r->dim, c->dim);
    goto out;
  }
  c->dim = r->dim;
  row = (size_t)r->dim * sizeof(float);
  if (r->found.len != n || w.bulk_len < n * row) {
    rc = bad_answer(s, c->what, shard,
                    "answer of %zu rows (%zu found flags) for the ids asked",
                    w.bulk_len / row, r->found.len);
    goto out;
  }
  for (size_t k = 0; c->rows && k < n; k++)
    cm_wire_bulk_read(&w, k * row,
                      c->rows + c->pos[c->first[shard] + k] * r->dim, row);
  for (size_t k = 0; c->found && k < n; k++)
    c->found[c->pos[c->first[shard] + k]] = r->found.data[k] != 0;
  if (c->versions)
    c->versions[shard] = r->version;
  psc__serving_learn(s, shard, r->layout, r->shards, r->rows, (int)r->move_to,
                     (int)r->moved);
out:
  if (r)
    psd__v1__lookup_response__free_unpacked(r, NULL);
  cm_wire_msg_release(&w);
  return rc;
}

/* Groups ids[0..n) by shard into c (counting sort, stable). */
static int group(struct rows_call *c, const uint64_t *ids, size_t n,
                 unsigned char *want) {
  int nshards = psc__serving_shards(c->s);
  size_t *at = calloc((size_t)nshards, sizeof *at);
  int *of = malloc(n * sizeof *of + 1);
  int rc = CM_ENOMEM;
  c->ids = malloc(n * sizeof *c->ids + 1);
  c->pos = malloc(n * sizeof *c->pos + 1);
  c->first = calloc((size_t)nshards, sizeof *c->first);
  c->count = calloc((size_t)nshards, sizeof *c->count);
  if (!at || !of || !c->ids || !c->pos || !c->first || !c->count)
    goto out;
  for (size_t i = 0; i < n; i++) {
    of[i] = psc__serving_route(c->s, ids[i]);
    c->count[of[i]]++;
  }
  for (int sh = 1; sh < nshards; sh++)
    c->first[sh] = c->first[sh - 1] + c->count[sh - 1];
  for (int sh = 0; sh < nshards; sh++) {
    at[sh] = c->first[sh];
    want[sh] = c->count[sh] > 0;
  }
  for (size_t i = 0; i < n; i++) {
    c->ids[at[of[i]]] = ids[i];
    c->pos[at[of[i]]++] = i;
  }
  rc = 0;
out:
  free(at);
  free(of);
  return rc;
}

/* One lookup of ids[0..n) (n >= 1) of table; rows NULL: only the dim. */
static int lookup_once(struct psc__serving *s, const char *table,
                       const uint64_t *ids, size_t n, float *rows,
                       uint8_t *found, uint64_t *versions, uint32_t *dim) {
  int nshards = psc__serving_shards(s), rc;
  unsigned char *want = calloc((size_t)nshards, 1);
  char what[256];
  struct rows_call c = {.s = s,
                        .table = table,
                        .what = what,
                        .rows = rows,
                        .found = found,
                        .versions = versions,
                        .dim = psc__serving_dim_known(s, table)};
  snprintf(what, sizeof what, "lookup of table '%s'", table);
  psc__serving_caller(s, &c.caller);
  if (versions)
    memset(versions, 0, (size_t)nshards * sizeof *versions);
  if (!want || group(&c, ids, n, want)) {
    rc = psc__serving_fail(s, CM_ENOMEM, "%s: out of memory", what);
    goto out;
  }
  if ((rc = psc__serving_call(s, want, what, LOOKUP, rows_build, rows_read, &c,
                              NULL)))
    goto out;
  if ((rc = psc__serving_dim_keep(s, table, c.dim)))
    psc__serving_fail(s, rc, "%s: out of memory", what);
  if (dim)
    *dim = c.dim;
out:
  free(want);
  free(c.ids);
  free(c.pos);
  free(c.first);
  free(c.count);
  return rc;
}

/* lookup_once, and again when a task answered that the publications
 * place rows by another rule than the client grouped by (a job resumed from
 * a checkpoint written before buckets: the map took the task's), or by
 * another layout (a reshard: the client took the task's word and groups
 * again; when it knew that word, the task that takes the bucket lags: it
 * asks every task's word and waits a little). At most FOLLOW_ROUNDS. */
#define FOLLOW_ROUNDS 12

/* Round `round`'s wait (0 first) for a task that lags: 10 ms, doubling
 * to 400. */
static void follow_wait(int round) {
  long ms = 10;
  for (int i = 0; i < round && ms < 400; i++)
    ms *= 2;
  cm_sleep_ms(ms < 400 ? ms : 400);
}

static int lookup(struct psc__serving *s, const char *table,
                  const uint64_t *ids, size_t n, float *rows, uint8_t *found,
                  uint64_t *versions, uint32_t *dim) {
  int rc = 0, moved, waits = 0;
  for (int round = 0; round < FOLLOW_ROUNDS; round++) {
    if (!(rc = lookup_once(s, table, ids, n, rows, found, versions, dim)) ||
        !(moved = psc__serving_rows_moved(s)))
      break;
    if (moved == 2 && !psc__serving_probe(s))
      follow_wait(waits++);
  }
  return rc;
}

/* A table name the calls accept, else CM_EINVAL with the error set. */
static int check_table(struct psc__serving *s, const char *table) {
  if (!table || !table[0] || strlen(table) > 200)
    return psc__serving_fail(s, CM_EINVAL,
                             "lookup: no table name, or one longer than 200 "
                             "bytes");
  return 0;
}

int psc__serving_dim(struct psc__serving *s, const char *table, uint32_t *dim) {
  uint64_t id = 0;
  int rc;
  *dim = 0;
  if ((rc = check_table(s, table)))
    return rc;
  if ((*dim = psc__serving_dim_known(s, table)))
    return 0;
  return lookup(s, table, &id, 1, NULL, NULL, NULL, dim);
}

int psc__serving_lookup(struct psc__serving *s, const char *table,
                        const uint64_t *ids, size_t n, float *rows,
                        uint8_t *found, uint64_t *versions) {
  int rc;
  if ((rc = check_table(s, table)))
    return rc;
  if (n > 0 && (!ids || !rows))
    return psc__serving_fail(s, CM_EINVAL,
                             "lookup of table '%s': %zu ids and no %s", table,
                             n, ids ? "rows" : "ids");
  if (n == 0) {
    if (versions)
      memset(versions, 0, (size_t)psc__serving_shards(s) * sizeof *versions);
    return 0;
  }
  return lookup(s, table, ids, n, rows, found, versions, NULL);
}

/* ---- dense variables */

/* One shard's rows of the variable. */
struct dense_part {
  int64_t begin, end; /* its rows */
  float *vals;        /* owned: their floats */
  size_t nvals;       /* floats in vals */
  int answered;       /* 1: an answer was read (0: NOT_FOUND, not asked) */
  uint64_t layout;    /* the layout it named */
  uint64_t version;   /* the publication it came from */
};

/* One dense lookup in flight. */
struct dense_call {
  struct psc__serving *s;   /* the client */
  const char *name;         /* the variable */
  const char *what;         /* "lookup of dense variable 'x'" */
  Psd__V1__Caller caller;   /* sent with every message */
  struct dense_part *parts; /* owned, per shard */
  uint64_t *versions;       /* the caller's, or NULL */
  int layouts;              /* layouts the answers named, when not all
                               one (2: more than one) */
  int64_t rows;             /* the variable's rows, as an answer's
                               VarSlice.shape says (0: none said) */
  uint64_t layout;          /* the first answer's */
  int answered;             /* answers read */
};

static grpc_byte_buffer *dense_build(int shard, void *ctx) {
  struct dense_call *d = ctx;
  Psd__V1__LookupRequest req = PSD__V1__LOOKUP_REQUEST__INIT;
  char *names[1] = {(char *)d->name};
  (void)shard;
  req.caller = &d->caller;
  req.table = (char *)"";
  req.n_dense = 1;
  req.dense = names;
  return cm_rpc_pack(&req.base);
}

static int dense_read(int shard, grpc_byte_buffer *bb, void *ctx) {
  struct dense_call *d = ctx;
  struct dense_part *p = &d->parts[shard];
  struct cm_wire_msg w;
  Psd__V1__LookupResponse *r = NULL;
  const Psd__V1__VarSlice *v = NULL;
  size_t skip, bytes;
  int rc = 0;
  if (cm_wire_parse(&w, bb) ||
      !(r = psd__v1__lookup_response__unpack(NULL, w.head_len, w.head))) {
    rc = bad_answer(d->s, d->what, shard, "malformed answer");
    goto out;
  }
  if (d->versions)
    d->versions[shard] = r->version;
  psc__serving_learn(d->s, shard, r->layout, r->shards, r->rows,
                     (int)r->move_to, (int)r->moved);
  p->answered = 1;
  p->layout = r->layout;
  p->version = r->version;
  if (d->answered++ && r->layout != d->layout)
    d->layouts = 2;
  d->layout = r->layout;
  for (size_t i = 0; i < r->n_dense && !v; i++)
    if (r->dense[i]->name && !strcmp(r->dense[i]->name, d->name))
      v = r->dense[i];
  if (v && v->n_shape > 0 && v->shape[0] > 0)
    d->rows = v->shape[0];
  if (!v || v->row_end <= v->row_begin)
    goto out; /* none of it here */
  skip = r->found.len * (size_t)r->dim * sizeof(float);
  bytes = w.bulk_len > skip ? w.bulk_len - skip : 0;
  if (v->row_begin < 0 || bytes % sizeof(float) ||
      bytes / sizeof(float) % (size_t)(v->row_end - v->row_begin)) {
    rc = bad_answer(d->s, d->what, shard, "%zu bytes for %zu rows", bytes,
                    (size_t)(v->row_end - v->row_begin));
    goto out;
  }
  p->begin = v->row_begin;
  p->end = v->row_end;
  p->nvals = bytes / sizeof(float);
  if (!(p->vals = malloc(bytes + 1))) {
    rc = psc__serving_fail(d->s, CM_ENOMEM, "%s: out of memory", d->what);
    goto out;
  }
  cm_wire_bulk_read(&w, skip, p->vals, bytes);
out:
  if (r)
    psd__v1__lookup_response__free_unpacked(r, NULL);
  cm_wire_msg_release(&w);
  return rc;
}

static int by_begin(const void *a, const void *b) {
  const struct dense_part *x = *(struct dense_part *const *)a,
                          *y = *(struct dense_part *const *)b;
  return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* Orders the shards' rows and checks that they cover 0..N once with one
 * row size; *numel its elements. */
/* What each shard answered, for an error: "; serve:J: rows A..B (version
 * V, layout L)" or "; serve:J: none of it". */
static void answers(const struct dense_call *d, int nshards, char *buf,
                    size_t len) {
  size_t k = 0;
  buf[0] = 0;
  for (int sh = 0; sh < nshards && k < len; sh++) {
    const struct dense_part *p = &d->parts[sh];
    int t = psc__serving_task(d->s, sh);
    if (p->answered && p->vals)
      k += (size_t)snprintf(buf + k, len - k,
                            "; serve:%d: rows %lld..%lld (version %llu, "
                            "layout %llu)",
                            t, (long long)p->begin, (long long)p->end,
                            (unsigned long long)p->version,
                            (unsigned long long)p->layout);
    else if (p->answered)
      k += (size_t)snprintf(buf + k, len - k,
                            "; serve:%d: none of it (version %llu, layout "
                            "%llu)",
                            t, (unsigned long long)p->version,
                            (unsigned long long)p->layout);
  }
}

static int assemble(struct dense_call *d, int nshards, float *out, size_t count,
                    size_t *numel) {
  struct dense_part **held = calloc((size_t)nshards, sizeof *held);
  size_t row_len = 0, total = 0, at = 0;
  int n = 0, rc = 0;
  int64_t next = 0;
  if (!held)
    return psc__serving_fail(d->s, CM_ENOMEM, "%s: out of memory", d->what);
  for (int sh = 0; sh < nshards; sh++)
    if (d->parts[sh].vals)
      held[n++] = &d->parts[sh];
  if (n == 0) {
    char asked[512];
    size_t at = 0;
    asked[0] = 0;
    for (int sh = 0; sh < nshards && at < sizeof asked; sh++)
      at += (size_t)snprintf(asked + at, sizeof asked - at, "%sserve:%d",
                             sh ? ", " : "", psc__serving_task(d->s, sh));
    char said[600];
    answers(d, nshards, said, sizeof said);
    rc = psc__serving_fail(d->s, CM_ENOENT,
                           "%s: no serving task holds it (asked %s, one of "
                           "each shard%s)",
                           d->what, asked, said);
    goto out;
  }
  qsort(held, (size_t)n, sizeof *held, by_begin);
  for (int i = 0; i < n; i++) {
    size_t len = held[i]->nvals / (size_t)(held[i]->end - held[i]->begin);
    if (held[i]->begin != next || (row_len && len != row_len)) {
      char said[600];
      answers(d, nshards, said, sizeof said);
      rc = psc__serving_fail(
          d->s, CM_EPROTO,
          "%s: the shards' rows do not fit together: rows %lld..%lld of "
          "%zu floats after rows up to %lld of %zu%s",
          d->what, (long long)held[i]->begin, (long long)held[i]->end, len,
          (long long)next, row_len, said);
      goto out;
    }
    row_len = len;
    next = held[i]->end;
    total += held[i]->nvals;
  }
  if (d->rows && next != d->rows) {
    char said[600];
    answers(d, nshards, said, sizeof said);
    rc = psc__serving_fail(d->s, CM_EPROTO,
                           "%s: the shards' rows end at row %lld of its %lld%s",
                           d->what, (long long)next, (long long)d->rows, said);
    goto out;
  }
  if (numel)
    *numel = total;
  if (!out)
    goto out;
  if (count != total) {
    rc = psc__serving_fail(d->s, CM_ESHAPE,
                           "%s: it has %zu elements; the buffer holds %zu",
                           d->what, total, count);
    goto out;
  }
  for (int i = 0; i < n; i++) {
    memcpy(out + at, held[i]->vals, held[i]->nvals * sizeof(float));
    at += held[i]->nvals;
  }
out:
  free(held);
  return rc;
}

int psc__serving_dense(struct psc__serving *s, const char *name, float *out,
                       size_t count, size_t *numel, uint64_t *versions) {
  int nshards = psc__serving_shards(s), rc;
  unsigned char *want = malloc((size_t)nshards);
  unsigned char *nf = calloc((size_t)nshards, 1);
  char what[300];
  struct dense_call d = {
      .s = s, .name = name, .what = what, .versions = versions};
  if (numel)
    *numel = 0;
  if (!name || !name[0] || strlen(name) > 200)
    return psc__serving_fail(s, CM_EINVAL,
                             "lookup_dense: no variable name, or one longer "
                             "than 200 bytes");
  snprintf(what, sizeof what, "lookup of dense variable '%s'", name);
  psc__serving_caller(s, &d.caller);
  if (versions)
    memset(versions, 0, (size_t)nshards * sizeof *versions);
  d.parts = calloc((size_t)nshards, sizeof *d.parts);
  if (!want || !nf || !d.parts) {
    rc = psc__serving_fail(s, CM_ENOMEM, "%s: out of memory", what);
    goto out;
  }
  /* The shards of the latest layout a task named: a standby shard's task
   * holds no dense rows. Tasks part way through a layout switch answer
   * slices of two layouts that do not fit, or that leave rows out: asked
   * again, a little later, while one of them has not said it holds the
   * latest layout. */
  for (int round = 0; round < FOLLOW_ROUNDS; round++) {
    int in = psc__serving_layout_shards(s);
    d.answered = d.layouts = 0;
    d.rows = 0;
    for (int sh = 0; sh < nshards; sh++) {
      want[sh] = sh < in;
      nf[sh] = 0;
      free(d.parts[sh].vals);
      memset(&d.parts[sh], 0, sizeof d.parts[sh]);
    }
    if ((rc = psc__serving_call(s, want, what, LOOKUP, dense_build, dense_read,
                                &d, nf)))
      break;
    if (!(rc = assemble(&d, nshards, out, count, numel)))
      break;
    psc__serving_probe(s); /* the words of tasks that answered NOT_FOUND */
    if (!(d.layouts > 1 || psc__serving_layout_shards(s) != in ||
          psc__serving_lagging(s, psc__serving_layout_shards(s))))
      break;
    follow_wait(round);
  }
out:
  for (int sh = 0; d.parts && sh < nshards; sh++)
    free(d.parts[sh].vals);
  free(d.parts);
  free(want);
  free(nf);
  return rc;
}
