/* The embedding tables in a shard's checkpoints (ckpt_internal.h).
 *
 * Each checkpoint directory holds one file per table, table-<i>.bin
 * (table.h, psd_table_snap_write: one instant's rows with their value,
 * optimizer state and statistics, CRC-32 guarded). The file is a full
 * snapshot, or a delta: only the rows changed since the previous
 * checkpoint, and the ids evicted since. The manifest names, per table, the
 * chain to restore: the steps of the checkpoints holding its full snapshot
 * and each delta after it, oldest first, ending at its own. Restoring takes
 * the full one and applies the deltas in order. A chain is at most
 * PSD__TCHAIN_MAX long; pruning keeps every checkpoint a kept one's chain
 * needs. Snapshots are taken while the shard is held still (ckpt_write.c),
 * so value, state and statistics, and the dense variables, are one
 * instant. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_internal.h"
#include "err.h"
#include "fileset.h"
#include "log.h"

/* The chain of table `name`, or NULL. */
static struct psd__tchain *chain_of(struct psd_ckpt *c, const char *name) {
  for (int i = 0; i < c->nchains; i++)
    if (!strcmp(c->chains[i].name, name))
      return &c->chains[i];
  return NULL;
}

/* Table i's snapshot for checkpoint `step`, prepared: full or delta
 * (psd__ckpt_tables_take says when), after the table's eviction. */
static int prepare_one(struct psd_ckpt *c, uint64_t step, struct psd__tsnaps *s,
                       int i) {
  struct psd_table *t = psd_tables_at(c->tables, i);
  const struct psd__tchain *ch = chain_of(c, psd_table_conf(t)->name);
  s->conf[i] = *psd_table_conf(t);
  s->delta[i] = !c->tables_full && ch && ch->n > 0 && ch->n < PSD__TCHAIN_MAX &&
                ch->steps[ch->n - 1] < step;
  /* Eviction runs at checkpoint time (the step is the shard's, as the
   * rows' last-touched steps are), before the instant: the ids it evicts
   * are in this checkpoint's delta. */
  if (s->conf[i].evict_after_steps || s->conf[i].evict_min_count) {
    uint64_t ev = 0;
    psd_table_shrink(t, step, &ev);
    if (ev)
      cm_info("table '%s': %llu rows evicted at the checkpoint of step %llu",
              s->conf[i].name, (unsigned long long)ev,
              (unsigned long long)step);
  }
  return psd_table_snap_prepare(t, 0, s->delta[i], &s->snap[i]) ? CM_ENOMEM : 0;
}

int psd__ckpt_tables_prepare(struct psd_ckpt *c, uint64_t step,
                             struct psd__tsnaps *s, char *err, size_t errlen) {
  memset(s, 0, sizeof *s);
  if (!c->tables)
    return 0;
  int n = psd_tables_count(c->tables);
  for (int i = 0; i < n && i < CM_TABLE_MAX; i++) {
    int rc = prepare_one(c, step, s, i);
    s->n = i + 1; /* freed by psd__ckpt_tables_done */
    if (rc) {
      snprintf(err, errlen, "out of memory for the snapshot of table '%s'",
               s->conf[i].name);
      return rc;
    }
  }
  return 0;
}

int psd__ckpt_tables_take(struct psd_ckpt *c, uint64_t step,
                          struct psd__tsnaps *s, char *err, size_t errlen) {
  if (!c->tables)
    return 0;
  int n = psd_tables_count(c->tables);
  for (int i = 0; i < n && i < CM_TABLE_MAX; i++) {
    struct psd_table *t = psd_tables_at(c->tables, i);
    /* A table declared since the preparation: prepared now. */
    int fresh = i >= s->n;
    if (fresh)
      s->n = i + 1;
    if ((fresh && prepare_one(c, step, s, i)) ||
        psd_table_snap_take(t, s->snap[i])) {
      snprintf(err, errlen, "out of memory for the snapshot of table '%s'",
               s->conf[i].name);
      return CM_ENOMEM;
    }
    s->delta[i] = s->snap[i]->delta;
    /* The async version (table.h), from the same held instant. */
    struct psd_table_stats ts;
    psd_table_stats(t, &ts);
    s->pushes[i] = ts.pushes;
  }
  return 0;
}

int psd__ckpt_tables_write(struct psd_ckpt *c, const struct psd__tsnaps *s,
                           struct psd_fileset *f, uint64_t step, json_t **out,
                           char *err, size_t errlen) {
  json_t *a = json_array();
  char path[1300], file[32];
  int rc = 0;
  *out = NULL;
  if (!a)
    return CM_ENOMEM;
  for (int i = 0; i < s->n; i++) {
    const struct psd_table_snap *sn = s->snap[i];
    const struct psd__tchain *ch = chain_of(c, s->conf[i].name);
    uint64_t size;
    json_t *chain = json_array(), *e;
    snprintf(file, sizeof file, "table-%d.bin", i);
    psd_fileset_path(f, file, path, sizeof path);
    /* Taken unsorted at the instant; sorted here, the shard going on. */
    if ((rc = psd_table_snap_sort(s->snap[i])) ||
        (rc = psd_table_snap_write(sn, &s->conf[i], path, err, errlen))) {
      if (rc == CM_ENOMEM)
        snprintf(err, errlen, "out of memory sorting table '%s'",
                 s->conf[i].name);
      json_decref(chain);
      goto out;
    }
    size = psd_fileset_count(f, path);
    for (int k = 0; s->delta[i] && chain && k < ch->n; k++)
      json_array_append_new(chain, json_integer((json_int_t)ch->steps[k]));
    if (chain)
      json_array_append_new(chain, json_integer((json_int_t)step));
    e = json_pack("{s:s, s:i, s:I, s:s, s:s, s:b, s:I, s:I, s:I, s:I, s:o}",
                  "name", s->conf[i].name, "dim", (int)s->conf[i].dim,
                  "id_bound", (json_int_t)s->conf[i].id_bound, "optimizer",
                  cm_rowopt_name(s->conf[i].opt.type), "file", file, "delta",
                  s->delta[i], "rows", (json_int_t)sn->nrows, "evicted",
                  (json_int_t)sn->nevicted, "bytes", (json_int_t)size, "pushes",
                  (json_int_t)s->pushes[i], "chain", chain);
    if (!e || json_array_append_new(a, e)) {
      rc = CM_ENOMEM;
      goto out;
    }
  }
  *out = a;
  a = NULL;
out:
  json_decref(a);
  return rc;
}

void psd__ckpt_tables_done(struct psd_ckpt *c, struct psd__tsnaps *s,
                           uint64_t step, int ok) {
  if (!ok)
    c->tables_full = 1;
  for (int i = 0; i < s->n; i++) {
    if (ok) {
      struct psd__tchain *ch = chain_of(c, s->conf[i].name);
      if (!ch && c->nchains < CM_TABLE_MAX) {
        ch = &c->chains[c->nchains++];
        snprintf(ch->name, sizeof ch->name, "%s", s->conf[i].name);
      }
      if (ch) {
        if (!s->delta[i])
          ch->n = 0;
        ch->steps[ch->n++] = step;
      }
    }
    psd_table_snap_free(s->snap[i]);
    s->snap[i] = NULL;
  }
  if (ok)
    c->tables_full = 0;
  s->n = 0;
}

/* One table of a manifest, read and verified: its snapshots in chain
 * order. */
struct loaded {
  struct cm_table_conf conf;                    /* its settings now */
  uint64_t pushes;                              /* pushes applied (0: none
                                                   recorded) */
  int n;                                        /* snapshots */
  struct psd_table_snap *snap[PSD__TCHAIN_MAX]; /* owned, chain order */
  uint64_t steps[PSD__TCHAIN_MAX];              /* their checkpoints */
};

int psd__ckpt_tables_load(struct psd_ckpt *c, json_t *m, uint64_t step,
                          char *err, size_t errlen) {
  json_t *tables = json_object_get(m, "tables");
  size_t n = json_array_size(tables);
  struct loaded *l = NULL;
  char path[1400], dir[1100];
  int rc = 0;
  if (!tables || !n)
    return 0;
  if (!c->tables) {
    snprintf(err, errlen, "the checkpoint holds tables; this shard has none");
    return CM_EFORMAT;
  }
  if (n > CM_TABLE_MAX || !(l = calloc(n, sizeof *l))) {
    snprintf(err, errlen, "%zu tables", n);
    return n > CM_TABLE_MAX ? CM_EFORMAT : CM_ENOMEM;
  }
  /* Every file of every chain first: nothing changes unless all verify. */
  for (size_t i = 0; i < n; i++) {
    json_t *e = json_array_get(tables, i), *chain = json_object_get(e, "chain");
    const char *name = json_string_value(json_object_get(e, "name"));
    const char *file = json_string_value(json_object_get(e, "file"));
    json_int_t dim = json_integer_value(json_object_get(e, "dim"));
    json_int_t bound = json_integer_value(json_object_get(e, "id_bound"));
    size_t nc = json_array_size(chain);
    if (!name || !file || dim < 1 || dim > CM_TABLE_MAX_DIM || !nc ||
        nc > PSD__TCHAIN_MAX || strchr(file, '/')) {
      snprintf(err, errlen, "manifest: tables[%zu] is malformed", i);
      rc = CM_EFORMAT;
      goto out;
    }
    psd_tables_conf_for(c->tables, name, (uint32_t)dim, (uint64_t)bound,
                        &l[i].conf);
    l[i].pushes = (uint64_t)json_integer_value(json_object_get(e, "pushes"));
    struct psd_table *live = psd_tables_find(c->tables, name);
    if (live && psd_table_conf(live)->dim != (uint32_t)dim) {
      snprintf(err, errlen,
               "table '%s' has dim %lld in the checkpoint; the spec gives it "
               "dim %u",
               name, (long long)dim, psd_table_conf(live)->dim);
      rc = CM_EFORMAT;
      goto out;
    }
    for (size_t k = 0; k < nc; k++) {
      uint64_t s = (uint64_t)json_integer_value(json_array_get(chain, k));
      if ((k + 1 == nc && s != step) || s > step) {
        snprintf(err, errlen, "manifest: table '%s' chain step %llu", name,
                 (unsigned long long)s);
        rc = CM_EFORMAT;
        goto out;
      }
      psd__ckpt_path(c, s, dir, sizeof dir);
      snprintf(path, sizeof path, "%s/%s", dir, file);
      if ((rc = psd_table_snap_read(path, &l[i].conf, &l[i].snap[k], err,
                                    errlen)))
        goto out;
      l[i].n = (int)k + 1;
      l[i].steps[k] = s;
      if (l[i].snap[k]->delta != (k > 0)) {
        snprintf(err, errlen, "%s: a %s snapshot where the chain needs a %s",
                 path, l[i].snap[k]->delta ? "delta" : "full",
                 k > 0 ? "delta" : "full one");
        rc = CM_EFORMAT;
        goto out;
      }
    }
  }
  for (size_t i = 0; i < n; i++) {
    struct psd_table *t;
    int created;
    if ((rc =
             psd_tables_declare(c->tables, l[i].conf.name, l[i].conf.dim,
                                l[i].conf.id_bound, &t, &created, err, errlen)))
      goto out;
    for (int k = 0; k < l[i].n; k++)
      if ((rc = psd_table_restore(t, l[i].snap[k]))) {
        snprintf(err, errlen,
                 "table '%s': restoring the snapshot of step %llu "
                 "failed (%s)",
                 l[i].conf.name, (unsigned long long)l[i].steps[k],
                 cm_strerror(rc));
        goto out;
      }
    psd_table_set_pushes(t, l[i].pushes);
    cm_info("table '%s': restored from %d file%s (full at step %llu%s)",
            l[i].conf.name, l[i].n, l[i].n == 1 ? "" : "s",
            (unsigned long long)l[i].steps[0],
            l[i].n > 1 ? ", then deltas" : "");
  }
  /* Changes are counted from the restored state: start a new chain. */
  c->tables_full = 1;
out:
  for (size_t i = 0; l && i < n; i++)
    for (int k = 0; k < l[i].n; k++)
      psd_table_snap_free(l[i].snap[k]);
  free(l);
  return rc;
}

int psd__ckpt_tables_needed(struct psd_ckpt *c, const uint64_t *kept, int n,
                            uint64_t step) {
  char path[1400], dir[1100];
  for (int i = 0; i < n; i++) {
    json_error_t jerr;
    psd__ckpt_path(c, kept[i], dir, sizeof dir);
    snprintf(path, sizeof path, "%s/" PSD__CKPT_MANIFEST, dir);
    json_t *m = json_load_file(path, 0, &jerr), *e;
    size_t k;
    int need = 0;
    json_array_foreach(json_object_get(m, "tables"), k, e) {
      json_t *s;
      size_t j;
      json_array_foreach(json_object_get(e, "chain"), j, s) need |=
          (uint64_t)json_integer_value(s) == step;
    }
    json_decref(m);
    if (need)
      return 1;
  }
  return 0;
}
