/* psctl's checkpoint and export commands (psctl.c parses the command line).
 *
 * checkpoint: asks every shard at once to write a checkpoint
 * (Admin.Checkpoint) and prints what each answered, a shard that is down or
 * failed included; exit status 1 names them.
 *
 * export: reads every variable's rows from the shards that hold them (their
 * live values, with Data.Pull; with slots, each variable's optimizer slots
 * too, as "<name>/<slot>": "<name>/momentum", "<name>/m", "<name>/v", ...)
 * and writes them as one safetensors file, each tensor with the variable's
 * whole shape, so that numpy or PyTorch load the model in one call. The
 * file is written to a temporary name and renamed, so FILE is never
 * half-written. */
#ifndef PSD_PSCTL_CKPT_H
#define PSD_PSCTL_CKPT_H

#include <jansson.h>

#include "spec.h"

/* Settings shared by both commands. */
struct psd_ctl_opts {
  int json;        /* print one JSON document instead of a table */
  int timeout_ms;  /* deadline of each call */
  int wait;        /* checkpoint: answer once written */
  int slots;       /* export: the optimizer's slots too */
  const char *out; /* export: the file to write */
};

/* Each returns psctl's exit status: 0 every shard did its part, 1 a shard
 * was down or failed (named on stderr), 2 a usage mistake. */
int psd_ctl_checkpoint(const struct cm_spec *spec,
                       const struct psd_ctl_opts *o);
int psd_ctl_export(const struct cm_spec *spec, const struct psd_ctl_opts *o);

/* psctl status's checkpoint table, from the shards' status documents
 * (st[s] NULL for a shard that is down). */
void psd_ctl_print_checkpoints(const struct cm_spec *spec, json_t **st);

#endif
