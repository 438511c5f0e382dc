/* A shard's embedding tables by name (table.h holds one table's rows).
 * Tables come from the spec's job.tables, created when psd starts, and
 * from clients' Declare (DeclareRequest.tables): a table the spec names
 * takes its settings from there, any other the spec's job.table_defaults
 * with the declared dim and bound. The list only
 * grows; tables live until psd_tables_free. */
#ifndef PSD_TABLES_H
#define PSD_TABLES_H

#include <stddef.h>
#include <stdint.h>

#include "tabconf.h"
#include "table.h"

struct psd_tables;

/* spec[0..nspec) (copied) are the spec's tables, created now; defaults
 * (copied; NULL: cm_table_conf_defaults) the settings of any other table;
 * seed is the job's. Returns 0, CM_EINVAL (err names the table and field),
 * CM_ENOMEM. */
int psd_tables_new(struct psd_tables **out, const struct cm_table_conf *spec,
                   int nspec, const struct cm_table_conf *defaults,
                   uint64_t seed, char *err, size_t errlen);
void psd_tables_free(struct psd_tables *ts);

/* Creates table `name` or checks the one that exists: *out gets it
 * (borrowed until psd_tables_free), *created whether this call made it.
 * Returns 0; CM_EEXIST when it exists with another dim or id_bound (err
 * names both); CM_EINVAL for a bad dim or name, or too many tables;
 * CM_ENOMEM. */
int psd_tables_declare(struct psd_tables *ts, const char *name, uint32_t dim,
                       uint64_t id_bound, struct psd_table **out, int *created,
                       char *err, size_t errlen);

/* The table called name, or NULL. */
struct psd_table *psd_tables_find(struct psd_tables *ts, const char *name);

/* Tables held, and the i-th in creation order. */
int psd_tables_count(struct psd_tables *ts);
struct psd_table *psd_tables_at(struct psd_tables *ts, int i);

/* The settings a table called name would get when declared with dim and
 * id_bound: the spec's entry (dim and bound as declared) or the defaults. */
void psd_tables_conf_for(const struct psd_tables *ts, const char *name,
                         uint32_t dim, uint64_t id_bound,
                         struct cm_table_conf *out);

/* Puts a table restored from a checkpoint in the list (ts takes t); it
 * replaces (and frees) one of the same name. Call before serving. Returns
 * 0, or CM_EINVAL when the list is full. */
int psd_tables_adopt(struct psd_tables *ts, struct psd_table *t);

/* "always", "count(3)", "probability(0.5)"; and "off", "after_steps(1000)",
 * "min_count(2)" or both joined by ", ". */
void psd_tables_describe_admission(const struct cm_table_conf *c, char *buf,
                                   size_t len);
void psd_tables_describe_eviction(const struct cm_table_conf *c, char *buf,
                                  size_t len);

#endif
