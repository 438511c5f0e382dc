/* One optimizer as JSON text (optjson.h): read through the spec's own
 * parser of job.optimizer (job_optim.c), so that a variable's optimizer
 * takes the same keys and is refused with the same words; written with
 * every hyper-parameter so that what a checkpoint keeps reads back exactly. */
#include "optjson.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "err.h"
#include "jcheck.h"
#include "job_optim.h"

/* Where a variable's optimizer's mistakes are said to be. */
#define OPTJSON_PATH "optimizer"

int cm_optim_from_json(const char *text, size_t len, struct cm_optim *out,
                       char *err, size_t errlen) {
  struct cm__errs e;
  struct cm_optim o;
  json_t *root = NULL;
  char got[CM__SPEC_QUOTE_MAX];
  int rc = CM_ESPEC;

  cm__errs_init(&e, OPTJSON_PATH, err, errlen);
  cm_optim_defaults(&o);
  if (!(root = cm__load_json(&e, text ? text : "", text ? len : 0, &rc)))
    goto out;
  e.source = NULL; /* the paths start with "optimizer" */
  rc = CM_ESPEC;
  if (!json_is_object(root)) {
    cm__report(&e, OPTJSON_PATH,
               "expected an object like {\"type\": \"sgd\", \"lr\": 0.1}, "
               "got %s",
               cm__describe(got, sizeof got, root));
    goto out;
  }
  cm__parse_optim_obj(&e, root, OPTJSON_PATH, &o, NULL);
  if (e.count == 0) {
    *out = o;
    rc = 0;
  }
out:
  cm__errs_finish(&e);
  json_decref(root);
  return rc;
}

/* Writes x into num[0..n) in the fewest significant digits that read back
 * as x. */
static void shortest(double x, char *num, size_t n) {
  for (int digits = 1; digits <= 17; digits++) {
    snprintf(num, n, "%.*g", digits, x);
    if (strtod(num, NULL) == x)
      return;
  }
}

/* Appends printf-style text at buf + *at; sets *full when it did not fit. */
static void put(char *buf, size_t len, size_t *at, int *full, const char *fmt,
                ...) __attribute__((format(printf, 5, 6)));

static void put(char *buf, size_t len, size_t *at, int *full, const char *fmt,
                ...) {
  va_list ap;
  int n;

  if (*full)
    return;
  va_start(ap, fmt);
  n = vsnprintf(buf + *at, len - *at, fmt, ap);
  va_end(ap);
  if (n < 0 || (size_t)n >= len - *at)
    *full = 1;
  else
    *at += (size_t)n;
}

int cm_optim_to_json(const struct cm_optim *o, char *buf, size_t len) {
  const struct cm_schedule *s = &o->schedule;
  char lr[32], mu[32], wd[32], b1[32], b2[32], eps[32], a[32];
  size_t at = 0;
  int full = len == 0;

  shortest(o->lr, lr, sizeof lr);
  shortest(o->momentum, mu, sizeof mu);
  shortest(o->weight_decay, wd, sizeof wd);
  shortest(o->beta1, b1, sizeof b1);
  shortest(o->beta2, b2, sizeof b2);
  shortest(o->eps, eps, sizeof eps);
  put(buf, len, &at, &full,
      "{\"type\": \"%s\", \"lr\": %s, \"momentum\": %s, \"weight_decay\": %s, "
      "\"beta1\": %s, \"beta2\": %s, \"eps\": %s, \"schedule\": {\"type\": "
      "\"%s\", \"warmup_steps\": %llu",
      cm_optim_name(o->type), lr, mu, wd, b1, b2, eps, cm_sched_name(s->type),
      (unsigned long long)s->warmup_steps);
  if (s->type == CM_SCHED_STEP) {
    shortest(s->gamma, a, sizeof a);
    put(buf, len, &at, &full, ", \"decay_every\": %llu, \"gamma\": %s",
        (unsigned long long)s->decay_every, a);
  } else if (s->type == CM_SCHED_COSINE) {
    shortest(s->min_lr, a, sizeof a);
    put(buf, len, &at, &full, ", \"total_steps\": %llu, \"min_lr\": %s",
        (unsigned long long)s->total_steps, a);
  }
  put(buf, len, &at, &full, "}}");
  return full ? CM_ERANGE : 0;
}
