/* A cluster spec derived from a Kubernetes pod's environment
 * (--cluster k8s[:FILE]), for the manifests in deploy/k8s: the shards are
 * the pods of an Indexed Job SET (or of a StatefulSet SET: SET-0, SET-1,
 * ...) and the workers those of an Indexed Job JOB (JOB-0, ...), all under
 * one headless Service (the Jobs' subdomain), so that shard i is
 * SET-i.SERVICE.NAMESPACE.svc:PORT and worker i
 * JOB-i.SERVICE.NAMESPACE.svc:WORKER_PORT. This pod's task comes from its
 * hostname: SET-I is ps:I, JOB-I worker:I; JOB_COMPLETION_INDEX, when
 * Kubernetes set it (an Indexed Job's pod), must say the same I.
 *
 * The environment (the manifests in deploy/k8s set it): PSD_K8S_SHARDS and
 * PSD_K8S_WORKERS (the replica counts; required), PSD_K8S_SERVICE [psd],
 * PSD_K8S_SHARD_SET [psd], PSD_K8S_WORKER_JOB [psd-worker], PSD_K8S_PORT
 * [7100], PSD_K8S_WORKER_PORT [7200], POD_NAMESPACE (else the service
 * account's namespace file, else "default"), HOSTNAME (else
 * gethostname()), JOB_COMPLETION_INDEX. FILE holds the job's settings ("job"
 * and "auth"). */
#ifndef CM_K8S_H
#define CM_K8S_H

#include "spec.h"

/* Derives the spec from envp (NULL-terminated "NAME=VALUE" strings; NULL:
 * this process's) and the job file `file` (NULL: every default), as
 * cm_slurm_spec does: *out (free with cm_spec_free) and, when json is not
 * NULL, the derived spec's text in *json (free with free()). Returns 0, or
 * CM_ESPEC (CM_ENOENT, CM_EIO for FILE) with every mistake in err, one per
 * line, naming the variable or FILE's JSON path. */
int cm_k8s_spec(const char *file, char *const *envp, struct cm_spec **out,
                char **json, char *err, size_t errlen);

/* The spec of a Kubeflow TFJob's pod (--cluster tf_config[:FILE]): the
 * cluster and the task from the TF_CONFIG text tf_config (NULL: the
 * environment's) as Kubeflow injects it (a "chief" is worker 0, evaluators
 * are noted; spec.h), the job's settings from FILE ("job" and "auth").
 * Returns as cm_k8s_spec. */
int cm_tf_config_spec(const char *file, const char *tf_config,
                      struct cm_spec **out, char **json, char *err,
                      size_t errlen);

#endif
