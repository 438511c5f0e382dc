/* The variables' Declare, in two rounds (client_internal.h,
 * psc__declare_vars; docs/wire.md, "Initial values"), so that a variable
 * split across shards gets all its rows from one client, whoever declares
 * it at the same time:
 *
 *   round 1  every variable to every shard, except a variable with rows on
 *            several shards, which goes to the first of them alone; that
 *            shard's answer says whether this client created it there
 *   round 2  such a variable to its other shards: created there by the
 *            client that created it on the first (from its values, or its
 *            initializer), awaited by every other (VarSpec SOURCE_AWAIT,
 *            sent again until it exists there)
 *
 * A variable declared with values (psc__var.given) carries each shard's rows
 * of them in its Declare (ValueRun). When a shard's share passes
 * chunk_bytes it travels in several Declares with one random stage id,
 * chunk_bytes each, and the shard creates the variable from them once they
 * are all there; a round whose staged values did not make it (the shard
 * restarted meanwhile) is sent again. */
#include "client_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "err.h"
#include "layout.h"
#include "rand.h"

/* One variable of the declare, as the rounds see it. */
struct want {
  const struct psc__var *v; /* the caller's, resolved placement */
  uint64_t row;             /* elements per row */
  int first;                /* the first shard holding rows of it, -1: none */
  int multi;                /* 1: rows on more than one shard */
  int won;                  /* 1: this client created it on `first` */
};

/* One variable to one shard in a round, and what came of it. */
struct pair {
  int shard;      /* destination */
  struct want *w; /* the variable */
  int source;     /* Psd__V1__Source sent */
  int done;       /* the shard answered with its slice */
  int created;    /* ... and this client's Declare created it */
  uint64_t begin; /* the shard's elements of it, [begin, end) */
  uint64_t end;
};

/* The elements shard s holds of w's variable, into *begin, *end. */
static void rows_of(const struct psc__client *c, const struct want *w, int s,
                    uint64_t *begin, uint64_t *end) {
  int64_t rb, re;
  cm_layout_rows(w->v->shape[0], w->v->placement, c->nshards, s, &rb, &re);
  *begin = (uint64_t)rb * w->row;
  *end = (uint64_t)re * w->row;
}

/* What one pass of a round sends: its arrays, freed by pass_free. */
struct pass {
  Psd__V1__VarSpec *specs;       /* one per pending pair, by shard */
  Psd__V1__VarSpec **specp;      /* pointers to them */
  struct pair **of_spec;         /* the pair of each spec */
  Psd__V1__ValueRun *runs;       /* the values, cut into runs, by shard */
  Psd__V1__ValueRun **runp;      /* pointers to them */
  Psd__V1__DeclareRequest *reqs; /* the requests */
  struct psc__decl_call *dc;     /* one per request */
  int *spec0;                    /* per request: its shard's first spec */
  int nreqs;                     /* entries in reqs and dc */
};

static void pass_free(struct pass *p) {
  free(p->specs);
  free(p->specp);
  free(p->of_spec);
  free(p->runs);
  free(p->runp);
  free(p->reqs);
  free(p->dc);
  free(p->spec0);
  memset(p, 0, sizeof *p);
}

/* Builds the requests for the pending pairs of pairs[0..n) (grouped by
 * shard). */
static int pass_build(struct psc__client *c, struct pass *p, struct pair *pairs,
                      int n, Psd__V1__Caller *caller) {
  uint64_t chunk = c->o.chunk_bytes / sizeof(float);
  size_t nruns = 0;
  int nspecs = 0;

  memset(p, 0, sizeof *p);
  for (int k = 0; k < n; k++) {
    if (pairs[k].done)
      continue;
    nspecs++;
    if (pairs[k].source == PSD__V1__SOURCE__SOURCE_VALUES)
      nruns += (pairs[k].end - pairs[k].begin + chunk - 1) / chunk;
  }
  /* At most one request per run, plus one per shard. */
  p->specs = calloc(nspecs + 1, sizeof *p->specs);
  p->specp = calloc(nspecs + 1, sizeof *p->specp);
  p->of_spec = calloc(nspecs + 1, sizeof *p->of_spec);
  p->runs = calloc(nruns + 1, sizeof *p->runs);
  p->runp = calloc(nruns + 1, sizeof *p->runp);
  p->reqs = calloc(nruns + c->nshards + 1, sizeof *p->reqs);
  p->dc = calloc(nruns + c->nshards + 1, sizeof *p->dc);
  p->spec0 = calloc(nruns + c->nshards + 1, sizeof *p->spec0);
  if (!p->specs || !p->specp || !p->of_spec || !p->runs || !p->runp ||
      !p->reqs || !p->dc || !p->spec0)
    return CM_ENOMEM;
  nspecs = 0;
  nruns = 0;
  for (int k = 0; k < n;) {
    int s = pairs[k].shard, s0 = nspecs;
    size_t r0 = nruns;
    uint64_t bytes = 0;
    for (; k < n && pairs[k].shard == s; k++) {
      struct pair *pr = &pairs[k];
      const struct psc__var *v = pr->w->v;
      Psd__V1__VarSpec *sp = &p->specs[nspecs];
      if (pr->done)
        continue;
      psd__v1__var_spec__init(sp);
      sp->name = (char *)v->name;
      sp->n_shape = v->ndim;
      sp->shape = (int64_t *)v->shape;
      sp->placement = v->placement;
      sp->asked = cm_layout_asked_to_wire(v->asked);
      sp->init = v->init == PSC__INIT_UNIFORM ? PSD__V1__INIT__INIT_UNIFORM
                                              : PSD__V1__INIT__INIT_ZEROS;
      sp->init_scale = v->init_scale;
      sp->seed = c->o.seed;
      if (v->optimizer)
        sp->optimizer = (char *)v->optimizer;
      sp->source = pr->source;
      p->of_spec[nspecs] = pr;
      p->specp[nspecs++] = sp;
      if (pr->source != PSD__V1__SOURCE__SOURCE_VALUES)
        continue;
      for (uint64_t at = pr->begin; at < pr->end; at += chunk) {
        uint64_t cnt = pr->end - at < chunk ? pr->end - at : chunk;
        Psd__V1__ValueRun *run = &p->runs[nruns];
        psd__v1__value_run__init(run);
        run->name = (char *)v->name;
        run->offset = at;
        run->data.len = cnt * sizeof(float);
        run->data.data = (uint8_t *)(v->given + at);
        p->runp[nruns++] = run;
        bytes += run->data.len;
      }
    }
    if (nspecs == s0)
      continue; /* nothing pending here */
    /* One request when the values fit one message; else a stage of
     * several, each with every variable of the shard. */
    uint64_t stage = bytes > c->o.chunk_bytes ? cm_splitmix64(&c->rng) | 1 : 0;
    size_t r = r0;
    do {
      Psd__V1__DeclareRequest *q = &p->reqs[p->nreqs];
      uint64_t in = 0;
      psd__v1__declare_request__init(q);
      q->caller = caller;
      q->n_vars = (size_t)(nspecs - s0);
      q->vars = &p->specp[s0];
      q->stage = stage;
      q->client = c->client_id;
      q->values = &p->runp[r];
      while (r < nruns && (q->n_values == 0 ||
                           in + p->runp[r]->data.len <= c->o.chunk_bytes)) {
        in += p->runp[r++]->data.len;
        q->n_values++;
      }
      p->dc[p->nreqs] = (struct psc__decl_call){s, q, NULL};
      p->spec0[p->nreqs++] = s0;
    } while (r < nruns);
  }
  return 0;
}

/* Marks the pairs each answer of the pass has a slice for (slices come in
 * the order of their request's variables), and those an answer settles
 * whatever it lists: a variable created from its initializer, or from
 * values sent whole, exists once the shard answered OK. */
static void pass_take(struct pass *p) {
  for (int q = 0; q < p->nreqs; q++) {
    const Psd__V1__DeclareResponse *r = p->dc[q].resp;
    size_t j = 0, nv = p->reqs[q].n_vars;
    for (size_t i = 0; r && i < nv; i++) {
      struct pair *pr = p->of_spec[p->spec0[q] + i];
      if (pr->source == PSD__V1__SOURCE__SOURCE_INIT ||
          (pr->source == PSD__V1__SOURCE__SOURCE_VALUES && !p->reqs[q].stage))
        pr->done = 1;
    }
    for (size_t i = 0; r && i < r->n_slices; i++) {
      while (j < nv && strcmp(p->reqs[q].vars[j]->name, r->slices[i]->name))
        j++;
      if (j == nv)
        break; /* not ours: a malformed answer, and the pair stays */
      struct pair *pr = p->of_spec[p->spec0[q] + j++];
      pr->done = 1;
      pr->created |= r->slices[i]->created;
    }
  }
}

/* Waits ms, or less when interrupted. */
static int pause_ms(struct psc__client *c, double ms) {
  for (double end = cm_mono_ms() + ms; (ms = end - cm_mono_ms()) > 0;) {
    if (ms > 100)
      ms = 100;
    struct timespec ts = {0, (long)(ms * 1e6)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
    int rc = psc__check_interrupt(c);
    if (rc)
      return rc;
  }
  return 0;
}

/* Sends pairs[0..n) (grouped by shard) until each has its slice: a pair
 * awaiting another client, or whose staged values did not all arrive, is
 * sent again, within connect_timeout_ms from t0. */
static int run_round(struct psc__client *c, struct pair *pairs, int n,
                     Psd__V1__Caller *caller, double t0) {
  struct pass p;
  int rc = 0;
  for (int attempt = 0;; attempt++) {
    if ((rc = pass_build(c, &p, pairs, n, caller)) ||
        (rc = psc__declare_calls(c, p.dc, p.nreqs))) {
      psc__decl_calls_free(p.dc, p.nreqs);
      pass_free(&p);
      return rc;
    }
    pass_take(&p);
    psc__decl_calls_free(p.dc, p.nreqs);
    pass_free(&p);
    const struct pair *left = NULL;
    for (int k = 0; k < n && !left; k++)
      if (!pairs[k].done)
        left = &pairs[k];
    if (!left)
      return 0;
    double waited = (cm_mono_ms() - t0) / 1000;
    if (waited * 1000 >= c->o.connect_timeout_ms) {
      const struct psc__var *v = left->w->v;
      if (left->source == PSD__V1__SOURCE__SOURCE_AWAIT)
        psc__seterr(c,
                    "declare: variable '%s' exists on ps:%d but not on ps:%d "
                    "after %.1f s; the client that created it on ps:%d puts "
                    "it there (did that client stop? did ps:%d restart "
                    "without it?)",
                    v->name, left->w->first, left->shard, waited,
                    left->w->first, left->shard);
      else
        psc__seterr(c,
                    "declare: ps:%d (%s) did not create variable '%s' from "
                    "its values within %.1f s (did it restart while they "
                    "were sent?)",
                    left->shard, c->spec->ps[left->shard].text, v->name,
                    waited);
      return CM_ETIMEDOUT;
    }
    /* The other client is usually a round trip behind. */
    double ms = 5.0 * (1 << (attempt < 6 ? attempt : 6));
    if ((rc = pause_ms(c, ms)))
      return rc;
  }
}

int psc__declare_vars(struct psc__client *c, const struct psc__var *vars, int n,
                      const unsigned char *skip) {
  Psd__V1__Caller caller = psc__caller(c, -1);
  struct want *wants = calloc((size_t)n + 1, sizeof *wants);
  struct pair *pairs = calloc((size_t)n * c->nshards + 1, sizeof *pairs);
  double t0 = cm_mono_ms();
  int nw = 0, np = 0, rc = 0;

  if (!wants || !pairs) {
    rc = CM_ENOMEM;
    goto out;
  }
  for (int i = 0; i < n; i++) {
    struct want *w = &wants[nw];
    int holders = 0;
    if (skip[i])
      continue;
    w->v = &vars[i];
    w->row = 1;
    for (int d = 1; d < vars[i].ndim; d++)
      w->row *= (uint64_t)vars[i].shape[d];
    w->first = -1;
    for (int s = 0; s < c->nshards; s++) {
      uint64_t b, e;
      rows_of(c, w, s, &b, &e);
      if (b < e && holders++ == 0)
        w->first = s;
    }
    w->multi = holders > 1;
    nw++;
  }
  /* Round 1: all but the later shards of a variable on several. */
  for (int s = 0; s < c->nshards; s++)
    for (int k = 0; k < nw; k++) {
      struct pair *pr = &pairs[np];
      rows_of(c, &wants[k], s, &pr->begin, &pr->end);
      if (wants[k].multi && s != wants[k].first && pr->begin < pr->end)
        continue;
      pr->shard = s;
      pr->w = &wants[k];
      pr->source = wants[k].v->given && pr->begin < pr->end
                       ? PSD__V1__SOURCE__SOURCE_VALUES
                       : PSD__V1__SOURCE__SOURCE_INIT;
      np++;
    }
  if (nw == 0)
    goto out;
  if ((rc = run_round(c, pairs, np, &caller, t0)))
    goto out;
  for (int k = 0; k < np; k++)
    if (pairs[k].shard == pairs[k].w->first && pairs[k].created)
      pairs[k].w->won = 1;
  /* Round 2: the later shards, from the first's creator alone. */
  np = 0;
  for (int s = 0; s < c->nshards; s++)
    for (int k = 0; k < nw; k++) {
      struct pair *pr = &pairs[np];
      memset(pr, 0, sizeof *pr);
      rows_of(c, &wants[k], s, &pr->begin, &pr->end);
      if (!wants[k].multi || s == wants[k].first || pr->begin == pr->end)
        continue;
      pr->shard = s;
      pr->w = &wants[k];
      pr->source = !wants[k].won       ? PSD__V1__SOURCE__SOURCE_AWAIT
                   : wants[k].v->given ? PSD__V1__SOURCE__SOURCE_VALUES
                                       : PSD__V1__SOURCE__SOURCE_INIT;
      np++;
    }
  if (np > 0)
    rc = run_round(c, pairs, np, &caller, t0);
out:
  free(wants);
  free(pairs);
  return rc;
}
