/* Optimizer names, slots, schedules and per-variable rules (optconf.h). */
#include "optconf.h"

#include <fnmatch.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "err.h"

/* Indexed by enum cm_optim_type. */
static const char *const optim_names[CM_OPT_NTYPES] = {
    "sgd", "momentum", "nesterov", "adagrad", "adam", "adamw"};

/* Indexed by enum cm_sched_type. */
static const char *const sched_names[CM_SCHED_NTYPES] = {"constant", "step",
                                                         "cosine"};

void cm_optim_defaults(struct cm_optim *o) {
  memset(o, 0, sizeof *o);
  o->type = CM_OPT_MOMENTUM;
  o->lr = 0.05;
  o->momentum = 0.9;
  o->weight_decay = 0.0;
  o->beta1 = 0.9;
  o->beta2 = 0.999;
  o->eps = 1e-8;
  o->schedule.type = CM_SCHED_CONSTANT;
  o->schedule.gamma = 0.1;
}

const char *cm_optim_name(enum cm_optim_type t) {
  return (unsigned)t < CM_OPT_NTYPES ? optim_names[t] : "?";
}

int cm_optim_parse(const char *name, enum cm_optim_type *out) {
  for (int i = 0; i < CM_OPT_NTYPES; i++)
    if (strcmp(name, optim_names[i]) == 0) {
      *out = (enum cm_optim_type)i;
      return 0;
    }
  return CM_EINVAL;
}

int cm_optim_nslots(enum cm_optim_type t) {
  switch (t) {
  case CM_OPT_MOMENTUM:
  case CM_OPT_NESTEROV:
  case CM_OPT_ADAGRAD:
    return 1;
  case CM_OPT_ADAM:
  case CM_OPT_ADAMW:
    return 2;
  default:
    return 0;
  }
}

const char *cm_optim_slot_name(enum cm_optim_type t, int i) {
  if (i < 0 || i >= cm_optim_nslots(t))
    return NULL;
  switch (t) {
  case CM_OPT_MOMENTUM:
  case CM_OPT_NESTEROV:
    return "momentum";
  case CM_OPT_ADAGRAD:
    return "accum";
  default:
    return i == 0 ? "m" : "v";
  }
}

const char *cm_sched_name(enum cm_sched_type t) {
  return (unsigned)t < CM_SCHED_NTYPES ? sched_names[t] : "?";
}

double cm_schedule_lr(const struct cm_schedule *s, double lr, uint64_t k) {
  uint64_t w = s->warmup_steps, t;

  if (k < w)
    return lr * (double)(k + 1) / (double)w;
  k -= w;
  switch (s->type) {
  case CM_SCHED_STEP:
    return s->decay_every ? lr * pow(s->gamma, (double)(k / s->decay_every))
                          : lr;
  case CM_SCHED_COSINE:
    t = s->total_steps > w ? s->total_steps - w : 0;
    if (t == 0 || k >= t)
      return s->min_lr;
    return s->min_lr +
           (lr - s->min_lr) * 0.5 * (1.0 + cos(M_PI * (double)k / (double)t));
  default:
    return lr;
  }
}

const struct cm_optim *cm_optim_pick(const struct cm_optim_set *set,
                                     const char *var, int *rule) {
  int i, found = -1;

  for (i = 0; i < set->nrules && found < 0; i++)
    if (strcmp(set->rules[i].pattern, var) == 0)
      found = i;
  for (i = 0; i < set->nrules && found < 0; i++)
    if (fnmatch(set->rules[i].pattern, var, 0) == 0)
      found = i;
  if (rule)
    *rule = found;
  return found >= 0 ? &set->rules[found].opt : &set->def;
}

/* Appends printf-style text to the string in buf[0..len), cutting it off
 * where the buffer ends. */
static void append(char *buf, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void append(char *buf, size_t len, const char *fmt, ...) {
  size_t n = strnlen(buf, len);
  va_list ap;

  if (n + 1 >= len)
    return;
  va_start(ap, fmt);
  vsnprintf(buf + n, len - n, fmt, ap);
  va_end(ap);
}

/* Appends the schedule's description, ", schedule=..." (nothing for a
 * constant one without warm-up). */
static void describe_schedule(const struct cm_schedule *s, char *buf,
                              size_t len) {
  const char *sep = "";

  if (s->type == CM_SCHED_CONSTANT && s->warmup_steps == 0)
    return;
  append(buf, len, ", schedule=%s(", cm_sched_name(s->type));
  if (s->warmup_steps) {
    append(buf, len, "warmup_steps=%llu", (unsigned long long)s->warmup_steps);
    sep = ", ";
  }
  if (s->type == CM_SCHED_STEP)
    append(buf, len, "%sdecay_every=%llu, gamma=%g", sep,
           (unsigned long long)s->decay_every, s->gamma);
  else if (s->type == CM_SCHED_COSINE)
    append(buf, len, "%stotal_steps=%llu, min_lr=%g", sep,
           (unsigned long long)s->total_steps, s->min_lr);
  append(buf, len, ")");
}

void cm_optim_describe(const struct cm_optim *o, char *buf, size_t len) {
  if (!len)
    return;
  buf[0] = '\0';
  append(buf, len, "%s(lr=%g", cm_optim_name(o->type), o->lr);
  switch (o->type) {
  case CM_OPT_MOMENTUM:
  case CM_OPT_NESTEROV:
    append(buf, len, ", momentum=%g", o->momentum);
    break;
  case CM_OPT_ADAGRAD:
    append(buf, len, ", eps=%g", o->eps);
    break;
  case CM_OPT_ADAM:
  case CM_OPT_ADAMW:
    append(buf, len, ", beta1=%g, beta2=%g, eps=%g", o->beta1, o->beta2,
           o->eps);
    break;
  default:
    break;
  }
  if (o->weight_decay != 0.0)
    append(buf, len, ", weight_decay=%g", o->weight_decay);
  describe_schedule(&o->schedule, buf, len);
  append(buf, len, ")");
}

/* The schedules' fields that their type uses, compared. */
static int same_schedule(const struct cm_schedule *a,
                         const struct cm_schedule *b) {
  if (a->type != b->type || a->warmup_steps != b->warmup_steps)
    return 0;
  if (a->type == CM_SCHED_STEP)
    return a->decay_every == b->decay_every && a->gamma == b->gamma;
  if (a->type == CM_SCHED_COSINE)
    return a->total_steps == b->total_steps && a->min_lr == b->min_lr;
  return 1;
}

int cm_optim_same(const struct cm_optim *a, const struct cm_optim *b) {
  if (a->type != b->type || a->lr != b->lr ||
      a->weight_decay != b->weight_decay ||
      !same_schedule(&a->schedule, &b->schedule))
    return 0;
  switch (a->type) {
  case CM_OPT_MOMENTUM:
  case CM_OPT_NESTEROV:
    return a->momentum == b->momentum;
  case CM_OPT_ADAGRAD:
    return a->eps == b->eps;
  case CM_OPT_ADAM:
  case CM_OPT_ADAMW:
    return a->beta1 == b->beta1 && a->beta2 == b->beta2 && a->eps == b->eps;
  default:
    return 1;
  }
}
