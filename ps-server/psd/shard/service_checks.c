/* The field checks every psd.v1.Data handler shares
 * (service_internal.h): a variable's name, the number of segments, a
 * segment's variable and element range, and overlapping segments in one
 * push. Each check answers the call itself when it fails, naming the field,
 * variable or shape, so a handler only stops. */
#include "service_internal.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"

int psd__check_name(struct psd_service *svc, struct cm_rpc_call *call,
                    const char *name, const char *what, size_t i) {
  size_t n = strlen(name);
  /* Declare's tables (service_tables.c) are named as tables. */
  int table = !strcmp(what, "Declare table");
  const char *of = table                     ? "table"
                   : strcmp(what, "Declare") ? "segment"
                                             : "variable";
  if (table)
    what = "Declare";
  if (n == 0 || n > PSD_VAR_MAX_NAME) {
    psd__fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
              "%s: %s %zu: the %s name is %zu bytes long; expected 1..%d", what,
              of, i, table ? "table" : "variable", n, PSD_VAR_MAX_NAME);
    return -1;
  }
  for (size_t k = 0; k < n; k++) {
    unsigned char c = (unsigned char)name[k];
    if (c < 0x20 || c == 0x7f) {
      psd__fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
                "%s: %s %zu: the %s name has a control character (0x%02x) at "
                "byte %zu",
                what, of, i, table ? "table" : "variable", c, k);
      return -1;
    }
  }
  return 0;
}

size_t psd__wire_esize(struct psd_service *svc, struct cm_rpc_call *call,
                       Psd__V1__WireDtype dtype, const char *what) {
  if (dtype == PSD__V1__WIRE_DTYPE__F32)
    return sizeof(float);
  if (dtype == PSD__V1__WIRE_DTYPE__BF16)
    return CM_BF16_BYTES;
  psd__fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
            "%s on shard %d: dtype %d is no wire type; expected F32 (0) or "
            "BF16 (1)",
            what, svc->shard, (int)dtype);
  return 0;
}

int psd__check_segment_count(struct psd_service *svc, struct cm_rpc_call *call,
                             size_t n, const char *what) {
  if (n <= PSD_MAX_SEGMENTS)
    return 0;
  psd__fail(svc, call, GRPC_STATUS_INVALID_ARGUMENT,
            "%s: %zu segments in one request; at most %d", what, n,
            PSD_MAX_SEGMENTS);
  return -1;
}

struct psd_var *psd__segment_var(struct psd_service *svc,
                                 struct cm_rpc_call *call,
                                 const Psd__V1__Segment *seg, size_t i,
                                 const char *what) {
  struct psd_var *v;
  if (psd__check_name(svc, call, seg->name, what, i))
    return NULL;
  if (!(v = psd_store_find(svc->store, seg->name))) {
    psd__fail(svc, call, GRPC_STATUS_NOT_FOUND,
              "%s: no variable '%s' on shard %d (declare it first)", what,
              seg->name, svc->shard);
    return NULL;
  }
  if (seg->count == 0) {
    psd__fail(
        svc, call, GRPC_STATUS_INVALID_ARGUMENT,
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
    psd__fail(svc, call, GRPC_STATUS_OUT_OF_RANGE,
              "%s of '%s' elements [%llu, %s) is outside shard %d's slice, "
              "elements [%llu, %llu) (rows [%lld, %lld))",
              what, v->name, (unsigned long long)seg->offset, end, svc->shard,
              (unsigned long long)v->elem_begin,
              (unsigned long long)v->elem_end, (long long)v->row_begin,
              (long long)v->row_end);
    return NULL;
  }
  return v;
}

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

int psd__check_overlap(struct psd_service *svc, struct cm_rpc_call *call,
                       const Psd__V1__PushRequest *req,
                       struct psd_var *const *vars) {
  struct span *sp;
  int rc = 0;
  if (req->n_segments < 2)
    return 0;
  if (!(sp = malloc(req->n_segments * sizeof *sp))) {
    psd__fail(svc, call, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
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
    psd__fail(
        svc, call, GRPC_STATUS_INVALID_ARGUMENT,
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
