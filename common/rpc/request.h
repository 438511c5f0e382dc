/* The one way a handler takes its request: split the message (locating a
 * bulk field in place, wire.h) or read it whole, unpack it with protobuf-c,
 * check that its `caller` names the job this server serves, and answer the
 * call when any of that fails. Every psd.v1 handler (psd's data service, the
 * coordinator, the checkpoint saver) starts with cm_request_open and ends
 * with cm_request_free.
 *
 * Refusals, worded for the one who sent the call:
 *   INVALID_ARGUMENT     "request is not a valid psd.v1.PullRequest message
 *                        (malformed protobuf)"
 *   INVALID_ARGUMENT     "Pull: caller.job is missing; every request names
 *                        its job (this shard serves job 'x')"
 *   FAILED_PRECONDITION  "Pull for job 'y' reached shard 1 of job 'x'" */
#ifndef CM_REQUEST_H
#define CM_REQUEST_H

#include <grpc/grpc.h>
#include <protobuf-c/protobuf-c.h>

#include "rpc_server.h"
#include "wire.h"

/* How a server names itself in refusals, and how it answers them. */
struct cm_request_host {
  const char *job;  /* the job this server serves; borrowed */
  const char *noun; /* "shard", "coordinator": "(this shard serves ...)" */
  char name[64];    /* "shard 1", "the coordinator": "... reached shard 1 of
                       job 'x'" */
  /* Answers a refused call (the message is formatted); NULL answers with
   * cm_rpc_fail. psd's data service logs and counts its refusals here. */
  void (*refuse)(void *ctx, struct cm_rpc_call *call, grpc_status_code code,
                 const char *msg);
  void *ctx; /* passed to refuse */
};

/* Fills host: the job and noun are borrowed, name is formatted. */
void cm_request_host_init(struct cm_request_host *host, const char *job,
                          const char *noun, const char *name_fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Takes the request bb of a call to method `what` ("Pull") as a message of
 * type desc. With wire, the message is split first and its bulk bytes stay
 * in the received slices (read them with cm_wire_bulk_read; release wire
 * with cm_wire_msg_release in every case, once the bytes are read); without
 * it the message is read whole. A message with a `caller` field must name
 * host->job there. Returns the message, owned by the caller (free it with
 * cm_request_free), or answers the call and returns NULL. */
ProtobufCMessage *cm_request_open(const struct cm_request_host *host,
                                  struct cm_rpc_call *call,
                                  grpc_byte_buffer *bb,
                                  const ProtobufCMessageDescriptor *desc,
                                  const char *what, struct cm_wire_msg *wire);

/* Frees a message from cm_request_open; NULL is ignored. */
void cm_request_free(ProtobufCMessage *msg);

/* Answers call with code and a formatted message through host (its refuse
 * hook, or cm_rpc_fail). */
void cm_request_refuse(const struct cm_request_host *host,
                       struct cm_rpc_call *call, grpc_status_code code,
                       const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
