"""Checkpoints end to end with real psd processes on 127.0.0.1: SIGTERM writes
one and exits 0, a restart resumes at its step with bit-identical values and
slots (async, and a sync job of dworkers that then goes on from that step);
psctl export read back by numpy equals the live values and the checkpoint
files; a corrupted or truncated newest checkpoint falls back to the previous
one with a loud line; kill -9 between checkpoints loads the previous one;
pruning keeps exactly K; a failed write is reported and the shard keeps
serving; psctl checkpoint names a shard that is down; the directory comes
from the spec, --checkpoint-dir or STATE_DIRECTORY, or checkpoints are off;
bad settings exit 2 with their JSON path.
Run: /usr/bin/python3 test_ckpt.py BUILD_DIR"""
import glob
import json
import os
import shutil
import signal
import struct
import time
import unittest

import numpy as np

import harness as h
from harness import psctl

DATA = "/usr/share/datasets/fashion-mnist"
LR, MU = 0.1, 0.9


def read_safetensors(path):
    """The independent reader: the format by hand, numpy for the arrays
    (the snippet in docs/checkpoints.md)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    meta = header.pop("__metadata__", {})
    arrays = {name: np.frombuffer(data[t["data_offsets"][0]:t["data_offsets"][1]],
                                  dtype="<f4").reshape(t["shape"])
              for name, t in header.items()}
    return arrays, meta


def bits(a):
    """An array's exact bits, for bit-identical comparisons."""
    return np.ascontiguousarray(a).view(np.uint32)


def pulled(out):
    line = out.strip().splitlines()[-1]
    assert line.startswith("OK "), line
    vals = line.split("values=", 1)[1]
    return np.array([float(v) for v in vals.split(",")] if vals else [], dtype=np.float32)


def start(spec, i, *args, env=None, wrapper=None, ready=True):
    argv = [h.build_path("ps-server", "psd"), "--cluster", spec, "--task", "ps:%d" % i]
    p = h.Proc((wrapper or []) + argv + list(args), env=env)
    if ready:
        p.wait_for("ready: listening on")
    return p


def ck_spec(d, nps=1, nworker=1, name="ck", checkpoint=None, **job):
    """d/spec.json (h.spec_in) of job name with momentum at LR and MU,
    checkpoint and the other job keys given; returns its path."""
    j = {"name": name, "optimizer": {"type": "momentum", "lr": LR, "momentum": MU}}
    if checkpoint is not None:
        j["checkpoint"] = checkpoint
    j.update(job)
    return h.spec_in(d, job=j, nps=nps, nworker=nworker)


def ckpt_dirs(root, job="ck", shard=0):
    return sorted(os.path.basename(p) for p in glob.glob(
        os.path.join(root, job, "ps-%d" % shard, "ckpt-*")))


class AsyncCkptTest(h.ProcTest):
    """One or two shards driven by pstool: exact, fast, no dataset."""

    def psd(self, spec, i, *args, **kw):
        p = start(spec, i, *args, **kw)
        self.procs.append(p)
        return p

    def tool(self, spec, *args, shard=0):
        r = h.pstool(spec, "--shard", str(shard), *args)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        return r.stdout

    def push(self, spec, g, shard=0, name="w", shape="4,3", offset=0):
        self.tool(spec, "push", name, shape, str(offset), ",".join(repr(x) for x in g),
                  shard=shard)

    def test_sigterm_writes_one_and_restart_is_bit_identical(self):
        root = os.path.join(self.d, "ck")
        spec = ck_spec(self.d, nps=2, checkpoint={"dir": "ck"})
        ps = [self.psd(spec, i) for i in range(2)]
        # 'w' (4, 3) split: rows [0, 2) on ps:0, [2, 4) on ps:1; 'b' whole on ps:1.
        for s in range(2):
            self.tool(spec, "declare", "w", "4,3", shard=s)
        self.tool(spec, "declare", "b", "5", "1", shard=1)
        for k in range(3):
            self.push(spec, [0.5 * k - i * 0.25 for i in range(6)], shard=0)
            self.push(spec, [1.0 + k + i for i in range(6)], shard=1, offset=6)
            self.push(spec, [0.1 * i - k for i in range(5)], shard=1, name="b", shape="5")
        before = os.path.join(self.d, "before.safetensors")
        r = psctl(spec, "export", "--out", before, "--slots")
        self.assertEqual(r.returncode, 0, r.stderr)
        # SIGTERM: exit 0 and a checkpoint at the shard's step (pushes applied).
        for s, p in enumerate(ps):
            self.assertEqual(p.stop(signal.SIGTERM), 0, p.output())
            step = 3 if s == 0 else 6
            path = os.path.join(root, "ck", "ps-%d" % s, "ckpt-%010d" % step)
            line = [l for l in p.lines if "checkpoint (at exit)" in l]
            self.assertEqual(len(line), 1, p.output())
            self.assertIn("at step %d written to %s" % (step, path), line[0])
            with open(os.path.join(path, "manifest.json")) as f:
                m = json.load(f)
            self.assertEqual((m["step"], m["shard"], m["nshards"], m["job"]), (step, s, 2, "ck"))
        # Restart: each resumes at its step, with the same bits.
        ps = [self.psd(spec, i) for i in range(2)]
        for s, p in enumerate(ps):
            p.wait_for("resumed from step %d: " % (3 if s == 0 else 6))
        after = os.path.join(self.d, "after.safetensors")
        r = psctl(spec, "export", "--out", after, "--slots")
        self.assertEqual(r.returncode, 0, r.stderr)
        a, _ = read_safetensors(before)
        b, _ = read_safetensors(after)
        self.assertEqual(sorted(a), ["b", "b/momentum", "w", "w/momentum"])
        for name in a:
            self.assertTrue(np.array_equal(bits(a[name]), bits(b[name])), name)
        self.assertTrue(np.any(a["w/momentum"] != 0))
        # A declaration of another shape is refused, naming both shapes.
        r = h.pstool(spec, "--shard", "0", "declare", "w", "4,2")
        self.assertEqual(r.returncode, 1)
        self.assertIn("ALREADY_EXISTS", r.stdout)
        self.assertIn("[4, 3]", r.stdout)
        self.assertIn("[4, 2]", r.stdout)
        self.tool(spec, "declare", "w", "4,3", shard=0)  # the same shape agrees
        # Versions came back too, and the momentum slot acts on the next push:
        # w' = w - lr * (mu * v + g).
        st = json.loads(psctl(spec, "--json", "status").stdout)["shards"]
        self.assertEqual([v["version"] for v in st[1]["vars"]], [3, 3])
        g = [0.5, -1.0, 2.0, 0.0, 1.5, -0.5]
        self.push(spec, g, shard=0)
        got = pulled(self.tool(spec, "pull", "w", "0", "6", shard=0))
        f32 = np.float32
        v = f32(MU) * a["w/momentum"].reshape(-1)[:6] + np.array(g, dtype=f32)
        want = a["w"].reshape(-1)[:6] - f32(LR) * v
        self.assertTrue(np.array_equal(bits(got), bits(want.astype(f32))))
        # The step goes on from the restored one: 3 + 1.
        r = psctl(spec, "checkpoint", "--wait")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertRegex(r.stdout, r"ps:0\s+\S+\s+written\s+4\s")

    def test_export_equals_live_pulls_and_checkpoint_files(self):
        root = os.path.join(self.d, "ck")
        spec = ck_spec(self.d, nps=2, checkpoint={"dir": root})
        for i in range(2):
            self.psd(spec, i)
        for s in range(2):
            self.tool(spec, "declare", "w", "4,3", shard=s)
        self.tool(spec, "declare", "b", "5", "1", shard=1)
        self.push(spec, [0.5 - i * 0.25 for i in range(6)], shard=0)
        self.push(spec, [1.0 + i for i in range(6)], shard=1, offset=6)
        self.push(spec, [0.1 * i for i in range(5)], shard=1, name="b", shape="5")
        # A 9 MiB variable: each shard's half is more than one 2 MiB message.
        r = h.pstool(spec, "--bytes", str(9 << 20), "--rounds", "1", "roundtrip")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        big = "roundtrip/%d/0" % (9 << 20)
        out = os.path.join(self.d, "model.safetensors")
        r = psctl(spec, "export", "--out", out, "--slots")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("exported 3 variables", r.stdout)
        arrays, meta = read_safetensors(out)
        self.assertEqual(meta["job"], "ck")
        self.assertEqual(meta["shards"], "2")
        # Whole shapes, and the same values as raw pulls from each shard.
        self.assertEqual(arrays["w"].shape, (4, 3))
        self.assertEqual(arrays["b"].shape, (5,))
        self.assertEqual(arrays[big].shape, ((9 << 20) // 4 // 256, 256))
        live = np.concatenate([pulled(self.tool(spec, "pull", "w", "0", "6", shard=0)),
                               pulled(self.tool(spec, "pull", "w", "6", "6", shard=1))])
        self.assertTrue(np.array_equal(bits(arrays["w"].reshape(-1)), bits(live)))
        live = pulled(self.tool(spec, "pull", "b", "0", "5", shard=1))
        self.assertTrue(np.array_equal(bits(arrays["b"]), bits(live)))
        n = arrays[big].size
        live = np.concatenate([pulled(self.tool(spec, "pull", big, "0", str(n // 2), shard=0)),
                               pulled(self.tool(spec, "pull", big, str(n // 2), str(n // 2),
                                                shard=1))])
        self.assertTrue(np.array_equal(bits(arrays[big].reshape(-1)), bits(live)))
        self.assertTrue(np.any(live != 0))
        # ... and what psctl get prints, for every variable.
        for name in ("w", "b", big):
            r = psctl(spec, "--json", "get", name)
            self.assertEqual(r.returncode, 0, r.stderr)
            got = np.array(json.loads(r.stdout)["values"], dtype=np.float32)
            self.assertTrue(np.array_equal(bits(arrays[name].reshape(-1)),
                                           bits(got.reshape(-1))), name)
        # Values and slots equal the shards' checkpoint files, rows joined.
        r = psctl(spec, "checkpoint", "--wait", "--json")
        self.assertEqual(r.returncode, 0, r.stderr)
        shards = json.loads(r.stdout)["shards"]
        files = [read_safetensors(os.path.join(s["path"], "shard.safetensors"))[0]
                 for s in shards]
        for name in ("w", "w/momentum", big, big + "/momentum"):
            joined = np.concatenate([files[0][name], files[1][name]])
            self.assertTrue(np.array_equal(bits(arrays[name]), bits(joined)), name)
        self.assertNotIn("b", files[0])  # declared on ps:1 only
        self.assertTrue(np.array_equal(bits(arrays["b/momentum"]), bits(files[1]["b/momentum"])))
        # Without --slots: values only. Bad use is exit 2.
        r = psctl(spec, "export", "--out", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(sorted(read_safetensors(out)[0]), sorted(["w", "b", big]))
        self.assertEqual(psctl(spec, "export").returncode, 2)

    def test_corrupt_or_truncated_newest_falls_back(self):
        root = os.path.join(self.d, "ck")
        spec = ck_spec(self.d, checkpoint={"dir": root, "keep": 5})
        p = self.psd(spec, 0)
        self.tool(spec, "declare", "w", "4,3")
        values = {}
        for step in (1, 2, 3):
            self.push(spec, [step * 0.5 + i for i in range(12)])
            r = psctl(spec, "checkpoint", "--wait")
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            values[step] = pulled(self.tool(spec, "pull", "w", "0", "12"))
        p.stop(signal.SIGKILL)
        shard_dir = os.path.join(root, "ck", "ps-0")
        newest = os.path.join(shard_dir, "ckpt-0000000003", "shard.safetensors")
        with open(newest, "r+b") as f:
            f.seek(-10, os.SEEK_END)
            b = f.read(2)
            f.seek(-10, os.SEEK_END)
            f.write(bytes([b[0] ^ 0xff, b[1] ^ 0x01]))
        p = self.psd(spec, 0)
        line = p.wait_for("REFUSED checkpoint")
        self.assertIn("ckpt-0000000003", line)
        self.assertIn("fails its checksum", line)
        self.assertIn(" error: ", line)
        p.wait_for("resumed from step 2: ")
        got = pulled(self.tool(spec, "pull", "w", "0", "12"))
        self.assertTrue(np.array_equal(bits(got), bits(values[2])))
        p.stop(signal.SIGKILL)
        # Truncated: cut the newest good one short.
        second = os.path.join(shard_dir, "ckpt-0000000002", "shard.safetensors")
        os.truncate(second, os.path.getsize(second) - 17)
        p = self.psd(spec, 0)
        p.wait_for("resumed from step 1: ")
        refused = [l for l in p.lines if "REFUSED checkpoint" in l]
        self.assertEqual(len(refused), 2, p.output())
        self.assertIn("truncated", refused[1])
        got = pulled(self.tool(spec, "pull", "w", "0", "12"))
        self.assertTrue(np.array_equal(bits(got), bits(values[1])))
        p.stop(signal.SIGKILL)
        # Nothing that verifies: psd refuses to start (exit 1) and says why.
        first = os.path.join(shard_dir, "ckpt-0000000001", "manifest.json")
        with open(first, "a") as f:
            f.write("x")
        q = start(spec, 0, ready=False)
        self.assertEqual(q.wait(timeout=30), 1, q.output())
        self.assertIn("none of the 3 checkpoints", q.output())

    def test_kill9_between_checkpoints_loads_the_previous(self):
        root = os.path.join(self.d, "ck")
        spec = ck_spec(self.d, checkpoint={"dir": root, "every_steps": 3})
        p = self.psd(spec, 0)
        self.tool(spec, "declare", "w", "4,3")
        for k in range(3):
            self.push(spec, [k + 0.25 * i for i in range(12)])
        p.wait_for("checkpoint (every_steps) at step 3 written")
        at3 = pulled(self.tool(spec, "pull", "w", "0", "12"))
        for k in range(2):
            self.push(spec, [-k - 0.5 * i for i in range(12)])
        at5 = pulled(self.tool(spec, "pull", "w", "0", "12"))
        self.assertFalse(np.array_equal(at3, at5))
        p.stop(signal.SIGKILL)
        self.assertEqual(ckpt_dirs(root), ["ckpt-0000000003"])
        p = self.psd(spec, 0)
        p.wait_for("resumed from step 3: ")
        got = pulled(self.tool(spec, "pull", "w", "0", "12"))
        self.assertTrue(np.array_equal(bits(got), bits(at3)))
        self.assertIn("version=3", self.tool(spec, "pull", "w", "0", "1"))
        # every_steps counts on from the restored step: 4, 5, 6 -> a checkpoint at 6.
        for k in range(3):
            self.push(spec, [1.0] * 12)
        p.wait_for("checkpoint (every_steps) at step 6 written")

    def test_prune_keeps_exactly_k(self):
        root = os.path.join(self.d, "ck")
        spec = ck_spec(self.d, checkpoint={"dir": root, "keep": 2})
        p = self.psd(spec, 0)
        self.tool(spec, "declare", "w", "4,3")
        for k in range(1, 6):
            self.push(spec, [float(k)] * 12)
            r = psctl(spec, "checkpoint", "--wait")
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertEqual(len(ckpt_dirs(root)), min(k, 2))
        self.assertEqual(ckpt_dirs(root), ["ckpt-0000000004", "ckpt-0000000005"])
        self.push(spec, [1.0] * 12)
        self.assertEqual(p.stop(signal.SIGTERM), 0)
        self.assertEqual(ckpt_dirs(root), ["ckpt-0000000005", "ckpt-0000000006"])
        self.assertEqual(glob.glob(os.path.join(root, "ck", "ps-0", ".tmp-*")), [])

    def test_every_s(self):
        root = os.path.join(self.d, "ck")
        spec = ck_spec(self.d, checkpoint={"dir": root, "every_s": 0.2})
        p = self.psd(spec, 0)
        self.tool(spec, "declare", "w", "4,3")
        self.push(spec, [1.0] * 12)
        p.wait_for("checkpoint (every_s) at step 1 written", timeout=30)
        self.push(spec, [1.0] * 12)
        p.wait_for("checkpoint (every_s) at step 2 written", timeout=30)

    def test_failed_write_is_reported_and_the_shard_keeps_serving(self):
        root = os.path.join(self.d, "ck")
        spec = ck_spec(self.d, checkpoint={"dir": root})
        # A 3 MiB file size limit stands in for a full disk (root ignores
        # permissions; mounting a small filesystem is not allowed here).
        limit = 3 << 20
        wrapper = ["/usr/bin/python3", "-c",
                   "import os, resource, signal, sys; "
                   "signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
                   "resource.setrlimit(resource.RLIMIT_FSIZE, (%d, %d)); "
                   "os.execv(sys.argv[1], sys.argv[1:])" % (limit, limit)]
        p = self.psd(spec, 0, wrapper=wrapper)
        self.tool(spec, "declare", "w", "4,3")
        self.push(spec, [1.0] * 12)
        r = psctl(spec, "checkpoint", "--wait")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        good = os.path.join(root, "ck", "ps-0", "ckpt-0000000001")
        saved = {}
        for f in os.listdir(good):
            with open(os.path.join(good, f), "rb") as fh:
                saved[f] = fh.read()
        # 4 MiB of values + 4 MiB of slots cannot be written under the limit.
        r = h.pstool(spec, "--bytes", str(4 << 20), "--rounds", "1", "roundtrip")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        r = psctl(spec, "checkpoint", "--wait")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("ps:0 (127.0.0.1:", r.stderr)
        self.assertIn("INTERNAL: checkpoint failed: ", r.stderr)
        self.assertIn("File too large", r.stderr)
        self.assertRegex(r.stdout, r"ps:0\s+\S+\s+failed")
        line = p.wait_for("checkpoint (asked for) failed")
        self.assertIn("the previous checkpoint is intact and psd keeps serving", line)
        # The previous checkpoint is untouched, no temporary is left, psd serves.
        self.assertEqual(ckpt_dirs(root), ["ckpt-0000000001"])
        for f, data in saved.items():
            with open(os.path.join(good, f), "rb") as fh:
                self.assertEqual(fh.read(), data, f)
        self.assertEqual(glob.glob(os.path.join(root, "ck", "ps-0", ".tmp-*")), [])
        self.push(spec, [2.0] * 12)
        self.assertIn("version=2", self.tool(spec, "pull", "w", "0", "1"))
        st = psctl(spec, "status")
        self.assertIn("LAST WRITE FAILED: ", st.stdout)
        doc = json.loads(psctl(spec, "--json", "status").stdout)["shards"][0]["checkpoint"]
        self.assertEqual((doc["written"], doc["failed"], doc["step"]), (1, 1, 1))
        self.assertIn("File too large", doc["error"])
        # The final checkpoint cannot be written either: exit 1, said loudly.
        self.assertEqual(p.stop(signal.SIGTERM), 1, p.output())
        self.assertIn("checkpoint (at exit) failed", p.output())

    def test_psctl_checkpoint_names_a_shard_that_is_down(self):
        root = os.path.join(self.d, "ck")
        spec = ck_spec(self.d, nps=2, checkpoint={"dir": root})
        ps = [self.psd(spec, i) for i in range(2)]
        ps[1].stop(signal.SIGKILL)
        r = psctl(spec, "checkpoint", "--wait")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertRegex(r.stderr, r"psctl: ps:1 \(127\.0\.0\.1:\d+\) is down")
        self.assertRegex(r.stdout, r"ps:0\s+\S+\s+written\s+0\s+.*ckpt-0000000000")
        self.assertRegex(r.stdout, r"ps:1\s+\S+\s+down")
        r = psctl(spec, "--json", "checkpoint", "--wait")
        self.assertEqual(r.returncode, 1)
        doc = json.loads(r.stdout)["shards"]
        self.assertTrue(doc[0]["ok"] and doc[0]["written"])
        self.assertFalse(doc[1]["ok"])
        self.assertEqual(doc[1]["status"], "UNAVAILABLE")
        # Without --wait the shard answers at once, before writing.
        r = psctl(spec, "checkpoint")
        self.assertRegex(r.stdout, r"ps:0\s+\S+\s+queued")
        self.assertEqual(r.returncode, 1)

    def test_checkpoints_off(self):
        spec = ck_spec(self.d)
        env = {"STATE_DIRECTORY": ""}
        p = self.psd(spec, 0, env=env)
        self.tool(spec, "declare", "w", "4,3")
        r = psctl(spec, "checkpoint", "--wait")
        self.assertEqual(r.returncode, 1)
        self.assertIn("FAILED_PRECONDITION: checkpoints are off: no checkpoint dir (set "
                      "job.checkpoint.dir, --checkpoint-dir or STATE_DIRECTORY)", r.stderr)
        self.assertIn("CHECKPOINTS off", psctl(spec, "status").stdout)
        self.assertEqual(p.stop(signal.SIGTERM), 0)
        self.assertEqual(sum("checkpoints are off" in l for l in p.lines), 1, p.output())
        self.assertIn("no checkpoint written at exit (no checkpoint dir)", p.output())
        self.assertEqual(os.listdir(self.d), ["spec.json"])
        # --resume-step without a directory is a usage error.
        q = start(spec, 0, "--resume-step", "3", env=env, ready=False)
        self.assertEqual(q.wait(timeout=30), 2)

    def test_dir_from_state_directory_and_flag(self):
        state = os.path.join(self.d, "state")
        spec = ck_spec(self.d)
        p = self.psd(spec, 0, env={"STATE_DIRECTORY": state + ":/elsewhere"})
        self.assertIn("from STATE_DIRECTORY", p.wait_for("checkpoints in %s/ck/ps-0" % state))
        self.assertEqual(p.stop(signal.SIGTERM), 0)
        self.assertEqual(ckpt_dirs(state), ["ckpt-0000000000"])
        # --checkpoint-dir wins over the spec and STATE_DIRECTORY.
        spec = ck_spec(self.d, checkpoint={"dir": "from-spec"})
        flag = os.path.join(self.d, "flag")
        p = self.psd(spec, 0, "--checkpoint-dir", flag, env={"STATE_DIRECTORY": state})
        p.wait_for("checkpoints in %s/ck/ps-0 (from --checkpoint-dir)" % flag)
        self.assertEqual(p.stop(signal.SIGTERM), 0)
        self.assertEqual(ckpt_dirs(flag), ["ckpt-0000000000"])
        p = self.psd(spec, 0, env={"STATE_DIRECTORY": state})
        p.wait_for("checkpoints in %s/from-spec/ck/ps-0 (from job.checkpoint.dir)" % self.d)
        p.stop(signal.SIGTERM)

    def test_sigterm_while_starting_is_graceful(self):
        # Sent before psd serves (it has just found its directory): held
        # until the loop watches signals, then a normal stop.
        root = os.path.join(self.d, "ck")
        spec = ck_spec(self.d, checkpoint={"dir": root})
        p = self.psd(spec, 0, ready=False)
        p.wait_for("checkpoints in ")
        p.p.send_signal(signal.SIGTERM)
        self.assertEqual(p.wait(timeout=30), 0, p.output())
        self.assertIn("checkpoint (at exit) at step 0 written", p.output())
        self.assertEqual(ckpt_dirs(root), ["ckpt-0000000000"])

    def test_sigterm_repeated_while_stopping_is_still_graceful(self):
        # A launcher killed by SIGKILL can make the kernel send its tasks
        # the parent-death SIGTERM more than once (once per thread of the
        # launcher as each exits). Every one after the first, at any point
        # of the stop, must leave the stop graceful: exit 0, the final
        # checkpoint, the Unix socket removed. Signals are sent until psd
        # is gone (bounded: 20,000 at most).
        root = os.path.join(self.d, "ck")
        spec = ck_spec(self.d, checkpoint={"dir": root})
        p = self.psd(spec, 0)
        # SIGHUP is only logged.
        p.p.send_signal(signal.SIGHUP)
        p.wait_for("SIGHUP: nothing to reload")
        self.assertIsNone(p.p.poll(), p.output())
        sent = 0
        while p.p.poll() is None and sent < 20000:
            try:
                os.kill(p.p.pid, signal.SIGTERM)
            except ProcessLookupError:
                break
            sent += 1
            time.sleep(0.0002)
        self.assertEqual(p.wait(timeout=30), 0,
                         "after %d SIGTERMs\n%s" % (sent, p.output()))
        self.assertIn("checkpoint (at exit) at step 0 written", p.output())
        self.assertIn("stopped", p.lines[-1], p.output())

    def test_bad_settings_exit_2_with_the_json_path(self):
        cases = [({"dir": ""}, "job.checkpoint.dir: empty"),
                 ({"dir": "x", "keep": 0}, "job.checkpoint.keep: expected a positive integer, got 0"),
                 ({"every_steps": -5}, "job.checkpoint.every_steps: expected a non-negative integer"),
                 ({"every_s": "10"}, "job.checkpoint.every_s: expected a number of seconds"),
                 ({"evry_s": 1}, "job.checkpoint.evry_s: unknown key (did you mean every_s?)")]
        for ck, needle in cases:
            spec = ck_spec(self.d, checkpoint=ck)
            r = h.run([h.build_path("ps-server", "psd"), "--cluster", spec, "--task", "ps:0"],
                      timeout=30)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn("spec.json: " + needle, r.stderr)
        # A directory that cannot be one: exit 1, naming it.
        blocker = os.path.join(self.d, "file")
        open(blocker, "w").close()
        spec = ck_spec(self.d, checkpoint={"dir": blocker})
        r = h.run([h.build_path("ps-server", "psd"), "--cluster", spec, "--task", "ps:0"],
                  timeout=30)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("cannot use %s as a directory" % blocker, r.stderr)


class SyncStepsTest(unittest.TestCase):
    """Sync shards that resume at different steps are told so, and
    --resume-step realigns them (pstool syncload: no dataset needed)."""

    def test_shards_at_different_steps_then_resume_step(self):
        with h.TempDir() as d:
            root = os.path.join(d, "ck")
            spec = ck_spec(d, nps=2, nworker=1, name="steps",
                           checkpoint={"dir": root, "every_steps": 2, "keep": 5},
                           sync={"mode": "sync"}, heartbeat_ms=100, dead_after_ms=5000)
            ps = [start(spec, i) for i in range(2)]
            try:
                r = h.pstool(spec, "--rounds", "4", "--worker", "0", "syncload")
                self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
                for p in ps:
                    p.wait_for("checkpoint (every_steps) at step 4 written")
                self.assertEqual([p.stop(signal.SIGTERM) for p in ps], [0, 0])
                # ps:0 loses its newest: it resumes at 2, ps:1 at 4.
                shutil.rmtree(os.path.join(root, "steps", "ps-0", "ckpt-0000000004"))
                ps = [start(spec, i) for i in range(2)]
                ps[0].wait_for("resumed from step 2: ")
                ps[1].wait_for("resumed from step 4: ")
                line = ps[0].wait_for("the shards are at different steps")
                self.assertIn("(the coordinator opens step 2): ps:1 is at step 4;", line)
                self.assertIn("--resume-step", line)
                r = h.pstool(spec, "--rounds", "1", "--worker", "0", "syncload")
                self.assertEqual(r.returncode, 1)
                self.assertIn("FAILED_PRECONDITION: the shards are at different steps", r.stderr)
                # Realigned: ps:1 goes back to 2 and sets 4 aside; steps go on.
                self.assertEqual([p.stop(signal.SIGTERM) for p in ps], [0, 0])
                ps = [start(spec, 0), start(spec, 1, "--resume-step", "2")]
                for p in ps:
                    p.wait_for("resumed from step 2: ")
                self.assertIn("superseded-ckpt-0000000004-", ps[1].wait_for(" aside as "))
                r = h.pstool(spec, "--rounds", "3", "--worker", "0", "syncload")
                self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
                st = json.loads(psctl(spec, "--json", "status").stdout)["shards"]
                self.assertEqual([s["step"] for s in st], [5, 5])
                self.assertEqual([r["step"] for r in st[1]["steps"]], [2, 3, 4])
            finally:
                for p in ps:
                    p.stop(signal.SIGTERM)


@unittest.skipUnless(os.path.isdir(DATA), "dataset-fashion-mnist is not installed")
class SyncCkptTest(unittest.TestCase):
    def test_sigterm_and_restart_resume_at_the_saved_step(self):
        with h.TempDir() as d:
            root = os.path.join(d, "ck")
            spec = ck_spec(d, nps=2, nworker=2, name="sync-ck", epochs=1, log_every=5,
                           checkpoint={"dir": root, "every_steps": 5, "keep": 3},
                           sync={"mode": "sync", "deterministic": True},
                           heartbeat_ms=100, dead_after_ms=20000)
            ps = [start(spec, i) for i in range(2)]
            try:
                ws = [h.Proc([h.build_path("worker", "dworker"), "--cluster", spec, "--task",
                              "worker:%d" % i, "--max-steps", "12"]) for i in range(2)]
                for w in ws:
                    self.assertEqual(w.wait(timeout=300), 0, w.output()[-3000:])
                before = os.path.join(d, "before.safetensors")
                r = psctl(spec, "export", "--out", before, "--slots")
                self.assertEqual(r.returncode, 0, r.stderr)
                # Periodic ones at 5 and 10 on both shards, at commit boundaries.
                for p in ps:
                    p.wait_for("checkpoint (every_steps) at step 5 written")
                    p.wait_for("checkpoint (every_steps) at step 10 written")
                rcs = [p.stop(signal.SIGTERM) for p in ps]
                self.assertEqual(rcs, [0, 0])
                for s, p in enumerate(ps):
                    self.assertIn("checkpoint (at exit) at step 12 written", p.output())
                    self.assertEqual(ckpt_dirs(root, "sync-ck", s),
                                     ["ckpt-0000000005", "ckpt-0000000010", "ckpt-0000000012"])
                ps = [start(spec, i) for i in range(2)]
                for p in ps:
                    p.wait_for("resumed from step 12: ")
                after = os.path.join(d, "after.safetensors")
                r = psctl(spec, "export", "--out", after, "--slots")
                self.assertEqual(r.returncode, 0, r.stderr)
                a, _ = read_safetensors(before)
                b, meta = read_safetensors(after)
                self.assertEqual(meta["step"], "12")
                self.assertEqual(len(a), 12)  # 6 variables and their slots
                for name in a:
                    self.assertTrue(np.array_equal(bits(a[name]), bits(b[name])), name)
                # Workers join at the saved step and the job goes on from it.
                ws = [h.Proc([h.build_path("worker", "dworker"), "--cluster", spec, "--task",
                              "worker:%d" % i, "--max-steps", "3"]) for i in range(2)]
                for w in ws:
                    self.assertEqual(w.wait(timeout=300), 0, w.output()[-3000:])
                    self.assertIn("joined the synchronous job at step 12", w.output())
                for p in ps:
                    p.wait_for("checkpoint (every_steps) at step 15 written")
                st = json.loads(psctl(spec, "--json", "status").stdout)["shards"]
                for s in st:
                    self.assertEqual(s["step"], 15)
                    self.assertEqual([r["step"] for r in s["steps"]], [12, 13, 14])
                    self.assertEqual(s["checkpoint"]["step"], 15)
            finally:
                for p in ps:
                    p.stop(signal.SIGTERM)


if __name__ == "__main__":
    h.main()
