/* gRPC C core plumbing shared by psd and libpsclient: the process-wide
 * setup (grpc_init, the message limit), packing and unpacking messages, and
 * what a call's status means. The two halves that use it have headers of
 * their own: rpc_server.h (calls answered by a queue thread) and rpc_client.h
 * (batches of unary calls in flight at once). */
#ifndef CM_RPC_H
#define CM_RPC_H

#include <stddef.h>
#include <stdint.h>

#include <grpc/grpc.h>

/* Largest message either side accepts by default (the spec's
 * job.max_message_mb changes it). Tensors travel in chunks far below this
 * (2 MiB by default), so the limit only stops runaway messages. */
#define CM_RPC_MAX_MESSAGE (64 * 1024 * 1024)

/* The smallest limit that still carries a 2 MiB chunk with its head. */
#define CM_RPC_MIN_MESSAGE (4 * 1024 * 1024)

/* Sets the largest message, in bytes, that servers and channels created
 * afterwards send and receive (clamped to [CM_RPC_MIN_MESSAGE, INT_MAX]);
 * anything larger is answered RESOURCE_EXHAUSTED by gRPC itself. Process-wide
 * rather than an argument of every constructor: one process serves or calls
 * one job, and the setting is gRPC's per-channel argument in the end. */
void cm_rpc_set_max_message(long long bytes);

/* The limit in force (CM_RPC_MAX_MESSAGE unless set). */
int cm_rpc_max_message(void);

/* Call before any other gRPC use: grpc_init and malloc settings that keep
 * large message buffers from page-faulting. Reference-counted like
 * grpc_init: each call is balanced by one cm_rpc_global_shutdown. */
void cm_rpc_global_init(void);
void cm_rpc_global_shutdown(void);

/* Packs a protobuf-c message into a new byte buffer. */
struct ProtobufCMessage;
grpc_byte_buffer *cm_rpc_pack(const struct ProtobufCMessage *msg);

/* Reads a whole byte buffer into malloc'd memory (*len bytes); for small
 * messages only. NULL bb gives an empty buffer. Returns 0 or CM_ENOMEM. */
int cm_rpc_readall(grpc_byte_buffer *bb, uint8_t **data, size_t *len);

/* Reads a whole (small) byte buffer and unpacks it as a message of type
 * desc: a response, or a request without a bulk field. Returns the message
 * (free it with protobuf_c_message_free_unpacked), or NULL when bb is not
 * valid protobuf of that type or memory ran out. */
struct ProtobufCMessageDescriptor;
struct ProtobufCMessage *
cm_rpc_unpack(grpc_byte_buffer *bb,
              const struct ProtobufCMessageDescriptor *desc);

/* gRPC's status name, e.g. "INVALID_ARGUMENT". */
const char *cm_rpc_status_name(grpc_status_code code);

/* The error code a call's status maps to: 0 for OK, CM_ETIMEDOUT,
 * CM_EUNAVAIL, CM_ENOENT (NOT_FOUND), CM_EEXIST (ALREADY_EXISTS), CM_ERANGE
 * (OUT_OF_RANGE), else CM_ERPC. The one mapping of statuses to codes, for
 * every client: a condition a client finds itself gets the code a shard's
 * answer would. */
int cm_rpc_status_rc(grpc_status_code code);

#endif
