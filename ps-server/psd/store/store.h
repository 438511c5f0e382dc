/* Room ps-server/psd/store/, a training shard's state in memory: its
 * variables (store.h), its embedding tables by name (tables.h) and each
 * table's rows (table.h; table_internal.h is the room's own) in the
 * storage engine a serving task's tables use too (rows.h), and the pushes
 * it has applied (dedup.h). Training, checkpoints, publishing and
 * the reshard all hold the state through these. Rooms it calls: none.
 *
 * A shard's variables: for each, the rows this shard holds, in one aligned
 * allocation with the optimizer's slots beside the values, a version
 * (pushes applied), the optimizer's step count and a lock. Each variable
 * has its own optimizer, picked from the job's set (the spec's
 * job.optimizer and job.optimizer_overrides) when it is created, or named
 * by the declaration itself (VarSpec.optimizer). A thread
 * touching a variable holds that variable's lock, never a store-wide one;
 * the name table has its own read-write lock. */
#ifndef PSD_STORE_H
#define PSD_STORE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "optconf.h"

#define PSD_VAR_MAX_DIMS 4
#define PSD_VAR_MAX_NAME 200
/* Longest optimizer description (cm_optim_describe). */
#define PSD_OPTIM_DESC 256
#define PSD_VAR_MAX_ELEMS (1ULL << 40) /* elements of the whole variable */

enum psd_init { PSD_INIT_ZEROS = 0, PSD_INIT_UNIFORM = 1 };

/* One variable's slice on this shard. Fields above `lock` are fixed at
 * creation; value, slots, version and applied are guarded by lock. */
struct psd_var {
  char name[PSD_VAR_MAX_NAME + 1]; /* unique in the store */
  int ndim;                        /* 1..PSD_VAR_MAX_DIMS */
  int64_t shape[PSD_VAR_MAX_DIMS]; /* the whole variable's shape */
  int placement;                 /* -1 split, else the shard holding it whole */
  int64_t row_begin, row_end;    /* rows held here */
  uint64_t elem_begin, elem_end; /* the same as global element numbers */
  uint64_t numel;                /* elements of the whole variable */
  int index;                     /* position in declaration order */
  /* this variable's optimizer: the job's, its override's, or its own */
  struct cm_optim opt;
  /* the job.optimizer_overrides entry that chose opt, -1 for job.optimizer
   * or a declared one (own) */
  int rule;
  int own;    /* 1: opt was declared with the variable (VarSpec.optimizer) */
  int nslots; /* cm_optim_nslots(opt.type) */
  /* what opt does, cm_optim_describe(&opt) (VarStatus.optimizer) */
  char optim_desc[PSD_OPTIM_DESC];
  pthread_mutex_t lock; /* guards the fields below */
  float *value;         /* owned, elem_end - elem_begin floats */
  /* slot i (cm_optim_slot_name) beside value in value's allocation, each
   * 64-byte aligned; NULL from nslots on */
  float *slots[CM_OPTIM_MAX_SLOTS];
  uint64_t version; /* pushes applied */
  /* Gradient elements the optimizer has applied to this slice: the update
   * that takes it past k whole slices is update k + 1 (Adam's t, the
   * schedule's step). Async pushes of one step come in chunks, in any
   * order, so updates are counted in elements; sync sets it from the
   * committed step. */
  uint64_t applied;
  /* How its declaration chose the placement (CM_LAYOUT_SPLIT, AUTO, NAME,
   * a shard index, or CM_LAYOUT_UNSAID: VarSpec.asked), kept through
   * reshards (cm_layout_replace); psd_store_set_asked sets it. */
  int asked;
  /* The random id of the client whose Declare created it here
   * (DeclareRequest.client; 0: not said, or restored from a checkpoint);
   * psd_store_set_asked sets it. */
  uint64_t creator;
};

struct psd_store;

/* optims (copied) gives each variable its optimizer. */
int psd_store_new(struct psd_store **out, int shard, int nshards,
                  const struct cm_optim_set *optims);
void psd_store_free(struct psd_store *s);

/* ---- The switch gate: a live layout switch (reshard/switch.h) replaces
 * the variables while the shard serves. Every user of the variables, a
 * call on gRPC's thread, a checkpoint's or a publication's snapshot on
 * theirs, read-holds the gate while it uses them (one uncontended rwlock
 * read); the switch's FREEZE takes it for writing to set `frozen` (dense
 * calls are then refused, retried by the clients, and snapshots wait) and
 * its COMMIT takes it for writing to replace the variables and thaw. ---- */

/* Read-holds the gate; returns whether the store is frozen. Release it
 * with psd_store_release either way. */
int psd_store_hold(struct psd_store *s);
void psd_store_release(struct psd_store *s);

/* Read-holds the gate once the store is not frozen, waiting up to wait_ms
 * for the thaw: 0 (held), or CM_ETIMEDOUT (still frozen, not held). For
 * snapshots (checkpoints, publications), which must not copy a shard
 * whose layout is switching. */
int psd_store_hold_thawed(struct psd_store *s, long wait_ms);

/* Sets or clears frozen with the gate held for writing: once it returns,
 * every user that held the gate before has released it. */
void psd_store_freeze(struct psd_store *s, int frozen);
int psd_store_frozen(struct psd_store *s);

/* Holds the gate for writing, and releases it (thaw: clearing frozen
 * first). */
void psd_store_exclusive(struct psd_store *s);
void psd_store_exclusive_end(struct psd_store *s, int thaw);

/* Swaps s's variables and shard count with staged's (the caller holds the
 * gate for writing): s holds staged's variables from now on, staged the
 * old ones, to be freed with it. The optimizer set and the gate stay. */
void psd_store_replace(struct psd_store *s, struct psd_store *staged);

/* The shard count the store's variables are placed among. */
int psd_store_nshards(const struct psd_store *s);

/* Creates the variable, or checks that an existing one agrees. own (may
 * be NULL: the job's set picks, psd_store_want) is the variable's own
 * optimizer, copied. Returns 0 and sets *created; CM_EEXIST when the name
 * exists with another shape, placement or optimizer, CM_EINVAL for a bad
 * shape/placement/name, CM_ENOMEM; err says which, naming the variable and
 * both shapes or both optimizers (cm_optim_describe). *out is the store's
 * (borrowed until psd_store_free). */
int psd_store_declare(struct psd_store *s, const char *name, int ndim,
                      const int64_t *shape, int placement, enum psd_init init,
                      float init_scale, uint64_t seed,
                      const struct cm_optim *own, struct psd_var **out,
                      int *created, char *err, size_t errlen);

/* The same, creating it with values (the caller's, copied: this shard's
 * rows of it, elem_end - elem_begin floats as cm_layout_rows places them)
 * instead of an initializer. An existing variable keeps its values. */
int psd_store_declare_values(struct psd_store *s, const char *name, int ndim,
                             const int64_t *shape, int placement,
                             const float *values, const struct cm_optim *own,
                             struct psd_var **out, int *created, char *err,
                             size_t errlen);

/* The optimizer a declaration of name with own (may be NULL) asks for:
 * own, else the job's set's pick. *rule (may be NULL) gets the rule's
 * index, -1 for job.optimizer or own. Borrowed from own or the store. */
const struct cm_optim *psd_store_want(const struct psd_store *s,
                                      const char *name,
                                      const struct cm_optim *own, int *rule);

/* Writes "<what v has>; this declaration asks for <want>" style text: the
 * CM_EEXIST message for a variable that exists with another optimizer than
 * want (own: whether want is the declaration's own). */
void psd_store_optim_clash(const struct psd_var *v, const struct cm_optim *want,
                           int own, char *err, size_t errlen);

/* Sets v->asked and v->creator (under v->lock): the declaration that
 * created v says how it chose its placement, and which client sent it. A
 * variable is created CM_LAYOUT_UNSAID by no client said (0). */
void psd_store_set_asked(struct psd_var *v, int asked, uint64_t creator);

/* Whether client (nonzero) is the one whose Declare created v here. */
int psd_store_created_by(struct psd_var *v, uint64_t client);

/* The variable called name, or NULL. */
struct psd_var *psd_store_find(struct psd_store *s, const char *name);

/* Number of variables, and the i-th in declaration order. */
int psd_store_count(struct psd_store *s);
struct psd_var *psd_store_at(struct psd_store *s, int i);

/* The store's set of optimizers (borrowed until psd_store_free). */
const struct cm_optim_set *psd_store_optims(const struct psd_store *s);

/* Applies v's optimizer to elements [off, off + n) of v's slice (local
 * numbering) with gradient g, as one async update: its step is counted
 * from v->applied (see there). Caller holds v->lock. */
void psd_store_apply(struct psd_store *s, struct psd_var *v, uint64_t off,
                     const float *g, size_t n);

/* Applies v's optimizer to v's whole slice with gradient g as sync step
 * `step` (0-based: the update is step + 1 for Adam and the schedule).
 * Caller holds v->lock. */
void psd_store_apply_step(struct psd_store *s, struct psd_var *v,
                          const float *g, uint64_t step);

/* Optimizer steps applied to v's slice: ceil(applied / slice length). */
uint64_t psd_var_steps(const struct psd_var *v);

/* Bytes a slice of the variable called name would hold per element: the
 * value and the slots of the optimizer it gets (own, or the job's pick when
 * own is NULL). */
uint64_t psd_store_elem_bytes(const struct psd_store *s, const char *name,
                              const struct cm_optim *own);

/* Bytes this shard holds for v (values plus slots). */
uint64_t psd_var_bytes(const struct psd_store *s, const struct psd_var *v);

/* Writes "[784, 256]". */
void psd_shape_format(int ndim, const int64_t *shape, char *buf, size_t len);

#endif
