"""Fault tests of shards and workers that stop answering: a psd stopped
(SIGSTOP) past the call deadline, a worker cut off in a network namespace,
and the checkpoint disk full and then read-only. Run by test_faults.py."""
import errno
import glob
import os
import random
import re
import signal
import subprocess
import unittest

import harness as h
from faults import DATA, Faults, fields, psctl, result, status, wait_any, wait_match
from netns import Net, ip



class StopTest(Faults):
    def test_sigstop_past_deadline_push_applied_exactly_once(self):
        spec = h.spec_in(self.d, {"name": "stop", "optimizer": {"type": "sgd", "lr": 0.5},
                                 "rpc_timeout_ms": 300, "retry_s": 30}, nworker=1)
        ps = [self.psd(spec, i) for i in range(2)]
        # 4 MiB split over 2 shards in 256 KiB messages: 8 per shard per push.
        rounds, per_shard = 300, 8
        c = self.proc([h.build_path("tests", "pstool"), "--cluster", spec, "--timeout", "300",
                       "--bytes", str(4 << 20), "--chunk", str(256 << 10), "--rounds",
                       str(rounds), "count"])
        c.wait_for("count pushes=50", timeout=60)
        ps[1].p.send_signal(signal.SIGSTOP)
        try:
            # Stopped past the 300 ms deadline: the client says so, once.
            line = c.wait_for("unreachable (DEADLINE_EXCEEDED", timeout=30)
            self.assertIn("ps:1 (", line)
            self.assertIn("retrying for up to 30 s", line)
        finally:
            ps[1].p.send_signal(signal.SIGCONT)
        wait_match(c, r"ps:1 \(\S+\) back after \d+\.\d s")
        self.assertEqual(c.wait(timeout=120), 0, c.output()[-3000:])
        res = fields(c.lines[-1])
        # Every element is exactly its start minus 300 x 0.5 x 2^-10.
        self.assertEqual((res["pushes"], res["mismatches"]), (str(rounds), "0"), c.lines[-1])
        self.assertEqual(float(res["value0"]), -rounds * 0.5 / 1024)
        self.assertGreater(int(res["retries"]), 0)
        self.assertEqual(res["outages"], "1")
        # Each shard applied each message once: the retries of calls the
        # stopped shard never read were applied once, any it had read were
        # acknowledged as duplicates.
        st = status(spec)
        self.assertEqual([s["pushes"] for s in st], [rounds * per_shard] * 2)
        self.assertEqual(st[0]["duplicates"], 0)
        print("stopped shard: %s retried calls, %d duplicates acknowledged"
              % (res["retries"], st[1]["duplicates"]))
        self.stop_all(ps)

    @unittest.skipUnless(os.path.isdir(DATA), "dataset-fashion-mnist is not installed")
    def test_sigstop_sync_job_is_bit_identical(self):
        job = {"name": "stop-sync", "epochs": 1, "batch_size": 64, "log_every": 20,
               "optimizer": {"type": "momentum", "lr": 0.02, "momentum": 0.9},
               "sync": {"mode": "sync", "deterministic": True}, "heartbeat_ms": 100,
               "dead_after_ms": 30000, "rpc_timeout_ms": 500, "retry_s": 60}
        params = []
        for stop in (False, True):
            d = os.path.join(self.d, "stop" if stop else "base")
            os.makedirs(d)
            spec = h.spec_in(d, job)
            ps = [self.psd(spec, i) for i in range(2)]
            out = os.path.join(d, "params.bin")
            ws = [self.worker(spec, 0, "--max-steps", "120", "--save-params", out),
                  self.worker(spec, 1, "--max-steps", "120")]
            if stop:
                for w in ws:
                    w.wait_for("step 40/", timeout=120)
                ps[1].p.send_signal(signal.SIGSTOP)
                try:
                    # A worker that pushed this step to ps:1 before the stop
                    # waits on the coordinator (ps:0) for the commit and may
                    # never call ps:1 while it is stopped; the other one
                    # pushes to it and must say it is unreachable.
                    hit = wait_any(ws, r"ps:1 \(\S+\) unreachable \(DEADLINE_EXCEEDED")
                finally:
                    ps[1].p.send_signal(signal.SIGCONT)
            self.finish(ws)
            st = status(spec)
            self.stop_all(ps)
            self.assertEqual(st[0]["steps"], st[1]["steps"])
            self.assertEqual(st[0]["step"], 120)
            if stop:
                self.assertRegex(hit.output(), r"ps:1 \(\S+\) back after")
            with open(out, "rb") as f:
                params.append((f.read(), result(ws[0])["test_accuracy"]))
        self.assertEqual(params[0][1], params[1][1])
        self.assertTrue(params[0][0] == params[1][0], "parameters differ after the stop")




@unittest.skipUnless(os.path.isdir(DATA), "dataset-fashion-mnist is not installed")
class NetnsTest(Faults):
    """worker:1 runs in a network namespace of its own, reaching the shards
    over a veth pair whose link the test takes down and brings back."""

    def setUp(self):
        super().setUp()
        net = Net(self, "psdf")
        self.ns = net.netns()
        self.vh = "pf%sh" % net.tag
        a, b = random.randrange(256), random.randrange(64) * 4
        self.host_ip, ns_ip = "10.213.%d.%d" % (a, b + 1), "10.213.%d.%d" % (a, b + 2)
        net.veth(self.vh, "pf%sn" % net.tag, None, self.ns, self.host_ip + "/30",
                 ns_ip + "/30")

    def test_cut_off_worker_rejoins(self):
        job = {"name": "netns", "epochs": 1, "batch_size": 64, "log_every": 20,
               "optimizer": {"type": "sgd", "lr": 0.02},
               "sync": {"mode": "sync", "deadline": {"multiple": 3.0, "floor_ms": 300}},
               "heartbeat_ms": 100, "dead_after_ms": 1000, "rpc_timeout_ms": 1000,
               "retry_s": 60}
        spec = h.spec_in(self.d, job, ps_host=self.host_ip)
        ps = [self.psd(spec, i) for i in range(2)]
        ws = [self.worker(spec, 0), self.worker(spec, 1, "--max-steps", "300", netns=self.ns)]
        self.assertIn("using TCP to %s:" % self.host_ip, ws[1].wait_for("shard 1: using"))
        ws[1].wait_for("step 40/", timeout=120)
        ip("link", "set", self.vh, "down")
        try:
            # Down past dead_after_ms: the coordinator gives up on it.
            ps[0].wait_for("worker:1 declared dead", timeout=30)
            ws[1].wait_for("unreachable (DEADLINE_EXCEEDED", timeout=30)
        finally:
            ip("link", "set", self.vh, "up")
        line = ps[0].wait_for("worker:1 rejoined at step ", timeout=60)
        back_at = int(re.search(r"rejoined at step (\d+)", line).group(1))
        ws[1].wait_for("joined the job again at step", timeout=30)
        self.finish(ws)
        self.assertEqual(result(ws[1])["steps"], "300")
        st = status(spec)
        self.stop_all(ps)
        self.assertEqual(st[0]["workers"][1]["joins"], 2)
        hist = [s["steps"] for s in st]
        self.assertEqual(hist[0], hist[1])
        # Counted in steps again once back.
        self.assertTrue(any(r["step"] >= back_at and 1 in r["applied"] for r in hist[0]),
                        [r for r in hist[0] if r["step"] >= back_at][:5])


class DiskTest(Faults):
    """The checkpoint directory on a 2 MiB tmpfs: filled up, then read-only."""

    def tool(self, spec, *args):
        r = h.pstool(spec, *args)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        return r.stdout

    def test_disk_full_then_read_only(self):
        root = os.path.join(self.d, "ck")
        os.makedirs(root)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", root],
                           capture_output=True, text=True)
        if r.returncode != 0:
            self.skipTest("cannot mount a tmpfs here: " + r.stderr.strip())
        self.cleanups.append(lambda: subprocess.run(["umount", "-l", root]))
        spec = h.spec_in(self.d, {"name": "disk", "optimizer": {"type": "sgd", "lr": 0.5},
                                 "checkpoint": {"dir": root}}, nps=1, nworker=1)
        p = self.psd(spec, 0)
        self.tool(spec, "declare", "w", "64,256")  # 64 KiB
        self.tool(spec, "push", "w", "64,256", "0", ",".join(["1"] * 8))
        r = psctl(spec, "checkpoint", "--wait")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        good = os.path.join(root, "disk", "ps-0", "ckpt-0000000001")
        saved = {}
        for f in os.listdir(good):
            with open(os.path.join(good, f), "rb") as fh:
                saved[f] = fh.read()

        def intact():
            self.assertEqual(sorted(os.listdir(os.path.dirname(good))), ["ckpt-0000000001"])
            for f, data in saved.items():
                with open(os.path.join(good, f), "rb") as fh:
                    self.assertEqual(fh.read(), data, f)

        def fails_and_serves(why, version):
            r = psctl(spec, "checkpoint", "--wait")
            self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
            self.assertIn("INTERNAL: checkpoint failed: ", r.stderr)
            self.assertIn(why, r.stderr)
            fails_and_serves.n += 1
            line = wait_match(p, r"checkpoint \(asked for\) failed", count=fails_and_serves.n)
            self.assertIn(why, line)
            self.assertIn("the previous checkpoint is intact and psd keeps serving", line)
            intact()
            self.tool(spec, "push", "w", "64,256", "0", ",".join(["1"] * 8))
            self.assertIn("version=%d" % version, self.tool(spec, "pull", "w", "0", "1"))

        fails_and_serves.n = 0
        # Full: fill what is left of the 2 MiB.
        filler = os.path.join(root, "filler")
        with open(filler, "wb") as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError as e:
                self.assertEqual(e.errno, errno.ENOSPC)
        self.tool(spec, "push", "w", "64,256", "0", ",".join(["1"] * 8))
        fails_and_serves("No space left on device", 3)
        # Read-only: room again, but no writes at all.
        os.remove(filler)
        subprocess.run(["mount", "-o", "remount,ro", root], check=True)
        fails_and_serves("Read-only file system", 4)
        self.assertEqual(len([l for l in p.lines if "checkpoint (asked for) failed" in l]), 2)
        # Writable again: the next checkpoint is written, and counted.
        subprocess.run(["mount", "-o", "remount,rw", root], check=True)
        r = psctl(spec, "checkpoint", "--wait")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        doc = status(spec)[0]["checkpoint"]
        self.assertEqual((doc["written"], doc["failed"], doc["step"]), (2, 2, 4))
        self.assertEqual(glob.glob(os.path.join(root, "disk", "ps-0", ".tmp-*")), [])
        self.stop_all([p])
