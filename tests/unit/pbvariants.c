/* Variants of an encoded protobuf message, each with one field taken away
 * or emptied (pbvariants.h). Works on the wire format, guided by the
 * message's descriptor, so any message of proto/ps.proto, and any field
 * added to it, is taken apart the same way. */
#include "pbvariants.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- protobuf's wire format, as much as taking a message apart needs ---- */

void tu_put(struct tu_buf *b, const void *p, size_t n) {
  if (b->n + n > b->cap) {
    b->cap = (b->n + n) * 2 + 64;
    b->p = realloc(b->p, b->cap);
    ck_assert_ptr_nonnull(b->p);
  }
  if (n)
    memcpy(b->p + b->n, p, n);
  b->n += n;
}

static void put_varint(struct tu_buf *b, uint64_t v) {
  uint8_t t[10];
  size_t k = 0;
  do {
    t[k++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
    v >>= 7;
  } while (v);
  tu_put(b, t, k);
}

static uint64_t get_varint(const uint8_t *p, size_t n, size_t *at) {
  uint64_t v = 0;
  for (int s = 0; *at < n && s < 64; s += 7) {
    uint8_t c = p[(*at)++];
    v |= (uint64_t)(c & 0x7f) << s;
    if (!(c & 0x80))
      return v;
  }
  ck_abort_msg("bad varint in a request this suite encoded");
  return 0;
}

/* One field of an encoded message. */
struct rec {
  uint32_t field;     /* its number */
  const uint8_t *raw; /* the whole record, key included */
  size_t rawlen;      /* its bytes */
  const uint8_t *val; /* a length-delimited field's value, else NULL */
  size_t vlen;        /* its bytes */
};

/* The records of the message p[0..n), at most max; returns how many. */
static size_t records(const uint8_t *p, size_t n, struct rec *out, size_t max) {
  size_t at = 0, k = 0;
  while (at < n) {
    ck_assert_uint_lt(k, max);
    struct rec *r = &out[k++];
    r->raw = p + at;
    uint64_t key = get_varint(p, n, &at);
    r->field = (uint32_t)(key >> 3);
    r->val = NULL;
    r->vlen = 0;
    switch (key & 7) {
    case 0:
      get_varint(p, n, &at);
      break;
    case 1:
      at += 8;
      break;
    case 5:
      at += 4;
      break;
    case 2:
      r->vlen = get_varint(p, n, &at);
      r->val = p + at;
      at += r->vlen;
      break;
    default:
      ck_abort_msg("wire type %d in a request this suite encoded",
                   (int)(key & 7));
    }
    ck_assert_uint_le(at, n);
    r->rawlen = (size_t)(p + at - r->raw);
  }
  return k;
}

/* Whether a field is written length-delimited when present: strings,
 * bytes, messages and packed repeated scalars (proto3's default). */
static int delimited(const ProtobufCFieldDescriptor *f) {
  return f->type == PROTOBUF_C_TYPE_STRING ||
         f->type == PROTOBUF_C_TYPE_BYTES ||
         f->type == PROTOBUF_C_TYPE_MESSAGE ||
         f->label == PROTOBUF_C_LABEL_REPEATED;
}

/* ---- the variants of a request ---- */

/* Most fields in one encoded message (repeated ones count each). */
#define MAX_RECORDS 64

/* A new variant of vs named prefix + name + how, its message empty. */
static struct tu_variant *add_variant(struct tu_variants *vs,
                                      const char *prefix, const char *name,
                                      const char *how) {
  ck_assert_int_lt(vs->n, TU_MAX_VARIANTS);
  struct tu_variant *v = &vs->v[vs->n++];
  snprintf(v->what, sizeof v->what, "%s%s %s", prefix, name, how);
  v->keep = 0;
  memset(&v->msg, 0, sizeof v->msg);
  return v;
}

/* How a changed message is put back into the request that holds it:
 * wrap(ctx, inner, out) writes the whole request around inner into out. */
typedef void (*wrap_fn)(const void *ctx, const struct tu_buf *inner,
                        struct tu_buf *out);

/* How a nested message is put back: the enclosing message's bytes with
 * record `at` (a length-delimited field) holding the new bytes instead. */
struct nest {
  const uint8_t *outer; /* the enclosing message */
  size_t outer_len;     /* its bytes */
  const struct rec *at; /* the record replaced */
  wrap_fn wrap;         /* how the enclosing message is put back */
  const void *ctx;      /* its context */
};

static void wrap_nested(const void *ctx, const struct tu_buf *inner,
                        struct tu_buf *out) {
  const struct nest *ns = ctx;
  struct tu_buf mid = {0};
  size_t before = (size_t)(ns->at->raw - ns->outer);
  tu_put(&mid, ns->outer, before);
  put_varint(&mid, (uint64_t)ns->at->field << 3 | 2);
  put_varint(&mid, inner->n);
  tu_put(&mid, inner->p, inner->n);
  size_t after = before + ns->at->rawlen;
  tu_put(&mid, ns->outer + after, ns->outer_len - after);
  if (ns->wrap)
    ns->wrap(ns->ctx, &mid, out);
  else
    *out = mid;
  if (ns->wrap)
    free(mid.p);
}

/* Gives v its message: inner, put back into the request when nested. */
static void finish(struct tu_variant *v, struct tu_buf *inner, wrap_fn wrap,
                   const void *ctx) {
  if (wrap) {
    wrap(ctx, inner, &v->msg);
    free(inner->p);
  } else {
    v->msg = *inner;
  }
}

/* Appends to vs every variant of the message p[0..n) of type d; prefix
 * names where it sits ("vars[1]."), wrap and ctx put it back (NULL at the
 * top). */
static void take_apart(struct tu_variants *vs, const uint8_t *p, size_t n,
                       const ProtobufCMessageDescriptor *d, const char *prefix,
                       wrap_fn wrap, const void *ctx) {
  struct rec r[MAX_RECORDS];
  size_t nr = records(p, n, r, MAX_RECORDS);
  /* At the top: every field absent but the caller (the emptiest request
   * that names its job). */
  const ProtobufCFieldDescriptor *who =
      protobuf_c_message_descriptor_get_field_by_name(d, "caller");
  if (!prefix[0] && who) {
    struct tu_buf b = {0};
    for (size_t k = 0; k < nr; k++)
      if (r[k].field == who->id)
        tu_put(&b, r[k].raw, r[k].rawlen);
    struct tu_variant *v =
        add_variant(vs, "", "every field but caller", "absent");
    v->msg = b;
    v->keep = 1;
  }
  for (unsigned i = 0; i < d->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &d->fields[i];
    /* Absent: every record of the field left out. */
    struct tu_buf b = {0};
    for (size_t k = 0; k < nr; k++)
      if (r[k].field != f->id)
        tu_put(&b, r[k].raw, r[k].rawlen);
    finish(add_variant(vs, prefix, f->name, "absent"), &b, wrap, ctx);
    /* Empty: one record of length 0 where the field's first was (or at
     * the end). */
    if (delimited(f)) {
      struct tu_buf e = {0};
      int done = 0;
      for (size_t k = 0; k <= nr; k++) {
        if (!done && (k == nr || r[k].field == f->id)) {
          put_varint(&e, (uint64_t)f->id << 3 | 2);
          put_varint(&e, 0);
          done = 1;
        }
        if (k < nr && r[k].field != f->id)
          tu_put(&e, r[k].raw, r[k].rawlen);
      }
      finish(add_variant(vs, prefix, f->name, "empty"), &e, wrap, ctx);
    }
    /* Inside: each message the field holds, taken apart in turn. */
    if (f->type != PROTOBUF_C_TYPE_MESSAGE)
      continue;
    int elem = 0;
    for (size_t k = 0; k < nr; k++) {
      if (r[k].field != f->id)
        continue;
      char sub[128];
      if (f->label == PROTOBUF_C_LABEL_REPEATED)
        snprintf(sub, sizeof sub, "%s%s[%d].", prefix, f->name, elem++);
      else
        snprintf(sub, sizeof sub, "%s%s.", prefix, f->name);
      struct nest ns = {p, n, &r[k], wrap, ctx};
      take_apart(vs, r[k].val, r[k].vlen, f->descriptor, sub, wrap_nested, &ns);
    }
  }
}

void tu_take_apart(struct tu_variants *vs, const uint8_t *p, size_t n,
                   const ProtobufCMessageDescriptor *d) {
  take_apart(vs, p, n, d, "", NULL, NULL);
}

void tu_variants_release(struct tu_variants *vs) {
  for (int i = 0; i < vs->n; i++)
    free(vs->v[i].msg.p);
  vs->n = 0;
}
