"""What a client says when it cannot use a shard (docs/faults.md): a shard
nobody listens for is named with its address and the cause within 2 s and
again every 10 s, by dworker and by psctl, and a worker waits for a shard
that comes up late, answered within 1 s of its readiness line; a worker started from another cluster spec than the
shard's is refused, naming both specs' counts; a shard restarted without a
checkpoint stops the workers with an error naming it and checkpoint.dir,
while one restarted from its checkpoint lets them go on. Run:
/usr/bin/python3 test_reach.py BUILD_DIR"""
import json
import os
import re
import signal
import time
import unittest

import harness as h

DATA = "/usr/share/datasets/fashion-mnist"
# A small, slowed-down job: steps long enough to kill a shard mid-training.
JOB = {"name": "reach", "model": "mlp", "hidden": [32], "epochs": 1, "log_every": 10,
       "batch_size": 32, "optimizer": {"type": "sgd", "lr": 0.05}, "heartbeat_ms": 200,
       "rpc_timeout_ms": 2000}


def stamp(line):
    """Seconds since midnight of a log line's "HH:MM:SS.mmm" prefix."""
    m = re.match(r"(\d\d):(\d\d):(\d\d\.\d+) ", line)
    assert m, line
    return int(m.group(1)) * 3600 + int(m.group(2)) * 60 + float(m.group(3))


def spec_file(d, name, cfg):
    path = os.path.join(d, name)
    with open(path, "w") as f:
        json.dump(cfg, f, indent=2)
    return path


class UnreachableTest(h.ProcTest):
    def test_psctl_names_shard_address_and_cause_at_once(self):
        spec = os.path.join(self.d, "spec.json")
        cfg = h.write_spec(spec, nps=1, nworker=1, job={"name": "reach"})
        addr = cfg["cluster"]["ps"][0]
        t0 = time.monotonic()
        r = h.run([h.build_path("ps-server", "psctl"), "--cluster", spec, "status"],
                  timeout=30)
        took = time.monotonic() - t0
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("ps:0 (%s) is down: " % addr, r.stderr)
        self.assertIn("connection refused (nothing listens there?)", r.stderr)
        self.assertLess(took, 3.0, r.stderr)

    @unittest.skipUnless(os.path.isdir(DATA), "dataset-fashion-mnist is not installed")
    def test_worker_says_cause_within_2s_repeats_every_10s_then_fails(self):
        spec = os.path.join(self.d, "spec.json")
        cfg = h.write_spec(spec, nps=1, nworker=1, job=JOB)
        addr = cfg["cluster"]["ps"][0]
        t0 = time.monotonic()
        w = h.Proc([h.build_path("worker", "dworker"), "--cluster", spec, "--task",
                    "worker:0", "--connect-timeout-ms", "12000"])
        self.procs.append(w)
        first = w.wait_for("not reachable", timeout=10)
        # From process start (with its data loading, and slack for a slow
        # machine), and from the line before the declare by the log's clock.
        self.assertLess(time.monotonic() - t0, 5.0)
        before = w.wait_for("model: mlp")
        self.assertLessEqual(stamp(first) - stamp(before), 2.0, w.output())
        self.assertIn("ps:0 (%s) not reachable: connection refused (nothing listens "
                      "there?); waiting up to 12 s" % addr, first)
        again = w.wait_for("still waiting for ps:0 (%s): connection refused" % addr,
                           timeout=15)
        self.assertAlmostEqual(stamp(again) - stamp(first), 10.0, delta=1.5)
        self.assertEqual(w.wait(timeout=30), 1, w.output())
        last = w.lines[-1]
        self.assertIn("declare to ps:0 (%s) failed: not reachable for" % addr, last)
        self.assertIn("connection refused", last)
        self.assertLess(time.monotonic() - t0, 25.0)

    @unittest.skipUnless(os.path.isdir(DATA), "dataset-fashion-mnist is not installed")
    def test_worker_waits_for_a_late_shard(self):
        spec = os.path.join(self.d, "spec.json")
        cfg = h.write_spec(spec, nps=1, nworker=1, job=JOB)
        addr = cfg["cluster"]["ps"][0]
        w = h.Proc([h.build_path("worker", "dworker"), "--cluster", spec, "--task",
                    "worker:0", "--max-steps", "5"])
        self.procs.append(w)
        w.wait_for("ps:0 (%s) not reachable" % addr, timeout=10)
        ps = h.start_psd(spec, 0)
        self.procs.append(ps)
        answered = w.wait_for("ps:0 (%s) answered after" % addr, timeout=15)
        self.assertRegex(answered, r"answered after \d+\.\d s")
        # Within ~100 ms of the shard listening, by the logs' clock (a
        # generous 1 s here), not after gRPC's reconnect backoff (5-6.8 s).
        ready = ps.wait_for("ready: listening on")
        self.assertLess(stamp(answered) - stamp(ready), 1.0, w.output())
        self.assertEqual(w.wait(timeout=60), 0, w.output())
        self.assertIn("final: test_accuracy=", w.output())


@unittest.skipUnless(os.path.isdir(DATA), "dataset-fashion-mnist is not installed")
class SpecMismatchTest(h.ProcTest):
    def test_worker_with_two_shards_against_shard_with_one(self):
        cfg = h.write_spec(os.path.join(self.d, "two.json"), nps=2, nworker=2, job=JOB)
        two = os.path.join(self.d, "two.json")
        one_cfg = json.loads(json.dumps(cfg))
        one_cfg["cluster"]["ps"] = cfg["cluster"]["ps"][:1]
        one = spec_file(self.d, "one.json", one_cfg)
        ps = h.start_psd(one, 0)
        self.procs.append(ps)
        r = h.run([h.build_path("worker", "dworker"), "--cluster", two, "--task", "worker:0",
                   "--connect-timeout-ms", "20000"], timeout=60)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("declare to ps:0 (%s) failed: FAILED_PRECONDITION: the worker's and "
                      "the shard's cluster specs differ: worker:0's spec lists 2 shards and "
                      "2 workers, ps:0's lists 1 shard and 2 workers (job 'reach'); start "
                      "every task from the same spec" % cfg["cluster"]["ps"][0], r.stderr)
        # Refused at once, not after waiting for ps:1, which nobody runs.
        self.assertNotIn("still waiting", r.stderr)
        # psctl from that spec is refused the same way.
        st = h.run([h.build_path("ps-server", "psctl"), "--cluster", two, "status"])
        self.assertEqual(st.returncode, 1)
        self.assertIn("the caller's and the shard's cluster specs differ: psctl's spec "
                      "lists 2 shards", st.stderr)
        # The same spec is served.
        st = h.run([h.build_path("ps-server", "psctl"), "--cluster", one, "status"])
        self.assertEqual(st.returncode, 0, st.stderr)


@unittest.skipUnless(os.path.isdir(DATA), "dataset-fashion-mnist is not installed")
class LostStateTest(h.ProcTest):
    def workers(self, spec, *extra):
        ws = []
        for i in range(2):
            ws.append(h.Proc([h.build_path("worker", "dworker"), "--cluster", spec,
                              "--task", "worker:%d" % i, "--inject-delay-ms", "20"]
                             + list(extra)))
            self.procs.append(ws[-1])
        return ws

    def test_shard_restarted_without_checkpoint_stops_the_workers(self):
        spec = os.path.join(self.d, "spec.json")
        cfg = h.write_spec(spec, nps=2, nworker=2, job=dict(JOB, retry_s=20))
        ps = [h.start_psd(spec, i) for i in range(2)]
        self.procs += ps
        ws = self.workers(spec)
        for w in ws:
            w.wait_for("step 20/", timeout=60)
        ps[0].p.send_signal(signal.SIGKILL)
        self.assertEqual(ps[0].wait(), -signal.SIGKILL)
        ps[0] = h.start_psd(spec, 0)
        self.procs.append(ps[0])
        for w in ws:
            self.assertEqual(w.wait(timeout=60), 1, w.output()[-3000:])
            out = w.output()
            err = [l for l in w.lines if "restarted without a checkpoint" in l]
            self.assertEqual(len(err), 1, out[-3000:])
            self.assertRegex(err[0], r"ps:0 \(%s\) failed: FAILED_PRECONDITION: ps:0 "
                             r"restarted without a checkpoint: the parameters worker:\d "
                             r"trained there are lost" % re.escape(cfg["cluster"]["ps"][0]))
            self.assertIn("set job.checkpoint.dir in the spec", err[0])
            # Nothing trained after it.
            after = w.lines[w.lines.index(err[0]) + 1:]
            self.assertFalse([l for l in after if re.search(r"step \d+/", l)], out[-3000:])

    def test_shard_restarted_from_its_checkpoint_lets_them_go_on(self):
        spec = os.path.join(self.d, "spec.json")
        h.write_spec(spec, nps=2, nworker=2,
                     job=dict(JOB, retry_s=20,
                              checkpoint={"dir": os.path.join(self.d, "ck"),
                                          "every_steps": 20}))
        ps = [h.start_psd(spec, i) for i in range(2)]
        self.procs += ps
        ws = self.workers(spec, "--max-steps", "120")
        ps[0].wait_for("checkpoint (every_steps) at step ", timeout=60)
        ps[0].p.send_signal(signal.SIGKILL)
        self.assertEqual(ps[0].wait(), -signal.SIGKILL)
        ps[0] = h.start_psd(spec, 0)
        self.procs.append(ps[0])
        ps[0].wait_for("resumed from step ")
        for w in ws:
            self.assertEqual(w.wait(timeout=90), 0, w.output()[-3000:])
            self.assertNotIn("restarted without a checkpoint", w.output())


if __name__ == "__main__":
    h.main()
