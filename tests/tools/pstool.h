/* pstool's insides: its parsed command line and its subcommands, one family
 * per file (the usage is at the top of pstool.c):
 *
 *   pstool.c        main: options, the spec, dispatch
 *   pstool_low.c    declare, push, pushfill, pull, raw: one call to one
 *                   shard, to check psd's answers; nanpush: the client's
 *                   refusal of a NaN gradient
 *   pstool_bench.c  roundtrip, syncload, tcp: timings for the benchmarks
 *   pstool_count.c  count, load: pushes applied exactly once through faults
 *   pstool_rowload.c the table part of load: rows pushed and pulled, checked
 *   pstool_rows.c   rows: sparse pulls and pushes of an embedding table
 *   pstool_sparse.c sparse: the embedding-table benchmark
 *
 * Every subcommand returns the process's exit status and prints the
 * key=value lines that tests/integration and tests/bench/bench.py parse. */
#ifndef PSTOOL_H
#define PSTOOL_H

#include <stddef.h>
#include <stdint.h>

#include "spec.h"

/* The command line, as main parsed it. */
struct pstool_args {
  const char *cluster; /* --cluster */
  int shard;           /* --shard */
  int timeout;         /* --timeout ms */
  uint64_t bytes;      /* --bytes */
  int rounds;          /* --rounds */
  size_t chunk;        /* --chunk */
  int inflight;        /* --inflight */
  int worker;          /* --worker */
  int join;            /* --join: roundtrip joins as worker --worker first */
  long long step;      /* --step: a push's sync step, -1 when not given */
  int max_message_mb;  /* --max-message-mb, 0: the spec's */
  uint64_t client_id; /* --client-id: push names its message (0: it does not) */
  uint64_t seq;       /* --seq: the push's seq */
  uint32_t chunk_id;  /* --chunk-id: the push's chunk */
  int clients;        /* --clients: load's client threads */
  double seconds;     /* --seconds: load's duration */
  int faults;         /* --faults: load runs through faults (shards restarted
                         meanwhile): failed attempts that were retried are
                         expected; lost or doubled updates still fail it */
  int only;           /* --only push|pull: roundtrip times that direction
                         alone (0: both), so a profiler sees one path */
  int pingpong; /* --pingpong: tcp times round trips of --bytes out, 64 back */
};

/* ---- pstool_low.c */

/* argv[0] is declare, push, pushfill, pull or raw, argv[1..argc) its
 * arguments: one call to shard a->shard, "OK ..." or "ERROR ..." printed. */
int pstool_low(struct cm_spec *spec, const struct pstool_args *a, int argc,
               char **argv);

/* nanpush K: a NaN at element `at` must be refused whole by the client. */
int pstool_nanpush(struct cm_spec *spec, const struct pstool_args *a,
                   uint64_t at);

/* ---- pstool_bench.c */

/* roundtrip: checks a push and pull of a->bytes, then times a->rounds. */
int pstool_roundtrip(struct cm_spec *spec, const struct pstool_args *a);

/* syncload: a light sync worker, a->rounds steps. */
int pstool_syncload(struct cm_spec *spec, const struct pstool_args *a);

/* tcp: the loopback TCP copy the transport benchmark compares with. */
int pstool_tcp(const struct pstool_args *a);

/* ---- pstool_rows.c */

/* rows TABLE DIM[:BOUND] pull IDS | push IDS GRADS: argv[0] is "rows". */
int pstool_rows(struct cm_spec *spec, const struct pstool_args *a, int argc,
                char **argv);

/* ---- pstool_sparse.c */

/* sparse DIM: fills table "bench/DIM" with a->bytes rows, then times
 * a->clients clients pulling and pushing batches of a->chunk Zipf ids for
 * a->seconds each. */
int pstool_sparse(struct cm_spec *spec, const struct pstool_args *a,
                  uint32_t dim);

/* ---- pstool_count.c */

/* count: a->rounds pushes, then checks each was applied exactly once. */
int pstool_count(struct cm_spec *spec, const struct pstool_args *a);

/* load: a->clients clients pushing and pulling for a->seconds, then
 * checked as count is. */
int pstool_load(struct cm_spec *spec, const struct pstool_args *a);

/* ---- pstool_rowload.c */

struct psc__client;

/* Hot ids per load client: pushed every round, checked exactly. */
#define ROWLOAD_HOT 8
/* Cold ids per load client: each pushed in two rounds running, then left
 * to admission and eviction. */
#define ROWLOAD_COLD 512

/* One load client's rows of the spec's first table. */
struct rowload {
  const struct cm_table_conf *conf; /* the spec's job.tables[0] */
  char who[32];                     /* "load:N", for messages */
  uint64_t ids[ROWLOAD_HOT + 2];    /* the hot ids, then a round's 2 cold */
  uint64_t cold_base;               /* the first cold id of the pool */
  float *rows;                      /* pull destination, (HOT + 2) x dim */
  float *grad;                      /* 2^-10 everywhere, (HOT + 2) x dim */
  float *want;                      /* the hot rows as pushed, HOT x dim */
  uint64_t hot_pushes;              /* pushes of each hot id (warm-up too) */
  uint64_t rounds;                  /* rounds done */
  uint64_t pushes;                  /* sparse pushes that succeeded */
  uint64_t pulls;                   /* sparse pulls that succeeded */
  int64_t bad;                      /* hot elements found wrong so far */
};

/* 1 when load should load the spec's first table, 0 when the spec has no
 * table, -1 (with *why) when the table cannot be checked exactly: it must
 * be sgd, admit always or by count, evict by count only, dim <= 64. */
int pstool_rowload_usable(const struct cm_spec *spec, const char **why);

/* Declares the table, pulls the hot rows' start and warms them up (past
 * admission and min_count); 0, or 1 with the error printed. */
int pstool_rowload_open(struct rowload *r, struct psc__client *cl,
                        const struct cm_spec *spec, int client);

/* One round: pushes and pulls the hot ids and 2 cold ones, checking the
 * hot rows; 0, or 1 when a call failed (printed). */
int pstool_rowload_round(struct rowload *r, struct psc__client *cl);

/* The final pull: the hot elements wrong over the whole run, or -1 when the
 * pull failed. */
int64_t pstool_rowload_check(struct rowload *r, struct psc__client *cl);

void pstool_rowload_free(struct rowload *r);

#endif
