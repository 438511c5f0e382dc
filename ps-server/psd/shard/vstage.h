/* Initial values staged by Declare (docs/wire.md, "Initial values"): a
 * client whose values for a variable do not fit one message sends them in
 * several Declares with the same DeclareRequest.stage id, and the shard
 * keeps the runs here, under (stage, name), until they cover its rows of
 * the variable; the Declare that completes them creates the variable from
 * them (psd_store_declare_values), so nobody sees it before its values are
 * in place. A stage ends when its variable is created, by that client or
 * another, or when it is left untouched for PSD_VSTAGE_IDLE_S.
 *
 * Used by the Declare handler alone, on the service's thread: no lock. */
#ifndef PSD_VSTAGE_H
#define PSD_VSTAGE_H

#include <stddef.h>
#include <stdint.h>

/* Seconds a stage may go untouched before it is dropped (its client
 * stopped half way). */
#define PSD_VSTAGE_IDLE_S 600

struct psd_vstage;

/* One variable's staged values on this shard. */
struct psd_vstage_entry;

int psd_vstage_new(struct psd_vstage **out);
void psd_vstage_free(struct psd_vstage *s);

/* The stage of (id, name), or NULL. */
struct psd_vstage_entry *psd_vstage_find(struct psd_vstage *s, uint64_t id,
                                         const char *name);

/* Makes the stage of (id, name) for the elements [begin, end) (this
 * shard's rows of the variable, in its global numbering). Returns 0 or
 * CM_ENOMEM. */
int psd_vstage_add(struct psd_vstage *s, uint64_t id, const char *name,
                   uint64_t begin, uint64_t end, struct psd_vstage_entry **out);

/* The elements an entry was made for. */
void psd_vstage_range(const struct psd_vstage_entry *e, uint64_t *begin,
                      uint64_t *end);

/* Copies count f32 elements from data (little-endian, maybe unaligned) to
 * elements [offset, offset + count) of e, which must lie in its range; an
 * element sent twice (a retried message) takes the later value. */
void psd_vstage_put(struct psd_vstage_entry *e, uint64_t offset,
                    const void *data, uint64_t count);

/* Elements of e's range that runs have filled so far. */
uint64_t psd_vstage_filled(const struct psd_vstage_entry *e);

/* e's values, end - begin floats (complete once filled equals that). */
const float *psd_vstage_values(const struct psd_vstage_entry *e);

/* Drops every stage of name (the variable exists now). */
void psd_vstage_drop_name(struct psd_vstage *s, const char *name);

/* Drops the stages untouched since before now_s - PSD_VSTAGE_IDLE_S
 * (now_s: a monotonic clock in seconds). */
void psd_vstage_expire(struct psd_vstage *s, double now_s);

/* Marks e touched at now_s. */
void psd_vstage_touch(struct psd_vstage_entry *e, double now_s);

/* Bytes every stage holds (counted with the variables against the
 * shard's limit). */
uint64_t psd_vstage_bytes(const struct psd_vstage *s);

#endif
