/* A configured optimizer applied to a tensor: the bridge from the spec's
 * optimizer (optconf.h: type, hyper-parameters, lr schedule) to the update
 * kernels (kernels/optim.h), which know nothing of configuration. psd's
 * store applies pushes with it, and dworker --standalone its local steps.
 * It lives outside kernels/ so that the math library stays pure. */
#ifndef CM_OPTSTEP_H
#define CM_OPTSTEP_H

#include <stddef.h>
#include <stdint.h>

#include "optconf.h"
#include "optim.h"

/* Fills hp for update k (0-based: k updates came before it) of optimizer o:
 * lr from o's schedule at k, t = k + 1, the rest from o, rounded to float. */
void cm_optim_hp_at(struct kn_optim_hp *hp, const struct cm_optim *o,
                    uint64_t k);

/* Runs optimizer o as update k (see cm_optim_hp_at) on w, g (n) and its
 * slots: slots[i] (n) for i below cm_optim_nslots(o->type), in the order
 * of cm_optim_slot_name. */
void cm_optim_apply(const struct cm_optim *o, uint64_t k, float *w,
                    float *const *slots, const float *g, size_t n);

#endif
