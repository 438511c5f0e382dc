"""pslaunch with the real psd and dworker (test_launch.py checks the launcher
alone, with fakes), on short jobs of the MLP model (its first layer is split
across both shards, so every push reaches both and each shard's step counts
them all; the softmax model's two small variables may both hash to one):

- pslaunch killed with SIGKILL: its shards still get SIGTERM (the parent-death
  signal each child asked for), write their final checkpoint, remove their
  Unix sockets and exit 0;
- a launcher that runs only part of a spec (ps:0, ps:1 and worker:0 of a spec
  whose worker:1 lives on another host) keeps its shards up once worker:0 has
  finished, says what it waits for, serves worker:1 when the test starts it,
  and stops the shards once worker:1 has finished;
- nor does it wait for a worker that died: once the coordinator has declared
  it dead, the shards stop.

Run: /usr/bin/python3 test_launch_real.py BUILD_DIR"""
import json
import os
import re
import signal

import harness as h

DATA = "/usr/share/datasets/fashion-mnist"
TIMEOUT = 60  # seconds for any one wait


class PartialLaunchTest(h.ProcTest):

    def setUp(self):
        if not os.path.isdir(DATA):
            self.skipTest("dataset-fashion-mnist is not installed")
        super().setUp()
        self.job = "launch-real-%d" % os.getpid()
        self.ckpt = os.path.join(self.d, "ck")
        self.spec = os.path.join(self.d, "spec.json")

    def launch(self, **job):
        """Writes the spec (job's keys added) and starts pslaunch on it: ps:0,
        ps:1 and worker:0 (20 steps). Returns it once it waits for worker:1,
        with the shards' PIDs."""
        ports = h.free_ports(3)
        self.ps = ["127.0.0.1:%d" % p for p in ports[:2]]
        spec = {"name": self.job, "model": "mlp", "data_dir": DATA,
                "epochs": 1, "batch_size": 64, "seed": 1,
                "sync": {"mode": "async"}, "log_every": 10,
                "checkpoint": {"dir": self.ckpt}}
        spec.update(job)
        with open(self.spec, "w") as f:
            json.dump({"cluster": {
                "ps": self.ps,
                # worker:1 is another host's: pslaunch does not start it.
                "worker": ["127.0.0.1:%d" % ports[2],
                           "%s:7200" % h.foreign_host()]}, "job": spec}, f)
        run = h.Proc([h.build_path("deploy", "pslaunch"), self.spec, "--",
                      "--max-steps", "20"])
        self.procs.append(run)
        run.wait_for("pslaunch: waiting for worker:1 (not joined yet) to "
                     "finish; Ctrl-C stops the shards now", timeout=TIMEOUT)
        pids = {}
        for s in (0, 1):
            line = run.wait_for("pslaunch: started ps:%d (pid " % s)
            pids[s] = int(re.search(r"\(pid (\d+)\)", line).group(1))
        return run, pids

    def manifest(self, shard, step):
        path = os.path.join(self.ckpt, self.job, "ps-%d" % shard,
                            "ckpt-%010d" % step, "manifest.json")
        self.assertTrue(os.path.exists(path), "no checkpoint %s" % path)
        with open(path) as f:
            return json.load(f)

    def test_sigkill_of_pslaunch_stops_the_shards_cleanly(self):
        h.set_subreaper(True)
        self.addCleanup(h.set_subreaper, False)
        run, pids = self.launch()
        # Each shard serves its Unix socket; the line says where.
        socks = {}
        for s in (0, 1):
            line = run.wait_for("ready: listening on %s and unix:"
                                % self.ps[s])
            socks[s] = re.search(r" and unix:(\S+?),", line).group(1)
            self.assertTrue(os.path.exists(socks[s]), socks[s])
        run.p.kill()
        self.assertEqual(run.wait(TIMEOUT), -signal.SIGKILL)
        # The shards were pslaunch's children: now this test's, which reaps
        # them. Each was sent SIGTERM when pslaunch died, and stopped cleanly.
        for s, pid in pids.items():
            status = h.wait_pid(pid, TIMEOUT)
            if status is None:
                os.kill(pid, signal.SIGKILL)
                h.wait_pid(pid, TIMEOUT)
                self.fail("ps:%d (pid %d) still ran %d s after pslaunch was "
                          "killed\n%s" % (s, pid, TIMEOUT, run.output()))
            if os.WIFSIGNALED(status):
                self.fail("ps:%d ended by %s" % (
                    s, signal.Signals(os.WTERMSIG(status)).name))
            self.assertEqual(os.WEXITSTATUS(status), 0, "ps:%d" % s)
            # Its final checkpoint holds worker:0's 20 pushes.
            m = self.manifest(s, 20)
            self.assertEqual((m["step"], m["shard"], m["job"]),
                             (20, s, self.job))
            self.assertFalse(os.path.exists(socks[s]),
                             "%s left behind" % socks[s])

    def test_partial_launcher_waits_for_the_worker_run_elsewhere(self):
        run, _ = self.launch()
        run.wait_for("pslaunch: all 1 local workers finished; the ps tasks "
                     "keep serving the cluster's 1 other worker")
        self.assertRegex(run.output(), r"worker:0 \| final: test_accuracy=")
        self.assertIsNone(run.p.poll(), "pslaunch stopped the shards early\n"
                          + run.output())
        # worker:1, "on another host", trains on the shards pslaunch keeps up.
        w1 = h.run([h.build_path("worker", "dworker"), "--cluster", self.spec,
                    "--task", "worker:1", "--max-steps", "30",
                    "--inject-delay-ms", "100"], timeout=TIMEOUT)
        self.assertEqual(w1.returncode, 0, w1.stdout + w1.stderr)
        self.assertIn("done: steps=30 ", w1.stdout)
        self.assertEqual(run.wait(TIMEOUT), 0, run.output())
        out = run.output()
        for line in ("pslaunch: waiting for worker:1 (training) to finish; "
                     "Ctrl-C stops the shards now",
                     "pslaunch: worker:1 finished (it left the job)",
                     "pslaunch: every worker of the cluster has finished or "
                     "is gone; stopping the ps tasks",
                     "pslaunch: all 1 local workers finished, and every "
                     "other worker of the cluster finished or is gone"):
            self.assertIn(line, run.lines, out)
        # The job's rate covers both workers, the one run elsewhere too:
        # (20 + 30) steps of 64 examples.
        job = h.job_line(out)
        self.assertIsNotNone(job, out)
        self.assertEqual((job["workers"], job["reported"], job["examples"]),
                         ("2", "2", str(50 * 64)), out)
        for s in (0, 1):
            self.assertRegex(out, r"ps:%d +pid \d+ .* exit 0, after SIGTERM"
                             % s)
            # Stopped after worker:1's 30 pushes, not before.
            self.assertEqual(self.manifest(s, 50)["step"], 50)

    def test_a_worker_that_died_is_not_waited_for(self):
        run, _ = self.launch(heartbeat_ms=100, dead_after_ms=1000)
        # worker:1 trains for a minute, unless killed.
        w1 = h.Proc([h.build_path("worker", "dworker"), "--cluster",
                     self.spec, "--task", "worker:1", "--inject-delay-ms",
                     "100"])
        self.procs.append(w1)
        run.wait_for("pslaunch: waiting for worker:1 (training) to finish; "
                     "Ctrl-C stops the shards now", timeout=TIMEOUT)
        self.assertEqual(w1.stop(signal.SIGKILL), -signal.SIGKILL)
        line = run.wait_for("pslaunch: worker:1 was declared dead by ps:0",
                            timeout=TIMEOUT)
        self.assertIn("job.dead_after_ms 1000) and has not come back; not "
                      "waiting for it", line)
        self.assertEqual(run.wait(TIMEOUT), 0, run.output())
        self.assertIn("pslaunch: every worker of the cluster has finished or "
                      "is gone; stopping the ps tasks", run.lines)


if __name__ == "__main__":
    h.main()
