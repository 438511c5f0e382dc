"""The real job: pslaunch starts 2 psd shards and 2 dworkers on 127.0.0.1,
they train the demo MLP on Fashion-MNIST over gRPC, and worker 0's final line
reports the test accuracy: at least the figure README.md's example table
states (test_examples.stated) for deploy/examples/local.json, local-sync.json
and local-ssp.json, each run as shipped but for its ports (under make asan,
PSD_SANITIZED=1, one epoch, the figure not asserted: those runs look for
memory errors, as test_examples' do). Also dworker's own errors, and a worker started
again on shards that kept an earlier run's state (resuming; a complete sync
job trains nothing). Run:
/usr/bin/python3 test_train.py BUILD_DIR"""
import json
import os
import re
import struct
import unittest

import harness as h
from test_examples import SANITIZED, stated

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
DATA = "/usr/share/datasets/fashion-mnist"


def demo_job(name="local.json", **over):
    """The example's job, with over; one epoch under make asan."""
    with open(os.path.join(ROOT, "deploy", "examples", name)) as f:
        job = json.load(f)["job"]
    if SANITIZED:
        job["epochs"] = 1
    job.update(over)
    return job


def check_figure(name, test, kv):
    """README's figure for example name, but under make asan, whose one
    epoch must only have learned something."""
    if SANITIZED:
        test.assertGreaterEqual(float(kv["test_accuracy"]), 0.75)
    else:
        stated(name).check(test, kv)


class TrainTest(unittest.TestCase):
    def test_demo_job_two_shards_two_workers(self):
        if not os.path.isdir(DATA):
            self.skipTest("dataset-fashion-mnist is not installed")
        with h.TempDir() as d:
            spec = os.path.join(d, "job.json")
            h.write_spec(spec, nps=2, nworker=2, job=demo_job())
            r = h.run([h.build_path("deploy", "pslaunch"), spec], timeout=900)
            out = r.stdout + r.stderr
            self.assertEqual(r.returncode, 0, out[-4000:])
            epochs = demo_job()["epochs"]
            # Both workers made progress lines, prefixed by the launcher.
            for w in (0, 1):
                self.assertRegex(r.stdout, r"worker:%d\s*\| .*epoch \d+/%d step \d+" % (w, epochs))
            # Both shards served and were stopped cleanly.
            for s in (0, 1):
                self.assertRegex(r.stderr, r"ps:%d\s*\| .*ready: listening" % s)
            last = [l for l in r.stdout.splitlines() if "final:" in l]
            self.assertEqual(len(last), 1, r.stdout[-2000:])
            kv = dict(re.findall(r"(\w+)=([\d.]+)", last[0].split("final:", 1)[1]))
            self.assertIn("worker_examples_per_s", kv)
            self.assertIn("wall_s", kv)
            self.assertEqual(kv["epochs"], str(epochs))
            # Each worker trained on its half: 30000 examples an epoch.
            self.assertEqual(kv["examples"], str(epochs * 30000))
            # The job's rate, measured by ps:0: all 60000 examples an epoch.
            job = h.assert_job_accounting(self, r.stdout, epochs, 2)
            acc = float(kv["test_accuracy"])
            print("\ntest_accuracy=%.4f job examples_per_s=%s wall_s=%s "
                  "(worker:0 alone %s/s)" % (acc, job["examples_per_s"],
                                            job["wall_s"], kv["worker_examples_per_s"]))
            check_figure("local.json", self, kv)  # README's figure
            # worker 0's final line is its last line of output.
            w0 = [l for l in r.stdout.splitlines() if l.startswith("worker:0")]
            self.assertIn("final:", w0[-1])


    def run_example(self, name):
        with h.TempDir() as d:
            spec = os.path.join(d, "job.json")
            h.write_spec(spec, nps=2, nworker=2, job=demo_job(name))
            r = h.run([h.build_path("deploy", "pslaunch"), spec], timeout=900)
            self.assertEqual(r.returncode, 0, (r.stdout + r.stderr)[-4000:])
            last = [l for l in r.stdout.splitlines() if "final:" in l]
            self.assertEqual(len(last), 1, r.stdout[-2000:])
            kv = dict(re.findall(r"(\w+)=([\d.]+)", last[0].split("final:", 1)[1]))
            job = h.assert_job_accounting(self, r.stdout, demo_job(name)["epochs"], 2)
            print("\n%s: test_accuracy=%s job examples_per_s=%s wall_s=%s"
                  % (name, kv["test_accuracy"], job["examples_per_s"], job["wall_s"]))
            check_figure(name, self, kv)  # README's figure

    def test_demo_spec_in_sync_mode(self):
        if not os.path.isdir(DATA):
            self.skipTest("dataset-fashion-mnist is not installed")
        self.run_example("local-sync.json")

    def test_demo_job_with_bf16_wire_reaches_085(self):
        """job.wire_dtype "bf16": pulls and pushes travel as bfloat16, the
        shards keep f32; the demo still learns (docs/performance.md has
        the measured trade-off)."""
        if not os.path.isdir(DATA):
            self.skipTest("dataset-fashion-mnist is not installed")
        with h.TempDir() as d:
            spec = os.path.join(d, "job.json")
            h.write_spec(spec, nps=2, nworker=2, job=demo_job(wire_dtype="bf16"))
            r = h.run([h.build_path("deploy", "pslaunch"), spec], timeout=900)
            self.assertEqual(r.returncode, 0, (r.stdout + r.stderr)[-4000:])
            last = [l for l in r.stdout.splitlines() if "final:" in l]
            kv = dict(re.findall(r"(\w+)=([\d.]+)", last[0].split("final:", 1)[1]))
            job = h.assert_job_accounting(self, r.stdout, demo_job()["epochs"], 2)
            print("\nbf16 wire: test_accuracy=%s job examples_per_s=%s"
                  % (kv["test_accuracy"], job["examples_per_s"]))
            self.assertGreaterEqual(float(kv["test_accuracy"]), 0.75 if SANITIZED else 0.85)

    def test_demo_spec_with_staleness_bound(self):
        if not os.path.isdir(DATA):
            self.skipTest("dataset-fashion-mnist is not installed")
        self.run_example("local-ssp.json")


class WorkerErrorTest(unittest.TestCase):
    def test_spec_mistake_exits_2_with_path(self):
        with h.TempDir() as d:
            spec = os.path.join(d, "bad.json")
            with open(spec, "w") as f:
                json.dump({"cluster": {"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]},
                           "job": {"epochs": "3"}}, f)
            r = h.run([h.build_path("worker", "dworker"), "--cluster", spec, "--task",
                       "worker:0"], timeout=60)
            self.assertEqual(r.returncode, 2)
            self.assertIn("job.epochs", r.stderr)
            r = h.run([h.build_path("worker", "dworker"), "--cluster", spec, "--task",
                       "worker:3"], timeout=60)
            self.assertEqual(r.returncode, 2)

    def test_missing_data_is_a_clear_error(self):
        with h.TempDir() as d:
            spec = os.path.join(d, "job.json")
            h.write_spec(spec, nps=1, nworker=1, job={"data_dir": os.path.join(d, "nothing")})
            r = h.run([h.build_path("worker", "dworker"), "--cluster", spec, "--task",
                       "worker:0"], timeout=60)
            self.assertEqual(r.returncode, 1)
            self.assertIn(os.path.join(d, "nothing"), r.stderr)

    def test_unreachable_shard_fails_within_the_deadline(self):
        if not os.path.isdir(DATA):
            self.skipTest("dataset-fashion-mnist is not installed")
        with h.TempDir() as d:
            spec = os.path.join(d, "job.json")
            # Nobody listens on the shard's port; declare waits 3 s, then fails.
            h.write_spec(spec, nps=1, nworker=1, job={"rpc_timeout_ms": 3000})
            r = h.run([h.build_path("worker", "dworker"), "--cluster", spec, "--task",
                       "worker:0", "--connect-timeout-ms", "3000"], timeout=120)
            self.assertEqual(r.returncode, 1)
            self.assertIn("ps:0", r.stderr)


@unittest.skipUnless(os.path.isdir(DATA), "dataset-fashion-mnist is not installed")
class ResumeTest(unittest.TestCase):
    """A worker started again on shards that kept an earlier run's state
    says where the job is; a complete sync job trains nothing and exits 0."""

    def job(self, d, **job):
        spec = os.path.join(d, "job.json")
        h.write_spec(spec, nps=1, nworker=1,
                     job=dict({"name": "resume", "epochs": 1, "batch_size": 32,
                               "log_every": 100, "heartbeat_ms": 100}, **job))
        return spec, h.start_psd(spec, 0)

    def worker(self, spec, *extra):
        r = h.run([h.build_path("worker", "dworker"), "--cluster", spec, "--task",
                   "worker:0"] + list(extra), timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        final = [l for l in r.stdout.splitlines() if l.startswith("final:")]
        self.assertEqual(len(final), 1, r.stdout)
        return r.stderr, dict(re.findall(r"(\w+)=([\d.]+)", final[0]))

    def step(self, spec):
        r = h.run([h.build_path("ps-server", "psctl"), "--cluster", spec, "--json", "status"])
        self.assertEqual(r.returncode, 0, r.stderr)
        return json.loads(r.stdout)["shards"][0]["step"]

    def test_sync_resumes_then_says_the_job_is_complete(self):
        with h.TempDir() as d:
            spec, ps = self.job(d, max_steps=6, sync={"mode": "sync"})
            try:
                log, res = self.worker(spec, "--max-steps", "4")
                self.assertNotIn("resuming", log)
                self.assertEqual((res["steps"], self.step(spec)), ("4", 4))
                # Again, the spec's length: the 2 steps left of its 6.
                log, res = self.worker(spec)
                self.assertIn("resuming from step 4 of 6: 2 to go, from batch 4 of this "
                              "worker's share", log)
                self.assertEqual((res["steps"], self.step(spec)), ("2", 6))
                acc = res["test_accuracy"]
                # Complete: said, nothing trained, exit 0; worker 0 still
                # evaluates the job's parameters (the same ones).
                log, res = self.worker(spec)
                self.assertIn("the job is already complete: it is at step 6, and "
                              "job.max_steps makes it 6 steps long; nothing to train (raise "
                              "job.max_steps, or pass --max-steps N to train N more)", log)
                self.assertEqual((res["steps"], self.step(spec)), ("0", 6))
                self.assertEqual(res["test_accuracy"], acc)
                # --max-steps N: N more, from where the job is.
                log, res = self.worker(spec, "--max-steps", "2")
                self.assertIn("resuming from step 6: this run takes 2 steps (--max-steps), "
                              "to step 8", log)
                self.assertEqual((res["steps"], self.step(spec)), ("2", 8))
            finally:
                self.assertEqual(ps.stop(), 0)

    def test_async_says_how_far_the_job_has_come(self):
        with h.TempDir() as d:
            spec, ps = self.job(d, max_steps=5)
            try:
                log, res = self.worker(spec)
                self.assertNotIn("resuming", log)
                log, res = self.worker(spec)
                self.assertIn("resuming: the variables on ps:0 have taken 5 pushes already "
                              "(an earlier run, or the checkpoint the shards resumed from); "
                              "this run trains on from those values", log)
                self.assertEqual(res["steps"], "5")
            finally:
                self.assertEqual(ps.stop(), 0)


class DeviceTest(unittest.TestCase):
    """--device and --replicas of dworker, as far as this machine allows:
    without a GPU, cuda is an error naming the CUDA failure and auto falls
    back to the CPU; replicas give the single replica's training."""

    def no_gpu_reason(self):
        """The reason test-kernels-cuda gives for skipping, or None when a
        GPU works here."""
        r = h.run([h.build_path("tests", "test-kernels-cuda")], timeout=300)
        if r.returncode != 77:
            return None
        m = re.search(r"SKIP: (.*)", r.stdout)
        self.assertIsNotNone(m, r.stdout)
        return m.group(1)

    def standalone(self, d, *args, job=None, timeout=300):
        spec = os.path.join(d, "job.json")
        h.write_spec(spec, nps=1, nworker=1,
                     job=job or {"model": "mlp", "hidden": [32], "log_every": 1000})
        return h.run([h.build_path("worker", "dworker"), "--cluster", spec,
                      "--standalone"] + list(args), timeout=timeout)

    def test_cuda_without_gpu_is_an_error_naming_the_cause(self):
        why = self.no_gpu_reason()
        if why is None:
            self.skipTest("a GPU works here")
        with h.TempDir() as d:
            for dev in ("cuda", "cuda:1"):
                r = self.standalone(d, "--device", dev, "--max-steps", "1")
                self.assertEqual(r.returncode, 1, r.stderr)
                self.assertIn("dworker: --device %s: %s" % (dev, why), r.stderr)
                self.assertNotIn("final:", r.stdout)

    def test_auto_without_gpu_uses_the_cpu(self):
        why = self.no_gpu_reason()
        if why is None:
            self.skipTest("a GPU works here")
        with h.TempDir() as d:
            r = self.standalone(d, "--device", "auto", "--max-steps", "2")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("--device auto: no usable GPU (%s); using the CPU" % why, r.stderr)
            self.assertIn("final:", r.stdout)

    def test_bad_device_and_replicas_are_usage_errors(self):
        with h.TempDir() as d:
            for args, msg in ((["--device", "tpu"], "--device tpu: expected cpu, cuda, cuda:N or auto"),
                              (["--device", "cuda:x"], "--device cuda:x: expected"),
                              (["--replicas", "0"], "--replicas 0: expected an integer in 1..64")):
                r = self.standalone(d, *args)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn(msg, r.stderr)

    def test_two_replicas_train_like_one(self):
        if not os.path.isdir(DATA):
            self.skipTest("dataset-fashion-mnist is not installed")
        with h.TempDir() as d:
            params = []
            for reps in (1, 2):
                out = os.path.join(d, "p%d.bin" % reps)
                r = self.standalone(d, "--replicas", str(reps), "--max-steps", "20",
                                    "--save-params", out)
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertIn("%d replica" % reps, r.stderr)
                with open(out, "rb") as f:
                    params.append(struct.unpack("<%df" % (os.path.getsize(out) // 4), f.read()))
            self.assertEqual(len(params[0]), 784 * 32 + 32 + 32 * 10 + 10)
            # 20 momentum steps from the same start on the same batches: the
            # gradients differ only in float summation order.
            worst = max(abs(a - b) for a, b in zip(*params))
            moved = max(abs(a) for a in params[0][-10:])
            print("\nreplicas 1 vs 2: largest parameter difference %.3g" % worst)
            self.assertLess(worst, 1e-4)
            self.assertGreater(moved, 0.0)  # the biases trained at all


if __name__ == "__main__":
    h.main()
