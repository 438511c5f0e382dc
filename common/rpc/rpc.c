/* gRPC plumbing both halves use (rpc.h): the process-wide setup, the
 * arguments every server and channel is made with, packing and unpacking
 * messages, and status names and codes. */
#include "rpc.h"

#include <limits.h>
#include <malloc.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer_reader.h>
#include <protobuf-c/protobuf-c.h>

#include "err.h"
#include "rpc_internal.h"

void cm_rpc_global_init(void) {
  /* Message buffers of a few MiB would otherwise be fresh mmaps whose page
   * faults dominate transfer time (shared/TRANSPORT.md, lesson 5). */
  mallopt(M_MMAP_THRESHOLD, 32 * 1024 * 1024);
  mallopt(M_TRIM_THRESHOLD, 256 * 1024 * 1024);
  grpc_init();
}

void cm_rpc_global_shutdown(void) { grpc_shutdown(); }

/* The message limit (rpc.h says why it is process-wide). */
static atomic_int max_message = CM_RPC_MAX_MESSAGE;

void cm_rpc_set_max_message(long long bytes) {
  if (bytes < CM_RPC_MIN_MESSAGE)
    bytes = CM_RPC_MIN_MESSAGE;
  if (bytes > INT_MAX)
    bytes = INT_MAX;
  atomic_store(&max_message, (int)bytes);
}

int cm_rpc_max_message(void) { return atomic_load(&max_message); }

void cm__rpc_build_args(grpc_arg *a, size_t *n, int server) {
  int k = 0;
  a[k].type = GRPC_ARG_INTEGER;
  a[k].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
  a[k++].value.integer = cm_rpc_max_message();
  a[k].type = GRPC_ARG_INTEGER;
  a[k].key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
  a[k++].value.integer = cm_rpc_max_message();
  if (server) {
    /* gRPC sets SO_REUSEPORT by default, which would let a second psd bind
     * the same port silently; we want "address already in use". */
    a[k].type = GRPC_ARG_INTEGER;
    a[k].key = GRPC_ARG_ALLOW_REUSEPORT;
    a[k++].value.integer = 0;
  } else {
    /* A shard that restarts is dialled again within a second of coming
     * back (gRPC's default backoff grows to 2 minutes, far beyond a
     * restart, so a retrying worker would sit idle long after it); a
     * client that waits for it dials every 50 ms (cm_channels_await). */
    a[k].type = GRPC_ARG_INTEGER;
    a[k].key = GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS;
    a[k++].value.integer = 100;
    a[k].type = GRPC_ARG_INTEGER;
    a[k].key = GRPC_ARG_MAX_RECONNECT_BACKOFF_MS;
    a[k++].value.integer = 1000;
  }
  *n = k;
}

grpc_byte_buffer *cm_rpc_pack(const struct ProtobufCMessage *msg) {
  size_t len = protobuf_c_message_get_packed_size(msg);
  grpc_slice sl = grpc_slice_malloc(len);
  protobuf_c_message_pack(msg, GRPC_SLICE_START_PTR(sl));
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&sl, 1);
  grpc_slice_unref(sl);
  return bb;
}

int cm_rpc_readall(grpc_byte_buffer *bb, uint8_t **data, size_t *len) {
  grpc_byte_buffer_reader r;
  grpc_slice s;
  size_t n = bb ? grpc_byte_buffer_length(bb) : 0, off = 0;
  uint8_t *p = malloc(n ? n : 1);
  if (!p)
    return CM_ENOMEM;
  if (bb && grpc_byte_buffer_reader_init(&r, bb)) {
    while (grpc_byte_buffer_reader_next(&r, &s)) {
      size_t k = GRPC_SLICE_LENGTH(s);
      if (off + k > n)
        k = n - off;
      memcpy(p + off, GRPC_SLICE_START_PTR(s), k);
      off += k;
      grpc_slice_unref(s);
    }
    grpc_byte_buffer_reader_destroy(&r);
  }
  *data = p;
  *len = off;
  return 0;
}

ProtobufCMessage *cm_rpc_unpack(grpc_byte_buffer *bb,
                                const ProtobufCMessageDescriptor *desc) {
  uint8_t *data = NULL;
  size_t len = 0;
  ProtobufCMessage *msg = NULL;
  if (cm_rpc_readall(bb, &data, &len) == 0)
    msg = protobuf_c_message_unpack(desc, NULL, len, data);
  free(data);
  return msg;
}

const char *cm_rpc_status_name(grpc_status_code code) {
  static const char *names[] = {"OK",
                                "CANCELLED",
                                "UNKNOWN",
                                "INVALID_ARGUMENT",
                                "DEADLINE_EXCEEDED",
                                "NOT_FOUND",
                                "ALREADY_EXISTS",
                                "PERMISSION_DENIED",
                                "RESOURCE_EXHAUSTED",
                                "FAILED_PRECONDITION",
                                "ABORTED",
                                "OUT_OF_RANGE",
                                "UNIMPLEMENTED",
                                "INTERNAL",
                                "UNAVAILABLE",
                                "DATA_LOSS",
                                "UNAUTHENTICATED"};
  if ((int)code >= 0 && (size_t)code < sizeof names / sizeof names[0])
    return names[code];
  return "UNKNOWN";
}

int cm_rpc_status_rc(grpc_status_code code) {
  switch (code) {
  case GRPC_STATUS_OK:
    return 0;
  case GRPC_STATUS_DEADLINE_EXCEEDED:
    return CM_ETIMEDOUT;
  case GRPC_STATUS_UNAVAILABLE:
    return CM_EUNAVAIL;
  case GRPC_STATUS_NOT_FOUND:
    return CM_ENOENT;
  case GRPC_STATUS_ALREADY_EXISTS:
    return CM_EEXIST;
  case GRPC_STATUS_OUT_OF_RANGE:
    return CM_ERANGE;
  default:
    return CM_ERPC;
  }
}
