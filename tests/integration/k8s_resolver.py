"""Kubernetes: each pod's environment, as deploy/k8s's manifests give it,
replayed against the real resolver (`pslaunch --cluster k8s --print-spec`),
and Kubeflow's TFJob TF_CONFIG examples; part of integration-k8s
(test_k8s.py runs these cases with its own)."""
import json
import os
import subprocess
import unittest

import harness as h

try:
    import yaml
    import k8s_pods as kp
except ImportError:  # python3-yaml; deploy/setup.sh installs it
    yaml = None


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
        m = kp.Manifests()
        self.job = os.path.join(self.d, "job.json")
        # Only "job": auth's files are the Secret's, not here.
        settings = json.loads(m.cm["data"]["job.json"])
        with open(self.job, "w") as f:
            json.dump({"job": settings["job"]}, f)
        self.env = {k: v for k, v in kp.env_of(m.container(m.shards)).items() if v}
        self.env["POD_NAMESPACE"] = "ml"
        self.nps = m.shards["spec"]["completions"]
        self.nworker = m.workers["spec"]["completions"]

    def tearDown(self):
        self.tmp.__exit__(None, None, None)

    def derive(self, **extra):
        r = print_spec("k8s", dict(self.env, **extra), self.job)
        self.assertEqual(r.returncode, 0, r.stderr)
        return json.loads(r.stdout)

    def test_shard_and_worker_pods(self):
        """The hostnames and indexes an Indexed Job gives its pods."""
        for i in range(self.nps):
            spec = self.derive(HOSTNAME="psd-%d" % i, JOB_COMPLETION_INDEX=str(i))
            self.assertEqual(spec["task"], {"type": "ps", "index": i})
        self.assertEqual(spec["cluster"]["ps"],
                         ["psd-%d.psd.ml.svc:7100" % i for i in range(self.nps)])
        self.assertEqual(spec["cluster"]["worker"],
                         ["psd-worker-%d.psd.ml.svc:7200" % i
                          for i in range(self.nworker)])
        self.assertTrue(spec["job"]["exit_when_done"])
        for i in range(self.nworker):
            spec = self.derive(HOSTNAME="psd-worker-%d" % i,
                               JOB_COMPLETION_INDEX=str(i))
            self.assertEqual(spec["task"], {"type": "worker", "index": i})
        # A StatefulSet's shard (no index) still derives its task.
        spec = self.derive(HOSTNAME="psd-1")
        self.assertEqual(spec["task"], {"type": "ps", "index": 1})

    def test_mistakes_name_the_variable(self):
        r = print_spec("k8s", dict(self.env, HOSTNAME="web-0"), self.job)
        self.assertEqual(r.returncode, 2)
        self.assertIn('its hostname "web-0" is neither psd-I for I in 0..1', r.stderr)
        env = dict(self.env)
        del env["PSD_K8S_WORKERS"]
        r = print_spec("k8s", dict(env, HOSTNAME="psd-0"), self.job)
        self.assertEqual(r.returncode, 2)
        self.assertIn("PSD_K8S_WORKERS: not set", r.stderr)
        r = print_spec("k8s", dict(self.env, HOSTNAME="psd-worker-9",
                                   JOB_COMPLETION_INDEX="9"), self.job)
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
