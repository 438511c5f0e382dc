"""Fault tests of graceful stops (SIGTERM, as `systemctl restart psd@I`
sends): a shard stopped mid-training and started again costs the job only
the outage, in async, SSP and sync jobs, ps:1 and then ps:0 (the
coordinator) in one job. Run by test_faults.py."""
import json
import os
import random
import signal
import unittest

import harness as h
from faults import (ACC_JOB, DATA, LOAD_TABLE, SOAK, Checkpointer, Faults, fields,
                    psctl, result, status, table_totals)
from faults_kill import SYNC_JOB

SSP_JOB = dict(ACC_JOB, name="sspterm", sync={"mode": "async", "staleness": 2})


@unittest.skipUnless(os.path.isdir(DATA), "dataset-fashion-mnist is not installed")
class TermPsdTest(Faults):
    """Each mode's job once without a fault and once with ps:1 stopped
    (SIGTERM) and started again past step 100, then ps:0 (the coordinator)
    past step 250: one faulted job covers both shards."""

    STOPS = ((1, 100), (0, 250))

    def run_job(self, job, stops=()):
        """stops: (shard, step) pairs, in order: the shard is sent SIGTERM
        once both workers are past the step, and started again; () is the
        fault-free run. Returns (accuracy, shards, workers, status)."""
        d = os.path.join(self.d, "term" if stops else "base")
        os.makedirs(d)
        spec = h.spec_in(d, job)
        ps = [self.psd(spec, i) for i in range(2)]
        ws = [self.worker(spec, i) for i in range(2)]
        for stop, step in stops:
            for w in ws:
                w.wait_for("step %d/" % step, timeout=120)
            ps[stop].p.send_signal(signal.SIGTERM)
            self.assertEqual(ps[stop].wait(), 0, ps[stop].output()[-3000:])
            self.assertIn("checkpoint (at exit) at step ", ps[stop].output())
            # Every call was answered before the final checkpoint.
            self.assertNotIn("still unanswered", ps[stop].output())
            ps[stop] = self.psd(spec, stop)
            ps[stop].wait_for("resumed from step ")
        self.finish(ws)
        st = status(spec)
        self.stop_all(ps)
        return float(result(ws[0])["test_accuracy"]), ps, ws, st

    def check(self, job):
        base = self.run_job(job)[0]
        acc, ps, ws, st = self.run_job(job, self.STOPS)
        print("%s: fault-free accuracy %.4f, with ps:1 then ps:0 stopped (SIGTERM) and "
              "started again %.4f" % (job["name"], base, acc))
        self.assertLessEqual(abs(acc - base), 0.01, (acc, base))
        for w in ws:
            # No call failed on it (the bug: "push ... failed: CANCELLED");
            # a CANCELLED that gRPC gives a call racing the shard's final
            # shutdown is retried, and its outage line may name it.
            self.assertNotRegex(w.output(), r"failed: CANCELLED")
        return ps, ws, st

    def test_async_ps1_then_ps0(self):
        self.check(ACC_JOB)

    def test_ssp_ps1_then_ps0(self):
        self.check(SSP_JOB)

    def test_sync_ps1_then_ps0(self):
        self.check(SYNC_JOB)


@unittest.skipUnless(os.path.isdir(DATA), "dataset-fashion-mnist is not installed")
class CutTest(Faults):
    """psctl checkpoint in a sync job: the coordinator names one step and
    every shard writes that step, mid-training; in an async job each shard
    writes its own."""

    def start(self, base, name):
        """A one-epoch job of base's mode, checkpoints on, with both workers
        past step 100: (spec, shards, workers)."""
        d = os.path.join(self.d, name)
        os.makedirs(d)
        spec = h.spec_in(d, dict(base, name=name, epochs=1, checkpoint={"dir": "ck"}))
        ps = [self.psd(spec, i) for i in range(2)]
        ws = [self.worker(spec, i) for i in range(2)]
        for w in ws:
            w.wait_for("step 100/", timeout=120)
        return spec, ps, ws

    def test_sync_cut_is_one_step_on_every_shard(self):
        spec, ps, ws = self.start(SYNC_JOB, "cut")
        steps = []
        for _ in range(3):
            r = psctl(spec, "--json", "checkpoint", "--wait")
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            shards = json.loads(r.stdout)["shards"]
            self.assertTrue(all(s["written"] for s in shards), shards)
            got = {s["step"] for s in shards}
            self.assertEqual(len(got), 1, shards)
            for s in shards:
                self.assertTrue(s["path"].endswith("ckpt-%010d" % s["step"]), s)
                self.assertTrue(os.path.isdir(s["path"]), s)
            steps.append(got.pop())
        self.assertEqual(steps, sorted(steps))
        self.assertIn("checkpoint cut: every shard writes step %d" % steps[0],
                      ps[0].output())
        self.finish(ws)
        self.stop_all(ps)

    def test_async_checkpoint_is_per_shard(self):
        spec, ps, ws = self.start(ACC_JOB, "acut")
        r = psctl(spec, "--json", "checkpoint", "--wait")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        for s in json.loads(r.stdout)["shards"]:
            self.assertTrue(s["written"] and os.path.isdir(s["path"]), s)
        self.finish(ws)
        self.stop_all(ps)


class RestartLoadTest(Faults):
    """Rounds of graceful restarts (SIGTERM, then start again) of a random
    shard while clients push and pull dense variables and rows of a table
    (with admission, eviction and checkpoints between the restarts, psctl
    checkpoint): every push is applied exactly once (pstool load checks every
    dense element, and every hot row at every pull, across the restarts),
    none is given up on. make soak runs more rounds for longer."""

    def test_graceful_restarts_under_load_lose_nothing(self):
        rounds, seconds = (8, 60) if SOAK else (2, 10)
        spec = h.spec_in(self.d, {"name": "rload", "optimizer": {"type": "sgd", "lr": 0.5},
                                 "retry_s": 30, "checkpoint": {"dir": "ck"},
                                 "tables": [LOAD_TABLE]}, nworker=1)
        ps = [self.psd(spec, i) for i in range(2)]
        c = self.proc([h.build_path("tests", "pstool"), "--cluster", spec, "--clients", "8",
                       "--seconds", str(seconds), "--faults", "load"])
        c.wait_for("load started", timeout=120)
        ck = Checkpointer(spec)
        rng = random.Random(13)
        try:
            for r in range(rounds):
                c.wait_for("load t=", new=True, timeout=60)
                i = rng.randrange(2)
                ps[i].p.send_signal(signal.SIGTERM)
                self.assertEqual(ps[i].wait(), 0, ps[i].output()[-3000:])
                ps[i] = self.psd(spec, i)
                ps[i].wait_for("resumed from step ")
            self.assertEqual(c.wait(timeout=seconds + 300), 0, c.output()[-3000:])
        finally:
            ck.stop()
        res = fields(c.lines[-1])
        r = psctl(spec, "checkpoint", "--wait", timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        tab = table_totals(spec)
        print("load with %d graceful restarts: %s dense and %s table pushes, %s calls, "
              "%s failed and %s retried, %s and %s mismatches; %d checkpoints written "
              "(%d refused while a shard restarted), since the last restarts table rows "
              "admitted %d, evicted %d"
              % (rounds, res["pushes"], res["row_pushes"], res["calls"],
                 res["failed_calls"], res["retries"], res["mismatches"],
                 res["row_mismatches"], ck.written, ck.failed, tab["admitted"],
                 tab["evicted"]))
        self.assertEqual((res["mismatches"], res["row_mismatches"]), ("0", "0"), c.lines[-1])
        self.assertGreater(int(res["pushes"]), 8)
        self.assertGreater(int(res["row_pushes"]), 8)
        self.assertGreater(ck.written, 0, ck.errors)
        self.assertGreater(tab["evicted"], 0, tab)
        self.stop_all(ps)
