/* Messages with a bulk `bytes` field, moved without protobuf-c's copies.
 *
 * Send: the small fields are packed by protobuf-c into a head; the bulk field
 * (tag and length written by hand) follows as slices that point straight at
 * the tensor's memory. The result is ordinary protobuf: a stock client sees
 * an ordinary message with a bytes field.
 *
 * Receive: one pass over the received slices splits the message into a
 * contiguous head (every field but the bulk one, ready for protobuf-c's
 * unpack) and the bulk field's location in the slices, from which
 * cm_wire_bulk_read copies bytes exactly once, into their destination. */
#ifndef CM_WIRE_H
#define CM_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>

/* Field number of the bulk `data` field in every psd.v1 message that has one.
 */
#define CM_WIRE_BULK_FIELD 15

/* One run of bulk bytes in memory. */
struct cm_wire_piece {
  const uint8_t *ptr; /* first byte; not owned */
  size_t len;         /* bytes in the run */
};

/* A received message split into head and bulk. Borrows the byte buffer it
 * was parsed from: keep that alive until cm_wire_msg_release. */
struct cm_wire_msg {
  uint8_t *head;   /* owned: every field except the bulk one */
  size_t head_len; /* bytes in head */
  size_t head_cap; /* allocated bytes of head */
  struct cm_wire_piece
      *bulk;       /* owned array: where the bulk bytes lie, in order */
  int nbulk;       /* entries used in bulk */
  int bulk_cap;    /* allocated entries of bulk */
  size_t bulk_len; /* total bulk bytes (0 when the field is absent) */
  int has_bulk;    /* 1 when the bulk field was present */
  grpc_byte_buffer_reader reader; /* reader over the borrowed buffer */
  int reader_open;                /* 1 while reader must be destroyed */
};

/* Splits bb. Returns 0, or CM_EPROTO when bb is not valid protobuf (bad
 * wire type, truncated field, the bulk field twice or not length-delimited),
 * or CM_ENOMEM. Call cm_wire_msg_release afterwards in every case. */
int cm_wire_parse(struct cm_wire_msg *m, grpc_byte_buffer *bb);

/* Copies bulk bytes [off, off + len) into dst. Returns 0, or CM_ERANGE when
 * the range lies outside the bulk. */
int cm_wire_bulk_read(const struct cm_wire_msg *m, size_t off, void *dst,
                      size_t len);

/* Widens the bfloat16s at bulk bytes [off, off + 2 count) into count
 * floats at dst (job.wire_dtype "bf16"; bf16.h), slice by slice: the one
 * pass that both copies and converts. An element split between two slices
 * is joined. Returns 0, or CM_ERANGE when the range lies outside the bulk
 * (off odd included). */
int cm_wire_bulk_read_bf16(const struct cm_wire_msg *m, size_t off, float *dst,
                           size_t count);

void cm_wire_msg_release(struct cm_wire_msg *m);

/* Builds a message of `head` (copied) followed by the bulk field made of
 * pieces[0..n) without copying them: each piece becomes a slice whose
 * release calls release(user) once (release may be NULL when the memory
 * outlives the call for sure). Returns NULL only when out of memory. */
grpc_byte_buffer *cm_wire_build(const uint8_t *head, size_t head_len,
                                const struct cm_wire_piece *pieces, int n,
                                void (*release)(void *), void *user);

#endif
