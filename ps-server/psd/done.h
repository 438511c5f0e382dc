/* job.exit_when_done (done.c): a shard that stops by itself once every
 * worker of its job has finished, so that an engine that waits for every
 * process of a job (Kubernetes' Job, a Kubeflow TFJob, an sbatch script)
 * sees it complete: shards would otherwise serve forever. */
#ifndef PSD_DONE_H
#define PSD_DONE_H

#include <uv.h>

struct psd_server;

/* Asks ps:0 (this shard's own coordinator, or over the network) every
 * second how the spec's workers stand (its Status through peer.h, each
 * worker judged by libpsclient's psc__worker_judge, the rule pslaunch
 * keeps to as well); once every one
 * has finished or been declared dead (a worker that never joined is
 * waited for), or every one had left and ps:0 is gone, logs why and stops
 * the loop as SIGTERM would (the final checkpoint is written).
 * Uses srv->loop; 0 or a negative code. */
int psd_done_start(struct psd_server *srv);

/* Frees what psd_done_start made (after the loop has stopped). */
void psd_done_free(struct psd_server *srv);

#endif
