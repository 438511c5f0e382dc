/* Writing a shard's checkpoint (ckpt.h, ckpt_internal.h): the shard file
 * (safetensors: each variable's rows and its optimizer's slots) and the
 * manifest that describes and checksums it, as a file set (fileset.h: a
 * temporary directory fsynced and renamed into place whole); then the
 * oldest beyond `keep` are pruned. Async, the table of applied pushes is saved
 * in the manifest, taken at the same instant as the values. A variable declared
 * with its own optimizer keeps it whole in the manifest ("own_optimizer"): the
 * spec cannot give it back. */
#include <jansson.h>
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
#include "optjson.h"
#include "safetensors.h"

/* Async: a variable (values and slots) up to this size is copied under its
 * lock and written after, so its lock is held for a memcpy, not for the
 * write into the page cache (which the kernel may throttle for a second);
 * a larger one is written under its lock, so that memory never doubles. */
#define COPY_MAX (64u << 20)
/* Async: a shard whose variables (values and slots) come to at most this
 * much is copied whole while pushes wait at the apply gate, and written
 * after the gate is thawed, so pushes wait for memcpy's, not for the page
 * cache; a larger one is written with the gate frozen (per variable as
 * above), so that memory grows by at most this much. */
#define SNAPSHOT_MAX (256u << 20)

/* Sets e's "own_optimizer" to v's optimizer, whole (optjson.h), for a
 * variable declared with its own: on load the spec would give it another. */
static int set_own_optimizer(json_t *e, const struct psd_var *v) {
  char text[CM_OPTIM_JSON_MAX];
  json_t *o;

  if (cm_optim_to_json(&v->opt, text, sizeof text))
    return CM_ERANGE;
  if (!(o = json_loads(text, 0, NULL)))
    return CM_ENOMEM;
  return json_object_set_new(e, "own_optimizer", o) ? CM_ENOMEM : 0;
}

/* Removes all but the newest `keep` checkpoints, and those their tables'
 * chains need. */
static void prune(struct psd_ckpt *c) {
  uint64_t *steps = malloc(PSD__CKPT_MAX * sizeof *steps);
  char p[1400];
  int n;
  if (!steps)
    return;
  n = psd_ckpt_list(c, steps, PSD__CKPT_MAX);
  for (int i = c->keep; i < n; i++) {
    /* A kept checkpoint's table chain needs it. */
    if (psd__ckpt_tables_needed(c, steps, c->keep < n ? c->keep : n, steps[i]))
      continue;
    psd__ckpt_path(c, steps[i], p, sizeof p);
    psd_fileset_remove_tree(p);
    cm_debug("pruned %s (keeping the newest %d)", p, c->keep);
  }
  if (n > c->keep)
    psd_fileset_sync_dir(c->dir);
  free(steps);
}

/* Bytes of store's first n variables' values and slots (n < 0: all). */
static size_t store_bytes(struct psd_store *store, int n) {
  size_t b = 0;
  if (n < 0)
    n = psd_store_count(store);
  for (int i = 0; i < n; i++) {
    const struct psd_var *v = psd_store_at(store, i);
    if (v)
      b += (size_t)(1 + v->nslots) * (v->elem_end - v->elem_begin) *
           sizeof(float);
  }
  return b;
}

/* Writes the shard file: the header from the variables' shapes, then each
 * variable's values and slots, taken under its lock with lock_vars (copied
 * first when small enough, COPY_MAX). With dedup, all of that is done with
 * its apply gate frozen, and the table is saved into *dedup_json before the
 * gate is thawed: the values and the table are one instant of the shard.
 * The embedding tables' snapshots (*ts) are taken at that instant too.
 * The file's tail and fsync come after. Appends the manifest's per-variable
 * entries to vars_json; sets res->nvars, res->hold_ms (the longest lock
 * hold) and res->freeze_ms. */
static int write_shard(struct psd_ckpt *c, struct psd_store *store,
                       struct psd_dedup *dedup, uint64_t step, int lock_vars,
                       struct psd_fileset *f, json_t *vars_json,
                       json_t **dedup_json, struct psd__tsnaps *ts,
                       uint64_t *bytes, struct psd_ckpt_result *res, char *err,
                       size_t errlen) {
  struct cm_st_desc *desc = NULL;
  int64_t(*shapes)[PSD_VAR_MAX_DIMS] = NULL;
  char(*slot_names)[CM_OPTIM_MAX_SLOTS][PSD_VAR_MAX_NAME + 16] = NULL;
  uint64_t *versions = NULL, *opt_steps = NULL;
  int *asked = NULL; /* each variable's v->asked, read with its values */
  struct cm_st_writer *w = NULL;
  char *copy = NULL;
  size_t copy_cap = 0;
  int n, nt = 0, fd = -1, rc = 0, frozen = 0;
  double frozen_at = 0;
  char stepbuf[32], shardbuf[16], path[1300];

  /* The one-instant copy's buffer, allocated and touched before the gate
   * freezes, for the variables held now (its first touches under the
   * gate held pushes for 17 ms at 12 MiB): more is allocated under it
   * only when a variable declared meanwhile makes it short. */
  size_t pre = dedup ? store_bytes(store, -1) : 0;
  if (pre && pre <= SNAPSHOT_MAX && (copy = malloc(pre + 1))) {
    memset(copy, 0, pre);
    copy_cap = pre;
  }
  /* Counted under the gate: a push applied before it is to a variable
   * declared before it. */
  if (dedup) {
    psd_dedup_freeze(dedup);
    frozen = 1;
    frozen_at = cm_mono_ms();
  }
  n = res->nvars = psd_store_count(store);
  desc = calloc((size_t)(1 + CM_OPTIM_MAX_SLOTS) * n + 1, sizeof *desc);
  shapes = calloc(n + 1, sizeof *shapes);
  slot_names = calloc(n + 1, sizeof *slot_names);
  versions = calloc(n + 1, sizeof *versions);
  opt_steps = calloc(n + 1, sizeof *opt_steps);
  asked = calloc(n + 1, sizeof *asked);
  if (!desc || !shapes || !slot_names || !versions || !opt_steps || !asked) {
    rc = CM_ENOMEM;
    goto out;
  }
  for (int i = 0; i < n; i++) {
    struct psd_var *v = psd_store_at(store, i);
    memcpy(shapes[i], v->shape, sizeof shapes[i]);
    shapes[i][0] = v->row_end - v->row_begin;
    desc[nt++] = (struct cm_st_desc){v->name, v->ndim, shapes[i]};
    for (int k = 0; k < v->nslots; k++) {
      snprintf(slot_names[i][k], sizeof slot_names[i][k], "%s/%s", v->name,
               cm_optim_slot_name(v->opt.type, k));
      desc[nt++] = (struct cm_st_desc){slot_names[i][k], v->ndim, shapes[i]};
    }
  }
  snprintf(stepbuf, sizeof stepbuf, "%llu", (unsigned long long)step);
  snprintf(shardbuf, sizeof shardbuf, "%d", c->shard);
  struct cm_st_meta meta[] = {{"format", PSD__CKPT_FORMAT},
                              {"job", c->job},
                              {"shard", shardbuf},
                              {"step", stepbuf}};
  if ((rc = psd_fileset_create(f, PSD__CKPT_SHARD_FILE, &fd, path, sizeof path,
                               err, errlen)) ||
      (rc = cm_st_writer_new(&w, fd, path, desc, nt, meta, 4, err, errlen)))
    goto out;
  /* With the gate frozen: the whole shard into one buffer when it fits
   * SNAPSHOT_MAX (written once the gate is thawed). */
  size_t total = frozen ? store_bytes(store, n) : 0, at = 0;
  if (frozen && total <= SNAPSHOT_MAX && total > copy_cap) {
    free(copy);
    copy = malloc(total + 1);
    copy_cap = copy ? total : 0;
  }
  int whole = frozen && total <= SNAPSHOT_MAX && copy;
  for (int i = 0; i < n; i++) {
    struct psd_var *v = psd_store_at(store, i);
    size_t len = (v->elem_end - v->elem_begin) * sizeof(float);
    size_t all = (size_t)(1 + v->nslots) * len;
    int copied = whole || (lock_vars && all <= COPY_MAX);
    if (!whole && copied && all > copy_cap) {
      free(copy);
      if (!(copy = malloc(all))) {
        rc = CM_ENOMEM;
        goto out;
      }
      copy_cap = all;
    }
    char *dst = whole ? copy + at : copy;
    if (lock_vars)
      pthread_mutex_lock(&v->lock);
    double t0 = cm_mono_ms();
    if (copied) {
      /* len 0 (no rows of it here): dst may be NULL, no buffer taken yet */
      for (int k = 0; len && k <= v->nslots; k++)
        memcpy(dst + (size_t)k * len, k ? v->slots[k - 1] : v->value, len);
    } else {
      rc = cm_st_writer_write(w, v->value, len, err, errlen);
      for (int k = 0; !rc && k < v->nslots; k++)
        rc = cm_st_writer_write(w, v->slots[k], len, err, errlen);
    }
    versions[i] = v->version;
    opt_steps[i] = psd_var_steps(v);
    asked[i] = v->asked;
    if (lock_vars)
      pthread_mutex_unlock(&v->lock);
    if (lock_vars && cm_mono_ms() - t0 > res->hold_ms)
      res->hold_ms = cm_mono_ms() - t0;
    if (whole)
      at += all;
    else if (copied && all)
      rc = cm_st_writer_write(w, copy, all, err, errlen);
    if (rc)
      goto out;
  }
  /* The live move state, then the tables at the same instant
   * (ckpt_tables.c): a move's rows installed before its state is adopted
   * are in them; a source adopts the state before it drops the rows, and
   * a start drops those its state gives another shard. */
  int move_to = c->move_to ? __atomic_load_n(c->move_to, __ATOMIC_ACQUIRE) : 0;
  int moved = c->moved ? __atomic_load_n(c->moved, __ATOMIC_ACQUIRE) : 0;
  if ((rc = psd__ckpt_tables_take(c, step, ts, err, errlen)))
    goto out;
  ts->move_to = move_to;
  ts->moved = moved;
  if (frozen) {
    rc = psd_dedup_save(dedup, dedup_json);
    psd_dedup_thaw(dedup);
    frozen = 0;
    res->freeze_ms = cm_mono_ms() - frozen_at;
    if (rc)
      goto out;
  }
  if (whole && (rc = cm_st_writer_write(w, copy, total, err, errlen)))
    goto out;
  if ((rc = cm_st_writer_finish(w, err, errlen)))
    goto out;
  *bytes = cm_st_writer_size(w);
  for (int i = 0, t = 0; i < n; i++) {
    struct psd_var *v = psd_store_at(store, i);
    json_t *slots = json_array();
    json_t *e = json_pack(
        "{s:s, s:o, s:i, s:[I, I], s:I, s:{s:s, s:I}, s:s, s:I}", "name",
        v->name, "shape", psd_fileset_json_shape(v->ndim, v->shape),
        "placement", v->placement, "rows", (json_int_t)v->row_begin,
        (json_int_t)v->row_end, "version", (json_int_t)versions[i], "value",
        "tensor", v->name, "crc32", (json_int_t)cm_st_writer_crc(w, t),
        "optimizer", cm_optim_name(v->opt.type), "opt_step",
        (json_int_t)opt_steps[i]);
    t++;
    for (int k = 0; slots && k < v->nslots; k++, t++)
      if (json_array_append_new(
              slots, json_pack("{s:s, s:s, s:I}", "name",
                               cm_optim_slot_name(v->opt.type, k), "tensor",
                               slot_names[i][k], "crc32",
                               (json_int_t)cm_st_writer_crc(w, t)))) {
        json_decref(slots);
        slots = NULL;
      }
    /* The _new calls take their argument's reference, even when they fail. */
    if (!e || !slots) {
      json_decref(e);
      json_decref(slots);
      rc = CM_ENOMEM;
      goto out;
    }
    if (json_object_set_new(e, "slots", slots)) {
      json_decref(e);
      rc = CM_ENOMEM;
      goto out;
    }
    /* How its declaration placed it, for a reshard (cm_layout_replace);
     * left out when not said, as an older psd wrote it. */
    if (asked[i] != CM_LAYOUT_UNSAID &&
        json_object_set_new(e, "asked", json_integer(asked[i]))) {
      json_decref(e);
      rc = CM_ENOMEM;
      goto out;
    }
    if (v->own && (rc = set_own_optimizer(e, v))) {
      json_decref(e);
      goto out;
    }
    if (json_array_append_new(vars_json, e)) {
      rc = CM_ENOMEM;
      goto out;
    }
  }
out:
  if (frozen)
    psd_dedup_thaw(dedup);
  /* fsynced and closed once its manifest entries are made */
  if (fd >= 0)
    rc = psd_fileset_close(f, path, fd, rc, err, errlen);
  cm_st_writer_free(w);
  free(copy);
  free(desc);
  free(shapes);
  free(slot_names);
  free(versions);
  free(opt_steps);
  free(asked);
  return rc;
}

int psd_ckpt_write(struct psd_ckpt *c, struct psd_store *store,
                   struct psd_dedup *dedup, uint64_t step, int lock_vars,
                   struct psd_ckpt_result *res, char *err, size_t errlen) {
  char final[1100], optim[PSD_OPTIM_DESC], when[32];
  json_t *m = NULL, *vars = json_array(), *dedup_json = NULL,
         *tables_json = NULL;
  struct psd__tsnaps ts = {0};
  struct psd_fileset f = {0};
  double t0 = cm_mono_ms();
  uint64_t bytes = 0;
  int rc = 0;

  memset(res, 0, sizeof *res);
  res->clients = -1;
  psd__ckpt_path(c, step, final, sizeof final);
  if (!vars) {
    rc = CM_ENOMEM;
    goto out;
  }
  if ((rc = psd_fileset_begin(&f, final, step, err, errlen)) ||
      (rc = psd__ckpt_tables_prepare(c, step, &ts, err, errlen)) ||
      (rc = write_shard(c, store, dedup, step, lock_vars, &f, vars, &dedup_json,
                        &ts, &bytes, res, err, errlen)) ||
      (rc =
           psd__ckpt_tables_write(c, &ts, &f, step, &tables_json, err, errlen)))
    goto out;
  {
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
  }
  /* The job's optimizer, for people; each variable names its own. */
  cm_optim_describe(&c->optims.def, optim, sizeof optim);
  m = json_pack(
      "{s:s, s:s, s:i, s:i, s:I, s:s, s:{s:s, s:f, s:f, s:s}, s:s, s:s, "
      "s:I, s:o}",
      "format", PSD__CKPT_FORMAT, "job", c->job, "shard", c->shard, "nshards",
      c->nshards, "step", (json_int_t)step, "mode", c->mode, "optimizer",
      "type", cm_optim_name(c->optims.def.type), "lr", c->optims.def.lr,
      "momentum", c->optims.def.momentum, "describe", optim, "written", when,
      "file", PSD__CKPT_SHARD_FILE, "file_bytes", (json_int_t)bytes, "vars",
      vars);
  vars = NULL; /* m owns it, or json_pack freed it */
  if (m && c->layout &&
      json_object_set_new(m, "layout", json_integer((json_int_t)c->layout))) {
    json_decref(m);
    m = NULL;
  }
  /* How the layout places rows; a manifest without it is modulo's. */
  if (m && json_object_set_new(m, "rows",
                               json_string(cm_layout_rule_name(c->rows)))) {
    json_decref(m);
    m = NULL;
  }
  if (m && dedup_json) {
    res->clients = (int)json_array_size(dedup_json);
    rc = json_object_set_new(m, "dedup", dedup_json) ? CM_ENOMEM : 0;
    dedup_json = NULL; /* m owns it, or set_new freed it */
  }
  if (m && !rc && tables_json && json_array_size(tables_json)) {
    rc = json_object_set_new(m, "tables", tables_json) ? CM_ENOMEM : 0;
    tables_json = NULL; /* m owns it, or set_new freed it */
  }
  if (m && !rc && ts.move_to &&
      json_object_set_new(
          m, "move",
          json_pack("{s:i, s:i}", "to", ts.move_to, "moved", ts.moved)))
    rc = CM_ENOMEM;
  if (!m || rc) {
    rc = rc ? rc : CM_ENOMEM;
    goto out;
  }
  /* Same step again (e.g. SIGTERM right after a periodic one): the new one
   * is swapped in atomically (replace), then the old one dropped. */
  if ((rc = psd_fileset_write_manifest(&f, PSD__CKPT_MANIFEST, m,
                                       PSD__CKPT_CHECKSUM, err, errlen)) ||
      (rc = psd_fileset_commit(&f, 1, err, errlen)))
    goto out;
  res->step = step;
  snprintf(res->path, sizeof res->path, "%s", final);
  res->bytes = f.bytes;
  res->ms = cm_mono_ms() - t0;
  prune(c);
  psd__ckpt_move_prune(c, ts.moved);
out:
  psd__ckpt_tables_done(c, &ts, step, rc == 0);
  psd_fileset_end(&f);
  json_decref(m);
  json_decref(vars);
  json_decref(dedup_json);
  json_decref(tables_json);
  return rc;
}
