/* Internal to common/rpc: what rpc_server.c and rpc_client.c share beyond
 * rpc.h. */
#ifndef CM_RPC_INTERNAL_H
#define CM_RPC_INTERNAL_H

#include <stddef.h>

#include <grpc/grpc.h>

/* Writes into a[] (room for 4) the arguments every server (server 1) or
 * channel (server 0) is made with, and their count into *n: the message
 * limit in force, then a server's or a channel's own. */
void cm__rpc_build_args(grpc_arg *a, size_t *n, int server);

#endif
