#!/usr/bin/python3
"""PyTorch through psd, end to end: pslaunch runs deploy/examples/torch-mlp.json
(2 psd shards, 2 Python workers running deploy/examples/torch/train.py as the
spec's job.worker_command) in async and in sync mode, and each worker's
final line says test accuracy >= 0.85; pslaunch's job line counts every
worker's examples. Also psd.torch.DistributedOptimizer's own rules: an
excluded parameter stays local, a constant nonzero one is refused by name,
and the pushes of a step follow the spec's optimizer.

Run: /usr/bin/python3 test_torch_psd.py BUILD_DIR (SKIP, exit 77, without
python3-torch or the psd package)."""
import json
import os
import re
import sys
import unittest

import numpy as np

import harness as h

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
EXAMPLE = os.path.join(REPO, "deploy", "examples", "torch-mlp.json")
TRAIN = os.path.join(REPO, "deploy", "examples", "torch", "train.py")
FINAL = re.compile(r"final: worker=(\d+) test_acc=([0-9.]+) steps=(\d+) "
                   r"examples=(\d+)")
psd = torch = None


def setUpModule():
    global psd, torch
    try:
        import torch as t
    except ImportError as e:
        raise unittest.SkipTest("python3-torch is not installed: %s" % e)
    sys.path.insert(0, h.build_path("worker", "python"))
    try:
        import psd as p
        import psd.torch  # noqa: F401
    except ImportError as e:
        raise unittest.SkipTest("the psd Python package is not built: %s" % e)
    psd, torch = p, t


class ExampleTest(h.ProcTest):
    """The example spec, on free ports, as a user runs it."""

    def run_example(self, mode):
        with open(EXAMPLE) as f:
            spec = json.load(f)
        ports = h.free_ports(4)
        spec["cluster"]["ps"] = ["127.0.0.1:%d" % p for p in ports[:2]]
        spec["cluster"]["worker"] = ["127.0.0.1:%d" % p for p in ports[2:]]
        spec["job"]["name"] = "torch-" + mode
        spec["job"]["sync"] = {"mode": mode}
        spec["job"]["worker_command"] = ["/usr/bin/python3", TRAIN]
        path = os.path.join(self.d, "torch.json")
        with open(path, "w") as f:
            json.dump(spec, f)
        env = {"PYTHONPATH": h.build_path("worker", "python")}
        r = h.run([h.build_path("deploy", "pslaunch"), path], timeout=240,
                  env=env)
        out = r.stdout + r.stderr
        self.assertEqual(r.returncode, 0, out[-3000:])
        finals = {int(m.group(1)): m for m in FINAL.finditer(out)}
        self.assertEqual(sorted(finals), [0, 1], out[-3000:])
        epochs, n = spec["job"]["epochs"], 0
        for w, m in finals.items():
            acc = float(m.group(2))
            self.assertGreaterEqual(acc, 0.85, "worker %d: %s" % (w, m.group(0)))
            self.assertEqual(int(m.group(4)), 30000 * epochs)
            n += int(m.group(4))
        job = h.job_line(out)
        self.assertIsNotNone(job, out[-2000:])
        self.assertEqual(int(job["examples"]), n)
        self.assertEqual(job["reported"], "2")
        self.assertRegex(out, r"worker:0 \| worker:0: step \d+ epoch")

    def test_mlp_async(self):
        self.run_example("async")

    def test_mlp_sync(self):
        self.run_example("sync")


class OptimizerTest(h.ProcTest):
    """DistributedOptimizer against two shards of an async spec with SGD."""

    def setUp(self):
        super().setUp()
        self.spec = os.path.join(self.d, "spec.json")
        h.write_spec(self.spec, job={"name": "dopt", "batch_size": 4,
                                     "optimizer": {"type": "sgd", "lr": 0.5}})
        self.procs += [h.start_psd(self.spec, i) for i in range(2)]

    def test_step_applies_the_shards_optimizer(self):
        import psd.torch as pt
        model = torch.nn.Sequential(torch.nn.Linear(3, 2),
                                    torch.nn.LayerNorm(2))
        c = psd.Client(self.spec, "worker:0")
        self.addCleanup(c.close)
        with self.assertRaises(ValueError) as cm:
            pt.DistributedOptimizer(model.named_parameters(), c)
        self.assertIn("1.weight", str(cm.exception))  # LayerNorm's ones
        opt = pt.DistributedOptimizer(model.named_parameters(), c,
                                      exclude=["1.*"])
        self.assertEqual(opt.local, ["1.weight", "1.bias"])
        self.assertEqual(opt.names, ["0.weight", "0.bias"])
        w0 = model[0].weight.detach().clone()
        # The shards' values replaced the module's: uniform within the
        # module's own bound (PyTorch's 1/sqrt(fan_in) for both).
        b0 = model[0].bias.detach().clone()
        self.assertLessEqual(float(w0.abs().max()), 1 / 3 ** 0.5 + 1e-6)
        self.assertLessEqual(float(b0.abs().max()), 1 / 3 ** 0.5 + 1e-6)
        x = torch.ones(4, 3)
        model[0](x).sum().backward()
        gw = torch.ones(2, 3) * 4  # d sum / dW = batch of ones
        opt.step()
        np.testing.assert_allclose(model[0].weight.detach().numpy(),
                                   (w0 - 0.5 * gw).numpy(), rtol=1e-6)
        np.testing.assert_allclose(model[0].bias.detach().numpy(),
                                   (b0 - 0.5 * 4).numpy(), rtol=1e-6)
        self.assertEqual(opt.steps, 1)
        self.assertEqual(opt.early_pushes, 0)  # one small bucket: at step()
        opt.finish()

    def test_buckets_pushed_during_backward(self):
        """bucket_mb=0: every gradient is pushed by the pusher thread as
        backward produces it; the values still follow the formula."""
        import psd.torch as pt
        model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
        c = psd.Client(self.spec, "worker:0")
        self.addCleanup(c.close)
        opt = pt.DistributedOptimizer(model.named_parameters(), c,
                                      bucket_mb=0, prefix="b/")
        before = [p.detach().clone() for p in model.parameters()]
        model(torch.ones(4, 3)).sum().backward()
        grads = [p.grad.detach().clone() for p in model.parameters()]
        opt.step()
        self.assertEqual(opt.early_pushes, 3)  # 4 gradients, the last at step()
        for p, b, g in zip(model.parameters(), before, grads):
            np.testing.assert_allclose(p.detach().numpy(), (b - 0.5 * g).numpy(),
                                       rtol=1e-5, atol=1e-6)
            self.assertIsNone(p.grad)
        opt.finish()


if __name__ == "__main__":
    h.main()
