#!/usr/bin/python3
"""Kubernetes, checked for shape and replayed: no cluster runs here (Debian
has none), so the manifests in deploy/k8s are parsed (python3-yaml) and
checked for what --cluster k8s relies on: one headless Service that both
Indexed Jobs (the shards', the workers') name as their pods' subdomain, the
Jobs' counts equal to the PSD_K8S_SHARDS / PSD_K8S_WORKERS their env gives,
the same env in both, no StatefulSet (a pod that exits is restarted), the
ports, the ConfigMap's job.json a valid spec holding only "job" and "auth",
the Secret's token and TLS (make-secret.sh) mounted where "auth" names them
(the workers without the shards' key), the metrics port and Prometheus's
scrape annotations. Each pod's environment is replayed against the real
programs (`pslaunch --cluster k8s --print-spec`), which must derive the
addresses the Service's DNS gives and the pod's own task, and Kubeflow's
TFJob TF_CONFIG examples must parse into the spec psd runs. Then the job
runs: every pod a process with the manifest's command, environment and
volumes (k8s_pods.py), until both Jobs complete. deploy/k8s/reshard (the
reshard Job, the checkpoints' claim, set-shards.sh) is checked, and a job
is taken from 2 shards to 3 as docs/reshard-deploy.md says, replayed the
same way.

Run: /usr/bin/python3 test_k8s.py BUILD_DIR"""
import json
import os
import re
import shutil
import signal
import subprocess
import unittest

import harness as h
import k8s_resolver

try:
    import yaml
    import k8s_pods as kp
except ImportError:  # python3-yaml; deploy/setup.sh installs it
    yaml = None


def mounts_of(container):
    return {m["name"]: m["mountPath"] for m in container.get("volumeMounts", [])}


@unittest.skipIf(yaml is None, "python3-yaml is not installed")
class ManifestTest(unittest.TestCase):
    def setUp(self):
        self.m = kp.Manifests()
        self.svc, self.cm = self.m.svc, self.m.cm
        self.shard = self.m.container(self.m.shards)
        self.worker = self.m.container(self.m.workers)
        self.settings = json.loads(self.cm["data"]["job.json"])

    def test_kinds_and_names(self):
        self.assertEqual(self.svc["kind"], "Service")
        self.assertEqual(self.svc["spec"]["clusterIP"], "None")  # headless
        self.assertEqual(self.cm["kind"], "ConfigMap")
        name = self.svc["metadata"]["name"]
        for job in (self.m.shards, self.m.workers):
            self.assertEqual(job["kind"], "Job")
            self.assertEqual(job["spec"]["completionMode"], "Indexed")
            self.assertEqual(self.m.pod_spec(job)["subdomain"], name)
        for c in (self.shard, self.worker):
            e = kp.env_of(c)
            self.assertEqual(e["PSD_K8S_SERVICE"], name)
            self.assertEqual(e["PSD_K8S_SHARD_SET"], self.m.shards["metadata"]["name"])
            self.assertEqual(e["PSD_K8S_WORKER_JOB"], self.m.workers["metadata"]["name"])
            names = [x["name"] for x in c["env"]]
            self.assertIn("POD_NAMESPACE", names)

    def test_nothing_restarts_a_finished_shard(self):
        """job.exit_when_done ends the shards with exit 0: in a Job that is
        a completed pod; a StatefulSet (or restartPolicy Always) would start
        it again, to wait for workers that never come."""
        self.assertTrue(self.settings["job"]["exit_when_done"])
        kinds = [d["kind"] for f in sorted(os.listdir(kp.K8S)) if f.endswith(".yaml")
                 for d in kp.load(f)]
        self.assertNotIn("StatefulSet", kinds)
        self.assertNotIn("Deployment", kinds)
        for job in (self.m.shards, self.m.workers):
            self.assertIn(self.m.pod_spec(job)["restartPolicy"], ("OnFailure", "Never"))
            # A bounded number of retries: a crash loop ends the Job.
            self.assertLessEqual(job["spec"]["backoffLimit"], 10)

    def test_counts_and_ports(self):
        se, we = kp.env_of(self.shard), kp.env_of(self.worker)
        self.assertEqual(se, we, "shards and workers must derive one cluster")
        for job, var in ((self.m.shards, "PSD_K8S_SHARDS"),
                         (self.m.workers, "PSD_K8S_WORKERS")):
            self.assertEqual(int(se[var]), job["spec"]["completions"])
            self.assertEqual(job["spec"]["parallelism"], job["spec"]["completions"])
        port = int(se["PSD_K8S_PORT"])
        self.assertIn(port, [p["port"] for p in self.svc["spec"]["ports"]])
        self.assertIn(port, [p["containerPort"] for p in self.shard["ports"]])
        self.assertIn("0.0.0.0:%d" % port, self.shard["command"])
        # Every pod of the job is behind the Service (DNS for workers too).
        sel = self.svc["spec"]["selector"]
        for job in (self.m.shards, self.m.workers):
            labels = job["spec"]["template"]["metadata"]["labels"]
            for k, v in sel.items():
                self.assertEqual(labels.get(k), v)

    def test_metrics_port_and_scrape_annotations(self):
        """Each shard serves GET /metrics (psd --metrics-listen) on a port
        its pod names, and Prometheus's pod discovery finds it by the
        annotations: the port, the path, https since auth.tls is on."""
        cmd = self.shard["command"]
        self.assertIn("--metrics-listen", cmd)
        listen = cmd[cmd.index("--metrics-listen") + 1]
        self.assertTrue(listen.startswith("0.0.0.0:"), listen)
        mport = int(listen.split(":")[1])
        ports = {p["name"]: p["containerPort"] for p in self.shard["ports"]}
        self.assertEqual(ports["metrics"], mport)
        ann = self.m.shards["spec"]["template"]["metadata"]["annotations"]
        self.assertEqual(ann["prometheus.io/scrape"], "true")
        self.assertEqual(ann["prometheus.io/port"], str(mport))
        self.assertEqual(ann["prometheus.io/path"], "/metrics")
        self.assertEqual(ann["prometheus.io/scheme"],
                         "https" if "tls" in self.settings["auth"] else "http")

    def test_token_and_tls_from_the_secret(self):
        """auth names the files of the Secret's volume: the shards hold the
        token, the CA, their certificate and key; the workers the token and
        the CA alone; no file is readable by others (mode 0440, group the
        pods' fsGroup, the user psd the image runs as)."""
        auth = self.settings["auth"]
        files = [auth["token_file"]] + [auth["tls"][k] for k in ("ca", "cert", "key")]
        _, doc = kp.make_secret()
        self.assertEqual(doc["kind"], "Secret")
        for job, need in ((self.m.shards, files),
                          (self.m.workers, [auth["token_file"], auth["tls"]["ca"]])):
            c, spec = self.m.container(job), self.m.pod_spec(job)
            vol = [v for v in spec["volumes"] if "secret" in v]
            self.assertEqual(len(vol), 1, job["metadata"]["name"])
            sv = vol[0]["secret"]
            self.assertEqual(sv["secretName"], doc["metadata"]["name"])
            self.assertEqual(sv["defaultMode"] & 0o007, 0, oct(sv["defaultMode"]))
            mount = mounts_of(c)[vol[0]["name"]]
            keys = [i["key"] for i in sv["items"]] if "items" in sv else list(doc["data"])
            for key in keys:
                self.assertIn(key, doc["data"])
            given = {os.path.join(mount, k) for k in keys}
            self.assertLessEqual(set(need), given, job["metadata"]["name"])
            if job is self.m.workers:  # never the shards' private key
                self.assertNotIn(auth["tls"]["key"], given)
            sc = spec["securityContext"]
            self.assertTrue(sc["runAsNonRoot"])
            self.assertEqual(sc["fsGroup"], sc["runAsGroup"])
        # One certificate for every shard, whatever the namespace.
        self.assertEqual(auth["tls"]["server_name"], "psd")

    def test_job_settings_and_volumes(self):
        self.assertLessEqual(set(self.settings), {"job", "auth"})
        path = "/etc/psd/job.json"
        for c in (self.shard, self.worker):
            self.assertIn("k8s:" + path, c["command"])
            self.assertEqual(mounts_of(c)["job"], os.path.dirname(path))
        ck = self.settings["job"].get("checkpoint", {}).get("dir")
        self.assertEqual(mounts_of(self.shard)["checkpoints"], ck)
        self.assertIn("emptyDir", self.m.volume(self.m.shards, "checkpoints"))


@unittest.skipIf(yaml is None, "python3-yaml is not installed")
class SecretTest(unittest.TestCase):
    """make-secret.sh's certificate: signed by its CA, naming the ConfigMap's
    tls.server_name, with a key that is the certificate's."""

    @unittest.skipUnless(shutil.which("openssl"), "the openssl command is not installed")
    def test_certificate(self):
        data, _ = kp.make_secret()
        with h.TempDir() as d:
            for k, v in data.items():
                with open(os.path.join(d, k), "wb") as f:
                    f.write(v)
            r = subprocess.run(["openssl", "verify", "-CAfile", "ca.crt", "tls.crt"],
                               cwd=d, capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            r = subprocess.run(["openssl", "x509", "-in", "tls.crt", "-noout", "-ext",
                                "subjectAltName"], cwd=d, capture_output=True, text=True)
            self.assertIn("DNS:psd", r.stdout)
            pubs = [subprocess.run(["openssl"] + a, cwd=d, capture_output=True).stdout
                    for a in (["x509", "-in", "tls.crt", "-noout", "-pubkey"],
                              ["pkey", "-in", "tls.key", "-pubout"])]
            self.assertEqual(pubs[0], pubs[1])
        self.assertGreaterEqual(len(data["token"].strip()), 32)


DATA = "/usr/share/datasets/fashion-mnist"


def short_job(doc):
    """The ConfigMap's job, shortened for the suite: 60 steps of one epoch."""
    doc["job"].update(epochs=1, max_steps=60, log_every=20)


@unittest.skipIf(yaml is None, "python3-yaml is not installed")
class PodReplay(h.ProcTest):
    """What JobReplayTest and ReshardReplayTest share: pods replayed as
    processes (k8s_pods.py), as root, with the Secret of make-secret.sh."""

    def setUp(self):
        super().setUp()
        if os.geteuid() != 0:
            self.skipTest("needs root: each pod runs in a mount namespace of its "
                          "own (unshare) whose /etc/hosts names the pods")
        for tool in ("unshare", "setpriv", "openssl"):
            if not shutil.which(tool):
                self.skipTest("%s is not installed" % tool)
        if not os.path.isdir(DATA):
            self.skipTest("no %s (Debian's dataset-fashion-mnist)" % DATA)
        self.secret, _ = kp.make_secret()

    def use(self, manifests, root, edit=None):
        """Replays manifests' pods under root (their volumes made, the job
        edited: edit(doc), else shortened): self.m, self.replay,
        self.settings."""
        self.m = manifests
        os.makedirs(root, exist_ok=True)
        os.chmod(self.d, 0o755)  # the pods' user reaches root
        self.replay = kp.Replay(self.m, root)
        self.settings = json.loads(self.m.cm["data"]["job.json"])
        for pod in self.replay.pods():
            self.make(pod, edit or short_job)

    def make(self, pod, edit):
        """The pod's volumes, its job.json's paths in its own directory; the
        claims under the test's directory, shared by every replay."""
        pod.make_volumes(self.m.cm["data"], self.secret, edit,
                         claims=os.path.join(self.d, "claims"))
        path = pod.host_path("/etc/psd/job.json")
        with open(path) as f:
            text = pod.rewrite(f.read())
        with open(path, "w") as f:
            f.write(text)

    def as_user(self, pod):
        """setpriv's arguments that run a command as the pod's user
        (runAsUser, runAsGroup, fsGroup), or none where that user cannot
        run the build's programs (a build tree in root's home)."""
        sc = pod.spec.get("securityContext", {})
        ids = [str(sc.get(k, 0)) for k in ("runAsUser", "runAsGroup", "fsGroup")]
        user = ["setpriv", "--reuid", ids[0], "--regid", ids[1], "--groups", ids[2], "--"]
        if subprocess.run(user + ["test", "-x", h.build_path("ps-server", "psd")]).returncode:
            print("k8s: note: uid %s cannot run %s: the pods run as root" % (ids[0], h.BUILD))
            return []
        return user

    def start(self, pod, extra=(), argv=None):
        """pod's command (or argv, a program run in the pod as kubectl exec
        runs it) with extra arguments, as a process: its environment, its
        view of the Service's names, its user."""
        user = self.as_user(pod)
        env = dict(pod.env, GRPC_DNS_RESOLVER="native")
        if "/tmp" in pod.mounts:
            # The pod's own /tmp (an emptyDir) for psd's socket directory,
            # which would be /tmp/psd-UID, shared by every pod of this host.
            env["PSD_SOCKET_DIR"] = pod.host_path("/tmp") + "/psd"
        programs = {"psd": h.build_path("ps-server", "psd"),
                    "dworker": h.build_path("worker", "dworker")}
        argv = (["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                 'mount --bind "$0" /etc/hosts && exec "$@"', self.replay.hosts]
                + user + (argv or pod.argv(self.replay.port_map, programs.get, True))
                + list(extra))
        p = h.Proc(argv, env=env)
        self.procs.append(p)
        return p


@unittest.skipIf(yaml is None, "python3-yaml is not installed")
class JobReplayTest(PodReplay):
    """Both Jobs run to completion as the manifests write them, each pod a
    process (k8s_pods.py): the manifest's command and environment, its
    volumes (the ConfigMap's job.json, shortened to 60 steps; the Secret
    from make-secret.sh, mode 0440, group the fsGroup; emptyDirs), a mount
    namespace of its own whose /etc/hosts resolves the Service's names to
    one loopback address per pod, and the pod's user (runAsUser). The
    shards serve TLS and demand the token; Prometheus scrapes them as the
    annotations say; a worker without the token is refused; once the
    workers finish, every shard exits 0 by itself after its final
    checkpoint, so both Jobs complete and no pod would be restarted
    (restartPolicy OnFailure)."""

    def setUp(self):
        super().setUp()
        self.use(kp.Manifests(), self.d)

    def test_both_jobs_complete(self):
        auth = self.settings["auth"]
        token = self.secret["token"].decode().splitlines()[0]
        shards = [self.start(p) for p in self.replay.shards]
        for i, s in enumerate(shards):
            line = s.wait_for("ready: listening on", timeout=60)
            self.assertIn("shard %d of %d" % (i, len(shards)), line)
            self.assertIn("bearer token required", s.output())

        # Prometheus finds each shard by its annotations.
        ann = self.m.shards["spec"]["template"]["metadata"]["annotations"]
        self.assertEqual(ann["prometheus.io/scheme"], "https")
        for pod in self.replay.shards:
            where = (pod.addr, self.replay.port_map[int(ann["prometheus.io/port"])],
                     ann["prometheus.io/path"], pod.host_path(auth["tls"]["ca"]),
                     auth["tls"]["server_name"])
            status, body = kp.scrape(*where, token=token)
            self.assertEqual(status, 200, body)
            self.assertIn('psd_up{shard="%d",address="%s.psd.ml.svc:' % (pod.index, pod.name), body)
            self.assertEqual(kp.scrape(*where)[0], 401)

        # Worker 0's pod with a job file that names no token: refused.
        bad = kp.Pod(self.m.workers, "worker", 0, self.replay.workers[0].addr,
                     os.path.join(self.d, "no-token"))
        bad.env = dict(self.replay.workers[0].env)
        self.make(bad, lambda doc: (short_job(doc), doc["auth"].pop("token_file")))
        w = self.start(bad, ["--connect-timeout-ms", "5000"])
        self.assertEqual(w.wait(120), 1, w.output())
        self.assertIn("UNAUTHENTICATED", w.output())

        workers = [self.start(p) for p in self.replay.workers]
        for w in workers:
            self.assertEqual(w.wait(300), 0, w.output())
        for pod, s in zip(self.replay.shards, shards):
            self.assertEqual(s.wait(60), 0, s.output())
            self.assertIn("(job.exit_when_done): stopping", s.output())
            self.assertIn("stopped", s.output().splitlines()[-1])
            ck = pod.host_path(self.settings["job"]["checkpoint"]["dir"])
            self.assertTrue(os.listdir(ck), "no checkpoint in " + ck)


def set_shards(m, k8s):
    """deploy/k8s/reshard/set-shards.sh M K8S, as docs/reshard-deploy.md
    runs it: (exit status, output)."""
    r = subprocess.run(["sh", os.path.join(k8s, "reshard", "set-shards.sh"), str(m), k8s],
                       capture_output=True, text=True, timeout=30)
    return r.returncode, r.stdout + r.stderr


def read(path):
    with open(path) as f:
        return f.read()


def k8s_copy(d):
    """A copy of deploy/k8s under d, to edit as an operator would."""
    k8s = os.path.join(d, "k8s")
    shutil.copytree(kp.K8S, k8s)
    return k8s


@unittest.skipIf(yaml is None, "python3-yaml is not installed")
class ReshardManifestTest(unittest.TestCase):
    """deploy/k8s/reshard (docs/reshard-deploy.md): the claim every shard's
    checkpoints share, the Job that runs psd --reshard on it, and
    set-shards.sh, which sets a new count in every manifest that holds it."""

    def setUp(self):
        self.m = kp.Manifests()
        self.job = self.m.reshard
        self.c = self.m.container(self.job)
        self.claim = kp.load(os.path.join("reshard", "checkpoints.yaml"))[0]
        self.settings = json.loads(self.m.cm["data"]["job.json"])

    def test_reshard_job(self):
        shard = self.m.container(self.m.shards)
        spec = self.m.pod_spec(self.job)
        self.assertEqual(self.job["kind"], "Job")
        self.assertNotEqual(self.job["spec"].get("completionMode"), "Indexed")
        self.assertEqual(self.job["spec"]["completions"], 1)
        self.assertEqual(self.job["spec"]["backoffLimit"], 0)  # never run twice
        self.assertEqual(spec["restartPolicy"], "Never")
        # The shards' program and job file, and --reshard.
        cluster = shard["command"][shard["command"].index("--cluster") + 1]
        self.assertEqual(self.c["command"], ["psd", "--cluster", cluster, "--reshard"])
        self.assertEqual(self.c["image"], shard["image"])
        self.assertEqual(kp.env_of(self.c), kp.env_of(shard))
        # --cluster k8s wants a shard's hostname; it has no DNS name (no
        # subdomain) and the Service does not select it.
        set_name = kp.env_of(shard)["PSD_K8S_SHARD_SET"]
        self.assertEqual(spec["hostname"], set_name + "-0")
        self.assertNotIn("subdomain", spec)
        labels = self.job["spec"]["template"]["metadata"]["labels"]
        sel = self.m.svc["spec"]["selector"]
        self.assertFalse(all(labels.get(k) == v for k, v in sel.items()))
        # The ConfigMap where the shards mount it; no Secret (it serves
        # nothing, calls nothing).
        mounts = mounts_of(self.c)
        self.assertEqual(mounts["job"], mounts_of(shard)["job"])
        self.assertEqual(self.m.volume(self.job, "job"),
                         self.m.volume(self.m.shards, "job"))
        self.assertFalse([v for v in spec["volumes"] if "secret" in v])
        self.assertEqual(spec["securityContext"],
                         self.m.pod_spec(self.m.shards)["securityContext"])
        # Every shard's checkpoints: the claim, at job.checkpoint.dir.
        self.assertEqual(mounts["checkpoints"], self.settings["job"]["checkpoint"]["dir"])
        vol = self.m.volume(self.job, "checkpoints")["persistentVolumeClaim"]
        self.assertEqual(vol["claimName"], self.claim["metadata"]["name"])
        self.assertEqual(self.claim["kind"], "PersistentVolumeClaim")
        self.assertIn("ReadWriteMany", self.claim["spec"]["accessModes"])

    def test_set_shards(self):
        with h.TempDir() as d:
            k8s = k8s_copy(d)
            rc, out = set_shards(3, k8s)
            self.assertEqual(rc, 0, out)
            m = kp.Manifests(k8s)
            shard = m.container(m.shards)
            self.assertEqual(m.shards["spec"]["completions"], 3)
            self.assertEqual(m.shards["spec"]["parallelism"], 3)
            for c in (shard, m.container(m.workers), m.container(m.reshard)):
                self.assertEqual(kp.env_of(c), dict(kp.env_of(self.c), PSD_K8S_SHARDS="3"))
            for k in ("completions", "parallelism"):  # the workers' count stays
                self.assertEqual(m.workers["spec"][k], self.m.workers["spec"][k])
            # The shards' checkpoints now on the claim the reshard Job reads.
            self.assertEqual(m.volume(m.shards, "checkpoints"),
                             m.volume(m.reshard, "checkpoints"))
            self.assertEqual(m.volume(m.shards, "tmp"), self.m.volume(self.m.shards, "tmp"))
            self.assertRegex(out, r'shards.yaml:\d+: +- {name: PSD_K8S_SHARDS, value: "3"}')
            # Again, and back: the same files as a first run gives.
            before = {f: read(os.path.join(k8s, f)) for f in ("shards.yaml", "workers.yaml")}
            self.assertEqual(set_shards(3, k8s)[0], 0)
            for f, text in before.items():
                self.assertEqual(read(os.path.join(k8s, f)), text, f)
            self.assertEqual(set_shards(2, k8s)[0], 0)
            self.assertEqual(kp.Manifests(k8s).shards["spec"]["completions"], 2)
            for bad in ("0", "x", "4097", "07"):
                rc, out = set_shards(bad, k8s)
                self.assertEqual(rc, 2, bad)
                self.assertIn("usage: set-shards.sh M [DIR]", out)
            # The reshard pod derives the new shards' cluster.
            self.assertEqual(set_shards(3, k8s)[0], 0)
            m = kp.Manifests(k8s)
            job = os.path.join(d, "job.json")
            with open(job, "w") as f:
                json.dump({"job": self.settings["job"]}, f)
            envs = [dict(kp.env_of(m.container(m.shards)), HOSTNAME="psd-2",
                         JOB_COMPLETION_INDEX="2"),
                    dict(kp.env_of(m.container(m.reshard)),
                         HOSTNAME=m.pod_spec(m.reshard)["hostname"])]
            specs = []
            for env in envs:
                env = {k: v for k, v in env.items() if v}
                r = print_spec("k8s", dict(env, POD_NAMESPACE="ml"), job)
                self.assertEqual(r.returncode, 0, r.stderr)
                specs.append(json.loads(r.stdout)["cluster"])
            self.assertEqual(specs[0], specs[1])
            self.assertEqual(len(specs[0]["ps"]), 3)


@unittest.skipIf(yaml is None, "python3-yaml is not installed")
class ReshardReplayTest(PodReplay):
    """2 -> 3 shards as docs/reshard-deploy.md does it, each pod a process
    (JobReplayTest's): set-shards.sh 2 puts the checkpoints on the claim;
    both Jobs of 2 shards run and are deleted mid-epoch (SIGTERM to every
    pod: each shard's final checkpoint on the claim); set-shards.sh 3; a shard of 3 started now refuses the 2-shard
    checkpoint, naming psd --reshard; the reshard Job's pod restores it onto
    3 and exits 0, the old layout kept beside; the Jobs of 3 shards resume
    from the checkpoint's step and complete."""

    def setUp(self):
        super().setUp()
        self.k8s = k8s_copy(self.d)

    def run_jobs(self):
        """Both Jobs of the current manifests, to completion: the shards'
        outputs."""
        shards = [self.start(p) for p in self.replay.shards]
        for i, s in enumerate(shards):
            line = s.wait_for("ready: listening on", timeout=60)
            self.assertIn("shard %d of %d" % (i, len(shards)), line)
        workers = [self.start(p) for p in self.replay.workers]
        for w in workers:
            self.assertEqual(w.wait(300), 0, w.output())
        for s in shards:
            self.assertEqual(s.wait(60), 0, s.output())
            self.assertIn("(job.exit_when_done): stopping", s.output())
        return [s.output() for s in shards]

    def test_two_to_three_shards(self):
        self.assertEqual(set_shards(2, self.k8s)[0], 0)
        # 2 shards training two epochs, deleted (kubectl delete: SIGTERM
        # to every pod at once) once worker 0 has logged step 40.
        self.use(kp.Manifests(self.k8s), os.path.join(self.d, "two"),
                 lambda doc: doc["job"].update(epochs=2, log_every=20))
        shards = [self.start(p) for p in self.replay.shards]
        for s in shards:
            s.wait_for("ready: listening on", timeout=60)
        workers = [self.start(p) for p in self.replay.workers]
        workers[0].wait_for("step 40/", timeout=120)
        for p in shards + workers:
            p.p.send_signal(signal.SIGTERM)
        for p in workers:
            p.p.wait(60)
        for s in shards:
            self.assertEqual(s.p.wait(60), 0, s.output())
            s.stop()
            self.assertIn("checkpoint (at exit)", s.output())
            self.assertNotIn("(job.exit_when_done): stopping", s.output())
        name = self.settings["job"]["name"]
        claim = os.path.join(self.d, "claims", "psd-checkpoints")
        self.assertEqual(sorted(os.listdir(os.path.join(claim, name))), ["ps-0", "ps-1"])

        self.assertEqual(set_shards(3, self.k8s)[0], 0)
        self.use(kp.Manifests(self.k8s), os.path.join(self.d, "three"))
        early = self.start(self.replay.shards[0])
        self.assertEqual(early.wait(60), 1, early.output())
        self.assertIn("was written by a job of 2 shards; the spec has 3", early.output())
        self.assertIn("psd --cluster SPEC --reshard", early.output())

        pod = kp.Pod(self.m.reshard, "reshard", 0, self.replay.shards[0].addr,
                     os.path.join(self.d, "three"))
        self.make(pod, short_job)
        r = self.start(pod)
        self.assertEqual(r.wait(300), 0, r.output())
        m = re.search(r"reshard: done in .* holds the checkpoint of step (\d+) for 3 "
                      r"shards .* the 2-shard layout is kept in (\S+)", r.output())
        self.assertTrue(m, r.output())
        step = int(m.group(1))
        self.assertGreater(step, 0)
        self.assertEqual(sorted(os.listdir(os.path.join(claim, name))),
                         ["ps-0", "ps-1", "ps-2"])
        kept = [f for f in os.listdir(claim) if f.startswith(name + ".2-shards-")]
        self.assertEqual(len(kept), 1, os.listdir(claim))
        self.assertEqual(sorted(os.listdir(os.path.join(claim, kept[0]))), ["ps-0", "ps-1"])

        for out in self.run_jobs():
            self.assertIn("resumed from step %d" % step, out)


@unittest.skipIf(yaml is None, "python3-yaml is not installed")
class LiveReshardReplayTest(PodReplay):
    """A live reshard under Kubernetes (docs/reshard-deploy.md), each pod a
    process: set-shards.sh 3 (3 shard pods, the checkpoints on the claim)
    with job.shards 2 in the ConfigMap, so psd-2 stands by, and a CTR
    model with a table; once worker 0 trains, psctl reshard --shards 3 run
    in shard 0's pod (kubectl exec: its job file, token and TLS, its view
    of the Service's names) moves the table's rows to psd-2 while the
    workers go on, then switches; both Jobs complete."""

    def test_two_to_three_shards_while_training(self):
        k8s = k8s_copy(self.d)
        self.assertEqual(set_shards(3, k8s)[0], 0)
        # A model with a table, so that the reshard moves its rows live.
        ctr = h.ctr_table_job(os.path.join(self.d, "ctr"))
        self.use(kp.Manifests(k8s), os.path.join(self.d, "live"),
                 lambda doc: doc["job"].update(shards=2, max_steps=200, log_every=20, **ctr))
        shards = [self.start(p) for p in self.replay.shards]
        for s in shards[:2]:
            s.wait_for("ready: listening on", timeout=60)
        shards[2].wait_for("standing by: the job's layout 0 has 2 shards", timeout=60)
        workers = [self.start(p, ["--inject-delay-ms", "20"]) for p in self.replay.workers]
        workers[0].wait_for("step 20/", timeout=120)
        pod = self.replay.shards[0]
        ctl = self.start_program(pod, h.build_path("ps-server", "psctl"),
                                 ["reshard", "--shards", "3"])
        self.assertEqual(ctl.wait(300), 0, ctl.output())
        self.assertRegex(ctl.output(), h.LIVE_MOVED)
        for w in workers:
            self.assertEqual(w.wait(300), 0, w.output())
            self.assertIn("layout moved: now layout 1 of 3 shards", w.output())
            self.assertRegex(w.output(), r"(final|done): .*steps=200\b")
        for s in shards:
            self.assertEqual(s.wait(60), 0, s.output())
            self.assertIn("(job.exit_when_done): stopping", s.output())
        # Taken in without a restart: its rows moved to it, then the switch.
        self.assertIn("COMMIT: ps:2 serves layout 1 of 3 shards", shards[2].output())
        self.assertGreater(h.rows_moved_in(shards[2].output()), 0, shards[2].output())

    def start_program(self, pod, program, args):
        """program --cluster (the pod's job file) ARGS, run in pod as
        kubectl exec would run it there."""
        cmd = pod.container["command"]
        cluster = pod.rewrite(cmd[cmd.index("--cluster") + 1])
        return self.start(pod, args, argv=[program, "--cluster", cluster])


# The resolver's cases live in k8s_resolver.py (this file's size); they run here.
ResolverTest = k8s_resolver.ResolverTest
print_spec = k8s_resolver.print_spec


if __name__ == "__main__":
    h.main()
