/* pstool: a test and benchmark client for psd (not installed).
 *
 *   pstool --cluster F [--shard S] declare NAME SHAPE [PLACEMENT]
 *   pstool --cluster F [--shard S] [--step T --worker W] push NAME SHAPE
 *          OFFSET V1,V2,...
 *   pstool --cluster F [--shard S] [--step T --worker W] pushfill NAME SHAPE
 *          OFFSET COUNT VALUE
 *   pstool --cluster F [--shard S] [--client-id ID --seq N [--chunk-id C]]
 *          push NAME SHAPE OFFSET V1,V2,...
 *   pstool --cluster F [--shard S] pull NAME OFFSET COUNT
 *   pstool --cluster F [--shard S] raw METHOD HEXBYTES
 *   pstool --cluster F roundtrip --bytes N [--rounds R] [--chunk B]
 *          [--inflight K] [--join --worker W] [--only push|pull]
 *   pstool tcp --bytes N [--rounds R] [--pingpong]
 *   pstool --cluster F [--chunk B] rows TABLE DIM[:BOUND] pull IDS | push IDS
 * GRADS pstool --cluster F sparse DIM --bytes ROWS --seconds S [--clients C]
 *          [--chunk BATCH]
 *
 * SHAPE is "4,3". The low-level commands send exactly one call to one shard
 * and print "OK ..." or "ERROR <gRPC status>: <message>" (exit 1), so tests
 * can check psd's answers to bad input. pull asks as a stock client does
 * (no max_answer_bytes: gRPC's 4 MiB default) and prints "partial
 * elements=N" before the values when psd sent only the first N elements.
 * pushfill pushes COUNT copies of
 * VALUE ("nan" and "inf" work); --step T and --worker W make a push a sync
 * one (step T, worker W); --max-message-mb M lets pstool send and receive
 * messages up to M MiB whatever the spec says, to test the shard's limit.
 * roundtrip declares a variable of N bytes split across all shards with
 * libpsclient, pushes a known gradient, pulls it back and checks every element
 * against the update formula, then times R pushes and R pulls (with each call's
 * p50 and p99; --only push or --only pull times that direction alone, for a
 * profiler; shm=yes when ps:0's bytes go through shared memory); with --join it
 * first joins the job as worker W, so its pushes name it (the coordinator then
 * times them as that worker's steps); tcp times a plain loopback TCP copy, the
 * baseline for the transport benchmark. nanpush K (with --bytes N) pushes a
 * gradient with a NaN at element K through libpsclient, which must refuse it
 * whole (job.nonfinite "reject"), and checks with a pull that no shard changed.
 * syncload is a light sync worker for the scale benchmark: the demo MLP's
 * variables, no compute, S steps of pull, stage, admit.
 *
 * Faults (tests/integration/test_faults.py):
 *   push --client-id ID --seq N [--chunk-id C] names the message as libpsclient
 *     does (PushRequest.client_id, seq, chunk), so sending it twice tests
 *     that a shard applies it once.
 *   pstool --cluster F count --rounds K [--bytes N] [--chunk B] [--worker W]
 *     pushes a gradient of 2^-10 everywhere K times with libpsclient (which
 *     retries through faults), printing "count pushes=N" every 25, then
 *     pulls and checks every element equals its start minus K lr 2^-10
 *     (job.optimizer must be sgd): exactly once, whatever was retried.
 *   pstool --cluster F load --clients N --seconds S [--bytes B] [--faults]
 *     N threads, each its own client and variable split across the shards,
 *     push then pull until S seconds have passed, then each checks its
 *     variable as count does; prints "load t=..." every second and a last
 *     line with pushes, pulls, calls and failed calls; a failed call fails
 *     it unless --faults (shards are restarted meanwhile: only a call given
 *     up on, or an update lost or applied twice, fails it). When the spec
 *     names a table, each round also pushes and pulls rows of job.tables[0]
 *     (pstool_rowload.c): hot rows of each client's own, checked exactly at
 *     every pull, and cold ones left to admission and eviction.
 *
 * This file parses the options and loads the spec; pstool.h says which file
 * holds each subcommand. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pstool.h"
#include "rpc.h"
#include "spec.h"

int main(int argc, char **argv) {
  static const struct option opts[] = {
      {"cluster", required_argument, 0, 'c'},
      {"shard", required_argument, 0, 's'},
      {"timeout", required_argument, 0, 't'},
      {"bytes", required_argument, 0, 'b'},
      {"rounds", required_argument, 0, 'r'},
      {"chunk", required_argument, 0, 'k'},
      {"inflight", required_argument, 0, 'i'},
      {"worker", required_argument, 0, 'w'},
      {"join", no_argument, 0, 'j'},
      {"step", required_argument, 0, 'T'},
      {"max-message-mb", required_argument, 0, 'M'},
      {"client-id", required_argument, 0, 'C'},
      {"seq", required_argument, 0, 'S'},
      {"chunk-id", required_argument, 0, 'K'},
      {"clients", required_argument, 0, 'n'},
      {"seconds", required_argument, 0, 'E'},
      {"faults", no_argument, 0, 'F'},
      {"only", required_argument, 0, 'O'},
      {"pingpong", no_argument, 0, 'P'},
      {0, 0, 0, 0}};
  struct pstool_args a = {.timeout = 10000, .rounds = 5, .step = -1};
  struct cm_spec *spec = NULL;
  char err[4096];
  int ch, rc;

  while ((ch = getopt_long(argc, argv, "+", opts, NULL)) != -1) {
    switch (ch) {
    case 'c':
      a.cluster = optarg;
      break;
    case 's':
      a.shard = atoi(optarg);
      break;
    case 't':
      a.timeout = atoi(optarg);
      break;
    case 'b':
      a.bytes = strtoull(optarg, NULL, 10);
      break;
    case 'r':
      a.rounds = atoi(optarg);
      break;
    case 'k':
      a.chunk = strtoull(optarg, NULL, 10);
      break;
    case 'i':
      a.inflight = atoi(optarg);
      break;
    case 'w':
      a.worker = atoi(optarg);
      break;
    case 'j':
      a.join = 1;
      break;
    case 'T':
      a.step = strtoll(optarg, NULL, 10);
      break;
    case 'M':
      a.max_message_mb = atoi(optarg);
      break;
    case 'C':
      a.client_id = strtoull(optarg, NULL, 0);
      break;
    case 'S':
      a.seq = strtoull(optarg, NULL, 10);
      break;
    case 'K':
      a.chunk_id = (uint32_t)strtoul(optarg, NULL, 10);
      break;
    case 'n':
      a.clients = atoi(optarg);
      break;
    case 'E':
      a.seconds = atof(optarg);
      break;
    case 'F':
      a.faults = 1;
      break;
    case 'P':
      a.pingpong = 1;
      break;
    case 'O':
      if (strcmp(optarg, "push") && strcmp(optarg, "pull")) {
        fprintf(stderr, "pstool: --only takes push or pull\n");
        return 2;
      }
      a.only = strcmp(optarg, "push") ? 2 : 1;
      break;
    default:
      return 2;
    }
  }
  if (optind >= argc) {
    fprintf(stderr,
            "pstool: no command (see the comment in tests/tools/pstool.c)\n");
    return 2;
  }
  if (!strcmp(argv[optind], "tcp"))
    return pstool_tcp(&a);
  if (!a.cluster || cm_spec_load(a.cluster, &spec, err, sizeof err)) {
    fprintf(stderr, "pstool: %s\n", a.cluster ? err : "--cluster is required");
    return 2;
  }
  if (a.shard < 0 || a.shard >= spec->nps) {
    fprintf(stderr, "pstool: --shard %d out of range\n", a.shard);
    cm_spec_free(spec);
    return 2;
  }
  cm_rpc_global_init();
  cm_rpc_set_max_message((long long)(a.max_message_mb
                                         ? a.max_message_mb
                                         : spec->job.max_message_mb)
                         << 20);
  if (!strcmp(argv[optind], "roundtrip"))
    rc = pstool_roundtrip(spec, &a);
  else if (!strcmp(argv[optind], "syncload"))
    rc = pstool_syncload(spec, &a);
  else if (!strcmp(argv[optind], "count"))
    rc = pstool_count(spec, &a);
  else if (!strcmp(argv[optind], "load"))
    rc = pstool_load(spec, &a);
  else if (!strcmp(argv[optind], "sparse") && optind + 1 < argc)
    rc = pstool_sparse(spec, &a, (uint32_t)strtoul(argv[optind + 1], NULL, 10));
  else if (!strcmp(argv[optind], "rows"))
    rc = pstool_rows(spec, &a, argc - optind, argv + optind);
  else if (!strcmp(argv[optind], "nanpush") && optind + 1 < argc)
    rc = pstool_nanpush(spec, &a, strtoull(argv[optind + 1], NULL, 10));
  else
    rc = pstool_low(spec, &a, argc - optind, argv + optind);
  cm_spec_free(spec);
  cm_rpc_global_shutdown();
  return rc;
}
