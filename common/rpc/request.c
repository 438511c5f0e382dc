/* Taking a request: decode, check the caller's job, its spec and the shard
 * process it trained on, refuse (request.h). */
#include "request.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layout.h"
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

/* "1 shard", "2 workers". */
static const char *plural(int n, const char *one, const char *many) {
  return n == 1 ? one : many;
}

/* A caller whose cluster spec differs from this server's (another address
 * list, other counts): refused before its request can fail on something
 * that only the difference explains (a placement, a missing variable).
 * Returns 0 or refuses the call and returns -1. */
static int check_spec(const struct cm_request_host *host,
                      struct cm_rpc_call *call, const Psd__V1__Caller *caller) {
  const struct cm_request_self *me = host->self;
  const char *who =
      caller->worker && caller->worker[0] ? caller->worker : "the caller";
  if (!me || !me->spec_fp || !caller->spec_fp || caller->spec_fp == me->spec_fp)
    return 0;
  cm_request_refuse(
      host, call, GRPC_STATUS_FAILED_PRECONDITION,
      "the %s's and the shard's cluster specs differ: %.64s's spec lists %d "
      "%s and %d %s, ps:%d's lists %d %s and %d %s%s (job '%s'); start every "
      "task from the same spec",
      !strncmp(who, "worker", 6)    ? "worker"
      : !strcmp(who, "coordinator") ? "coordinator"
                                    : "caller",
      who, caller->spec_ps, plural(caller->spec_ps, "shard", "shards"),
      caller->spec_workers, plural(caller->spec_workers, "worker", "workers"),
      me->shard, me->nps, plural(me->nps, "shard", "shards"), me->nworkers,
      plural(me->nworkers, "worker", "workers"),
      caller->spec_ps == me->nps && caller->spec_workers == me->nworkers
          ? " too, at other addresses"
          : "",
      host->job);
  return -1;
}

/* A caller that trained on an earlier process of this shard (its boot id
 * differs) when this one started from nothing: what it trained here is
 * gone, and going on would train on freshly initialised values. A shard
 * that resumed from a checkpoint holds the job's values (up to that
 * checkpoint), so its callers go on. Returns 0 or refuses the call and
 * returns -1. */
static int check_boot(const struct cm_request_host *host,
                      struct cm_rpc_call *call, const Psd__V1__Caller *caller) {
  const struct cm_request_self *me = host->self;
  const char *who =
      caller->worker && caller->worker[0] ? caller->worker : "the caller";
  if (!me || !me->boot || !caller->boot || caller->boot == me->boot ||
      me->resumed)
    return 0;
  if (me->ckpt_dir && me->ckpt_dir[0])
    cm_request_refuse(
        host, call, GRPC_STATUS_FAILED_PRECONDITION,
        "ps:%d restarted without a checkpoint: the parameters %.64s trained "
        "there are lost (this is a new psd process, and it found no "
        "checkpoint in %.512s); a restarted shard resumes from the newest "
        "checkpoint in job.checkpoint.dir: keep that directory across "
        "restarts, and write checkpoints before a restart can cost them "
        "(job.checkpoint.every_steps, every_s)",
        me->shard, who, me->ckpt_dir);
  else
    cm_request_refuse(
        host, call, GRPC_STATUS_FAILED_PRECONDITION,
        "ps:%d restarted without a checkpoint: the parameters %.64s trained "
        "there are lost (this is a new psd process that started from "
        "nothing); set job.checkpoint.dir in the spec so that a restarted "
        "shard resumes from its newest checkpoint",
        me->shard, who);
  return -1;
}

const char *cm_request_holds(const struct cm_request_self *me, char *buf,
                             size_t len) {
  int move_to = __atomic_load_n(&me->move_to, __ATOMIC_ACQUIRE);
  int moved = __atomic_load_n(&me->moved, __ATOMIC_ACQUIRE);
  int k = snprintf(buf, len, "ps:%d holds layout %llu of %d shard%s%s%s",
                   me->shard, (unsigned long long)me->layout, me->nshards,
                   me->nshards == 1 ? "" : "s", me->rows ? ", rows by " : "",
                   me->rows ? cm_layout_rule_name(me->rows) : "");
  if (move_to && k >= 0 && (size_t)k < len)
    snprintf(buf + k, len - (size_t)k, ", moving to %d shard%s after %d move%s",
             move_to, move_to == 1 ? "" : "s", moved, moved == 1 ? "" : "s");
  return buf;
}

/* A data call planned for another layout than the one this shard holds, or
 * any data call to a shard outside its layout (standing by): the client
 * re-plans on this answer, whose first words it reads (libpsclient's
 * relayout). A caller of this layout is accepted whatever its move state
 * (Caller.move_to, moved): the shard's buckets decide for table rows, and
 * dense variables do not move bucket by bucket. A shard is in the layout
 * while its index is below the larger of the layout's count and the
 * move's. Returns 0 or refuses the call and returns -1. */
static int check_layout(const struct cm_request_host *host,
                        struct cm_rpc_call *call, const Psd__V1__Caller *caller,
                        const char *what) {
  const struct cm_request_self *me = host->self;
  int standby, move_to;
  char holds[200];
  static const char *const data[] = {"Declare",    "Pull",       "Push",
                                     "SparsePull", "SparsePush", "Commit",
                                     "Rollback"};
  int is_data = 0;
  if (!host->check_layout || !me || me->nshards <= 0)
    return 0;
  move_to = __atomic_load_n(&me->move_to, __ATOMIC_ACQUIRE);
  standby = me->shard >= (move_to > me->nshards ? move_to : me->nshards);
  /* The common case first, without looking at the method's name. */
  if (!standby &&
      (!caller->shards ||
       (caller->layout == me->layout && caller->shards == me->nshards &&
        (!caller->rows || !me->rows || caller->rows == me->rows))))
    return 0;
  for (size_t i = 0; i < sizeof data / sizeof data[0]; i++)
    is_data |= !strcmp(what, data[i]);
  if (!is_data) /* Status and the admin calls answer in any layout */
    return 0;
  cm_request_refuse(
      host, call, GRPC_STATUS_FAILED_PRECONDITION,
      "layout moved: %s; %s was planned for layout %llu of %d shard%s%s%s%s "
      "(the job was resharded: psctl reshard); the client re-plans and calls "
      "again",
      cm_request_holds(me, holds, sizeof holds), what,
      (unsigned long long)caller->layout, caller->shards,
      caller->shards == 1 ? "" : "s", caller->rows ? ", rows by " : "",
      caller->rows ? cm_layout_rule_name(caller->rows) : "",
      standby ? ", and this shard stands by outside the layout" : "");
  return -1;
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
  if (check_spec(host, call, caller) || check_boot(host, call, caller) ||
      check_layout(host, call, caller, what))
    goto refused;
  return msg;
refused:
  protobuf_c_message_free_unpacked(msg, NULL);
  return NULL;
}

void cm_request_free(ProtobufCMessage *msg) {
  if (msg)
    protobuf_c_message_free_unpacked(msg, NULL);
}
