/* Criteo's click logs (the Kaggle Display Advertising Challenge and the
 * Terabyte set) as tab-separated text, streamed: one example a line,
 *   label \t I1 .. I13 \t C1 .. C26
 * 40 fields, `\n` (or `\r\n`) ending each: the label 0 or 1, thirteen
 * integer features (a decimal integer, maybe negative, or empty: missing),
 * twenty-six categorical values (any bytes but tab; Criteo's are eight
 * lowercase hex digits; empty: missing). Plain or gzip (zlib's gzread tells
 * them apart by the magic, so `.gz` or not). Any other shape is an error
 * "path:line: what is wrong" (CM_EFORMAT).
 *
 * Categorical field f (0-based) with value bytes s gets the u64 id
 * dw_criteo_id(f, s) (docs/ctr.md, "The Criteo format"; psd.criteo's
 * Python reader gives the same ids). An empty value hashes like any other:
 * each field has its own "missing" id. With per-field bounds the id used is
 * id % bounds[f] (the DLRM's tables). */
#ifndef DW_CRITEO_H
#define DW_CRITEO_H

#include <stddef.h>
#include <stdint.h>

#include "libsvm.h"

#define DW_CRITEO_INTS 13   /* integer features a line */
#define DW_CRITEO_CATS 26   /* categorical features a line */
#define DW_CRITEO_FIELDS 40 /* tab-separated fields a line: 1 + 13 + 26 */

/* The per-field bounds of the DLRM's 26 tables over psd-ctrgen's Criteo
 * data (psd.criteo.CARDINALITIES): the generator's cardinalities. */
extern const uint64_t dw_criteo_bounds[DW_CRITEO_CATS];

/* Categorical field f's id of value bytes s[0..len):
 *   cm_splitmix64_at(fnv1a64(s) ^ cm_splitmix64_at(f + 1))
 * with fnv1a64 FNV-1a 64 (h = 0xcbf29ce484222325, per byte
 * h = (h ^ b) * 0x100000001b3). */
uint64_t dw_criteo_id(int field, const void *s, size_t len);

/* A reader (opaque); dw_criteo_open makes one, dw_criteo_close frees it. */
struct dw_criteo;

/* Opens path for the lines i (0-based, every line counted) with
 * i % nshares == share; other lines are counted, not parsed. Returns 0,
 * CM_EINVAL (share not in 0..nshares-1), CM_ENOENT/CM_EIO (err: the path
 * and why), CM_ENOMEM. */
int dw_criteo_open(const char *path, int share, int nshares,
                   struct dw_criteo **out, char *err, size_t errlen);

/* One batch of the share's next examples, at most n, into caller-owned
 * arrays: label[n] (0 or 1), dense[n][13] (the integers as floats, missing
 * 0), present (may be NULL) [n][13] (1 where the integer was given),
 * ids[n][26] (dw_criteo_id, % bounds[f] when bounds is not NULL; a bound
 * of 0 is taken as none). *got: the examples filled, 0 at the end of the
 * file. Returns 0, CM_EFORMAT (err: "path:line: what is wrong"), CM_EIO
 * (a read or gzip error: err names the file). After an error the reader
 * only repeats it. */
int dw_criteo_read(struct dw_criteo *r, size_t n, const uint64_t *bounds,
                   float *label, float *dense, uint8_t *present, uint64_t *ids,
                   size_t *got, char *err, size_t errlen);

/* Lines read so far (all shares'). */
unsigned long long dw_criteo_lines(const struct dw_criteo *r);

void dw_criteo_close(struct dw_criteo *r);

/* Loads the share's lines as the CTR model's sparse examples (libsvm.h):
 * categorical field f becomes feature f * 10^9 + id % 10^9 (value 1),
 * integer feature j feature (26 + j) * 10^9 with value log(1 + max(x, 0))
 * (none when missing). Returns as dw_criteo_read, and CM_ENOMEM. */
int dw_criteo_load_svm(const char *path, int share, int nshares,
                       struct dw_svm *out, char *err, size_t errlen);

#endif
