/* psd.v1.Data and psd.v1.Admin handlers (service.h). Each handler checks
 * the whole request before changing anything, so a rejected push applies
 * nothing. Bulk bytes are read in place from the received slices (wire.h):
 * one copy into a scratch buffer on push, one copy out of the variable on
 * pull. */
#include "service.h"

#include <pthread.h>

#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "coord.h"
#include "dedup.h"
#include "err.h"
#include "finite.h"
#include "hist.h"
#include "log.h"
#include "ps.pb-c.h"
#include "request.h"
#include "saver.h"
#include "shard.h"
#include "steps.h"
#include "units.h"
#include "wire.h"

/* Errors logged in full before the log only samples them. */
#define LOGGED_ERRORS 50

struct psd_service {
  struct psd_store *store;         /* borrowed */
  int shard;                       /* this shard's index */
  int nshards;                     /* shards in the job */
  int nworkers;                    /* workers in the job: valid indices */
  struct psd_limits limits;        /* what requests may ask (service.h) */
  int held_is_memory;              /* limits.max_held is the machine's RAM */
  char job[64];                    /* job name callers must use */
  struct cm_request_host host;     /* how requests are taken and refused */
  char mode[16];                   /* "async" */
  struct timespec started;         /* for uptime */
  struct cm_rpc_method methods[6]; /* what psd serves */
  struct psd_steps *steps;         /* owned, sync mode */
  struct psd_coord *coord;         /* borrowed, shard 0 only (status) */
  struct cm_server *rpc;           /* borrowed: its refusal count (status) */
  struct psd_saver *saver;         /* borrowed: step counts, commit gate */
  pthread_mutex_t park_lock;       /* guards parked and nparked */
  struct parked_pull *parked;      /* pulls waiting for a version */
  int nparked;                     /* entries in parked */
  atomic_uint_fast64_t pulls;      /* pull calls answered */
  atomic_uint_fast64_t pushes;     /* push calls applied */
  atomic_uint_fast64_t examples;   /* examples behind applied pushes */
  atomic_uint_fast64_t bytes_in;   /* gradient bytes applied */
  atomic_uint_fast64_t bytes_out;  /* value bytes sent */
  atomic_uint_fast64_t errors;     /* calls answered with an error */
  atomic_uint_fast64_t updates;    /* async: worker steps applied (pushes
                                      carrying a batch's examples) */
  atomic_uint_fast64_t nonfinite;  /* pushes with NaN or Inf, whatever
                                      job.nonfinite did with them */
  struct psd_hist push_time;       /* push handling, decode to reply */
  struct psd_hist pull_time;       /* pull handling, a parked wait excluded */
  struct psd_dedup *dedup;         /* owned: push messages applied, per
                                      client (retries are not applied twice) */
};

/* A pull waiting for the shard to commit min_version steps. */
struct parked_pull {
  struct cm_rpc_call *call;  /* answered once the version exists */
  Psd__V1__PullRequest *req; /* owned, unpacked request */
  struct parked_pull *next;  /* list link */
};

/* Answers a refused call, logging it (cm_request_host's refuse hook). */
static void refuse(void *ctx, struct cm_rpc_call *call, grpc_status_code code,
                   const char *msg) {
  struct psd_service *svc = ctx;
  if (code == GRPC_STATUS_ABORTED) {
    /* A sync gradient that came after its step closed: routine, not an
     * error (the coordinator counts the drop). */
    cm_debug("%s from %s: %s", cm_rpc_status_name(code), cm_rpc_peer(call),
             msg);
    cm_rpc_fail(call, code, "%s", msg);
    return;
  }
  uint64_t n = atomic_fetch_add(&svc->errors, 1) + 1;
  if (n <= LOGGED_ERRORS || n % 1000 == 0)
    cm_warn("%s from %s: %s%s", cm_rpc_status_name(code), cm_rpc_peer(call),
            msg, n == LOGGED_ERRORS ? " (further errors are sampled)" : "");
  cm_rpc_fail(call, code, "%s", msg);
}

/* Refuses a call with a formatted message, logged and counted. */
#define fail(svc, call, code, ...)                                             \
  cm_request_refuse(&(svc)->host, call, code, __VA_ARGS__)

/* Checks a variable name sent in a request: 1..PSD_VAR_MAX_NAME bytes, no
 * control characters (names end up in logs, tables and checkpoint files).
 * Returns 0 or answers the call and returns -1. */
static int check_name(struct psd_service *svc, struct cm_rpc_call *call,
                      const char *name, const char *what, size_t i) {
  size_t n = strlen(name);
  if (n == 0 || n > PSD_VAR_MAX_NAME) {
    fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
         "%s: %s %zu: the variable name is %zu bytes long; expected 1..%d",
         what, strcmp(what, "Declare") ? "segment" : "variable", i, n,
         PSD_VAR_MAX_NAME);
    return -1;
  }
  for (size_t k = 0; k < n; k++) {
    unsigned char c = (unsigned char)name[k];
    if (c < 0x20 || c == 0x7f) {
      fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
           "%s: %s %zu: the variable name has a control character (0x%02x) "
           "at byte %zu",
           what, strcmp(what, "Declare") ? "segment" : "variable", i, c, k);
      return -1;
    }
  }
  return 0;
}

/* Checks the number of segments of a pull or push; returns 0 or answers the
 * call and returns -1. */
static int check_segment_count(struct psd_service *svc,
                               struct cm_rpc_call *call, size_t n,
                               const char *what) {
  if (n <= PSD_MAX_SEGMENTS)
    return 0;
  fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
       "%s: %zu segments in one request; at most %d", what, n,
       PSD_MAX_SEGMENTS);
  return -1;
}

/* Finds a segment's variable and checks its element range against this
 * shard's rows. Returns the variable or answers the call and returns NULL. */
static struct psd_var *segment_var(struct psd_service *svc,
                                   struct cm_rpc_call *call,
                                   const Psd__V1__Segment *seg, size_t i,
                                   const char *what) {
  struct psd_var *v;
  if (check_name(svc, call, seg->name, what, i))
    return NULL;
  if (!(v = psd_store_find(svc->store, seg->name))) {
    fail(svc, call, GRPC_STATUS_NOT_FOUND,
         "%s: no variable '%s' on shard %d (declare it first)", what, seg->name,
         svc->shard);
    return NULL;
  }
  if (seg->count == 0) {
    fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
         "%s of '%s': segment %zu has count 0; expected at least one element",
         what, v->name, i);
    return NULL;
  }
  if (seg->offset < v->elem_begin || seg->offset > v->elem_end ||
      seg->count > v->elem_end - seg->offset) {
    char end[48];
    /* offset + count may not even fit in 64 bits. */
    if (seg->count > UINT64_MAX - seg->offset)
      snprintf(end, sizeof end, "%llu + %llu", (unsigned long long)seg->offset,
               (unsigned long long)seg->count);
    else
      snprintf(end, sizeof end, "%llu",
               (unsigned long long)(seg->offset + seg->count));
    fail(svc, call, GRPC_STATUS_OUT_OF_RANGE,
         "%s of '%s' elements [%llu, %s) is outside shard %d's slice, "
         "elements [%llu, %llu) (rows [%lld, %lld))",
         what, v->name, (unsigned long long)seg->offset, end, svc->shard,
         (unsigned long long)v->elem_begin, (unsigned long long)v->elem_end,
         (long long)v->row_begin, (long long)v->row_end);
    return NULL;
  }
  return v;
}

/* Memory the kernel says it can give without swapping (MemAvailable), in
 * bytes; UINT64_MAX when it cannot be read. */
static uint64_t mem_available(void) {
  char line[256];
  unsigned long long kib;
  uint64_t bytes = UINT64_MAX;
  FILE *f = fopen("/proc/meminfo", "r");
  if (!f)
    return bytes;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) {
      bytes = (uint64_t)kib * 1024;
      break;
    }
  fclose(f);
  return bytes;
}

/* Orders positions in a Declare's vars by name (qsort_r context). */
static int cmp_spec_name(const void *a, const void *b, void *ctx) {
  Psd__V1__VarSpec **vars = ctx;
  return strcmp(vars[*(const size_t *)a]->name, vars[*(const size_t *)b]->name);
}

/* Whether two declarations of one name agree. */
static int same_spec(const Psd__V1__VarSpec *a, const Psd__V1__VarSpec *b) {
  if (a->n_shape != b->n_shape || a->placement != b->placement)
    return 0;
  for (size_t d = 0; d < a->n_shape; d++)
    if (a->shape[d] != b->shape[d])
      return 0;
  return 1;
}

/* Checks every variable of a Declare before any is created: name, shape,
 * placement, init, a name given twice with different settings, and the
 * memory the new ones need here. Returns 0 or answers the call and returns
 * -1, so a refused Declare creates nothing. */
static int check_declare(struct psd_service *svc, struct cm_rpc_call *call,
                         const Psd__V1__DeclareRequest *req) {
  char shape[128], a[32], b[32], c[32];
  uint64_t need = 0, held = 0;
  size_t *order = NULL;
  int nnew = 0, rc = -1;

  if (req->n_vars > PSD_MAX_VARS) {
    fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
         "Declare: %zu variables in one request; at most %d", req->n_vars,
         PSD_MAX_VARS);
    return -1;
  }
  for (size_t i = 0; i < req->n_vars; i++) {
    const Psd__V1__VarSpec *vs = req->vars[i];
    uint64_t numel = 1, row_elems = 1;
    int64_t rb, re;
    if (check_name(svc, call, vs->name, "Declare", i))
      goto out;
    if (vs->n_shape < 1 || vs->n_shape > PSD_VAR_MAX_DIMS) {
      fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
           "Declare '%s': the shape has %zu dimensions; expected 1..%d",
           vs->name, vs->n_shape, PSD_VAR_MAX_DIMS);
      goto out;
    }
    psd_shape_format((int)vs->n_shape, vs->shape, shape, sizeof shape);
    for (size_t d = 0; d < vs->n_shape; d++) {
      if (vs->shape[d] <= 0) {
        fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
             "Declare '%s': shape %s: dimension %zu is %lld; expected a "
             "positive size",
             vs->name, shape, d, (long long)vs->shape[d]);
        goto out;
      }
      /* numel * shape[d] <= 2^40 without overflowing. */
      if ((uint64_t)vs->shape[d] > PSD_VAR_MAX_ELEMS / numel) {
        fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
             "Declare '%s': shape %s has more than 2^40 elements, the most a "
             "variable may have",
             vs->name, shape);
        goto out;
      }
      numel *= (uint64_t)vs->shape[d];
      if (d > 0)
        row_elems *= (uint64_t)vs->shape[d];
    }
    if (vs->placement < -1 || vs->placement >= svc->nshards) {
      fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
           "Declare '%s': placement %d; expected -1 (split) or a shard index "
           "0..%d",
           vs->name, vs->placement, svc->nshards - 1);
      goto out;
    }
    if (vs->init != PSD__V1__INIT__INIT_ZEROS &&
        vs->init != PSD__V1__INIT__INIT_UNIFORM) {
      fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
           "Declare '%s': init %d is not an Init value (0 zeros, 1 uniform)",
           vs->name, (int)vs->init);
      goto out;
    }
    if (!isfinite(vs->init_scale) || vs->init_scale < 0) {
      fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
           "Declare '%s': init_scale %g; expected a finite number >= 0",
           vs->name, vs->init_scale);
      goto out;
    }
    if (psd_store_find(svc->store, vs->name))
      continue; /* psd_store_declare compares it with what exists */
    cm_shard_rows(vs->shape[0], vs->placement, svc->nshards, svc->shard, &rb,
                  &re);
    need += (uint64_t)(re - rb) * row_elems *
            psd_store_elem_bytes(svc->store, vs->name);
    nnew++;
  }
  /* A name given twice must mean the same variable. */
  if (req->n_vars > 1) {
    if (!(order = malloc(req->n_vars * sizeof *order))) {
      fail(svc, call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
      goto out;
    }
    for (size_t i = 0; i < req->n_vars; i++)
      order[i] = i;
    qsort_r(order, req->n_vars, sizeof *order, cmp_spec_name, req->vars);
    for (size_t i = 1; i < req->n_vars; i++) {
      const Psd__V1__VarSpec *x = req->vars[order[i - 1]],
                             *y = req->vars[order[i]];
      if (strcmp(x->name, y->name) == 0 && !same_spec(x, y)) {
        fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
             "Declare: '%s' is declared twice in one request with different "
             "shapes or placements",
             x->name);
        goto out;
      }
    }
  }
  int nvars = psd_store_count(svc->store);
  if (nnew > PSD_MAX_VARS - nvars) {
    fail(svc, call, GRPC_STATUS_RESOURCE_EXHAUSTED,
         "Declare: shard %d holds %d variables; %d more would pass the limit "
         "of %d",
         svc->shard, nvars, nnew, PSD_MAX_VARS);
    goto out;
  }
  for (int i = 0; i < nvars; i++)
    held += psd_var_bytes(svc->store, psd_store_at(svc->store, i));
  if (need > svc->limits.max_held || held > svc->limits.max_held - need) {
    fail(svc, call, GRPC_STATUS_RESOURCE_EXHAUSTED,
         "Declare: the new variables need %s on shard %d (values and "
         "optimizer slots), which holds %s already; its limit is %s%s",
         cm_fmt_bytes((double)need, a, sizeof a), svc->shard,
         cm_fmt_bytes((double)held, b, sizeof b),
         cm_fmt_bytes((double)svc->limits.max_held, c, sizeof c),
         svc->held_is_memory ? " (this machine's memory)" : "");
    goto out;
  }
  /* Memory is taken lazily and touched by the initial values: a variable
   * that fits the machine but not what is free now would be killed, not
   * refused. */
  uint64_t avail = mem_available();
  if (need > avail) {
    fail(svc, call, GRPC_STATUS_RESOURCE_EXHAUSTED,
         "Declare: the new variables need %s on shard %d (values and "
         "optimizer slots), but this machine has %s of memory available",
         cm_fmt_bytes((double)need, a, sizeof a), svc->shard,
         cm_fmt_bytes((double)avail, b, sizeof b));
    goto out;
  }
  rc = 0;
out:
  free(order);
  return rc;
}

static void on_declare(struct cm_rpc_call *call, grpc_byte_buffer *bb,
                       void *ctx) {
  struct psd_service *svc = ctx;
  struct cm_wire_msg m;
  Psd__V1__DeclareRequest *req = NULL;
  Psd__V1__DeclareResponse resp = PSD__V1__DECLARE_RESPONSE__INIT;
  Psd__V1__VarSlice *slices = NULL, **ptrs = NULL;
  char err[512];

  req = (Psd__V1__DeclareRequest *)cm_request_open(
      &svc->host, call, bb, &psd__v1__declare_request__descriptor, "Declare",
      &m);
  if (!req || check_declare(svc, call, req))
    goto out;
  slices = calloc(req->n_vars + 1, sizeof *slices);
  ptrs = calloc(req->n_vars + 1, sizeof *ptrs);
  if (!slices || !ptrs) {
    fail(svc, call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    goto out;
  }
  for (size_t i = 0; i < req->n_vars; i++) {
    const Psd__V1__VarSpec *vs = req->vars[i];
    struct psd_var *v;
    int created = 0, rc;
    rc = psd_store_declare(
        svc->store, vs->name, (int)vs->n_shape, vs->shape, vs->placement,
        vs->init == PSD__V1__INIT__INIT_UNIFORM ? PSD_INIT_UNIFORM
                                                : PSD_INIT_ZEROS,
        vs->init_scale, vs->seed, &v, &created, err, sizeof err);
    if (rc) {
      fail(svc, call,
           rc == CM_EEXIST   ? GRPC_STATUS_ALREADY_EXISTS
           : rc == CM_ENOMEM ? GRPC_STATUS_RESOURCE_EXHAUSTED
                             : GRPC_STATUS_INVALID_ARGUMENT,
           "%s", err);
      goto out;
    }
    if (created) {
      char shape[128];
      const char *who =
          req->caller && req->caller->worker ? req->caller->worker : "?";
      psd_shape_format(v->ndim, v->shape, shape, sizeof shape);
      if (v->row_end > v->row_begin)
        cm_info("created '%s' %s: rows [%lld, %lld) here (declared by %.64s)",
                v->name, shape, (long long)v->row_begin, (long long)v->row_end,
                who);
      else
        cm_info("created '%s' %s: no rows here, %s (declared by %.64s)",
                v->name, shape,
                v->placement >= 0 ? "placed whole on another shard"
                                  : "more shards than rows",
                who);
    }
    psd__v1__var_slice__init(&slices[i]);
    slices[i].name = v->name;
    slices[i].row_begin = v->row_begin;
    slices[i].row_end = v->row_end;
    slices[i].created = created;
    ptrs[i] = &slices[i];
  }
  resp.n_slices = req->n_vars;
  resp.slices = ptrs;
  cm_rpc_reply(call, cm_rpc_pack(&resp.base));
out:
  free(slices);
  free(ptrs);
  cm_request_free((ProtobufCMessage *)req);
  cm_wire_msg_release(&m);
}

static void release_free(void *p) { free(p); }

/* Answers a pull whose version exists; `start` (cm_mono_ms) is when its
 * handling began, for the pull histogram. */
static void answer_pull(struct psd_service *svc, struct cm_rpc_call *call,
                        const Psd__V1__PullRequest *req, double start) {
  Psd__V1__PullResponse resp = PSD__V1__PULL_RESPONSE__INIT;
  struct psd_var **vars = NULL;
  struct cm_wire_piece *pieces = NULL;
  uint64_t *versions = NULL, total = 0;
  uint8_t *data = NULL, *head = NULL;
  size_t head_len;

  vars = calloc(req->n_segments + 1, sizeof *vars);
  versions = calloc(req->n_segments + 1, sizeof *versions);
  if (!vars || !versions)
    goto nomem;
  for (size_t i = 0; i < req->n_segments; i++) {
    if (!(vars[i] = segment_var(svc, call, req->segments[i], i, "pull")))
      goto out;
    if (req->slots && req->slot >= (uint32_t)vars[i]->nslots) {
      fail(svc, call, GRPC_STATUS_FAILED_PRECONDITION,
           "pull of '%s' slot %u: its optimizer %s keeps %d", vars[i]->name,
           req->slot, vars[i]->optim_desc, vars[i]->nslots);
      goto out;
    }
    total += req->segments[i]->count * sizeof(float);
    /* The answer must fit in a message with its head (a count is at most
     * 2^40, so the sum cannot wrap before this stops it). */
    if (total > svc->limits.max_message - 4096) {
      fail(svc, call, GRPC_STATUS_RESOURCE_EXHAUSTED,
           "pull asks for more than %llu bytes in one message (job."
           "max_message_mb less a head); split it into chunks",
           (unsigned long long)(svc->limits.max_message - 4096));
      goto out;
    }
  }
  if (svc->steps)
    resp.step = psd_steps_version(svc->steps);
  if (!svc->steps) {
    /* Async: send straight from the variables' memory, no copy. A push
     * may land while gRPC writes it, as it could between two pulls: async
     * training reads whatever values are current (floats are never torn).
     * Variables live until the server has stopped. */
    if (!(pieces = calloc(req->n_segments + 1, sizeof *pieces)))
      goto nomem;
    for (size_t i = 0; i < req->n_segments; i++) {
      const Psd__V1__Segment *seg = req->segments[i];
      struct psd_var *v = vars[i];
      pthread_mutex_lock(&v->lock);
      versions[i] = v->version;
      pthread_mutex_unlock(&v->lock);
      pieces[i].ptr =
          (const uint8_t *)((req->slots ? v->slots[req->slot] : v->value) +
                            (seg->offset - v->elem_begin));
      pieces[i].len = seg->count * sizeof(float);
    }
  } else {
    /* Sync: one copy, so a chunk is exactly the version it says. */
    if (!(data = malloc(total ? total : 1)) ||
        !(pieces = calloc(1, sizeof *pieces)))
      goto nomem;
    uint8_t *p = data;
    for (size_t i = 0; i < req->n_segments; i++) {
      const Psd__V1__Segment *seg = req->segments[i];
      struct psd_var *v = vars[i];
      pthread_mutex_lock(&v->lock);
      memcpy(p,
             (req->slots ? v->slots[req->slot] : v->value) +
                 (seg->offset - v->elem_begin),
             seg->count * sizeof(float));
      versions[i] = v->version;
      pthread_mutex_unlock(&v->lock);
      p += seg->count * sizeof(float);
    }
    pieces[0] = (struct cm_wire_piece){data, total};
  }
  resp.n_versions = req->n_segments;
  resp.versions = versions;
  head_len = protobuf_c_message_get_packed_size(&resp.base);
  if (!(head = malloc(head_len + 1)))
    goto nomem;
  protobuf_c_message_pack(&resp.base, head);
  {
    grpc_byte_buffer *out =
        data ? cm_wire_build(head, head_len, pieces, 1, release_free, data)
             : cm_wire_build(head, head_len, pieces, (int)req->n_segments, NULL,
                             NULL);
    data = NULL; /* the slice owns it now */
    atomic_fetch_add(&svc->pulls, 1);
    atomic_fetch_add(&svc->bytes_out, total);
    cm_rpc_reply(call, out);
    psd_hist_observe(&svc->pull_time, (cm_mono_ms() - start) / 1e3);
  }
  goto out;
nomem:
  fail(svc, call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
out:
  free(head);
  free(data);
  free(pieces);
  free(vars);
  free(versions);
}

/* Answers a sync pull of a generation the job has rolled back from: no
 * data, the step to pull again and the generation. */
static void answer_rolled_back(struct psd_service *svc,
                               struct cm_rpc_call *call) {
  Psd__V1__PullResponse r = PSD__V1__PULL_RESPONSE__INIT;
  struct psd_steps_state st;
  psd_steps_state(svc->steps, &st);
  r.gen = st.gen;
  r.rollback_step = st.rollback_step;
  r.rolled_back = 1;
  r.step = st.version;
  cm_rpc_reply(call, cm_rpc_pack(&r.base));
}

/* Answers a sync push of a generation the job has rolled back from: nothing
 * was staged; the step to go on from and the generation. */
static void answer_push_rolled_back(struct cm_rpc_call *call,
                                    const struct psd_steps_state *st) {
  Psd__V1__PushResponse r = PSD__V1__PUSH_RESPONSE__INIT;
  r.rolled_back = 1;
  r.rollback_step = st->rollback_step;
  r.gen = st->gen;
  cm_rpc_reply(call, cm_rpc_pack(&r.base));
}

static void on_pull(struct cm_rpc_call *call, grpc_byte_buffer *bb, void *ctx) {
  struct psd_service *svc = ctx;
  double start = cm_mono_ms();
  struct cm_wire_msg m;
  Psd__V1__PullRequest *req = (Psd__V1__PullRequest *)cm_request_open(
      &svc->host, call, bb, &psd__v1__pull_request__descriptor, "Pull", &m);
  cm_wire_msg_release(&m);
  if (!req || check_segment_count(svc, call, req->n_segments, "Pull"))
    goto out;
  if (req->min_version > 0 && svc->steps) {
    /* Park it under the lock that commits drain, so none is missed. */
    struct psd_steps_state st;
    uint64_t version, gen;
    int full = 0, resumed;
    pthread_mutex_lock(&svc->park_lock);
    psd_steps_state(svc->steps, &st);
    version = st.version;
    gen = st.gen;
    resumed = st.resumed;
    /* A pull of an older generation asks for steps the job rolled back:
     * it is told so, without data. */
    if (req->gen < gen) {
      pthread_mutex_unlock(&svc->park_lock);
      answer_rolled_back(svc, call);
      goto out;
    }
    /* A worker pulls for the step after the last one closed, whose commit
     * may still be on its way here: one ahead at most. Further ahead would
     * wait for steps that cannot close without this shard; one that
     * restarted from an older checkpoint waits for the coordinator's
     * rollback (the pull is retried). A newer generation's pull waits for
     * this shard's rollback, parked. */
    if (version + 1 < req->min_version && req->gen == gen) {
      pthread_mutex_unlock(&svc->park_lock);
      fail(svc, call,
           resumed ? GRPC_STATUS_UNAVAILABLE : GRPC_STATUS_FAILED_PRECONDITION,
           "Pull: version %llu asked for, but shard %d has committed %llu "
           "steps; a worker pulls at most one step ahead (did this shard "
           "restart alone, or the worker come from another run?)",
           (unsigned long long)req->min_version, svc->shard,
           (unsigned long long)version);
      goto out;
    }
    if (version < req->min_version || req->gen > gen) {
      struct parked_pull *p = NULL;
      if (svc->nparked >= PSD_MAX_PARKED)
        full = 1;
      else if (!(p = calloc(1, sizeof *p)))
        full = 2;
      if (p) {
        *p = (struct parked_pull){call, req, svc->parked};
        svc->parked = p;
        svc->nparked++;
        req = NULL;
        call = NULL;
      }
    }
    pthread_mutex_unlock(&svc->park_lock);
    if (full) {
      if (full == 2)
        fail(svc, call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
      else
        fail(svc, call, GRPC_STATUS_RESOURCE_EXHAUSTED,
             "Pull: %d pulls already wait for a step on shard %d; no more "
             "are parked",
             PSD_MAX_PARKED, svc->shard);
      goto out;
    }
    if (!call)
      goto out;
  }
  answer_pull(svc, call, req, start);
out:
  cm_request_free((ProtobufCMessage *)req);
}

/* Answers the parked pulls whose version now exists (or all of them, with
 * UNAVAILABLE, when psd stops). */
static void release_parked(struct psd_service *svc, int stopping) {
  struct parked_pull *ready = NULL;
  pthread_mutex_lock(&svc->park_lock);
  struct psd_steps_state st = {0};
  if (svc->steps)
    psd_steps_state(svc->steps, &st);
  uint64_t version = st.version, gen = st.gen;
  for (struct parked_pull **pp = &svc->parked; *pp;) {
    struct parked_pull *p = *pp;
    if (stopping || p->req->gen < gen ||
        (p->req->gen == gen && p->req->min_version <= version)) {
      *pp = p->next;
      p->next = ready;
      ready = p;
      svc->nparked--;
    } else {
      pp = &p->next;
    }
  }
  pthread_mutex_unlock(&svc->park_lock);
  while (ready) {
    struct parked_pull *p = ready;
    ready = p->next;
    if (stopping)
      cm_rpc_fail(p->call, GRPC_STATUS_UNAVAILABLE, "psd is shutting down");
    else if (p->req->gen < gen)
      answer_rolled_back(svc, p->call);
    else
      answer_pull(svc, p->call, p->req, cm_mono_ms());
    cm_request_free(&p->req->base);
    free(p);
  }
}

/* Checks a Commit's sets: worker indices in range, none listed twice, none
 * both applied and dropped. Returns 0 or answers the call and returns -1. */
static int check_commit_sets(struct psd_service *svc, struct cm_rpc_call *call,
                             const Psd__V1__CommitRequest *req) {
  /* 1: applied, 2: dropped, per worker */
  unsigned char seen[PSD_STEPS_MAX_WORKERS] = {0};
  const struct {
    const char *name; /* the field */
    size_t n;         /* entries */
    const int32_t *w; /* worker indices */
  } sets[2] = {{"applied", req->n_applied, req->applied},
               {"dropped", req->n_dropped, req->dropped}};

  for (int k = 0; k < 2; k++) {
    if (sets[k].n > (size_t)svc->nworkers) {
      fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
           "Commit of step %llu: %zu workers in %s; the job has %d",
           (unsigned long long)req->step, sets[k].n, sets[k].name,
           svc->nworkers);
      return -1;
    }
    for (size_t i = 0; i < sets[k].n; i++) {
      int32_t w = sets[k].w[i];
      if (w < 0 || w >= svc->nworkers) {
        fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
             "Commit of step %llu: worker %d in %s is out of range; "
             "cluster.worker has %d entries",
             (unsigned long long)req->step, w, sets[k].name, svc->nworkers);
        return -1;
      }
      if (seen[w]) {
        fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
             "Commit of step %llu: worker %d is listed %s",
             (unsigned long long)req->step, w,
             seen[w] == k + 1 ? (k ? "twice in dropped" : "twice in applied")
                              : "both in applied and in dropped");
        return -1;
      }
      seen[w] = (unsigned char)(k + 1);
    }
  }
  return 0;
}

static void on_commit(struct cm_rpc_call *call, grpc_byte_buffer *bb,
                      void *ctx) {
  struct psd_service *svc = ctx;
  struct cm_wire_msg m;
  Psd__V1__CommitRequest *req = (Psd__V1__CommitRequest *)cm_request_open(
      &svc->host, call, bb, &psd__v1__commit_request__descriptor, "Commit", &m);
  int applied[PSD_STEPS_MAX_WORKERS], dropped[PSD_STEPS_MAX_WORKERS];
  char err[256];
  cm_wire_msg_release(&m);
  if (!req)
    goto out;
  if (!svc->steps) {
    fail(svc, call, GRPC_STATUS_FAILED_PRECONDITION,
         "Commit: shard %d runs an asynchronous job", svc->shard);
    goto out;
  }
  if (check_commit_sets(svc, call, req))
    goto out;
  for (size_t i = 0; i < req->n_applied; i++)
    applied[i] = req->applied[i];
  for (size_t i = 0; i < req->n_dropped; i++)
    dropped[i] = req->dropped[i];
  /* A checkpoint being written holds the commit (saver.h). */
  if (svc->saver)
    psd_saver_commit_begin(svc->saver);
  int rc = psd_steps_commit(svc->steps, req->step, applied, (int)req->n_applied,
                            dropped, (int)req->n_dropped, err, sizeof err);
  if (svc->saver)
    psd_saver_commit_end(svc->saver, psd_steps_version(svc->steps));
  if (rc) {
    /* Shards resumed from different checkpoints cannot go on together. */
    fail(svc, call, GRPC_STATUS_FAILED_PRECONDITION, "%s%s", err,
         req->step != psd_steps_version(svc->steps)
             ? "; did the shards resume from different checkpoints? restart "
               "every shard with --resume-step N, N the newest step all of "
               "them have"
             : "");
    goto out;
  }
  {
    Psd__V1__CommitResponse r = PSD__V1__COMMIT_RESPONSE__INIT;
    r.version = psd_steps_version(svc->steps);
    cm_rpc_reply(call, cm_rpc_pack(&r.base));
  }
  release_parked(svc, 0);
out:
  cm_request_free((ProtobufCMessage *)req);
}

/* Sync: the coordinator rolls the job back to a step (saver.h,
 * psd_saver_rollback): this shard reloads its checkpoint of that step in
 * place and drops every staged gradient; the pulls parked for steps of the
 * old generation are told. */
static void on_rollback(struct cm_rpc_call *call, grpc_byte_buffer *bb,
                        void *ctx) {
  struct psd_service *svc = ctx;
  struct cm_wire_msg m;
  Psd__V1__RollbackRequest *req = (Psd__V1__RollbackRequest *)cm_request_open(
      &svc->host, call, bb, &psd__v1__rollback_request__descriptor, "Rollback",
      &m);
  char err[4096];
  cm_wire_msg_release(&m);
  if (!req)
    goto out;
  if (!svc->steps) {
    fail(svc, call, GRPC_STATUS_FAILED_PRECONDITION,
         "Rollback: shard %d runs an asynchronous job", svc->shard);
    goto out;
  }
  struct psd_steps_state st;
  psd_steps_state(svc->steps, &st);
  uint64_t gen = st.gen;
  if (gen >= req->gen && st.version == req->step) {
    /* A retry whose answer was lost. */
  } else if (gen >= req->gen) {
    /* A generation never goes back: a stale or forged call. */
    fail(svc, call, GRPC_STATUS_FAILED_PRECONDITION,
         "Rollback to step %llu in generation %llu: shard %d is at "
         "generation %llu already",
         (unsigned long long)req->step, (unsigned long long)req->gen,
         svc->shard, (unsigned long long)gen);
    goto out;
  } else if (!svc->saver || psd_saver_rollback(svc->saver, req->step, req->gen,
                                               err, sizeof err)) {
    fail(svc, call, GRPC_STATUS_FAILED_PRECONDITION,
         "Rollback to step %llu: shard %d cannot: %s",
         (unsigned long long)req->step, svc->shard,
         svc->saver ? err : "it keeps no checkpoints");
    goto out;
  }
  {
    Psd__V1__RollbackResponse r = PSD__V1__ROLLBACK_RESPONSE__INIT;
    r.version = psd_steps_version(svc->steps);
    cm_rpc_reply(call, cm_rpc_pack(&r.base));
  }
  release_parked(svc, 0);
out:
  cm_request_free((ProtobufCMessage *)req);
}

void psd_service_stop(struct psd_service *svc) { release_parked(svc, 1); }

/* One segment of a push, for the overlap check. */
struct span {
  int var;        /* the variable's position in the store */
  uint64_t begin; /* first element */
  uint64_t end;   /* one past the last */
  size_t seg;     /* the segment's position in the request */
};

static int cmp_span(const void *a, const void *b) {
  const struct span *x = a, *y = b;
  if (x->var != y->var)
    return x->var < y->var ? -1 : 1;
  return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* Refuses a push whose segments overlap (the same elements twice in one
 * gradient: applied twice, or one silently winning). Returns 0 or answers
 * the call and returns -1. */
static int check_overlap(struct psd_service *svc, struct cm_rpc_call *call,
                         const Psd__V1__PushRequest *req,
                         struct psd_var *const *vars) {
  struct span *sp;
  int rc = 0;
  if (req->n_segments < 2)
    return 0;
  if (!(sp = malloc(req->n_segments * sizeof *sp))) {
    fail(svc, call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    return -1;
  }
  for (size_t i = 0; i < req->n_segments; i++)
    sp[i] =
        (struct span){vars[i]->index, req->segments[i]->offset,
                      req->segments[i]->offset + req->segments[i]->count, i};
  qsort(sp, req->n_segments, sizeof *sp, cmp_span);
  for (size_t i = 1; i < req->n_segments; i++) {
    if (sp[i].var != sp[i - 1].var || sp[i].begin >= sp[i - 1].end)
      continue;
    fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
         "push to '%s': segments %zu and %zu overlap (elements [%llu, %llu) "
         "and [%llu, %llu)); a gradient gives each element once",
         vars[sp[i].seg]->name,
         sp[i - 1].seg < sp[i].seg ? sp[i - 1].seg : sp[i].seg,
         sp[i - 1].seg < sp[i].seg ? sp[i].seg : sp[i - 1].seg,
         (unsigned long long)sp[i - 1].begin, (unsigned long long)sp[i - 1].end,
         (unsigned long long)sp[i].begin, (unsigned long long)sp[i].end);
    rc = -1;
    break;
  }
  free(sp);
  return rc;
}

enum psd_nonfinite psd_nonfinite_parse(const char *name) {
  return !strcmp(name, "skip")    ? PSD_NONFINITE_SKIP
         : !strcmp(name, "apply") ? PSD_NONFINITE_APPLY
                                  : PSD_NONFINITE_REJECT;
}

const char *psd_nonfinite_name(enum psd_nonfinite n) {
  return n == PSD_NONFINITE_SKIP    ? "skip"
         : n == PSD_NONFINITE_APPLY ? "apply"
                                    : "reject";
}

/* Logs a push with NaN or Inf that was skipped or applied, sampled as
 * errors are. */
static void log_nonfinite(struct psd_service *svc, struct cm_rpc_call *call,
                          const char *what, uint64_t n) {
  if (n <= LOGGED_ERRORS || n % 1000 == 0)
    cm_warn("%s a push from %s: %s; job.nonfinite is \"%s\" (%llu such "
            "pushes so far)%s",
            svc->limits.nonfinite == PSD_NONFINITE_SKIP ? "skipped" : "applied",
            cm_rpc_peer(call), what, psd_nonfinite_name(svc->limits.nonfinite),
            (unsigned long long)n,
            n == LOGGED_ERRORS ? " (further ones are sampled)" : "");
}

static void on_push(struct cm_rpc_call *call, grpc_byte_buffer *bb, void *ctx) {
  struct psd_service *svc = ctx;
  double start = cm_mono_ms();
  struct cm_wire_msg m;
  Psd__V1__PushRequest *req = NULL;
  Psd__V1__PushResponse resp = PSD__V1__PUSH_RESPONSE__INIT;
  struct psd_var **vars = NULL;
  uint64_t *versions = NULL, total = 0;
  float *grad = NULL;
  char have[128], want[128];
  int skip = 0;
  int claimed = 0; /* this message's dedup claim is ours to give back */
  int gated = 0;   /* async: we hold the dedup table's apply gate */

  req = (Psd__V1__PushRequest *)cm_request_open(
      &svc->host, call, bb, &psd__v1__push_request__descriptor, "Push", &m);
  /* A call the client cancelled before its message arrived (its deadline
   * passed while this shard was stopped) reaches here as an empty message
   * and is refused for its missing caller like any other: the client has
   * gone, so only the errors counter sees it. */
  if (!req || check_segment_count(svc, call, req->n_segments, "Push"))
    goto out;
  /* The worker index is used in sync mode (staging) and when named. */
  if ((svc->steps || req->has_worker) &&
      (req->worker < 0 || req->worker >= svc->nworkers)) {
    fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
         "Push: worker %d out of range; cluster.worker has %d entries",
         req->worker, svc->nworkers);
    goto out;
  }
  /* Sync: a push of an older generation is for a step the job rolled back
   * (told so, nothing staged); one of a newer generation waits, retried,
   * until this shard has rolled back too. */
  if (svc->steps) {
    struct psd_steps_state st;
    psd_steps_state(svc->steps, &st);
    uint64_t gen = st.gen;
    if (req->gen < gen) {
      answer_push_rolled_back(call, &st);
      goto out;
    }
    if (req->gen > gen) {
      fail(svc, call, GRPC_STATUS_UNAVAILABLE,
           "push for step %llu of generation %llu: shard %d has not rolled "
           "back to it yet (it is at generation %llu); retry",
           (unsigned long long)req->step, (unsigned long long)req->gen,
           svc->shard, (unsigned long long)gen);
      goto out;
    }
  }
  vars = calloc(req->n_segments + 1, sizeof *vars);
  versions = calloc(req->n_segments + 1, sizeof *versions);
  if (!vars || !versions)
    goto nomem;
  /* Check everything before applying anything. */
  for (size_t i = 0; i < req->n_segments; i++) {
    const Psd__V1__Segment *seg = req->segments[i];
    struct psd_var *v;
    int same;
    if (check_name(svc, call, seg->name, "push", i))
      goto out;
    v = psd_store_find(svc->store, seg->name);
    same = v && seg->n_shape == (size_t)v->ndim;
    for (size_t d = 0; same && d < seg->n_shape; d++)
      same = seg->shape[d] == v->shape[d];
    if (v && !same) {
      psd_shape_format(v->ndim, v->shape, have, sizeof have);
      psd_shape_format(seg->n_shape > 8 ? 8 : (int)seg->n_shape, seg->shape,
                       want, sizeof want);
      fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
           "push to '%s': gradient shape %s%s does not match the variable's "
           "shape %s",
           seg->name, want, seg->n_shape > 8 ? " (and more)" : "", have);
      goto out;
    }
    if (!(vars[i] = segment_var(svc, call, seg, i, "push")))
      goto out;
    total += seg->count * sizeof(float);
    /* Stop at once when the segments ask for more than the data holds: a
     * count is at most 2^40, so the sum cannot wrap before this. */
    if (total > m.bulk_len)
      break;
  }
  if (total != m.bulk_len) {
    fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
         "push: segments describe %s%llu bytes of gradient but the data field "
         "holds %zu",
         total > m.bulk_len ? "at least " : "", (unsigned long long)total,
         m.bulk_len);
    goto out;
  }
  if (check_overlap(svc, call, req, vars))
    goto out;
  /* Async: from the claim until the values are changed, a checkpoint waits
   * (dedup.h, the apply gate), so the table it saves names exactly the
   * messages its values hold. Every push takes it, with an identity or
   * without, so that the checkpoint is one instant of the shard. */
  if (!svc->steps) {
    psd_dedup_apply_begin(svc->dedup);
    gated = 1;
  }
  /* A retry of a message applied already (its answer was lost) is
   * acknowledged and changes nothing. Claimed only once the message is known
   * good, and given back if staging refuses it. */
  if (req->client_id) {
    int d = psd_dedup_claim(svc->dedup, req->client_id, req->seq, req->chunk);
    if (d == 1) {
      if (gated) {
        psd_dedup_apply_end(svc->dedup);
        gated = 0;
      }
      cm_debug("duplicate push from %s (client %016llx, seq %llu, chunk %u): "
               "acknowledged without effect",
               cm_rpc_peer(call), (unsigned long long)req->client_id,
               (unsigned long long)req->seq, req->chunk);
      for (size_t i = 0; i < req->n_segments; i++) {
        if (svc->steps) {
          versions[i] = psd_steps_version(svc->steps);
          continue;
        }
        pthread_mutex_lock(&vars[i]->lock);
        versions[i] = vars[i]->version;
        pthread_mutex_unlock(&vars[i]->lock);
      }
      resp.n_versions = req->n_segments;
      resp.versions = versions;
      cm_rpc_reply(call, cm_rpc_pack(&resp.base));
      goto out;
    }
    claimed = d == 0;
  }
  /* One copy of the whole gradient out of the received slices, then one
   * pass over it for NaN and infinities, before anything is applied. */
  if (!(grad = malloc(total ? total : 1)))
    goto nomem;
  cm_wire_bulk_read(&m, 0, grad, total);
  {
    size_t n = total / sizeof(float), bad = cm_first_nonfinite(grad, n);
    if (bad < n) {
      char what[512];
      size_t i = 0, k = bad;
      while (k >= req->segments[i]->count)
        k -= req->segments[i++]->count;
      uint64_t n_bad = atomic_fetch_add(&svc->nonfinite, 1) + 1;
      snprintf(what, sizeof what,
               "push to '%s': gradient element %llu (segment %zu) is %s",
               vars[i]->name,
               (unsigned long long)(req->segments[i]->offset + k), i,
               isnan(grad[bad])   ? "NaN"
               : grad[bad] > 0.0f ? "+Inf"
                                  : "-Inf");
      if (svc->limits.nonfinite == PSD_NONFINITE_REJECT) {
        if (claimed) /* a retry is judged again */
          psd_dedup_unclaim(svc->dedup, req->client_id, req->seq, req->chunk);
        fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
             "%s; nothing of this push was applied (job.nonfinite is "
             "\"reject\")",
             what);
        goto out;
      }
      log_nonfinite(svc, call, what, n_bad);
      skip = svc->limits.nonfinite == PSD_NONFINITE_SKIP;
    }
  }
  {
    size_t off = 0;
    for (size_t i = 0; i < req->n_segments; i++) {
      const Psd__V1__Segment *seg = req->segments[i];
      struct psd_var *v = vars[i];
      const float *g = grad + off;
      off += seg->count;
      if (svc->steps) {
        char err[512];
        int rc = skip ? 0
                      : psd_steps_stage(svc->steps, req->worker, req->step, v,
                                        seg->offset - v->elem_begin, g,
                                        seg->count, err, sizeof err);
        if (rc) {
          struct psd_steps_state st;
          psd_steps_state(svc->steps, &st);
          if (claimed)
            psd_dedup_unclaim(svc->dedup, req->client_id, req->seq, req->chunk);
          if (st.gen > req->gen) {
            /* A rollback came in since the check above. */
            answer_push_rolled_back(call, &st);
            goto out;
          }
          /* A late gradient is ABORTED: the worker drops it and moves on. A
           * step beyond this shard's, after it restarted from an older
           * checkpoint, is retried until the coordinator rolls back. */
          fail(svc, call,
               rc == CM_ERANGE ? GRPC_STATUS_ABORTED
               : st.resumed    ? GRPC_STATUS_UNAVAILABLE
                               : GRPC_STATUS_FAILED_PRECONDITION,
               "%s", err);
          goto out;
        }
        versions[i] = psd_steps_version(svc->steps);
        continue;
      }
      pthread_mutex_lock(&v->lock);
      if (!skip) {
        psd_store_apply(svc->store, v, seg->offset - v->elem_begin, g,
                        seg->count);
        ++v->version;
      }
      versions[i] = v->version;
      pthread_mutex_unlock(&v->lock);
    }
  }
  if (gated) {
    psd_dedup_apply_end(svc->dedup);
    gated = 0;
  }
  if (!skip) {
    atomic_fetch_add(&svc->pushes, 1);
    /* A worker's step sends its examples in its first message to a shard
     * only, so this counts steps however the gradient was chunked. */
    if (!svc->steps && req->examples > 0)
      atomic_fetch_add(&svc->updates, 1);
    if (svc->saver && !svc->steps)
      psd_saver_pushed(svc->saver);
    atomic_fetch_add(&svc->examples, req->examples);
    atomic_fetch_add(&svc->bytes_in, total);
  }
  resp.n_versions = req->n_segments;
  resp.versions = versions;
  cm_rpc_reply(call, cm_rpc_pack(&resp.base));
  /* Async steps are timed at shard 0 by the pushes' first messages; sync
   * steps by their admissions (coord.c). svc->steps alone decides staging. */
  if (svc->coord && !svc->steps && req->has_worker && req->first)
    psd_coord_pushed(svc->coord, req->worker);
  psd_hist_observe(&svc->push_time, (cm_mono_ms() - start) / 1e3);
  goto out;
nomem:
  /* Not applied: neither a retry nor a checkpoint may take it for applied. */
  if (claimed)
    psd_dedup_unclaim(svc->dedup, req->client_id, req->seq, req->chunk);
  fail(svc, call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
out:
  if (gated)
    psd_dedup_apply_end(svc->dedup);
  free(grad);
  free(vars);
  free(versions);
  cm_request_free((ProtobufCMessage *)req);
  cm_wire_msg_release(&m);
}

/* Points h at counts (PSD_HIST_BOUNDS + 1 entries, borrowed until the
 * message is packed) and the shared bounds. */
static void fill_hist(Psd__V1__Histogram *h, const char *name, uint64_t *counts,
                      double sum) {
  psd__v1__histogram__init(h);
  h->name = (char *)name;
  h->n_bounds = PSD_HIST_BOUNDS;
  h->bounds = (double *)psd_hist_bounds(); /* protobuf-c only reads it */
  h->n_counts = PSD_HIST_BOUNDS + 1;
  h->counts = counts;
  h->sum = sum;
  h->count = 0;
  for (int i = 0; i <= PSD_HIST_BOUNDS; i++)
    h->count += counts[i];
}

static void on_status(struct cm_rpc_call *call, grpc_byte_buffer *bb,
                      void *ctx) {
  struct psd_service *svc = ctx;
  struct cm_wire_msg m;
  Psd__V1__StatusRequest *req = NULL;
  Psd__V1__StatusResponse resp = PSD__V1__STATUS_RESPONSE__INIT;
  Psd__V1__VarStatus *vs = NULL, **ptrs = NULL;
  char *(*slot_names)[CM_OPTIM_MAX_SLOTS] = NULL; /* static strings */
  struct psd_step_record *hist = NULL;
  Psd__V1__StepRecord *recs = NULL, **recp = NULL;
  int32_t *ids = NULL;
  struct psd_worker_info *winfo = NULL;
  Psd__V1__WorkerStatus *ws = NULL, **wsp = NULL;
  Psd__V1__CheckpointStatus ck = PSD__V1__CHECKPOINT_STATUS__INIT;
  struct psd_saver_state *sst = NULL;
  Psd__V1__Histogram *wh = NULL, sh[2], *shp[2] = {&sh[0], &sh[1]};
  uint64_t counts[2][PSD_HIST_BOUNDS + 1];
  double sums[2];
  struct timespec now;
  int n;

  req = (Psd__V1__StatusRequest *)cm_request_open(
      &svc->host, call, bb, &psd__v1__status_request__descriptor, "Status", &m);
  if (!req)
    goto out;
  n = psd_store_count(svc->store);
  vs = calloc(n + 1, sizeof *vs);
  ptrs = calloc(n + 1, sizeof *ptrs);
  slot_names = calloc(n + 1, sizeof *slot_names);
  if (!vs || !ptrs || !slot_names) {
    fail(svc, call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    goto out;
  }
  for (int i = 0; i < n; i++) {
    struct psd_var *v = psd_store_at(svc->store, i);
    psd__v1__var_status__init(&vs[i]);
    vs[i].name = v->name;
    vs[i].n_shape = v->ndim;
    vs[i].shape = v->shape;
    vs[i].row_begin = v->row_begin;
    vs[i].row_end = v->row_end;
    pthread_mutex_lock(&v->lock);
    vs[i].version = v->version;
    pthread_mutex_unlock(&v->lock);
    vs[i].bytes = psd_var_bytes(svc->store, v);
    vs[i].optimizer = v->optim_desc;
    vs[i].n_slots = v->nslots;
    vs[i].slots = slot_names[i];
    for (int k = 0; k < v->nslots; k++)
      slot_names[i][k] = (char *)cm_optim_slot_name(v->opt.type, k);
    vs[i].placement = v->placement;
    ptrs[i] = &vs[i];
  }
  clock_gettime(CLOCK_MONOTONIC, &now);
  resp.shard = svc->shard;
  resp.num_shards = svc->nshards;
  resp.job = svc->job;
  resp.mode = svc->mode;
  resp.pulls = atomic_load(&svc->pulls);
  resp.pushes = atomic_load(&svc->pushes);
  resp.examples = atomic_load(&svc->examples);
  resp.bytes_in = atomic_load(&svc->bytes_in);
  resp.bytes_out = atomic_load(&svc->bytes_out);
  resp.errors = atomic_load(&svc->errors);
  resp.unauthenticated = svc->rpc ? cm_server_unauthenticated(svc->rpc) : 0;
  resp.nonfinite_pushes = atomic_load(&svc->nonfinite);
  resp.nonfinite = (char *)psd_nonfinite_name(svc->limits.nonfinite);
  resp.max_message_bytes = svc->limits.max_message;
  resp.uptime_s = (now.tv_sec - svc->started.tv_sec) +
                  (now.tv_nsec - svc->started.tv_nsec) / 1e9;
  resp.n_vars = n;
  resp.vars = ptrs;
  psd_hist_read(&svc->push_time, counts[0], &sums[0]);
  psd_hist_read(&svc->pull_time, counts[1], &sums[1]);
  fill_hist(&sh[0], "push_seconds", counts[0], sums[0]);
  fill_hist(&sh[1], "pull_seconds", counts[1], sums[1]);
  resp.n_histograms = 2;
  resp.histograms = shp;
  {
    struct psd_dedup_stats ds;
    psd_dedup_stats(svc->dedup, &ds);
    resp.duplicates = ds.duplicates;
    resp.dedup_clients = ds.clients;
    resp.dedup_evicted = ds.evicted;
  }
  if (svc->steps) {
    struct psd_steps_state st;
    psd_steps_state(svc->steps, &st);
    resp.step = st.version;
    resp.rollbacks = st.gen;
    resp.rollback_step = st.rollback_step;
    resp.resumed = st.resumed;
    if (!(hist = malloc(PSD_STEPS_HISTORY * sizeof *hist)) ||
        !(recs = calloc(PSD_STEPS_HISTORY, sizeof *recs)) ||
        !(recp = calloc(PSD_STEPS_HISTORY, sizeof *recp)) ||
        !(ids = calloc(PSD_STEPS_HISTORY * 2 * PSD_STEPS_MAX_WORKERS,
                       sizeof *ids))) {
      fail(svc, call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
      goto out;
    }
    int nh = psd_steps_history(svc->steps, hist, PSD_STEPS_HISTORY);
    int32_t *id = ids;
    for (int i = 0; i < nh; i++) {
      psd__v1__step_record__init(&recs[i]);
      recs[i].step = hist[i].step;
      recs[i].n_applied = hist[i].napplied;
      recs[i].applied = id;
      for (int k = 0; k < hist[i].napplied; k++)
        *id++ = hist[i].applied[k];
      recs[i].n_dropped = hist[i].ndropped;
      recs[i].dropped = id;
      for (int k = 0; k < hist[i].ndropped; k++)
        *id++ = hist[i].dropped[k];
      recp[i] = &recs[i];
    }
    resp.n_steps = nh;
    resp.steps = recp;
  }
  if (svc->coord) {
    int nw = psd_coord_workers(svc->coord, NULL, 0);
    if (!(winfo = calloc(nw + 1, sizeof *winfo)) ||
        !(ws = calloc(nw + 1, sizeof *ws)) ||
        !(wsp = calloc(nw + 1, sizeof *wsp)) ||
        !(wh = calloc(nw + 1, sizeof *wh))) {
      fail(svc, call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
      goto out;
    }
    psd_coord_workers(svc->coord, winfo, nw);
    for (int i = 0; i < nw; i++) {
      psd__v1__worker_status__init(&ws[i]);
      ws[i].worker = winfo[i].worker;
      ws[i].live = winfo[i].live;
      ws[i].joined = winfo[i].joined;
      ws[i].applied = winfo[i].applied;
      ws[i].dropped = winfo[i].dropped;
      ws[i].clock = winfo[i].clock;
      ws[i].last_seen_ms = winfo[i].last_seen_ms;
      ws[i].joins = winfo[i].joins;
      ws[i].last_step = winfo[i].last_step;
      ws[i].pushes = winfo[i].pushes;
      ws[i].step_samples = winfo[i].step_samples;
      ws[i].step_p50_ms = winfo[i].step_p50_ms;
      ws[i].step_p95_ms = winfo[i].step_p95_ms;
      ws[i].lag_p50_ms = winfo[i].lag_p50_ms;
      ws[i].lag_p95_ms = winfo[i].lag_p95_ms;
      fill_hist(&wh[i], "step_seconds", winfo[i].step_counts,
                winfo[i].step_sum);
      ws[i].step_time = &wh[i];
      wsp[i] = &ws[i];
    }
    resp.n_workers = nw;
    resp.workers = wsp;
    resp.max_clock_spread = psd_coord_max_spread(svc->coord);
    resp.coordinator = 1;
  }
  if (svc->saver && (sst = malloc(sizeof *sst))) {
    psd_saver_state(svc->saver, sst);
    ck.dir = sst->dir;
    ck.written = sst->written;
    ck.failed = sst->failed;
    ck.step = sst->step;
    ck.path = sst->path;
    ck.bytes = sst->bytes;
    ck.ms = sst->ms;
    ck.error = sst->error;
    resp.checkpoint = &ck;
  }
  cm_rpc_reply(call, cm_rpc_pack(&resp.base));
out:
  free(sst);
  free(hist);
  free(recs);
  free(recp);
  free(ids);
  free(winfo);
  free(ws);
  free(wsp);
  free(wh);
  free(vs);
  free(ptrs);
  free(slot_names);
  cm_request_free((ProtobufCMessage *)req);
  cm_wire_msg_release(&m);
}

int psd_service_new(struct psd_service **out, struct psd_store *store,
                    int shard, int nshards, int nworkers, const char *job,
                    const char *mode) {
  struct psd_service *svc = calloc(1, sizeof *svc);
  if (!svc)
    return CM_ENOMEM;
  svc->store = store;
  svc->shard = shard;
  svc->nshards = nshards;
  svc->nworkers = nworkers;
  psd_service_set_limits(svc, NULL);
  snprintf(svc->job, sizeof svc->job, "%s", job);
  snprintf(svc->mode, sizeof svc->mode, "%s", mode);
  cm_request_host_init(&svc->host, svc->job, "shard", "shard %d", shard);
  svc->host.refuse = refuse;
  svc->host.ctx = svc;
  clock_gettime(CLOCK_MONOTONIC, &svc->started);
  svc->methods[0] =
      (struct cm_rpc_method){"/psd.v1.Data/Declare", on_declare, svc};
  svc->methods[1] = (struct cm_rpc_method){"/psd.v1.Data/Pull", on_pull, svc};
  svc->methods[2] = (struct cm_rpc_method){"/psd.v1.Data/Push", on_push, svc};
  svc->methods[3] =
      (struct cm_rpc_method){"/psd.v1.Admin/Status", on_status, svc};
  svc->methods[4] =
      (struct cm_rpc_method){"/psd.v1.Data/Commit", on_commit, svc};
  svc->methods[5] =
      (struct cm_rpc_method){"/psd.v1.Data/Rollback", on_rollback, svc};
  pthread_mutex_init(&svc->park_lock, NULL);
  /* Sync mode stages pushes for steps; svc->steps != NULL says so. */
  if (psd_dedup_new(&svc->dedup, PSD_DEDUP_CLIENTS) ||
      (strcmp(mode, "sync") == 0 &&
       psd_steps_new(&svc->steps, store, nworkers))) {
    psd_service_free(svc);
    return CM_ENOMEM;
  }
  *out = svc;
  return 0;
}

void psd_service_set_server(struct psd_service *svc, struct cm_server *rpc) {
  svc->rpc = rpc;
}

void psd_service_set_limits(struct psd_service *svc,
                            const struct psd_limits *l) {
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (l)
    svc->limits = *l;
  else
    svc->limits = (struct psd_limits){.max_message = CM_RPC_MAX_MESSAGE};
  if (svc->limits.max_message < CM_RPC_MIN_MESSAGE)
    svc->limits.max_message = CM_RPC_MIN_MESSAGE;
  svc->held_is_memory = !svc->limits.max_held;
  if (!svc->limits.max_held)
    svc->limits.max_held =
        pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : UINT64_MAX;
}

void psd_service_set_coord(struct psd_service *svc, struct psd_coord *coord) {
  svc->coord = coord;
}

void psd_service_set_saver(struct psd_service *svc, struct psd_saver *saver) {
  svc->saver = saver;
}

struct psd_steps *psd_service_steps(struct psd_service *svc) {
  return svc->steps;
}

struct psd_dedup *psd_service_dedup(struct psd_service *svc) {
  return svc->dedup;
}

void psd_service_set_dedup(struct psd_service *svc, struct psd_dedup *d) {
  psd_dedup_free(svc->dedup);
  svc->dedup = d;
}

void psd_service_free(struct psd_service *svc) {
  if (!svc)
    return;
  release_parked(svc, 1);
  psd_steps_free(svc->steps);
  psd_dedup_free(svc->dedup);
  pthread_mutex_destroy(&svc->park_lock);
  free(svc);
}

const struct cm_rpc_method *psd_service_methods(struct psd_service *svc,
                                                int *n) {
  *n = 6;
  return svc->methods;
}

void psd_service_counters(struct psd_service *svc, struct psd_counters *c) {
  c->pulls = atomic_load(&svc->pulls);
  c->pushes = atomic_load(&svc->pushes);
  c->examples = atomic_load(&svc->examples);
  c->bytes_in = atomic_load(&svc->bytes_in);
  c->bytes_out = atomic_load(&svc->bytes_out);
  c->errors = atomic_load(&svc->errors);
  c->nonfinite = atomic_load(&svc->nonfinite);
  c->step =
      svc->steps ? psd_steps_version(svc->steps) : atomic_load(&svc->updates);
}
