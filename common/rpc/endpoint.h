/* Where a client reaches a shard. A shard also listens on a Unix-domain
 * socket whose path follows from the job name and the shard's address in
 * the spec, so that a client on the same host finds it without any
 * configuration; clients on other hosts use TCP as before.
 *
 * The socket is named "psd-<job>-<port>.sock" (characters of the job name
 * other than letters, digits, '-', '_' and '.' become '_') in a directory
 * only psd's user can enter, since whoever makes that path receives the
 * bearer token and the gradients of every client that connects. The
 * directory is the first of:
 *   $PSD_SOCKET_DIR, an explicit choice;
 *   $RUNTIME_DIRECTORY (the first when it lists several), systemd's
 *     RuntimeDirectory= of the units;
 *   $XDG_RUNTIME_DIR/psd, else /run/user/<uid>/psd, when that runtime
 *     directory exists and belongs to this user;
 *   /tmp/psd-<uid>, a private directory of this user's.
 * psd makes the last component (mode 0700) and refuses a directory that is
 * a symbolic link, belongs to another user or lets group or others in. A
 * client finds the directory by the same rule (same user, same
 * environment) and trusts a socket only when both the file and the process
 * listening on it belong to its own user, root, or the user the spec's
 * job.socket_owner names. */
#ifndef CM_ENDPOINT_H
#define CM_ENDPOINT_H

#include <stddef.h>
#include <sys/types.h>

struct cm_addr;

/* Writes this user's socket directory (the rule above) to buf, and to
 * *from (when not NULL) a static string naming what chose it, for
 * messages. Makes and checks nothing. Returns 0, or CM_EINVAL when it does
 * not fit. */
int cm_endpoint_unix_dir(char *buf, size_t len, const char **from);

/* psd's side of the rule: makes dir (mode 0700; its parent must exist) when
 * it is missing, and checks that it is a directory, not a symbolic link,
 * owned by this process's effective uid, with no permission for group or
 * others. Returns 0, or CM_EEXIST (a directory psd must not use) or CM_ESYS
 * (cannot make or inspect it) with why naming the directory, what is wrong
 * and the fix. */
int cm_endpoint_unix_claim_dir(const char *dir, char *why, size_t len);

/* Writes the shard's Unix socket path (without the "unix:" prefix) for a
 * job and the shard's address in the spec, in cm_endpoint_unix_dir's
 * directory. Returns 0, or CM_EINVAL when the path would not fit a socket
 * address. */
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

/* Listens on the Unix socket path, in a directory that
 * cm_endpoint_unix_claim_dir accepts (made when missing). A socket file
 * nobody listens on (left by a psd that was killed) is replaced; a live
 * one is refused with CM_EADDRINUSE, any other file with CM_EEXIST. The
 * socket file gets mode 0600. *fd is non-blocking and close-on-exec.
 * Returns 0 or a negative code with the reason in why. */
int cm_endpoint_unix_listen(const char *path, int *fd, char *why, size_t len);

/* Connects to the Unix socket path and tunes the socket, once the socket
 * file and then the process listening on it (SO_PEERCRED) are found to
 * belong to this process's effective uid, root, or owner (the spec's
 * job.socket_owner: a user name or a numeric uid; "" or NULL for none).
 * Returns 0 with *fd; CM_EEXIST when the owner is someone else, with why
 * saying whose it is and the fix (the caller reports it); or CM_EUNAVAIL
 * (nobody listens, or the buffers stay small) or another negative code,
 * with nothing to report. */
int cm_endpoint_unix_connect(const char *path, const char *owner, int *fd,
                             char *why, size_t len);

/* 0 when uid may own a same-host socket (or, at a shard, connect to its
 * .shm socket): this process's own user, root, or `owner` (the spec's
 * job.socket_owner, "" or NULL for none). Else CM_EEXIST, with why saying
 * whose `what` is. */
int cm_endpoint_check_owner(const char *what, uid_t uid, const char *owner,
                            char *why, size_t len);

/* Whether a client should try the Unix socket of shard: allowed
 * (use_unix), a socket exists at the path, and the shard's host is this
 * machine (cm_addr_is_local). Writes the path to buf; returns 1 when it
 * should, else 0. */
int cm_endpoint_unix_candidate(const char *job, const struct cm_addr *shard,
                               int use_unix, char *buf, size_t len);

#endif
