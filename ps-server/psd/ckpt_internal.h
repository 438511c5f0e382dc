/* A shard's checkpoints (ckpt.h): the internals shared by the files they
 * are made of:
 *   ckpt.c         the handle and the shard's directory: creating it,
 *                  cleaning what a crash left, listing checkpoints, and the
 *                  file system helpers the others use
 *   ckpt_write.c   writing a checkpoint atomically (the shard file and the
 *                  manifest), then pruning old ones
 *   ckpt_verify.c  reading one checkpoint directory back into a new store,
 *                  verifying every byte and field on the way
 *   ckpt_load.c    which checkpoint to load (the newest that verifies) or
 *                  restore in place, and setting newer ones aside
 * Nothing here is for other modules: they use ckpt.h. */
#ifndef PSD_CKPT_INTERNAL_H
#define PSD_CKPT_INTERNAL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "ckpt.h"
#include "dedup.h"
#include "store.h"

/* Format 2 names each variable's optimizer and keeps any number of slots;
 * format 1 (momentum or sgd for the whole job, one "slot") still loads. */
#define PSD__CKPT_FORMAT "psd-checkpoint-2"
#define PSD__CKPT_FORMAT_1 "psd-checkpoint-1"
#define PSD__CKPT_SHARD_FILE "shard.safetensors"
#define PSD__CKPT_MANIFEST "manifest.json"
/* Checkpoint directories looked at when loading or pruning. */
#define PSD__CKPT_MAX 4096

struct psd_ckpt {
  char dir[1024];             /* <root>/<job>/ps-<shard> */
  char job[64];               /* job name */
  int shard;                  /* this shard */
  int nshards;                /* shards in the job */
  char mode[16];              /* "sync" or "async" */
  struct cm_optim_set optims; /* the job's: each variable's, checked on load */
  int keep;                   /* checkpoints kept */
  int has_max;                /* load nothing newer than max */
  uint64_t max;               /* --resume-step */
};

/* ---- ckpt.c */

/* fsyncs a directory so renames and new entries in it are durable.
 * Returns 0 or CM_EIO (errno says why). */
int psd__ckpt_sync_dir(const char *path);

/* Removes path and everything under it (best effort; files and
 * directories only, as psd writes them). */
void psd__ckpt_remove_tree(const char *path);

/* The directory of checkpoint `step`, <dir>/ckpt-<step, zero-padded>, into
 * buf. */
void psd__ckpt_path(const struct psd_ckpt *c, uint64_t step, char *buf,
                    size_t len);

/* ---- ckpt_write.c */

/* The CRC-32 that guards a manifest: of its compact, key-sorted JSON
 * without the "checksum" member (which must be absent from m). */
int psd__ckpt_manifest_crc(json_t *m, uint32_t *crc);

/* ---- ckpt_verify.c */

/* Loads checkpoint directory dir (of `step`) into a new store (*out) and a
 * new table of applied pushes (*dedup; *clients as res->clients), both the
 * caller's; verifies everything. err says what is wrong: CM_EEXIST, a
 * variable's optimizer type is not the spec's; CM_ENOMEM; another code, the
 * checkpoint is damaged or not this shard's. */
int psd__ckpt_load_one(struct psd_ckpt *c, const char *dir, uint64_t step,
                       struct psd_store **out, struct psd_dedup **dedup,
                       int *clients, int *nvars, uint64_t *bytes, char *err,
                       size_t errlen);

#endif
