/* The click-through-rate data set generator (ctrgen.h). */
#include "ctrgen.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ctrdata.h"
#include "err.h"
#include "rand.h"

#define K 4          /* the true interaction vectors' width */
#define HOT_RANKS 30 /* ranks past this carry a twentieth of the signal */
#define SW 0.5       /* the weights' scale */
#define SV 0.25      /* the interaction vectors' scale */
#define BIAS (-1.0)  /* the true model's bias */

double dw_ctrgen_normal(uint64_t h) {
  double u1 = ((double)(h >> 11) + 0.5) * (1.0 / 9007199254740992.0);
  double u2 = (double)(cm_mix64(h) >> 11) * (1.0 / 9007199254740992.0);
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* The true parameters of (field, rank): w and v[K]. */
static void params(uint64_t seed, int f, uint64_t r, double *w, double *v) {
  uint64_t key = cm_mix64(cm_splitmix64_at(seed) ^ ((uint64_t)f << 56) ^ r);
  double scale = r <= HOT_RANKS ? 1.0 : 0.05;
  *w = SW * scale * dw_ctrgen_normal(cm_splitmix64_at(key));
  for (int k = 0; k < K; k++)
    v[k] =
        SV * scale * dw_ctrgen_normal(cm_splitmix64_at(key + 1 + (uint64_t)k));
}

uint64_t dw_ctrgen_rank(uint64_t *state, double s) {
  double u = (double)(cm_splitmix64(state) >> 11) * (1.0 / 9007199254740992.0);
  double a = 1.0 - s, top = pow((double)DW_CTR_SPAN, a);
  double r = pow((top - 1.0) * u + 1.0, 1.0 / a);
  return r < 1 ? 1 : r > (double)DW_CTR_SPAN ? DW_CTR_SPAN : (uint64_t)r;
}

static uint64_t id_of(int f, uint64_t r) {
  return (uint64_t)f * DW_CTR_SPAN + (r - 1) * 2654435761ull % DW_CTR_SPAN;
}

static int cmp_pair(const void *a, const void *b) {
  float x = ((const float *)a)[0], y = ((const float *)b)[0];
  return x < y ? -1 : x > y;
}

double dw_auc(const float *s, const uint8_t *y, size_t n) {
  float(*p)[2] = malloc((n + 1) * sizeof *p);
  double pos = 0, neg = 0, sum = 0;
  if (!p)
    return 0.5;
  for (size_t i = 0; i < n; i++) {
    p[i][0] = s[i];
    p[i][1] = y[i];
  }
  qsort(p, n, sizeof *p, cmp_pair);
  /* Mid-ranks of ties, summed over the positives. */
  for (size_t i = 0; i < n;) {
    size_t j = i;
    double npos = 0;
    while (j < n && p[j][0] == p[i][0])
      npos += p[j++][1];
    sum += npos * ((double)(i + j + 1) / 2.0);
    pos += npos;
    neg += (double)(j - i) - npos;
    i = j;
  }
  free(p);
  if (pos == 0 || neg == 0)
    return 0.5;
  return (sum - pos * (pos + 1) / 2.0) / (pos * neg);
}

/* Writes one file of n examples from generator state *st; scores the true
 * model into prob/y when they are not NULL. */
static int write_set(const char *path, const struct dw_ctrgen_opts *o,
                     uint64_t n, uint64_t *st, float *prob, uint8_t *y,
                     void (*progress)(const char *, double), char *err,
                     size_t errlen) {
  char tmp[1200];
  snprintf(tmp, sizeof tmp, "%s.tmp-%d", path, (int)getpid());
  FILE *f = fopen(tmp, "w");
  double w[64], v[64][K];
  if (!f) {
    snprintf(err, errlen, "cannot create %s: %s", tmp, strerror(errno));
    return CM_EIO;
  }
  for (uint64_t i = 0; i < n; i++) {
    uint64_t r[64];
    double logit = BIAS;
    for (int k = 0; k < o->fields; k++) {
      r[k] = dw_ctrgen_rank(st, o->zipf);
      params(o->seed, k, r[k], &w[k], v[k]);
      logit += w[k];
    }
    for (int a = 0; a < o->fields; a++)
      for (int b = a + 1; b < o->fields; b++)
        for (int k = 0; k < K; k++)
          logit += v[a][k] * v[b][k];
    double p = 1.0 / (1.0 + exp(-logit));
    double u = (double)(cm_splitmix64(st) >> 11) * (1.0 / 9007199254740992.0);
    int label = u < p;
    fprintf(f, "%d", label);
    for (int k = 0; k < o->fields; k++)
      fprintf(f, " %llu:1", (unsigned long long)id_of(k, r[k]));
    fputc('\n', f);
    if (prob) {
      prob[i] = (float)p;
      y[i] = (uint8_t)label;
    }
    if (progress && n >= 10 && (i + 1) % (n / 10) == 0)
      progress(path, (double)(i + 1) / (double)n);
  }
  return dw_ctrgen_commit(f, tmp, path, err, errlen);
}

int dw_ctrgen_commit(FILE *f, const char *tmp, const char *path, char *err,
                     size_t errlen) {
  if (fflush(f) != 0 || ferror(f) || fsync(fileno(f)) != 0) {
    snprintf(err, errlen, "write %s: %s", tmp, strerror(errno));
    fclose(f);
    unlink(tmp);
    return CM_EIO;
  }
  fclose(f);
  if (rename(tmp, path) != 0) {
    snprintf(err, errlen, "cannot rename %s to %s: %s", tmp, path,
             strerror(errno));
    unlink(tmp);
    return CM_EIO;
  }
  return 0;
}

/* truth.json's settings object. */
static json_t *settings(const struct dw_ctrgen_opts *o) {
  return json_pack("{s:i, s:I, s:I, s:I, s:f, s:i}", "fields", o->fields,
                   "train", (json_int_t)o->train, "test", (json_int_t)o->test,
                   "seed", (json_int_t)o->seed, "zipf", o->zipf, "format", 1);
}

void dw_ctrgen_score(const float *prob, const uint8_t *y, uint64_t n,
                     struct dw_ctrgen_truth *truth) {
  double ll = 0, pos = 0;
  for (uint64_t i = 0; i < n; i++) {
    double p = prob[i] < 1e-7f       ? 1e-7
               : prob[i] > 1 - 1e-7f ? 1 - 1e-7
                                     : prob[i];
    ll -= y[i] ? log(p) : log(1 - p);
    pos += y[i];
  }
  truth->auc = dw_auc(prob, y, n);
  truth->logloss = n ? ll / (double)n : 0;
  truth->ctr = n ? pos / (double)n : 0;
}

int dw_ctrgen_put_truth(const char *dir, json_t *j, char *err, size_t errlen) {
  char path[1100], tmp[1200];
  int rc = 0;
  snprintf(path, sizeof path, "%s/truth.json", dir);
  snprintf(tmp, sizeof tmp, "%s.tmp-%d", path, (int)getpid());
  if (!j || json_dump_file(j, tmp, JSON_INDENT(1)) != 0 ||
      rename(tmp, path) != 0) {
    snprintf(err, errlen, "cannot write %s: %s", path,
             j ? strerror(errno) : "out of memory");
    unlink(tmp);
    rc = CM_EIO;
  }
  json_decref(j);
  return rc;
}

int dw_ctrgen_write(const char *dir, const struct dw_ctrgen_opts *o,
                    struct dw_ctrgen_truth *truth,
                    void (*progress)(const char *file, double done), char *err,
                    size_t errlen) {
  static const char *const gen[2] = {"train.svm", "test.svm"};
  char path[1100];
  float *prob = malloc((o->test + 1) * sizeof *prob);
  uint8_t *y = malloc(o->test + 1);
  uint64_t st = cm_splitmix64_at(o->seed ^ 0x747261696eull);
  int rc = CM_ENOMEM;
  if (!prob || !y || o->fields < 1 || o->fields > 64)
    goto out;
  if ((rc = dw_ctrdata_claim(dir, gen, err, errlen)))
    goto out;
  snprintf(path, sizeof path, "%s/%s", dir, gen[0]);
  if ((rc = write_set(path, o, o->train, &st, NULL, NULL, progress, err,
                      errlen)))
    goto out;
  st = cm_splitmix64_at(o->seed ^ 0x74657374ull);
  snprintf(path, sizeof path, "%s/%s", dir, gen[1]);
  if ((rc = write_set(path, o, o->test, &st, prob, y, progress, err, errlen)))
    goto out;
  dw_ctrgen_score(prob, y, o->test, truth);
  rc = dw_ctrdata_mark(
      dir,
      json_pack("{s:o, s:f, s:f, s:f}", "settings", settings(o), "true_auc",
                truth->auc, "true_logloss", truth->logloss, "ctr", truth->ctr),
      gen, err, errlen);
out:
  if (rc == CM_ENOMEM)
    snprintf(err, errlen, "out of memory (or fields not in 1..64)");
  free(prob);
  free(y);
  return rc;
}

int dw_ctrgen_find(const char *dir, const struct dw_ctrgen_opts *o,
                   struct dw_ctrdata *out, char *err, size_t errlen) {
  static const char *const gen[2] = {"train.svm", "test.svm"};
  return dw_ctrdata_find(dir, 0, settings(o), gen, out, err, errlen);
}
