/* STUB copied from /work/wt/I28.md until i28/pub lands (not committed). */
#ifndef PSD_PUBFILE_H
#define PSD_PUBFILE_H
#include <stddef.h>
#include <stdint.h>
struct psd_pub_dense { char name[201]; int64_t shape[8]; int ndim; int64_t row_begin, row_end;
                       float *values; };
struct psd_pub_table { char name[201]; uint32_t dim; size_t nrows; uint64_t *ids; float *values;
                       size_t nremoved; uint64_t *removed; };
struct psd_pub { uint64_t version, base, prev, step; int full; int64_t time_unix_ms;
                 int shard, shards; char job[64];
                 int ndense; struct psd_pub_dense *dense; int ntables; struct psd_pub_table *tables; };
int psd_pub_list(const char *dir, uint64_t **out, size_t *n, char *err, size_t errlen);
int psd_pub_read(const char *dir, uint64_t version, const char *job, int shard, int shards,
                 struct psd_pub **out, char *err, size_t errlen);
void psd_pub_free(struct psd_pub *p);
#endif
