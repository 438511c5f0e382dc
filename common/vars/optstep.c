/* A configured optimizer applied to a tensor or a row (optstep.h): the
 * spec's hyper-parameters turned into the kernels' (the one place that
 * rounds them), and each type mapped to its kernel and its state to the
 * kernel's arrays. */
#include "optstep.h"

#include <string.h>

void cm_optim_hp_at(struct kn_optim_hp *hp, const struct cm_optim *o,
                    uint64_t k) {
  hp->lr = (float)cm_schedule_lr(&o->schedule, o->lr, k);
  hp->momentum = (float)o->momentum;
  hp->beta1 = o->beta1;
  hp->beta2 = o->beta2;
  hp->eps = (float)o->eps;
  hp->weight_decay = (float)o->weight_decay;
  hp->t = k + 1;
}

void cm_optim_apply(const struct cm_optim *o, uint64_t k, float *w,
                    float *const *slots, const float *g, size_t n) {
  struct kn_optim_hp hp;

  cm_optim_hp_at(&hp, o, k);
  switch (o->type) {
  case CM_OPT_SGD:
    kn_sgd_step(w, g, n, &hp);
    break;
  case CM_OPT_MOMENTUM:
    kn_momentum_step(w, slots[0], g, n, &hp);
    break;
  case CM_OPT_NESTEROV:
    kn_nesterov_step(w, slots[0], g, n, &hp);
    break;
  case CM_OPT_ADAGRAD:
    kn_adagrad_step(w, slots[0], g, n, &hp);
    break;
  case CM_OPT_ADAM:
    kn_adam_step(w, slots[0], slots[1], g, n, &hp);
    break;
  case CM_OPT_ADAMW:
    kn_adamw_step(w, slots[0], slots[1], g, n, &hp);
    break;
  default:
    break;
  }
}

void cm_rowopt_hp(struct kn_row_hp *hp, const struct cm_rowopt *o) {
  hp->lr = o->lr;
  hp->beta1 = o->beta1;
  hp->beta2 = o->beta2;
  hp->eps = (float)o->eps;
  hp->accum0 = (float)o->initial_accumulator;
  hp->l1 = (float)o->l1;
  hp->l2 = (float)o->l2;
  hp->beta = (float)o->ftrl_beta;
}

void cm_rowopt_init_state(const struct cm_rowopt *o, uint32_t dim,
                          const float *w, float *state) {
  uint32_t n = cm_rowopt_nstate(o->type, dim);
  struct kn_row_hp hp;

  cm_rowopt_hp(&hp, o);
  switch (o->type) {
  case CM_ROWOPT_ADAGRAD:
  case CM_ROWOPT_ROWWISE_ADAGRAD:
    for (uint32_t i = 0; i < n; i++)
      state[i] = hp.accum0;
    break;
  case CM_ROWOPT_FTRL:
    kn_row_ftrl_init(w, state, state + dim, dim, &hp);
    break;
  default:
    memset(state, 0, n * sizeof *state);
    break;
  }
}

void cm_rowopt_apply(const struct cm_rowopt *o, uint32_t dim, float *w,
                     float *state, uint32_t *t, const float *g) {
  struct kn_row_hp hp;

  cm_rowopt_hp(&hp, o);
  *t += 1;
  switch (o->type) {
  case CM_ROWOPT_SGD:
    kn_row_sgd(w, g, dim, &hp);
    break;
  case CM_ROWOPT_ADAGRAD:
    kn_row_adagrad(w, state, g, dim, &hp);
    break;
  case CM_ROWOPT_ROWWISE_ADAGRAD:
    kn_row_rowwise_adagrad(w, state, g, dim, &hp);
    break;
  case CM_ROWOPT_ADAM:
    kn_row_adam(w, state, state + dim, g, dim, *t, &hp);
    break;
  case CM_ROWOPT_FTRL:
    kn_row_ftrl(w, state, state + dim, g, dim, &hp);
    break;
  default:
    break;
  }
}
