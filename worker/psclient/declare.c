/* psc__client_declare (psclient.h): checks the caller's variables, resolves
 * PSC__PLACE_AUTO, and declares them on the shards that hold them
 * (declare_rounds.c, over declare_calls.c, which waits for shards that are
 * still starting). Once every shard has answered, the client plans its
 * traffic and moves to the Unix sockets of the shards on this host
 * (client.c). A shard that answers "layout moved" has the client follow
 * the new layout and declare there again (relayout.c). */
#include "client_internal.h"

#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "layout.h"

/* The shards keep how a declaration placed a variable in common/'s terms. */
_Static_assert(PSC__PLACE_NAME == CM_LAYOUT_NAME &&
                   PSC__PLACE_AUTO == CM_LAYOUT_AUTO &&
                   PSC__PLACE_SPLIT == CM_LAYOUT_SPLIT,
               "psclient.h's placements are common/layout/layout.h's");

/* Variables at least this large are split across shards under AUTO. */
#define AUTO_SPLIT_BYTES CM_LAYOUT_SPLIT_BYTES

/* Whether a and b have the same shape. */
static int same_shape(const struct psc__var *a, const struct psc__var *b) {
  if (a->ndim != b->ndim)
    return 0;
  for (int d = 0; d < a->ndim; d++)
    if (a->shape[d] != b->shape[d])
      return 0;
  return 1;
}

/* Checks vars[0..n) and resolves their placements into vars. skip[i] is set
 * for a variable this client declared already (same shape; a different one
 * is CM_EEXIST). */
static int check_vars(struct psc__client *c, struct psc__var *vars, int n,
                      unsigned char *skip, uint64_t *bytes, int *place) {
  for (int i = 0; i < n; i++) {
    if (!vars[i].name || !vars[i].name[0] || strlen(vars[i].name) > 200) {
      psc__seterr(c, "declare: variable %d has %s name; expected 1..200 bytes",
                  i, vars[i].name && vars[i].name[0] ? "a too long" : "no");
      return CM_EINVAL;
    }
    if (vars[i].ndim < 1 || vars[i].ndim > PSC__VAR_MAX_DIMS) {
      psc__seterr(c, "declare: variable '%s' has %d dimensions; expected 1..%d",
                  vars[i].name, vars[i].ndim, PSC__VAR_MAX_DIMS);
      return CM_EINVAL;
    }
    for (int d = 0; d < vars[i].ndim; d++)
      if (vars[i].shape[d] <= 0) {
        psc__seterr(c,
                    "declare: variable '%s' dimension %d is %lld; expected > 0",
                    vars[i].name, d, (long long)vars[i].shape[d]);
        return CM_EINVAL;
      }
    if (vars[i].placement >= c->nshards ||
        vars[i].placement < PSC__PLACE_NAME) {
      psc__seterr(c,
                  "declare: variable '%s' placement %d; expected a shard "
                  "0..%d or AUTO, NAME or SPLIT",
                  vars[i].name, vars[i].placement, c->nshards - 1);
      return CM_EINVAL;
    }
    bytes[i] = psc__numel(&vars[i]) * sizeof(float);
    int k = psc__client_find(c, vars[i].name);
    if (k >= 0) {
      if (!same_shape(&c->vars[k], &vars[i])) {
        psc__seterr(c,
                    "declare: variable '%s' was declared by this client with "
                    "%d dimensions [%lld, ...], now with %d [%lld, ...]",
                    vars[i].name, c->vars[k].ndim,
                    (long long)c->vars[k].shape[0], vars[i].ndim,
                    (long long)vars[i].shape[0]);
        return CM_EEXIST;
      }
      skip[i] = 1;
      vars[i].placement = c->vars[k].placement;
      vars[i].asked = c->vars[k].asked;
    } else {
      vars[i].asked = vars[i].placement;
    }
  }
  cm_layout_auto(bytes, n, c->nshards, AUTO_SPLIT_BYTES, place);
  for (int i = 0; i < n; i++) {
    if (vars[i].placement == PSC__PLACE_AUTO)
      vars[i].placement = place[i];
    else if (vars[i].placement == PSC__PLACE_NAME)
      vars[i].placement = cm_layout_by_name(vars[i].name, bytes[i], c->nshards,
                                            AUTO_SPLIT_BYTES);
  }
  return 0;
}

/* Appends copies of the variables of vars[0..n) not in skip to c->vars. */
static int keep_vars(struct psc__client *c, const struct psc__var *vars, int n,
                     const unsigned char *skip) {
  if (c->nvars + n > c->cap_vars) {
    int cap = c->cap_vars ? c->cap_vars : 8;
    while (cap < c->nvars + n)
      cap *= 2;
    struct psc__var *v = realloc(c->vars, (size_t)cap * sizeof *v);
    if (!v)
      return CM_ENOMEM;
    c->vars = v;
    char **names = realloc(c->var_names, (size_t)cap * sizeof *names);
    if (!names)
      return CM_ENOMEM;
    c->var_names = names;
    unsigned char *sel = c->sel ? realloc(c->sel, (size_t)cap) : NULL;
    if (c->sel && !sel)
      return CM_ENOMEM;
    if (sel)
      c->sel = sel;
    unsigned char *sp = c->sel_push ? realloc(c->sel_push, (size_t)cap) : NULL;
    if (c->sel_push && !sp)
      return CM_ENOMEM;
    if (sp)
      c->sel_push = sp;
    c->cap_vars = cap;
  }
  for (int i = 0; i < n; i++) {
    if (skip[i])
      continue;
    char *name = strdup(vars[i].name);
    if (!name)
      return CM_ENOMEM;
    c->var_names[c->nvars] = name;
    c->vars[c->nvars] = vars[i];
    c->vars[c->nvars].name = name;
    c->vars[c->nvars].given = NULL; /* the caller's, borrowed for the call */
    if (c->sel)
      c->sel[c->nvars] = 0;
    if (c->sel_push)
      c->sel_push[c->nvars] = 0;
    c->nvars++;
  }
  /* The bf16 staging buffer is sized for the variables: made again. */
  free(c->grad16);
  free(c->grad16_at);
  c->grad16 = NULL;
  c->grad16_at = NULL;
  return 0;
}

int psc__client_declare(struct psc__client *c, struct psc__var *vars, int n) {
  uint64_t *bytes = NULL;
  unsigned char *skip = NULL;
  int *place = NULL, rc = 0, nnew = 0;

  c->err[0] = 0;
  if (n < 0 || (n > 0 && !vars)) {
    psc__seterr(c, "declare: no variables");
    return CM_EINVAL;
  }
  bytes = calloc(n + 1, sizeof *bytes);
  place = calloc(n + 1, sizeof *place);
  skip = calloc(n + 1, 1);
  if (!bytes || !place || !skip) {
    rc = CM_ENOMEM;
    goto out;
  }
  if ((rc = check_vars(c, vars, n, skip, bytes, place)))
    goto out;
  for (int i = 0; i < n; i++)
    nnew += !skip[i];
  if (nnew == 0)
    goto out;
  /* Shards may still be starting: wait for them, within the deadline. A
   * layout that moved meanwhile is followed, and the declare made again. */
  for (struct psc__follow f = {0};;) {
    int from = c->nshards;
    c->moved[0] = 0;
    if (!(rc = psc__declare_vars(c, vars, n, skip)) || !c->moved[0])
      break;
    if ((rc = psc__follow_moved(c, &f, "declare", 0)))
      break;
    for (int i = 0; from != c->nshards && i < n; i++)
      if (!skip[i])
        vars[i].placement = psc__replace(&vars[i], from, c->nshards);
    c->err[0] = 0;
  }
  if (rc)
    goto out;
  if ((rc = keep_vars(c, vars, n, skip)))
    goto out;
  rc = psc__plan(c);
  if (!rc)
    rc = psc__use_unix_sockets(c);
out:
  free(bytes);
  free(place);
  free(skip);
  if (rc && !c->err[0])
    psc__seterr(c, "declare: %s", cm_strerror(rc));
  return rc;
}
