/* A configured optimizer applied to a tensor or to a table's row: the one
 * bridge from the spec's optimizers to the update kernels, which know
 * nothing of configuration. For dense variables, optconf.h's optimizer
 * (type, hyper-parameters, lr schedule) to kernels/optim.h: psd's store
 * applies pushes with it, and dworker --standalone its local steps. For
 * embedding tables, tabconf.h's per-row optimizer to kernels/rowopt.h
 * (the formulas and their float order are there): psd's tables, and the
 * in-memory baseline of bench sparse. It lives outside kernels/ so that
 * the math library stays pure. */
#ifndef CM_OPTSTEP_H
#define CM_OPTSTEP_H

#include <stddef.h>
#include <stdint.h>

#include "optconf.h"
#include "optim.h"
#include "rowopt.h"
#include "tabconf.h"

/* Fills hp for update k (0-based: k updates came before it) of optimizer o:
 * lr from o's schedule at k, t = k + 1, the rest from o, rounded to float. */
void cm_optim_hp_at(struct kn_optim_hp *hp, const struct cm_optim *o,
                    uint64_t k);

/* Runs optimizer o as update k (see cm_optim_hp_at) on w, g (n) and its
 * slots: slots[i] (n) for i below cm_optim_nslots(o->type), in the order
 * of cm_optim_slot_name. */
void cm_optim_apply(const struct cm_optim *o, uint64_t k, float *w,
                    float *const *slots, const float *g, size_t n);

/* Fills hp from per-row optimizer o: lr, beta1, beta2 as configured
 * (double), the rest rounded to float. */
void cm_rowopt_hp(struct kn_row_hp *hp, const struct cm_rowopt *o);

/* Fills a new row's state (cm_rowopt_nstate(o->type, dim) floats) for its
 * initial value w (dim floats): the accumulators with initial_accumulator
 * (adagrad, rowwise_adagrad, ftrl's n), ftrl's z from w and n
 * (kernels/rowopt.h), the rest (adam's m and v) with zeros. */
void cm_rowopt_init_state(const struct cm_rowopt *o, uint32_t dim,
                          const float *w, float *state);

/* Applies o to row w (dim floats) with gradient g (dim floats) and the
 * row's state, in cm_rowopt_state_name's order; *t is the row's update
 * count (Adam's t), incremented. */
void cm_rowopt_apply(const struct cm_rowopt *o, uint32_t dim, float *w,
                     float *state, uint32_t *t, const float *g);

#endif
