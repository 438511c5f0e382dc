/* What psctl's files share (psctl has no public header: it is a program).
 * psctl.c parses the command line, asks every shard for its status and
 * runs one command; each command lives in a file of its own (status.c,
 * vars.c, get.c, workers.c, metrics.c, checkpoint.c, export.c, tables.c,
 * serving.c)
 * and works
 * with struct psctl, which main fills. Every shard is reached through
 * libpsclient (psclient.h); psctl links nothing of psd. */
#ifndef PSCTL_PSCTL_H
#define PSCTL_PSCTL_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "psclient.h"
#include "spec.h"
#include "status_json.h"

/* Exit status of a bad command line (always 2, as for every psd program). */
#define PSCTL_EXIT_USAGE 2

/* How psctl reshard moves the rows without --moves or --stop
 * (ReshardRequest.how): 2, a live move where the job can make one (async,
 * tables, rows by buckets), else every shard stops and ps:0 cuts. */
#define PSCTL_RESHARD_HOW 2

/* export's pulls: elements per message, and messages in flight per shard
 * (main gives the client these settings for export). */
#define PSCTL_EXPORT_CHUNK_BYTES (2u << 20)
#define PSCTL_EXPORT_WINDOW 8

/* What every command works with. */
struct psctl {
  const struct cm_spec *spec; /* borrowed: the cluster spec */
  struct psc__client *client; /* borrowed: channels to every shard */
  int json;                   /* --json: one JSON document on stdout */
  json_t **st;      /* per shard: its status (owned), NULL when it is down;
                       NULL for a command that does not ask (checkpoint,
                       export) */
  char **why;       /* per shard: why it did not answer (owned), or NULL */
  int down;         /* shards that did not answer */
  int argc;         /* operands after the command's name */
  char **argv;      /* them (borrowed from main's argv) */
  const char *rows; /* get --rows A:B, or NULL */
  int stats;        /* get --stats */
  int wait;         /* checkpoint --wait */
  int slots;        /* export --slots */
  const char *out;  /* export --out FILE */
  const char *ids;  /* get TABLE --ids A,B,C */
  uint64_t *idv;    /* them parsed (owned; main frees it), NULL without */
  size_t nids;      /* entries in idv */
  int top;          /* top --top K, 0: the default */
  int shards;       /* reshard --shards M, 0: not given */
  int how;          /* reshard: ReshardRequest.how, --moves 1 or --stop 0;
                       -1: neither (PSCTL_RESHARD_HOW) */
  unsigned batch;   /* reshard --batch: buckets per batch, 0: ps:0's */
  double rate;      /* reshard --rate: MB/s at most, 0: no limit */
  int cancel;       /* reshard --cancel */
  int timeout_ms;   /* the deadline of each call (--timeout, else 5000) */
};

/* ---- the commands: each returns psctl's exit status ---- */

int psctl_cmd_status(struct psctl *p);     /* status.c */
int psctl_cmd_vars(struct psctl *p);       /* vars.c */
int psctl_cmd_get(struct psctl *p);        /* get.c */
int psctl_cmd_workers(struct psctl *p);    /* workers.c */
int psctl_cmd_metrics(struct psctl *p);    /* metrics.c */
int psctl_cmd_checkpoint(struct psctl *p); /* checkpoint.c */
int psctl_cmd_export(struct psctl *p);     /* export.c */
int psctl_cmd_tables(struct psctl *p);     /* tables.c */
int psctl_cmd_top(struct psctl *p);        /* tables.c */
int psctl_cmd_shrink(struct psctl *p);     /* tables.c */
int psctl_cmd_serving(struct psctl *p);    /* serving.c */
int psctl_cmd_reshard(struct psctl *p);    /* reshard.c */
/* get TABLE --ids and export TABLE --out: get and export hand over */
int psctl_table_get(struct psctl *p);    /* tables.c */
int psctl_table_export(struct psctl *p); /* tables.c */

/* ---- reading status documents (psctl.c) ---- */

/* A status document's members and named entries: cm_status_int, _num,
 * _str and cm_status_find_named (common/metrics/status_json.h). */

/* Shard s's status document (*doc owned by the caller). Returns 0, or the
 * client's code with psc__client_error and psc__client_last_status saying why
 * (CM_ENOMEM when the document could not be parsed). */
int psctl_status_doc(struct psctl *p, int s, json_t **doc);

/* ---- output (psctl.c) ---- */

/* "[784, 256]" from a JSON array of dimensions. */
void psctl_shape_text(json_t *shape, char *buf, size_t len);

/* Prints a JSON document (borrowed); returns 0 or CM_ENOMEM. */
int psctl_print_json(json_t *doc);

/* [{"shard", "address", "error"}] for the shards that are down (new
 * reference). */
json_t *psctl_down_json(const struct psctl *p);

/* After a table: one line per down shard, so it is named on stdout too. */
void psctl_print_down(const struct psctl *p);

/* A command's exit status from rc: an exit status (> 0), a CM_E* code
 * (< 0, said on stderr, exit 1), or 0: then 1 when a shard is down. */
int psctl_finish(const struct psctl *p, int rc);

/* 0, or says that the command takes no operands and returns
 * PSCTL_EXIT_USAGE. */
int psctl_no_operands(const struct psctl *p, const char *cmd);

/* ---- the shard map (vars.c; get uses it too) ---- */

/* Where one variable lives: its shape and, per shard, its rows. */
struct psctl_var_map {
  const char *name; /* borrowed from a status document */
  json_t *shape;    /* borrowed: the JSON shape */
  int64_t rows;     /* shape[0] */
  uint64_t row_len; /* elements per row */
  int placement;    /* -1 split, else the shard holding it whole */
  int64_t *begin;   /* owned, per shard: first row held */
  int64_t *end;     /* owned, per shard: one past the last */
  json_t **slice;   /* owned array, per shard: its VarStatus (borrowed), or
                       NULL when the shard is down */
};

/* Fills m for variable `name` from the shards that answered; a down
 * shard's rows come from the layout (common/layout/layout.h). Returns 0,
 * CM_ENOENT when no shard that answered knows it, or CM_ENOMEM. */
int psctl_map_var(const struct psctl *p, const char *name,
                  struct psctl_var_map *m);
void psctl_map_free(struct psctl_var_map *m);

/* "no variable 'x' in job 'j' (it has: a, b)" on stderr; returns 1. */
int psctl_no_such_var(const struct psctl *p, const char *name);

/* ---- status's checkpoint table (checkpoint.c) ---- */

/* The CHECKPOINTS table of psctl status, from the shards' status documents
 * (st[s] NULL for a shard that is down). */
void psctl_print_checkpoints(const struct cm_spec *spec, json_t **st);

#endif
