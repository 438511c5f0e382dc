/* How psd starts serving (startup.c), in the order main calls it: restore
 * the store from the newest checkpoint, open the service, the coordinator
 * (shard 0) and the gRPC server, serve GET /metrics over HTTP when asked
 * (metrics.h), serve the job's Unix socket too, and say
 * who may call, what is refused and that the shard is ready. Each failure
 * is logged where it happens, with the fix. */
#ifndef PSD_STARTUP_H
#define PSD_STARTUP_H

#include "psd.h"

/* Settles where checkpoints go (--checkpoint-dir, the spec's
 * job.checkpoint.dir, $STATE_DIRECTORY) and restores the newest one that
 * verifies into srv->store (and srv->dedup). Returns PSD_EXIT_OK (also when
 * checkpoints are off or none exists yet), PSD_EXIT_FAILED when the
 * directory cannot be used or none of its checkpoints verifies, or
 * PSD_EXIT_USAGE for --resume-step without a checkpoint dir. */
enum psd_exit psd_server_restore(struct psd_server *srv);

/* psd --reshard: restores the job's newest checkpoint onto the spec's
 * shard count (reshard.h) and says what moved. Returns PSD_EXIT_OK,
 * PSD_EXIT_FAILED (said; nothing changed) or PSD_EXIT_USAGE (no checkpoint
 * dir). */
enum psd_exit psd_server_reshard(struct psd_server *srv);

/* Opens the store (unless restored), the service, the checkpoint saver,
 * the coordinator on shard 0 and the gRPC server, and starts serving.
 * Returns PSD_EXIT_OK or PSD_EXIT_FAILED (reported). */
enum psd_exit psd_server_open(struct psd_server *srv);

/* Serves the job's Unix socket too, so that clients on this host skip TCP
 * (common/rpc/endpoint.h), once srv->loop exists. Not being able to is a
 * warning: TCP serves. */
void psd_server_start_local(struct psd_server *srv);

/* Serves GET /metrics on srv->metrics_addr (metrics.h), when set, and says
 * where. Returns PSD_EXIT_OK, or PSD_EXIT_FAILED when it cannot listen
 * there (said). */
enum psd_exit psd_server_start_metrics(struct psd_server *srv);

/* Logs who may call this task: the token and TLS, or none. */
void psd_server_log_security(struct psd_server *srv);

/* Logs who may call this shard, what it refuses beyond the per-field
 * checks, and "ready: listening on ...", the line operators and tests wait
 * for. */
void psd_server_log_ready(struct psd_server *srv);

#endif
