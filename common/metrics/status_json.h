/* A shard's Admin/Status answer (psd.v1.StatusResponse) as a JSON document:
 * its fields under their proto names, histograms with their bounds and
 * per-bucket counts. One document for every reader: libpsclient's
 * psc__client_status hands it to psctl, pslaunch and the tests, and psd's
 * metrics endpoint renders its own shard's through prom.h, as psctl
 * metrics renders every shard's. */
#ifndef CM_STATUS_JSON_H
#define CM_STATUS_JSON_H

#include <jansson.h>

#include "ps.pb-c.h"

/* The document for resp (borrowed); a new reference, or NULL when out of
 * memory. */
json_t *cm_status_json(const Psd__V1__StatusResponse *resp);

/* Reading such a document: the member key of o as an integer, a number (0
 * when missing) or a string ("" when missing or not a string; borrowed
 * from o), and the entry of list, an array of objects, whose "name" is
 * name (a variable, a table, a histogram), or NULL (borrowed from list). */
long long cm_status_int(json_t *o, const char *key);
double cm_status_num(json_t *o, const char *key);
const char *cm_status_str(json_t *o, const char *key);
json_t *cm_status_find_named(json_t *list, const char *name);

#endif
