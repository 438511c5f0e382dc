/* The job's optimizers (job_optim.h): job.optimizer with its learning-rate
 * schedule and clip_norm, and job.optimizer_overrides, each entry starting
 * from the job's optimizer; the rules are optconf.h's, the checks here say
 * where a setting is wrong and why. One optimizer object's parser is shared
 * with optjson.c (a variable's own optimizer). */
#include "job_optim.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "jcheck.h"

/* Parses job.optimizer.schedule, or an override's, into *s (which holds
 * the defaults); lr is the optimizer's, which min_lr may not exceed. Keys of
 * another schedule type are mistakes: they show that the author believes the
 * schedule is of that type. */
static void parse_schedule(struct cm__errs *e, json_t *opt, const char *parent,
                           double lr, struct cm_schedule *s) {
  static const char *const keys[] = {"type",  "warmup_steps", "decay_every",
                                     "gamma", "total_steps",  "min_lr"};
  static const char *const types[] = {"constant", "step", "cosine", NULL};
  static const struct {
    const char *key;         /* a type's own key */
    enum cm_sched_type type; /* that type */
  } owned[] = {{"decay_every", CM_SCHED_STEP},
               {"gamma", CM_SCHED_STEP},
               {"total_steps", CM_SCHED_COSINE},
               {"min_lr", CM_SCHED_COSINE}};
  char path[CM__SPEC_PATH_MAX], kpath[CM__SPEC_PATH_MAX + 32],
      type[16] = "constant";
  json_t *sch, *v;
  long long x;
  int before, type_known;

  sch =
      cm__opt_object(e, opt, parent, "schedule",
                     "an object like {\"type\": \"cosine\", \"warmup_steps\": "
                     "100, \"total_steps\": 2000}");
  if (!sch)
    return;
  cm__path_key(path, sizeof path, parent, "schedule");
  cm__check_keys(e, sch, path, keys, sizeof keys / sizeof keys[0]);
  before = e->count;
  cm__opt_choice(e, sch, path, "type", types, type, sizeof type);
  type_known = e->count == before;
  for (int i = 0; i < CM_SCHED_NTYPES; i++)
    if (strcmp(type, cm_sched_name((enum cm_sched_type)i)) == 0)
      s->type = (enum cm_sched_type)i;
  for (size_t i = 0; type_known && i < sizeof owned / sizeof owned[0]; i++)
    if (json_object_get(sch, owned[i].key) && s->type != owned[i].type) {
      cm__path_key(kpath, sizeof kpath, path, owned[i].key);
      cm__report(e, kpath, "only meaningful with \"type\": \"%s\"",
                 cm_sched_name(owned[i].type));
    }
  if ((v = json_object_get(sch, "warmup_steps"))) {
    cm__path_key(kpath, sizeof kpath, path, "warmup_steps");
    if (cm__want_int(e, v, kpath, 0, LLONG_MAX, &x))
      s->warmup_steps = (uint64_t)x;
  }
  if ((v = json_object_get(sch, "decay_every"))) {
    cm__path_key(kpath, sizeof kpath, path, "decay_every");
    if (cm__want_int(e, v, kpath, 1, LLONG_MAX, &x))
      s->decay_every = (uint64_t)x;
  } else if (type_known && s->type == CM_SCHED_STEP) {
    cm__report(
        e, path,
        "\"type\": \"step\" needs \"decay_every\" (steps between decays, "
        "e.g. 1000) and takes \"gamma\" (default 0.1)");
  }
  if ((v = json_object_get(sch, "gamma"))) {
    double g = 0;
    cm__path_key(kpath, sizeof kpath, path, "gamma");
    before = e->count;
    cm__opt_number(e, sch, path, "gamma", 0, 0, HUGE_VAL, "a number in (0, 1]",
                   &g);
    if (e->count == before && g > 1)
      cm__report(e, kpath, "expected a number in (0, 1], got %g", g);
    else if (e->count == before)
      s->gamma = g;
  }
  if ((v = json_object_get(sch, "total_steps"))) {
    cm__path_key(kpath, sizeof kpath, path, "total_steps");
    if (cm__want_int(e, v, kpath, 1, LLONG_MAX, &x)) {
      if ((uint64_t)x <= s->warmup_steps)
        cm__report(
            e, kpath,
            "%lld is not more than warmup_steps (%llu); expected the step "
            "at which the decay ends, counted from the first",
            x, (unsigned long long)s->warmup_steps);
      else
        s->total_steps = (uint64_t)x;
    }
  } else if (type_known && s->type == CM_SCHED_COSINE) {
    cm__report(
        e, path,
        "\"type\": \"cosine\" needs \"total_steps\" (the step at which lr "
        "reaches min_lr, warm-up included)");
  }
  if ((v = json_object_get(sch, "min_lr"))) {
    cm__path_key(kpath, sizeof kpath, path, "min_lr");
    before = e->count;
    cm__opt_number(e, sch, path, "min_lr", 0, 1, HUGE_VAL, "a number >= 0",
                   &s->min_lr);
    if (e->count == before && s->min_lr > lr)
      cm__report(e, kpath, "%g is more than the optimizer's lr (%g)", s->min_lr,
                 lr);
  }
}

void cm__parse_optim_obj(struct cm__errs *e, json_t *opt, const char *parent,
                         struct cm_optim *o, double *clip_norm) {
  static const char *const keys[] = {"type",         "lr",       "momentum",
                                     "weight_decay", "beta1",    "beta2",
                                     "eps",          "schedule", "clip_norm"};
  static const char *const types[] = {"sgd",  "momentum", "nesterov", "adagrad",
                                      "adam", "adamw",    NULL};
  char type[16] = "", path[CM__SPEC_PATH_MAX + 32];

  cm__check_keys(e, opt, parent, keys, sizeof keys / sizeof keys[0]);
  if (!clip_norm && json_object_get(opt, "clip_norm")) {
    cm__path_key(path, sizeof path, parent, "clip_norm");
    cm__report(e, path,
               "clipping is per job, not per variable (the global norm is over "
               "every variable's gradient); set job.optimizer.clip_norm");
  }
  cm__opt_choice(e, opt, parent, "type", types, type, sizeof type);
  if (type[0])
    cm_optim_parse(type, &o->type);
  /* The upper bound only keeps the value finite; any positive rate is taken. */
  cm__opt_number(e, opt, parent, "lr", 0, 0, HUGE_VAL, "a positive number",
                 &o->lr);
  /* Hyper-parameters of other types are accepted and unused, so that
   * switching type does not mean deleting lines. */
  cm__opt_number(e, opt, parent, "momentum", 0, 1, 1, "a number in [0, 1)",
                 &o->momentum);
  cm__opt_number(e, opt, parent, "weight_decay", 0, 1, HUGE_VAL,
                 "a number >= 0", &o->weight_decay);
  cm__opt_number(e, opt, parent, "beta1", 0, 1, 1, "a number in [0, 1)",
                 &o->beta1);
  cm__opt_number(e, opt, parent, "beta2", 0, 1, 1, "a number in [0, 1)",
                 &o->beta2);
  cm__opt_number(e, opt, parent, "eps", 0, 0, HUGE_VAL, "a positive number",
                 &o->eps);
  if (o->type == CM_OPT_NESTEROV && o->momentum == 0.0) {
    cm__path_key(path, sizeof path, parent,
                 json_object_get(opt, "momentum") ? "momentum" : "type");
    cm__report(e, path,
               "nesterov needs a momentum above 0 (with 0 it is plain sgd)");
  }
  if (json_object_get(opt, "schedule")) {
    struct cm_optim d;
    cm_optim_defaults(&d);
    o->schedule = d.schedule;
    parse_schedule(e, opt, parent, o->lr, &o->schedule);
  } else if (o->schedule.type == CM_SCHED_COSINE &&
             o->schedule.min_lr > o->lr) {
    /* An override's lr under the cosine it keeps from the job. */
    cm__path_key(path, sizeof path, parent, "lr");
    cm__report(e, path,
               "%g is below the min_lr (%g) of the schedule it keeps from "
               "job.optimizer; give this entry a \"schedule\" of its own",
               o->lr, o->schedule.min_lr);
  }
  if (clip_norm)
    cm__opt_number(
        e, opt, parent, "clip_norm", 0, 0, HUGE_VAL,
        "a positive number (the largest global L2 norm of a worker's "
        "gradient)",
        clip_norm);
}

/* Parses job.optimizer_overrides: {"<variable or glob>": {optimizer keys},
 * ...}, each entry starting from the job's optimizer. */
static void parse_overrides(struct cm__errs *e, json_t *job,
                            struct cm_job *out) {
  char path[CM__SPEC_PATH_MAX];
  const char *key;
  json_t *ov, *v;

  ov = cm__opt_object(e, job, "job", "optimizer_overrides",
                      "an object like {\"*/bias\": {\"weight_decay\": 0}} "
                      "(variable name or glob: optimizer keys)");
  if (!ov)
    return;
  json_object_foreach(ov, key, v) {
    struct cm_optim_rule *r = &out->optim.rules[out->optim.nrules];
    cm__path_key(path, sizeof path, "job.optimizer_overrides", key);
    if (!key[0] || strlen(key) > CM_OPTIM_PATTERN_MAX) {
      cm__report(e, path,
                 "expected a variable name or glob of 1..%d characters",
                 CM_OPTIM_PATTERN_MAX);
      continue;
    }
    if (!json_is_object(v)) {
      char got[CM__SPEC_QUOTE_MAX];
      cm__report(
          e, path,
          "expected an object of optimizer keys like {\"type\": \"sgd\", "
          "\"lr\": 0.1}, got %s",
          cm__describe(got, sizeof got, v));
      continue;
    }
    if (out->optim.nrules == CM_OPTIM_MAX_RULES) {
      cm__report(e, path, "more than %d overrides", CM_OPTIM_MAX_RULES);
      return;
    }
    snprintf(r->pattern, sizeof r->pattern, "%s", key);
    r->opt = out->optim.def;
    cm__parse_optim_obj(e, v, path, &r->opt, NULL);
    out->optim.nrules++;
  }
}

void cm__parse_optimizer(struct cm__errs *e, json_t *job, struct cm_job *out) {
  json_t *opt =
      cm__opt_object(e, job, "job", "optimizer",
                     "an object like {\"type\": \"momentum\", \"lr\": "
                     "0.05, \"momentum\": 0.9}");

  if (opt)
    cm__parse_optim_obj(e, opt, "job.optimizer", &out->optim.def,
                        &out->clip_norm);
  parse_overrides(e, job, out);
}
