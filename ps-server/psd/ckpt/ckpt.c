/* A shard's checkpoints (ckpt.h, ckpt_internal.h): the handle and the
 * shard's directory. Preparing it (fileset.h: mkdir -p, removing what a
 * crash left in it) and listing the checkpoints it holds. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_internal.h"
#include "err.h"
#include "fileset.h"
#include "layout.h"
#include "log.h"

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
  while ((e = readdir(d))) {
    int64_t s = name_step(e->d_name);
    if (s < 0 || max <= 0)
      continue;
    if (n < max) {
      steps[n++] = (uint64_t)s;
      qsort(steps, n, sizeof *steps, cmp_desc);
    } else if ((uint64_t)s > steps[n - 1]) {
      /* Full: the newest max are kept. */
      steps[n - 1] = (uint64_t)s;
      qsort(steps, n, sizeof *steps, cmp_desc);
    }
  }
  closedir(d);
  return n;
}

int psd_ckpt_peek(struct psd_ckpt *c, uint64_t *step, int *nshards, char *mode,
                  size_t modelen, uint64_t *layout, int *rows, char *err,
                  size_t errlen) {
  char dir[1100], path[1200];
  json_error_t jerr;
  if (psd_ckpt_list(c, step, 1) < 1)
    return CM_ENOENT;
  psd__ckpt_path(c, *step, dir, sizeof dir);
  snprintf(path, sizeof path, "%s/" PSD__CKPT_MANIFEST, dir);
  json_t *m = json_load_file(path, 0, &jerr);
  json_t *n = m ? json_object_get(m, "nshards") : NULL;
  const char *md = m ? json_string_value(json_object_get(m, "mode")) : NULL;
  if (!json_is_integer(n) || json_integer_value(n) < 1) {
    snprintf(err, errlen, "%s: %s", path,
             m ? "no \"nshards\" (not a psd checkpoint?)" : jerr.text);
    json_decref(m);
    return CM_EFORMAT;
  }
  *nshards = (int)json_integer_value(n);
  if (layout)
    *layout = (uint64_t)json_integer_value(json_object_get(m, "layout"));
  if (rows) {
    const char *r = json_string_value(json_object_get(m, "rows"));
    *rows = r ? cm_layout_rule_parse(r) : CM_LAYOUT_RULE_MODULO;
    if (!*rows) {
      snprintf(err, errlen,
               "%s: \"rows\" is \"%.40s\"; this psd places rows by "
               "\"buckets\" or \"modulo\" (a newer psd's checkpoint?)",
               path, r);
      json_decref(m);
      return CM_EFORMAT;
    }
  }
  snprintf(mode, modelen, "%s", md ? md : "async");
  json_decref(m);
  return 0;
}

void psd__ckpt_path(const struct psd_ckpt *c, uint64_t step, char *buf,
                    size_t len) {
  snprintf(buf, len, "%s/ckpt-%010llu", c->dir, (unsigned long long)step);
}

int psd_ckpt_new(struct psd_ckpt **out, const struct psd_ckpt_opts *o,
                 char *err, size_t errlen) {
  struct psd_ckpt *c = calloc(1, sizeof *c);
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
  c->rows = o->rows ? o->rows : CM_LAYOUT_RULE_BUCKETS;
  c->layout = o->layout;
  c->optims = *o->optims;
  c->keep = o->keep > 0 ? o->keep : 1;
  c->has_max = o->has_resume_step;
  c->max = o->resume_step;
  if ((c->read_only = o->read_only))
    goto out;
  rc = psd_fileset_prepare(c->dir, "checkpoint", err, errlen);
out:
  if (rc)
    psd_ckpt_free(c);
  else
    *out = c;
  return rc;
}

void psd_ckpt_free(struct psd_ckpt *c) { free(c); }

const char *psd_ckpt_dir(const struct psd_ckpt *c) { return c->dir; }

/* A read_only handle of a standby shard made one that writes: its
 * directory exists (or is made by its first write, fileset's begin makes
 * no parents, so made here). `why` names the cause in the error. */
static void writes_now(struct psd_ckpt *c, const char *why) {
  if (c->read_only) {
    char err[1200];
    if (psd_fileset_prepare(c->dir, "checkpoint", err, sizeof err))
      cm_error("%s: %s; this shard's checkpoints will fail", why, err);
    c->read_only = 0;
  }
}

void psd_ckpt_set_layout(struct psd_ckpt *c, int nshards, uint64_t layout,
                         int serves) {
  c->nshards = nshards;
  c->layout = layout;
  /* A standby shard taken in writes checkpoints from now on. */
  if (serves)
    writes_now(c, "layout switch");
}

void psd_ckpt_take_rows(struct psd_ckpt *c) {
  writes_now(c, "rows moved to this standby shard");
}

void psd_ckpt_set_tables(struct psd_ckpt *c, struct psd_tables *ts) {
  c->tables = ts;
  c->tables_full = 1; /* a new process starts a new chain */
}
