/* Prometheus metric families from shards' status documents (status_json.h):
 * every counter, gauge and histogram psd keeps, per shard, per variable,
 * per embedding table and (from the coordinator's document) per worker,
 * and their text in the exposition format 0.0.4. psctl metrics renders
 * every shard of a job with it (from their Admin/Status answers); psd's
 * /metrics endpoint renders its own shard (ps-server/psd/metrics.c).
 *
 * A family is a JSON object {"name", "type", "help", "samples"}, each
 * sample {"name", "labels": {label: value}, "value"}; psctl --json prints
 * them as they are. */
#ifndef CM_PROM_H
#define CM_PROM_H

#include <jansson.h>

/* One shard to render. */
struct cm_prom_shard {
  int index;           /* the shard's index: its "shard" label */
  const char *address; /* its address, the psd_up sample's "address" label */
  json_t *status;      /* borrowed status document; NULL: it did not answer
                          (psd_up 0, no other sample) */
};

/* The families of shards[0..n) (a shard whose document has "coordinator":
 * true adds the per-worker ones), in a fixed order; a new reference, or
 * NULL when out of memory. A family may have no samples. */
json_t *cm_prom_families(const struct cm_prom_shard *shards, int n);

/* The families' text exposition (families without samples left out), as a
 * malloc'd string the caller frees; NULL when out of memory. */
char *cm_prom_text(json_t *families);

/* The Content-Type of that text. */
#define CM_PROM_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

#endif
