/* What an embedding table is, as the spec names it (job.tables[], or a
 * client's declare): its name, row width, id bound, initializer, per-row
 * optimizer, admission and eviction. Plain data shared by the spec parser,
 * psd's tables (ps-server/psd/store/table.h), libpsclient and psctl. The
 * per-row update rules themselves are kernels/rowopt.h (common/vars/optstep.h
 * applies a cm_rowopt with them). */
#ifndef CM_TABCONF_H
#define CM_TABCONF_H

#include <stddef.h>
#include <stdint.h>

/* Most tables in one job (and on one shard). */
#define CM_TABLE_MAX 64
/* Longest table name (a variable name's limit). */
#define CM_TABLE_MAX_NAME 200
/* Widest row, in floats. */
#define CM_TABLE_MAX_DIM 1024

/* A per-row optimizer's rule. Applied lazily: only to the rows a push
 * touches, once per row per push (duplicate ids summed first). */
enum cm_rowopt_type {
  CM_ROWOPT_SGD = 0,         /* w -= lr g; no state */
  CM_ROWOPT_ADAGRAD,         /* element-wise: a += g^2; w -= lr g /
                                (sqrt(a) + eps); dim floats of state */
  CM_ROWOPT_ROWWISE_ADAGRAD, /* one accumulator per row: a += mean(g^2);
                                w -= lr g / (sqrt(a) + eps); 1 float */
  CM_ROWOPT_ADAM,            /* lazy Adam: m, v per element, bias
                                correction by the row's own step count;
                                2 dim floats */
  CM_ROWOPT_FTRL,            /* FTRL-Proximal (McMahan et al. 2013): z, n
                                per element; 2 dim floats */
  CM_ROWOPT_NTYPES           /* number of types */
};

/* A per-row optimizer with its hyper-parameters (those its type does not
 * use are kept, and ignored). */
struct cm_rowopt {
  enum cm_rowopt_type type;   /* the rule */
  double lr;                  /* learning rate (FTRL's alpha), > 0 */
  double eps;                 /* adagrad, adam: denominator term, > 0 */
  double initial_accumulator; /* adagrad (both), ftrl: n's start, >= 0 */
  double beta1;               /* adam: first-moment decay, [0, 1) */
  double beta2;               /* adam: second-moment decay, [0, 1) */
  double l1;                  /* ftrl: L1 strength, >= 0 */
  double l2;                  /* ftrl: L2 strength, >= 0 */
  double ftrl_beta;           /* ftrl: beta in the per-coordinate rate, >= 0 */
};

/* When a never-stored id's row is stored (admission). */
enum cm_admit_type {
  CM_ADMIT_ALWAYS = 0, /* on first touch */
  CM_ADMIT_COUNT,      /* once the id has been pushed admit_count times */
  CM_ADMIT_PROB,       /* each push of it admits it with probability
                          admit_prob (decided by a hash of (seed, table, id,
                          the id's push count), so every run agrees) */
};

/* How a table's rows are first filled. */
enum cm_table_init {
  CM_TABLE_INIT_ZEROS = 0,   /* all zero */
  CM_TABLE_INIT_UNIFORM = 1, /* uniform in [-init_scale, init_scale),
                                seeded by (job seed, table, id) */
};

/* One table, as configured. */
struct cm_table_conf {
  char name[CM_TABLE_MAX_NAME + 1]; /* unique among tables and variables */
  uint32_t dim;                     /* floats per row, 1..CM_TABLE_MAX_DIM */
  uint64_t id_bound;                /* 0: any u64 id; else ids < id_bound */
  enum cm_table_init init;          /* how new rows are filled */
  float init_scale;                 /* bound of uniform */
  struct cm_rowopt opt;             /* the per-row optimizer */
  enum cm_admit_type admit;         /* admission */
  uint32_t admit_count;             /* CM_ADMIT_COUNT: pushes before storing */
  double admit_prob;                /* CM_ADMIT_PROB: in (0, 1] */
  uint64_t evict_after_steps;       /* evict rows untouched for this many steps
                                       (the shard's step: sync commits, async
                                       worker steps applied); 0: never */
  uint32_t evict_min_count;         /* evict rows pushed fewer times than this;
                                       0: never */
};

/* The defaults: dim 0 (must be set), unbounded, uniform 0.01, adagrad
 * lr 0.05 eps 1e-8 initial_accumulator 0.1, adam betas 0.9/0.999, ftrl
 * l1 0 l2 0 beta 1, admit always, no eviction. */
void cm_table_conf_defaults(struct cm_table_conf *c);

/* The settings of table `name` as every part of psd applies them: the
 * entry of spec[0..nspec) (job.tables, each completed from
 * job.table_defaults by the parser) that has this name, else *defaults
 * (job.table_defaults) with id_bound 0; then name and dim set. The shard
 * (ps-server/psd/store/tables.c), the serving task (serve.c) and the export
 * (psd.export, through the Python extension) all ask here, so a table has
 * one initializer wherever its rows are made. */
void cm_table_conf_for(const struct cm_table_conf *spec, int nspec,
                       const struct cm_table_conf *defaults, const char *name,
                       uint32_t dim, struct cm_table_conf *out);

/* "sgd", "adagrad", "rowwise_adagrad", "adam", "ftrl"; "?" for a bad one. */
const char *cm_rowopt_name(enum cm_rowopt_type t);

/* The type called name; 0, or CM_EINVAL for an unknown name. */
int cm_rowopt_parse(const char *name, enum cm_rowopt_type *out);

/* Floats of optimizer state per row for a type and width: 0 sgd, dim
 * adagrad, 1 rowwise_adagrad, 2 dim adam and ftrl. */
uint32_t cm_rowopt_nstate(enum cm_rowopt_type t, uint32_t dim);

/* Names of the state's parts, in storage order, for psctl get and export:
 * "accum"; "accum"; "m", "v"; "z", "n". NULL past the type's parts. Each
 * part is dim floats, except rowwise_adagrad's one. */
const char *cm_rowopt_state_name(enum cm_rowopt_type t, int i);

/* Writes what o does, e.g. "adagrad(lr=0.05, eps=1e-08,
 * initial_accumulator=0.1)". */
void cm_rowopt_describe(const struct cm_rowopt *o, char *buf, size_t len);

#endif
