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
 *   FAILED_PRECONDITION  "Pull for job 'y' reached shard 1 of job 'x'"
 * and, for a server that says who it is (host->self):
 *   FAILED_PRECONDITION  "the worker's and the shard's cluster specs differ:
 *                        worker:0's spec lists 2 shards and 2 workers,
 *                        ps:0's lists 1 shard and 2 workers (job 'x'); ..."
 *   FAILED_PRECONDITION  "ps:0 restarted without a checkpoint: the
 *                        parameters worker:1 trained there are lost ...;
 *                        set job.checkpoint.dir ..." */
#ifndef CM_REQUEST_H
#define CM_REQUEST_H

#include <stdint.h>

#include <grpc/grpc.h>
#include <protobuf-c/protobuf-c.h>

#include "rpc_server.h"
#include "wire.h"

/* Who a psd process is beyond its job, for the checks every caller gets
 * (docs/faults.md): a caller whose cluster spec differs (Caller.spec_fp)
 * is refused, and so is one that trained on an earlier process of this
 * shard (Caller.boot) when this one did not resume from a checkpoint. */
struct cm_request_self {
  int shard;            /* this shard's index: "ps:1" in refusals */
  uint64_t spec_fp;     /* cm_spec_fingerprint of its spec; 0: not checked */
  int nps;              /* shards in its spec, named in a refusal */
  int nworkers;         /* workers in its spec, likewise */
  uint64_t boot;        /* this process's random id; 0: not checked */
  int resumed;          /* 1: it restored a checkpoint when it started */
  const char *ckpt_dir; /* its checkpoint directory, "" when checkpoints
                           are off; borrowed */
  uint64_t layout;      /* the job's layout version as this shard holds it
                           (docs/reshard.md "Live") */
  int nshards;          /* that layout's shard count; 0: not checked */
  int rows;             /* how it places table rows (CM_LAYOUT_RULE_*,
                           Caller.rows); 0: not checked */
  int move_to;          /* a live move bucket by bucket: to this many
                           shards (0: none); read and written with
                           __atomic builtins (the shard adopts it at a
                           hand-over, on a thread of its own) */
  int moved;            /* that move's bucket moves made so far (never
                           goes back); likewise atomic */
};

/* What a shard holds, as every "layout moved" refusal says it, into buf:
 * "ps:1 holds layout 3 of 2 shards, rows by buckets, moving to 3 shards
 * after 40 moves" (the move only while one is set; "shard" for 1). The
 * client re-plans from these words: they are worded here alone. Returns
 * buf. */
const char *cm_request_holds(const struct cm_request_self *me, char *buf,
                             size_t len);

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
  /* 1: a data service: a Data call (Declare, Pull, Push, SparsePull,
   * SparsePush, Commit, Rollback; not Status or the admin calls) whose
   * caller planned it for another layout
   * (Caller.layout, Caller.shards, Caller.rows), or any caller of a shard
   * outside its layout, is answered FAILED_PRECONDITION "layout moved: ps:I
   * holds layout V of M shards, rows by RULE; ..." so that the client
   * re-plans. */
  int check_layout;
  /* Checked against every caller's spec fingerprint and boot id; NULL:
   * only the job is checked (unit tests, the fuzzer). Borrowed: it must
   * outlive the server. */
  const struct cm_request_self *self;
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
 * host->job there, and pass the checks of host->self (when set). Returns the
 * message, owned by the caller (free it with cm_request_free), or answers the
 * call and returns NULL. */
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
