/* How psd runs a serving task (`psd --task serve:J`, serve_start.c): the
 * serving setup main branches to once the command line and the spec are
 * read (docs/serving.md). */
#ifndef PSD_SERVE_START_H
#define PSD_SERVE_START_H

#include "psd.h"

/* Runs serve:J of srv's spec (configured by psd_server_configure:
 * srv->serving set, srv->replica J, srv->shard J % nps): follows shard
 * J % nps's publications under job.publish.dir, serves Lookup and Status
 * on srv->listen with the spec's token and TLS, logs "ready: listening on
 * ...", and runs until SIGTERM or SIGINT, then stops gracefully. Returns
 * PSD_EXIT_OK, or PSD_EXIT_FAILED when it could not start (said). */
enum psd_exit psd_serve_main(struct psd_server *srv);

#endif
