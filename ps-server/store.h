/* A shard's variables: for each, the rows this shard holds, in one aligned
 * allocation with the optimizer's slot beside the values, a version (pushes
 * applied) and a lock. A thread touching a variable holds that variable's
 * lock, never a store-wide one; the name table has its own read-write lock. */
#ifndef PSD_STORE_H
#define PSD_STORE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define PSD_VAR_MAX_DIMS 4
#define PSD_VAR_MAX_NAME 200
#define PSD_VAR_MAX_ELEMS (1ULL << 40) /* elements of the whole variable */

enum psd_optim_type { PSD_OPT_SGD = 0, PSD_OPT_MOMENTUM = 1 };

/* The server-side optimizer applied to every push. */
struct psd_optim {
  enum psd_optim_type type; /* which update */
  float lr;                 /* learning rate */
  float momentum;           /* momentum coefficient (PSD_OPT_MOMENTUM) */
};

enum psd_init { PSD_INIT_ZEROS = 0, PSD_INIT_UNIFORM = 1 };

/* One variable's slice on this shard. Fields above `lock` are fixed at
 * creation; value, slot and version are guarded by lock. */
struct psd_var {
  char name[PSD_VAR_MAX_NAME + 1]; /* unique in the store */
  int ndim;                        /* 1..PSD_VAR_MAX_DIMS */
  int64_t shape[PSD_VAR_MAX_DIMS]; /* the whole variable's shape */
  int placement;                 /* -1 split, else the shard holding it whole */
  int64_t row_begin, row_end;    /* rows held here */
  uint64_t elem_begin, elem_end; /* the same as global element numbers */
  uint64_t numel;                /* elements of the whole variable */
  int index;                     /* position in declaration order */
  pthread_mutex_t lock;          /* guards the fields below */
  float *value;                  /* owned, elem_end - elem_begin floats */
  float *slot;                   /* momentum buffer beside value, or NULL */
  uint64_t version;              /* pushes applied */
};

struct psd_store;

int psd_store_new(struct psd_store **out, int shard, int nshards,
                  const struct psd_optim *opt);
void psd_store_free(struct psd_store *s);

/* Creates the variable, or checks that an existing one agrees. Returns 0
 * and sets *created; CM_EEXIST when the name exists with another shape or
 * placement, CM_EINVAL for a bad shape/placement/name, CM_ENOMEM; err says
 * which, naming the variable and both shapes. *out is the store's
 * (borrowed until psd_store_free). */
int psd_store_declare(struct psd_store *s, const char *name, int ndim,
                      const int64_t *shape, int placement, enum psd_init init,
                      float init_scale, uint64_t seed, struct psd_var **out,
                      int *created, char *err, size_t errlen);

/* The variable called name, or NULL. */
struct psd_var *psd_store_find(struct psd_store *s, const char *name);

/* Number of variables, and the i-th in declaration order. */
int psd_store_count(struct psd_store *s);
struct psd_var *psd_store_at(struct psd_store *s, int i);

/* Applies the optimizer to elements [off, off + n) of v's slice (local
 * numbering) with gradient g. Caller holds v->lock. */
void psd_store_apply(struct psd_store *s, struct psd_var *v, uint64_t off,
                     const float *g, size_t n);

/* Bytes held per element of a slice: the value and the optimizer's slots. */
uint64_t psd_store_elem_bytes(const struct psd_store *s);

/* Bytes this shard holds for v (values plus slots). */
uint64_t psd_var_bytes(const struct psd_store *s, const struct psd_var *v);

/* "sgd(lr=0.05)" or "momentum(lr=0.05, momentum=0.9)". */
void psd_optim_describe(const struct psd_optim *o, char *buf, size_t len);

/* Writes "[784, 256]". */
void psd_shape_format(int ndim, const int64_t *shape, char *buf, size_t len);

#endif
