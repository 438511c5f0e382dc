/* The plain data of an embedding table's configuration (tabconf.h): its
 * defaults, the per-row optimizers' names and state sizes, descriptions. */
#include "tabconf.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "err.h"

static const char *const names[CM_ROWOPT_NTYPES] = {
    "sgd", "adagrad", "rowwise_adagrad", "adam", "ftrl"};

void cm_table_conf_defaults(struct cm_table_conf *c) {
  memset(c, 0, sizeof *c);
  c->init = CM_TABLE_INIT_UNIFORM;
  c->init_scale = 0.01f;
  c->opt.type = CM_ROWOPT_ADAGRAD;
  c->opt.lr = 0.05;
  c->opt.eps = 1e-8;
  c->opt.initial_accumulator = 0.1;
  c->opt.beta1 = 0.9;
  c->opt.beta2 = 0.999;
  c->opt.ftrl_beta = 1.0;
  c->admit = CM_ADMIT_ALWAYS;
  c->admit_count = 1;
  c->admit_prob = 1.0;
}

void cm_table_conf_for(const struct cm_table_conf *spec, int nspec,
                       const struct cm_table_conf *defaults, const char *name,
                       uint32_t dim, struct cm_table_conf *out) {
  int i;
  for (i = 0; i < nspec && strcmp(spec[i].name, name); i++)
    ;
  if (i < nspec) {
    *out = spec[i];
  } else {
    *out = *defaults;
    out->id_bound = 0;
  }
  snprintf(out->name, sizeof out->name, "%s", name);
  out->dim = dim;
}

const char *cm_rowopt_name(enum cm_rowopt_type t) {
  return (unsigned)t < CM_ROWOPT_NTYPES ? names[t] : "?";
}

int cm_rowopt_parse(const char *name, enum cm_rowopt_type *out) {
  for (int i = 0; i < CM_ROWOPT_NTYPES; i++)
    if (!strcmp(name, names[i])) {
      *out = (enum cm_rowopt_type)i;
      return 0;
    }
  return CM_EINVAL;
}

uint32_t cm_rowopt_nstate(enum cm_rowopt_type t, uint32_t dim) {
  switch (t) {
  case CM_ROWOPT_ADAGRAD:
    return dim;
  case CM_ROWOPT_ROWWISE_ADAGRAD:
    return 1;
  case CM_ROWOPT_ADAM:
  case CM_ROWOPT_FTRL:
    return 2 * dim;
  default:
    return 0;
  }
}

const char *cm_rowopt_state_name(enum cm_rowopt_type t, int i) {
  switch (t) {
  case CM_ROWOPT_ADAGRAD:
  case CM_ROWOPT_ROWWISE_ADAGRAD:
    return i == 0 ? "accum" : NULL;
  case CM_ROWOPT_ADAM:
    return i == 0 ? "m" : i == 1 ? "v" : NULL;
  case CM_ROWOPT_FTRL:
    return i == 0 ? "z" : i == 1 ? "n" : NULL;
  default:
    return NULL;
  }
}

/* Appends to buf what fits. */
static void append(char *buf, size_t len, const char *fmt, ...) {
  size_t used = strlen(buf);
  if (used + 1 >= len)
    return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf + used, len - used, fmt, ap);
  va_end(ap);
}

void cm_rowopt_describe(const struct cm_rowopt *o, char *buf, size_t len) {
  if (!len)
    return;
  buf[0] = '\0';
  append(buf, len, "%s(lr=%g", cm_rowopt_name(o->type), o->lr);
  switch (o->type) {
  case CM_ROWOPT_ADAGRAD:
  case CM_ROWOPT_ROWWISE_ADAGRAD:
    append(buf, len, ", eps=%g, initial_accumulator=%g", o->eps,
           o->initial_accumulator);
    break;
  case CM_ROWOPT_ADAM:
    append(buf, len, ", beta1=%g, beta2=%g, eps=%g", o->beta1, o->beta2,
           o->eps);
    break;
  case CM_ROWOPT_FTRL:
    append(buf, len, ", l1=%g, l2=%g, beta=%g, initial_accumulator=%g", o->l1,
           o->l2, o->ftrl_beta, o->initial_accumulator);
    break;
  default:
    break;
  }
  append(buf, len, ")");
}
