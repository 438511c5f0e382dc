#!/usr/bin/python3
"""PyTorch through psd, end to end: pslaunch runs deploy/examples/torch-mlp.json
(2 psd shards, 2 Python workers running deploy/examples/torch/train.py as the
spec's job.worker_command) in sync mode (integration-examples runs it as
shipped, async, from the installed tree), and each worker's final line meets
README.md's figure for the example (under make asan one epoch, which need
only learn); pslaunch's job line counts every
worker's examples. Also psd.torch.DistributedOptimizer's own rules: every
worker and the shards start from the first worker's values (a LayerNorm's
ones and a split weight included); an excluded parameter stays local; the
pushes of a step follow the spec's optimizer, or a torch optimizer's (SGD,
momentum, nesterov, Adam, AdamW, Adagrad, param groups: the values match
torch's own after three steps); what the shards cannot apply is refused by
name, and so are a Module and param groups; Horovod's argument order and
parameters() work; two backward passes are summed with
backward_passes_per_step=2 and refused without; step() after finish()
raises.

Run: /usr/bin/python3 test_torch_psd.py BUILD_DIR (SKIP, exit 77, without
python3-torch or the psd package)."""
import copy
import json
import os
import re
import sys
import unittest
from unittest import mock

import numpy as np

import harness as h
from test_examples import SANITIZED, stated

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
        if SANITIZED:  # memory errors, not the figure: one epoch
            spec["job"]["epochs"] = 1
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
            if SANITIZED:
                self.assertGreaterEqual(float(m.group(2)), 0.70, "worker:%d" % w)
            else:
                stated("torch-mlp.json").check(self, {"test_acc": m.group(2)},
                                               "worker:%d" % w)
            self.assertEqual(int(m.group(4)), 30000 * epochs)
            n += int(m.group(4))
        job = h.job_line(out)
        self.assertIsNotNone(job, out[-2000:])
        self.assertEqual(int(job["examples"]), n)
        self.assertEqual(job["reported"], "2")
        self.assertRegex(out, r"worker:0 \| worker:0: step \d+ epoch")

    def test_mlp_sync(self):
        self.run_example("sync")


class ShardTest(h.ProcTest):
    """DistributedOptimizer against two shards of an async spec with SGD
    lr 0.5 as job.optimizer."""

    def setUp(self):
        super().setUp()
        self.spec = os.path.join(self.d, "spec.json")
        h.write_spec(self.spec, job={"name": "dopt", "batch_size": 4,
                                     "optimizer": {"type": "sgd", "lr": 0.5}})
        self.procs += [h.start_psd(self.spec, i) for i in range(2)]

    def client(self, task=None):
        c = psd.Client(self.spec, task)
        self.addCleanup(c.close)
        return c


class OptimizerTest(ShardTest):
    def test_step_applies_the_shards_optimizer(self):
        import psd.torch as pt
        model = torch.nn.Sequential(torch.nn.Linear(3, 2),
                                    torch.nn.LayerNorm(2))
        c = self.client()
        opt = pt.DistributedOptimizer(model.named_parameters(), c,
                                      exclude=["1.*"])
        self.assertEqual(opt.local, ["1.weight", "1.bias"])
        self.assertEqual(opt.names, ["0.weight", "0.bias"])
        w0 = model[0].weight.detach().clone()
        b0 = model[0].bias.detach().clone()
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

    def test_clip_norm_is_said_not_ignored(self):
        """The spec's clip_norm is dworker's; here it is warned of."""
        import psd.torch as pt
        spec = os.path.join(self.d, "clip.json")
        h.write_spec(spec, job={"name": "clip", "optimizer": {
            "type": "sgd", "lr": 0.5, "clip_norm": 1.5}})
        self.procs += [h.start_psd(spec, i) for i in range(2)]
        c = psd.Client(spec)
        self.addCleanup(c.close)
        model = torch.nn.Linear(3, 2)
        with self.assertWarnsRegex(UserWarning, "clip_norm 1.5.*unclipped"):
            opt = pt.DistributedOptimizer(model.named_parameters(), c)
        opt.finish()

    def test_a_scalar_parameter(self):
        """A 0-d parameter is a variable of one element: declared with its
        value, trained, pulled back into the 0-d tensor."""
        import psd.torch as pt
        p = torch.nn.Parameter(torch.tensor(3.0))
        opt = pt.DistributedOptimizer([("s", p)], self.client())
        self.assertEqual(float(p), 3.0)
        (p * 2).backward()
        opt.step()
        # The step's push and its pull of the new value travel together
        # (push_pull_sets), and its pull may or may not see the push
        # (python.md); the next step's pull does.
        self.assertIn(float(p), (3.0, 3.0 - 0.5 * 2))
        opt.step()
        self.assertEqual(float(p), 3.0 - 0.5 * 2)
        opt.finish()

    def test_buckets_pushed_during_backward(self):
        """bucket_mb=0: every gradient is pushed by the pusher thread as
        backward produces it; the values still follow the formula."""
        import psd.torch as pt
        model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
        c = self.client()
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


class TorchOptimizerTest(ShardTest):
    """A torch optimizer's type and hyper-parameters become the shards'
    optimizer: the values after three steps through psd are those torch's
    own optimizer reaches from the same values with the same gradients."""

    def against_torch(self, make, prefix, horovod=True):
        import psd.torch as pt
        torch.manual_seed(3)
        model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(),
                                    torch.nn.Linear(4, 2))
        c = self.client()
        if horovod:  # Horovod's order: the optimizer first
            opt = pt.DistributedOptimizer(
                make(model), named_parameters=model.named_parameters(),
                client=c, prefix=prefix)
        else:
            opt = pt.DistributedOptimizer(model.named_parameters(), c,
                                          optimizer=make(model), prefix=prefix)
        ref = copy.deepcopy(model)
        ropt = make(ref)
        for _ in range(3):
            x = torch.randn(4, 3)
            model(x).square().sum().backward()
            opt.step()
            ropt.zero_grad()
            ref(x).square().sum().backward()
            ropt.step()
        for (n, p), r in zip(model.named_parameters(), ref.parameters()):
            np.testing.assert_allclose(p.detach().numpy(), r.detach().numpy(),
                                       rtol=2e-5, atol=1e-6, err_msg=n)
        opt.finish()

    def test_sgd_momentum_nesterov_adam_adamw_adagrad(self):
        optim = torch.optim
        cases = {
            "sgd": lambda m: optim.SGD(m.parameters(), lr=0.1,
                                       weight_decay=0.01),
            "momentum": lambda m: optim.SGD(m.parameters(), lr=0.05,
                                            momentum=0.8),
            "nesterov": lambda m: optim.SGD(m.parameters(), lr=0.05,
                                            momentum=0.9, nesterov=True),
            "adam": lambda m: optim.Adam(m.parameters(), lr=0.01,
                                         betas=(0.8, 0.99), eps=1e-6,
                                         weight_decay=0.001),
            "adamw": lambda m: optim.AdamW(m.parameters(), lr=0.01),
            "adagrad": lambda m: optim.Adagrad(m.parameters(), lr=0.1),
        }
        for name, make in cases.items():
            with self.subTest(name):
                self.against_torch(make, name + "/")
        self.against_torch(cases["adam"], "kw/", horovod=False)

    def test_param_groups_keep_their_own_lr(self):
        def make(m):
            return torch.optim.SGD([
                {"params": m[0].parameters(), "lr": 0.01},
                {"params": m[2].parameters()}], lr=0.2, momentum=0.5)
        self.against_torch(make, "groups/")

    def test_parameters_named_by_index(self):
        import psd.torch as pt
        model = torch.nn.Linear(3, 2)
        # None in the client's place: psd.Client() from an environment
        # that names no spec.
        env = {k: v for k, v in os.environ.items()
               if k not in ("PSD_SPEC", "TF_CONFIG")}
        with mock.patch.dict(os.environ, env, clear=True), \
                self.assertRaisesRegex(ValueError, "PSD_SPEC"):
            pt.DistributedOptimizer(model.parameters(), None)
        opt = pt.DistributedOptimizer(model.parameters(), self.client())
        self.assertEqual(opt.names, ["param.0", "param.1"])
        w0 = model.weight.detach().clone()
        model(torch.ones(4, 3)).sum().backward()
        opt.step()
        np.testing.assert_allclose(model.weight.detach().numpy(),
                                   (w0 - 0.5 * 4).numpy(), rtol=1e-6)
        opt.finish()
        # Horovod's DistributedOptimizer(optimizer) alone, and an optimizer
        # over part of the model: the rest is kept local.
        m2 = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 2))
        o2 = pt.DistributedOptimizer(torch.optim.SGD(m2[1].parameters(), lr=1),
                                     client=self.client(), prefix="h/")
        self.assertEqual(o2.names, ["param.0", "param.1"])
        o3 = pt.DistributedOptimizer(torch.optim.SGD(m2[1].parameters(), lr=1),
                                     named_parameters=m2.named_parameters(),
                                     client=self.client(), prefix="p/")
        self.assertEqual(o3.names, ["1.weight", "1.bias"])
        self.assertEqual(o3.local, ["0.weight", "0.bias"])

    def test_what_the_shards_cannot_apply_is_refused_by_name(self):
        import psd.torch as pt
        model = torch.nn.Linear(3, 2)
        c = self.client()
        ps = model.parameters
        refused = {
            "amsgrad": torch.optim.Adam(ps(), amsgrad=True),
            "dampening": torch.optim.SGD(ps(), lr=0.1, momentum=0.9,
                                         dampening=0.5),
            "maximize": torch.optim.SGD(ps(), lr=0.1, maximize=True),
            "lr_decay": torch.optim.Adagrad(ps(), lr_decay=0.01),
            "initial_accumulator_value": torch.optim.Adagrad(
                ps(), initial_accumulator_value=0.1),
            "RMSprop": torch.optim.RMSprop(ps()),
        }
        for word, topt in refused.items():
            with self.subTest(word):
                with self.assertRaises(ValueError) as cm:
                    pt.DistributedOptimizer(topt, named_parameters=
                                            model.named_parameters(), client=c)
                self.assertIn(word, str(cm.exception))
        with self.assertRaisesRegex(TypeError, r"named_parameters\(\)"):
            pt.DistributedOptimizer(model, c)
        with self.assertRaisesRegex(TypeError, "param groups"):
            pt.DistributedOptimizer([{"params": list(ps())}], c)
        with self.assertRaisesRegex(TypeError, "optimizer"):
            pt.DistributedOptimizer(model.named_parameters(), c, optimizer=3)
        with self.assertRaisesRegex(TypeError, "optimizer given twice"):
            pt.DistributedOptimizer(torch.optim.SGD(ps(), lr=1), c,
                                    optimizer={"type": "sgd"})

    def test_an_lr_scheduler_is_refused_in_step(self):
        import psd.torch as pt
        model = torch.nn.Linear(3, 2)
        topt = torch.optim.SGD(model.parameters(), lr=0.1)
        sched = torch.optim.lr_scheduler.StepLR(topt, step_size=1, gamma=0.5)
        topt.step()  # torch warns of a scheduler stepped before it
        opt = pt.DistributedOptimizer(topt, model.named_parameters(),
                                      self.client(), prefix="sched/")
        model(torch.ones(1, 3)).sum().backward()
        opt.step()
        sched.step()
        model(torch.ones(1, 3)).sum().backward()
        with self.assertRaisesRegex(RuntimeError, "from 0.1 to 0.05"):
            opt.step()


class ValuesTest(ShardTest):
    """The shards start from the first worker's values (Horovod's broadcast
    of rank 0's): a model with known weights, a second worker's model with
    other weights; both end up with the first one's, and so do the shards
    (a third client pulls them). A LayerNorm's weight of ones, which the
    shards' initializers cannot express, is among them, and so is a weight
    of 360 KB that is split across both shards."""

    def known_model(self, seed):
        torch.manual_seed(seed)
        m = torch.nn.Sequential(torch.nn.Linear(300, 300),
                                torch.nn.LayerNorm(300),
                                torch.nn.Linear(300, 3))
        with torch.no_grad():
            m[2].weight.copy_(torch.arange(900.0).reshape(3, 300) / 1000)
            m[2].bias.copy_(torch.tensor([0.5, -2.0, 7.0]))
        return m

    def test_every_worker_and_shard_holds_the_first_workers_values(self):
        import psd.torch as pt
        m0 = self.known_model(7)
        m1 = self.known_model(8)  # other random values
        with torch.no_grad():
            m1[1].weight.fill_(2.0)
            m1[2].bias.zero_()
        known = {n: p.detach().clone() for n, p in m0.named_parameters()}
        self.assertFalse(torch.equal(known["0.weight"], m1[0].weight))
        o0 = pt.DistributedOptimizer(m0.named_parameters(),
                                     self.client("worker:0"))
        o1 = pt.DistributedOptimizer(m1.named_parameters(),
                                     self.client("worker:1"))
        for who, m in (("worker 0", m0), ("worker 1", m1)):
            for n, p in m.named_parameters():
                np.testing.assert_array_equal(
                    p.detach().numpy(), known[n].numpy(),
                    err_msg="%s: %s" % (who, n))
        third = self.client()
        for n, p in known.items():
            h = third.declare(n, tuple(p.shape))
            np.testing.assert_array_equal(third.pull(h), p.numpy(),
                                          err_msg="the shards: " + n)
        # Training goes on from them: worker 0's step (sgd, lr 0.5, a
        # batch of 2) reaches worker 1 at its next pull.
        m0(torch.ones(2, 300)).sum().backward()
        o0.step()
        o1.step()  # pushes nothing, pulls
        np.testing.assert_array_equal(m1[2].bias.detach().numpy(),
                                      (known["2.bias"] - 1.0).numpy())
        o0.finish()
        o1.finish()


class PassesTest(ShardTest):
    """Two backward passes before step(): summed with
    backward_passes_per_step=2, refused without; step() after finish()."""

    def test_two_backward_passes_are_summed_or_refused(self):
        import psd.torch as pt
        model = torch.nn.Linear(3, 2)
        opt = pt.DistributedOptimizer(model.named_parameters(), self.client(),
                                      backward_passes_per_step=2)
        w0 = model.weight.detach().clone()
        x = torch.ones(4, 3)
        g = torch.ones(2, 3) * 4
        model(x).sum().backward()
        model(x).sum().backward()
        opt.step()
        np.testing.assert_allclose(model.weight.detach().numpy(),
                                   (w0 - 2 * 0.5 * g).numpy(), rtol=1e-6)
        # One pass of two, then step(): the one gradient is pushed.
        model(x).sum().backward()
        opt.step()
        np.testing.assert_allclose(model.weight.detach().numpy(),
                                   (w0 - 3 * 0.5 * g).numpy(), rtol=1e-6)
        with self.assertRaisesRegex(RuntimeError, "backward_passes_per_step=2"):
            for _ in range(3):
                model(x).sum().backward()
        opt.finish()

        m1 = torch.nn.Linear(3, 2)
        o1 = pt.DistributedOptimizer(m1.named_parameters(), self.client(),
                                     prefix="one/")
        w1 = m1.weight.detach().clone()
        m1(x).sum().backward()
        with self.assertRaisesRegex(RuntimeError, "backward_passes_per_step"):
            m1(x).sum().backward()
        o1.step()  # the first pass's gradient, once
        np.testing.assert_allclose(m1.weight.detach().numpy(),
                                   (w1 - 0.5 * g).numpy(), rtol=1e-6)
        o1.finish()

    def test_step_after_finish_raises(self):
        import psd.torch as pt
        model = torch.nn.Linear(3, 2)
        opt = pt.DistributedOptimizer(model.named_parameters(), self.client())
        opt.finish()
        model(torch.ones(1, 3)).sum().backward()
        with self.assertRaisesRegex(RuntimeError, "after finish"):
            opt.step()


if __name__ == "__main__":
    h.main()
