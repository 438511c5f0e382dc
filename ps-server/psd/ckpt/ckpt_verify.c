/* Reading one checkpoint back and verifying it (ckpt_internal.h): the
 * manifest's checksum, format, job, shard and step; the shard file's size;
 * each variable's shape, rows and optimizer against this shard and the
 * spec (or the variable's own optimizer, which the manifest keeps whole);
 * every tensor's CRC-32; and the table of applied pushes. What fails is
 * said in err, naming the file and what is wrong; ckpt_load.c decides what
 * to do about it. */
#include <errno.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt_internal.h"
#include "dedup.h"
#include "err.h"
#include "fileset.h"
#include "layout.h"
#include "log.h"
#include "optjson.h"
#include "safetensors.h"

/* Reads a JSON integer member into *x; returns 0 or -1. */
static int get_int(json_t *o, const char *key, json_int_t *x) {
  json_t *v = json_object_get(o, key);
  if (!json_is_integer(v))
    return -1;
  *x = json_integer_value(v);
  return 0;
}

/* Reads tensor `name` of f (f32, shape [rows, shape[1:]]) into dst and
 * checks its CRC against want. */
static int load_tensor(struct cm_st_file *f, const char *file, json_t *ref,
                       const struct psd_var *v, float *dst, char *err,
                       size_t errlen) {
  json_t *tn = json_object_get(ref, "tensor");
  json_int_t want;
  const struct cm_st_tensor *t;
  uint64_t len = (v->elem_end - v->elem_begin) * sizeof(float);
  uint32_t crc;
  int rc, same;

  if (!json_is_string(tn) || get_int(ref, "crc32", &want)) {
    snprintf(err, errlen, "variable '%s': tensor entry without tensor/crc32",
             v->name);
    return CM_EFORMAT;
  }
  if (!(t = cm_st_find(f, json_string_value(tn)))) {
    snprintf(err, errlen, "%s: no tensor '%s'", file, json_string_value(tn));
    return CM_EFORMAT;
  }
  same = !strcmp(t->dtype, "F32") && t->ndim == v->ndim &&
         t->shape[0] == v->row_end - v->row_begin;
  for (int d = 1; same && d < v->ndim; d++)
    same = t->shape[d] == v->shape[d];
  if (!same || t->end - t->begin != len) {
    snprintf(err, errlen,
             "%s: tensor '%s' is not f32 with shape [%lld, ...] as the "
             "manifest says",
             file, t->name, (long long)(v->row_end - v->row_begin));
    return CM_EFORMAT;
  }
  if ((rc = cm_st_read(f, t, 0, dst, len, err, errlen)))
    return rc;
  crc = cm_st_crc32(0, dst, len);
  if (crc != (uint32_t)want) {
    snprintf(err, errlen,
             "%s: tensor '%s' fails its checksum (CRC-32 %08x, the manifest "
             "says %08x): the file is corrupt",
             file, t->name, crc, (uint32_t)want);
    return CM_EFORMAT;
  }
  return 0;
}

/* Reads and checks a manifest: parse, checksum, format, job, shard. */
static int load_manifest(struct psd_ckpt *c, const char *path, uint64_t step,
                         json_t **out, char *err, size_t errlen) {
  json_error_t jerr;
  json_t *m = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr), *sum;
  json_int_t want, x;
  uint32_t crc;
  int rc = CM_EFORMAT;
  const char *s;

  *out = NULL;
  if (!m && access(path, F_OK) != 0) {
    snprintf(err, errlen, "%s: %s", path, strerror(errno));
    return CM_ENOENT;
  }
  if (!m) {
    snprintf(err, errlen, "%s: not valid JSON: %s (line %d)", path, jerr.text,
             jerr.line);
    return CM_EFORMAT;
  }
  sum = json_object_get(m, PSD__CKPT_CHECKSUM);
  if (!json_is_integer(sum)) {
    snprintf(err, errlen, "%s: no checksum", path);
    goto out;
  }
  want = json_integer_value(sum);
  json_object_del(m, PSD__CKPT_CHECKSUM);
  if ((rc = psd_fileset_manifest_crc(m, PSD__CKPT_CHECKSUM, &crc)))
    goto out;
  rc = CM_EFORMAT;
  if (crc != (uint32_t)want) {
    snprintf(err, errlen,
             "%s fails its checksum (CRC-32 %08x, it says %08x): the file is "
             "corrupt",
             path, crc, (uint32_t)want);
    goto out;
  }
  s = json_string_value(json_object_get(m, "format"));
  if (!s || (strcmp(s, PSD__CKPT_FORMAT) != 0 &&
             strcmp(s, PSD__CKPT_FORMAT_1) != 0)) {
    snprintf(err, errlen,
             "%s: format is not \"" PSD__CKPT_FORMAT
             "\" (nor \"" PSD__CKPT_FORMAT_1 "\")",
             path);
    goto out;
  }
  s = json_string_value(json_object_get(m, "job"));
  if (!s || strcmp(s, c->job) != 0) {
    snprintf(err, errlen, "%s: written by job '%s'; this is job '%s'", path,
             s ? s : "?", c->job);
    goto out;
  }
  if (get_int(m, "shard", &x) || x != c->shard || get_int(m, "nshards", &x) ||
      x != c->nshards) {
    get_int(m, "nshards", &x);
    snprintf(err, errlen,
             "%s: written by another shard or shard count (this is shard %d "
             "of %d; it says shard %lld of %lld)",
             path, c->shard, c->nshards,
             (long long)json_integer_value(json_object_get(m, "shard")),
             (long long)json_integer_value(json_object_get(m, "nshards")));
    goto out;
  }
  if (get_int(m, "step", &x) || (uint64_t)x != step) {
    snprintf(err, errlen, "%s: its step does not match its directory's (%llu)",
             path, (unsigned long long)step);
    goto out;
  }
  if (!json_is_array(json_object_get(m, "vars"))) {
    snprintf(err, errlen, "%s: no \"vars\" array", path);
    goto out;
  }
  rc = 0;
  *out = m;
  m = NULL;
out:
  json_decref(m);
  return rc;
}

/* Refuses variable v of a checkpoint when it was trained with an
 * optimizer of another type than the spec gives it (its slots would mean
 * something else): CM_EEXIST, err saying what to do. otype is the type the
 * checkpoint names for v. */
static int check_optimizer(struct psd_ckpt *c, const struct psd_var *v,
                           const char *otype, char *err, size_t errlen) {
  char where[CM_OPTIM_PATTERN_MAX + 48];

  if (!strcmp(otype, cm_optim_name(v->opt.type)))
    return 0;
  if (v->own)
    snprintf(where, sizeof where, "its own, in the manifest");
  else if (v->rule >= 0)
    snprintf(where, sizeof where, "job.optimizer_overrides[\"%s\"]",
             c->optims.rules[v->rule].pattern);
  else
    snprintf(where, sizeof where, "job.optimizer");
  snprintf(err, errlen,
           "'%s' was trained with optimizer %s, and the spec gives it %s "
           "(%s): the checkpoint's slots and steps belong to %s. Put %s "
           "back in the spec to resume, or move %s away to start from "
           "scratch",
           v->name, otype, cm_optim_name(v->opt.type), where, otype, otype,
           c->dir);
  return CM_EEXIST;
}

/* Reads manifest entry e's "own_optimizer" (a variable declared with its
 * own) into *opt and sets *own to it; *own stays NULL without one (the
 * spec's). Returns 0, or CM_EFORMAT with err saying what is wrong. */
static int get_own_optimizer(json_t *e, const char *path, size_t i,
                             struct cm_optim *opt, const struct cm_optim **own,
                             char *err, size_t errlen) {
  json_t *o = json_object_get(e, "own_optimizer");
  char why[512];
  char *text;
  int rc;

  *own = NULL;
  if (!o)
    return 0;
  if (!(text = json_dumps(o, JSON_COMPACT)))
    return CM_ENOMEM;
  rc = cm_optim_from_json(text, strlen(text), opt, why, sizeof why);
  free(text);
  if (rc == CM_ENOMEM)
    return rc;
  if (rc) {
    snprintf(err, errlen, "%s: vars[%zu].own_optimizer: %s", path, i, why);
    return CM_EFORMAT;
  }
  *own = opt;
  return 0;
}

/* Loads v's slots from manifest entry e: format 2's "slots" by name, or
 * format 1's "slot" (momentum). A slot the checkpoint lacks starts at zero,
 * said once per checkpoint (*warned). */
static int load_slots(struct cm_st_file *f, const char *file, const char *dir,
                      json_t *e, struct psd_var *v, int *warned, char *err,
                      size_t errlen) {
  json_t *list = json_object_get(e, "slots"), *x;
  int rc;

  for (int k = 0; k < v->nslots; k++) {
    const char *want = cm_optim_slot_name(v->opt.type, k);
    json_t *ref = NULL;
    size_t i;
    json_array_foreach(list, i, x) {
      const char *nm = json_string_value(json_object_get(x, "name"));
      if (nm && !strcmp(nm, want))
        ref = x;
    }
    if (!list && k == 0)
      ref = json_object_get(e, "slot");
    if (ref) {
      if ((rc = load_tensor(f, file, ref, v, v->slots[k], err, errlen)))
        return rc;
    } else if (!*warned) {
      cm_warn("%s has no '%s' slot for '%s' (and maybe others): such slots "
              "start at zero",
              dir, want, v->name);
      *warned = 1;
    }
  }
  return 0;
}

/* The table of applied pushes saved in manifest m (path), into a new table
 * (*out); an empty one when m has none (*clients -1). */
static int load_dedup(json_t *m, const char *path, struct psd_dedup **out,
                      int *clients, char *err, size_t errlen) {
  json_t *snap = json_object_get(m, "dedup");
  struct psd_dedup *d = NULL;
  char derr[512];
  int rc;

  *out = NULL;
  *clients = snap ? (int)json_array_size(snap) : -1;
  if ((rc = psd_dedup_new(&d, PSD_DEDUP_CLIENTS))) {
    snprintf(err, errlen, "%s: %s", path, cm_strerror(rc));
    goto out;
  }
  if (snap && (rc = psd_dedup_load(d, snap, derr, sizeof derr))) {
    snprintf(err, errlen, "%s: %s", path, derr);
    goto out;
  }
  *out = d;
  d = NULL;
out:
  psd_dedup_free(d);
  return rc;
}

int psd__ckpt_load_one(struct psd_ckpt *c, const char *dir, uint64_t step,
                       struct psd_store **out, struct psd_dedup **dedup,
                       int *clients, int *nvars, uint64_t *bytes, char *err,
                       size_t errlen) {
  char path[1200], file[1200], shape_s[128];
  json_t *m = NULL, *e;
  struct cm_st_file *f = NULL;
  struct psd_store *store = NULL;
  struct psd_dedup *d = NULL;
  json_int_t fbytes = -1;
  size_t i;
  int rc, warned = 0;
  const char *mode, *otype, *odesc;
  char optim[PSD_OPTIM_DESC];

  *out = NULL;
  *dedup = NULL;
  snprintf(path, sizeof path, "%s/" PSD__CKPT_MANIFEST, dir);
  if ((rc = load_manifest(c, path, step, &m, err, errlen)))
    goto out;
  snprintf(file, sizeof file, "%s/" PSD__CKPT_SHARD_FILE, dir);
  if ((rc = cm_st_open(&f, file, err, errlen)))
    goto out;
  if (get_int(m, "file_bytes", &fbytes) || (uint64_t)fbytes != cm_st_size(f)) {
    snprintf(err, errlen, "%s: %llu bytes; the manifest says %lld", file,
             (unsigned long long)cm_st_size(f), (long long)fbytes);
    rc = CM_ETRUNC;
    goto out;
  }
  mode = json_string_value(json_object_get(m, "mode"));
  if (mode && strcmp(mode, c->mode) != 0)
    cm_warn("%s was written by a %s job; this job is %s (its step counts %s)",
            dir, mode, c->mode,
            !strcmp(c->mode, "sync") ? "commits" : "pushes applied");
  /* Format 1 names one optimizer for the job; format 2 one per variable
   * (and the job's, described, for people). */
  otype = json_string_value(
      json_object_get(json_object_get(m, "optimizer"), "type"));
  odesc = json_string_value(
      json_object_get(json_object_get(m, "optimizer"), "describe"));
  cm_optim_describe(&c->optims.def, optim, sizeof optim);
  if (odesc && strcmp(odesc, optim) != 0)
    cm_info("%s was written with job.optimizer %s; the spec now says %s", dir,
            odesc, optim);
  if ((rc = psd_store_new(&store, c->shard, c->nshards, &c->optims)))
    goto out;
  json_array_foreach(json_object_get(m, "vars"), i, e) {
    json_t *name = json_object_get(e, "name"),
           *shape = json_object_get(e, "shape");
    json_t *rows = json_object_get(e, "rows"), *x;
    int64_t dims[PSD_VAR_MAX_DIMS];
    json_int_t placement, version;
    struct cm_optim own_opt;
    const struct cm_optim *own;
    struct psd_var *v;
    size_t d;
    int created = 0;
    char derr[512];

    rc = CM_EFORMAT;
    if (!json_is_string(name) || !json_is_array(shape) ||
        json_array_size(shape) < 1 ||
        json_array_size(shape) > PSD_VAR_MAX_DIMS ||
        get_int(e, "placement", &placement) ||
        get_int(e, "version", &version) || !json_is_array(rows) ||
        json_array_size(rows) != 2) {
      snprintf(err, errlen, "%s: vars[%zu] is incomplete", path, i);
      goto out;
    }
    json_array_foreach(shape, d, x) dims[d] = json_integer_value(x);
    if ((rc = get_own_optimizer(e, path, i, &own_opt, &own, err, errlen)))
      goto out;
    rc = psd_store_declare(store, json_string_value(name),
                           (int)json_array_size(shape), dims, (int)placement,
                           PSD_INIT_ZEROS, 0, 0, own, &v, &created, derr,
                           sizeof derr);
    if (rc || !created) {
      snprintf(err, errlen, "%s: vars[%zu]: %s", path, i,
               rc ? derr : "a duplicate name");
      rc = rc == CM_ENOMEM ? rc : CM_EFORMAT;
      goto out;
    }
    rc = CM_EFORMAT;
    /* How the declaration placed it; a manifest of an older psd says
     * nothing, and a reshard then goes by placement alone. */
    if ((x = json_object_get(e, "asked"))) {
      json_int_t a = json_integer_value(x);
      if (!json_is_integer(x) || a < CM_LAYOUT_NAME || a > INT32_MAX) {
        snprintf(err, errlen,
                 "%s: vars[%zu] ('%s'): \"asked\" must be an integer >= -3 "
                 "(-1 split, -2 auto, -3 by name, or a shard index)",
                 path, i, v->name);
        goto out;
      }
      psd_store_set_asked(v, (int)a, 0);
    }
    if (json_integer_value(json_array_get(rows, 0)) != v->row_begin ||
        json_integer_value(json_array_get(rows, 1)) != v->row_end) {
      psd_shape_format(v->ndim, v->shape, shape_s, sizeof shape_s);
      snprintf(err, errlen,
               "%s: '%s' %s holds rows [%lld, %lld); this shard would hold "
               "[%lld, %lld)",
               path, v->name, shape_s,
               (long long)json_integer_value(json_array_get(rows, 0)),
               (long long)json_integer_value(json_array_get(rows, 1)),
               (long long)v->row_begin, (long long)v->row_end);
      goto out;
    }
    {
      const char *vt = json_string_value(json_object_get(e, "optimizer"));
      if (!vt && !(vt = otype)) {
        snprintf(err, errlen, "%s: vars[%zu] names no optimizer", path, i);
        goto out;
      }
      if ((rc = check_optimizer(c, v, vt, err, errlen)))
        goto out;
    }
    if ((rc = load_tensor(f, file, json_object_get(e, "value"), v, v->value,
                          err, errlen)) ||
        (rc = load_slots(f, file, dir, e, v, &warned, err, errlen)))
      goto out;
    v->version = (uint64_t)version;
    /* Format 1 kept no step count: the version is the closest (sync: the
     * same; async: pushes, at least the steps). */
    {
      json_int_t steps;
      if (get_int(e, "opt_step", &steps) || steps < 0)
        steps = version;
      v->applied = (uint64_t)steps * (v->elem_end - v->elem_begin);
    }
  }
  if ((rc = load_dedup(m, path, &d, clients, err, errlen)))
    goto out;
  *nvars = psd_store_count(store);
  *bytes = cm_st_size(f);
  *out = store;
  store = NULL;
  *dedup = d;
  d = NULL;
out:
  psd_dedup_free(d);
  psd_store_free(store);
  cm_st_close(f);
  json_decref(m);
  return rc;
}
