#!/usr/bin/python3
"""psd's container image (make image; deploy/container) runs the manifests'
job: every pod of deploy/k8s (k8s_pods.py: the manifest's command,
environment and volumes, the Secret from make-secret.sh, the pods' user,
a read-only root file system) is a container of the image, on this host's
network with the Service's names given to podman as hosts. The shards serve
TLS and the metrics page, the workers train one epoch of the ConfigMap's
MLP on the image's own data set to a test accuracy of at least 0.80, and
every container exits 0: the image's package list is complete. Before that,
ldd finds every library of psd, dworker, pslaunch, psctl, psd-ctrgen and
libpsclient in the image.

Podman runs the containers where it can (first with its defaults, then
with runc and the host's own limits: crun refuses a host whose cgroup v2
hierarchy holds controllers beside v1's, and podman asks for more open
files than some hosts allow). Where neither runs, each pod runs in the
image's root file system (a podman container's, mounted) under unshare and
chroot, and the test says so; PSD_IMAGE_RUN=chroot picks that way.

The image is not built by the suite: without it (or without podman) the
test reports SKIP and says to run make image. Run: /usr/bin/python3
test_image.py BUILD_DIR"""
import json
import os
import resource
import shutil
import subprocess
import unittest
import uuid

import harness as h

try:
    import k8s_pods as kp  # needs python3-yaml
except ImportError:
    kp = None

IMAGE = os.environ.get("PSD_IMAGE", "psd:latest")
BINARIES = ["/usr/sbin/psd", "/usr/bin/dworker", "/usr/bin/pslaunch", "/usr/bin/psctl",
            "/usr/bin/psd-ctrgen", "/usr/lib/x86_64-linux-gnu/libpsclient.so.1"]
ACCURACY = 0.80  # one epoch of the ConfigMap's MLP reaches about 0.84


def podman(*args, timeout=120):
    return subprocess.run(["podman"] + list(args), capture_output=True, text=True,
                          timeout=timeout)


def one_epoch(doc):
    """The ConfigMap's job, one epoch of it (5 in the manifests)."""
    doc["job"].update(epochs=1, log_every=200)


class Runner:
    """How this host runs a container of the image: podman with opts, or
    (opts None) chroot into a mounted container's root file system."""

    def __init__(self):
        self.opts, self.why = None, []
        if os.environ.get("PSD_IMAGE_RUN") == "chroot":
            self.why.append("PSD_IMAGE_RUN=chroot")
            return
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        tries = [[]]
        if shutil.which("runc"):
            tries.append(["--runtime", "runc", "--ulimit", "nofile=%d:%d" % (nofile, nofile),
                          "--ulimit", "nproc=4096:4096"])
        for opts in tries:
            r = podman("run", "--rm", "--pull=never", "--network", "host", *opts,
                       IMAGE, "true")
            if r.returncode == 0:
                self.opts = opts
                return
            self.why.append("podman run %s: %s" % (" ".join(opts) or "(defaults)",
                                                   r.stderr.strip().splitlines()[-1:]))

    def describe(self):
        if self.opts is not None:
            return "podman run %s" % " ".join(self.opts)
        if self.why == ["PSD_IMAGE_RUN=chroot"]:
            return "unshare + chroot (PSD_IMAGE_RUN=chroot)"
        return "unshare + chroot (podman cannot run a container here: %s)" % "; ".join(
            self.why)


@unittest.skipIf(kp is None, "python3-yaml is not installed")
class ImageTest(h.ProcTest):
    @classmethod
    def setUpClass(cls):
        if not shutil.which("podman"):
            raise unittest.SkipTest("podman is not installed (sh deploy/setup.sh test)")
        if os.geteuid() != 0:
            raise unittest.SkipTest("needs root: make image builds the image in root's "
                                    "podman storage")
        if podman("image", "exists", IMAGE).returncode != 0:
            raise unittest.SkipTest("the image %s is not built: make image builds it "
                                    "(docs/kubernetes.md, The image)" % IMAGE)
        cls.runner = Runner()
        print("image: %s, run with %s" % (IMAGE, cls.runner.describe()))
        rev = podman("image", "inspect", "--format",
                     '{{index .Labels "org.opencontainers.image.revision"}}', IMAGE).stdout
        head = subprocess.run(["git", "-C", kp.REPO, "rev-parse", "HEAD"],
                              capture_output=True, text=True).stdout
        if rev.strip() != head.strip():
            print("image: note: %s was built from %s, this tree is at %s; make image "
                  "tests this tree" % (IMAGE, rev.strip() or "?", head.strip() or "?"))

    def setUp(self):
        super().setUp()
        self.names, self.chroots = [], []
        self.addCleanup(self.remove_containers)

    def remove_containers(self):
        for n in self.names:
            podman("rm", "-f", "-t", "0", n)

    def name(self, pod):
        n = "psd-test-%s-%s" % (uuid.uuid4().hex[:8], pod.name)
        self.names.append(n)
        return n

    def run_pod(self, pod, replay):
        """A container of the image as the pod: its user and fsGroup, its
        volumes at their mount paths, its environment, a read-only root
        file system, the pods' names resolved to their addresses."""
        sc = pod.spec.get("securityContext", {})
        uid, gid, fsg = (sc.get(k, 0) for k in ("runAsUser", "runAsGroup", "fsGroup"))
        argv = pod.argv(replay.port_map)
        if self.runner.opts is None:
            return self.chroot_pod(pod, replay, (uid, gid, fsg), argv)
        cmd = ["podman", "run", "--rm", "--pull=never", "--network", "host",
               "--name", self.name(pod), "--hostname", pod.name,
               "--user", "%d:%d" % (uid, gid), "--group-add", str(fsg)]
        cmd += self.runner.opts
        if pod.container.get("securityContext", {}).get("readOnlyRootFilesystem"):
            cmd.append("--read-only")
        with open(replay.hosts) as f:
            for line in f.read().splitlines()[1:]:
                addr, *names = line.split()
                cmd += ["--add-host", "%s:%s" % (names[0], addr)]
        for path, m in pod.mounts.items():
            cmd += ["-v", "%s:%s%s" % (pod.host_path(path), path,
                                       ":ro" if m.get("readOnly") else "")]
        for k, v in sorted(pod.env.items()):
            if k != "HOSTNAME":  # podman sets it from --hostname
                cmd += ["-e", "%s=%s" % (k, v)]
        cmd += [IMAGE] + argv
        p = h.Proc(cmd)
        self.procs.append(p)
        return p

    def image_root(self, name):
        """The root file system of a container of the image made, not run
        (podman create), and mounted (podman mount): the image's files,
        writable, gone with the container."""
        if name not in self.names:
            self.names.append(name)
        r = podman("create", "--pull=never", "--name", name, IMAGE, "true")
        self.assertEqual(r.returncode, 0, r.stderr)
        root = podman("mount", name).stdout.strip()
        self.assertTrue(os.path.isdir(root), root)
        return root

    def in_image(self, *argv):
        """argv run in the image: by podman, or chrooted into its root."""
        if self.runner.opts is not None:
            return podman("run", "--rm", "--pull=never", *self.runner.opts, IMAGE, *argv)
        root = self.image_root("psd-test-%s" % uuid.uuid4().hex[:8])
        return subprocess.run(["chroot", root] + list(argv), capture_output=True, text=True,
                              env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}, timeout=120)

    def chroot_pod(self, pod, replay, ids, argv):
        """The pod in the image's root file system (image_root), its
        process in mount and PID namespaces of its own (unshare), with
        /proc, /dev, the hosts file and the volumes bound in, chrooted as
        the pod's user."""
        root = self.image_root(self.name(pod))
        binds = [("/dev", "/dev"), (replay.hosts, "/etc/hosts")]
        binds += [(pod.host_path(p), p) for p in pod.mounts]
        script = ["set -e", 'r="$0"', 'mount -t proc proc "$r/proc"']
        for src, dst in binds:
            kind = "-d" if os.path.isdir(src) else "-f"
            make = 'mkdir -p "$r%s"' % dst if kind == "-d" else 'touch "$r%s"' % dst
            script += ['[ %s "$r%s" ] || %s' % (kind, dst, make),
                       'mount --rbind "%s" "$r%s"' % (src, dst)]
        script.append('exec chroot --userspec=%d:%d --groups=%d "$r" "$@"' % ids)
        env = dict(pod.env)
        env["PATH"] = "/usr/sbin:/usr/bin:/sbin:/bin"
        cmd = ["unshare", "--mount", "--pid", "--fork", "--propagation", "private", "--",
               "sh", "-c", "\n".join(script), root] + argv
        p = h.Proc(cmd, env=env)
        self.procs.append(p)
        return p

    def test_libraries_in_the_image(self):
        """ldd finds every library the programs load; the image runs as
        the user psd."""
        r = self.in_image("ldd", *BINARIES)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertNotIn("not found", r.stdout)
        r = podman("image", "inspect", "--format", "{{.Config.User}}", IMAGE)
        self.assertEqual(r.stdout.strip(), "7100:7100")
        r = self.in_image("getent", "passwd", "7100")
        self.assertTrue(r.stdout.startswith("psd:x:7100:7100:"), r.stdout + r.stderr)

    def test_the_job_completes_in_containers(self):
        m = kp.Manifests()
        replay = kp.Replay(m, self.d)
        secret, _ = kp.make_secret()
        for pod in replay.pods():
            pod.make_volumes(m.cm["data"], secret, one_epoch)
            for path in pod.mounts:  # emptyDirs: the pod's user writes there
                if "emptyDir" in m.volume(pod.job, pod.mounts[path]["name"]):
                    os.chmod(pod.host_path(path), 0o1777)
        settings = json.loads(m.cm["data"]["job.json"])
        auth = settings["auth"]
        token = secret["token"].decode().splitlines()[0]

        shards = [self.run_pod(p, replay) for p in replay.shards]
        for i, s in enumerate(shards):
            line = s.wait_for("ready: listening on", timeout=120)
            self.assertIn("shard %d of %d" % (i, len(shards)), line)
        ann = m.shards["spec"]["template"]["metadata"]["annotations"]
        pod = replay.shards[0]
        status, body = kp.scrape(pod.addr, replay.port_map[int(ann["prometheus.io/port"])],
                                 ann["prometheus.io/path"], pod.host_path(auth["tls"]["ca"]),
                                 auth["tls"]["server_name"], token)
        self.assertEqual(status, 200, body)

        workers = [self.run_pod(p, replay) for p in replay.workers]
        for w in workers:
            self.assertEqual(w.wait(600), 0, w.output())
        final = [l for l in workers[0].lines if l.startswith("final: test_accuracy=")]
        self.assertTrue(final, workers[0].output())
        acc = float(final[-1].split()[1].split("=")[1])
        print("image: worker 0's test_accuracy=%.4f after one epoch" % acc)
        self.assertGreaterEqual(acc, ACCURACY, final[-1])
        for pod, s in zip(replay.shards, shards):
            self.assertEqual(s.wait(120), 0, s.output())
            self.assertIn("(job.exit_when_done): stopping", s.output())
            ck = pod.host_path(settings["job"]["checkpoint"]["dir"])
            self.assertTrue(os.listdir(ck), "no checkpoint in " + ck)


if __name__ == "__main__":
    h.main()
