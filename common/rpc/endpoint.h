/* Where a client reaches a shard. A shard also listens on a Unix-domain
 * socket whose path follows from the job name and the shard's address in
 * the spec, so that a client on the same host finds it without any
 * configuration; clients on other hosts use TCP as before.
 *
 * The socket lives in $PSD_SOCKET_DIR, default /tmp, named
 * "psd-<job>-<port>.sock" (characters of the job name other than letters,
 * digits, '-', '_' and '.' become '_'). */
#ifndef CM_ENDPOINT_H
#define CM_ENDPOINT_H

#include <stddef.h>

struct cm_addr;

/* Writes the shard's Unix socket path (without the "unix:" prefix) for a
 * job and the shard's address in the spec. Returns 0, or CM_EINVAL when the
 * path would not fit a socket address. */
int cm_endpoint_unix_path(const char *job, const struct cm_addr *shard,
                          char *buf, size_t len);

/* Unix sockets carry tensors faster than loopback TCP only with socket
 * buffers of a few MiB: with the kernel's default 208 KiB a 1 MiB message
 * takes several wake-ups each way, and the demo job trains 20% slower than
 * over TCP. The sockets are therefore made by psd and libpsclient themselves
 * (and handed to gRPC) with CM_ENDPOINT_SOCKBUF buffers, and used only where
 * the kernel grants at least CM_ENDPOINT_MIN_SOCKBUF (net.core.wmem_max). */
#define CM_ENDPOINT_SOCKBUF (4 << 20)
#define CM_ENDPOINT_MIN_SOCKBUF (1 << 20)

/* 0 when this kernel lets a socket's send buffer reach
 * CM_ENDPOINT_MIN_SOCKBUF; else CM_EUNAVAIL with the reason in why. */
int cm_endpoint_unix_usable(char *why, size_t len);

/* Sets fd's send and receive buffers to CM_ENDPOINT_SOCKBUF (as far as the
 * kernel allows) and makes it non-blocking. Returns 0, or CM_EUNAVAIL when
 * the send buffer stays below CM_ENDPOINT_MIN_SOCKBUF. */
int cm_endpoint_tune(int fd);

/* Listens on the Unix socket path (a socket file left there is replaced;
 * any other file is refused with CM_EEXIST). *fd is non-blocking and
 * close-on-exec. Returns 0 or a negative code with the reason in why. */
int cm_endpoint_unix_listen(const char *path, int *fd, char *why, size_t len);

/* Connects to the Unix socket path and tunes the socket. Returns 0 with *fd,
 * or a negative code (CM_EUNAVAIL: nobody listens, or the buffers stay
 * small). */
int cm_endpoint_unix_connect(const char *path, int *fd);

/* Whether a client should try the Unix socket of shard: allowed
 * (use_unix), a socket exists at the path, and the shard's host is this
 * machine (cm_addr_is_local). Writes the path to buf; returns 1 when it
 * should, else 0. */
int cm_endpoint_unix_candidate(const char *job, const struct cm_addr *shard,
                               int use_unix, char *buf, size_t len);

#endif
