/* The click data generator's Criteo format (ctrgen.h, docs/ctr.md "The
 * generator's Criteo data"): lines of Criteo's TSV layout (criteo.h) with
 * a known true model, deterministic from the seed.
 *
 * Categorical field f draws a value's rank r in 1..N_f (N_f =
 * dw_criteo_bounds[f], Criteo Kaggle's distinct count): missing (an empty
 * field) with probability miss_f, else with probability tail_f uniformly
 * (the long tail of values seen once or twice), else Zipf-distributed with
 * exponent s_f (1.05 for the fields of millions of values, 1.1 for the
 * tens of thousands, 1.2 for the small ones). Rank r's value is eight
 * lowercase hex digits of (r * 2654435761 ^ salt_f) mod 2^32 (a bijection,
 * so ranks keep apart). Integer feature j: missing with probability
 * imiss_j, else floor(exp(mu_j + sig_j * z)) - 1 (z standard normal: a
 * heavy-tailed count from 0; I2 is -1 or -2 a twentieth of the time).
 *
 * The label is Bernoulli(sigmoid(logit)) of a factorization machine over
 * the categorical values plus a term on the integers:
 *   logit = BIAS + sum_f w(f, b_f) + sum_{f<g} <v(f, b_f), v(g, b_g)>
 *           + sum_j a_j (log(1 + max(x_j, 0)) - mu_j) / sig_j
 * w ~ N(0, SW^2), v ~ N(0, SV^2 I_4), a_j ~ N(0, SA^2). A value's w and v
 * are drawn from a hash of (seed, field, b_f), its row: the row its id
 * takes in the DLRM's bounded table, dw_criteo_id % dw_criteo_bounds[f], so
 * values that share a row share their parameters and a model of bounded tables
 * can hold the truth (version 1 drew them per rank: a small field's values
 * collide in N_f rows, which capped such a DLRM 0.03 under the truth). A
 * missing value (rank 0) is the empty value, hashed as any other. The rows of
 * ranks 0..HOT carry the signal; every other row a twentieth of it: what a
 * model sees often enough to learn decides the labels. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "criteo.h"
#include "ctrdata.h"
#include "ctrgen.h"
#include "err.h"
#include "rand.h"

#define K 4         /* the true interaction vectors' width */
#define HOT 10      /* rows but those of ranks 0..HOT: a twentieth */
#define SW 0.5      /* the categorical weights' scale */
#define SV 0.12     /* the interaction vectors' scale */
#define SA 0.15     /* the integer terms' scale */
#define BIAS (-1.6) /* the true model's bias */
#define VERSION 2   /* truth.json's settings.version: these rules */

/* Categorical fields' missing rates (Criteo Kaggle's, rounded). */
static const double miss[DW_CRITEO_CATS] = {
    0, 0, .034, .034, 0, .12, 0,   0,    0,   0, 0,    .034, 0,
    0, 0, .034, 0,    0, .44, .44, .034, .76, 0, .034, .44,  .44};
/* Integer features' missing rates, and their log-normal mu and sigma. */
static const double imiss[DW_CRITEO_INTS] = {
    .45, 0, .21, .22, .026, .22, .043, .0005, .043, .45, .043, .77, .22};
static const double imu[DW_CRITEO_INTS] = {0.8, 2,   2.5, 1.8, 7,   4, 1.5,
                                           2.5, 3.5, 0.5, 1.2, 0.5, 2};
static const double isig[DW_CRITEO_INTS] = {1, 1.5, 1.4, 1, 2,   1.8, 1.5,
                                            1, 1.2, 0.6, 1, 0.6, 1.2};

/* A field's draw: its Zipf exponent and its uniform tail's share. */
static double zipf_of(int f) {
  uint64_t n = dw_criteo_bounds[f];
  return n >= 1000000 ? 1.05 : n >= 10000 ? 1.1 : 1.2;
}
static double tail_of(int f) {
  uint64_t n = dw_criteo_bounds[f];
  return n >= 1000000 ? DW_CRITEO_TAIL : n >= 50000 ? 0.3 : 0;
}

/* A uniform double in [0, 1) from a 64-bit word. */
static double unit(uint64_t h) {
  return (double)(h >> 11) * (1.0 / 9007199254740992.0);
}

/* A standard normal from a 64-bit hash (Box-Muller). */
static double normal(uint64_t h) {
  double u1 = ((double)(h >> 11) + 0.5) * (1.0 / 9007199254740992.0);
  double u2 = unit(cm_mix64(h));
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* The true parameters of (field, row b), at scale: w and v[K]. */
static void params(uint64_t seed, int f, uint64_t b, double scale, double *w,
                   double *v) {
  uint64_t key = cm_mix64(cm_splitmix64_at(seed ^ 0x637269746556ull) ^
                          ((uint64_t)f << 56) ^ b);
  *w = SW * scale * normal(cm_splitmix64_at(key));
  for (int k = 0; k < K; k++)
    v[k] = SV * scale * normal(cm_splitmix64_at(key + 1 + (uint64_t)k));
}

/* The generator's tables: the hot ranks' parameters, per-field draws. */
struct gen {
  uint64_t seed;                         /* the data's seed */
  uint64_t hb[DW_CRITEO_CATS][HOT + 1];  /* the rows of ranks 0..HOT */
  double hw[DW_CRITEO_CATS][HOT + 1];    /* w of those rows */
  double hv[DW_CRITEO_CATS][HOT + 1][K]; /* v of those rows */
  double a[DW_CRITEO_INTS];              /* the integer terms' weights */
  double top[DW_CRITEO_CATS];            /* (N_f + 1)^(1 - s_f) */
  uint32_t salt[DW_CRITEO_CATS];         /* the values' salts */
};

/* Rank r's value, eight hex digits (none for rank 0, missing), at o;
 * returns its length. */
static size_t value_of(const struct gen *g, int f, uint64_t r, char *o) {
  static const char hex[] = "0123456789abcdef";
  if (!r)
    return 0;
  uint32_t v = (uint32_t)r * 2654435761u ^ g->salt[f];
  for (int k = 7; k >= 0; k--)
    *o++ = hex[(v >> (4 * k)) & 15];
  return 8;
}

/* The row of a value (len bytes at s) in field f's bounded table. */
static uint64_t row_of(int f, const char *s, size_t len) {
  return dw_criteo_id(f, s, len) % dw_criteo_bounds[f];
}

static void gen_init(struct gen *g, uint64_t seed) {
  g->seed = seed;
  for (int f = 0; f < DW_CRITEO_CATS; f++) {
    g->top[f] = pow((double)dw_criteo_bounds[f] + 1.0, 1.0 - zipf_of(f));
    g->salt[f] = (uint32_t)cm_splitmix64_at(seed * 31 + (uint64_t)f);
    for (uint64_t r = 0; r <= HOT; r++) {
      char s[8];
      g->hb[f][r] = row_of(f, s, value_of(g, f, r, s));
      params(seed, f, g->hb[f][r], 1.0, &g->hw[f][r], g->hv[f][r]);
    }
  }
  for (int j = 0; j < DW_CRITEO_INTS; j++)
    g->a[j] = SA * normal(cm_splitmix64_at(seed ^ (0x696e74ull + (uint64_t)j)));
}

/* Field f's rank: 0 missing, else 1..N_f. */
static uint64_t draw_rank(const struct gen *g, int f, uint64_t *st) {
  uint64_t n = dw_criteo_bounds[f];
  double u = unit(cm_splitmix64(st)), s = zipf_of(f);
  if (u < miss[f])
    return 0;
  u = (u - miss[f]) / (1 - miss[f]); /* uniform again */
  if (u < tail_of(f))
    return 1 + cm_splitmix64(st) % n;
  double x =
      pow((g->top[f] - 1.0) * unit(cm_splitmix64(st)) + 1.0, 1.0 / (1.0 - s));
  return x < 1 ? 1 : x >= (double)n ? n : (uint64_t)x;
}

/* Writes one example from state *st to buf (returns its length); its true
 * probability in *p and the dense term alone in *dense_logit. */
static size_t example(const struct gen *g, uint64_t *st, char *buf, double *p,
                      double *dense_logit, int *label) {
  uint64_t r[DW_CRITEO_CATS];
  char val[DW_CRITEO_CATS][8];
  size_t vlen[DW_CRITEO_CATS];
  double logit = BIAS, dl = 0, sum[K] = {0}, sq = 0;
  long long x[DW_CRITEO_INTS];
  int have[DW_CRITEO_INTS];
  for (int j = 0; j < DW_CRITEO_INTS; j++) {
    double u = unit(cm_splitmix64(st));
    double z = normal(cm_splitmix64(st));
    have[j] = u >= imiss[j];
    x[j] = have[j] ? (long long)floor(exp(imu[j] + isig[j] * z)) - 1 : 0;
    if (j == 1 && unit(cm_splitmix64(st)) < 0.05)
      x[j] = -1 - (z > 0);
    dl += g->a[j] * (log1p(x[j] > 0 ? (double)x[j] : 0) - imu[j]) / isig[j];
  }
  for (int f = 0; f < DW_CRITEO_CATS; f++) {
    double w, v[K], *pv = v;
    r[f] = draw_rank(g, f, st);
    vlen[f] = value_of(g, f, r[f], val[f]);
    uint64_t b = row_of(f, val[f], vlen[f]);
    int h = 0;
    while (h <= HOT && g->hb[f][h] != b)
      h++;
    if (h <= HOT) {
      w = g->hw[f][h];
      pv = (double *)g->hv[f][h];
    } else {
      params(g->seed, f, b, 0.05, &w, v);
    }
    logit += w;
    for (int k = 0; k < K; k++) {
      sum[k] += pv[k];
      sq += pv[k] * pv[k];
    }
  }
  for (int k = 0; k < K; k++)
    logit += 0.5 * sum[k] * sum[k];
  logit += dl - 0.5 * sq;
  *p = 1.0 / (1.0 + exp(-logit));
  *dense_logit = dl;
  *label = unit(cm_splitmix64(st)) < *p;
  char *o = buf;
  *o++ = (char)('0' + *label);
  for (int j = 0; j < DW_CRITEO_INTS; j++) {
    *o++ = '\t';
    if (have[j])
      o += sprintf(o, "%lld", x[j]);
  }
  for (int f = 0; f < DW_CRITEO_CATS; f++) {
    *o++ = '\t';
    memcpy(o, val[f], vlen[f]);
    o += vlen[f];
  }
  *o++ = '\n';
  return (size_t)(o - buf);
}

/* Writes n examples to path (gzip when gz) from state *st; scores into
 * prob/dense/y when not NULL. */
static int write_set(const char *path, int gz, const struct gen *g, uint64_t n,
                     uint64_t *st, float *prob, float *dense, uint8_t *y,
                     void (*progress)(const char *, double), char *err,
                     size_t errlen) {
  char tmp[1200], *buf = malloc(1u << 20);
  size_t used = 0;
  int rc = CM_EIO;
  snprintf(tmp, sizeof tmp, "%s.tmp-%d", path, (int)getpid());
  gzFile f = buf ? gzopen(tmp, gz ? "wb1" : "wbT") : NULL;
  if (!f) {
    snprintf(err, errlen, "cannot create %s: %s", tmp, strerror(errno));
    free(buf);
    return CM_EIO;
  }
  for (uint64_t i = 0; i < n; i++) {
    double p, dl;
    int label;
    used += example(g, st, buf + used, &p, &dl, &label);
    if (prob) {
      prob[i] = (float)p;
      dense[i] = (float)dl;
      y[i] = (uint8_t)label;
    }
    if (used > (1u << 20) - 1024 || i + 1 == n) {
      if (gzwrite(f, buf, (unsigned)used) != (int)used) {
        int zerr;
        snprintf(err, errlen, "write %s: %s", tmp, gzerror(f, &zerr));
        goto out;
      }
      used = 0;
    }
    if (progress && n >= 10 && (i + 1) % (n / 10) == 0)
      progress(path, (double)(i + 1) / (double)n);
  }
  if (gzclose(f) != Z_OK) {
    f = NULL;
    snprintf(err, errlen, "write %s: %s", tmp, strerror(errno));
    goto out;
  }
  f = NULL;
  if (rename(tmp, path) != 0) {
    snprintf(err, errlen, "cannot rename %s to %s: %s", tmp, path,
             strerror(errno));
    goto out;
  }
  rc = 0;
out:
  if (f)
    gzclose(f);
  if (rc)
    unlink(tmp);
  free(buf);
  return rc;
}

/* truth.json's settings object. */
static json_t *settings(const struct dw_ctrgen_criteo_opts *o) {
  return json_pack("{s:s, s:I, s:I, s:I, s:b, s:f, s:i}", "format", "criteo",
                   "train", (json_int_t)o->train, "test", (json_int_t)o->test,
                   "seed", (json_int_t)o->seed, "gzip", o->gzip, "tail",
                   DW_CRITEO_TAIL, "version", VERSION);
}

void dw_ctrgen_criteo_names(const struct dw_ctrgen_criteo_opts *o,
                            const char *dir, char *train, char *test,
                            size_t size) {
  snprintf(train, size, "%s/train.tsv%s", dir, o->gzip ? ".gz" : "");
  snprintf(test, size, "%s/test.tsv%s", dir, o->gzip ? ".gz" : "");
}

int dw_ctrgen_criteo_write(const char *dir,
                           const struct dw_ctrgen_criteo_opts *o,
                           struct dw_ctrgen_truth *truth,
                           void (*progress)(const char *file, double done),
                           char *err, size_t errlen) {
  const char *const gen[2] = {o->gzip ? "train.tsv.gz" : "train.tsv",
                              o->gzip ? "test.tsv.gz" : "test.tsv"};
  char train[1100], test[1100];
  float *prob = malloc((o->test + 1) * sizeof *prob);
  float *dense = malloc((o->test + 1) * sizeof *dense);
  uint8_t *y = malloc(o->test + 1);
  struct gen *g = malloc(sizeof *g);
  uint64_t st = cm_splitmix64_at(o->seed ^ 0x747261696eull);
  int rc = CM_ENOMEM;
  if (!prob || !dense || !y || !g) {
    snprintf(err, errlen, "out of memory");
    goto out;
  }
  gen_init(g, o->seed);
  dw_ctrgen_criteo_names(o, dir, train, test, sizeof train);
  if ((rc = dw_ctrdata_claim(dir, gen, err, errlen)))
    goto out;
  if ((rc = write_set(train, o->gzip, g, o->train, &st, NULL, NULL, NULL,
                      progress, err, errlen)))
    goto out;
  st = cm_splitmix64_at(o->seed ^ 0x74657374ull);
  if ((rc = write_set(test, o->gzip, g, o->test, &st, prob, dense, y, progress,
                      err, errlen)))
    goto out;
  dw_ctrgen_score(prob, y, o->test, truth);
  truth->dense_auc = dw_auc(dense, y, o->test);
  rc = dw_ctrdata_mark(
      dir,
      json_pack("{s:o, s:f, s:f, s:f, s:f}", "settings", settings(o),
                "true_auc", truth->auc, "true_logloss", truth->logloss, "ctr",
                truth->ctr, "dense_true_auc", truth->dense_auc),
      gen, err, errlen);
out:
  free(prob);
  free(dense);
  free(y);
  free(g);
  return rc;
}

int dw_ctrgen_criteo_find(const char *dir,
                          const struct dw_ctrgen_criteo_opts *o,
                          struct dw_ctrdata *out, char *err, size_t errlen) {
  const char *const gen[2] = {o->gzip ? "train.tsv.gz" : "train.tsv",
                              o->gzip ? "test.tsv.gz" : "test.tsv"};
  return dw_ctrdata_find(dir, 1, settings(o), gen, out, err, errlen);
}
