/* A shard's checkpoints on disk (ckpt.h): writing one atomically, loading
 * the newest that verifies, pruning, and cleaning what a crash left. */
#include "ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "dedup.h"
#include "err.h"
#include "log.h"
#include "safetensors.h"

/* Format 2 names each variable's optimizer and keeps any number of slots;
 * format 1 (momentum or sgd for the whole job, one "slot") still loads. */
#define FORMAT "psd-checkpoint-2"
#define FORMAT_1 "psd-checkpoint-1"
#define SHARD_FILE "shard.safetensors"
#define MANIFEST "manifest.json"
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
/* Checkpoint directories looked at when loading or pruning. */
#define MAX_CKPTS 4096

struct psd_ckpt {
  char dir[1024];             /* <root>/<job>/ps-<shard> */
  char job[64];               /* job name */
  int shard;                  /* this shard */
  int nshards;                /* shards in the job */
  char mode[16];              /* "sync" or "async" */
  struct cm_optim_set optims; /* the job's: each variable's, checked on load */
  int keep;                   /* checkpoints kept */
  int has_max;                /* load nothing newer than max */
  uint64_t max;               /* --resume-step */
};

/* Creates path and its missing parents (mkdir -p). */
static int mkdirs(const char *path, char *err, size_t errlen) {
  char p[1024];
  size_t n = strlen(path);
  if (n >= sizeof p) {
    snprintf(err, errlen, "%s: path too long", path);
    return CM_EINVAL;
  }
  memcpy(p, path, n + 1);
  for (size_t i = 1; i <= n; i++) {
    if (p[i] != '/' && p[i] != 0)
      continue;
    char c = p[i];
    p[i] = 0;
    if (mkdir(p, 0755) != 0 && errno != EEXIST) {
      snprintf(err, errlen, "cannot create %s: %s", p, strerror(errno));
      return CM_EIO;
    }
    struct stat st;
    if (stat(p, &st) != 0 || !S_ISDIR(st.st_mode)) {
      snprintf(err, errlen, "cannot use %s as a directory: %s", p,
               stat(p, &st) != 0 ? strerror(errno) : "it is not a directory");
      return CM_EIO;
    }
    p[i] = c;
  }
  return 0;
}

/* fsyncs a directory so renames and new entries in it are durable. */
static int sync_dir(const char *path) {
  int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  int rc = 0;
  if (fd < 0)
    return CM_EIO;
  if (fsync(fd) != 0)
    rc = CM_EIO;
  close(fd);
  return rc;
}

/* Removes path and everything under it (best effort; files and
 * directories only, as psd writes them). */
static void remove_tree(const char *path) {
  DIR *d = opendir(path);
  struct dirent *e;
  char child[1400];
  if (!d) {
    unlink(path);
    return;
  }
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
      continue;
    snprintf(child, sizeof child, "%s/%s", path, e->d_name);
    if (e->d_type == DT_DIR)
      remove_tree(child);
    else
      unlink(child);
  }
  closedir(d);
  rmdir(path);
}

/* The step of a "ckpt-<digits>" name, or -1. */
static int64_t name_step(const char *name) {
  char *end;
  if (strncmp(name, "ckpt-", 5) != 0 || !name[5] ||
      strspn(name + 5, "0123456789") != strlen(name + 5) ||
      strlen(name + 5) > 19)
    return -1;
  unsigned long long s = strtoull(name + 5, &end, 10);
  return s > INT64_MAX ? -1 : (int64_t)s;
}

static int cmp_desc(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? 1 : x > y ? -1 : 0;
}

int psd_ckpt_list(struct psd_ckpt *c, uint64_t *steps, int max) {
  DIR *d = opendir(c->dir);
  struct dirent *e;
  int n = 0;
  if (!d)
    return 0;
  while ((e = readdir(d)) && n < max) {
    int64_t s = name_step(e->d_name);
    if (s >= 0)
      steps[n++] = (uint64_t)s;
  }
  closedir(d);
  qsort(steps, n, sizeof *steps, cmp_desc);
  return n;
}

static void ckpt_path(const struct psd_ckpt *c, uint64_t step, char *buf,
                      size_t len) {
  snprintf(buf, len, "%s/ckpt-%010llu", c->dir, (unsigned long long)step);
}

int psd_ckpt_new(struct psd_ckpt **out, const struct psd_ckpt_opts *o,
                 char *err, size_t errlen) {
  struct psd_ckpt *c = calloc(1, sizeof *c);
  DIR *d = NULL;
  struct dirent *e;
  int rc = 0;

  *out = NULL;
  if (!c)
    return CM_ENOMEM;
  if ((size_t)snprintf(c->dir, sizeof c->dir, "%s/%s/ps-%d", o->root, o->job,
                       o->shard) >= sizeof c->dir) {
    snprintf(err, errlen, "checkpoint directory %s/%s/ps-%d: path too long",
             o->root, o->job, o->shard);
    rc = CM_EINVAL;
    goto out;
  }
  snprintf(c->job, sizeof c->job, "%s", o->job);
  snprintf(c->mode, sizeof c->mode, "%s", o->mode);
  c->shard = o->shard;
  c->nshards = o->nshards;
  c->optims = *o->optims;
  c->keep = o->keep > 0 ? o->keep : 1;
  c->has_max = o->has_resume_step;
  c->max = o->resume_step;
  if ((rc = mkdirs(c->dir, err, errlen)))
    goto out;
  /* A crash mid-write leaves a .tmp-* directory: never a checkpoint. */
  if (!(d = opendir(c->dir))) {
    snprintf(err, errlen, "cannot read %s: %s", c->dir, strerror(errno));
    rc = CM_EIO;
    goto out;
  }
  while ((e = readdir(d))) {
    if (strncmp(e->d_name, ".tmp-", 5) != 0)
      continue;
    char p[1400];
    snprintf(p, sizeof p, "%s/%s", c->dir, e->d_name);
    cm_warn("removing %s: an unfinished checkpoint (psd stopped while "
            "writing it)",
            p);
    remove_tree(p);
  }
out:
  if (d)
    closedir(d);
  if (rc)
    psd_ckpt_free(c);
  else
    *out = c;
  return rc;
}

void psd_ckpt_free(struct psd_ckpt *c) { free(c); }

const char *psd_ckpt_dir(const struct psd_ckpt *c) { return c->dir; }

/* The CRC-32 that guards a manifest: of its compact, key-sorted JSON
 * without the "checksum" member (which must be absent from m). */
static int manifest_crc(json_t *m, uint32_t *crc) {
  char *text = json_dumps(m, JSON_COMPACT | JSON_SORT_KEYS);
  if (!text)
    return CM_ENOMEM;
  *crc = cm_st_crc32(0, text, strlen(text));
  free(text);
  return 0;
}

/* Writes text to path and fsyncs it. */
static int write_file(const char *path, const char *text, char *err,
                      size_t errlen) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  size_t n = strlen(text), done = 0;
  if (fd < 0) {
    snprintf(err, errlen, "cannot create %s: %s", path, strerror(errno));
    return CM_EIO;
  }
  while (done < n) {
    ssize_t k = write(fd, text + done, n - done);
    if (k < 0 && errno == EINTR)
      continue;
    if (k <= 0) {
      snprintf(err, errlen, "write %s: %s", path,
               k < 0 ? strerror(errno) : "no progress");
      close(fd);
      return CM_EIO;
    }
    done += (size_t)k;
  }
  if (fsync(fd) != 0 || close(fd) != 0) {
    snprintf(err, errlen, "fsync %s: %s", path, strerror(errno));
    return CM_EIO;
  }
  return 0;
}

static json_t *json_shape(int ndim, const int64_t *shape) {
  json_t *a = json_array();
  for (int i = 0; a && i < ndim; i++)
    json_array_append_new(a, json_integer(shape[i]));
  return a;
}

/* Removes all but the newest `keep` checkpoints. */
static void prune(struct psd_ckpt *c) {
  uint64_t *steps = malloc(MAX_CKPTS * sizeof *steps);
  char p[1400];
  int n;
  if (!steps)
    return;
  n = psd_ckpt_list(c, steps, MAX_CKPTS);
  for (int i = c->keep; i < n; i++) {
    ckpt_path(c, steps[i], p, sizeof p);
    remove_tree(p);
    cm_debug("pruned %s (keeping the newest %d)", p, c->keep);
  }
  if (n > c->keep)
    sync_dir(c->dir);
  free(steps);
}

/* Writes the shard file: the header from the variables' shapes, then each
 * variable's values and slots, taken under its lock with lock_vars (copied
 * first when small enough, COPY_MAX). With dedup, all of that is done with
 * its apply gate frozen, and the table is saved into *dedup_json before the
 * gate is thawed: the values and the table are one instant of the shard.
 * The file's tail and fsync come after. Appends the manifest's per-variable
 * entries to vars_json; sets res->nvars, res->hold_ms (the longest lock
 * hold) and res->freeze_ms. */
static int write_shard(struct psd_ckpt *c, struct psd_store *store,
                       struct psd_dedup *dedup, uint64_t step, int lock_vars,
                       const char *path, json_t *vars_json, json_t **dedup_json,
                       uint64_t *bytes, struct psd_ckpt_result *res, char *err,
                       size_t errlen) {
  struct cm_st_desc *desc = NULL;
  int64_t(*shapes)[PSD_VAR_MAX_DIMS] = NULL;
  char(*slot_names)[CM_OPTIM_MAX_SLOTS][PSD_VAR_MAX_NAME + 16] = NULL;
  uint64_t *versions = NULL, *opt_steps = NULL;
  struct cm_st_writer *w = NULL;
  char *copy = NULL;
  size_t copy_cap = 0;
  int n, nt = 0, fd = -1, rc = 0, frozen = 0;
  double frozen_at = 0;
  char stepbuf[32], shardbuf[16];

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
  if (!desc || !shapes || !slot_names || !versions || !opt_steps) {
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
  struct cm_st_meta meta[] = {{"format", FORMAT},
                              {"job", c->job},
                              {"shard", shardbuf},
                              {"step", stepbuf}};
  fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    snprintf(err, errlen, "cannot create %s: %s", path, strerror(errno));
    rc = CM_EIO;
    goto out;
  }
  if ((rc = cm_st_writer_new(&w, fd, path, desc, nt, meta, 4, err, errlen)))
    goto out;
  /* With the gate frozen: the whole shard into one buffer when it fits
   * SNAPSHOT_MAX (written once the gate is thawed). */
  size_t total = 0, at = 0;
  for (int i = 0; frozen && i < n; i++) {
    struct psd_var *v = psd_store_at(store, i);
    total +=
        (size_t)(1 + v->nslots) * (v->elem_end - v->elem_begin) * sizeof(float);
  }
  int whole = frozen && total <= SNAPSHOT_MAX && (copy = malloc(total + 1));
  if (whole)
    copy_cap = total;
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
      memcpy(dst, v->value, len);
      for (int k = 0; k < v->nslots; k++)
        memcpy(dst + (size_t)(1 + k) * len, v->slots[k], len);
    } else {
      rc = cm_st_writer_write(w, v->value, len, err, errlen);
      for (int k = 0; !rc && k < v->nslots; k++)
        rc = cm_st_writer_write(w, v->slots[k], len, err, errlen);
    }
    versions[i] = v->version;
    opt_steps[i] = psd_var_steps(v);
    if (lock_vars)
      pthread_mutex_unlock(&v->lock);
    if (lock_vars && cm_mono_ms() - t0 > res->hold_ms)
      res->hold_ms = cm_mono_ms() - t0;
    if (whole)
      at += all;
    else if (copied)
      rc = cm_st_writer_write(w, copy, all, err, errlen);
    if (rc)
      goto out;
  }
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
  if (fsync(fd) != 0) {
    snprintf(err, errlen, "fsync %s: %s", path, strerror(errno));
    rc = CM_EIO;
    goto out;
  }
  *bytes = cm_st_writer_size(w);
  for (int i = 0, t = 0; i < n; i++) {
    struct psd_var *v = psd_store_at(store, i);
    json_t *slots = json_array();
    json_t *e = json_pack(
        "{s:s, s:o, s:i, s:[I, I], s:I, s:{s:s, s:I}, s:s, s:I}", "name",
        v->name, "shape", json_shape(v->ndim, v->shape), "placement",
        v->placement, "rows", (json_int_t)v->row_begin, (json_int_t)v->row_end,
        "version", (json_int_t)versions[i], "value", "tensor", v->name, "crc32",
        (json_int_t)cm_st_writer_crc(w, t), "optimizer",
        cm_optim_name(v->opt.type), "opt_step", (json_int_t)opt_steps[i]);
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
    if (json_array_append_new(vars_json, e)) {
      rc = CM_ENOMEM;
      goto out;
    }
  }
out:
  if (frozen)
    psd_dedup_thaw(dedup);
  if (fd >= 0 && close(fd) != 0 && !rc) {
    snprintf(err, errlen, "close %s: %s", path, strerror(errno));
    rc = CM_EIO;
  }
  cm_st_writer_free(w);
  free(copy);
  free(desc);
  free(shapes);
  free(slot_names);
  free(versions);
  free(opt_steps);
  return rc;
}

int psd_ckpt_write(struct psd_ckpt *c, struct psd_store *store,
                   struct psd_dedup *dedup, uint64_t step, int lock_vars,
                   struct psd_ckpt_result *res, char *err, size_t errlen) {
  char tmp[1100], file[1200], final[1100], optim[PSD_OPTIM_DESC], when[32];
  json_t *m = NULL, *vars = json_array(), *dedup_json = NULL;
  char *text = NULL;
  double t0 = cm_mono_ms();
  uint64_t bytes = 0;
  int rc = 0, made = 0;
  uint32_t crc;
  struct stat st;

  memset(res, 0, sizeof *res);
  res->clients = -1;
  snprintf(tmp, sizeof tmp, "%s/.tmp-%llu-%d", c->dir, (unsigned long long)step,
           (int)getpid());
  ckpt_path(c, step, final, sizeof final);
  if (!vars) {
    rc = CM_ENOMEM;
    goto out;
  }
  if (mkdir(tmp, 0755) != 0) {
    snprintf(err, errlen, "cannot create %s: %s", tmp, strerror(errno));
    rc = CM_EIO;
    goto out;
  }
  made = 1;
  snprintf(file, sizeof file, "%s/" SHARD_FILE, tmp);
  if ((rc = write_shard(c, store, dedup, step, lock_vars, file, vars,
                        &dedup_json, &bytes, res, err, errlen)))
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
      "format", FORMAT, "job", c->job, "shard", c->shard, "nshards", c->nshards,
      "step", (json_int_t)step, "mode", c->mode, "optimizer", "type",
      cm_optim_name(c->optims.def.type), "lr", c->optims.def.lr, "momentum",
      c->optims.def.momentum, "describe", optim, "written", when, "file",
      SHARD_FILE, "file_bytes", (json_int_t)bytes, "vars", vars);
  vars = NULL; /* m owns it, or json_pack freed it */
  if (m && dedup_json) {
    res->clients = (int)json_array_size(dedup_json);
    rc = json_object_set_new(m, "dedup", dedup_json) ? CM_ENOMEM : 0;
    dedup_json = NULL; /* m owns it, or set_new freed it */
  }
  if (!m || rc || (rc = manifest_crc(m, &crc)) ||
      json_object_set_new(m, "checksum", json_integer(crc)) ||
      !(text = json_dumps(m, JSON_INDENT(1) | JSON_PRESERVE_ORDER))) {
    rc = rc ? rc : CM_ENOMEM;
    goto out;
  }
  snprintf(file, sizeof file, "%s/" MANIFEST, tmp);
  if ((rc = write_file(file, text, err, errlen)))
    goto out;
  if (sync_dir(tmp) != 0) {
    snprintf(err, errlen, "fsync %s: %s", tmp, strerror(errno));
    rc = CM_EIO;
    goto out;
  }
  if (stat(final, &st) == 0) {
    /* Same step again (e.g. SIGTERM right after a periodic one): swap the
     * new one in atomically, then drop the old one. */
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE) != 0) {
      snprintf(err, errlen, "cannot replace %s: %s", final, strerror(errno));
      rc = CM_EIO;
      goto out;
    }
  } else if (rename(tmp, final) != 0) {
    snprintf(err, errlen, "cannot rename %s to %s: %s", tmp, final,
             strerror(errno));
    rc = CM_EIO;
    goto out;
  } else {
    made = 0;
  }
  if (sync_dir(c->dir) != 0) {
    snprintf(err, errlen, "fsync %s: %s", c->dir, strerror(errno));
    rc = CM_EIO;
    goto out;
  }
  res->step = step;
  snprintf(res->path, sizeof res->path, "%s", final);
  res->bytes = bytes + strlen(text);
  res->ms = cm_mono_ms() - t0;
  prune(c);
out:
  if (made)
    remove_tree(tmp);
  free(text);
  json_decref(m);
  json_decref(vars);
  json_decref(dedup_json);
  return rc;
}

/* ---- loading ---- */

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
  sum = json_object_get(m, "checksum");
  if (!json_is_integer(sum)) {
    snprintf(err, errlen, "%s: no checksum", path);
    goto out;
  }
  want = json_integer_value(sum);
  json_object_del(m, "checksum");
  if ((rc = manifest_crc(m, &crc)))
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
  if (!s || (strcmp(s, FORMAT) != 0 && strcmp(s, FORMAT_1) != 0)) {
    snprintf(err, errlen,
             "%s: format is not \"" FORMAT "\" (nor \"" FORMAT_1 "\")", path);
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
  if (v->rule >= 0)
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

/* Loads one checkpoint directory into a new store and a new table of
 * applied pushes; verifies everything. */
static int load_one(struct psd_ckpt *c, const char *dir, uint64_t step,
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
  snprintf(path, sizeof path, "%s/" MANIFEST, dir);
  if ((rc = load_manifest(c, path, step, &m, err, errlen)))
    goto out;
  snprintf(file, sizeof file, "%s/" SHARD_FILE, dir);
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
    rc = psd_store_declare(
        store, json_string_value(name), (int)json_array_size(shape), dims,
        (int)placement, PSD_INIT_ZEROS, 0, 0, &v, &created, derr, sizeof derr);
    if (rc || !created) {
      snprintf(err, errlen, "%s: vars[%zu]: %s", path, i,
               rc ? derr : "a duplicate name");
      rc = rc == CM_ENOMEM ? rc : CM_EFORMAT;
      goto out;
    }
    rc = CM_EFORMAT;
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

/* Renames the checkpoints of steps[0..upto) above max (when has_max) to
 * superseded-ckpt-<step>-<time>, saying why. */
static void set_aside_above(struct psd_ckpt *c, const uint64_t *steps, int upto,
                            int has_max, uint64_t max, const char *why) {
  char from[1100], to[1200];
  for (int i = 0; i < upto; i++) {
    if (!has_max || steps[i] <= max)
      continue;
    ckpt_path(c, steps[i], from, sizeof from);
    snprintf(to, sizeof to, "%s/superseded-ckpt-%010llu-%ld", c->dir,
             (unsigned long long)steps[i], (long)time(NULL));
    if (rename(from, to) == 0)
      cm_warn("set %s aside as %s: newer than %s %llu", from, to, why,
              (unsigned long long)max);
    else
      cm_error("cannot set %s aside: %s", from, strerror(errno));
  }
  sync_dir(c->dir);
}

/* Renames the checkpoints newer than the one loaded (steps[0..upto), newest
 * first, those above --resume-step) out of the ckpt-* namespace. */
static void set_aside(struct psd_ckpt *c, const uint64_t *steps, int upto) {
  set_aside_above(c, steps, upto, c->has_max, c->max, "--resume-step");
}

int psd_ckpt_load(struct psd_ckpt *c, struct psd_store **out,
                  struct psd_dedup **dedup, struct psd_ckpt_result *res,
                  char *err, size_t errlen) {
  uint64_t *steps = malloc(MAX_CKPTS * sizeof *steps);
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
  n = psd_ckpt_list(c, steps, MAX_CKPTS);
  for (int i = 0; i < n; i++) {
    struct psd_store *s = NULL;
    struct psd_dedup *d = NULL;
    uint64_t bytes = 0;
    int nvars = 0, clients = -1;
    if (c->has_max && steps[i] > c->max)
      continue;
    ckpt_path(c, steps[i], dir, sizeof dir);
    rc = load_one(c, dir, steps[i], &s, &d, &clients, &nvars, &bytes, why,
                  sizeof why);
    if (rc == CM_ENOMEM)
      break;
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
  uint64_t *steps = malloc(MAX_CKPTS * sizeof *steps);
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
  n = psd_ckpt_list(c, steps, MAX_CKPTS);
  for (int i = 0; i < n; i++)
    have |= steps[i] == step;
  ckpt_path(c, step, dir, sizeof dir);
  if (!have) {
    snprintf(err, errlen, "no checkpoint of step %llu in %s",
             (unsigned long long)step, c->dir);
    rc = CM_ENOENT;
    goto out;
  }
  if ((rc = load_one(c, dir, step, &from, &d, &clients, &nvars, &bytes, why,
                     sizeof why))) {
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
        f->nslots != v->nslots) {
      snprintf(err, errlen,
               "checkpoint %s: '%s' is %s; this shard holds it otherwise", dir,
               v->name, f ? "held with other rows or slots" : "missing");
      rc = CM_EFORMAT;
      goto out;
    }
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
