/* What an optimizer is, as the spec names it: the update rules (SGD,
 * momentum, Nesterov, Adagrad, Adam, AdamW), their hyper-parameters, the
 * slots each keeps beside a variable, the learning-rate schedules, and the
 * job's set of optimizers (a default and per-variable rules). The update
 * kernels themselves are in kernels/optim.h; this module is the plain data
 * and the pure functions over it (the lr at a step, a variable's rule, a
 * description), shared by psd, dworker --standalone and psctl. */
#ifndef CM_OPTCONF_H
#define CM_OPTCONF_H

#include <stddef.h>
#include <stdint.h>

/* Most slots any optimizer keeps per element (Adam: m and v). */
#define CM_OPTIM_MAX_SLOTS 2
/* Most per-variable rules ("job.optimizer_overrides" entries). */
#define CM_OPTIM_MAX_RULES 32
/* Longest variable name or pattern in a rule (a variable name's limit). */
#define CM_OPTIM_PATTERN_MAX 200

enum cm_optim_type {
  CM_OPT_SGD = 0,  /* w -= lr g */
  CM_OPT_MOMENTUM, /* heavy ball, PyTorch's SGD(momentum) */
  CM_OPT_NESTEROV, /* PyTorch's SGD(momentum, nesterov=True) */
  CM_OPT_ADAGRAD,  /* PyTorch's Adagrad (no lr decay, accumulator from 0) */
  CM_OPT_ADAM,     /* PyTorch's Adam, L2 weight decay added to g */
  CM_OPT_ADAMW,    /* PyTorch's AdamW, decoupled weight decay */
  CM_OPT_NTYPES    /* number of types */
};

enum cm_sched_type {
  CM_SCHED_CONSTANT = 0, /* lr */
  CM_SCHED_STEP,         /* lr gamma^floor(s / decay_every) */
  CM_SCHED_COSINE,       /* lr down to min_lr along half a cosine */
  CM_SCHED_NTYPES        /* number of types */
};

/* A learning-rate schedule. Step k (0 for the first update) runs at
 * lr(k) = lr (k + 1) / warmup_steps while k < warmup_steps, then at the
 * type's formula with s = k - warmup_steps; see cm_schedule_lr. */
struct cm_schedule {
  enum cm_sched_type type; /* the decay after warm-up */
  uint64_t warmup_steps;   /* linear warm-up length, 0 = none */
  uint64_t decay_every;    /* step: s between decays, >= 1 */
  double gamma;            /* step: factor per decay, in (0, 1] */
  uint64_t total_steps;    /* cosine: k at which min_lr is reached */
  double min_lr;           /* cosine: the floor, in [0, lr] */
};

/* One optimizer with its hyper-parameters (those its type does not use are
 * kept, and ignored). */
struct cm_optim {
  enum cm_optim_type type;     /* the update rule */
  double lr;                   /* base learning rate, > 0 */
  double momentum;             /* momentum, nesterov: mu in [0, 1) */
  double weight_decay;         /* >= 0: L2 added to g, decoupled for adamw */
  double beta1;                /* adam(w): first-moment decay, [0, 1) */
  double beta2;                /* adam(w): second-moment decay, [0, 1) */
  double eps;                  /* adagrad, adam(w): denominator term, > 0 */
  struct cm_schedule schedule; /* lr over the steps */
};

/* A per-variable rule: variables whose name is `pattern` (or matches it as
 * an fnmatch(3) glob) get `opt`. */
struct cm_optim_rule {
  char pattern[CM_OPTIM_PATTERN_MAX + 1]; /* a name or a glob */
  struct cm_optim opt;                    /* what those variables get */
};

/* A job's optimizers: the default and the rules that override it. */
struct cm_optim_set {
  struct cm_optim def;                            /* every other variable */
  int nrules;                                     /* entries used in rules */
  struct cm_optim_rule rules[CM_OPTIM_MAX_RULES]; /* in the spec's order */
};

/* The defaults: momentum, lr 0.05, momentum 0.9, weight_decay 0,
 * beta1 0.9, beta2 0.999, eps 1e-8, constant schedule (step: gamma 0.1). */
void cm_optim_defaults(struct cm_optim *o);

/* "sgd", "momentum", ... for a type; "?" for a bad one. */
const char *cm_optim_name(enum cm_optim_type t);

/* The type called name; returns 0, or CM_EINVAL for an unknown name. */
int cm_optim_parse(const char *name, enum cm_optim_type *out);

/* Slots a type keeps per element: 0 sgd, 1 momentum/nesterov/adagrad,
 * 2 adam/adamw. */
int cm_optim_nslots(enum cm_optim_type t);

/* Name of slot i of a type (a tensor is called "<variable>/<name>"):
 * "momentum" (momentum, nesterov), "accum" (adagrad), "m" and "v"
 * (adam, adamw); NULL past the type's slots. */
const char *cm_optim_slot_name(enum cm_optim_type t, int i);

/* "constant", "step", "cosine"; "?" for a bad one. */
const char *cm_sched_name(enum cm_sched_type t);

/* The learning rate of update k (0-based: k updates were applied before
 * it) for a base rate lr:
 *   k < W (warm-up):  lr (k + 1) / W
 *   then, s = k - W:
 *   constant          lr
 *   step              lr gamma^floor(s / decay_every)
 *   cosine            min_lr + (lr - min_lr) (1 + cos(pi min(s, T) / T)) / 2,
 *                     T = total_steps - W (min_lr from k = total_steps on)
 * Pure; computed in double. */
double cm_schedule_lr(const struct cm_schedule *s, double lr, uint64_t k);

/* The optimizer of variable `var`: the rule whose pattern equals the name,
 * else the first rule whose glob matches it, else the default. *rule (may be
 * NULL) gets the rule's index, or -1 for the default. */
const struct cm_optim *cm_optim_pick(const struct cm_optim_set *set,
                                     const char *var, int *rule);

/* Writes what o does, with the parameters its type uses, e.g.
 * "sgd(lr=0.05)", "momentum(lr=0.05, momentum=0.9)",
 * "adamw(lr=0.001, beta1=0.9, beta2=0.999, eps=1e-08, weight_decay=0.01,
 * schedule=cosine(warmup_steps=100, total_steps=2000, min_lr=0))";
 * weight_decay and the schedule only when they do something. */
void cm_optim_describe(const struct cm_optim *o, char *buf, size_t len);

/* 1 when a and b update a variable alike: the same type, lr, weight_decay,
 * schedule, and the hyper-parameters of that type (momentum; eps; beta1,
 * beta2); those the type does not use may differ. Else 0. */
int cm_optim_same(const struct cm_optim *a, const struct cm_optim *b);

#endif
