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
 * Every per-shard array is sized for the pool, so a re-plan to any count
 * 1..nps needs no new channels. A "moved" answer is neither an outage nor
 * a retry; a call re-plans at most PSC__MAX_REPLANS times. Declares and
 * sparse calls re-plan from their own files (declare.c, sparse.c). */
#include "client_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "layout.h"
#include "log.h"
#include "shm_client.h"

#define MOVED_PREFIX "layout moved: "

int psc__is_moved(const struct cm_unary *u) {
  return u->status == GRPC_STATUS_FAILED_PRECONDITION &&
         strncmp(u->details, MOVED_PREFIX, sizeof MOVED_PREFIX - 1) == 0;
}

int psc__moved_parse(const char *details, int *shard, uint64_t *layout,
                     int *nshards, int *rows) {
  unsigned long long v = 0;
  int s = -1, n = 0, end = 0;
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
    size_t w = strcspn(details + end + 10, ";");
    char word[16];
    if (w >= sizeof word)
      return CM_EPROTO;
    memcpy(word, details + end + 10, w);
    word[w] = 0;
    if (!(rule = cm_layout_rule_parse(word)))
      return CM_EPROTO;
    end += 10 + (int)w;
  }
  if (details[end] != ';' && details[end] != '\0')
    return CM_EPROTO;
  *shard = s;
  *layout = v;
  *nshards = n;
  *rows = rule;
  return 0;
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

/* Takes layout `layout` of n shards (checked against the pool by the
 * caller): every boot id forgotten, the arenas dropped, the variables
 * re-placed, the plan made again, one line said when `say`. */
static int take(struct psc__client *c, uint64_t layout, int n, int rows,
                int say, const char *what) {
  int from = c->nshards, rc;
  uint64_t was = c->layout;
  c->layout = layout;
  c->nshards = n;
  cm_layout_map_init(&c->map, rows, n);
  /* New processes: their boot ids come with their next Declare. */
  memset(c->boot, 0, (size_t)c->spec->nps * sizeof *c->boot);
  for (int s = n; s < c->spec->nps; s++)
    c->out[s].since = 0; /* out of the layout: no outage to wait for */
  drop_arenas(c);
  for (int i = 0; i < c->nvars; i++)
    c->vars[i].placement = psc__replace(&c->vars[i], from, n);
  if ((rc = psc__plan(c))) {
    psc__seterr(c, "%s: out of memory", what);
    return rc;
  }
  if (say)
    cm_info("layout moved: now layout %llu of %d shards (was %llu of %d); "
            "re-planned",
            (unsigned long long)layout, n, (unsigned long long)was, from);
  /* Declare moves to the Unix sockets; a re-plan does too (a socket of a
   * shard that restarted was left for TCP when its call failed). */
  if ((c->nvars || c->ntables) && (rc = psc__use_unix_sockets(c)))
    psc__seterr(c, "%s: out of memory", what);
  return rc;
}

/* The count n of layout `layout` against c's pool; 0 or CM_ERANGE said. */
static int in_pool(struct psc__client *c, int shard, uint64_t layout, int n,
                   const char *what) {
  if (n >= 1 && n <= c->spec->nps)
    return 0;
  psc__seterr(c,
              "%s: ps:%d says the job moved to layout %llu of %d shards, "
              "but this client's spec lists %d ps addresses (a layout "
              "holds 1..%d shards); start every task from the job's spec",
              what, shard, (unsigned long long)layout, n, c->spec->nps,
              c->spec->nps);
  return CM_ERANGE;
}

int psc__relayout(struct psc__client *c, const char *details,
                  const char *what) {
  int shard, n, rows, rc;
  uint64_t layout;
  if (psc__moved_parse(details, &shard, &layout, &n, &rows)) {
    psc__seterr(c,
                "%s: a shard answered that the job's layout moved, in a "
                "message this client does not understand: %s",
                what, details);
    return CM_EPROTO;
  }
  if ((rc = in_pool(c, shard, layout, n, what)))
    return rc;
  if (layout == c->layout && n == c->nshards && rows == c->map.rule) {
    psc__seterr(c,
                "%s: ps:%d answered that the job's layout moved, but names "
                "the layout this client planned for (layout %llu of %d "
                "shards): %s",
                what, shard, (unsigned long long)layout, n, details);
    return CM_EPROTO;
  }
  return take(c, layout, n, rows, 1, what);
}

int psc__client_take_layout(struct psc__client *c, int shard, uint64_t layout,
                            int nshards, int rows) {
  int rc;
  if (layout == c->layout && nshards == c->nshards && rows == c->map.rule)
    return 0;
  if ((rc = in_pool(c, shard, layout, nshards, "layout")))
    return rc;
  return take(c, layout, nshards, rows, 0, "layout");
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
