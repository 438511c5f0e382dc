/* The serving client's object and its calls (serving.h): a channel to every
 * task of cluster.serve, the replica each shard uses now, and
 * psc__serving_call, which sends one message per shard and moves a shard to
 * its next replica when the one in use cannot be reached. Also one task's
 * Admin/Status for psctl serving. */
#include "serving.h"

#include <stdint.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "auth.h"
#include "client_internal.h"
#include "clock.h"
#include "err.h"
#include "layout.h"
#include "log.h"
#include "ps.pb-c.h"
#include "rpc.h"
#include "rpc_client.h"
#include "wire.h"

/* After every replica of a shard failed in a row: BACKOFF_MS, doubling up
 * to BACKOFF_MAX_MS (as retry.c's for the training shards). */
#define BACKOFF_MS 100
#define BACKOFF_MAX_MS 2000

/* A table's dim, as a serving task answered it. */
struct known_dim {
  char name[201]; /* the table */
  uint32_t dim;   /* its floats per row */
};

struct psc__serving {
  const struct cm_spec *spec;        /* borrowed */
  char worker[64];                   /* identity sent with every call */
  uint64_t spec_fp;                  /* cm_spec_fingerprint(spec) */
  struct cm_creds creds;             /* owned: the spec's token and TLS */
  int nshards;                       /* training shards, spec->nps */
  struct cm_layout_map map;          /* their row map: where each id is looked
                                        up (a fresh job's buckets, until a task
                                        answers "rows moved") */
  int rows_moved;                    /* the last call ended on "rows moved" and
                                        map took the task's rule, or on "layout
                                        moved" naming a layout not known */
  int job_shards;                    /* the count a new job starts on */
  struct psc__moved *held;           /* owned, per shard: the layout its serving
                                        task's publications place rows by, as
                                        its last answer said (nshards 0: none
                                        heard) */
  uint16_t route[CM_LAYOUT_BUCKETS]; /* per bucket: the shard asked */
  int route_dirty;                   /* held changed since route was built */
  struct psc__moved prev;            /* the latest word before the latest layout
                                        (nshards 0: not seen): a bucket's owner while
                                        its new owner's task lags a switch */
  double probed_ms;                  /* cm_mono_ms of the last probe */
  int nrep;                          /* replicas per shard, nserve / nps */
  int ntasks;                        /* serving tasks, nserve */
  struct cm_channel **ch;            /* owned, one per serving task */
  int *cur;                          /* owned, per shard: the replica in use */
  char (*cause)[256];           /* owned, per task: its last failure in words */
  int timeout_ms;               /* deadline of each call */
  double retry_ms;              /* budget of a shard's outage, ms; <= 0: one
                                   round of its replicas */
  grpc_completion_queue *cq;    /* reused by every call */
  int (*interrupt)(void *);     /* psc__serving_set_interrupt's poll */
  void *interrupt_arg;          /* passed to it */
  uint64_t failovers;           /* calls moved to another replica */
  struct known_dim *dims;       /* owned: the tables' dims learnt */
  int ndims;                    /* entries in dims */
  char err[2048];               /* the last error */
  grpc_status_code last_status; /* of the last failed answer */
};

int psc__serving_fail(struct psc__serving *s, int rc, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(s->err, sizeof s->err, fmt, ap);
  va_end(ap);
  return rc;
}

int psc__serving_new(struct psc__serving **out, const struct cm_spec *spec,
                     const struct psc__serving_opts *o, char *err,
                     size_t errlen) {
  struct psc__serving *s = NULL;
  struct psc__serving_opts given = {0};
  int rc = 0, base;
  *out = NULL;
  if (o)
    given = *o;
  if (spec->nserve < 1 || !spec->serve) {
    snprintf(err, errlen,
             "%s: no cluster.serve: the job has no serving tasks to look up "
             "from",
             spec->source);
    return CM_EINVAL;
  }
  if (!cm_layout_serve_replicas(spec->nserve, spec->nps)) {
    snprintf(err, errlen,
             "%s: cluster.serve has %d tasks, not a multiple of the %d "
             "shards",
             spec->source, spec->nserve, spec->nps);
    return CM_EINVAL;
  }
  if (!(s = calloc(1, sizeof *s)))
    return CM_ENOMEM;
  cm_rpc_global_init(); /* balanced in psc__serving_free */
  cm_rpc_set_max_message((long long)spec->job.max_message_mb << 20);
  s->spec = spec;
  s->spec_fp = cm_spec_fingerprint(spec);
  snprintf(s->worker, sizeof s->worker, "%s",
           given.worker ? given.worker : "psc");
  s->nshards = spec->nps;
  s->job_shards = spec->job.shards > 0 ? spec->job.shards : spec->nps;
  cm_layout_map_init(&s->map, CM_LAYOUT_RULE_BUCKETS, s->nshards);
  s->route_dirty = 1;
  s->ntasks = spec->nserve;
  s->nrep = cm_layout_serve_replicas(spec->nserve, spec->nps);
  s->timeout_ms = given.timeout_ms > 0       ? given.timeout_ms
                  : spec->job.timeout_ms > 0 ? spec->job.timeout_ms
                                             : 30000;
  if (given.retry_s == 0)
    given.retry_s = spec->job.retry_s;
  s->retry_ms = given.retry_s > 0 ? given.retry_s * 1000 : 0;
  s->cq = grpc_completion_queue_create_for_next(NULL);
  if ((rc = cm_creds_load(&spec->auth, 0, &s->creds, err, errlen)))
    goto out;
  if (!(s->ch = calloc((size_t)s->ntasks, sizeof *s->ch)) ||
      !(s->cause = calloc((size_t)s->ntasks, sizeof *s->cause)) ||
      !(s->cur = calloc((size_t)s->nshards, sizeof *s->cur)) ||
      !(s->held = calloc((size_t)s->nshards, sizeof *s->held))) {
    rc = CM_ENOMEM;
    snprintf(err, errlen, "out of memory");
    goto out;
  }
  for (int t = 0; t < s->ntasks; t++)
    if ((rc = cm_channel_new(&s->ch[t], spec->serve[t].text, &s->creds))) {
      snprintf(err, errlen, "serve:%d (%s): cannot open a channel: %s", t,
               spec->serve[t].text, cm_strerror(rc));
      goto out;
    }
  base = given.replica >= 0 ? given.replica : (int)(getpid() & 0x7fffffff);
  for (int sh = 0; sh < s->nshards; sh++)
    s->cur[sh] = base % s->nrep;
out:
  if (rc) {
    psc__serving_free(s);
    s = NULL;
  }
  *out = s;
  return rc;
}

void psc__serving_free(struct psc__serving *s) {
  if (!s)
    return;
  for (int t = 0; s->ch && t < s->ntasks; t++)
    cm_channel_free(s->ch[t]);
  free(s->ch);
  free(s->cause);
  free(s->cur);
  free(s->held);
  free(s->dims);
  cm_creds_free(&s->creds);
  if (s->cq)
    cm_queue_free(s->cq);
  free(s);
  cm_rpc_global_shutdown();
}

const char *psc__serving_error(const struct psc__serving *s) { return s->err; }
grpc_status_code psc__serving_last_status(const struct psc__serving *s) {
  return s->last_status;
}
int psc__serving_shards(const struct psc__serving *s) { return s->nshards; }
int psc__serving_replicas(const struct psc__serving *s) { return s->nrep; }
const char *psc__serving_addr(const struct psc__serving *s, int task) {
  return s->spec->serve[task].text;
}
uint64_t psc__serving_failovers(const struct psc__serving *s) {
  return s->failovers;
}

int psc__serving_task(const struct psc__serving *s, int shard) {
  return cm_layout_serve_task(shard, s->cur[shard], s->nshards);
}

void psc__serving_set_interrupt(struct psc__serving *s,
                                int (*interrupted)(void *), void *arg) {
  s->interrupt = interrupted;
  s->interrupt_arg = arg;
}

uint32_t psc__serving_dim_known(const struct psc__serving *s,
                                const char *table) {
  for (int i = 0; i < s->ndims; i++)
    if (!strcmp(s->dims[i].name, table))
      return s->dims[i].dim;
  return 0;
}

int psc__serving_dim_keep(struct psc__serving *s, const char *table,
                          uint32_t dim) {
  struct known_dim *grown;
  if (psc__serving_dim_known(s, table) || strlen(table) > 200)
    return 0;
  if (!(grown = realloc(s->dims, ((size_t)s->ndims + 1) * sizeof *grown)))
    return CM_ENOMEM;
  s->dims = grown;
  snprintf(grown[s->ndims].name, sizeof grown[s->ndims].name, "%s", table);
  grown[s->ndims++].dim = dim;
  return 0;
}

void psc__serving_caller(const struct psc__serving *s, Psd__V1__Caller *out) {
  psd__v1__caller__init(out);
  out->job = (char *)s->spec->job.name;
  out->worker = (char *)s->worker;
  out->spec_fp = s->spec_fp;
  out->spec_ps = s->spec->nps;
  out->spec_workers = s->spec->nworker;
  out->rows = s->map.rule;
}

int psc__serving_rows_moved(struct psc__serving *s) {
  int moved = s->rows_moved;
  s->rows_moved = 0;
  return moved;
}

/* ---- Following a reshard (docs/serving.md "Following a reshard"): each
 * shard's serving task says, in every answer, the layout and live move its
 * publications place rows by; a bucket is asked of the shard whose own
 * word of the latest layout gives it that shard (the latest such word when
 * two do: the destination of a move once its task caught up). Else its
 * new owner's task lags: it is asked of its owner in the oldest word of
 * the latest layout (during a live move, the source, which answers a
 * bucket that left it for a while), or, when that owner's task has not
 * said the latest layout either (a switch), of its owner in the layout
 * before (which answers it as its own, or as left). A shard not heard from
 * is taken to hold the latest word when it is in that layout's count,
 * nothing otherwise (a standby shard's task has published nothing before a
 * move gives it rows); a task's word of an older layout claims nothing (it
 * may hold rows a reshard took away long since). */

/* The latest word heard, or a fresh job's layout. */
static struct psc__moved latest(const struct psc__serving *s) {
  struct psc__moved l = {.nshards = s->job_shards,
                         .rows = s->map.rule ? s->map.rule
                                             : CM_LAYOUT_RULE_BUCKETS};
  int any = 0;
  for (int sh = 0; sh < s->nshards; sh++)
    if (s->held[sh].nshards && (!any || psc__moved_later(&s->held[sh], &l))) {
      l = s->held[sh];
      any = 1;
    }
  return l;
}

/* Shard sh's word, or the latest for a shard of its count not heard
 * from; nshards 0: none (a shard past it, not heard from). */
static struct psc__moved word_of(const struct psc__serving *s, int sh,
                                 const struct psc__moved *l) {
  struct psc__moved none = {0};
  if (s->held[sh].nshards)
    return s->held[sh];
  return sh < l->nshards ? *l : none;
}

/* The map a word places rows by. */
static void word_map(const struct psc__moved *w, struct cm_layout_map *m) {
  cm_layout_map_of(m, w->rows, w->nshards, w->move_to, w->moves);
}

/* Builds s->route from the words held. */
static void build_route(struct psc__serving *s) {
  struct psc__moved l = latest(s), oldest = l;
  struct cm_layout_map *maps = malloc((size_t)(s->nshards + 2) * sizeof *maps);
  struct psc__moved *w = calloc((size_t)s->nshards + 1, sizeof *w);
  if (!maps || !w) { /* without memory: the latest word's map */
    struct cm_layout_map m;
    word_map(&l, &m);
    for (unsigned b = 0; b < CM_LAYOUT_BUCKETS; b++)
      s->route[b] = m.shard[b];
    goto out;
  }
  for (int sh = 0; sh < s->nshards; sh++) {
    w[sh] = word_of(s, sh, &l);
    if (w[sh].nshards)
      word_map(&w[sh], &maps[sh]);
    if (w[sh].nshards && w[sh].layout == l.layout &&
        psc__moved_later(&oldest, &w[sh]))
      oldest = w[sh];
  }
  word_map(&oldest, &maps[s->nshards]);
  if (s->prev.nshards)
    word_map(&s->prev, &maps[s->nshards + 1]);
  for (unsigned b = 0; b < CM_LAYOUT_BUCKETS; b++) {
    int pick = -1, o;
    for (int sh = 0; sh < s->nshards; sh++)
      if (w[sh].nshards && w[sh].layout == l.layout &&
          maps[sh].shard[b] == sh &&
          (pick < 0 || psc__moved_later(&w[sh], &w[pick])))
        pick = sh;
    if (pick < 0) {
      o = maps[s->nshards].shard[b];
      pick = o < s->nshards && w[o].layout != l.layout && s->prev.nshards
                 ? maps[s->nshards + 1].shard[b]
                 : o;
    }
    s->route[b] = (uint16_t)pick;
  }
out:
  free(maps);
  free(w);
  s->route_dirty = 0;
}

int psc__serving_route(struct psc__serving *s, uint64_t id) {
  if (s->map.rule == CM_LAYOUT_RULE_MODULO)
    return cm_layout_map_id_shard(&s->map, id);
  if (s->route_dirty)
    build_route(s);
  int sh = s->route[cm_layout_bucket(cm_layout_id_hash(id))];
  return sh < s->nshards ? sh : 0;
}

int psc__serving_layout_shards(struct psc__serving *s) {
  struct psc__moved l = latest(s);
  return l.nshards < s->nshards ? l.nshards : s->nshards;
}

int psc__serving_lagging(struct psc__serving *s, int n) {
  struct psc__moved l = latest(s);
  for (int sh = 0; sh < n && sh < s->nshards; sh++)
    if (!s->held[sh].nshards || s->held[sh].layout != l.layout)
      return 1;
  return 0;
}

int psc__serving_learn(struct psc__serving *s, int shard, uint64_t layout,
                       int nshards, int rule, int move_to, int moved) {
  struct psc__moved w = {.shard = shard,
                         .layout = layout,
                         .nshards = nshards,
                         .rows = rule ? rule : CM_LAYOUT_RULE_MODULO,
                         .move_to = move_to,
                         .moves = move_to ? moved : 0,
                         .bucket = -1};
  struct psc__moved *h;
  if (shard < 0 || shard >= s->nshards || nshards < 1 ||
      nshards > CM_LAYOUT_MAX_SHARDS)
    return 0;
  h = &s->held[shard];
  if (h->nshards && h->layout == w.layout && h->nshards == w.nshards &&
      h->rows == w.rows && h->move_to == w.move_to && h->moves == w.moves)
    return 0;
  struct psc__moved before = latest(s);
  *h = w;
  if (w.layout > before.layout) /* a new layout: the one before, kept */
    s->prev = before;
  s->route_dirty = 1;
  return 1;
}

void psc__serving_belief(const struct psc__serving *s, int shard,
                         Psd__V1__Caller *c) {
  const struct psc__moved *h = &s->held[shard];
  if (!h->nshards)
    return; /* nothing heard: a fresh job's word (shards 0) */
  c->layout = h->layout;
  c->shards = h->nshards;
  c->move_to = (uint32_t)h->move_to;
  c->moved = (uint32_t)h->moves;
}

/* A task's "layout moved: ps:S holds layout ..." answer: S's word, kept.
 * Returns 1 when it was news, 0 when not (or not such an answer). */
static int take_layout(struct psc__serving *s, int shard,
                       const struct cm_unary *u) {
  struct psc__moved m;
  if (u->status != GRPC_STATUS_FAILED_PRECONDITION ||
      psc__moved_parse(u->details, &m) || m.shard != shard)
    return 0;
  return psc__serving_learn(s, shard, m.layout, m.nshards, m.rows, m.move_to,
                            m.moves);
}

int psc__serving_probe(struct psc__serving *s) {
  struct cm_unary *calls;
  int n = 0, news = 0;
  if (cm_mono_ms() - s->probed_ms < 100 ||
      !(calls = calloc((size_t)s->nshards, sizeof *calls)))
    return 0;
  s->probed_ms = cm_mono_ms();
  /* An empty Lookup of every shard's task in use, tried once: its word (a
   * task with no publication yet answers UNAVAILABLE, and stays unheard). */
  for (int sh = 0; sh < s->nshards; sh++) {
    Psd__V1__LookupRequest req = PSD__V1__LOOKUP_REQUEST__INIT;
    Psd__V1__Caller caller;
    psc__serving_caller(s, &caller);
    req.caller = &caller;
    req.table = (char *)"";
    calls[n].channel = s->ch[psc__serving_task(s, sh)];
    calls[n].method = "/psd.v1.Serve/Lookup";
    calls[n].user = (void *)(intptr_t)sh;
    if ((calls[n].request = cm_rpc_pack(&req.base)))
      n++;
  }
  struct cm_run_opts ro = {.timeout_ms =
                               s->timeout_ms < 2000 ? s->timeout_ms : 2000,
                           .inflight = 1,
                           .cq = s->cq,
                           .interrupted = s->interrupt,
                           .interrupt_ctx = s->interrupt_arg};
  cm_client_run(calls, n, &ro);
  for (int k = 0; k < n; k++) {
    struct cm_unary *u = &calls[k];
    Psd__V1__LookupResponse *r;
    struct cm_wire_msg w;
    if (u->status == GRPC_STATUS_OK && !cm_wire_parse(&w, u->response)) {
      if ((r = psd__v1__lookup_response__unpack(NULL, w.head_len, w.head))) {
        news |=
            psc__serving_learn(s, (int)(intptr_t)u->user, r->layout, r->shards,
                               r->rows, (int)r->move_to, (int)r->moved);
        psd__v1__lookup_response__free_unpacked(r, NULL);
      }
      cm_wire_msg_release(&w);
    }
    cm_unary_release(u);
  }
  free(calls);
  return news;
}

/* A task's "rows moved: serve:J places rows by RULE ..." answer: the map
 * takes RULE. Returns 1 when it did (the caller plans again), 0 when the
 * answer is not that, or names the rule planned for already. */
static int take_rows(struct psc__serving *s, const struct cm_unary *u) {
  static const char pre[] = "rows moved: serve:";
  const char *by = strstr(u->details, " places rows by ");
  char word[16];
  int rule, n = 0;
  if (u->status != GRPC_STATUS_FAILED_PRECONDITION ||
      strncmp(u->details, pre, sizeof pre - 1) || !by ||
      sscanf(by, " places rows by %15[a-z]%n", word, &n) != 1 || !n ||
      !(rule = cm_layout_rule_parse(word)) || rule == s->map.rule)
    return 0;
  cm_layout_map_init(&s->map, rule, s->nshards);
  return 1;
}

/* One shard's part of a psc__serving_call. */
struct part {
  int want;     /* 1 while it waits for an answer */
  double since; /* cm_mono_ms() of its first failure in this call, 0: none */
  int fails;    /* failures in a row */
  int rc;       /* its answer's read (psc__sv_read), 0 */
};

/* What on_done needs. */
struct run_ctx {
  struct part *parts; /* per shard */
  psc__sv_read read;  /* reads an OK answer */
  void *ctx;          /* read's */
  unsigned char *nf;  /* NOT_FOUND taken as an answer, or NULL */
};

static void on_done(struct cm_unary *u, void *arg) {
  struct run_ctx *r = arg;
  int shard = (int)(intptr_t)u->user;
  if (u->status == GRPC_STATUS_OK)
    r->parts[shard].rc = r->read(shard, u->response, r->ctx);
}

/* Task t's failure u in words, into s->cause[t]. */
static void note_cause(struct psc__serving *s, int t,
                       const struct cm_unary *u) {
  char words[256];
  if (psc__reach_cause(u->status, u->details, cm_channel_connected(s->ch[t]),
                       s->timeout_ms / 1000.0, words, sizeof words))
    snprintf(s->cause[t], sizeof s->cause[t], "%s", words);
  else
    snprintf(s->cause[t], sizeof s->cause[t], "%s: %s",
             cm_rpc_status_name(u->status), u->details);
}

/* The outage error: every replica of shard and why it failed. */
static int unreachable(struct psc__serving *s, int shard, const char *what,
                       double waited_ms) {
  size_t at;
  at = (size_t)snprintf(s->err, sizeof s->err,
                        "%s: no serving task of shard %d answered within "
                        "%.1f s (job.retry_s):",
                        what, shard, waited_ms / 1000);
  for (int r = 0; r < s->nrep && at < sizeof s->err; r++) {
    int t = cm_layout_serve_task(shard, r, s->nshards);
    at += (size_t)snprintf(
        s->err + at, sizeof s->err - at, "%s serve:%d (%s): %s", r ? ";" : "",
        t, s->spec->serve[t].text, s->cause[t][0] ? s->cause[t] : "not tried");
  }
  return CM_EUNAVAIL;
}

/* Waits before trying the shards that failed on every replica again: the
 * backoff of attempt `round`, cut short when one of their channels
 * connects. */
static void back_off(struct psc__serving *s, const struct part *parts,
                     int round) {
  unsigned char *which = calloc((size_t)s->ntasks, 1);
  double ms = BACKOFF_MS;
  for (int i = 1; i < round && ms < BACKOFF_MAX_MS; i++)
    ms *= 2;
  if (ms > BACKOFF_MAX_MS)
    ms = BACKOFF_MAX_MS;
  if (!which) {
    cm_sleep_ms((long)ms);
    return;
  }
  for (int sh = 0; sh < s->nshards; sh++)
    if (parts[sh].want)
      for (int r = 0; r < s->nrep; r++)
        which[cm_layout_serve_task(sh, r, s->nshards)] = 1;
  cm_channels_await(s->ch, which, s->ntasks, s->cq, ms);
  free(which);
}

int psc__serving_call(struct psc__serving *s, const unsigned char *want,
                      const char *what, const char *method, psc__sv_build build,
                      psc__sv_read read, void *ctx, unsigned char *not_found) {
  struct part *parts = calloc((size_t)s->nshards, sizeof *parts);
  struct cm_unary *calls = calloc((size_t)s->nshards, sizeof *calls);
  struct run_ctx rc_ = {
      .parts = parts, .read = read, .ctx = ctx, .nf = not_found};
  int rc = 0, left = 0;
  s->err[0] = 0;
  s->last_status = GRPC_STATUS_OK;
  if (!parts || !calls) {
    rc = psc__serving_fail(s, CM_ENOMEM, "%s: out of memory", what);
    goto out;
  }
  for (int sh = 0; sh < s->nshards; sh++)
    left += parts[sh].want = want[sh] != 0;
  for (int round = 1; left > 0; round++) {
    struct cm_run_opts ro = {.timeout_ms = s->timeout_ms,
                             .inflight = 1,
                             .done = on_done,
                             .ctx = &rc_,
                             .cq = s->cq,
                             .interrupted = s->interrupt,
                             .interrupt_ctx = s->interrupt_arg};
    int n = 0, stuck = 0, run_rc;
    for (int sh = 0; sh < s->nshards; sh++) {
      if (!parts[sh].want)
        continue;
      memset(&calls[n], 0, sizeof calls[n]);
      calls[n].channel = s->ch[psc__serving_task(s, sh)];
      calls[n].method = method;
      calls[n].user = (void *)(intptr_t)sh;
      parts[sh].rc = 0;
      if (!(calls[n++].request = build(sh, ctx))) {
        for (int k = 0; k < n - 1; k++)
          cm_unary_release(&calls[k]);
        rc = psc__serving_fail(s, CM_ENOMEM, "%s: out of memory", what);
        goto out;
      }
    }
    run_rc = cm_client_run(calls, n, &ro);
    for (int k = 0; k < n && !rc; k++) {
      struct cm_unary *u = &calls[k];
      int sh = (int)(intptr_t)u->user, t = psc__serving_task(s, sh);
      struct part *p = &parts[sh];
      if (u->status == GRPC_STATUS_OK && p->rc) {
        rc = p->rc; /* read said why */
      } else if (u->status == GRPC_STATUS_OK ||
                 (u->status == GRPC_STATUS_NOT_FOUND && not_found)) {
        if (u->status == GRPC_STATUS_NOT_FOUND)
          not_found[sh] = 1;
        p->want = 0;
        left--;
      } else if (run_rc == CM_ECANCELED) {
        rc = psc__serving_fail(s, CM_ECANCELED, "%s: interrupted", what);
      } else if (psc__retryable(u->status)) {
        note_cause(s, t, u);
        if (!p->since)
          p->since = cm_mono_ms();
        p->fails++;
        s->cur[sh] = (s->cur[sh] + 1) % s->nrep;
        if (s->nrep > 1) {
          s->failovers++;
          cm_warn("%s: serve:%d (%s) failed: %s; trying serve:%d (%s)", what, t,
                  s->spec->serve[t].text, s->cause[t], psc__serving_task(s, sh),
                  s->spec->serve[psc__serving_task(s, sh)].text);
        }
        if (p->fails % s->nrep == 0) {
          double waited = cm_mono_ms() - p->since;
          if (waited >= s->retry_ms)
            rc = unreachable(s, sh, what, waited);
          stuck = 1;
        }
      } else {
        s->last_status = u->status;
        s->rows_moved = take_rows(s, u) || take_layout(s, sh, u);
        if (!s->rows_moved && u->status == GRPC_STATUS_FAILED_PRECONDITION &&
            !strncmp(u->details, "layout moved: ", 14))
          s->rows_moved = 2; /* a word known: its bucket's task lags */
        rc = psc__serving_fail(s, cm_rpc_status_rc(u->status),
                               "%s at serve:%d (%s): %s: %s", what, t,
                               s->spec->serve[t].text,
                               cm_rpc_status_name(u->status), u->details);
      }
    }
    for (int k = 0; k < n; k++)
      cm_unary_release(&calls[k]);
    if (rc)
      break;
    if (stuck && left > 0)
      back_off(s, parts, round);
  }
out:
  free(parts);
  free(calls);
  return rc;
}

int psc__serving_status(struct psc__serving *s, int task,
                        struct psc__serve_status *out) {
  Psd__V1__Caller caller;
  Psd__V1__StatusRequest req = PSD__V1__STATUS_REQUEST__INIT;
  Psd__V1__StatusResponse *resp = NULL;
  struct cm_unary u;
  struct cm_run_opts ro = {
      .timeout_ms = s->timeout_ms, .inflight = 1, .cq = s->cq};
  const Psd__V1__ServingStatus *sv;
  int rc;
  memset(out, 0, sizeof *out);
  memset(&u, 0, sizeof u);
  s->err[0] = 0;
  s->last_status = GRPC_STATUS_OK;
  if (task < 0 || task >= s->ntasks)
    return psc__serving_fail(s, CM_EINVAL,
                             "status: no serve:%d; cluster.serve has %d", task,
                             s->ntasks);
  psc__serving_caller(s, &caller);
  req.caller = &caller;
  u.channel = s->ch[task];
  u.method = "/psd.v1.Admin/Status";
  u.request = cm_rpc_pack(&req.base);
  if (!u.request)
    return psc__serving_fail(s, CM_ENOMEM, "status: out of memory");
  if ((rc = cm_client_run(&u, 1, &ro))) {
    char words[800];
    if (!psc__reach_cause(u.status, u.details,
                          cm_channel_connected(s->ch[task]),
                          s->timeout_ms / 1000.0, words, sizeof words)) {
      s->last_status = u.status;
      snprintf(words, sizeof words, "%s: %s", cm_rpc_status_name(u.status),
               u.details);
    }
    psc__serving_fail(s, rc, "serve:%d (%s): %s", task,
                      s->spec->serve[task].text, words);
    goto out;
  }
  if (!(resp = (Psd__V1__StatusResponse *)cm_rpc_unpack(
            u.response, &psd__v1__status_response__descriptor))) {
    rc = psc__serving_fail(s, CM_EPROTO, "serve:%d (%s): malformed status",
                           task, s->spec->serve[task].text);
    goto out;
  }
  if ((sv = resp->serving)) {
    out->serving = 1;
    out->replica = sv->replica;
    out->shard = sv->shard;
    snprintf(out->dir, sizeof out->dir, "%s", sv->dir ? sv->dir : "");
    out->version = sv->version;
    out->step = sv->step;
    out->time_unix_ms = sv->time_unix_ms;
    out->newest_seen = sv->newest_seen;
    out->rows = sv->rows;
    out->bytes = sv->bytes;
    out->applied = sv->applied;
    out->refused = sv->refused;
    snprintf(out->last_refusal, sizeof out->last_refusal, "%s",
             sv->last_refusal ? sv->last_refusal : "");
    out->lookups = sv->lookups;
    out->layout = sv->layout;
    out->shards = sv->shards;
    out->move_to = (int)sv->move_to;
    out->moved = (int)sv->moved;
  }
out:
  if (resp)
    psd__v1__status_response__free_unpacked(resp, NULL);
  cm_unary_release(&u);
  return rc;
}
