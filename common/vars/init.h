/* Initial values of variables, shared by psd (which creates them) and
 * dworker --standalone (which must start from the same model), and of an
 * embedding table's rows, shared by the shard (a row's first touch), the
 * serving task (an id never published) and the export (psd.export, through
 * the Python extension: the rows an export lacks). Values come from a
 * counter-based generator keyed by (seed, name, global element index or
 * row id), so they do not depend on how a variable or a table is sharded.
 * docs/tables.md states the rows' recipe. */
#ifndef CM_INIT_H
#define CM_INIT_H

#include <stdint.h>

#include "tabconf.h"

enum cm_init_kind { CM_INIT_ZEROS = 0, CM_INIT_UNIFORM = 1 };

/* Fills dst[0..n) with elements [first, first + n) of variable `name`:
 * zeros, or uniform in [-scale, scale). */
void cm_init_fill(float *dst, uint64_t first, uint64_t n,
                  enum cm_init_kind kind, float scale, uint64_t seed,
                  const char *name);

/* Fills row (conf->dim floats) with id's initial value in table conf->name
 * under the job's seed: zeros, or uniform in [-init_scale, init_scale)
 * (docs/tables.md, "A row's initial value"). conf is the table's resolved
 * settings (cm_table_conf_for). */
void cm_table_init_row(const struct cm_table_conf *conf, uint64_t seed,
                       uint64_t id, float *row);

#endif
