/* A shard's Admin/Status answer (psd.v1.StatusResponse) as a JSON document:
 * its fields under their proto names, histograms with their bounds and
 * per-bucket counts. One document for every reader: libpsclient's
 * dw_client_status hands it to psctl, pslaunch and the tests, and psd's
 * metrics endpoint renders its own shard's through prom.h, as psctl
 * metrics renders every shard's. */
#ifndef CM_STATUS_JSON_H
#define CM_STATUS_JSON_H

#include <jansson.h>

#include "ps.pb-c.h"

/* The document for resp (borrowed); a new reference, or NULL when out of
 * memory. */
json_t *cm_status_json(const Psd__V1__StatusResponse *resp);

#endif
