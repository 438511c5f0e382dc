/* psctl checkpoint and psctl export (psctl_ckpt.h), over plain gRPC calls to
 * every shard: Admin.Checkpoint, Admin.Status and Data.Pull. */
#include "psctl_ckpt.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "auth.h"
#include "clock.h"
#include "err.h"
#include "ps.pb-c.h"
#include "rpc.h"
#include "safetensors.h"
#include "units.h"
#include "wire.h"

/* Bytes of values per pull message, and messages in flight at once. */
#define CHUNK_BYTES (2u << 20)
#define WINDOW 8

/* Opens a channel to every shard with the spec's credentials; returns 0,
 * or a negative code (a credential file that cannot be read is reported). */
static int open_channels(const struct cm_spec *spec, struct cm_channel ***out) {
  struct cm_channel **ch = calloc(spec->nps, sizeof *ch);
  struct cm_creds creds;
  char err[1024];
  int rc = 0;
  *out = ch;
  if (!ch)
    return CM_ENOMEM;
  if ((rc = cm_creds_load(&spec->auth, 0, &creds, err, sizeof err))) {
    fprintf(stderr, "psctl: %s\n", err);
    return rc;
  }
  for (int s = 0; s < spec->nps && !rc; s++)
    if (cm_channel_new(&ch[s], spec->ps[s].text, &creds))
      rc = CM_ENOMEM;
  cm_creds_free(&creds);
  return rc;
}

static void close_channels(const struct cm_spec *spec, struct cm_channel **ch) {
  for (int s = 0; ch && s < spec->nps; s++)
    cm_channel_free(ch[s]);
  free(ch);
}

/* ---- checkpoint ---- */

int psd_ctl_checkpoint(const struct cm_spec *spec,
                       const struct psd_ctl_opts *o) {
  Psd__V1__Caller caller = PSD__V1__CALLER__INIT;
  Psd__V1__CheckpointRequest req = PSD__V1__CHECKPOINT_REQUEST__INIT;
  Psd__V1__CheckpointResponse **resp = NULL;
  struct cm_channel **ch = NULL;
  struct cm_unary *calls = NULL;
  json_t *root = NULL, *shards = NULL;
  int rc = 1, bad = 0;

  caller.job = (char *)spec->job.name;
  caller.worker = "psctl";
  req.caller = &caller;
  req.wait = o->wait;
  calls = calloc(spec->nps, sizeof *calls);
  resp = calloc(spec->nps, sizeof *resp);
  if (!calls || !resp || open_channels(spec, &ch)) {
    fprintf(stderr, "psctl: out of memory\n");
    goto out;
  }
  for (int s = 0; s < spec->nps; s++) {
    calls[s].channel = ch[s];
    calls[s].method = "/psd.v1.Admin/Checkpoint";
    calls[s].request = cm_rpc_pack(&req.base);
  }
  /* All shards at once: each writes its own slice in parallel. */
  struct cm_run_opts ro = {.timeout_ms = o->timeout_ms, .inflight = 1};
  cm_client_run(calls, spec->nps, &ro);
  for (int s = 0; s < spec->nps; s++) {
    uint8_t *data = NULL;
    size_t len = 0;
    if (calls[s].status == GRPC_STATUS_OK &&
        cm_rpc_readall(calls[s].response, &data, &len) == 0)
      resp[s] = psd__v1__checkpoint_response__unpack(NULL, len, data);
    free(data);
    if (calls[s].status == GRPC_STATUS_OK && !resp[s]) {
      calls[s].status = GRPC_STATUS_INTERNAL;
      snprintf(calls[s].details, sizeof calls[s].details, "malformed answer");
    }
    if (calls[s].status == GRPC_STATUS_UNAVAILABLE ||
        calls[s].status == GRPC_STATUS_DEADLINE_EXCEEDED) {
      fprintf(stderr, "psctl: ps:%d (%s) is down: %s: %s\n", s,
              spec->ps[s].text, cm_rpc_status_name(calls[s].status),
              calls[s].details);
      bad++;
    } else if (calls[s].status != GRPC_STATUS_OK) {
      fprintf(stderr, "psctl: ps:%d (%s): %s: %s\n", s, spec->ps[s].text,
              cm_rpc_status_name(calls[s].status), calls[s].details);
      bad++;
    }
  }
  if (o->json) {
    root = json_object();
    shards = json_array();
    for (int s = 0; s < spec->nps; s++) {
      json_t *e =
          json_pack("{s:i, s:s, s:b}", "shard", s, "address", spec->ps[s].text,
                    "ok", calls[s].status == GRPC_STATUS_OK);
      if (resp[s]) {
        json_object_set_new(e, "written", json_boolean(resp[s]->written));
        json_object_set_new(e, "step", json_integer(resp[s]->step));
        json_object_set_new(e, "path", json_string(resp[s]->path));
        json_object_set_new(e, "bytes", json_integer(resp[s]->bytes));
        json_object_set_new(e, "ms", json_real(resp[s]->ms));
      } else {
        json_object_set_new(e, "status",
                            json_string(cm_rpc_status_name(calls[s].status)));
        json_object_set_new(e, "error", json_string(calls[s].details));
      }
      json_array_append_new(shards, e);
    }
    json_object_set_new(root, "shards", shards);
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    printf("%s\n", text);
    free(text);
  } else {
    printf("%-6s %-22s %-8s %10s %10s %9s  %s\n", "SHARD", "ADDRESS", "RESULT",
           "STEP", "SIZE", "TIME", "PATH");
    for (int s = 0; s < spec->nps; s++) {
      char size[32], ms[32];
      const char *state =
          calls[s].status == GRPC_STATUS_UNAVAILABLE ||
                  calls[s].status == GRPC_STATUS_DEADLINE_EXCEEDED
              ? "down"
          : !resp[s]         ? "failed"
          : resp[s]->written ? "written"
                             : "queued";
      if (!resp[s]) {
        printf("ps:%-3d %-22s %-8s %10s %10s %9s  %s\n", s, spec->ps[s].text,
               state, "-", "-", "-", calls[s].details);
        continue;
      }
      cm_fmt_bytes((double)resp[s]->bytes, size, sizeof size);
      snprintf(ms, sizeof ms, "%.0f ms", resp[s]->ms);
      printf("ps:%-3d %-22s %-8s %10llu %10s %9s  %s\n", s, spec->ps[s].text,
             state, (unsigned long long)resp[s]->step,
             resp[s]->written ? size : "-", resp[s]->written ? ms : "-",
             resp[s]->written ? resp[s]->path : "(not waited for: --wait)");
    }
  }
  rc = bad ? 1 : 0;
out:
  for (int s = 0; calls && s < spec->nps; s++) {
    cm_unary_release(&calls[s]);
    if (resp[s])
      psd__v1__checkpoint_response__free_unpacked(resp[s], NULL);
  }
  json_decref(root);
  free(calls);
  free(resp);
  close_channels(spec, ch);
  return rc;
}

/* ---- export ---- */

/* One shard's rows of a variable. */
struct part {
  int shard;                  /* who holds them */
  int64_t row_begin, row_end; /* rows */
  uint64_t version;           /* its version there */
};

/* A variable as the shards together hold it. */
struct evar {
  const char *name;              /* borrowed from a status answer */
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

/* Asks every shard for its status. Returns the number that did not answer
 * (named on stderr). */
static int statuses(const struct cm_spec *spec, struct cm_channel **ch,
                    int timeout_ms, Psd__V1__StatusResponse **st) {
  Psd__V1__Caller caller = PSD__V1__CALLER__INIT;
  Psd__V1__StatusRequest req = PSD__V1__STATUS_REQUEST__INIT;
  struct cm_unary *calls = calloc(spec->nps, sizeof *calls);
  struct cm_run_opts ro = {.timeout_ms = timeout_ms, .inflight = 1};
  int down = 0;

  if (!calls)
    return spec->nps;
  caller.job = (char *)spec->job.name;
  caller.worker = "psctl";
  req.caller = &caller;
  for (int s = 0; s < spec->nps; s++) {
    calls[s].channel = ch[s];
    calls[s].method = "/psd.v1.Admin/Status";
    calls[s].request = cm_rpc_pack(&req.base);
  }
  cm_client_run(calls, spec->nps, &ro);
  for (int s = 0; s < spec->nps; s++) {
    uint8_t *data = NULL;
    size_t len = 0;
    if (calls[s].status == GRPC_STATUS_OK &&
        cm_rpc_readall(calls[s].response, &data, &len) == 0)
      st[s] = psd__v1__status_response__unpack(NULL, len, data);
    free(data);
    if (!st[s]) {
      fprintf(stderr, "psctl: ps:%d (%s) is down: %s: %s\n", s,
              spec->ps[s].text, cm_rpc_status_name(calls[s].status),
              calls[s].details);
      down++;
    }
    cm_unary_release(&calls[s]);
  }
  free(calls);
  return down;
}

/* Gathers the variables of all shards into vars (sorted by name) and checks
 * that their rows cover each variable exactly once. Returns the count, or -1
 * (reported). */
static int gather(const struct cm_spec *spec, Psd__V1__StatusResponse **st,
                  struct evar **out) {
  int n = 0, cap = 0;
  struct evar *vars = NULL;
  for (int s = 0; s < spec->nps; s++) {
    for (size_t i = 0; i < st[s]->n_vars; i++) {
      const Psd__V1__VarStatus *v = st[s]->vars[i];
      struct evar *e = NULL;
      for (int k = 0; k < n && !e; k++)
        if (!strcmp(vars[k].name, v->name))
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
        e->name = v->name;
        e->ndim = (int)v->n_shape;
        if (e->ndim < 1 || e->ndim > CM_ST_MAX_DIMS) {
          fprintf(stderr, "psctl: ps:%d: variable '%s' has %d dimensions\n", s,
                  v->name, e->ndim);
          goto fail;
        }
        memcpy(e->shape, v->shape, e->ndim * sizeof *e->shape);
        if (v->n_slots > CM_OPTIM_MAX_SLOTS) {
          fprintf(stderr, "psctl: ps:%d: variable '%s' has %zu slots\n", s,
                  v->name, v->n_slots);
          goto fail;
        }
        e->nslots = (int)v->n_slots;
        for (int k = 0; k < e->nslots; k++)
          snprintf(e->slot_names[k], sizeof e->slot_names[k], "%s/%s", v->name,
                   v->slots[k]);
      }
      if ((int)v->n_slots != e->nslots) {
        fprintf(stderr,
                "psctl: variable '%s' has %zu optimizer slots on ps:%d and %d "
                "on another shard; do the shards run the same spec?\n",
                v->name, v->n_slots, s, e->nslots);
        goto fail;
      }
      int same = (int)v->n_shape == e->ndim;
      for (int d = 0; same && d < e->ndim; d++)
        same = v->shape[d] == e->shape[d];
      if (!same) {
        fprintf(stderr,
                "psctl: variable '%s' has different shapes on different "
                "shards (ps:%d disagrees)\n",
                v->name, s);
        goto fail;
      }
      if (v->row_end > v->row_begin) {
        if (e->nparts == (int)(sizeof e->parts / sizeof e->parts[0])) {
          fprintf(stderr, "psctl: variable '%s' is on more than %zu shards\n",
                  v->name, sizeof e->parts / sizeof e->parts[0]);
          goto fail;
        }
        e->parts[e->nparts++] =
            (struct part){s, v->row_begin, v->row_end, v->version};
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

/* Pulls elements [first, first + count) of var (its values, or with
 * slot >= 0 that slot) from shard and writes them to w, WINDOW chunks in
 * flight at once. */
static int pull_part(struct cm_channel *ch, const struct cm_spec *spec,
                     const char *name, uint64_t first, uint64_t count, int slot,
                     int timeout_ms, struct cm_st_writer *w, char *buf,
                     char *err, size_t errlen) {
  Psd__V1__Caller caller = PSD__V1__CALLER__INIT;
  struct cm_unary calls[WINDOW];
  uint64_t per = CHUNK_BYTES / sizeof(float), done = 0;
  int rc = 0;

  caller.job = (char *)spec->job.name;
  caller.worker = "psctl";
  while (done < count && !rc) {
    int n = 0;
    uint64_t counts[WINDOW];
    memset(calls, 0, sizeof calls);
    for (; n < WINDOW && done < count; n++) {
      Psd__V1__PullRequest req = PSD__V1__PULL_REQUEST__INIT;
      Psd__V1__Segment seg = PSD__V1__SEGMENT__INIT, *segs[1] = {&seg};
      seg.name = (char *)name;
      seg.offset = first + done;
      seg.count = count - done < per ? count - done : per;
      counts[n] = seg.count;
      done += seg.count;
      req.caller = &caller;
      req.n_segments = 1;
      req.segments = segs;
      req.slots = slot >= 0;
      req.slot = slot >= 0 ? (uint32_t)slot : 0;
      calls[n].channel = ch;
      calls[n].method = "/psd.v1.Data/Pull";
      calls[n].request = cm_rpc_pack(&req.base);
    }
    struct cm_run_opts ro = {.timeout_ms = timeout_ms, .inflight = WINDOW};
    cm_client_run(calls, n, &ro);
    /* In order, whatever order they completed in. */
    for (int i = 0; i < n; i++) {
      struct cm_wire_msg m;
      size_t len = counts[i] * sizeof(float);
      if (!rc && calls[i].status != GRPC_STATUS_OK) {
        snprintf(err, errlen, "pull of '%s' from %s: %s: %s", name,
                 cm_channel_target(ch), cm_rpc_status_name(calls[i].status),
                 calls[i].details);
        rc = CM_ERPC;
      }
      if (!rc) {
        if (cm_wire_parse(&m, calls[i].response) || m.bulk_len != len) {
          snprintf(err, errlen, "pull of '%s' from %s: %zu bytes; expected %zu",
                   name, cm_channel_target(ch), m.bulk_len, len);
          rc = CM_EPROTO;
        } else {
          cm_wire_bulk_read(&m, 0, buf, len);
          rc = cm_st_writer_write(w, buf, len, err, errlen);
        }
        cm_wire_msg_release(&m);
      }
      cm_unary_release(&calls[i]);
    }
  }
  return rc;
}

int psd_ctl_export(const struct cm_spec *spec, const struct psd_ctl_opts *o) {
  Psd__V1__StatusResponse **st = calloc(spec->nps, sizeof *st);
  struct cm_channel **ch = NULL;
  struct evar *vars = NULL;
  struct cm_st_desc *desc = NULL;
  struct cm_st_writer *w = NULL;
  char tmp[4200], err[4096], *buf = malloc(CHUNK_BYTES);
  char nshards[16], step[32], size[32];
  double t0 = cm_mono_ms();
  uint64_t values = 0;
  int n, nt = 0, fd = -1, rc = 1;

  snprintf(tmp, sizeof tmp, "%s.tmp-%d", o->out, (int)getpid());
  if (!st || !buf || open_channels(spec, &ch)) {
    fprintf(stderr, "psctl: out of memory\n");
    goto out;
  }
  if (statuses(spec, ch, o->timeout_ms, st)) {
    fprintf(stderr, "psctl: cannot export without every shard\n");
    goto out;
  }
  if ((n = gather(spec, st, &vars)) < 0)
    goto out;
  if (o->slots) {
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
    for (int i = 0; o->slots && i < vars[k].nslots; i++)
      desc[nt++] = (struct cm_st_desc){vars[k].slot_names[i], vars[k].ndim,
                                       vars[k].shape};
  }
  snprintf(nshards, sizeof nshards, "%d", spec->nps);
  snprintf(step, sizeof step, "%llu", (unsigned long long)st[0]->step);
  struct cm_st_meta meta[] = {{"format", "psd-export-1"},
                              {"job", spec->job.name},
                              {"mode", st[0]->mode},
                              {"shards", nshards},
                              {"step", step}};
  fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    fprintf(stderr, "psctl: cannot create %s: %s\n", tmp, strerror(errno));
    goto out;
  }
  if (cm_st_writer_new(&w, fd, o->out, desc, nt, meta,
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
    for (int slot = -1; slot < (o->slots ? e->nslots : 0); slot++)
      for (int p = 0; p < e->nparts; p++) {
        const struct part *pt = &e->parts[p];
        if (pull_part(ch[pt->shard], spec, e->name,
                      (uint64_t)pt->row_begin * row,
                      (uint64_t)(pt->row_end - pt->row_begin) * row, slot,
                      o->timeout_ms, w, buf, err, sizeof err)) {
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
  if (rename(tmp, o->out) != 0) {
    fprintf(stderr, "psctl: cannot rename %s to %s: %s\n", tmp, o->out,
            strerror(errno));
    goto out;
  }
  double ms = cm_mono_ms() - t0;
  uint64_t bytes = cm_st_writer_size(w);
  cm_fmt_bytes((double)bytes, size, sizeof size);
  if (o->json) {
    json_t *root = json_pack("{s:s, s:i, s:i, s:I, s:I, s:b, s:f}", "out",
                             o->out, "variables", n, "shards", spec->nps,
                             "values", (json_int_t)values, "bytes",
                             (json_int_t)bytes, "slots", o->slots, "ms", ms);
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    printf("%s\n", text);
    free(text);
    json_decref(root);
  } else {
    printf("exported %d variables (%llu values%s) from %d shards to %s: %s "
           "in %.0f ms\n",
           n, (unsigned long long)values,
           o->slots ? ", with their optimizer slots" : "", spec->nps, o->out,
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
    if (st[s])
      psd__v1__status_response__free_unpacked(st[s], NULL);
  free(st);
  free(buf);
  close_channels(spec, ch);
  return rc;
}

void psd_ctl_print_checkpoints(const struct cm_spec *spec, json_t **st) {
  int on = 0;
  for (int s = 0; s < spec->nps; s++) {
    const char *dir = st[s] ? json_string_value(json_object_get(
                                  json_object_get(st[s], "checkpoint"), "dir"))
                            : NULL;
    on |= dir && dir[0];
  }
  if (!on) {
    printf("\nCHECKPOINTS off: no checkpoint dir (set job.checkpoint.dir, "
           "--checkpoint-dir or STATE_DIRECTORY)\n");
    return;
  }
  printf("\n%-6s %10s %10s %9s %7s %6s  %s\n", "SHARD", "CKPT STEP", "SIZE",
         "TIME", "WRITTEN", "FAILED", "LAST");
  for (int s = 0; s < spec->nps; s++) {
    json_t *k = st[s] ? json_object_get(st[s], "checkpoint") : NULL;
    const char *dir = json_string_value(json_object_get(k, "dir"));
    const char *path = json_string_value(json_object_get(k, "path"));
    const char *error = json_string_value(json_object_get(k, "error"));
    char size[32], ms[32];
    if (!k || !dir || !dir[0]) {
      printf("ps:%-3d %10s\n", s, st[s] ? "off" : "down");
      continue;
    }
    cm_fmt_bytes((double)json_integer_value(json_object_get(k, "bytes")), size,
                 sizeof size);
    snprintf(ms, sizeof ms, "%.0f ms",
             json_real_value(json_object_get(k, "ms")));
    int any = path && path[0];
    printf("ps:%-3d %10lld %10s %9s %7lld %6lld  %s%s%s\n", s,
           json_integer_value(json_object_get(k, "step")), any ? size : "-",
           any ? ms : "-", json_integer_value(json_object_get(k, "written")),
           json_integer_value(json_object_get(k, "failed")),
           error && error[0] ? "LAST WRITE FAILED: " : "",
           error && error[0] ? error
           : any             ? path
                             : "none yet in ",
           error && error[0] ? ""
           : any             ? ""
                             : dir);
  }
}
