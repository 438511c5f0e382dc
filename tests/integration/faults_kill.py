"""Fault tests that kill processes (kill -9): a psd mid-training, async
(shard 0, resumed from its checkpoint) and sync (shard 0 or 1, the job rolled
back to a common checkpoint), and a worker while a shard is stopped. Run by
test_faults.py."""
import os
import re
import signal
import unittest

import harness as h
from faults import ACC_JOB, DATA, EPOCHS, Faults, result, status



_baseline = {}


@unittest.skipUnless(os.path.isdir(DATA), "dataset-fashion-mnist is not installed")
class KillPsdTest(Faults):
    def run_job(self, kill):
        d = os.path.join(self.d, "kill" if kill else "base")
        os.makedirs(d)
        spec = h.spec_in(d, ACC_JOB)
        ps = [self.psd(spec, i) for i in range(2)]
        ws = [self.worker(spec, i) for i in range(2)]
        resumed = None
        if kill:
            # Both train (a worker still declaring waits for the shards
            # without a retry to log).
            for w in ws:
                w.wait_for("step 100/", timeout=120)
            ps[0].wait_for("checkpoint (every_steps) at step ", timeout=60)
            ps[0].p.send_signal(signal.SIGKILL)
            self.assertEqual(ps[0].wait(), -signal.SIGKILL)
            # Restarted as systemd would (Restart=on-failure), at once.
            ps[0] = self.psd(spec, 0)
            line = ps[0].wait_for("resumed from step ")
            resumed = int(re.search(r"resumed from step (\d+): ", line).group(1))
        self.finish(ws)
        st = status(spec)
        self.stop_all(ps)
        return float(result(ws[0])["test_accuracy"]), ws, st, resumed

    def baseline(self):
        if "acc" not in _baseline:
            _baseline["acc"] = self.run_job(kill=False)[0]
        return _baseline["acc"]

    def test_kill9_shard0_restart_resumes_and_job_finishes(self):
        base = self.baseline()
        acc, ws, st, resumed = self.run_job(kill=True)
        print("fault-free accuracy %.4f, with ps:0 killed and restarted %.4f (resumed "
              "from step %d)" % (base, acc, resumed))
        self.assertGreater(resumed, 0)
        for w in ws:
            out = w.output()
            # The outage is said once, with the budget, and its end.
            self.assertEqual(len(re.findall(r"ps:0 \(\S+\) unreachable \(", out)), 1,
                             out[-3000:])
            self.assertIn("retrying for up to 60 s", out)
            self.assertRegex(out, r"ps:0 \(\S+\) back after \d+\.\d s")
            # The restarted coordinator did not know the worker: it joined again.
            self.assertIn("joined the job again at step", out)
        # Each joined the new coordinator once (then left at its end).
        self.assertEqual([(w["joins"], w["live"]) for w in st[0]["workers"]],
                         [(1, False), (1, False)])
        self.assertLessEqual(abs(acc - base), 0.01, (acc, base))


# The sync job a shard is killed in: ACC_JOB's sgd on a cosine over the
# job's EPOCHS x 469 steps, both workers in every step, checkpoints every 50.
SYNC_JOB = dict(ACC_JOB, name="syncfaults", epochs=EPOCHS,
                optimizer={"type": "sgd", "lr": 0.05,
                           "schedule": {"type": "cosine", "total_steps": EPOCHS * 469}},
                sync={"mode": "sync"}, checkpoint={"dir": "ck", "every_steps": 50})
_sync_baseline = {}


@unittest.skipUnless(os.path.isdir(DATA), "dataset-fashion-mnist is not installed")
class KillPsdSyncTest(Faults):
    """A sync job survives kill -9 + restart of a shard: another shard is
    rolled back by the coordinator to the checkpoint it restarted from; the
    coordinator (ps:0) restarted rolls every shard back to its own, and the
    workers join it again."""

    def run_job(self, kill=None):
        """kill: the shard to kill -9 and restart once both workers are
        past step 150 and it has written a checkpoint; None: no fault."""
        d = os.path.join(self.d, "base" if kill is None else "kill%d" % kill)
        os.makedirs(d)
        spec = h.spec_in(d, SYNC_JOB)
        ps = [self.psd(spec, i) for i in range(2)]
        ws = [self.worker(spec, i) for i in range(2)]
        resumed = None
        if kill is not None:
            for w in ws:
                w.wait_for("step 150/", timeout=120)
            ps[kill].wait_for("checkpoint (every_steps) at step ", timeout=60)
            ps[kill].p.send_signal(signal.SIGKILL)
            self.assertEqual(ps[kill].wait(), -signal.SIGKILL)
            ps[kill] = self.psd(spec, kill)
            line = ps[kill].wait_for("resumed from step ")
            resumed = int(re.search(r"resumed from step (\d+): ", line).group(1))
        self.finish(ws)
        st = status(spec)
        self.stop_all(ps)
        return float(result(ws[0])["test_accuracy"]), ps, ws, st, resumed

    def baseline(self):
        if "acc" not in _sync_baseline:
            _sync_baseline["acc"] = self.run_job()[0]
        return _sync_baseline["acc"]

    def check_end(self, ws, st, acc, base):
        """Both workers ran their steps and took again the ones the rollback
        undid, every shard is at the same step with the same commits where
        both remember them, one rollback each, and the accuracy is within
        0.02 of the run without the fault."""
        total = EPOCHS * 469
        for w in ws:
            r = result(w)
            self.assertGreater(int(r.get("redone", 0)), 0, r)
            self.assertEqual(int(r["steps"]), total + int(r["redone"]), r)
        self.assertIn("training: %d epochs of 469 steps" % EPOCHS, ws[0].output())
        self.assertEqual(st[0]["step"], st[1]["step"], (st[0]["step"], st[1]["step"]))
        print("sync: the shards committed %d steps (%d without the fault); the workers "
              "redid %s steps" % (st[0]["step"], total,
                                  " and ".join(result(w)["redone"] for w in ws)))
        self.assertEqual([x["rollbacks"] for x in st], [1, 1])
        hist = [{r["step"]: (r.get("applied"), r.get("dropped")) for r in x.get("steps", [])}
                for x in st]
        common = set(hist[0]) & set(hist[1])
        self.assertGreater(len(common), 100)
        for k in common:
            self.assertEqual(hist[0][k], hist[1][k], k)
        self.assertLessEqual(abs(acc - base), 0.02, (acc, base))

    def test_kill9_shard0_restart_rolls_back_and_workers_rejoin(self):
        base = self.baseline()
        acc, ps, ws, st, resumed = self.run_job(kill=0)
        m = re.search(r"rolled the job back to step (\d+): ps:0 \(the coordinator\) "
                      r"restarted from its checkpoint of step (\d+) while the others were "
                      r"at step (\d+); (\d+) steps are redone \(rollback 1\)", ps[0].output())
        self.assertTrue(m, ps[0].output()[-3000:])
        self.assertEqual(int(m.group(1)), resumed)
        self.assertGreater(int(m.group(3)), resumed)
        print("sync: fault-free accuracy %.4f, with ps:0 killed and restarted %.4f "
              "(resumed from step %d, the job was at step %s)" % (base, acc, resumed, m.group(3)))
        for w in ws:
            out = w.output()
            # Joined the restarted coordinator once, from the training
            # thread, at the step it reopened, in the new generation.
            self.assertEqual(len(re.findall("joined the job again", out)), 1, out[-3000:])
            self.assertIn("joined the job again at step %d (generation 1; the coordinator "
                          "restarted" % resumed, out)
        self.assertEqual([w["joins"] for w in st[0]["workers"]], [1, 1])
        self.check_end(ws, st, acc, base)

    def test_kill9_shard1_restart_rolls_back_and_job_finishes(self):
        base = self.baseline()
        acc, ps, ws, st, resumed = self.run_job(kill=1)
        m = re.search(r"rolled the job back to step (\d+): ps:1 restarted from its "
                      r"checkpoint of step (\d+) while the others were at step (\d+); "
                      r"(\d+) steps are redone", ps[0].output())
        self.assertTrue(m, ps[0].output()[-3000:])
        self.assertEqual(int(m.group(1)), resumed)
        print("sync: fault-free accuracy %.4f, with ps:1 killed and restarted %.4f "
              "(resumed from step %d, the job was at step %s)" % (base, acc, resumed, m.group(3)))
        for w in ws:
            out = w.output()
            self.assertIn("the job rolled back to step %d (a shard restarted from its "
                          "checkpoint); going on from there" % resumed, out)
        self.check_end(ws, st, acc, base)



@unittest.skipUnless(os.path.isdir(DATA), "dataset-fashion-mnist is not installed")
class KillWorkerTest(Faults):
    """A worker killed while a shard is stopped past the deadline."""

    def run_job(self, sync):
        job = {"name": "killw", "epochs": 20, "batch_size": 64, "log_every": 10,
               "optimizer": {"type": "sgd", "lr": 0.02}, "heartbeat_ms": 100,
               "dead_after_ms": 1000, "rpc_timeout_ms": 500, "retry_s": 60}
        if sync:
            job["sync"] = {"mode": "sync", "replicas_to_aggregate": 3, "min_replicas": 2,
                           "deadline": {"multiple": 3.0, "floor_ms": 300}}
        spec = h.spec_in(self.d, job, nworker=3)
        ps = [self.psd(spec, i) for i in range(2)]
        # worker:2 is killed mid-job: 20 epochs keep its end (some 6,000
        # steps) out of reach, so that a test process slowed by a busy
        # machine cannot see it finish before the signal; the others stop
        # at 600 steps, which worker:0 must not reach before ps:1 is stopped
        # (at 200 it once had, while worker:2 was still loading its data:
        # 10 to 200 steps take 0.4 s here).
        ws = [self.worker(spec, i, *(("--max-steps", "600") if i < 2 else ()))
              for i in range(3)]
        for w in ws[:2]:
            w.wait_for("step 10/", timeout=120)
        ws[2].wait_for("step 30/", timeout=120)
        ps[1].p.send_signal(signal.SIGSTOP)
        try:
            ws[2].p.send_signal(signal.SIGKILL)
            self.assertEqual(ws[2].wait(), -signal.SIGKILL)
            ws[0].wait_for("unreachable (DEADLINE_EXCEEDED", timeout=30)
        finally:
            ps[1].p.send_signal(signal.SIGCONT)
        ps[0].wait_for("worker:2 declared dead", timeout=30)
        self.finish(ws[:2])
        for w in ws[:2]:
            self.assertEqual(result(w)["steps"], "600")
        st = status(spec)
        self.stop_all(ps)
        self.assertEqual([w["live"] for w in st[0]["workers"]], [False] * 3)
        return st

    def test_async(self):
        st = self.run_job(sync=False)
        self.assertGreater(st[0]["workers"][2]["pushes"], 0)

    def test_sync(self):
        st = self.run_job(sync=True)
        hist = [s["steps"] for s in st]
        # Every shard applied the same workers' gradients at every step, and
        # the steps after the death went on with the two that live.
        self.assertEqual(hist[0], hist[1])
        self.assertEqual([r["step"] for r in hist[0]], list(range(len(hist[0]))))
        self.assertTrue(any(r["applied"] == [0, 1] and 2 not in r["dropped"]
                            for r in hist[0]), hist[0][-5:])
        self.assertTrue(any(2 in r["applied"] for r in hist[0]))
