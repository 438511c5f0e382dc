/* A configured optimizer applied to a tensor (optstep.h). */
#include "optstep.h"

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
