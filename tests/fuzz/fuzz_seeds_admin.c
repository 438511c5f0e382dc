/* The seed writer's Admin calls that change tables or the layout
 * (fuzz_seeds.h): Shrink, Export, Reshard and a live move's requests. */
#include "fuzz_seeds.h"

#include <string.h>

void fseed_shrink(struct seed *s, int cut, const char *table) {
  Psd__V1__ShrinkRequest r = PSD__V1__SHRINK_REQUEST__INIT;
  r.caller = &fseed_caller;
  r.table = (char *)table;
  fseed_add(s, "/psd.v1.Admin/Shrink", cut, &r.base);
}

void fseed_export(struct seed *s, int cut, const char *table, int has_after,
                  uint64_t after, uint32_t max_rows) {
  Psd__V1__ExportRequest r = PSD__V1__EXPORT_REQUEST__INIT;
  r.caller = &fseed_caller;
  r.table = (char *)table;
  r.has_after = has_after;
  r.after = after;
  r.max_rows = max_rows;
  fseed_add(s, "/psd.v1.Admin/Export", cut, &r.base);
}

/* A live reshard's request: to ps:0 (shards), or a shard told to stop
 * (prepare) or hold (hold). fuzz_service serves it through the serving
 * task's refusal: psd's own handler (live.c) needs a whole psd_server. */
void fseed_reshard(struct seed *s, int cut, int shards, int prepare,
                   uint64_t layout, uint64_t hold) {
  Psd__V1__ReshardRequest r = PSD__V1__RESHARD_REQUEST__INIT;
  r.caller = &fseed_caller;
  r.shards = shards;
  r.prepare = prepare;
  r.layout = layout;
  r.hold = hold;
  fseed_add(s, "/psd.v1.Admin/Reshard", cut, &r.base);
}

/* A live move's calls: to the source (MoveRows, phase 0..2 of one move,
 * buckets 0..bucket) and to the destination (MoveBuckets, served through
 * the serving task's refusal: psd's handler, move.c, needs a whole
 * psd_server). */
void fseed_move(struct seed *s, int cut, int to_dest, int phase,
                unsigned bucket) {
  static uint8_t set[512];
  memset(set, 0, sizeof set);
  for (unsigned b = 0; b <= bucket && b < 4096; b++)
    set[b >> 3] |= (uint8_t)(1u << (b & 7));
  if (to_dest) {
    Psd__V1__MoveBucketsRequest b = PSD__V1__MOVE_BUCKETS_REQUEST__INIT;
    b.caller = &fseed_caller;
    b.from = 1;
    b.buckets = (ProtobufCBinaryData){sizeof set, set};
    fseed_add(s, "/psd.v1.Admin/MoveBuckets", cut, &b.base);
    return;
  }
  Psd__V1__MoveRowsRequest r = PSD__V1__MOVE_ROWS_REQUEST__INIT;
  r.caller = &fseed_caller;
  r.buckets = (ProtobufCBinaryData){sizeof set, set};
  r.phase = (Psd__V1__MovePhase)phase;
  r.move = 7;
  fseed_add(s, "/psd.v1.Admin/MoveRows", cut, &r.base);
}

/* A live layout switch's calls (switch.h), served like MoveBuckets through
 * the serving task's refusal: psd's handlers need a whole psd_server. */
void fseed_switch(struct seed *s, int cut, int phase, int from, int to,
                  uint64_t layout) {
  Psd__V1__SwitchLayoutRequest r = PSD__V1__SWITCH_LAYOUT_REQUEST__INIT;
  r.caller = &fseed_caller;
  r.phase = (Psd__V1__SwitchPhase)phase;
  r.from = from;
  r.to = to;
  r.layout = layout;
  fseed_add(s, "/psd.v1.Admin/SwitchLayout", cut, &r.base);
}

void fseed_dense_rows(struct seed *s, int cut, const char *name, int64_t rows,
                      uint64_t layout) {
  Psd__V1__DenseRowsRequest r = PSD__V1__DENSE_ROWS_REQUEST__INIT;
  r.caller = &fseed_caller;
  r.name = (char *)name;
  r.row_end = rows;
  r.layout = layout;
  fseed_add(s, "/psd.v1.Admin/DenseRows", cut, &r.base);
}
