/* psctl export: reads every variable's rows from the shards that hold them
 * (their live values, with Data.Pull through psc__client_read; with --slots,
 * each variable's optimizer slots too, as "<name>/<slot>":
 * "<name>/momentum", "<name>/m", "<name>/v", ...) and writes them as one
 * safetensors file, each tensor with the variable's whole shape, so that
 * numpy or PyTorch load the model in one call. The file is written to a
 * temporary name and renamed, so FILE is never half-written. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "clock.h"
#include "optconf.h"
#include "psclient.h"
#include "psctl.h"
#include "rpc.h"
#include "safetensors.h"
#include "units.h"

/* One shard's rows of a variable. */
struct part {
  int shard;                  /* who holds them */
  int64_t row_begin, row_end; /* rows */
  uint64_t version;           /* its version there */
};

/* A variable as the shards together hold it. */
struct evar {
  const char *name;              /* borrowed from a status document */
  int ndim;                      /* dimensions */
  int64_t shape[CM_ST_MAX_DIMS]; /* whole shape */
  struct part parts[64];         /* shards holding rows, by row */
  int nparts;                    /* entries used */
  int nslots;                    /* the optimizer's slots (VarStatus.slots) */
  char slot_names[CM_OPTIM_MAX_SLOTS][256]; /* "<name>/<slot>" */
};

static int cmp_evar(const void *a, const void *b) {
  return strcmp(((const struct evar *)a)->name, ((const struct evar *)b)->name);
}

static int cmp_part(const void *a, const void *b) {
  const struct part *x = a, *y = b;
  return x->row_begin < y->row_begin ? -1 : x->row_begin > y->row_begin;
}

/* Asks every shard for its status document (st[s], owned by the caller).
 * Returns the number that did not answer (named on stderr). */
static int statuses(struct psctl *p, json_t **st) {
  int down = 0;
  for (int s = 0; s < p->spec->nps; s++) {
    const char *details = "";
    int status;
    if (psctl_status_doc(p, s, &st[s]) == 0)
      continue;
    status = psc__client_last_status(p->client, &details);
    fprintf(stderr, "psctl: ps:%d (%s) is down: %s: %s\n", s,
            p->spec->ps[s].text, cm_rpc_status_name((grpc_status_code)status),
            details);
    down++;
  }
  return down;
}

/* Gathers the variables of all shards' status documents into vars (sorted by
 * name) and checks that their rows cover each variable exactly once. Returns
 * the count, or -1 (reported). */
static int gather(const struct cm_spec *spec, json_t **st, struct evar **out) {
  int n = 0, cap = 0;
  struct evar *vars = NULL;
  for (int s = 0; s < spec->nps; s++) {
    json_t *v;
    size_t i;
    json_array_foreach(json_object_get(st[s], "vars"), i, v) {
      const char *name = cm_status_str(v, "name");
      json_t *shape = json_object_get(v, "shape");
      json_t *slots = json_object_get(v, "slots");
      json_t *rows = json_object_get(v, "rows");
      size_t n_shape = json_array_size(shape), n_slots = json_array_size(slots);
      int64_t row_begin = json_integer_value(json_array_get(rows, 0));
      int64_t row_end = json_integer_value(json_array_get(rows, 1));
      struct evar *e = NULL;
      for (int k = 0; k < n && !e; k++)
        if (!strcmp(vars[k].name, name))
          e = &vars[k];
      if (!e) {
        if (n == cap) {
          cap = cap ? 2 * cap : 16;
          struct evar *g = realloc(vars, cap * sizeof *g);
          if (!g) {
            fprintf(stderr, "psctl: out of memory\n");
            goto fail;
          }
          vars = g;
        }
        e = &vars[n++];
        memset(e, 0, sizeof *e);
        e->name = name;
        e->ndim = (int)n_shape;
        if (e->ndim < 1 || e->ndim > CM_ST_MAX_DIMS) {
          fprintf(stderr, "psctl: ps:%d: variable '%s' has %d dimensions\n", s,
                  name, e->ndim);
          goto fail;
        }
        for (int d = 0; d < e->ndim; d++)
          e->shape[d] = json_integer_value(json_array_get(shape, d));
        if (n_slots > CM_OPTIM_MAX_SLOTS) {
          fprintf(stderr, "psctl: ps:%d: variable '%s' has %zu slots\n", s,
                  name, n_slots);
          goto fail;
        }
        e->nslots = (int)n_slots;
        for (int k = 0; k < e->nslots; k++)
          snprintf(e->slot_names[k], sizeof e->slot_names[k], "%s/%s", name,
                   json_string_value(json_array_get(slots, k)));
      }
      if ((int)n_slots != e->nslots) {
        fprintf(stderr,
                "psctl: variable '%s' has %zu optimizer slots on ps:%d and %d "
                "on another shard; do the shards run the same spec?\n",
                name, n_slots, s, e->nslots);
        goto fail;
      }
      int same = (int)n_shape == e->ndim;
      for (int d = 0; same && d < e->ndim; d++)
        same = json_integer_value(json_array_get(shape, d)) == e->shape[d];
      if (!same) {
        fprintf(stderr,
                "psctl: variable '%s' has different shapes on different "
                "shards (ps:%d disagrees)\n",
                name, s);
        goto fail;
      }
      if (row_end > row_begin) {
        if (e->nparts == (int)(sizeof e->parts / sizeof e->parts[0])) {
          fprintf(stderr, "psctl: variable '%s' is on more than %zu shards\n",
                  name, sizeof e->parts / sizeof e->parts[0]);
          goto fail;
        }
        e->parts[e->nparts++] = (struct part){
            s, row_begin, row_end, (uint64_t)cm_status_int(v, "version")};
      }
    }
  }
  for (int k = 0; k < n; k++) {
    struct evar *e = &vars[k];
    int64_t at = 0;
    qsort(e->parts, e->nparts, sizeof *e->parts, cmp_part);
    for (int p = 0; p < e->nparts; p++) {
      if (e->parts[p].row_begin != at)
        break;
      at = e->parts[p].row_end;
    }
    if (at != e->shape[0]) {
      fprintf(stderr,
              "psctl: the shards' rows of '%s' do not cover rows [0, %lld) "
              "exactly once; is a shard holding an older layout?\n",
              e->name, (long long)e->shape[0]);
      goto fail;
    }
  }
  qsort(vars, n, sizeof *vars, cmp_evar);
  *out = vars;
  return n;
fail:
  free(vars);
  return -1;
}

/* Pulls elements [first, first + count) of variable `name` (its values, or
 * with slot >= 0 that slot) from shard and writes them to w, a window of
 * PSCTL_EXPORT_WINDOW messages at a time (buf holds one window), each
 * window in order whatever order its messages completed in. */
static int pull_part(struct psc__client *c, int shard, const char *name,
                     uint64_t first, uint64_t count, int slot,
                     struct cm_st_writer *w, float *buf, char *err,
                     size_t errlen) {
  uint64_t per = PSCTL_EXPORT_WINDOW * (PSCTL_EXPORT_CHUNK_BYTES / sizeof *buf);
  uint64_t done = 0;
  int rc = 0;

  while (done < count && !rc) {
    struct psc__read r = {.shard = shard,
                          .name = name,
                          .offset = first + done,
                          .count = count - done < per ? count - done : per,
                          .dst = buf,
                          .slots = slot >= 0,
                          .slot = slot >= 0 ? (uint32_t)slot : 0};
    if ((rc = psc__client_read(c, &r, 1)) && r.rc) {
      const char *details = "";
      int status = psc__client_last_status(c, &details);
      snprintf(err, errlen, "pull of '%s' from %s: %s: %s", name,
               psc__client_target(c, shard),
               cm_rpc_status_name((grpc_status_code)status), details);
    } else if (rc) {
      snprintf(err, errlen, "%s", psc__client_error(c));
    } else {
      rc = cm_st_writer_write(w, buf, r.count * sizeof *buf, err, errlen);
    }
    done += r.count;
  }
  return rc;
}

int psctl_cmd_export(struct psctl *p) {
  const struct cm_spec *spec = p->spec;
  json_t **st = NULL;
  struct evar *vars = NULL;
  struct cm_st_desc *desc = NULL;
  struct cm_st_writer *w = NULL;
  char tmp[4200], err[4096], nshards[16], step[32], size[32];
  float *buf = NULL;
  double t0 = cm_mono_ms();
  uint64_t values = 0;
  int n, nt = 0, fd = -1, rc = psctl_no_operands(p, "export");

  if (rc)
    return rc;
  if (!p->out || !p->out[0]) {
    fprintf(stderr, "psctl: export needs --out FILE.safetensors\n");
    return PSCTL_EXIT_USAGE;
  }
  rc = 1;
  snprintf(tmp, sizeof tmp, "%s.tmp-%d", p->out, (int)getpid());
  if (!(st = calloc(spec->nps, sizeof *st)) ||
      !(buf = malloc(PSCTL_EXPORT_WINDOW * PSCTL_EXPORT_CHUNK_BYTES))) {
    fprintf(stderr, "psctl: out of memory\n");
    goto out;
  }
  if (statuses(p, st)) {
    fprintf(stderr, "psctl: cannot export without every shard\n");
    goto out;
  }
  if ((n = gather(spec, st, &vars)) < 0)
    goto out;
  if (p->slots) {
    /* Variables whose optimizer keeps no slots (sgd) are exported bare. */
    int any = 0;
    for (int k = 0; k < n; k++)
      any |= vars[k].nslots > 0;
    if (!any) {
      fprintf(stderr, "psctl: --slots: no variable's optimizer keeps slots "
                      "(sgd keeps none)\n");
      goto out;
    }
  }
  if (!(desc =
            calloc((size_t)(1 + CM_OPTIM_MAX_SLOTS) * n + 1, sizeof *desc))) {
    fprintf(stderr, "psctl: out of memory\n");
    goto out;
  }
  for (int k = 0; k < n; k++) {
    desc[nt++] = (struct cm_st_desc){vars[k].name, vars[k].ndim, vars[k].shape};
    for (int i = 0; p->slots && i < vars[k].nslots; i++)
      desc[nt++] = (struct cm_st_desc){vars[k].slot_names[i], vars[k].ndim,
                                       vars[k].shape};
  }
  snprintf(nshards, sizeof nshards, "%d", spec->nps);
  snprintf(step, sizeof step, "%llu",
           (unsigned long long)cm_status_int(st[0], "step"));
  struct cm_st_meta meta[] = {{"format", "psd-export-1"},
                              {"job", spec->job.name},
                              {"mode", cm_status_str(st[0], "mode")},
                              {"shards", nshards},
                              {"step", step}};
  fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    fprintf(stderr, "psctl: cannot create %s: %s\n", tmp, strerror(errno));
    goto out;
  }
  if (cm_st_writer_new(&w, fd, p->out, desc, nt, meta,
                       sizeof meta / sizeof meta[0], err, sizeof err)) {
    fprintf(stderr, "psctl: %s\n", err);
    goto out;
  }
  for (int k = 0; k < n; k++) {
    const struct evar *e = &vars[k];
    uint64_t row = 1;
    for (int d = 1; d < e->ndim; d++)
      row *= (uint64_t)e->shape[d];
    /* The values (slot -1), then each slot, as the header lists them. */
    for (int slot = -1; slot < (p->slots ? e->nslots : 0); slot++)
      for (int i = 0; i < e->nparts; i++) {
        const struct part *pt = &e->parts[i];
        if (pull_part(p->client, pt->shard, e->name,
                      (uint64_t)pt->row_begin * row,
                      (uint64_t)(pt->row_end - pt->row_begin) * row, slot, w,
                      buf, err, sizeof err)) {
          fprintf(stderr, "psctl: ps:%d: %s\n", pt->shard, err);
          goto out;
        }
      }
    values += (uint64_t)e->shape[0] * row;
  }
  if (cm_st_writer_finish(w, err, sizeof err)) {
    fprintf(stderr, "psctl: %s\n", err);
    goto out;
  }
  if (fsync(fd) != 0 || close(fd) != 0) {
    fd = -1;
    fprintf(stderr, "psctl: %s: %s\n", tmp, strerror(errno));
    goto out;
  }
  fd = -1;
  if (rename(tmp, p->out) != 0) {
    fprintf(stderr, "psctl: cannot rename %s to %s: %s\n", tmp, p->out,
            strerror(errno));
    goto out;
  }
  double ms = cm_mono_ms() - t0;
  uint64_t bytes = cm_st_writer_size(w);
  cm_fmt_bytes((double)bytes, size, sizeof size);
  if (p->json) {
    json_t *root = json_pack("{s:s, s:i, s:i, s:I, s:I, s:b, s:f}", "out",
                             p->out, "variables", n, "shards", spec->nps,
                             "values", (json_int_t)values, "bytes",
                             (json_int_t)bytes, "slots", p->slots, "ms", ms);
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    printf("%s\n", text);
    free(text);
    json_decref(root);
  } else {
    printf("exported %d variables (%llu values%s) from %d shards to %s: %s "
           "in %.0f ms\n",
           n, (unsigned long long)values,
           p->slots ? ", with their optimizer slots" : "", spec->nps, p->out,
           size, ms);
  }
  rc = 0;
out:
  if (fd >= 0)
    close(fd);
  if (rc)
    unlink(tmp);
  cm_st_writer_free(w);
  free(desc);
  free(vars);
  for (int s = 0; st && s < spec->nps; s++)
    json_decref(st[s]);
  free(st);
  free(buf);
  return rc;
}
