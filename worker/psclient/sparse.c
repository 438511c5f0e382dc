/* Embedding tables (psclient.h, "embedding tables"): their declare, and
 * sparse pulls and pushes of rows by id.
 *
 * A call's ids are made unique and split by shard (the layout's row rule,
 * common/layout/layout.h, the one psd uses) in one pass, then cut into messages
 * of at most chunk_bytes of rows (sparse_plan.c); every message of every shard
 * and table goes in one run, up to `inflight` per shard at once. A shard is
 * asked for each row once however often the call names it: a pull's row
 * is copied to every position that names its id, and a push's repeated
 * rows are summed here, in the caller's order, the float32 sums the shard
 * would make (so a call counts once per id even when its rows pass one
 * message). A message's ids and a push's summed rows are copied into the
 * message's own buffers; a pull's answer is read from the received slices
 * in order, once, into the plan's rows of unique ids, then copied to the
 * caller's rows in position order. Failed calls are retried
 * like dense ones (retry.c), and a push's messages carry (client id, seq,
 * chunk) so a retried message is applied once.
 *
 * A call answered "layout moved" re-plans for the new layout (relayout.c):
 * a pull is made again whole (it changes nothing), a push sends only the
 * ids no shard acknowledged, regrouped by the new layout's map (a live
 * move's partway map among them, psc__sparse_regroup), with its client id
 * and seq, so that the shard's dedup applies a piece sent twice once. An
 * answer naming no newer layout than the client's (a shard behind it, a
 * bucket between owners) sends what is pending again, unchanged, after a
 * short wait (psc__follow_moved). */
#include "client_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "layout.h"
#include "sparse_plan.h"
#include "wire.h"

static const char PULL_METHOD[] = "/psd.v1.Data/SparsePull";
static const char PUSH_METHOD[] = "/psd.v1.Data/SparsePush";

int psc__client_shard_of(const struct psc__client *c, uint64_t id) {
  return cm_layout_map_id_shard(&c->map, id);
}

int psc__client_table_dim(const struct psc__client *c, const char *table) {
  const struct psc__table_state *t = table ? psc__sparse_table(c, table) : NULL;
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
  for (struct psc__follow f = {0};;) {
    c->moved[0] = 0;
    if (!(rc = psc__declare_everywhere(c, &req)) || !c->moved[0])
      break;
    /* The layout moved: declared again on the new one (or on the same,
     * after a short wait, for an answer naming none newer). */
    if ((rc = psc__follow_moved(c, &f, "declare tables", 0)))
      break;
    caller = psc__caller(c, -1);
    c->err[0] = 0;
  }
  if (rc)
    goto out;
  if (!(grown = realloc(c->tables,
                        ((size_t)c->ntables + (size_t)n) * sizeof *grown))) {
    rc = CM_ENOMEM;
    goto out;
  }
  c->tables = grown;
  for (int i = 0; i < n; i++) {
    if (psc__sparse_table(c, tables[i].name))
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

static void release_free(void *p) { free(p); }

/* Builds message m's request: its unique ids (and a push's rows, each the
 * sum of its id's rows in the caller's order) into buffers the message
 * owns. NULL when out of memory. */
static grpc_byte_buffer *build(struct psc__scall *sc,
                               const struct psc__smsg *m) {
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

/* Reads one answer: a pull's rows read into urows, a rolled-back sync
 * answer noted. */
static void on_done(struct cm_unary *u, void *ctx) {
  struct psc__scall *sc = ctx;
  const struct psc__smsg *m = u->user;
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
static int run(struct psc__scall *sc) {
  struct psc__client *c = sc->c;
  const char *name = sc->push ? "push rows" : "pull rows";
  /* Per address of the pool: a move's destinations are past nshards. */
  unsigned char *down = calloc((size_t)c->spec->nps, 1);
  struct cm_unary *calls = calloc((size_t)sc->nmsgs + 1, sizeof *calls);
  int *which = calloc((size_t)sc->nmsgs + 1, sizeof *which);
  int rc = 0, left = 0, rolled_before = c->rolled_back;
  if (!down || !calls || !which) {
    psc__seterr(c, "%s: out of memory", name);
    rc = CM_ENOMEM;
    goto out;
  }
  for (int i = 0; i < sc->nmsgs; i++)
    left += sc->msgs[i].pending;
  for (int attempt = 0; left > 0; attempt++) {
    int n = 0, fatal = 0;
    for (int i = 0; i < sc->nmsgs; i++) {
      struct psc__smsg *m = &sc->msgs[i];
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
    memset(down, 0, (size_t)c->spec->nps);
    for (int k = 0; k < n; k++)
      if (psc__retryable(calls[k].status))
        down[sc->msgs[which[k]].shard] = 1;
    for (int k = 0; k < n; k++) {
      struct cm_unary *u = &calls[k];
      struct psc__smsg *m = &sc->msgs[which[k]];
      c->stats.calls++;
      if (u->status == GRPC_STATUS_OK) {
        if (sc->push)
          c->pushed += m->n * m->dim * sizeof(float);
        if (!down[m->shard])
          psc__shard_up(c, m->shard);
      } else if (sc->push && sc->sync && u->status == GRPC_STATUS_ABORTED) {
        sc->closed = 1; /* the step closed without us: not an error */
      } else if (psc__is_moved(u)) {
        /* No outage, no retry: it stays pending for the re-plan. */
        psc__note_moved(c, &sc->moved, u->details);
        if (!down[m->shard])
          psc__shard_up(c, m->shard);
        continue;
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
    if (sc->moved)
      break; /* sparse_call re-plans, and runs what is pending again */
    if (fatal) {
      rc = CM_ERPC;
      break;
    }
    if (left > 0 &&
        (rc = psc__retry_wait(c, down, c->spec->nps, attempt + 1, name)))
      break;
  }
out:
  free(down);
  free(calls);
  free(which);
  return rc;
}

/* The layout moved during sc: re-planned, and what is pending made again
 * for the new layout: a pull whole, a push's unacknowledged ids
 * regrouped. An answer naming no newer layout leaves it pending as it
 * is, sent again after a short wait. */
static int replan(struct psc__scall *sc, int nr, struct psc__follow *f) {
  struct psc__client *c = sc->c;
  const char *name = sc->push ? "push rows" : "pull rows";
  int taken = f->taken, rc;
  if ((rc = psc__follow_moved(c, f, name, 0)) || f->taken == taken)
    return rc;
  if (sc->push)
    return psc__sparse_regroup(sc, &c->map, c->o.chunk_bytes);
  psc__sparse_plan_free(sc);
  return psc__sparse_plan(sc, nr);
}

/* Plans and runs one sparse call. */
static int sparse_call(struct psc__scall *sc, int nr) {
  int rc = psc__sparse_plan(sc, nr), answered = 1;
  if (!rc && sc->push)
    psc__sparse_sum_rows(sc, nr);
  /* Past every chunk index of the plan: a regrouped message's. */
  sc->chunk_next = (uint32_t)sc->nmsgs;
  for (struct psc__follow f = {0}; !rc;) {
    sc->moved = 0;
    if ((rc = run(sc)) || !sc->moved)
      break;
    rc = replan(sc, nr, &f);
  }
  for (int k = 0; k < sc->nmsgs; k++)
    answered &= !sc->msgs[k].pending;
  if (!rc && !sc->push && !sc->rolled && answered)
    psc__sparse_copy_out(sc, nr);
  psc__sparse_plan_free(sc);
  return rc;
}

int psc__client_pull_rows(struct psc__client *c, struct psc__rows *r, int nr) {
  struct psc__scall sc = {.c = c, .rows = r};
  return sparse_call(&sc, nr);
}

int psc__client_push_rows(struct psc__client *c, const struct psc__rows *r,
                          int nr) {
  struct psc__scall sc = {
      .c = c, .push = 1, .rows = (struct psc__rows *)r, .seq = ++c->sparse_seq};
  return sparse_call(&sc, nr);
}

int psc__client_pull_rows_at(struct psc__client *c, struct psc__rows *r, int nr,
                             uint64_t min_version) {
  struct psc__scall sc = {
      .c = c, .rows = r, .sync = 1, .min_version = min_version};
  return sparse_call(&sc, nr);
}

int psc__client_push_rows_step(struct psc__client *c, const struct psc__rows *r,
                               int nr, uint64_t step, int *closed) {
  int rc = psc__need_joined(c, "push rows", step);
  if (rc)
    return rc;
  struct psc__scall sc = {.c = c,
                          .push = 1,
                          .rows = (struct psc__rows *)r,
                          .sync = 1,
                          .step = step,
                          .seq = ++c->sparse_seq};
  rc = sparse_call(&sc, nr);
  *closed = sc.closed;
  return rc;
}
