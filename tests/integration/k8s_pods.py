"""The pods of deploy/k8s replayed on one host without Kubernetes, for
test_k8s.py (each pod a process) and test_image.py (each pod a container of
the image). Each pod gets what Kubernetes would give it:

- its command and environment, as the manifest writes them, plus what
  Kubernetes adds: HOSTNAME (an Indexed Job's pod is JOB-I; the pod
  spec's hostname where it names one), JOB_COMPLETION_INDEX (an Indexed
  Job's), POD_NAMESPACE (the fieldRef);
- its volumes, made under a directory of its own: the ConfigMap's files,
  the Secret's keys (make-secret.sh's, or only the items the volume lists)
  with the volume's defaultMode and the pod's fsGroup as their group, the
  emptyDirs; a persistentVolumeClaim, one directory per claim that every
  pod mounting it shares (a link to it);
- an address of its own, a loopback address 127.A.B.C, and a hosts file in
  which the headless Service's names (JOB-I.SERVICE.NAMESPACE.svc) resolve
  to those addresses, as the cluster's DNS would.

All pods share this host's network, so the ports of "0.0.0.0:PORT"
arguments are mapped to ports free here (each pod listens on its own
address), and PSD_K8S_PORT with them."""
import base64
import json
import os
import random
import re
import socket
import ssl
import subprocess

import yaml

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
K8S = os.path.join(REPO, "deploy", "k8s")
NAMESPACE = "ml"


def load(name, k8s=K8S):
    with open(os.path.join(k8s, name)) as f:
        return list(yaml.safe_load_all(f))


def env_of(container):
    """A container's plain env entries as a dict (fieldRef ones as None)."""
    return {e["name"]: e.get("value") for e in container.get("env", [])}


class Manifests:
    """deploy/k8s (or a copy of it, k8s) as parsed YAML: the Service, the
    shards' and the workers' Jobs, the ConfigMap, the reshard Job."""

    def __init__(self, k8s=K8S):
        self.svc = load("service.yaml", k8s)[0]
        self.shards = load("shards.yaml", k8s)[0]
        self.workers = load("workers.yaml", k8s)[0]
        self.cm = load("configmap.yaml", k8s)[0]
        self.reshard = load(os.path.join("reshard", "reshard-job.yaml"), k8s)[0]

    @staticmethod
    def pod_spec(job):
        return job["spec"]["template"]["spec"]

    @classmethod
    def container(cls, job):
        return cls.pod_spec(job)["containers"][0]

    @classmethod
    def volume(cls, job, name):
        """The volume a container's mount of that name refers to."""
        for v in cls.pod_spec(job).get("volumes", []):
            if v["name"] == name:
                return v
        raise KeyError("%s: no volume %r" % (job["metadata"]["name"], name))


def make_secret():
    """{key: bytes} of the Secret make-secret.sh prints, and the parsed
    document."""
    r = subprocess.run(["sh", os.path.join(K8S, "make-secret.sh")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    doc = yaml.safe_load(r.stdout)
    return {k: base64.b64decode(v) for k, v in doc["data"].items()}, doc


def free_on(addrs, n):
    """n ports that can be bound on every address of addrs just now."""
    for _ in range(100):
        ports, socks = [], []
        try:
            for _ in range(n):
                s = socket.socket()
                socks.append(s)
                s.bind((addrs[0], 0))
                port = s.getsockname()[1]
                for a in addrs[1:]:
                    t = socket.socket()
                    socks.append(t)
                    t.bind((a, port))
                ports.append(port)
            return ports
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError("no %d ports free on %s" % (n, addrs))


class Pod:
    """One pod of a Job: role "ps" or "worker", its index, hostname, address,
    directory (its volumes under it, each at DIR + mountPath), environment
    and the manifest's command."""

    def __init__(self, job, role, index, addr, root):
        self.job = job
        self.role = role
        self.index = index
        self.name = "%s-%d" % (job["metadata"]["name"], index)
        self.addr = addr
        self.dir = os.path.join(root, self.name)
        self.container = Manifests.container(job)
        self.spec = Manifests.pod_spec(job)
        self.env = {k: v for k, v in env_of(self.container).items() if v is not None}
        self.env.update(POD_NAMESPACE=NAMESPACE, HOSTNAME=self.name)
        if job["spec"].get("completionMode") == "Indexed":
            self.env["JOB_COMPLETION_INDEX"] = str(index)
        if "hostname" in self.spec:  # the pod's own, where the spec names one
            self.env["HOSTNAME"] = self.spec["hostname"]
        self.mounts = {m["mountPath"]: m for m in self.container.get("volumeMounts", [])}

    def host_path(self, mount_path):
        return self.dir + mount_path

    def fs_group(self):
        return self.spec.get("securityContext", {}).get("fsGroup", 0)

    def make_volumes(self, configmap, secret, edit_job=None, claims=None):
        """Writes the pod's volumes: configmap is the ConfigMap's data, secret
        the Secret's {key: bytes}; edit_job(dict) may change job.json's
        settings before it is written (the test's shorter job); a claim is
        a link to claims/CLAIM_NAME, made once, shared by every pod."""
        for path, m in self.mounts.items():
            vol = Manifests.volume(self.job, m["name"])
            host = self.host_path(path)
            if "persistentVolumeClaim" in vol:
                assert claims, "%s: a claim, and no claims directory" % self.name
                shared = os.path.join(claims, vol["persistentVolumeClaim"]["claimName"])
                if not os.path.isdir(shared):
                    os.makedirs(shared)
                    os.chmod(shared, 0o777)  # writable by the pods' fsGroup
                os.makedirs(os.path.dirname(host), exist_ok=True)
                os.symlink(shared, host)
                continue
            os.makedirs(host, exist_ok=True)
            if "configMap" in vol:
                for key, text in configmap.items():
                    if key == "job.json" and edit_job:
                        doc = json.loads(text)
                        edit_job(doc)
                        text = json.dumps(doc, indent=2)
                    with open(os.path.join(host, key), "w") as f:
                        f.write(text)
                    os.chmod(os.path.join(host, key), 0o644)
            elif "secret" in vol:
                sv = vol["secret"]
                items = sv.get("items") or [{"key": k, "path": k} for k in secret]
                for it in items:
                    name = os.path.join(host, it["path"])
                    with open(name, "wb") as f:
                        f.write(secret[it["key"]])
                    os.chown(name, 0, self.fs_group())
                    os.chmod(name, it.get("mode", sv.get("defaultMode", 0o644)))
            elif "emptyDir" in vol:
                os.chmod(host, 0o777)  # as the kubelet makes it
            else:
                raise AssertionError("%s: volume %r of an unknown kind"
                                     % (self.name, m["name"]))
        os.chmod(self.dir, 0o755)

    def argv(self, port_map, program=None, rewrite_paths=False):
        """The manifest's command: "0.0.0.0:PORT" on this pod's address and
        the mapped port; program(name) gives the program's path; with
        rewrite_paths, the mount paths in arguments under the pod's
        directory (a process, which sees no mounts)."""
        out = []
        for i, a in enumerate(self.container["command"]):
            m = re.fullmatch(r"0\.0\.0\.0:(\d+)", a)
            if m:
                a = "%s:%d" % (self.addr, port_map[int(m.group(1))])
            elif rewrite_paths:
                a = self.rewrite(a)
            if i == 0 and program:
                a = program(a)
            out.append(a)
        return out

    def rewrite(self, text):
        """text with every mount path (the longest first, at a path
        boundary) under the pod's directory."""
        paths = sorted(self.mounts, key=len, reverse=True)
        pat = "(%s)(?=[/\"':]|$)" % "|".join(re.escape(p) for p in paths)
        return re.sub(pat, lambda m: self.host_path(m.group(1)), text)


class Replay:
    """Every pod of both Jobs under root, their addresses, the hosts file
    that names them, and the port map."""

    def __init__(self, manifests, root):
        self.m = manifests
        self.root = root
        net = "127.%d.%d." % (random.randint(1, 254), random.randint(1, 254))
        svc = manifests.svc["metadata"]["name"]
        self.shards = [Pod(manifests.shards, "ps", i, net + str(10 + i), root)
                       for i in range(manifests.shards["spec"]["completions"])]
        self.workers = [Pod(manifests.workers, "worker", i, net + str(100 + i), root)
                        for i in range(manifests.workers["spec"]["completions"])]
        self.hosts = os.path.join(root, "hosts")
        with open(self.hosts, "w") as f:
            f.write("127.0.0.1 localhost\n")
            for p in self.shards + self.workers:
                fqdn = "%s.%s.%s.svc" % (p.name, svc, NAMESPACE)
                f.write("%s %s %s.cluster.local %s\n" % (p.addr, fqdn, fqdn, p.name))
        os.chmod(self.hosts, 0o644)
        ports = sorted({int(x) for p in self.shards + self.workers
                        for a in p.container["command"]
                        for x in re.findall(r"^0\.0\.0\.0:(\d+)$", a)})
        free = free_on([p.addr for p in self.shards], len(ports))
        self.port_map = dict(zip(ports, free))
        for p in self.shards + self.workers:
            k8s_port = int(p.env.get("PSD_K8S_PORT", "7100"))
            p.env["PSD_K8S_PORT"] = str(self.port_map.get(k8s_port, k8s_port))
        os.chmod(root, 0o755)

    def pods(self):
        return self.shards + self.workers


def scrape(addr, port, path, ca, server_name, token=None):
    """(status, body) of GET path over HTTPS from addr:port, checking the
    certificate against ca for server_name, as Prometheus's tls_config
    (ca_file, server_name) would."""
    ctx = ssl.create_default_context(cafile=ca)
    req = "GET %s HTTP/1.0\r\nHost: %s\r\n" % (path, server_name)
    if token:
        req += "Authorization: Bearer %s\r\n" % token
    with socket.create_connection((addr, port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname=server_name) as s:
            s.sendall((req + "\r\n").encode())
            data = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body.decode()
