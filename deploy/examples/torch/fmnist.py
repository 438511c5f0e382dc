"""Fashion-MNIST for PyTorch, the way dworker sees it: the data, the two
demo models and a worker's share of the batches, so that a PyTorch user
(plain, DDP, or through psd's shards) trains what dworker trains.

  load(data_dir, split)  the gzipped IDX files of Debian's
                         dataset-fashion-mnist as float32 x (n, 784), pixels
                         / 255 in [0, 1], and int64 labels y (n,) in 0..9
                         (worker/data/idx.c)
  MLP(hidden)            784 -> hidden... (ReLU) -> 10 logits
                         (worker/model/mlp.c)
  CNN(channels)          conv 5x5 pad 2 + ReLU + max-pool 2, conv 5x5 + ReLU
                         + max-pool 2, dense 64 + ReLU, dense 10
                         (worker/model/cnn.c)
  shard_batches(...)     worker `index` of `count`: examples i with
                         i % count == index, shuffled per epoch from (seed,
                         epoch, index) with dworker's own Fisher-Yates
                         (worker/dworker/feeder.c), in batches
  evaluate(model, x, y)  test accuracy

The models' initial values follow dworker's distributions (Glorot-uniform
dense kernels, He-uniform conv kernels and first CNN dense layer, zero
biases), not its exact values: those come from psd's counter-based
generator (tests/bench/torch_baseline.py reproduces them bit for bit).

Run on its own it trains one process and prints the test accuracy:
  /usr/bin/python3 deploy/examples/torch/fmnist.py [--model mlp|cnn] [--steps N]
"""
import gzip
import math
import os
import struct

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

DATA_DIR = "/usr/share/datasets/fashion-mnist"  # common/spec/job.c's default
CLASSES = 10
SIDE = 28  # images are SIDE x SIDE

# File name prefixes of the two splits (dw_dataset_load's "train" / "t10k").
PREFIX = {"train": "train", "test": "t10k"}

M64 = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15  # common/base/rand.h: CM_SPLITMIX64_GAMMA


# ---- Data: worker/data/idx.c ----

def read_idx(path, ndim):
    """An IDX file of unsigned bytes, gzipped or plain, as a uint8 array of
    its dimensions. Raises ValueError when the header or size is wrong."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 + 4 * ndim:
        raise ValueError("%s: %d bytes, shorter than an IDX header" % (path, len(raw)))
    magic = struct.unpack(">I", raw[:4])[0]
    if magic != 0x0800 | ndim:
        raise ValueError("%s: magic 0x%08x; expected 0x%08x (unsigned bytes, %d dimensions)"
                         % (path, magic, 0x0800 | ndim, ndim))
    dims = struct.unpack(">%dI" % ndim, raw[4:4 + 4 * ndim])
    count = math.prod(dims)
    body = raw[4 + 4 * ndim:]
    if len(body) < count:
        raise ValueError("%s: truncated: header promises %d data bytes, file has %d"
                         % (path, count, len(body)))
    return np.frombuffer(body, dtype=np.uint8, count=count).reshape(dims)


def load(data_dir=DATA_DIR, split="train"):
    """The split ("train": 60000 examples, "test": 10000) as (x, y): x float32
    (n, 784) with pixels / 255, y int64 (n,) with labels 0..9."""
    if split not in PREFIX:
        raise ValueError("split is %r; expected 'train' or 'test'" % (split,))
    ipath = os.path.join(data_dir, "%s-images-idx3-ubyte.gz" % PREFIX[split])
    lpath = os.path.join(data_dir, "%s-labels-idx1-ubyte.gz" % PREFIX[split])
    images, labels = read_idx(ipath, 3), read_idx(lpath, 1)
    if images.shape[0] != labels.shape[0]:
        raise ValueError("%s holds %d images but %s holds %d labels"
                         % (ipath, images.shape[0], lpath, labels.shape[0]))
    if labels.size and labels.max() >= CLASSES:
        raise ValueError("%s: a label is %d; expected 0..9" % (lpath, labels.max()))
    x = images.reshape(images.shape[0], -1).astype(np.float32) / np.float32(255.0)
    return x, labels.astype(np.int64)


# ---- Models: worker/model/mlp.c, worker/model/cnn.c ----

def _uniform_(t, scale):
    with torch.no_grad():
        t.uniform_(-scale, scale)


class MLP(nn.Module):
    """784 -> hidden[0] -> ... -> 10: dense layers with ReLU between them, the
    last one's output the logits (softmax cross-entropy is the loss's part,
    F.cross_entropy, as in dworker's head). Kernels Glorot-uniform
    (sqrt(6 / (in + out))), biases zero, as dw_mlp_init."""

    def __init__(self, hidden=(256, 128), inputs=SIDE * SIDE, classes=CLASSES):
        super().__init__()
        sizes = [inputs] + list(hidden) + [classes]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes, sizes[1:]))
        for lin in self.layers:
            _uniform_(lin.weight, math.sqrt(6.0 / (lin.in_features + lin.out_features)))
            nn.init.zeros_(lin.bias)

    def forward(self, x):
        """x is (B, 784); returns the logits (B, 10)."""
        x = x.reshape(x.shape[0], -1)
        for i, lin in enumerate(self.layers):
            x = lin(x)
            if i + 1 < len(self.layers):
                x = F.relu(x)
        return x


class CNN(nn.Module):
    """dworker's demo CNN (worker/model/cnn.h): conv 5x5 (1 -> c1, zero
    padding 2: 28x28 out) + ReLU + 2x2 max-pool (14x14), conv 5x5 (c1 -> c2,
    unpadded: 10x10) + ReLU + 2x2 max-pool (5x5), flattened channel-major,
    dense (c2 * 25 -> 64) + ReLU, dense (64 -> 10) logits. Conv kernels and
    the first dense kernel uniform in sqrt(6 / fan_in), the last dense kernel
    Glorot-uniform, biases zero, as dw_cnn_var."""

    KERNEL = 5   # DW_CNN_K
    POOL = 2     # DW_CNN_POOL
    PAD1 = 2     # DW_CNN_PAD1
    HIDDEN = 64  # DW_CNN_HIDDEN

    def __init__(self, channels=(16, 32), side=SIDE, classes=CLASSES):
        super().__init__()
        c1, c2 = channels
        k, p = self.KERNEL, self.POOL
        self.side = side
        self.conv0 = nn.Conv2d(1, c1, k, padding=self.PAD1)
        self.conv1 = nn.Conv2d(c1, c2, k)
        s = (side + 2 * self.PAD1 - k + 1) // p
        s = (s - k + 1) // p
        if s < 1:
            raise ValueError("a %dx%d image is too small for two blocks" % (side, side))
        self.dense0 = nn.Linear(c2 * s * s, self.HIDDEN)
        self.dense1 = nn.Linear(self.HIDDEN, classes)
        for conv in (self.conv0, self.conv1):
            fan_in = conv.in_channels * k * k
            _uniform_(conv.weight, math.sqrt(6.0 / fan_in))
            nn.init.zeros_(conv.bias)
        _uniform_(self.dense0.weight, math.sqrt(6.0 / self.dense0.in_features))
        _uniform_(self.dense1.weight,
                  math.sqrt(6.0 / (self.dense1.in_features + self.dense1.out_features)))
        nn.init.zeros_(self.dense0.bias)
        nn.init.zeros_(self.dense1.bias)

    def forward(self, x):
        """x is (B, 784) or (B, 1, 28, 28); returns the logits (B, 10)."""
        x = x.reshape(x.shape[0], 1, self.side, self.side)
        x = F.max_pool2d(F.relu(self.conv0(x)), self.POOL)
        x = F.max_pool2d(F.relu(self.conv1(x)), self.POOL)
        x = F.relu(self.dense0(x.flatten(1)))
        return self.dense1(x)


# ---- A worker's batches: worker/dworker/feeder.c ----

def _mix64(z):
    """cm_mix64 on a uint64 array (numpy wraps the products mod 2^64)."""
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def epoch_order(n, seed, epoch, index):
    """The order of epoch `epoch` of worker `index`'s n examples: dworker's
    Fisher-Yates over 0..n-1 seeded by (seed, epoch, index), its random
    numbers drawn in one numpy pass, the swaps in a loop."""
    s = (seed * GAMMA + epoch * 0xBF58476D1CE4E5B9 + index * 0x94D049BB133111EB) & M64
    k = np.arange(1, n, dtype=np.uint64)  # the k-th draw advances the state k times
    with np.errstate(over="ignore"):
        r = _mix64(np.uint64(s) + k * np.uint64(GAMMA))
    bound = np.arange(n, 1, -1, dtype=np.uint64)  # the k-th draw picks from [0, n - k + 1)
    js = (((r >> np.uint64(32)) * bound) >> np.uint64(32)).tolist()
    order = list(range(n))
    for i, j in zip(range(n, 1, -1), js):
        order[i - 1], order[j] = order[j], order[i - 1]
    return torch.tensor(order, dtype=torch.int64)


def shard(x, y, index, count):
    """Worker `index` of `count`'s share: examples i with i % count == index
    (dw_dataset_load's parts), as torch tensors."""
    if count < 1 or not 0 <= index < count:
        raise ValueError("worker %d of %d: expected 0 <= index < count" % (index, count))
    x, y = torch.as_tensor(x), torch.as_tensor(y)
    if x.shape[0] != y.shape[0]:
        raise ValueError("%d examples but %d labels" % (x.shape[0], y.shape[0]))
    return x[index::count], y[index::count]


def shard_batches(x, y, batch_size, epoch, seed, index, count):
    """Yields (xb, yb), the batches of epoch `epoch` of worker `index` of
    `count`: its share (shard) in dworker's shuffled order for (seed, epoch,
    index), batch_size examples each, the last one shorter when the share
    does not divide evenly, as dworker's steps."""
    if batch_size < 1:
        raise ValueError("batch_size is %d; expected >= 1" % batch_size)
    xs, ys = shard(x, y, index, count)
    order = epoch_order(xs.shape[0], seed, epoch, index)
    for first in range(0, xs.shape[0], batch_size):
        idx = order[first:first + batch_size]
        yield xs.index_select(0, idx), ys.index_select(0, idx)


def evaluate(model, x, y, batch=1000):
    """The fraction of (x, y) that model classifies right, batch examples at
    a time, without gradients; the model's training mode is kept."""
    x, y = torch.as_tensor(x), torch.as_tensor(y)
    was_training = model.training
    model.eval()
    correct = 0
    try:
        with torch.no_grad():
            for first in range(0, x.shape[0], batch):
                pred = model(x[first:first + batch]).argmax(dim=1)
                correct += int((pred == y[first:first + batch]).sum().item())
    finally:
        model.train(was_training)
    return correct / x.shape[0] if x.shape[0] else 0.0


def main():
    import argparse
    import time

    ap = argparse.ArgumentParser(description="Train dworker's demo model on Fashion-MNIST "
                                 "in one PyTorch process")
    ap.add_argument("--model", choices=("mlp", "cnn"), default="mlp")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--data-dir", default=DATA_DIR)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    x, y = load(args.data_dir, "train")
    xt, yt = load(args.data_dir, "test")
    model = MLP() if args.model == "mlp" else CNN()
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    step, epoch, t0 = 0, 0, time.monotonic()
    while step < args.steps:
        for xb, yb in shard_batches(x, y, args.batch, epoch, args.seed, 0, 1):
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(xb), yb).backward()
            opt.step()
            step += 1
            if step == args.steps:
                break
        epoch += 1
    wall = time.monotonic() - t0
    print("fmnist: model=%s steps=%d wall_s=%.2f test_accuracy=%.4f"
          % (args.model, step, wall, evaluate(model, xt, yt)))


if __name__ == "__main__":
    main()
