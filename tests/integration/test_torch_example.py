"""deploy/examples/torch/fmnist.py, the PyTorch side of psd's Python client:
Fashion-MNIST loaded as dworker loads it, the demo MLP and CNN, a worker's
shuffled share of the batches, the test accuracy; and 300 steps of the MLP
in one process (batch 64, SGD momentum 0.02 / 0.9 as
deploy/examples/local.json) must reach a test accuracy above 0.7 (0.81
measured here); and torch-cnn.json's optimizer must not kill the CNN at
the start of an async job (AsyncStartTest). About 15 s on 2 cores. Exits 77 (SKIP) with the reason when
PyTorch or numpy is missing; the cases that need the data set skip without
it. Run: /usr/bin/python3 test_torch_example.py BUILD_DIR"""
import copy
import gzip
import json
import math
import os
import struct
import sys
import unittest

import harness as h

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
DATA = "/usr/share/datasets/fashion-mnist"

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:
    print("SKIP: PyTorch or numpy is not installed (python3-torch, python3-numpy): %s" % e)
    sys.exit(h.EXIT_SKIP)

sys.path.insert(0, os.path.join(ROOT, "deploy", "examples", "torch"))
import fmnist  # noqa: E402

torch.set_num_threads(1)


def need_data(test):
    if not os.path.isdir(DATA):
        test.skipTest("dataset-fashion-mnist is not installed")


class LoadTest(unittest.TestCase):
    def test_train_and_test_splits_as_dworker_reads_them(self):
        need_data(self)
        for split, n in (("train", 60000), ("test", 10000)):
            x, y = fmnist.load(DATA, split)
            self.assertEqual(x.shape, (n, 784))
            self.assertEqual(x.dtype, np.float32)
            self.assertEqual(y.shape, (n,))
            self.assertEqual(y.dtype, np.int64)
            self.assertEqual(float(x.min()), 0.0)
            self.assertEqual(float(x.max()), 1.0)
            self.assertEqual(sorted(set(y.tolist())), list(range(10)))
            # Pixels are bytes / 255 (idx.c): 255 x is within rounding of an integer.
            self.assertLess(float(np.abs(x * 255 - np.round(x * 255)).max()), 1e-4)
        with self.assertRaises(ValueError):
            fmnist.load(DATA, "valid")

    def test_read_idx_refuses_a_bad_magic_and_a_short_file(self):
        with h.TempDir() as d:
            good = os.path.join(d, "good.gz")
            with gzip.open(good, "wb") as f:
                f.write(struct.pack(">IIII", 0x0803, 2, 2, 2) + bytes(range(8)))
            a = fmnist.read_idx(good, 3)
            self.assertEqual(a.shape, (2, 2, 2))
            self.assertEqual(a.ravel().tolist(), list(range(8)))
            bad = os.path.join(d, "bad.gz")
            with gzip.open(bad, "wb") as f:
                f.write(struct.pack(">IIII", 0x0D03, 2, 2, 2) + bytes(8))
            with self.assertRaisesRegex(ValueError, "magic"):
                fmnist.read_idx(bad, 3)
            short = os.path.join(d, "short.gz")
            with gzip.open(short, "wb") as f:
                f.write(struct.pack(">IIII", 0x0803, 2, 2, 2) + bytes(7))
            with self.assertRaisesRegex(ValueError, "truncated"):
                fmnist.read_idx(short, 3)


class ModelTest(unittest.TestCase):
    def test_mlp_and_cnn_give_ten_logits_per_example(self):
        x = torch.rand(5, 784)
        mlp = fmnist.MLP()
        self.assertEqual(tuple(mlp(x).shape), (5, 10))
        self.assertEqual([(l.in_features, l.out_features) for l in mlp.layers],
                         [(784, 256), (256, 128), (128, 10)])
        self.assertEqual(tuple(fmnist.MLP(hidden=(32,))(x).shape), (5, 10))
        cnn = fmnist.CNN()
        self.assertEqual(tuple(cnn(x).shape), (5, 10))
        self.assertEqual(tuple(cnn(x.reshape(5, 1, 28, 28)).shape), (5, 10))
        # cnn.c's shapes: 5x5 kernels, 16 and 32 channels, 32 x 5 x 5 into 64.
        self.assertEqual(tuple(cnn.conv0.weight.shape), (16, 1, 5, 5))
        self.assertEqual(tuple(cnn.conv1.weight.shape), (32, 16, 5, 5))
        self.assertEqual(tuple(cnn.dense0.weight.shape), (64, 800))
        self.assertEqual(tuple(cnn.dense1.weight.shape), (10, 64))
        # Zero biases and kernels within dworker's bounds.
        for b in (cnn.conv0.bias, cnn.dense1.bias, mlp.layers[0].bias):
            self.assertEqual(float(b.abs().max()), 0.0)
        self.assertLessEqual(float(mlp.layers[0].weight.abs().max()), (6 / (784 + 256)) ** 0.5)
        self.assertLessEqual(float(cnn.conv0.weight.abs().max()), (6 / 25) ** 0.5)

    def test_evaluate_counts_the_right_answers(self):
        class Fixed(torch.nn.Module):
            def forward(self, x):
                return F.one_hot(torch.full((x.shape[0],), 3), 10).float()

        y = torch.tensor([3, 3, 1, 3, 0, 3, 3, 2])
        self.assertEqual(fmnist.evaluate(Fixed(), torch.zeros(8, 784), y, batch=3), 5 / 8)


class ShardTest(unittest.TestCase):
    def test_shares_are_disjoint_complete_and_shuffled_per_epoch(self):
        n = 1001
        x = torch.arange(n, dtype=torch.float32).reshape(n, 1)
        y = torch.arange(n)
        seen = []
        for index in range(3):
            got = list(fmnist.shard_batches(x, y, 64, 0, 1, index, 3))
            sizes = [yb.shape[0] for _, yb in got]
            share = (n - index + 2) // 3
            self.assertEqual(sizes[:-1], [64] * (len(sizes) - 1))
            self.assertEqual(sum(sizes), share)
            ids = torch.cat([yb for _, yb in got]).tolist()
            self.assertTrue(all(i % 3 == index for i in ids))
            self.assertEqual(torch.cat([xb for xb, _ in got]).flatten().long().tolist(), ids)
            self.assertNotEqual(ids, sorted(ids))
            seen += ids
            again = torch.cat([yb for _, yb in fmnist.shard_batches(x, y, 64, 0, 1, index, 3)])
            self.assertEqual(again.tolist(), ids)
            other = torch.cat([yb for _, yb in fmnist.shard_batches(x, y, 64, 1, 1, index, 3)])
            self.assertNotEqual(other.tolist(), ids)
            self.assertEqual(sorted(other.tolist()), sorted(ids))
        self.assertEqual(sorted(seen), list(range(n)))
        with self.assertRaises(ValueError):
            list(fmnist.shard_batches(x, y, 64, 0, 1, 3, 3))


class TrainTest(unittest.TestCase):
    def test_mlp_300_steps_one_process_reaches_0_7(self):
        need_data(self)
        torch.manual_seed(1)
        x, y = fmnist.load(DATA, "train")
        xt, yt = fmnist.load(DATA, "test")
        model = fmnist.MLP((256, 128))
        opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
        self.assertLess(fmnist.evaluate(model, xt, yt), 0.4)
        steps, epoch = 0, 0
        while steps < 300:
            for xb, yb in fmnist.shard_batches(x, y, 64, epoch, 1, 0, 1):
                opt.zero_grad(set_to_none=True)
                loss = F.cross_entropy(model(xb), yb)
                loss.backward()
                opt.step()
                steps += 1
                if steps == 300:
                    break
            epoch += 1
        self.assertTrue(torch.isfinite(loss).item())
        acc = fmnist.evaluate(model, xt, yt)
        print("test_accuracy=%.4f after 300 steps" % acc)
        self.assertGreater(acc, 0.7)


def shard_lr(opt, k):
    """The lr of update k (from 0) of job.optimizer `opt` on a shard: its
    warm-up, then its schedule (docs/training.md, cm_schedule_lr)."""
    lr = float(opt.get("lr", 0.05))
    sched = opt.get("schedule", {})
    w = int(sched.get("warmup_steps", 0))
    if k < w:
        return lr * (k + 1) / w
    kind, s = sched.get("type", "constant"), k - w
    if kind == "constant":
        return lr
    if kind == "cosine":
        t, low = int(sched["total_steps"]) - w, float(sched.get("min_lr", 0))
        return low + (lr - low) * (1 + math.cos(math.pi * min(s, t) / t)) / 2
    return lr * float(sched.get("gamma", 0.1)) ** (s // int(sched["decay_every"]))


class AsyncStartTest(unittest.TestCase):
    """deploy/examples/torch-cnn.json's optimizer survives the start of an
    async job. Two workers pushing to one model each compute their gradient
    on values a push or two old; with momentum 0.9 at the full lr 0.04 from
    the first step, the loss of the first steps rose (to 7-10) and killed
    every ReLU of the CNN's dense layer, and the job trained at chance: 1
    run in 6 of the real example, and in this simulation 1 seed in 60 with
    gradients one push old, 3 in 60 (these three) two pushes old. With the
    example's warm-up none of the 120 died; a run under make test's load
    still did (staler gradients), and the example's momentum went from 0.9
    to 0.5 (docs/python.md: 4 pushes old, 320 pushes, 14 of 15 seeds died
    at 0.9, none at 0.5). Here: the CNN, the example's
    optimizer with the shards' schedule, every gradient computed on the
    values two pushes before, 40 pushes from each of those seeds; at least
    30% of the dense layer's units must still be alive (they were 2-17%)."""

    def test_cnn_example_optimizer_survives_stale_gradients(self):
        self.replay((18, 19, 45), 2, 40)

    def test_cnn_example_optimizer_survives_staler_gradients(self):
        """Gradients 4 pushes old, as under make test's load: these seeds
        left 78-94% of the dense units dead at momentum 0.9 after 120
        pushes (5-12% at the example's 0.5)."""
        self.replay((0, 3, 4), 4, 120)

    def replay(self, seeds, stale, pushes):
        """The example's optimizer from each seed, every gradient computed on
        the values `stale` pushes before, `pushes` pushes."""
        need_data(self)
        with open(os.path.join(ROOT, "deploy", "examples", "torch-cnn.json")) as f:
            job = json.load(f)["job"]
        opt = job["optimizer"]
        self.assertIn(opt["type"], ("sgd", "momentum"))
        mu = float(opt.get("momentum", 0.9)) if opt["type"] == "momentum" else 0.0
        x, y = fmnist.load(DATA, "train")
        x, y = torch.as_tensor(x.reshape(-1, 1, 28, 28)), torch.as_tensor(y)
        probe = x[:512]
        for seed in seeds:
            torch.manual_seed(seed)
            shard = fmnist.CNN(tuple(job["channels"]))
            sgd = torch.optim.SGD(shard.parameters(), lr=1.0, momentum=mu)
            worker = fmnist.CNN(tuple(job["channels"]))
            old = [copy.deepcopy(shard.state_dict())]
            draw = torch.Generator().manual_seed(seed)
            losses = []
            for k in range(pushes):
                worker.load_state_dict(old[max(0, len(old) - 1 - stale)])
                idx = torch.randint(0, x.shape[0], (64,), generator=draw)
                worker.zero_grad(set_to_none=True)
                loss = F.cross_entropy(worker(x[idx]), y[idx])
                loss.backward()
                losses.append(float(loss))
                for p, q in zip(shard.parameters(), worker.parameters()):
                    p.grad = q.grad
                sgd.param_groups[0]["lr"] = shard_lr(opt, k)
                sgd.step()
                old = (old + [copy.deepcopy(shard.state_dict())])[-(stale + 1):]
            with torch.no_grad():
                h = F.max_pool2d(F.relu(shard.conv0(probe)), 2)
                h = F.max_pool2d(F.relu(shard.conv1(h)), 2)
                h = F.relu(shard.dense0(h.flatten(1)))
                dead = float((h.max(0).values <= 0).float().mean())
            print("seed %d: largest loss %.2f, dense units dead %.2f"
                  % (seed, max(losses), dead))
            with self.subTest(seed=seed):
                self.assertLess(dead, 0.7, "the losses were " +
                                " ".join("%.2f" % v for v in losses))


if __name__ == "__main__":
    h.main()
