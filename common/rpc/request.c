/* Taking a request: decode, check the caller's job, refuse (request.h). */
#include "request.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ps.pb-c.h"
#include "rpc.h"

void cm_request_host_init(struct cm_request_host *host, const char *job,
                          const char *noun, const char *name_fmt, ...) {
  va_list ap;
  memset(host, 0, sizeof *host);
  host->job = job;
  host->noun = noun;
  va_start(ap, name_fmt);
  vsnprintf(host->name, sizeof host->name, name_fmt, ap);
  va_end(ap);
}

void cm_request_refuse(const struct cm_request_host *host,
                       struct cm_rpc_call *call, grpc_status_code code,
                       const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (host->refuse)
    host->refuse(host->ctx, call, code, msg);
  else
    cm_rpc_fail(call, code, "%s", msg);
}

ProtobufCMessage *cm_request_open(const struct cm_request_host *host,
                                  struct cm_rpc_call *call,
                                  grpc_byte_buffer *bb,
                                  const ProtobufCMessageDescriptor *desc,
                                  const char *what, struct cm_wire_msg *wire) {
  ProtobufCMessage *msg = NULL;
  const ProtobufCFieldDescriptor *field;
  const Psd__V1__Caller *caller;

  if (wire) {
    if (cm_wire_parse(wire, bb) == 0)
      msg = protobuf_c_message_unpack(desc, NULL, wire->head_len, wire->head);
  } else {
    msg = cm_rpc_unpack(bb, desc);
  }
  if (!msg) {
    cm_request_refuse(host, call, GRPC_STATUS_INVALID_ARGUMENT,
                      "request is not a valid %s message (malformed protobuf)",
                      desc->name);
    return NULL;
  }
  /* Every psd.v1 request names its caller in field `caller`; looking it up
   * by name keeps this module free of a list of request types. */
  field = protobuf_c_message_descriptor_get_field_by_name(desc, "caller");
  if (!field || field->descriptor != &psd__v1__caller__descriptor)
    return msg;
  caller = *(const Psd__V1__Caller *const *)((const char *)msg + field->offset);
  if (!caller || !caller->job || !caller->job[0]) {
    cm_request_refuse(host, call, GRPC_STATUS_INVALID_ARGUMENT,
                      "%s: caller.job is missing; every request names its job "
                      "(this %s serves job '%s')",
                      what, host->noun, host->job);
    goto refused;
  }
  if (strcmp(caller->job, host->job) != 0) {
    cm_request_refuse(host, call, GRPC_STATUS_FAILED_PRECONDITION,
                      "%s for job '%.100s' reached %s of job '%s'", what,
                      caller->job, host->name, host->job);
    goto refused;
  }
  return msg;
refused:
  protobuf_c_message_free_unpacked(msg, NULL);
  return NULL;
}

void cm_request_free(ProtobufCMessage *msg) {
  if (msg)
    protobuf_c_message_free_unpacked(msg, NULL);
}
