/* A live move's destination files (ckpt.h, docs/checkpoints.md "Move
 * files"): after a move's rows are installed and owned here, and before
 * the source is told to drop them, the destination writes them as
 * <shard dir>/move-L<layout>-<moved>/ (a file set, fileset.h): each
 * table's rows of the moved buckets (table-<i>.bin, table.h's snapshot
 * file) and manifest.json (format, job, shard, from, to, moved, layout,
 * the buckets as hex, the tables, its CRC-32 "checksum"). At start, the
 * files newer than the checkpoint loaded are applied in order of their
 * moves; a checkpoint that records at least their moves makes them
 * redundant, and the saver removes them. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_internal.h"
#include "err.h"
#include "fileset.h"
#include "layout.h"
#include "log.h"
#include "table.h"
#include "tables.h"

/* psd-move-2 adds a table's "handover" file; psd-move-1 is read too. */
#define MOVE_FORMAT "psd-move-2"
#define MOVE_FORMAT_1 "psd-move-1"
/* Bytes of a bucket set (bucket b at bit b % 8 of byte b / 8). */
#define SET_BYTES (CM_LAYOUT_BUCKETS / 8)
/* Move files looked at. */
#define MOVE_FILES_MAX 4096
/* A file set's temporary id, apart from checkpoints' steps. */
#define MOVE_TMP_ID (UINT64_C(0x6d6f7665) << 32)

void psd_ckpt_set_move(struct psd_ckpt *c, const int *move_to,
                       const int *moved) {
  c->move_to = move_to;
  c->moved = moved;
}

/* One move file found: its layout and moves. */
struct found {
  uint64_t layout; /* the layout it moves from */
  int moved;       /* the moves made with it */
};

/* Parses "move-L<layout>-<moved>"; returns 0 or -1. */
static int parse_name(const char *name, struct found *f) {
  unsigned long long l;
  int k, n = 0;
  if (sscanf(name, "move-L%llu-%d%n", &l, &k, &n) != 2 || name[n] || k <= 0)
    return -1;
  *f = (struct found){.layout = l, .moved = k};
  return 0;
}

static int by_moved(const void *a, const void *b) {
  const struct found *x = a, *y = b;
  return (x->moved > y->moved) - (x->moved < y->moved);
}

/* The move files of c's directory, sorted by moves; returns how many. */
static int list(struct psd_ckpt *c, struct found *out, int max) {
  DIR *d = opendir(c->dir);
  struct dirent *e;
  int n = 0;
  if (!d)
    return 0;
  while ((e = readdir(d)) && n < max)
    if (!parse_name(e->d_name, &out[n]))
      n++;
  closedir(d);
  qsort(out, (size_t)n, sizeof *out, by_moved);
  return n;
}

static void path_of(const struct psd_ckpt *c, uint64_t layout, int moved,
                    char *buf, size_t len) {
  snprintf(buf, len, "%s/move-L%" PRIu64 "-%010d", c->dir, layout, moved);
}

/* A move file being written (ckpt.h): its set, the tables' entries. */
struct psd_ckpt_move_file {
  struct psd_ckpt *c;     /* borrowed */
  struct psd_fileset f;   /* the set, in its temporary directory */
  uint8_t set[SET_BYTES]; /* the buckets */
  int moved;              /* the moves after it */
  int handovers;          /* hand-over files written */
  json_t *tables;         /* owned: the manifest's "tables" */
};

/* The entry of table `name` in f's tables, made when absent (NULL: out of
 * memory). */
static json_t *entry_of(struct psd_ckpt_move_file *f,
                        const struct cm_table_conf *conf) {
  json_t *e;
  size_t i;
  json_array_foreach(f->tables, i, e) {
    const char *n = json_string_value(json_object_get(e, "name"));
    if (n && !strcmp(n, conf->name))
      return e;
  }
  e = json_pack("{s:s, s:i, s:I}", "name", conf->name, "dim", (int)conf->dim,
                "id_bound", (json_int_t)conf->id_bound);
  if (e && json_array_append_new(f->tables, e))
    return NULL;
  return e;
}

/* Writes s as file `name` of f's set (fsynced), recorded in the entry of
 * its table under `key` with its rows under `rows_key`. */
static int put_snap(struct psd_ckpt_move_file *f,
                    const struct cm_table_conf *conf,
                    const struct psd_table_snap *s, const char *name,
                    const char *key, const char *rows_key, char *err,
                    size_t errlen) {
  char path[1300];
  json_t *e = entry_of(f, conf);
  int rc;
  if (!e)
    return CM_ENOMEM;
  psd_fileset_path(&f->f, name, path, sizeof path);
  if ((rc = psd_table_snap_write(s, conf, path, err, errlen)))
    return rc;
  psd_fileset_count(&f->f, path);
  if (json_object_set_new(e, key, json_string(name)) ||
      json_object_set_new(e, rows_key, json_integer((json_int_t)s->nrows)))
    return CM_ENOMEM;
  return 0;
}

void psd_ckpt_move_abandon(struct psd_ckpt_move_file *f) {
  if (!f)
    return;
  psd_fileset_end(&f->f);
  json_decref(f->tables);
  free(f);
}

int psd_ckpt_move_begin(struct psd_ckpt *c, const uint8_t *set, int moved,
                        struct psd_ckpt_move_file **out, char *err,
                        size_t errlen) {
  struct psd_ckpt_move_file *f = calloc(1, sizeof *f);
  char final[1200], file[32];
  int rc = 0;
  *out = NULL;
  if (!f || !(f->tables = json_array())) {
    free(f);
    return CM_ENOMEM;
  }
  f->c = c;
  f->moved = moved;
  memcpy(f->set, set, SET_BYTES);
  path_of(c, c->layout, moved, final, sizeof final);
  /* A standby shard's handle made no directory (read_only); nothing else
   * writes into it, so nothing of a writer's is cleaned by this. */
  if (c->read_only &&
      (rc = psd_fileset_prepare(c->dir, "move file", err, errlen)))
    goto out;
  if ((rc = psd_fileset_begin(&f->f, final, MOVE_TMP_ID | (uint64_t)moved, err,
                              errlen)))
    goto out;
  for (int i = 0; c->tables && i < psd_tables_count(c->tables); i++) {
    struct psd_table *t = psd_tables_at(c->tables, i);
    const struct cm_table_conf *conf = psd_table_conf(t);
    struct psd_table_snap *s = NULL;
    /* A full copy of the buckets' rows as the copies left them. A table's
     * move copies are one at a time: this shard is the destination, not a
     * source, now (ps:0 drives one batch at a time). */
    if (psd_table_move_snapshot(t, set, 0, &s)) {
      rc = CM_ENOMEM;
      snprintf(err, errlen, "out of memory copying table '%s'", conf->name);
      goto out;
    }
    psd_table_move_end(t);
    snprintf(file, sizeof file, "table-%d.bin", i);
    rc = put_snap(f, conf, s, file, "file", "rows", err, errlen);
    psd_table_snap_free(s);
    if (rc)
      goto out;
  }
out:
  if (rc)
    psd_ckpt_move_abandon(f);
  else
    *out = f;
  return rc;
}

int psd_ckpt_move_add(struct psd_ckpt_move_file *f,
                      const struct cm_table_conf *conf,
                      const struct psd_table_snap *s, char *err,
                      size_t errlen) {
  char file[48];
  snprintf(file, sizeof file, "table-%d.handover.bin", f->handovers++);
  return put_snap(f, conf, s, file, "handover", "handover_rows", err, errlen);
}

int psd_ckpt_move_finish(struct psd_ckpt_move_file *f, int from, uint64_t move,
                         int to, char *err, size_t errlen) {
  struct psd_ckpt *c = f->c;
  char hex[SET_BYTES * 2 + 1], id[17];
  json_t *m;
  int rc;
  for (unsigned i = 0; i < SET_BYTES; i++)
    snprintf(hex + 2 * i, 3, "%02x", f->set[i]);
  snprintf(id, sizeof id, "%016" PRIx64, move);
  m = json_pack("{s:s, s:s, s:i, s:i, s:s, s:i, s:i, s:I, s:s, s:O}", "format",
                MOVE_FORMAT, "job", c->job, "shard", c->shard, "from", from,
                "move_id", id, "to", to, "moved", f->moved, "layout",
                (json_int_t)c->layout, "buckets", hex, "tables", f->tables);
  if (!m)
    rc = CM_ENOMEM;
  else if (!(rc = psd_fileset_write_manifest(&f->f, PSD__CKPT_MANIFEST, m,
                                             PSD__CKPT_CHECKSUM, err, errlen)))
    rc = psd_fileset_commit(&f->f, 1, err, errlen);
  json_decref(m);
  psd_ckpt_move_abandon(f);
  return rc;
}

int psd_ckpt_move_newest(struct psd_ckpt *c, int *moved) {
  struct found *fs = malloc(MOVE_FILES_MAX * sizeof *fs);
  int n = fs ? list(c, fs, MOVE_FILES_MAX) : 0;
  *moved = 0;
  for (int i = 0; i < n; i++)
    if (fs[i].layout == c->layout && fs[i].moved > *moved)
      *moved = fs[i].moved;
  free(fs);
  return fs ? 0 : CM_ENOMEM;
}

/* Reads and checks the manifest of move file dir into *out (the caller's):
 * checksum, format, job, shard, to. */
static int read_manifest(struct psd_ckpt *c, const char *dir, int to,
                         json_t **out, char *err, size_t errlen) {
  char path[1300];
  json_error_t jerr;
  json_t *m, *sum;
  uint32_t crc;
  int rc = CM_EFORMAT;
  snprintf(path, sizeof path, "%s/" PSD__CKPT_MANIFEST, dir);
  if (!(m = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr))) {
    snprintf(err, errlen, "%s: %s (line %d)", path, jerr.text, jerr.line);
    return CM_EFORMAT;
  }
  sum = json_object_get(m, PSD__CKPT_CHECKSUM);
  if (!json_is_integer(sum)) {
    snprintf(err, errlen, "%s: no checksum", path);
    goto out;
  }
  json_int_t want = json_integer_value(sum);
  json_object_del(m, PSD__CKPT_CHECKSUM);
  if ((rc = psd_fileset_manifest_crc(m, PSD__CKPT_CHECKSUM, &crc)))
    goto out;
  rc = CM_EFORMAT;
  const char *fmt = json_string_value(json_object_get(m, "format"));
  const char *job = json_string_value(json_object_get(m, "job"));
  json_t *shard = json_object_get(m, "shard"), *mto = json_object_get(m, "to");
  const char *hex = json_string_value(json_object_get(m, "buckets"));
  if (crc != (uint32_t)want)
    snprintf(err, errlen,
             "%s fails its checksum (CRC-32 %08x, it says %08x): the file is "
             "corrupt",
             path, crc, (uint32_t)want);
  else if (!fmt || (strcmp(fmt, MOVE_FORMAT) && strcmp(fmt, MOVE_FORMAT_1)))
    snprintf(err, errlen,
             "%s: format is not \"" MOVE_FORMAT "\" (nor \"" MOVE_FORMAT_1
             "\")",
             path);
  else if (!job || strcmp(job, c->job))
    snprintf(err, errlen, "%s: job is not '%s'", path, c->job);
  else if (!json_is_integer(shard) || json_integer_value(shard) != c->shard)
    snprintf(err, errlen, "%s: shard is not %d", path, c->shard);
  else if (!json_is_integer(mto) || (to && json_integer_value(mto) != to))
    snprintf(err, errlen, "%s: \"to\" is not %d, the move's count", path, to);
  else if (!hex || strlen(hex) != SET_BYTES * 2)
    snprintf(err, errlen, "%s: \"buckets\" is not %d hex digits", path,
             SET_BYTES * 2);
  else if (!json_is_array(json_object_get(m, "tables")))
    snprintf(err, errlen, "%s: no \"tables\" array", path);
  else
    rc = 0;
out:
  if (rc)
    json_decref(m);
  else
    *out = m;
  return rc;
}

/* The bucket set of a checked manifest (read_manifest: its "buckets" has
 * the length of one). Returns 0, or -1 when it is not hex. */
static int set_of(json_t *m, uint8_t *set) {
  const char *hex = json_string_value(json_object_get(m, "buckets"));
  for (unsigned b = 0; b < SET_BYTES; b++) {
    unsigned v;
    if (sscanf(hex + 2 * b, "%2x", &v) != 1)
      return -1;
    set[b] = (uint8_t)v;
  }
  return 0;
}

/* Installs file `file` of move file dir into t's buckets of set: a full
 * copy (`full`: it must be one) or the hand-over's copy (a delta of rows
 * and evicted ids, or a full one). */
static int install_file(struct psd_table *t, const char *dir, const char *file,
                        int full, const uint8_t *set, uint64_t *rows, char *err,
                        size_t errlen) {
  struct psd_table_snap *s = NULL;
  char path[1400];
  uint64_t n = 0;
  int rc;
  snprintf(path, sizeof path, "%s/%s", dir, file);
  if ((rc = psd_table_snap_read(path, psd_table_conf(t), &s, err, errlen)))
    return rc;
  if (full && s->delta)
    rc = CM_EFORMAT,
    snprintf(err, errlen, "%s: a delta, not a full copy", path);
  else if ((rc = psd_table_move_install(t, s, set, &n)))
    snprintf(err, errlen, "%s: %s installing its rows", path, cm_strerror(rc));
  *rows += n;
  psd_table_snap_free(s);
  return rc;
}

/* Applies move file dir (manifest m): each table's rows replace those of
 * the buckets (its "file", the copies' rows), then its "handover" file's
 * changes are applied (psd-move-2). */
static int apply_one(struct psd_ckpt *c, const char *dir, json_t *m,
                     uint64_t *rows, char *err, size_t errlen) {
  json_t *tables = json_object_get(m, "tables"), *e;
  uint8_t set[SET_BYTES];
  size_t i;
  if (set_of(m, set)) {
    snprintf(err, errlen, "%s/" PSD__CKPT_MANIFEST ": \"buckets\" is not hex",
             dir);
    return CM_EFORMAT;
  }
  json_array_foreach(tables, i, e) {
    const char *name = json_string_value(json_object_get(e, "name"));
    const char *file = json_string_value(json_object_get(e, "file"));
    const char *hand = json_string_value(json_object_get(e, "handover"));
    json_t *dim = json_object_get(e, "dim"),
           *bound = json_object_get(e, "id_bound");
    struct psd_table *t = NULL;
    char why[300];
    int created, rc = 0;
    if (!name || (!file && !hand) || (file && strchr(file, '/')) ||
        (hand && strchr(hand, '/')) || !json_is_integer(dim) ||
        !json_is_integer(bound)) {
      snprintf(err, errlen,
               "%s/" PSD__CKPT_MANIFEST
               ": tables[%zu] lacks name, file (or handover), dim or "
               "id_bound",
               dir, i);
      return CM_EFORMAT;
    }
    if (!(t = psd_tables_find(c->tables, name)) &&
        (rc = psd_tables_declare(c->tables, name,
                                 (uint32_t)json_integer_value(dim),
                                 (uint64_t)json_integer_value(bound), &t,
                                 &created, why, sizeof why))) {
      snprintf(err, errlen, "%s: table '%s': %s", dir, name, why);
      return rc;
    }
    if ((file &&
         (rc = install_file(t, dir, file, 1, set, rows, err, errlen))) ||
        (hand && (rc = install_file(t, dir, hand, 0, set, rows, err, errlen))))
      return rc;
  }
  return 0;
}

int psd_ckpt_move_apply(struct psd_ckpt *c, int to, int after, int upto,
                        int *files, uint64_t *rows, char *err, size_t errlen) {
  struct found *fs = malloc(MOVE_FILES_MAX * sizeof *fs);
  char dir[1200];
  int n, rc = 0;
  *files = 0;
  *rows = 0;
  if (!fs || !c->tables) {
    free(fs);
    return fs ? 0 : CM_ENOMEM;
  }
  n = list(c, fs, MOVE_FILES_MAX);
  for (int i = 0; i < n && !rc; i++) {
    json_t *m = NULL;
    if (fs[i].layout != c->layout || fs[i].moved <= after || fs[i].moved > upto)
      continue;
    path_of(c, fs[i].layout, fs[i].moved, dir, sizeof dir);
    if (!(rc = read_manifest(c, dir, to, &m, err, errlen)))
      rc = apply_one(c, dir, m, rows, err, errlen);
    json_decref(m);
    if (!rc)
      ++*files;
  }
  free(fs);
  return rc;
}

int psd_ckpt_move_last(struct psd_ckpt *c, int to, struct psd_ckpt_move *out,
                       char *err, size_t errlen) {
  struct found *fs = malloc(MOVE_FILES_MAX * sizeof *fs);
  char dir[1200];
  json_t *m = NULL;
  int n, best = -1, rc = CM_ENOENT;
  memset(out, 0, sizeof *out);
  if (!fs)
    return CM_ENOMEM;
  n = list(c, fs, MOVE_FILES_MAX);
  for (int i = 0; i < n; i++)
    if (fs[i].layout == c->layout && (best < 0 || fs[i].moved > fs[best].moved))
      best = i;
  if (best < 0)
    goto out;
  path_of(c, fs[best].layout, fs[best].moved, dir, sizeof dir);
  if ((rc = read_manifest(c, dir, to, &m, err, errlen)))
    goto out;
  const char *id = json_string_value(json_object_get(m, "move_id"));
  json_t *from = json_object_get(m, "from");
  out->moved = fs[best].moved;
  out->to = (int)json_integer_value(json_object_get(m, "to"));
  out->from = json_is_integer(from) ? (int)json_integer_value(from) : -1;
  if (id && strlen(id) == 16)
    out->id = strtoull(id, NULL, 16);
  if (set_of(m, out->set)) {
    snprintf(err, errlen, "%s/" PSD__CKPT_MANIFEST ": \"buckets\" is not hex",
             dir);
    rc = CM_EFORMAT;
  }
out:
  json_decref(m);
  free(fs);
  return rc;
}

void psd__ckpt_move_prune(struct psd_ckpt *c, int moved) {
  struct found *fs = malloc(MOVE_FILES_MAX * sizeof *fs);
  char dir[1200];
  int n = fs ? list(c, fs, MOVE_FILES_MAX) : 0, any = 0;
  for (int i = 0; i < n; i++) {
    /* Held by the checkpoint just written: its moves include the file's,
     * or its layout is newer (the switch ended the move). */
    if (fs[i].layout > c->layout ||
        (fs[i].layout == c->layout && fs[i].moved > moved))
      continue;
    path_of(c, fs[i].layout, fs[i].moved, dir, sizeof dir);
    psd_fileset_remove_tree(dir);
    cm_debug("removed %s: the checkpoint holds its rows", dir);
    any = 1;
  }
  /* A live switch's staging (switch-L<X>/) and ps:0's decision
   * (switch-L<X>.commit, reshard/switch.h) of this layout or older: this
   * checkpoint holds the switch. */
  DIR *d = opendir(c->dir);
  struct dirent *e;
  while (d && (e = readdir(d))) {
    unsigned long long l;
    char tail[8] = "";
    int k = sscanf(e->d_name, "switch-L%llu%7s", &l, tail);
    if (k < 1 || l > c->layout || (k == 2 && strcmp(tail, ".commit")))
      continue;
    char path[1500];
    snprintf(path, sizeof path, "%s/%.255s", c->dir, e->d_name);
    psd_fileset_remove_tree(path);
    cm_debug("removed %s: the checkpoint holds layout %llu", path,
             (unsigned long long)c->layout);
    any = 1;
  }
  if (d)
    closedir(d);
  if (any)
    psd_fileset_sync_dir(c->dir);
  free(fs);
}
