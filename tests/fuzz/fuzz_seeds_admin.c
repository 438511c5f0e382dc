/* The seed writer's Admin calls that change tables or the layout
 * (fuzz_seeds.h): Shrink, Export and Reshard requests. */
#include "fuzz_seeds.h"

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
