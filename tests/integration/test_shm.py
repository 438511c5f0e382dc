"""The same-host shared-memory data path (docs/wire.md, "Same host, shared
memory"): exact values through it (push, pull, push_pull over several
messages and shards with a partial last chunk; a deterministic sync job of
two workers and an async job, several variables split across two shards,
bit for bit the same as over the socket), job.shared_memory false keeping
the bytes on the socket, a worker killed mid-transfer leaving no mapping on
the shard, graceful shard restarts under load survived (the clients
register again, nothing lost or applied twice), the hello's checks (wrong
token, wrong job, a memfd without seals or smaller than claimed, another
user), bad ranges and unknown keys refused by name, a NaN in the arena
refused, an arena dropped when its client's connection ends, and a sync
pull through the arena that is always one committed step while a worker
commits steps.
Run: /usr/bin/python3 test_shm.py BUILD_DIR"""
import fcntl
import json
import mmap
import os
import signal
import socket
import struct
import sys
import time

import harness as h
import pb

LR = 0.5
TOKEN = "s3cret-token-for-shm"


def kv(line):
    return dict(p.split("=", 1) for p in line.split() if "=" in p)


def mappings(pid):
    """The shard's mappings of client arenas (/proc/PID/maps lines)."""
    with open("/proc/%d/maps" % pid) as f:
        return sum("memfd:psd-shm" in line for line in f)


def wait_until(cond, timeout=15, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError("timed out waiting for " + what)


def recv_exact(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("EOF after %d of %d bytes" % (len(buf), n))
        buf += chunk
    return buf


def hello(path, job, token, size, seal=True, claim=None):
    """Registers an arena of size bytes with the shard listening on path
    (common/rpc/shm.h's hello); returns (socket, memfd, ok, key, reason)."""
    fd = os.memfd_create("psd-shm", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    if seal:
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL)
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    s.connect(path)
    j, t = job.encode(), token.encode()
    head = b"PSDSHM01" + struct.pack("=IIQ", len(j), len(t), claim or size)
    s.sendmsg([head + j + t], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", fd))])
    magic, ok, rlen, hi, lo = struct.unpack("=8sIIQQ", recv_exact(s, 32))
    assert magic == b"PSDSHMA1", magic
    reason = recv_exact(s, rlen).decode()
    return s, fd, ok, (hi, lo), reason


def try_hello(*args, **kw):
    """hello, its socket and memfd closed; returns (ok, reason)."""
    s, fd, ok, key, why = hello(*args, **kw)
    s.close()
    os.close(fd)
    return ok, why


def shm_ref(field, key, offset, length):
    body = (pb.key(1, 1) + struct.pack("<Q", key[0]) + pb.key(2, 1) +
            struct.pack("<Q", key[1]) + pb.uint(3, offset) + pb.uint(4, length))
    return pb.ld(field, body)


def push_shm(job, name, shape, count, key, offset, length, data=b""):
    body = (pb.caller(job) + pb.ld(2, pb.segment(name, 0, count, shape)) + pb.uint(3, 1) +
            shm_ref(60, key, offset, length))
    return body + (pb.ld(15, data) if data else b"")


def pull_shm(job, name, count, key, offset, length):
    return (pb.caller(job) + pb.ld(2, pb.segment(name, 0, count)) +
            shm_ref(64, key, offset, length))


def values(out):
    line = out.strip().splitlines()[-1]
    assert line.startswith("OK "), line
    return [float(v) for v in line.split("values=", 1)[1].split(",")]


class ShmTest(h.ProcTest):
    def setUp(self):
        super().setUp()
        h.need_socket_buffers(self)
        self.env = {"PSD_SOCKET_DIR": self.d}
        os.environ["PSD_SOCKET_DIR"] = self.d
        self.addCleanup(os.environ.pop, "PSD_SOCKET_DIR", None)

    def proc(self, argv):
        p = h.Proc(argv, env=self.env)
        self.procs.append(p)
        return p

    def psd(self, spec, i):
        p = h.start_psd(spec, i, env=self.env)
        self.procs.append(p)
        return p

    def spec(self, name="shm", nps=1, nworker=1, extra=None, **job):
        cfg = {"name": name, "optimizer": {"type": "sgd", "lr": LR}}
        cfg.update(job)
        path = os.path.join(self.d, "spec-%s.json" % name)
        self.cfg = h.write_spec(path, nps=nps, nworker=nworker, job=cfg, extra=extra)
        return path

    def sock(self, spec, i=0, name="shm"):
        port = self.cfg["cluster"]["ps"][i].rsplit(":", 1)[1]
        return os.path.join(self.d, "psd-%s-%s.sock.shm" % (name, port))

    def raw(self, spec, method, msg, code=None):
        r = h.pstool(spec, "--shard", "0", "raw", method, pb.hexa(msg))
        if code is None:
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        else:
            self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
            self.assertTrue(r.stdout.startswith("ERROR %s: " % code), r.stdout)
        return r.stdout

    def roundtrip(self, spec, nbytes, chunk):
        r = h.pstool(spec, "--bytes", str(nbytes), "--chunk", str(chunk), "--rounds", "3",
                     "roundtrip")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        line = r.stdout.strip().splitlines()[-1]
        self.assertIn("verified", line)
        return kv(line)

    # ---- exact values

    def test_roundtrip_is_exact_through_shared_memory(self):
        spec = self.spec(nps=2)
        ps = [self.psd(spec, i) for i in range(2)]
        # 3 MiB + 12 bytes over 2 shards in 512 KiB messages: several
        # messages per shard, a partial last one; push, pull, push_pull.
        out = self.roundtrip(spec, (3 << 20) + 12, 512 << 10)
        self.assertEqual((out["via"], out["shm"]), ("unix", "yes"), out)
        off = self.spec(name="noshm", nps=2, shared_memory=False)
        for p in ps:
            p.stop()
        self.procs = []
        ps = [self.psd(off, i) for i in range(2)]
        out = self.roundtrip(off, (1 << 20) + 12, 512 << 10)
        self.assertEqual((out["via"], out["shm"]), ("unix", "no"), out)
        self.assertFalse(os.path.exists(self.sock(off, 0, "noshm")))
        self.assertEqual(mappings(ps[0].p.pid), 0)

    def train_and_export(self, name, shm, sync):
        job = {"model": "mlp", "hidden": [32], "batch_size": 32, "max_steps": 40,
               "data_dir": "/usr/share/datasets/fashion-mnist", "shared_memory": shm}
        if sync:
            job["sync"] = {"mode": "sync", "deterministic": True}
        spec = self.spec(name=name, nps=2, nworker=2 if sync else 1, **job)
        ps = [self.psd(spec, i) for i in range(2)]
        ws = [self.proc([h.build_path("worker", "dworker"), "--cluster", spec, "--task",
                         "worker:%d" % i]) for i in range(2 if sync else 1)]
        for w in ws:
            self.assertEqual(w.wait(timeout=300), 0, w.output()[-3000:])
        said = "with shared memory (" in ws[0].output()
        self.assertEqual(said, shm, ws[0].output()[-3000:])
        out = os.path.join(self.d, name + ".safetensors")
        r = h.psctl(spec, "export", "--out", out)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        for p in ps:
            self.assertEqual(p.stop(), 0)
        self.procs = []
        with open(out, "rb") as f:
            blob = f.read()
        # The tensors (the header's names, shapes, offsets; the data), not
        # the metadata, which names the job.
        n = struct.unpack("<Q", blob[:8])[0]
        head = json.loads(blob[8:8 + n])
        head.pop("__metadata__", None)
        return head, blob[8 + n:]

    def test_sync_job_is_bit_for_bit_the_socket_path(self):
        if not os.path.isdir("/usr/share/datasets/fashion-mnist"):
            self.skipTest("no Fashion-MNIST at /usr/share/datasets/fashion-mnist")
        a = self.train_and_export("synca", True, True)
        b = self.train_and_export("syncb", False, True)
        self.assertEqual(a, b, "the variables differ between shm and the socket")

    def test_async_job_of_one_worker_is_bit_for_bit_the_socket_path(self):
        if not os.path.isdir("/usr/share/datasets/fashion-mnist"):
            self.skipTest("no Fashion-MNIST at /usr/share/datasets/fashion-mnist")
        a = self.train_and_export("asynca", True, False)
        b = self.train_and_export("asyncb", False, False)
        self.assertEqual(a, b, "the variables differ between shm and the socket")

    # ---- faults

    def test_worker_killed_mid_transfer_leaves_no_mapping(self):
        spec = self.spec()
        ps = self.psd(spec, 0)
        c = self.proc([h.build_path("tests", "pstool"), "--cluster", spec, "--clients", "2",
                       "--seconds", "60", "--bytes", str(4 << 20), "load"])
        c.wait_for("load t=", timeout=60)
        wait_until(lambda: mappings(ps.p.pid) > 0, what="the clients' arenas mapped")
        c.p.send_signal(signal.SIGKILL)
        c.p.wait()
        wait_until(lambda: mappings(ps.p.pid) == 0, what="the arenas unmapped")
        self.assertIsNone(ps.p.poll())

    def test_shard_restarted_mid_transfer_is_survived(self):
        spec = self.spec(nps=2, retry_s=30, checkpoint={"dir": os.path.join(self.d, "ck")})
        ps = [self.psd(spec, i) for i in range(2)]
        c = self.proc([h.build_path("tests", "pstool"), "--cluster", spec, "--clients", "2",
                       "--seconds", "12", "--faults", "load"])
        c.wait_for("load t=", timeout=60)
        for i in (0, 1):
            wait_until(lambda: mappings(ps[i].p.pid) > 0, what="ps:%d's arenas" % i)
            ps[i].p.send_signal(signal.SIGTERM)
            self.assertEqual(ps[i].wait(), 0, ps[i].output()[-3000:])
            ps[i] = self.psd(spec, i)
            # The clients register new arenas with the new process.
            wait_until(lambda: mappings(ps[i].p.pid) > 0, timeout=30,
                       what="arenas registered again with ps:%d" % i)
        self.assertEqual(c.wait(timeout=300), 0, c.output()[-3000:])
        res = kv(c.lines[-1])
        self.assertEqual(res["mismatches"], "0", c.lines[-1])
        self.assertGreater(int(res["pushes"]), 4)

    # ---- sync

    def test_sync_pull_never_sees_half_a_commit(self):
        import pyshards
        psd = pyshards.import_psd()
        import numpy as np
        import threading
        spec = self.spec(nps=2, sync={"mode": "sync"}, retry_s=10)
        ps = [self.psd(spec, i) for i in range(2)]
        steps, n = 150, 200000  # 800 KB: one message, one version
        w = psd.Client(spec, "worker:0")
        r = psd.Client(spec, "worker:0")
        self.addCleanup(w.close)
        self.addCleanup(r.close)
        opt = {"type": "sgd", "lr": 1.0}
        v = w.declare("v", (n,), placement=0, optimizer=opt)
        rv = r.declare("v", (n,), placement=0, optimizer=opt)
        errors = []

        def write():
            try:
                step = w.join()
                mine = np.empty(n, np.float32)
                for i in range(steps):
                    w.pull_at(v, mine, step)  # as a worker does, each step
                    w.push_step(v, np.full(n, float(i + 1), np.float32), step)
                    _, step = w.admit(step)
            except Exception as e:  # reported by the main thread
                errors.append(repr(e))

        t = threading.Thread(target=write)
        t.start()
        out = np.empty(n, np.float32)
        seen = set()
        first = r.pull_at(rv, out, 1)
        while t.is_alive():
            try:
                r.pull_at(rv, out, first)
            except psd.Error as e:
                t.join()
                self.fail("pull_at: %s; the writer: %s" % (e, errors))
            # After m commits every element is -(1 + 2 + ... + m): one value
            # across the message, never part of one step and part of another.
            vals = np.unique(out)
            self.assertEqual(len(vals), 1, "a pull saw %d values: %s" % (len(vals), vals[:5]))
            m = int(round((-1 + (1 - 8 * float(vals[0])) ** 0.5) / 2))
            self.assertEqual(float(vals[0]), -m * (m + 1) / 2)
            self.assertGreaterEqual(m, first)
            seen.add(m)
        t.join()
        self.assertEqual(errors, [])
        self.assertGreater(len(seen), 10)
        self.assertGreater(mappings(ps[0].p.pid), 1, "the clients used no shared memory")

    # ---- the hello

    def test_hello_checks_token_job_seals_and_size(self):
        tok = h.write_secret(self.d, "token", TOKEN + "\n")
        spec = self.spec(extra={"auth": {"token_file": tok}})
        ps = self.psd(spec, 0)
        path = self.sock(spec)
        ok, why = try_hello(path, "shm", "not-" + TOKEN, 4096)
        self.assertEqual((ok, why), (0, "wrong token: the hello's token is not the spec's "
                                        "auth token"))
        ok, why = try_hello(path, "other", TOKEN, 4096)
        self.assertEqual(ok, 0)
        self.assertIn("names job 'other'; this shard serves 'shm'", why)
        ok, why = try_hello(path, "shm", TOKEN, 4096, seal=False)
        self.assertEqual(ok, 0)
        self.assertIn("not sealed against shrinking", why)
        ok, why = try_hello(path, "shm", TOKEN, 4096, claim=1 << 20)
        self.assertEqual(ok, 0)
        self.assertIn("holds 4096 bytes, fewer than the 1048576", why)
        self.assertEqual(mappings(ps.p.pid), 0)
        s, fd, ok, key, why = hello(path, "shm", TOKEN, 4096)
        self.assertEqual((ok, why), (1, ""))
        wait_until(lambda: mappings(ps.p.pid) == 1, what="the arena mapped")
        s.close()
        os.close(fd)
        wait_until(lambda: mappings(ps.p.pid) == 0, what="the arena unmapped")
        self.assertIn("wrong token", ps.output())

    def test_client_of_another_user_is_refused(self):
        h.need_root(self)
        spec = self.spec()
        ps = self.psd(spec, 0)
        # The directory and the socket admit only psd's user: opened up here
        # (psd checked the directory at start), so that the shard's
        # SO_PEERCRED check is what refuses the client run as nobody.
        path = self.sock(spec)
        os.chmod(self.d, 0o711)
        os.chmod(path, 0o666)
        child = r"""
import os, socket, struct, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(10)
s.connect(sys.argv[1])
# The shard answers an untrusted peer at once, before any hello.
data = b""
while True:
    c = s.recv(4096)
    if not c:
        break
    data += c
print(data[32:].decode())
"""
        import pwd
        pw = pwd.getpwnam("nobody")
        try:
            r = h.run(h.nobody_argv([sys.executable, "-c", child, path]))
        finally:
            os.chmod(self.d, 0o700)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("the client belongs to uid %d" % pw.pw_uid, r.stdout)
        self.assertEqual(mappings(ps.p.pid), 0)

    # ---- bad requests

    def test_bad_ranges_and_unknown_keys_are_refused_by_name(self):
        spec = self.spec(nonfinite="reject")
        ps = self.psd(spec, 0)
        r = h.pstool(spec, "--shard", "0", "declare", "w", "4,4")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        s, fd, ok, key, why = hello(self.sock(spec), "shm", "", 4096)
        self.assertEqual(ok, 1, why)
        mm = mmap.mmap(fd, 4096)
        grad = [float(i) / 4 for i in range(16)]
        mm[128:192] = struct.pack("<16f", *grad)
        push = "/psd.v1.Data/Push"
        out = self.raw(spec, push, push_shm("shm", "w", (4, 4), 16, key, 4096, 64),
                       "INVALID_ARGUMENT")
        self.assertIn("shm.offset 4096 + shm.length 64 lies outside the arena of 4096 bytes",
                      out)
        out = self.raw(spec, push, push_shm("shm", "w", (4, 4), 16, key, (1 << 64) - 32, 64),
                       "INVALID_ARGUMENT")
        self.assertIn("lies outside the arena", out)
        out = self.raw(spec, push, push_shm("shm", "w", (4, 4), 16, key, 128, 60),
                       "INVALID_ARGUMENT")
        self.assertIn("shm.length is 60 bytes; the segments describe 64", out)
        out = self.raw(spec, push, push_shm("shm", "w", (4, 4), 16, key, 130, 64),
                       "INVALID_ARGUMENT")
        self.assertIn("shm.offset 130 is not a multiple of 4", out)
        out = self.raw(spec, push, push_shm("shm", "w", (4, 4), 16, key, 128, 64, b"\0" * 64),
                       "INVALID_ARGUMENT")
        self.assertIn("shm names the gradient's place, but the data field holds 64 bytes",
                      out)
        out = self.raw(spec, push, push_shm("shm", "w", (4, 4), 16, (key[0], key[1] ^ 1),
                                            128, 64), "FAILED_PRECONDITION")
        self.assertIn("shared memory arena unknown", out)
        out = self.raw(spec, "/psd.v1.Data/Pull", pull_shm("shm", "w", 16, key, 4064, 64),
                       "INVALID_ARGUMENT")
        self.assertIn("lies outside the arena", out)
        # Nothing was applied.
        r = h.pstool(spec, "--shard", "0", "pull", "w", "0", "16")
        before = values(r.stdout)
        # A NaN in the arena is found in the shard's copy and refused.
        mm[128 + 4 * 5:128 + 4 * 6] = struct.pack("<f", float("nan"))
        out = self.raw(spec, push, push_shm("shm", "w", (4, 4), 16, key, 128, 64),
                       "INVALID_ARGUMENT")
        self.assertIn("push to 'w': gradient element 5 (segment 0) is NaN", out)
        # A good push through the arena, then a pull into it.
        mm[128:192] = struct.pack("<16f", *grad)
        self.raw(spec, push, push_shm("shm", "w", (4, 4), 16, key, 128, 64))
        want = [h.f32(b - h.f32(LR * g)) for b, g in zip(before, grad)]
        self.assertEqual(values(h.pstool(spec, "--shard", "0", "pull", "w", "0", "16").stdout),
                         want)
        self.raw(spec, "/psd.v1.Data/Pull", pull_shm("shm", "w", 16, key, 1024, 64))
        self.assertEqual(list(struct.unpack("<16f", mm[1024:1088])), want)
        # The hello's connection ends: the arena is dropped, its key unknown.
        s.close()
        wait_until(lambda: mappings(ps.p.pid) == 0, what="the arena unmapped")
        out = self.raw(spec, push, push_shm("shm", "w", (4, 4), 16, key, 128, 64),
                       "FAILED_PRECONDITION")
        self.assertIn("shared memory arena unknown", out)
        mm.close()
        os.close(fd)


if __name__ == "__main__":
    h.main()
