/* Head/bulk splitting and zero-copy building of psd.v1 messages (wire.h).
 * The parser walks protobuf's top-level fields across the received slices
 * with a cursor; only the bulk field's bytes are left where they lie. */
#include "wire.h"

#include <stdlib.h>
#include <string.h>

#include <grpc/slice.h>

#include "bf16.h"
#include "err.h"

/* A position in the list of received slices. */
struct cursor {
  struct cm_wire_piece *sl; /* the slices, in order */
  int nsl;                  /* number of slices */
  int i;                    /* current slice */
  size_t off;               /* offset in the current slice */
};

static int cur_byte(struct cursor *c, uint8_t *b) {
  while (c->i < c->nsl && c->off == c->sl[c->i].len) {
    c->i++;
    c->off = 0;
  }
  if (c->i >= c->nsl)
    return CM_EPROTO;
  *b = c->sl[c->i].ptr[c->off++];
  return 0;
}

static int cur_at_end(struct cursor *c) {
  while (c->i < c->nsl && c->off == c->sl[c->i].len) {
    c->i++;
    c->off = 0;
  }
  return c->i >= c->nsl;
}

static int head_put(struct cm_wire_msg *m, const uint8_t *p, size_t n) {
  if (m->head_len + n > m->head_cap) {
    size_t cap = m->head_cap ? m->head_cap * 2 : 256;
    while (cap < m->head_len + n)
      cap *= 2;
    uint8_t *h = realloc(m->head, cap);
    if (!h)
      return CM_ENOMEM;
    m->head = h;
    m->head_cap = cap;
  }
  memcpy(m->head + m->head_len, p, n);
  m->head_len += n;
  return 0;
}

static int bulk_put(struct cm_wire_msg *m, const uint8_t *p, size_t n) {
  if (m->nbulk == m->bulk_cap) {
    int cap = m->bulk_cap ? m->bulk_cap * 2 : 16;
    struct cm_wire_piece *b = realloc(m->bulk, cap * sizeof *b);
    if (!b)
      return CM_ENOMEM;
    m->bulk = b;
    m->bulk_cap = cap;
  }
  m->bulk[m->nbulk].ptr = p;
  m->bulk[m->nbulk].len = n;
  m->nbulk++;
  return 0;
}

/* Reads a varint, appending its raw bytes to the head when keep is set. */
static int cur_varint(struct cursor *c, struct cm_wire_msg *m, int keep,
                      uint64_t *v) {
  uint64_t x = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    uint8_t b;
    int rc = cur_byte(c, &b);
    if (rc)
      return rc;
    if (keep && (rc = head_put(m, &b, 1)))
      return rc;
    x |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) {
      *v = x;
      return 0;
    }
  }
  return CM_EPROTO;
}

/* Moves n bytes forward, into the head (keep) or recorded as bulk pieces. */
static int cur_take(struct cursor *c, struct cm_wire_msg *m, int keep,
                    uint64_t n) {
  while (n > 0) {
    if (cur_at_end(c))
      return CM_EPROTO;
    size_t avail = c->sl[c->i].len - c->off;
    size_t k = n < avail ? (size_t)n : avail;
    const uint8_t *p = c->sl[c->i].ptr + c->off;
    int rc = keep ? head_put(m, p, k) : bulk_put(m, p, k);
    if (rc)
      return rc;
    c->off += k;
    n -= k;
  }
  return 0;
}

int cm_wire_parse(struct cm_wire_msg *m, grpc_byte_buffer *bb) {
  struct cursor c = {0};
  grpc_slice *s;
  int cap = 0, rc = 0;

  memset(m, 0, sizeof *m);
  if (!bb)
    return 0; /* an empty message: every field at its default */
  if (!grpc_byte_buffer_reader_init(&m->reader, bb))
    return CM_EPROTO;
  m->reader_open = 1;
  while (grpc_byte_buffer_reader_peek(&m->reader, &s)) {
    if (c.nsl == cap) {
      cap = cap ? cap * 2 : 16;
      struct cm_wire_piece *sl = realloc(c.sl, cap * sizeof *sl);
      if (!sl) {
        rc = CM_ENOMEM;
        goto out;
      }
      c.sl = sl;
    }
    c.sl[c.nsl].ptr = GRPC_SLICE_START_PTR(*s);
    c.sl[c.nsl].len = GRPC_SLICE_LENGTH(*s);
    c.nsl++;
  }
  while (!cur_at_end(&c)) {
    uint64_t key, len;
    uint8_t tag[10];
    size_t ntag = 0;
    /* Read the key without keeping it: whether it is kept depends on it. */
    int save_i = c.i;
    size_t save_off = c.off;
    if ((rc = cur_varint(&c, m, 0, &key)))
      goto out;
    uint32_t field = (uint32_t)(key >> 3), wt = key & 7;
    if (field == 0) {
      rc = CM_EPROTO;
      goto out;
    }
    if (field == CM_WIRE_BULK_FIELD) {
      if (wt != 2 || m->has_bulk) {
        rc = CM_EPROTO;
        goto out;
      }
      if ((rc = cur_varint(&c, m, 0, &len)) || (rc = cur_take(&c, m, 0, len)))
        goto out;
      m->has_bulk = 1;
      m->bulk_len = len;
      continue;
    }
    /* Copy the key's raw bytes into the head, then the value. */
    c.i = save_i;
    c.off = save_off;
    do {
      if ((rc = cur_byte(&c, &tag[ntag])))
        goto out;
    } while ((tag[ntag++] & 0x80) && ntag < sizeof tag);
    if ((rc = head_put(m, tag, ntag)))
      goto out;
    switch (wt) {
    case 0:
      rc = cur_varint(&c, m, 1, &len);
      break;
    case 1:
      rc = cur_take(&c, m, 1, 8);
      break;
    case 2:
      rc = cur_varint(&c, m, 1, &len);
      if (!rc)
        rc = cur_take(&c, m, 1, len);
      break;
    case 5:
      rc = cur_take(&c, m, 1, 4);
      break;
    default:
      rc = CM_EPROTO; /* groups (3, 4) and unknown wire types */
    }
    if (rc)
      goto out;
  }
out:
  free(c.sl);
  return rc;
}

int cm_wire_bulk_read(const struct cm_wire_msg *m, size_t off, void *dst,
                      size_t len) {
  uint8_t *d = dst;
  if (off > m->bulk_len || len > m->bulk_len - off)
    return CM_ERANGE;
  for (int i = 0; i < m->nbulk && len > 0; i++) {
    if (off >= m->bulk[i].len) {
      off -= m->bulk[i].len;
      continue;
    }
    size_t k = m->bulk[i].len - off;
    if (k > len)
      k = len;
    memcpy(d, m->bulk[i].ptr + off, k);
    d += k;
    len -= k;
    off = 0;
  }
  return 0;
}

int cm_wire_bulk_read_bf16(const struct cm_wire_msg *m, size_t off, float *dst,
                           size_t count) {
  size_t len = count * CM_BF16_BYTES;
  uint8_t carry[CM_BF16_BYTES];
  int have = 0; /* bytes of a split element in carry */
  if (off > m->bulk_len || len > m->bulk_len - off || off % CM_BF16_BYTES)
    return CM_ERANGE;
  for (int i = 0; i < m->nbulk && len > 0; i++) {
    const uint8_t *p;
    size_t k;
    if (off >= m->bulk[i].len) {
      off -= m->bulk[i].len;
      continue;
    }
    p = m->bulk[i].ptr + off;
    k = m->bulk[i].len - off;
    if (k > len)
      k = len;
    len -= k;
    off = 0;
    if (have) { /* the second byte of an element split across slices */
      carry[1] = *p++;
      k--;
      cm_bf16_to_f32(dst++, carry, 1);
      have = 0;
    }
    cm_bf16_to_f32(dst, p, k / CM_BF16_BYTES);
    dst += k / CM_BF16_BYTES;
    if (k % CM_BF16_BYTES) {
      carry[0] = p[k - 1];
      have = 1;
    }
  }
  return 0;
}

void cm_wire_msg_release(struct cm_wire_msg *m) {
  if (m->reader_open)
    grpc_byte_buffer_reader_destroy(&m->reader);
  free(m->head);
  free(m->bulk);
  memset(m, 0, sizeof *m);
}

/* Writes the bulk field's key and the varint length; returns bytes written. */
static size_t bulk_key(uint8_t *p, uint64_t len) {
  size_t n = 0;
  p[n++] = (CM_WIRE_BULK_FIELD << 3) | 2;
  do {
    p[n] = len & 0x7f;
    len >>= 7;
    if (len)
      p[n] |= 0x80;
    n++;
  } while (len);
  return n;
}

grpc_byte_buffer *cm_wire_build(const uint8_t *head, size_t head_len,
                                const struct cm_wire_piece *pieces, int n,
                                void (*release)(void *), void *user) {
  grpc_slice stack[17], *sl = stack;
  grpc_byte_buffer *bb = NULL;
  uint64_t total = 0;
  int ns = 0;

  if (n + 1 > (int)(sizeof stack / sizeof stack[0]) &&
      !(sl = malloc((n + 1) * sizeof *sl)))
    return NULL;
  for (int i = 0; i < n; i++)
    total += pieces[i].len;
  sl[ns] = grpc_slice_malloc(head_len + 11);
  memcpy(GRPC_SLICE_START_PTR(sl[ns]), head, head_len);
  if (n > 0) {
    size_t k = bulk_key(GRPC_SLICE_START_PTR(sl[ns]) + head_len, total);
    sl[ns] = grpc_slice_sub_no_ref(sl[ns], 0, head_len + k);
  } else {
    sl[ns] = grpc_slice_sub_no_ref(sl[ns], 0, head_len);
  }
  ns++;
  for (int i = 0; i < n; i++) {
    if (pieces[i].len == 0) {
      if (release)
        release(user);
      continue;
    }
    if (release)
      sl[ns++] = grpc_slice_new_with_user_data((void *)pieces[i].ptr,
                                               pieces[i].len, release, user);
    else
      sl[ns++] = grpc_slice_from_static_buffer(pieces[i].ptr, pieces[i].len);
  }
  bb = grpc_raw_byte_buffer_create(sl, ns);
  for (int i = 0; i < ns; i++)
    grpc_slice_unref(sl[i]);
  if (sl != stack)
    free(sl);
  return bb;
}
