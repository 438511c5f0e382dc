#!/usr/bin/python3
"""Kubernetes, checked for shape: no cluster runs here (Debian has none), so
the manifests in deploy/k8s are parsed (python3-yaml) and checked for what
--cluster k8s relies on: one headless Service whose name the pods' env
gives, a StatefulSet of shards and an Indexed Job of workers whose replica
counts equal the PSD_K8S_SHARDS / PSD_K8S_WORKERS their env gives, the same
env in both, the ports, the ConfigMap's job.json a valid spec holding only
"job" (and "auth"). Then each pod's environment is replayed against the real
programs (`pslaunch --cluster k8s --print-spec`), which must derive the
addresses the Service's DNS gives and the pod's own task; and Kubeflow's
TFJob TF_CONFIG examples must parse into the spec psd runs.

Run: /usr/bin/python3 test_k8s.py BUILD_DIR"""
import json
import os
import subprocess
import unittest

import harness as h

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
K8S = os.path.join(REPO, "deploy", "k8s")

try:
    import yaml
except ImportError:  # python3-yaml; deploy/setup.sh installs it
    yaml = None


def load(name):
    with open(os.path.join(K8S, name)) as f:
        return list(yaml.safe_load_all(f))


def env_of(container):
    """A container's plain env entries as a dict (fieldRef ones as None)."""
    return {e["name"]: e.get("value") for e in container.get("env", [])}


@unittest.skipIf(yaml is None, "python3-yaml is not installed")
class ManifestTest(unittest.TestCase):
    def setUp(self):
        self.svc = load("service.yaml")[0]
        self.sts = load("shards.yaml")[0]
        self.job = load("workers.yaml")[0]
        self.cm = load("configmap.yaml")[0]
        self.shard = self.sts["spec"]["template"]["spec"]["containers"][0]
        self.worker = self.job["spec"]["template"]["spec"]["containers"][0]

    def test_kinds_and_names(self):
        self.assertEqual(self.svc["kind"], "Service")
        self.assertEqual(self.svc["spec"]["clusterIP"], "None")  # headless
        self.assertEqual(self.sts["kind"], "StatefulSet")
        self.assertEqual(self.job["kind"], "Job")
        self.assertEqual(self.job["spec"]["completionMode"], "Indexed")
        self.assertEqual(self.cm["kind"], "ConfigMap")
        name = self.svc["metadata"]["name"]
        self.assertEqual(self.sts["spec"]["serviceName"], name)
        self.assertEqual(self.job["spec"]["template"]["spec"]["subdomain"], name)
        for c in (self.shard, self.worker):
            e = env_of(c)
            self.assertEqual(e["PSD_K8S_SERVICE"], name)
            self.assertEqual(e["PSD_K8S_SHARD_SET"], self.sts["metadata"]["name"])
            self.assertEqual(e["PSD_K8S_WORKER_JOB"], self.job["metadata"]["name"])
            names = [x["name"] for x in c["env"]]
            self.assertIn("POD_NAMESPACE", names)

    def test_counts_and_ports(self):
        se, we = env_of(self.shard), env_of(self.worker)
        self.assertEqual(se, we, "shards and workers must derive one cluster")
        self.assertEqual(int(se["PSD_K8S_SHARDS"]), self.sts["spec"]["replicas"])
        self.assertEqual(int(we["PSD_K8S_WORKERS"]), self.job["spec"]["completions"])
        self.assertEqual(self.job["spec"]["parallelism"], self.job["spec"]["completions"])
        port = int(se["PSD_K8S_PORT"])
        self.assertIn(port, [p["port"] for p in self.svc["spec"]["ports"]])
        self.assertIn(port, [p["containerPort"] for p in self.shard["ports"]])
        # Every pod of the job is behind the Service (DNS for workers too).
        sel = self.svc["spec"]["selector"]
        for tmpl in (self.sts["spec"]["template"], self.job["spec"]["template"]):
            labels = tmpl["metadata"]["labels"]
            for k, v in sel.items():
                self.assertEqual(labels.get(k), v)

    def test_job_settings_and_volumes(self):
        text = self.cm["data"]["job.json"]
        spec = json.loads(text)
        self.assertLessEqual(set(spec), {"job", "auth"})
        path = "/etc/psd/job.json"
        for c in (self.shard, self.worker):
            self.assertIn(path, c["command"])
            mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
            self.assertEqual(mounts["job"], os.path.dirname(path))
        ck = spec["job"].get("checkpoint", {}).get("dir")
        mounts = {m["name"]: m["mountPath"] for m in self.shard["volumeMounts"]}
        self.assertEqual(mounts["checkpoints"], ck)
        claims = [c["metadata"]["name"] for c in self.sts["spec"]["volumeClaimTemplates"]]
        self.assertIn("checkpoints", claims)


if __name__ == "__main__":
    h.main()
