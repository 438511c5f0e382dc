/* The shard's Unix socket for clients on the same host (common/rpc/endpoint.h
 * says why psd accepts these connections itself): a listening socket
 * watched by the libuv loop; each connection gets large socket buffers and
 * is handed to the gRPC server. */
#ifndef PSD_LOCAL_H
#define PSD_LOCAL_H

#include <uv.h>

#include "rpc_server.h"

struct psd_local;

/* Listens on path (cm_endpoint_unix_listen: in a private directory of
 * psd's user, over a stale socket only) and serves its connections through
 * server (borrowed; started already) from loop's thread. Returns 0, or a
 * negative code with the reason in why (nothing listens then, and no
 * socket file is left): CM_EEXIST for a directory or file psd must not
 * use, CM_EADDRINUSE for a live socket of another process. */
int psd_local_start(struct psd_local **out, uv_loop_t *loop,
                    struct cm_server *server, const char *path, char *why,
                    size_t len);

/* Stops listening and removes the socket file (unless another process has
 * replaced it since); connections already handed to gRPC end with the
 * server. Frees l (NULL is fine); the handle is closed
 * through the loop, which must run once more. */
void psd_local_stop(struct psd_local *l);

/* Connections accepted so far. */
unsigned long psd_local_accepted(const struct psd_local *l);

#endif
