/* Embedding tables (psclient.h, "embedding tables"): their declare, and
 * sparse pulls and pushes of rows by id.
 *
 * A call's ids are made unique and split by shard (splitmix64(id) % shards,
 * the function psd uses) in one pass, then cut into messages of at most
 * chunk_bytes of rows; every message of every shard and table goes in one
 * run, up to `inflight` per shard at once. A shard is asked for each row
 * once however often the call names it: a pull's row is copied to every
 * position that names its id, and a push's repeated rows are summed here,
 * in the caller's order, the float32 sums the shard would make (so a call
 * counts once per id even when its rows pass one message). A message's ids
 * (and a push's summed rows) are gathered straight into the message's own
 * buffer, the one copy; a pull's answer is read from the received slices
 * in order, once, straight into the caller's rows. Failed calls are retried
 * like dense ones (retry.c), and a push's messages carry (client id, seq,
 * chunk) so a retried message is applied once. */
#include "client_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "rand.h"
#include "wire.h"

static const char PULL_METHOD[] = "/psd.v1.Data/SparsePull";
static const char PUSH_METHOD[] = "/psd.v1.Data/SparsePush";

/* One message of a sparse call: some unique ids of one table for one
 * shard, a run of the plan's uid and head arrays. */
struct smsg {
  int r;          /* index into the call's psc__rows */
  int shard;      /* destination */
  size_t first;   /* its first unique id's index in the plan's arrays */
  size_t n;       /* unique ids in it */
  float *urow;    /* its rows in the plan's urows: a pull's answer, a
                     push's summed gradients (borrowed) */
  uint32_t dim;   /* the table's row width */
  uint32_t chunk; /* its index among the call's messages to its shard */
  int pending;    /* 1 until answered OK (or a closed step) */
};

/* A sparse call in progress. Its plan: every table's ids made unique and
 * grouped by shard in one pass (plan()): uid[u] is unique id u (by table,
 * shard, first use), head[u] the first of its positions in its table's
 * ids, uix[base[i] + k] the unique id of position k of table i (counted
 * from ufirst[i]), and urows the unique ids' rows, table i's from roff[i].
 * A pull's answers land in urows, then one pass in position order copies
 * them to the caller; a push's rows are summed into urows in one pass in
 * position order, the order the shard would sum them in. */
struct scall {
  struct psc__client *c;
  int push;               /* 1: push, 0: pull */
  struct psc__rows *rows; /* the caller's (const for a push) */
  int sync;               /* sync: min_version/step and gen are sent */
  uint64_t min_version;   /* pull: the version to wait for */
  uint64_t step;          /* push: the step staged for */
  uint64_t seq;           /* push: this push's dedup seq */
  int closed;             /* push: a shard said the step is closed */
  int rolled;             /* pull: an answer said the job rolled back */
  struct smsg *msgs;      /* owned */
  int nmsgs;              /* entries in msgs */
  uint64_t *uid;          /* owned: unique ids */
  uint32_t *head;         /* owned: uid[u]'s first position in its table */
  uint32_t *uix;          /* owned: per position of every table's ids */
  size_t *base;           /* owned: per table, its positions' offset in uix */
  size_t *ufirst;         /* owned: per table, its first unique id's index */
  size_t *roff;           /* owned: per table, its rows' offset in urows */
  float *urows;           /* owned: the unique ids' rows */
};

/* Past the most ids one table's part of a call may hold. */
#define NO_POS UINT32_MAX
/* How far ahead plan() fetches the hash set's slots (a power of 2). */
#define AHEAD 16

int psc__client_shard_of(const struct psc__client *c, uint64_t id) {
  return (int)(cm_splitmix64_at(id) % (uint64_t)c->nshards);
}

/* The declared table called name, or NULL. */
static const struct psc__table_state *find_table(const struct psc__client *c,
                                                 const char *name) {
  for (int i = 0; i < c->ntables; i++)
    if (!strcmp(c->tables[i].name, name))
      return &c->tables[i];
  return NULL;
}

int psc__client_table_dim(const struct psc__client *c, const char *table) {
  const struct psc__table_state *t = table ? find_table(c, table) : NULL;
  return t ? (int)t->dim : CM_ENOENT;
}

int psc__client_declare_tables(struct psc__client *c,
                               const struct psc__table *tables, int n) {
  Psd__V1__Caller caller = psc__caller(c, -1);
  Psd__V1__DeclareRequest req = PSD__V1__DECLARE_REQUEST__INIT;
  Psd__V1__TableSpec *specs = calloc((size_t)n + 1, sizeof *specs);
  Psd__V1__TableSpec **ptrs = calloc((size_t)n + 1, sizeof *ptrs);
  struct psc__table_state *grown = NULL;
  int rc = 0;
  if (!specs || !ptrs) {
    rc = CM_ENOMEM;
    goto out;
  }
  for (int i = 0; i < n; i++) {
    if (!tables[i].name || !tables[i].name[0] || strlen(tables[i].name) > 200) {
      psc__seterr(c,
                  "declare tables: table %d has no name, or one longer "
                  "than 200 bytes",
                  i);
      rc = CM_EINVAL;
      goto out;
    }
    if (tables[i].dim < 1 || tables[i].dim > CM_TABLE_MAX_DIM) {
      psc__seterr(c, "declare tables: table '%s' has dim %u; expected 1..%d",
                  tables[i].name, tables[i].dim, CM_TABLE_MAX_DIM);
      rc = CM_EINVAL;
      goto out;
    }
    psd__v1__table_spec__init(&specs[i]);
    specs[i].name = (char *)tables[i].name;
    specs[i].dim = tables[i].dim;
    specs[i].id_bound = tables[i].id_bound;
    ptrs[i] = &specs[i];
  }
  req.caller = &caller;
  req.n_tables = (size_t)n;
  req.tables = ptrs;
  if ((rc = psc__declare_everywhere(c, &req)))
    goto out;
  if (!(grown = realloc(c->tables,
                        ((size_t)c->ntables + (size_t)n) * sizeof *grown))) {
    rc = CM_ENOMEM;
    goto out;
  }
  c->tables = grown;
  for (int i = 0; i < n; i++) {
    if (find_table(c, tables[i].name))
      continue;
    struct psc__table_state *t = &c->tables[c->ntables++];
    snprintf(t->name, sizeof t->name, "%s", tables[i].name);
    t->dim = tables[i].dim;
    t->id_bound = tables[i].id_bound;
  }
  /* A client of tables alone moves to the shards' Unix sockets here. */
  if (!c->vars)
    rc = psc__use_unix_sockets(c);
out:
  free(specs);
  free(ptrs);
  if (rc && !c->err[0])
    psc__seterr(c, "declare tables: %s", cm_strerror(rc));
  return rc;
}

/* A slot of the plan's hash set of one table's unique ids: a unique id's
 * index + 1, 0 when free. */
static size_t slot_of(uint64_t h, size_t mask) {
  return (size_t)((h * 0x9E3779B97F4A7C15ull) >> 32) & mask;
}

/* Plans the call: each table's ids checked against its bound, made unique
 * (a hash set over the call's largest table, cleared per table) and grouped
 * by shard, then cut into messages of at most chunk_bytes of rows. One pass
 * over the ids, one over the unique ids; arrays sized once per call.
 * Returns 0, or an error in c->err. */
static int plan(struct scall *sc, int nr) {
  struct psc__client *c = sc->c;
  const char *what = sc->push ? "push" : "pull";
  size_t all = 0, most = 0, cap = 16, nu = 0;
  int ns = c->nshards, rc = 0;
  for (int i = 0; i < nr; i++) {
    all += sc->rows[i].n;
    most = sc->rows[i].n > most ? sc->rows[i].n : most;
    if (sc->rows[i].n >= NO_POS) {
      psc__seterr(c, "%s rows of '%s': %zu ids in one call; at most %u", what,
                  sc->rows[i].table, sc->rows[i].n, NO_POS - 1);
      return CM_EINVAL;
    }
  }
  while (cap < 2 * most)
    cap *= 2;
  uint32_t *slot = malloc(cap * sizeof *slot);
  uint32_t *sorted = malloc((most + 1) * sizeof *sorted);
  /* Per table: its unique ids in first-use order and their shards, before
   * grouping. */
  uint64_t *ids = malloc((most + 1) * sizeof *ids);
  uint32_t *first = malloc((most + 1) * sizeof *first);
  int *shard = malloc((most + 1) * sizeof *shard);
  size_t *count = calloc((size_t)ns + 1, sizeof *count);
  size_t *at = calloc((size_t)ns + 1, sizeof *at);
  uint32_t *chunks = calloc((size_t)ns + 1, sizeof *chunks);
  sc->uid = malloc((all + 1) * sizeof *sc->uid);
  sc->head = malloc((all + 1) * sizeof *sc->head);
  sc->uix = malloc((all + 1) * sizeof *sc->uix);
  sc->base = calloc((size_t)nr + 1, sizeof *sc->base);
  sc->ufirst = calloc((size_t)nr + 1, sizeof *sc->ufirst);
  sc->roff = calloc((size_t)nr + 1, sizeof *sc->roff);
  if (!slot || !sorted || !ids || !first || !shard || !count || !at ||
      !chunks || !sc->uid || !sc->head || !sc->uix || !sc->base ||
      !sc->ufirst || !sc->roff)
    goto nomem;
  /* The messages: at most one per shard and table beyond the rows' own
   * count of chunks; counted exactly below, sized generously here. */
  size_t maxmsgs = 0;
  for (int i = 0; i < nr; i++) {
    const struct psc__table_state *t = find_table(c, sc->rows[i].table);
    if (!t) {
      psc__seterr(c,
                  "%s rows of '%s': this client has declared no table '%s'; "
                  "declare it first",
                  what, sc->rows[i].table, sc->rows[i].table);
      rc = CM_ENOENT;
      goto out;
    }
    size_t per = c->o.chunk_bytes / (t->dim * sizeof(float));
    per = per ? per : 1;
    maxmsgs += sc->rows[i].n / per + (size_t)ns;
  }
  if (!(sc->msgs = calloc(maxmsgs + 1, sizeof *sc->msgs)))
    goto nomem;
  size_t pos = 0, floats = 0;
  for (int i = 0; i < nr; i++) {
    const struct psc__rows *r = &sc->rows[i];
    const struct psc__table_state *t = find_table(c, r->table);
    uint32_t *uix = sc->uix + pos;
    size_t tcap = 16, mask, n = 0;
    while (tcap < 2 * r->n)
      tcap *= 2;
    mask = tcap - 1;
    sc->base[i] = pos;
    sc->ufirst[i] = nu;
    sc->roff[i] = floats;
    pos += r->n;
    memset(slot, 0, tcap * sizeof *slot);
    memset(count, 0, (size_t)ns * sizeof *count);
    /* The hashes of the ids AHEAD positions on, their slots fetched
     * ahead: a large call's set is past the caches. */
    uint64_t ring[AHEAD];
    for (size_t k = 0; k < AHEAD && k < r->n; k++) {
      ring[k] = cm_splitmix64_at(r->ids[k]);
      __builtin_prefetch(&slot[slot_of(ring[k], mask)]);
    }
    for (size_t k = 0; k < r->n; k++) {
      uint64_t id = r->ids[k], h = ring[k % AHEAD];
      if (k + AHEAD < r->n) {
        uint64_t ha = cm_splitmix64_at(r->ids[k + AHEAD]);
        ring[k % AHEAD] = ha;
        __builtin_prefetch(&slot[slot_of(ha, mask)]);
      }
      if (t->id_bound && id >= t->id_bound) {
        psc__seterr(c,
                    "%s rows of '%s': id %llu (position %zu) is not below "
                    "the table's id_bound %llu",
                    what, r->table, (unsigned long long)id, k,
                    (unsigned long long)t->id_bound);
        rc = CM_ERANGE;
        goto out;
      }
      size_t j = slot_of(h, mask);
      while (slot[j] && ids[slot[j] - 1] != id)
        j = (j + 1) & mask;
      if (slot[j]) {
        uix[k] = slot[j] - 1;
        continue;
      }
      slot[j] = (uint32_t)n + 1;
      uix[k] = (uint32_t)n;
      ids[n] = id;
      first[n] = (uint32_t)k;
      /* psd's placement: splitmix64(id) % shards (psc__client_shard_of). */
      count[shard[n] = (int)(h % (uint64_t)ns)]++;
      n++;
    }
    /* The unique ids grouped by shard (a counting sort), each shard's run
     * cut into messages of at most `per` rows. */
    size_t per = c->o.chunk_bytes / (t->dim * sizeof(float));
    per = per ? per : 1;
    size_t from = nu;
    for (int s = 0; s < ns; s++) {
      at[s] = from;
      for (size_t left = count[s], k = from; left > 0;) {
        size_t m = left < per ? left : per;
        sc->msgs[sc->nmsgs++] = (struct smsg){.r = i,
                                              .shard = s,
                                              .first = k,
                                              .n = m,
                                              .dim = t->dim,
                                              .chunk = chunks[s]++,
                                              .pending = 1};
        k += m;
        left -= m;
      }
      from += count[s];
    }
    for (size_t u = 0; u < n; u++) {
      size_t to = at[shard[u]]++;
      sc->uid[to] = ids[u];
      sc->head[to] = first[u];
      sorted[u] = (uint32_t)(to - nu);
    }
    for (size_t k = 0; k < r->n; k++)
      uix[k] = sorted[uix[k]];
    nu += n;
    floats += n * t->dim;
  }
  if (!(sc->urows = malloc((floats + 1) * sizeof *sc->urows)))
    goto nomem;
  for (int k = 0; k < sc->nmsgs; k++) {
    struct smsg *m = &sc->msgs[k];
    m->urow =
        sc->urows + sc->roff[m->r] + (m->first - sc->ufirst[m->r]) * m->dim;
  }
  goto out;
nomem:
  psc__seterr(c, "%s rows: out of memory", what);
  rc = CM_ENOMEM;
out:
  free(slot);
  free(sorted);
  free(ids);
  free(first);
  free(shard);
  free(count);
  free(at);
  free(chunks);
  return rc;
}

static void release_free(void *p) { free(p); }

/* Builds message m's request: its unique ids (and a push's rows, each the
 * sum of its id's rows in the caller's order) into buffers the message
 * owns. NULL when out of memory. */
static grpc_byte_buffer *build(struct scall *sc, const struct smsg *m) {
  struct psc__client *c = sc->c;
  const struct psc__rows *r = &sc->rows[m->r];
  Psd__V1__Caller caller = psc__caller(c, m->shard);
  uint64_t *ids = malloc(m->n * sizeof *ids + 1);
  grpc_byte_buffer *bb = NULL;
  uint8_t *head = NULL;
  size_t head_len;
  if (!ids)
    return NULL;
  memcpy(ids, sc->uid + m->first, m->n * sizeof *ids);
  if (!sc->push) {
    Psd__V1__SparsePullRequest req = PSD__V1__SPARSE_PULL_REQUEST__INIT;
    req.caller = &caller;
    req.table = (char *)r->table;
    req.max_answer_bytes = (uint64_t)cm_rpc_max_message();
    if (sc->sync) {
      req.min_version = sc->min_version;
      req.gen = c->gen;
    }
    head_len = protobuf_c_message_get_packed_size(&req.base);
    if (!(head = malloc(head_len + 1)))
      goto out;
    protobuf_c_message_pack(&req.base, head);
    struct cm_wire_piece piece = {(const uint8_t *)ids, m->n * sizeof *ids};
    bb = cm_wire_build(head, head_len, &piece, 1, release_free, ids);
    ids = NULL; /* the slice owns it */
  } else {
    Psd__V1__SparsePushRequest req = PSD__V1__SPARSE_PUSH_REQUEST__INIT;
    size_t row = m->dim * sizeof(float);
    float *g = malloc(m->n * row + 1);
    if (!g)
      goto out;
    memcpy(g, m->urow, m->n * row);
    req.caller = &caller;
    req.table = (char *)r->table;
    req.ids.data = (uint8_t *)ids;
    req.ids.len = m->n * sizeof *ids;
    req.worker = c->windex;
    req.has_worker = c->windex >= 0;
    /* Its own identity, apart from the dense pushes' sequence. */
    req.client_id = c->client_id ^ 0x5350415253450001ull;
    req.seq = sc->seq;
    req.chunk = m->chunk;
    if (sc->sync) {
      req.step = sc->step;
      req.gen = c->gen;
    }
    head_len = protobuf_c_message_get_packed_size(&req.base);
    if (!(head = malloc(head_len + 1))) {
      free(g);
      goto out;
    }
    protobuf_c_message_pack(&req.base, head);
    struct cm_wire_piece piece = {(const uint8_t *)g, m->n * row};
    bb = cm_wire_build(head, head_len, &piece, 1, release_free, g);
  }
out:
  free(ids);
  free(head);
  return bb;
}

/* A push's rows summed per unique id into urows, one pass over each
 * table's positions in order: an id's first row copied, the later ones
 * added, the float32 sums the shard makes of repeats. */
static void sum_rows(struct scall *sc, int nr) {
  for (int i = 0; i < nr; i++) {
    const struct psc__rows *r = &sc->rows[i];
    const uint32_t *uix = sc->uix + sc->base[i];
    const uint32_t *head = sc->head + sc->ufirst[i];
    uint32_t dim = (uint32_t)psc__client_table_dim(sc->c, r->table);
    float *rows = sc->urows + sc->roff[i];
    for (size_t k = 0; k < r->n; k++) {
      float *dst = rows + (size_t)uix[k] * dim;
      const float *src = r->grads + k * dim;
      if (head[uix[k]] == k)
        memcpy(dst, src, dim * sizeof(float));
      else
        for (uint32_t j = 0; j < dim; j++)
          dst[j] += src[j];
    }
  }
}

/* A pull's rows, every message answered, copied from urows to every
 * position of the caller's, in position order. */
static void copy_out(struct scall *sc, int nr) {
  for (int i = 0; i < nr; i++) {
    struct psc__rows *r = &sc->rows[i];
    const uint32_t *uix = sc->uix + sc->base[i];
    uint32_t dim = (uint32_t)psc__client_table_dim(sc->c, r->table);
    const float *rows = sc->urows + sc->roff[i];
    for (size_t k = 0; k < r->n; k++)
      memcpy(r->rows + k * dim, rows + (size_t)uix[k] * dim,
             dim * sizeof(float));
  }
}

/* Reads one answer: a pull's rows read into urows, a rolled-back sync
 * answer noted. */
static void on_done(struct cm_unary *u, void *ctx) {
  struct scall *sc = ctx;
  const struct smsg *m = u->user;
  if (u->status != GRPC_STATUS_OK)
    return;
  if (sc->push) {
    Psd__V1__SparsePushResponse *r =
        (Psd__V1__SparsePushResponse *)cm_rpc_unpack(
            u->response, &psd__v1__sparse_push_response__descriptor);
    if (r && r->rolled_back)
      psc__saw_rollback(sc->c, r->gen, r->rollback_step);
    if (r)
      psd__v1__sparse_push_response__free_unpacked(r, NULL);
    return;
  }
  struct cm_wire_msg w;
  size_t row = m->dim * sizeof(float);
  if (cm_wire_parse(&w, u->response)) {
    u->status = GRPC_STATUS_INTERNAL;
    snprintf(u->details, sizeof u->details, "malformed sparse pull answer");
    cm_wire_msg_release(&w);
    cm_unary_release(u);
    return;
  }
  Psd__V1__SparsePullResponse *pr =
      psd__v1__sparse_pull_response__unpack(NULL, w.head_len, w.head);
  if (pr && pr->rolled_back) {
    sc->rolled = 1;
    psc__saw_rollback(sc->c, pr->gen, pr->rollback_step);
  } else if (w.bulk_len != m->n * row) {
    u->status = GRPC_STATUS_INTERNAL;
    snprintf(u->details, sizeof u->details,
             "sparse pull answer of '%s' holds %zu bytes; expected %zu (%zu "
             "ids of dim %u)",
             sc->rows[m->r].table, w.bulk_len, m->n * row, m->n, m->dim);
  } else {
    cm_wire_bulk_read(&w, 0, m->urow, w.bulk_len); /* in order, once */
    sc->c->pulled += w.bulk_len;
  }
  if (pr)
    psd__v1__sparse_pull_response__free_unpacked(pr, NULL);
  cm_wire_msg_release(&w);
  cm_unary_release(u);
}

/* Runs a planned sparse call: every pending message, then only the
 * retryable failures again, until all are answered or a shard stays
 * unreachable past the retry budget. */
static int run(struct scall *sc) {
  struct psc__client *c = sc->c;
  const char *name = sc->push ? "push rows" : "pull rows";
  unsigned char *down = calloc((size_t)c->nshards, 1);
  struct cm_unary *calls = calloc((size_t)sc->nmsgs + 1, sizeof *calls);
  int *which = calloc((size_t)sc->nmsgs + 1, sizeof *which);
  int rc = 0, left = sc->nmsgs, rolled_before = c->rolled_back;
  if (!down || !calls || !which) {
    psc__seterr(c, "%s: out of memory", name);
    rc = CM_ENOMEM;
    goto out;
  }
  for (int attempt = 0; left > 0; attempt++) {
    int n = 0, fatal = 0;
    for (int i = 0; i < sc->nmsgs; i++) {
      struct smsg *m = &sc->msgs[i];
      if (!m->pending)
        continue;
      memset(&calls[n], 0, sizeof calls[n]);
      calls[n].channel = c->ch[m->shard];
      calls[n].method = sc->push ? PUSH_METHOD : PULL_METHOD;
      calls[n].user = m;
      which[n] = i;
      if (!(calls[n++].request = build(sc, m))) {
        psc__seterr(c, "%s: out of memory", name);
        for (int k = 0; k < n - 1; k++)
          cm_unary_release(&calls[k]);
        rc = CM_ENOMEM;
        goto out;
      }
    }
    if (attempt > 0)
      c->stats.retries += (uint64_t)n;
    psc__run(c, calls, n, name, c->o.timeout_ms, 0, on_done, sc);
    memset(down, 0, (size_t)c->nshards);
    for (int k = 0; k < n; k++)
      if (psc__retryable(calls[k].status))
        down[sc->msgs[which[k]].shard] = 1;
    for (int k = 0; k < n; k++) {
      struct cm_unary *u = &calls[k];
      struct smsg *m = &sc->msgs[which[k]];
      c->stats.calls++;
      if (u->status == GRPC_STATUS_OK) {
        if (sc->push)
          c->pushed += m->n * m->dim * sizeof(float);
        if (!down[m->shard])
          psc__shard_up(c, m->shard);
      } else if (sc->push && sc->sync && u->status == GRPC_STATUS_ABORTED) {
        sc->closed = 1; /* the step closed without us: not an error */
      } else {
        c->stats.failed++;
        if (!psc__retryable(u->status)) {
          if (!fatal)
            psc__call_error(c, name, u);
          fatal = 1;
          continue;
        }
        psc__shard_down(c, m->shard, u);
        continue;
      }
      m->pending = 0;
      left--;
    }
    psc__back_to_tcp(c, calls, n);
    for (int k = 0; k < n; k++)
      cm_unary_release(&calls[k]);
    if (c->rolled_back && !rolled_before) {
      rc = 0; /* the caller goes back to the step rolled to */
      break;
    }
    if (fatal) {
      rc = CM_ERPC;
      break;
    }
    if (left > 0 &&
        (rc = psc__retry_wait(c, down, c->nshards, attempt + 1, name)))
      break;
  }
out:
  free(down);
  free(calls);
  free(which);
  return rc;
}

/* Plans and runs one sparse call. */
static int sparse_call(struct scall *sc, int nr) {
  int rc = plan(sc, nr), answered = 1;
  if (!rc && sc->push)
    sum_rows(sc, nr);
  if (!rc)
    rc = run(sc);
  for (int k = 0; k < sc->nmsgs; k++)
    answered &= !sc->msgs[k].pending;
  if (!rc && !sc->push && !sc->rolled && answered)
    copy_out(sc, nr);
  free(sc->msgs);
  free(sc->uid);
  free(sc->head);
  free(sc->uix);
  free(sc->base);
  free(sc->ufirst);
  free(sc->roff);
  free(sc->urows);
  return rc;
}

int psc__client_pull_rows(struct psc__client *c, struct psc__rows *r, int nr) {
  struct scall sc = {.c = c, .rows = r};
  return sparse_call(&sc, nr);
}

int psc__client_push_rows(struct psc__client *c, const struct psc__rows *r,
                          int nr) {
  struct scall sc = {
      .c = c, .push = 1, .rows = (struct psc__rows *)r, .seq = ++c->sparse_seq};
  return sparse_call(&sc, nr);
}

int psc__client_pull_rows_at(struct psc__client *c, struct psc__rows *r, int nr,
                             uint64_t min_version) {
  struct scall sc = {.c = c, .rows = r, .sync = 1, .min_version = min_version};
  return sparse_call(&sc, nr);
}

int psc__client_push_rows_step(struct psc__client *c, const struct psc__rows *r,
                               int nr, uint64_t step, int *closed) {
  int rc = psc__need_joined(c, "push rows", step);
  if (rc)
    return rc;
  struct scall sc = {.c = c,
                     .push = 1,
                     .rows = (struct psc__rows *)r,
                     .sync = 1,
                     .step = step,
                     .seq = ++c->sparse_seq};
  rc = sparse_call(&sc, nr);
  *closed = sc.closed;
  return rc;
}
