/* psd's command line (cmdline.c): the --help text, and configure, which
 * reads the options, the cluster spec, this shard's task and the spec's
 * credentials into a struct psd_server (psd.h). */
#ifndef PSD_CMDLINE_H
#define PSD_CMDLINE_H

#include "psd.h"

/* What psd_server_configure found. */
enum psd_config {
  PSD_CONFIG_RUN = 0, /* configured: serve */
  PSD_CONFIG_HELP,    /* --help was printed on stdout: exit PSD_EXIT_OK */
  PSD_CONFIG_BAD,     /* a bad command line, spec or task, reported on
                         stderr: exit PSD_EXIT_USAGE */
  PSD_CONFIG_RESHARD, /* --reshard: restore the checkpoint, then exit */
};

/* Fills srv (zeroed by the caller) from argv and the spec it names: the
 * spec (srv->spec, owned by srv even when this fails), the shard, the
 * address to listen on, the credentials and the checkpoint options. */
enum psd_config psd_server_configure(struct psd_server *srv, int argc,
                                     char **argv);

#endif
