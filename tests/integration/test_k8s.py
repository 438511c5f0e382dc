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
            self.assertIn("k8s:" + path, c["command"])
            mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
            self.assertEqual(mounts["job"], os.path.dirname(path))
        ck = spec["job"].get("checkpoint", {}).get("dir")
        mounts = {m["name"]: m["mountPath"] for m in self.shard["volumeMounts"]}
        self.assertEqual(mounts["checkpoints"], ck)
        claims = [c["metadata"]["name"] for c in self.sts["spec"]["volumeClaimTemplates"]]
        self.assertIn("checkpoints", claims)


class ExitWhenDoneTest(h.ProcTest):
    """job.exit_when_done (the manifests' ConfigMap sets it): real shards on
    127.0.0.1 stop by themselves, exit 0, once both workers have finished,
    so a Kubernetes Job of shards and workers would complete."""

    def test_shards_exit_after_the_workers(self):
        spec = os.path.join(self.d, "spec.json")
        h.write_spec(spec, job={"name": "ewd", "epochs": 1, "max_steps": 60,
                                "log_every": 20, "exit_when_done": True})
        shards = [h.start_psd(spec, i) for i in range(2)]
        self.procs += shards
        for s in shards:
            s.wait_for("job.exit_when_done: this shard stops once every worker")
        workers = [h.Proc([h.build_path("worker", "dworker"), "--cluster", spec,
                           "--task", "worker:%d" % i]) for i in range(2)]
        self.procs += workers
        for w in workers:
            self.assertEqual(w.wait(120), 0, w.output())
        for i, s in enumerate(shards):
            self.assertEqual(s.wait(60), 0, s.output())
            self.assertIn("(job.exit_when_done): stopping", s.output())
            self.assertIn("stopped", s.output().splitlines()[-1])


def print_spec(cluster, env, job_file):
    """pslaunch --cluster CLUSTER:job_file --print-spec in exactly env."""
    e = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    e.update(env)
    r = subprocess.run([h.build_path("deploy", "pslaunch"), "--cluster",
                        cluster + ":" + job_file, "--print-spec"],
                       capture_output=True, text=True, env=e, timeout=30)
    return r


@unittest.skipIf(yaml is None, "python3-yaml is not installed")
class ResolverTest(unittest.TestCase):
    """Each pod's environment, as the manifests give it, replayed against
    the real resolver."""

    def setUp(self):
        self.tmp = h.TempDir()
        self.d = self.tmp.__enter__()
        cm = load("configmap.yaml")[0]
        self.job = os.path.join(self.d, "job.json")
        with open(self.job, "w") as f:
            f.write(cm["data"]["job.json"])
        sts = load("shards.yaml")[0]
        self.env = {k: v for k, v in env_of(
            sts["spec"]["template"]["spec"]["containers"][0]).items() if v}
        self.env["POD_NAMESPACE"] = "ml"
        self.nps = sts["spec"]["replicas"]
        self.nworker = load("workers.yaml")[0]["spec"]["completions"]

    def tearDown(self):
        self.tmp.__exit__(None, None, None)

    def derive(self, **extra):
        r = print_spec("k8s", dict(self.env, **extra), self.job)
        self.assertEqual(r.returncode, 0, r.stderr)
        return json.loads(r.stdout)

    def test_shard_and_worker_pods(self):
        for i in range(self.nps):
            spec = self.derive(HOSTNAME="psd-%d" % i)
            self.assertEqual(spec["task"], {"type": "ps", "index": i})
        self.assertEqual(spec["cluster"]["ps"],
                         ["psd-%d.psd.ml.svc:7100" % i for i in range(self.nps)])
        self.assertEqual(spec["cluster"]["worker"],
                         ["psd-worker-%d.psd.ml.svc:7200" % i
                          for i in range(self.nworker)])
        self.assertTrue(spec["job"]["exit_when_done"])
        for i in range(self.nworker):
            spec = self.derive(HOSTNAME="psd-worker-%d-abcde" % i,
                               JOB_COMPLETION_INDEX=str(i))
            self.assertEqual(spec["task"], {"type": "worker", "index": i})

    def test_mistakes_name_the_variable(self):
        r = print_spec("k8s", dict(self.env, HOSTNAME="web-0"), self.job)
        self.assertEqual(r.returncode, 2)
        self.assertIn('hostname "web-0" is not psd-I', r.stderr)
        env = dict(self.env)
        del env["PSD_K8S_WORKERS"]
        r = print_spec("k8s", dict(env, HOSTNAME="psd-0"), self.job)
        self.assertEqual(r.returncode, 2)
        self.assertIn("PSD_K8S_WORKERS: not set", r.stderr)
        r = print_spec("k8s", dict(self.env, JOB_COMPLETION_INDEX="9"), self.job)
        self.assertEqual(r.returncode, 2)
        self.assertIn("JOB_COMPLETION_INDEX=9", r.stderr)

    def test_kubeflow_tf_config(self):
        """TF_CONFIG as Kubeflow's TFJob injects it: the chief is worker 0,
        the evaluator is noted, "environment" accepted."""
        tf = {"cluster": {"chief": ["tj-chief-0.ns.svc:2222"],
                          "ps": ["tj-ps-0.ns.svc:2222", "tj-ps-1.ns.svc:2222"],
                          "worker": ["tj-worker-0.ns.svc:2222"],
                          "evaluator": ["tj-evaluator-0.ns.svc:2222"]},
              "environment": "cloud"}
        want_workers = ["tj-chief-0.ns.svc:2222", "tj-worker-0.ns.svc:2222"]
        cases = [({"type": "chief", "index": 0}, {"type": "worker", "index": 0}),
                 ({"type": "worker", "index": 0}, {"type": "worker", "index": 1}),
                 ({"type": "ps", "index": 1}, {"type": "ps", "index": 1})]
        for task, want in cases:
            r = print_spec("tf_config", {"TF_CONFIG": json.dumps(
                dict(tf, task=task))}, self.job)
            self.assertEqual(r.returncode, 0, r.stderr)
            spec = json.loads(r.stdout)
            self.assertEqual(spec["cluster"]["worker"], want_workers)
            self.assertEqual(len(spec["cluster"]["ps"]), 2)
            self.assertEqual(spec["task"], want)
            self.assertIn("cluster.evaluator (1 task) is not part of a psd job",
                          r.stderr)
        r = print_spec("tf_config", {"TF_CONFIG": json.dumps(
            dict(tf, task={"type": "evaluator", "index": 0}))}, self.job)
        self.assertEqual(r.returncode, 0, r.stderr)  # noted, not refused
        self.assertNotIn("task", json.loads(r.stdout))
        self.assertIn('"evaluator" is not a psd task', r.stderr)


if __name__ == "__main__":
    h.main()
