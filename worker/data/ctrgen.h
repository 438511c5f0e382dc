/* The click-through-rate data set generator (docs/ctr.md): a known true
 * model over F categorical fields, ids drawn Zipf-distributed from a space
 * of 10^9 per field, written as LIBSVM files. Deterministic from its seed.
 *
 * Ids: field f's id of rank r (1 = the most frequent) is
 *   f * 10^9 + (r - 1) * 2654435761 mod 10^9
 * (a bijection of the ranks onto the field's 10^9 ids, so hot ids are not
 * neighbours), written as LIBSVM index `id:1`.
 * The true model is a factorization machine:
 *   logit = b + sum_f w(f, r_f) + sum_{f<g} <v(f, r_f), v(g, r_g)>
 * with w ~ N(0, sw^2) and v ~ N(0, sv^2 I_4) drawn from a hash of (seed,
 * field, rank), scaled down by 20 past rank 30 (the long tail carries
 * little signal, so what a model can learn from the data decides the
 * label: the learned model can come within 0.01 of the true model's AUC);
 * label ~ Bernoulli(sigmoid(logit)), b = -1, sw = 0.5, sv = 0.25. Nothing of
 * size 10^9 is stored.
 *
 * The Criteo format (dw_ctrgen_criteo_*, ctrgen_criteo.c) writes Criteo's
 * TSV layout (criteo.h) with Criteo Kaggle's cardinalities instead. */
#ifndef DW_CTRGEN_H
#define DW_CTRGEN_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Ids per field. */
#define DW_CTR_SPAN 1000000000ull

/* What to generate. */
struct dw_ctrgen_opts {
  int fields;     /* categorical fields per example */
  uint64_t train; /* training examples */
  uint64_t test;  /* held-out examples */
  uint64_t seed;  /* the data's seed */
  double zipf;    /* the ranks' exponent, > 1 */
};

/* What the true model scores on the held-out set. */
struct dw_ctrgen_truth {
  double auc;       /* area under the ROC curve of the true probabilities */
  double logloss;   /* mean log loss of the true probabilities */
  double ctr;       /* the held-out set's share of positive labels */
  double dense_auc; /* Criteo format: the AUC of the true model's integer
                       term alone (what no categorical value adds) */
};

/* Writes dir/train.svm, dir/test.svm and dir/truth.json (each to a
 * temporary name first, then renamed, so a reader never sees half a file
 * and two writers of the same settings race harmlessly), into a directory
 * that is new or psd's only (ctrdata.h's dw_ctrdata_claim; truth.json
 * marked as psd's). progress (may be NULL) is told every 10% of lines.
 * Returns 0, CM_EEXIST (dir is not psd's to write: nothing written), or
 * CM_EIO/CM_ENOMEM with err naming the file. */
int dw_ctrgen_write(const char *dir, const struct dw_ctrgen_opts *o,
                    struct dw_ctrgen_truth *truth,
                    void (*progress)(const char *file, double done), char *err,
                    size_t errlen);

struct dw_ctrdata;

/* What dir gives a LIBSVM job generating o (ctrdata.h's dw_ctrdata_find):
 * psd's data of exactly o, the user's, or generate. */
int dw_ctrgen_find(const char *dir, const struct dw_ctrgen_opts *o,
                   struct dw_ctrdata *out, char *err, size_t errlen);

/* The Criteo format (ctrgen_criteo.c, docs/ctr.md): what to generate. */
struct dw_ctrgen_criteo_opts {
  uint64_t train; /* training examples */
  uint64_t test;  /* held-out examples */
  uint64_t seed;  /* the data's seed */
  int gzip;       /* 1: train.tsv.gz and test.tsv.gz, else .tsv */
};

/* The Criteo format's defaults: the bench's size, at which the DLRM's
 * tables (ids % dw_criteo_bounds) hold more than 10M rows after an epoch. */
#define DW_CRITEO_TRAIN 5000000
#define DW_CRITEO_TEST 100000
/* The share of uniform draws (the long tail) in the fields of millions. */
#define DW_CRITEO_TAIL 0.6

/* Writes dir/train.tsv[.gz], dir/test.tsv[.gz] (criteo.h's layout) and
 * dir/truth.json, as dw_ctrgen_write does (CM_EEXIST too);
 * truth->dense_auc too. */
int dw_ctrgen_criteo_write(const char *dir,
                           const struct dw_ctrgen_criteo_opts *o,
                           struct dw_ctrgen_truth *truth,
                           void (*progress)(const char *file, double done),
                           char *err, size_t errlen);

/* What dir gives a Criteo job generating o (as dw_ctrgen_find). */
int dw_ctrgen_criteo_find(const char *dir,
                          const struct dw_ctrgen_criteo_opts *o,
                          struct dw_ctrdata *out, char *err, size_t errlen);

/* The training and test files' paths for o in dir. */
void dw_ctrgen_criteo_names(const struct dw_ctrgen_criteo_opts *o,
                            const char *dir, char *train, char *test,
                            size_t size);

/* The true model's scores of a held-out set: truth's auc, logloss (the
 * probabilities clamped to [1e-7, 1 - 1e-7]) and ctr of prob[0..n) against
 * the 0/1 labels y. */
void dw_ctrgen_score(const float *prob, const uint8_t *y, uint64_t n,
                     struct dw_ctrgen_truth *truth);

/* Finishes a file written as tmp (f open on it): flushed, fsynced, closed
 * and renamed to path, so that path is complete or absent. On failure tmp
 * is removed and err names the file. Returns 0 or CM_EIO. */
int dw_ctrgen_commit(FILE *f, const char *tmp, const char *path, char *err,
                     size_t errlen);

/* Writes j (taken: freed here; NULL reads as out of memory) as
 * dir/truth.json through a temporary name. Returns 0, or CM_EIO with err
 * naming the file. */
int dw_ctrgen_put_truth(const char *dir, json_t *j, char *err, size_t errlen);

/* A standard normal from a 64-bit hash (Box-Muller). */
double dw_ctrgen_normal(uint64_t h);

/* A Zipf rank in 1..DW_CTR_SPAN of exponent s (continuous inverse CDF),
 * drawn from *state (splitmix64). */
uint64_t dw_ctrgen_rank(uint64_t *state, double s);

/* A drifting stream (ctrgen_drift.c, docs/ctr.md "Training on a stream"):
 * parts part-00000.svm, part-00001.svm, ... of LIBSVM lines like
 * dw_ctrgen_write's, whose truth changes from part to part:
 *   - popular ids fade: in part p the id of rank r is the item
 *     key = p * shift + 1 - r (mod 10^9, then mapped to an id as above), so
 *     each part every item moves `shift` ranks down and `shift` new items
 *     take the top ranks;
 *   - the true weights move: an item's w and v are
 *     cos(p * turn) a + sin(p * turn) b of two draws a, b from a hash of
 *     (seed, field, item), scaled by 1 at ranks <= 30 and 0.05 past them
 *     (an item's signal fades with its rank);
 *   - the labels: Bernoulli(sigmoid(-1 + sum w + sum_{f<g} <v_f, v_g>)).
 * Part p's lines depend on (seed, fields, zipf, shift, turn, p,
 * per_part) alone. */
struct dw_ctrgen_drift_opts {
  int fields;        /* categorical fields per example */
  uint64_t parts;    /* parts in the stream */
  uint64_t per_part; /* examples per part */
  uint64_t seed;     /* the data's seed */
  double zipf;       /* the ranks' exponent, > 1 */
  uint64_t shift;    /* ranks every item falls per part */
  double turn;       /* radians the true weights turn per part */
  uint64_t from, to; /* write parts [from, to) only (truth.json has all) */
  double delay_s;    /* seconds to wait before each part after the first
                        written */
  const char *end;   /* the end marker written after the parts, or NULL */
};

/* Writes o's parts [from, to) into dir (each as ".NAME.tmp-PID", then
 * renamed: a follower never sees half a part), then dir/truth.json (the
 * settings, and per part its name, examples, true AUC, log loss and CTR),
 * then the end marker when o->end. said (may be NULL) is told each part's
 * name as it lands. Returns 0, or CM_EIO/CM_ENOMEM with err naming the
 * file. */
int dw_ctrgen_drift_write(const char *dir, const struct dw_ctrgen_drift_opts *o,
                          void (*said)(const char *part), char *err,
                          size_t errlen);

/* The AUC of scores s[0..n) against 0/1 labels y (ties count half), by
 * sorting; 0.5 when one class is absent. */
double dw_auc(const float *s, const uint8_t *y, size_t n);

#endif
