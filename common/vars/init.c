/* Counter-based initial values (init.h): splitmix64 of a key made from the
 * seed and the name's hash (the layout's, cm_layout_name_hash), plus the
 * element's global index (a variable) or the row's id and the element's
 * column (a table's row). */
#include "init.h"

#include <string.h>

#include "layout.h"
#include "rand.h"

/* The counter's uniform value in [-scale, scale). */
static float uniform_at(uint64_t counter, float scale) {
  uint64_t r = cm_splitmix64_at(counter);
  float u = (float)(r >> 40) * (1.0f / 16777216.0f); /* [0, 1) */
  return (2.0f * u - 1.0f) * scale;
}

void cm_init_fill(float *dst, uint64_t first, uint64_t n,
                  enum cm_init_kind kind, float scale, uint64_t seed,
                  const char *name) {
  if (kind != CM_INIT_UNIFORM) {
    memset(dst, 0, n * sizeof *dst);
    return;
  }
  uint64_t key = cm_splitmix64_at(seed ^ cm_layout_name_hash(name));
  for (uint64_t i = 0; i < n; i++)
    dst[i] = uniform_at(key + first + i, scale);
}

void cm_table_init_row(const struct cm_table_conf *conf, uint64_t seed,
                       uint64_t id, float *row) {
  if (conf->init != CM_TABLE_INIT_UNIFORM) {
    memset(row, 0, conf->dim * sizeof *row);
    return;
  }
  uint64_t key = cm_splitmix64_at(seed ^ cm_layout_name_hash(conf->name));
  key = cm_mix64(key ^ cm_splitmix64_at(id));
  for (uint32_t j = 0; j < conf->dim; j++)
    row[j] = uniform_at(key + j, conf->init_scale);
}
