/* The fuzzer's input format, shared by fuzz_service.c and fuzz_seeds.c.
 *
 *   byte 0        settings: FUZZ_SYNC, FUZZ_MOMENTUM, FUZZ_SKIP, FUZZ_SMALL,
 *                 FUZZ_APPLY
 *   then records  [method][length: 2 bytes, little-endian][length bytes]
 *
 * Each record is one call, in order, to a fresh shard 0 of 2 (the
 * coordinator) of a job "f" with 2 workers and the spec's embedding tables
 * ("emb"; "adm", bounded, admitted by count and evicted; "prob", admitted by
 * probability; fuzz_service.c): method % FUZZ_NMETHODS picks
 * the call from fuzz_methods, method / FUZZ_NMETHODS how the request's bytes
 * are cut into slices (fuzz_cuts; gRPC hands messages over in slices).
 * Serve/Lookup goes to a serving task of the same job (serve.h) that holds
 * a publication of shard 0's "emb" rows and dense "w" (fuzz_service.c). A
 * length beyond the input takes what is left. */
#ifndef FUZZ_INPUT_H
#define FUZZ_INPUT_H

#define FUZZ_SYNC 1     /* job.sync.mode "sync" (else async, staleness 1) */
#define FUZZ_MOMENTUM 2 /* momentum optimizer (else sgd) */
#define FUZZ_SKIP 4     /* job.nonfinite "skip" (else "reject") */
#define FUZZ_SMALL 8    /* the smallest message limit, 4 MiB */
#define FUZZ_APPLY 16   /* job.nonfinite "apply" (unless FUZZ_SKIP) */

#define FUZZ_MAX_CALLS 16 /* records beyond these are ignored */

/* Every method psd serves, in the order the method byte selects them: every
 * rpc of proto/ps.proto (the meson test fuzz-coverage, check_coverage.py,
 * fails when one is missing here or from the seeds). A new one goes at the
 * end, so that the committed corpus keeps most of its meaning. */
static const char *const fuzz_methods[] = {
    "/psd.v1.Data/Declare",       "/psd.v1.Data/Pull",
    "/psd.v1.Data/Push",          "/psd.v1.Data/Commit",
    "/psd.v1.Admin/Status",       "/psd.v1.Admin/Checkpoint",
    "/psd.v1.Coord/Join",         "/psd.v1.Coord/Heartbeat",
    "/psd.v1.Coord/Admit",        "/psd.v1.Coord/Clock",
    "/psd.v1.Data/Rollback",      "/psd.v1.Data/SparsePull",
    "/psd.v1.Data/SparsePush",    "/psd.v1.Admin/Rows",
    "/psd.v1.Admin/Shrink",       "/psd.v1.Admin/Export",
    "/psd.v1.Serve/Lookup",       "/psd.v1.Admin/Reshard",
    "/psd.v1.Admin/MoveRows",     "/psd.v1.Admin/MoveBuckets",
    "/psd.v1.Admin/SwitchLayout", "/psd.v1.Admin/DenseRows",
};
#define FUZZ_NMETHODS ((int)(sizeof fuzz_methods / sizeof fuzz_methods[0]))

/* Slice sizes a request is cut into (0: one slice). */
static const unsigned fuzz_cuts[] = {0, 1, 2, 3, 5, 8, 13, 64, 100, 4096};
#define FUZZ_NCUTS 10

#endif
