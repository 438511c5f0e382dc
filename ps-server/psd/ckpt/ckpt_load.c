/* Loading a shard's checkpoint (ckpt.h, ckpt_internal.h): at the start,
 * the newest that verifies (ckpt_verify.c), falling back past damaged ones
 * loudly, at or below --resume-step; in a sync rollback, the one of exactly
 * the step rolled back to, restored into the live store in place. Newer
 * checkpoints than the one taken are set aside, never loaded later. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ckpt_internal.h"
#include "clock.h"
#include "dedup.h"
#include "err.h"
#include "fileset.h"
#include "layout.h"
#include "log.h"

/* Restores the tables of the checkpoint in dir (of step) from its
 * manifest, verified already by psd__ckpt_load_one, and reads its live
 * move state into res. */
static int load_tables(struct psd_ckpt *c, const char *dir, uint64_t step,
                       struct psd_ckpt_result *res, char *err, size_t errlen) {
  char path[1200];
  json_error_t jerr;
  snprintf(path, sizeof path, "%s/" PSD__CKPT_MANIFEST, dir);
  json_t *m = json_load_file(path, 0, &jerr);
  if (!m) {
    snprintf(err, errlen, "%s: %s", path, jerr.text);
    return CM_EFORMAT;
  }
  json_t *mv = json_object_get(m, "move");
  json_t *to = json_object_get(mv, "to"), *k = json_object_get(mv, "moved");
  int rc = 0;
  res->move_to = res->moved = 0;
  if (mv && (!json_is_integer(to) || !json_is_integer(k) ||
             json_integer_value(to) < 1 ||
             json_integer_value(to) > CM_LAYOUT_MAX_SHARDS ||
             json_integer_value(k) < 0 ||
             json_integer_value(k) > CM_LAYOUT_BUCKETS)) {
    snprintf(err, errlen,
             "%s: \"move\" is not {\"to\": 1..%d shards, \"moved\": 0..%d "
             "moves}",
             path, CM_LAYOUT_MAX_SHARDS, CM_LAYOUT_BUCKETS);
    rc = CM_EFORMAT;
  } else if (mv) {
    res->move_to = (int)json_integer_value(to);
    res->moved = (int)json_integer_value(k);
  }
  if (!rc && c->tables)
    rc = psd__ckpt_tables_load(c, m, step, err, errlen);
  json_decref(m);
  return rc;
}

/* Renames the checkpoints of steps[0..upto) above max (when has_max) to
 * superseded-ckpt-<step>-<time>, saying why. */
static void set_aside_above(struct psd_ckpt *c, const uint64_t *steps, int upto,
                            int has_max, uint64_t max, const char *why) {
  char from[1100], to[1200];
  for (int i = 0; i < upto; i++) {
    if (!has_max || steps[i] <= max)
      continue;
    psd__ckpt_path(c, steps[i], from, sizeof from);
    snprintf(to, sizeof to, "%s/superseded-ckpt-%010llu-%ld", c->dir,
             (unsigned long long)steps[i], (long)time(NULL));
    if (rename(from, to) == 0)
      cm_warn("set %s aside as %s: newer than %s %llu", from, to, why,
              (unsigned long long)max);
    else
      cm_error("cannot set %s aside: %s", from, strerror(errno));
  }
  psd_fileset_sync_dir(c->dir);
}

/* Renames the checkpoints newer than the one loaded (steps[0..upto), newest
 * first, those above --resume-step) out of the ckpt-* namespace. */
static void set_aside(struct psd_ckpt *c, const uint64_t *steps, int upto) {
  if (c->read_only)
    return;
  set_aside_above(c, steps, upto, c->has_max, c->max, "--resume-step");
}

int psd_ckpt_load(struct psd_ckpt *c, struct psd_store **out,
                  struct psd_dedup **dedup, struct psd_ckpt_result *res,
                  char *err, size_t errlen) {
  uint64_t *steps = malloc(PSD__CKPT_MAX * sizeof *steps);
  char dir[1100], why[4096];
  double t0 = cm_mono_ms();
  int n, rc = 0;

  *out = NULL;
  if (dedup)
    *dedup = NULL;
  memset(res, 0, sizeof *res);
  res->clients = -1;
  if (!steps)
    return CM_ENOMEM;
  n = psd_ckpt_list(c, steps, PSD__CKPT_MAX);
  for (int i = 0; i < n; i++) {
    struct psd_store *s = NULL;
    struct psd_dedup *d = NULL;
    uint64_t bytes = 0;
    int nvars = 0, clients = -1;
    if (c->has_max && steps[i] > c->max)
      continue;
    psd__ckpt_path(c, steps[i], dir, sizeof dir);
    rc = psd__ckpt_load_one(c, dir, steps[i], &s, &d, &clients, &nvars, &bytes,
                            why, sizeof why);
    if (!rc && (rc = load_tables(c, dir, steps[i], res, why, sizeof why)) &&
        rc != CM_ENOMEM) {
      psd_store_free(s);
      psd_dedup_free(d);
      s = NULL;
      d = NULL;
      rc = CM_EFORMAT; /* damage: the previous one is tried */
    }
    if (rc == CM_ENOMEM) {
      psd_store_free(s);
      psd_dedup_free(d);
      break;
    }
    if (rc == CM_EEXIST) {
      /* Not damage: an older checkpoint of this run has the same
       * optimizer, and one of an earlier run would silently lose steps. */
      cm_error("REFUSED checkpoint %s: %s", dir, why);
      snprintf(err, errlen,
               "the newest checkpoint's optimizer is not the spec's (see "
               "above); older checkpoints are not tried");
      res->refused++;
      goto out;
    }
    if (rc) {
      cm_error("REFUSED checkpoint %s: %s; %s", dir, why,
               i + 1 < n ? "trying the previous one"
                         : "no older checkpoint is left");
      res->refused++;
      continue;
    }
    *out = s;
    if (dedup)
      *dedup = d;
    else
      psd_dedup_free(d);
    set_aside(c, steps, i);
    res->step = steps[i];
    snprintf(res->path, sizeof res->path, "%s", dir);
    res->bytes = bytes;
    res->nvars = nvars;
    res->clients = clients;
    res->ms = cm_mono_ms() - t0;
    goto out;
  }
  if (rc == CM_ENOMEM) {
    snprintf(err, errlen, "out of memory loading %s", dir);
  } else if (c->has_max && res->refused == 0) {
    snprintf(err, errlen, "no checkpoint at or below --resume-step %llu in %s",
             (unsigned long long)c->max, c->dir);
    rc = CM_ENOENT;
  } else if (n > 0) {
    snprintf(err, errlen,
             "none of the %d checkpoints in %s verifies (see the errors "
             "above); move them away to start from scratch",
             res->refused, c->dir);
    rc = CM_EFORMAT;
  }
out:
  free(steps);
  return rc;
}

int psd_ckpt_restore(struct psd_ckpt *c, uint64_t step, struct psd_store *store,
                     struct psd_ckpt_result *res, char *err, size_t errlen) {
  uint64_t *steps = malloc(PSD__CKPT_MAX * sizeof *steps);
  struct psd_store *from = NULL;
  struct psd_dedup *d = NULL;
  char dir[1100], why[4096];
  double t0 = cm_mono_ms();
  int n, nvars = 0, clients = -1, have = 0, rc = 0;
  uint64_t bytes = 0;

  memset(res, 0, sizeof *res);
  res->clients = -1;
  if (!steps) {
    rc = CM_ENOMEM;
    goto out;
  }
  n = psd_ckpt_list(c, steps, PSD__CKPT_MAX);
  for (int i = 0; i < n; i++)
    have |= steps[i] == step;
  psd__ckpt_path(c, step, dir, sizeof dir);
  if (!have) {
    snprintf(err, errlen, "no checkpoint of step %llu in %s",
             (unsigned long long)step, c->dir);
    rc = CM_ENOENT;
    goto out;
  }
  if ((rc = psd__ckpt_load_one(c, dir, step, &from, &d, &clients, &nvars,
                               &bytes, why, sizeof why))) {
    snprintf(err, errlen, "checkpoint %s: %s", dir, why);
    goto out;
  }
  /* Every variable the store holds must be in it with the same rows (the
   * same job, declared the same way), before anything is changed. */
  if (psd_store_count(store) != psd_store_count(from)) {
    snprintf(err, errlen, "checkpoint %s holds %d variables; this shard has %d",
             dir, psd_store_count(from), psd_store_count(store));
    rc = CM_EFORMAT;
    goto out;
  }
  for (int i = 0; i < psd_store_count(store); i++) {
    const struct psd_var *v = psd_store_at(store, i);
    const struct psd_var *f = psd_store_find(from, v->name);
    if (!f || f->elem_begin != v->elem_begin || f->elem_end != v->elem_end ||
        f->nslots != v->nslots || f->opt.type != v->opt.type) {
      snprintf(err, errlen,
               "checkpoint %s: '%s' is %s; this shard holds it otherwise", dir,
               v->name,
               f ? "held with other rows, slots or optimizer" : "missing");
      rc = CM_EFORMAT;
      goto out;
    }
  }
  /* The tables first: they verify every file before changing anything. */
  if ((rc = load_tables(c, dir, step, res, why, sizeof why))) {
    snprintf(err, errlen, "checkpoint %s: %s", dir, why);
    goto out;
  }
  for (int i = 0; i < psd_store_count(store); i++) {
    struct psd_var *v = psd_store_at(store, i);
    const struct psd_var *f = psd_store_find(from, v->name);
    size_t len = (size_t)(v->elem_end - v->elem_begin) * sizeof(float);
    pthread_mutex_lock(&v->lock);
    memcpy(v->value, f->value, len);
    for (int k = 0; k < v->nslots; k++)
      memcpy(v->slots[k], f->slots[k], len);
    v->version = f->version;
    v->applied = f->applied;
    pthread_mutex_unlock(&v->lock);
  }
  /* The newer ones hold steps that are to be redone. */
  set_aside_above(c, steps, n, 1, step, "the rollback to step");
  res->step = step;
  snprintf(res->path, sizeof res->path, "%s", dir);
  res->bytes = bytes;
  res->nvars = nvars;
  res->ms = cm_mono_ms() - t0;
out:
  psd_dedup_free(d);
  psd_store_free(from);
  free(steps);
  return rc;
}
