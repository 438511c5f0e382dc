/* The job's shard layout moved (client_internal.h; docs/wire.md, "Layout
 * moved"; docs/faults.md, "A reshard under running workers"): a shard
 * answers a Data call planned for another layout FAILED_PRECONDITION
 * "layout moved: ps:S holds layout V of M shards; ...", and the client
 * follows, transparently to its caller:
 *
 *   psc__relayout      the message read, M checked against the pool of
 *                      addresses (cluster.ps), the layout taken, every boot
 *                      id forgotten (the shards are new processes), the
 *                      shared-memory arenas dropped (one per shard process),
 *                      the variables re-placed as psd --reshard placed them
 *                      (psc__replace, the reshard's own rule), the plan
 *                      made again, one line said
 *   psc__relayout_transfer  the same in the middle of a pull or push: only
 *                      what no shard acknowledged is sent again, re-cut at
 *                      the new shards' row ranges (psc__recut) with the
 *                      push's client id and seq, so that every acknowledged
 *                      piece is applied once; a re-cut push message takes a
 *                      chunk index past every planned one
 *
 * A live move of table rows (docs/reshard.md "Live") adds to the message
 * ", moving to M shards after K moves; bucket B (table 'T' row ID) is no
 * longer here": the layout's version and count stay, variables stay where
 * they are, and table ids go by cm_layout_map_moving(N, M, K), whose
 * shards (max(N, M)) all hold rows meanwhile. A call follows an answer
 * only when it names a newer layout (psc__moved_newer), the newest of its
 * round (psc__note_moved), at most PSC__MAX_REPLANS times besides the
 * steps of a move it follows already; one that names
 * none newer (a shard that has not learnt the move's latest step, or a
 * bucket between owners) is sent again after a short backoff for up to
 * moved_wait_ms (psc__follow_moved).
 *
 * Every per-shard array is sized for the pool, so a re-plan to any count
 * 1..nps needs no new channels. A "moved" answer is neither an outage nor
 * a retry. Declares and sparse calls re-plan from their own files
 * (declare.c, sparse.c). */
#include "client_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "err.h"
#include "layout.h"
#include "log.h"
#include "shm_client.h"

#define MOVED_PREFIX "layout moved: "
/* The longest wait between two sends of a call refused as moved naming no
 * newer layout (doubling from 1 ms): a bucket is between owners for its
 * hand-over's pause, the hand-over's changes written to disk and the
 * source's MOVE_DONE, some 10-20 ms, and a longer backoff would hold the
 * call past that. */
#define MOVED_BACKOFF_MS 8

int psc__is_moved(const struct cm_unary *u) {
  return u->status == GRPC_STATUS_FAILED_PRECONDITION &&
         strncmp(u->details, MOVED_PREFIX, sizeof MOVED_PREFIX - 1) == 0;
}

/* The decimal number at p (digits only, at most max) into *v; returns the
 * characters read, 0 when there is none or it is past max. */
static int number(const char *p, unsigned long long max,
                  unsigned long long *v) {
  int n = 0;
  *v = 0;
  for (; p[n] >= '0' && p[n] <= '9'; n++) {
    if (*v > (max - (unsigned)(p[n] - '0')) / 10)
      return 0;
    *v = *v * 10 + (unsigned)(p[n] - '0');
  }
  return n;
}

/* The literal word w at p, and an optional 's' after it (plurals: "1
 * shard", "2 shards"); returns the characters read, 0 when w is not
 * there. */
static int word(const char *p, const char *w) {
  size_t n = strlen(w);
  if (strncmp(p, w, n))
    return 0;
  return (int)n + (p[n] == 's');
}

/* Whether a live move of layout (n shards, rule) to `to` shards after k
 * moves is one: by buckets, to another count of a layout, k at most its
 * moves (cm_layout_moves). */
static int move_ok(int n, int rule, int to, int k) {
  uint16_t buckets[CM_LAYOUT_BUCKETS];
  if (rule != CM_LAYOUT_RULE_BUCKETS || n < 1 || n > CM_LAYOUT_MAX_SHARDS ||
      to < 1 || to > CM_LAYOUT_MAX_SHARDS || to == n || k < 0)
    return 0;
  return k <= cm_layout_moves(n, to, buckets);
}

int psc__moved_parse(const char *details, struct psc__moved *m) {
  unsigned long long v = 0, to = 0, k = 0, b = 0;
  int s = -1, n = 0, end = 0, w;
  const char *num;
  if (!details || strncmp(details, MOVED_PREFIX, sizeof MOVED_PREFIX - 1))
    return CM_EPROTO;
  /* "of 1 shard", "of 2 shards". */
  if (sscanf(details, "layout moved: ps:%d holds layout %llu of %d shard%n", &s,
             &v, &n, &end) != 3 ||
      end == 0 || s < 0)
    return CM_EPROTO;
  if (details[end] == 's')
    end++;
  /* sscanf takes "-1" for %llu: the version must be digits. */
  num = strstr(details, " holds layout ");
  if (!num || num[sizeof " holds layout " - 1] < '0' ||
      num[sizeof " holds layout " - 1] > '9')
    return CM_EPROTO;
  /* ", rows by buckets": the rule (a shard before rules: modulo). */
  int rule = CM_LAYOUT_RULE_MODULO;
  if (!strncmp(details + end, ", rows by ", 10)) {
    size_t len = strcspn(details + end + 10, ",;");
    char name[16];
    if (len >= sizeof name)
      return CM_EPROTO;
    memcpy(name, details + end + 10, len);
    name[len] = 0;
    if (!(rule = cm_layout_rule_parse(name)))
      return CM_EPROTO;
    end += 10 + (int)len;
  }
  /* ", moving to M shards after K moves": a live move under way. */
  if (!strncmp(details + end, ", moving to ", 12)) {
    end += 12;
    if (!(w = number(details + end, CM_LAYOUT_MAX_SHARDS, &to)) ||
        details[end += w] != ' ' || !(w = word(details + ++end, "shard")) ||
        strncmp(details + (end += w), " after ", 7) ||
        !(w = number(details + (end += 7), CM_LAYOUT_BUCKETS, &k)) ||
        details[end += w] != ' ' || !(w = word(details + ++end, "move")))
      return CM_EPROTO;
    end += w;
    if (!move_ok(n, rule, (int)to, (int)k))
      return CM_EPROTO;
  }
  if (details[end] != ';' && details[end] != '\0')
    return CM_EPROTO;
  /* "; bucket B (table 'T' row ID) is no longer here": the bucket. */
  int bucket = -1;
  if (!strncmp(details + end, "; bucket ", 9)) {
    if (!number(details + end + 9, CM_LAYOUT_BUCKETS - 1, &b))
      return CM_EPROTO;
    bucket = (int)b;
  }
  *m = (struct psc__moved){.shard = s,
                           .layout = v,
                           .nshards = n,
                           .rows = rule,
                           .move_to = (int)to,
                           .moves = (int)k,
                           .bucket = bucket};
  return 0;
}

int psc__moved_later(const struct psc__moved *a, const struct psc__moved *b) {
  if (a->layout != b->layout)
    return a->layout > b->layout;
  if (!a->move_to)
    return 0;
  return !b->move_to || (a->move_to == b->move_to && a->moves > b->moves);
}

int psc__moved_newer(const struct psc__client *c, const struct psc__moved *m) {
  struct psc__moved mine = {.layout = c->layout,
                            .nshards = c->nshards,
                            .rows = c->map.rule,
                            .move_to = c->move_to,
                            .moves = c->moves};
  if (psc__moved_later(m, &mine))
    return 1;
  /* No move said, in the client's version: a shard that has not learnt
   * of the move yet while the client has (the move's end steps the
   * version); else, neither moving, the layout the client opened with
   * (job.shards, buckets) corrected. */
  return m->layout == c->layout && !m->move_to && !c->move_to &&
         (m->nshards != c->nshards || m->rows != c->map.rule);
}

int psc__replace(const struct psc__var *v, int from, int to) {
  return cm_layout_replace(v->asked, v->placement, from, v->name,
                           psc__numel(v) * sizeof(float), to);
}

/* Room for one more entry of *a (of size elem), *cap growing. */
static int grow(void **a, int n, int *cap, size_t elem) {
  if (n < *cap)
    return 0;
  int nc = *cap ? 2 * *cap : 16;
  void *g = realloc(*a, (size_t)nc * elem);
  if (!g)
    return CM_ENOMEM;
  *a = g;
  *cap = nc;
  return 0;
}

int psc__recut(const struct psc__var *vars, const struct psc__piece *in,
               int nin, int nshards, uint64_t chunk, struct psc__piece **pieces,
               int *npieces, struct psc__msg **msgs, int *nmsgs) {
  struct psc__piece *p = NULL;
  struct psc__msg *m = NULL;
  int np = 0, nm = 0, cap_p = 0, cap_m = 0;
  chunk = chunk ? chunk : 1;
  for (int s = 0; s < nshards; s++) {
    int cur = -1;        /* this shard's open message */
    uint64_t in_cur = 0; /* its elements */
    for (int i = 0; i < nin; i++) {
      const struct psc__var *v = &vars[in[i].var];
      uint64_t row = psc__numel(v) / (uint64_t)v->shape[0];
      int64_t rb, re;
      cm_layout_rows(v->shape[0], v->placement, nshards, s, &rb, &re);
      uint64_t lo = (uint64_t)rb * row, hi = (uint64_t)re * row;
      if (lo < in[i].offset)
        lo = in[i].offset;
      if (hi > in[i].offset + in[i].count)
        hi = in[i].offset + in[i].count;
      while (lo < hi) {
        if (cur < 0 || in_cur >= chunk) {
          if (grow((void **)&m, nm, &cap_m, sizeof *m))
            goto nomem;
          m[nm] = (struct psc__msg){.shard = s, .first = np, .lead = cur < 0};
          cur = nm++;
          in_cur = 0;
        }
        uint64_t k = hi - lo < chunk - in_cur ? hi - lo : chunk - in_cur;
        if (grow((void **)&p, np, &cap_p, sizeof *p))
          goto nomem;
        p[np++] = (struct psc__piece){in[i].var, lo, k};
        m[cur].npieces++;
        m[cur].bytes += k * sizeof(float);
        in_cur += k;
        lo += k;
      }
    }
  }
  *pieces = p;
  *npieces = np;
  *msgs = m;
  *nmsgs = nm;
  return 0;
nomem:
  free(p);
  free(m);
  return CM_ENOMEM;
}

void psc__plan_save_free(struct psc__plan_save *p) {
  if (p->held) {
    free(p->pieces);
    free(p->msgs);
    free(p->calls);
    free(p->call_pair);
    free(p->pending);
  }
  memset(p, 0, sizeof *p);
}

void psc__plan_restore(struct psc__client *c) {
  if (!c->full.held)
    return;
  free(c->pieces);
  free(c->msgs);
  free(c->calls);
  free(c->call_pair);
  free(c->pending);
  c->pieces = c->full.pieces;
  c->npieces = c->full.npieces;
  c->msgs = c->full.msgs;
  c->nmsgs = c->full.nmsgs;
  c->calls = c->full.calls;
  c->call_pair = c->full.call_pair;
  c->pending = c->full.pending;
  memset(&c->full, 0, sizeof c->full);
}

/* Drops every arena no other transfer holds: each belonged to a shard
 * process that is gone, and the next transfer registers new ones. */
static void drop_arenas(struct psc__client *c) {
  for (int s = 0; c->shm && s < c->spec->nps; s++) {
    struct psc__shm *sh = &c->shm[s];
    if (sh->held || pthread_mutex_trylock(&sh->busy))
      continue;
    psc__shm_retire(c, s);
    sh->said = 0;
    sh->refused_at = 0;
    pthread_mutex_unlock(&sh->busy);
  }
}

/* A layout in words: "layout 1 of 3 shards", "layout 0 of 2 shards moving
 * to 3 after 5 of 1366 moves"; `brief`: "1 of 3", "0 of 2 moving to ...".
 * Returns buf. */
static const char *layout_text(uint64_t layout, int n, int to, int k, int brief,
                               char *buf, size_t len) {
  uint16_t buckets[CM_LAYOUT_BUCKETS];
  int w =
      snprintf(buf, len, brief ? "%llu of %d%s" : "layout %llu of %d shard%s",
               (unsigned long long)layout, n,
               brief    ? ""
               : n == 1 ? ""
                        : "s");
  if (to && w > 0 && (size_t)w < len)
    snprintf(buf + w, len - (size_t)w, " moving to %d after %d of %d moves", to,
             k, cm_layout_moves(n, to, buckets));
  return buf;
}

/* Takes the layout m names (checked against the pool by the caller): on
 * a new version or count, every boot id forgotten and the arenas dropped
 * (psd --reshard's shards are new processes) and the variables re-placed;
 * the row map of the layout or of its move, the plan made again, and one
 * line said when `say` (a move's later steps: a debug line). */
static int take(struct psc__client *c, const struct psc__moved *m, int say,
                const char *what) {
  int from = c->nshards, rc;
  int anew = m->layout != c->layout || m->nshards != c->nshards;
  int started = m->move_to && m->move_to != c->move_to;
  char was[96], now[96];
  layout_text(c->layout, c->nshards, c->move_to, c->moves, 1, was, sizeof was);
  c->layout = m->layout;
  c->nshards = m->nshards;
  c->move_to = m->move_to;
  c->moves = m->moves;
  cm_layout_map_of(&c->map, m->rows, m->nshards, m->move_to, m->moves);
  if (anew) {
    /* New processes: their boot ids come with their next Declare. */
    memset(c->boot, 0, (size_t)c->spec->nps * sizeof *c->boot);
    drop_arenas(c);
  }
  /* Out of the layout and its move: no outage to wait for. */
  for (int s = c->map.nshards; s < c->spec->nps; s++)
    c->out[s].since = 0;
  /* A move's steps move table rows alone. */
  for (int i = 0; from != m->nshards && i < c->nvars; i++)
    c->vars[i].placement = psc__replace(&c->vars[i], from, m->nshards);
  if ((rc = psc__plan(c))) {
    psc__seterr(c, "%s: out of memory", what);
    return rc;
  }
  layout_text(c->layout, c->nshards, c->move_to, c->moves, 0, now, sizeof now);
  if (say)
    cm_log(anew || started ? CM_LOG_INFO : CM_LOG_DEBUG,
           "layout moved: now %s (was %s); re-planned", now, was);
  /* Declare moves to the Unix sockets; a re-plan does too (a socket of a
   * shard that restarted was left for TCP when its call failed). */
  if ((c->nvars || c->ntables) && (rc = psc__use_unix_sockets(c)))
    psc__seterr(c, "%s: out of memory", what);
  return rc;
}

/* The counts of layout m against c's pool; 0 or CM_ERANGE said. */
static int in_pool(struct psc__client *c, const struct psc__moved *m,
                   const char *what) {
  int to = m->move_to && m->move_to > c->spec->nps;
  int n = to ? m->move_to : m->nshards;
  if (n >= 1 && n <= c->spec->nps)
    return 0;
  if (to)
    psc__seterr(c,
                "%s: ps:%d says the job's layout %llu is moving to %d "
                "shards, but this client's spec lists %d ps addresses (a "
                "layout holds 1..%d shards); start every task from the "
                "job's spec",
                what, m->shard, (unsigned long long)m->layout, n, c->spec->nps,
                c->spec->nps);
  else
    psc__seterr(c,
                "%s: ps:%d says the job moved to layout %llu of %d shards, "
                "but this client's spec lists %d ps addresses (a layout "
                "holds 1..%d shards); start every task from the job's spec",
                what, m->shard, (unsigned long long)m->layout, n, c->spec->nps,
                c->spec->nps);
  return CM_ERANGE;
}

int psc__relayout(struct psc__client *c, const char *details,
                  const char *what) {
  struct psc__moved m;
  char mine[96];
  int rc;
  if (psc__moved_parse(details, &m)) {
    psc__seterr(c,
                "%s: a shard answered that the job's layout moved, in a "
                "message this client does not understand: %s",
                what, details);
    return CM_EPROTO;
  }
  if ((rc = in_pool(c, &m, what)))
    return rc;
  if (!psc__moved_newer(c, &m)) {
    psc__seterr(c,
                "%s: ps:%d answered that the job's layout moved, but names "
                "no layout newer than the one this client planned for (%s): "
                "%s",
                what, m.shard,
                layout_text(c->layout, c->nshards, c->move_to, c->moves, 0,
                            mine, sizeof mine),
                details);
    return CM_EPROTO;
  }
  c->stats.replans++;
  return take(c, &m, 1, what);
}

int psc__client_take_layout(struct psc__client *c, int shard, uint64_t layout,
                            int nshards, int rows, int move_to, int moves) {
  struct psc__moved m = {shard, layout, nshards, rows, move_to, moves, -1};
  int rc;
  if (!psc__moved_newer(c, &m))
    return 0;
  if ((rc = in_pool(c, &m, "layout")))
    return rc;
  if (move_to && !move_ok(nshards, rows, move_to, moves)) {
    psc__seterr(c,
                "layout: ps:%d says layout %llu of %d shards, rows by %s, is "
                "moving to %d shards after %d moves, which is no move of "
                "buckets this client knows",
                shard, (unsigned long long)layout, nshards,
                cm_layout_rule_name(rows), move_to, moves);
    return CM_EPROTO;
  }
  return take(c, &m, 0, "layout");
}

void psc__note_moved(struct psc__client *c, int *seen, const char *details) {
  struct psc__moved now, kept;
  /* A message not understood replaces none (psc__relayout says it). */
  if (*seen &&
      (psc__moved_parse(details, &now) || psc__moved_parse(c->moved, &kept) ||
       !psc__moved_later(&now, &kept)))
    return;
  snprintf(c->moved, sizeof c->moved, "%s", details);
  *seen = 1;
}

int psc__follow_moved(struct psc__client *c, struct psc__follow *f,
                      const char *what, int transfer) {
  struct psc__moved m;
  char mine[96], which[48] = "the call";
  double now = cm_mono_ms();
  int rc;
  if (psc__moved_parse(c->moved, &m) || psc__moved_newer(c, &m)) {
    /* A newer layout, or a message psc__relayout refuses in words. More
     * bucket moves of the move the client follows already are not
     * counted: each is strictly later, and a move has at most
     * CM_LAYOUT_BUCKETS of them, so a call that follows a live move's
     * batches (ms apart when small) never fails for it. */
    int step = m.layout == c->layout && m.nshards == c->nshards && m.move_to &&
               m.move_to == c->move_to && m.moves > c->moves;
    if (!step && f->replans++ == PSC__MAX_REPLANS) {
      psc__seterr(c,
                  "%s: the job's layout moved %d times during one call; the "
                  "last answer: %s",
                  what, f->replans, c->moved);
      return CM_ERPC;
    }
    f->wait_from = 0;
    f->taken++;
    return transfer ? psc__relayout_transfer(c, c->moved, what)
                    : psc__relayout(c, c->moved, what);
  }
  /* No newer layout: a shard that knows fewer moves than the client, or a
   * bucket between its source and its destination. Sent again, unchanged,
   * after a short wait. */
  if (!f->wait_from) {
    f->wait_from = now;
    f->backoff_ms = 1;
  }
  if (m.bucket >= 0)
    snprintf(which, sizeof which, "bucket %d", m.bucket);
  if (now - f->wait_from >= c->moved_wait_ms) {
    psc__seterr(c,
                "%s: ps:%d refused %s as moved for %.1f s, naming no layout "
                "newer than this client's (%s); the last answer: %s",
                what, m.shard, which, (now - f->wait_from) / 1000,
                layout_text(c->layout, c->nshards, c->move_to, c->moves, 0,
                            mine, sizeof mine),
                c->moved);
    return CM_ERPC;
  }
  if ((rc = psc__check_interrupt(c)))
    return rc;
  c->stats.moved_waits++;
  /* The last send goes when the wait ends, not a backoff past it. */
  double ms = f->backoff_ms, left = c->moved_wait_ms - (now - f->wait_from);
  cm_sleep_ms(ms < left ? (long)ms : left >= 1 ? (long)left : 1);
  f->backoff_ms = f->backoff_ms * 2 < MOVED_BACKOFF_MS ? f->backoff_ms * 2
                                                       : MOVED_BACKOFF_MS;
  return 0;
}

/* The selected pieces of the pairs pending in c's plan, those waiting for
 * a push (kind PSC__KIND_PUSH) or a pull, into *out (owned). */
static int pending_pieces(const struct psc__client *c, int kind,
                          struct psc__piece **out, int *n) {
  int cap = 0;
  *out = NULL;
  *n = 0;
  for (int i = 0; i < c->nmsgs; i++) {
    const struct psc__msg *m = &c->msgs[i];
    if (!c->pending[2 * i + (kind == PSC__KIND_PULL)])
      continue;
    for (int k = 0; k < m->npieces; k++) {
      const struct psc__piece *p = &c->pieces[m->first + k];
      if (kind == PSC__KIND_PUSH ? !psc__pushed(c, p->var)
                                 : !psc__selected(c, p->var))
        continue;
      if (grow((void **)out, *n, &cap, sizeof **out))
        return CM_ENOMEM;
      (*out)[(*n)++] = *p;
    }
  }
  return 0;
}

int psc__relayout_transfer(struct psc__client *c, const char *details,
                           const char *what) {
  struct psc__piece *push_in = NULL, *pull_in = NULL, *pp = NULL, *pq = NULL;
  struct psc__msg *mp = NULL, *mq = NULL;
  int npush = 0, npull = 0, npp = 0, npq = 0, nmp = 0, nmq = 0, rc;
  uint64_t chunk = c->o.chunk_bytes / sizeof(float);
  if ((rc = pending_pieces(c, PSC__KIND_PUSH, &push_in, &npush)) ||
      (rc = pending_pieces(c, PSC__KIND_PULL, &pull_in, &npull)))
    goto nomem;
  /* A remainder of an earlier move is what is pending now: the full plan
   * it put aside comes back first (psc__relayout makes it again). */
  psc__plan_restore(c);
  if ((rc = psc__relayout(c, details, what)))
    goto out;
  if ((rc = psc__recut(c->vars, push_in, npush, c->nshards, chunk, &pp, &npp,
                       &mp, &nmp)) ||
      (rc = psc__recut(c->vars, pull_in, npull, c->nshards, chunk, &pq, &npq,
                       &mq, &nmq)))
    goto nomem;
  c->full =
      (struct psc__plan_save){c->pieces, c->npieces,   c->msgs,    c->nmsgs,
                              c->calls,  c->call_pair, c->pending, 1};
  c->pieces = NULL;
  c->msgs = NULL;
  c->calls = NULL;
  c->call_pair = NULL;
  c->pending = NULL;
  c->npieces = npp + npq;
  c->nmsgs = nmp + nmq;
  c->pieces = malloc(((size_t)c->npieces + 1) * sizeof *c->pieces);
  c->msgs = malloc(((size_t)c->nmsgs + 1) * sizeof *c->msgs);
  c->calls = calloc(2 * (size_t)c->nmsgs + 1, sizeof *c->calls);
  c->call_pair = calloc(2 * (size_t)c->nmsgs + 1, sizeof *c->call_pair);
  c->pending = calloc(2 * (size_t)c->nmsgs + 1, 1);
  if (!c->pieces || !c->msgs || !c->calls || !c->call_pair || !c->pending) {
    rc = CM_ENOMEM;
    goto nomem;
  }
  if (npp)
    memcpy(c->pieces, pp, (size_t)npp * sizeof *pp);
  if (npq)
    memcpy(c->pieces + npp, pq, (size_t)npq * sizeof *pq);
  for (int i = 0; i < nmp; i++) {
    c->msgs[i] = mp[i];
    c->msgs[i].kinds = PSC__KIND_PUSH;
    /* Past every chunk index the plan gave a message of this push. */
    c->msgs[i].chunk = c->chunk_next++;
    c->pending[2 * i] = 1;
  }
  for (int i = 0; i < nmq; i++) {
    c->msgs[nmp + i] = mq[i];
    c->msgs[nmp + i].kinds = PSC__KIND_PULL;
    c->msgs[nmp + i].first += npp;
    c->pending[2 * (nmp + i) + 1] = 1;
  }
  goto out;
nomem:
  psc__seterr(c, "%s: out of memory", what);
out:
  free(push_in);
  free(pull_in);
  free(pp);
  free(pq);
  free(mp);
  free(mq);
  return rc;
}
