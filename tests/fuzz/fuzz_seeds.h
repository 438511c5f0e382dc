/* What the seed writer's files share (fuzz_seeds.c, the main and every
 * method's calls; fuzz_seeds_values.c, Declare's initial values;
 * fuzz_seeds_admin.c, the admin calls): a seed
 * being written in the format of fuzz_input.h, a record appended to it,
 * and the seed written to a file. */
#ifndef FUZZ_SEEDS_H
#define FUZZ_SEEDS_H

#include <stddef.h>
#include <stdint.h>

#include "ps.pb-c.h"

/* One seed being written. */
struct seed {
  uint8_t buf[1 << 16]; /* the input */
  size_t len;           /* bytes used */
};

/* The caller of every request (job "f", worker:0). */
extern Psd__V1__Caller fseed_caller;

/* While non-zero, fseed_add() leaves this field of the request out. */
extern uint32_t fseed_drop_field;

/* Appends a record calling `path` with msg, its bytes cut by
 * fuzz_cuts[cut]; exits when the seed would grow past its buffer. */
void fseed_add(struct seed *s, const char *path, int cut,
               const ProtobufCMessage *msg);

/* Writes s to DIR/name; exits when it cannot. */
void fseed_write(const char *dir, const char *name, const struct seed *s);

/* Admin calls (fuzz_seeds_admin.c): Shrink of table; Export of table's
 * rows after `after` (with has_after), at most max_rows; Reshard to
 * `shards`, or a shard told to stop (prepare) or hold for layout. Each
 * cut by fuzz_cuts[cut]. */
void fseed_shrink(struct seed *s, int cut, const char *table);
void fseed_export(struct seed *s, int cut, const char *table, int has_after,
                  uint64_t after, uint32_t max_rows);
void fseed_reshard(struct seed *s, int cut, int shards, int prepare,
                   uint64_t layout, uint64_t hold);
/* A live move's MoveRows (phase, buckets 0..bucket), or with to_dest its
 * MoveBuckets. */
void fseed_move(struct seed *s, int cut, int to_dest, int phase,
                unsigned bucket);
/* A live layout switch's SwitchLayout (phase, from -> to, layout), or
 * with rows its DenseRows of variable name's rows [0, rows) ("" and 0:
 * the catalog). */
void fseed_switch(struct seed *s, int cut, int phase, int from, int to,
                  uint64_t layout);
void fseed_dense_rows(struct seed *s, int cut, const char *name, int64_t rows,
                      uint64_t layout);

/* Writes the seeds of Declare's initial values (VarSpec.source,
 * DeclareRequest.values and stage) to dir. */
void fseed_values(const char *dir);

#endif
