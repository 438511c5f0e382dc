/* psd-ctrgen --drift (ctrgen.h): a stream of parts whose true model
 * changes from part to part, for training on a stream (docs/ctr.md). Every
 * part is drawn, written or not, so truth.json always holds every part's
 * true scores and the same settings give the same bytes whatever range is
 * written. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "ctrdata.h"
#include "ctrgen.h"
#include "err.h"
#include "rand.h"

#define K 4          /* the true interaction vectors' width */
#define HOT_RANKS 30 /* ranks past this carry a twentieth of the signal */
#define SW 0.5       /* the weights' scale */
#define SV 0.25      /* the interaction vectors' scale */
#define BIAS (-1.0)  /* the true model's bias */

/* Part p's true parameters of field f's item at rank r: w and v[K]. */
static void params(const struct dw_ctrgen_drift_opts *o, uint64_t p, int f,
                   uint64_t r, uint64_t item, double *w, double *v) {
  uint64_t key = cm_mix64(cm_splitmix64_at(o->seed ^ 0x6472696674ull) ^
                          ((uint64_t)f << 56) ^ item);
  double scale = r <= HOT_RANKS ? 1.0 : 0.05;
  double c = cos((double)p * o->turn), s = sin((double)p * o->turn);
  *w = SW * scale *
       (c * dw_ctrgen_normal(cm_splitmix64_at(key)) +
        s * dw_ctrgen_normal(cm_splitmix64_at(key ^ 0x5a5a5a5aull)));
  for (int k = 0; k < K; k++) {
    uint64_t kk = key + 1 + (uint64_t)k;
    v[k] = SV * scale *
           (c * dw_ctrgen_normal(cm_splitmix64_at(kk)) +
            s * dw_ctrgen_normal(cm_splitmix64_at(kk ^ 0x5a5a5a5aull)));
  }
}

/* Part p's item at rank r: p * shift + 1 - r, mod 10^9. */
static uint64_t item_of(const struct dw_ctrgen_drift_opts *o, uint64_t p,
                        uint64_t r) {
  uint64_t top = (p * o->shift) % DW_CTR_SPAN;
  return (top + DW_CTR_SPAN + 1 - r % DW_CTR_SPAN) % DW_CTR_SPAN;
}

/* Draws part p: its lines to f (NULL: drawn, not written), its true
 * probabilities and labels to prob and y. */
static void draw_part(const struct dw_ctrgen_drift_opts *o, uint64_t p, FILE *f,
                      float *prob, uint8_t *y) {
  uint64_t st =
      cm_splitmix64_at(o->seed ^ 0x64726966745f70ull ^ cm_mix64(p + 1));
  double w[64], v[64][K];
  for (uint64_t i = 0; i < o->per_part; i++) {
    uint64_t item[64];
    double logit = BIAS;
    for (int k = 0; k < o->fields; k++) {
      uint64_t r = dw_ctrgen_rank(&st, o->zipf);
      item[k] = item_of(o, p, r);
      params(o, p, k, r, item[k], &w[k], v[k]);
      logit += w[k];
    }
    for (int a = 0; a < o->fields; a++)
      for (int b = a + 1; b < o->fields; b++)
        for (int k = 0; k < K; k++)
          logit += v[a][k] * v[b][k];
    double pr = 1.0 / (1.0 + exp(-logit));
    double u = (double)(cm_splitmix64(&st) >> 11) * (1.0 / 9007199254740992.0);
    int label = u < pr;
    prob[i] = (float)pr;
    y[i] = (uint8_t)label;
    if (!f)
      continue;
    fprintf(f, "%d", label);
    for (int k = 0; k < o->fields; k++)
      fprintf(f, " %llu:1",
              (unsigned long long)((uint64_t)k * DW_CTR_SPAN +
                                   item[k] * 2654435761ull % DW_CTR_SPAN));
    fputc('\n', f);
  }
}

/* Writes part p as name in dir through a hidden temporary name. */
static int write_part(const char *dir, const char *name,
                      const struct dw_ctrgen_drift_opts *o, uint64_t p,
                      float *prob, uint8_t *y, char *err, size_t errlen) {
  char path[1400], tmp[1500];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  snprintf(tmp, sizeof tmp, "%s/.%s.tmp-%d", dir, name, (int)getpid());
  FILE *f = fopen(tmp, "w");
  if (!f) {
    snprintf(err, errlen, "cannot create %s: %s", tmp, strerror(errno));
    return CM_EIO;
  }
  draw_part(o, p, f, prob, y);
  return dw_ctrgen_commit(f, tmp, path, err, errlen);
}

/* truth.json's settings object. */
static json_t *settings(const struct dw_ctrgen_drift_opts *o) {
  return json_pack("{s:i, s:I, s:I, s:I, s:f, s:I, s:f, s:i}", "fields",
                   o->fields, "parts", (json_int_t)o->parts, "per_part",
                   (json_int_t)o->per_part, "seed", (json_int_t)o->seed, "zipf",
                   o->zipf, "shift", (json_int_t)o->shift, "turn", o->turn,
                   "drift", 1);
}

int dw_ctrgen_drift_write(const char *dir, const struct dw_ctrgen_drift_opts *o,
                          void (*said)(const char *part), char *err,
                          size_t errlen) {
  float *prob = malloc((o->per_part + 1) * sizeof *prob);
  uint8_t *y = malloc(o->per_part + 1);
  json_t *parts = json_array(), *j = NULL;
  int rc = CM_ENOMEM, written = 0;
  char name[64], path[1400];

  if (!prob || !y || !parts || o->fields < 1 || o->fields > 64) {
    snprintf(err, errlen, "out of memory (or fields not in 1..64)");
    goto out;
  }
  for (uint64_t p = 0; p < o->parts; p++) {
    struct dw_ctrgen_truth t;
    snprintf(name, sizeof name, "part-%05llu.svm", (unsigned long long)p);
    if (p >= o->from && p < o->to) {
      if (written++ && o->delay_s > 0)
        cm_sleep_ms((long)(o->delay_s * 1000));
      if ((rc = write_part(dir, name, o, p, prob, y, err, errlen)))
        goto out;
      if (said)
        said(name);
    } else {
      draw_part(o, p, NULL, prob, y);
    }
    dw_ctrgen_score(prob, y, o->per_part, &t);
    if (json_array_append_new(
            parts, json_pack("{s:s, s:I, s:f, s:f, s:f}", "name", name,
                             "examples", (json_int_t)o->per_part, "true_auc",
                             t.auc, "true_logloss", t.logloss, "ctr", t.ctr))) {
      rc = CM_ENOMEM;
      snprintf(err, errlen, "out of memory");
      goto out;
    }
  }
  /* Marked as psd's (ctrdata.h), so that a later run writes there again. */
  j = json_pack("{s:s, s:o, s:O}", "generator", DW_CTRDATA_STAMP, "settings",
                settings(o), "parts", parts);
  if ((rc = dw_ctrgen_put_truth(dir, j, err, errlen)))
    goto out;
  if (o->end) {
    snprintf(path, sizeof path, "%s/%s", dir, o->end);
    FILE *f = fopen(path, "w");
    if (!f || fclose(f) != 0) {
      snprintf(err, errlen, "cannot create %s: %s", path, strerror(errno));
      rc = CM_EIO;
    }
  }
out:
  json_decref(parts);
  free(prob);
  free(y);
  return rc;
}
