"""The PyTorch baseline of `bench train`: the job's MLP trained with PyTorch
(Debian's python3-torch), on the same data, batch, optimizer, initial
values, data order and epochs as dworker, in one process or in DDP.

  --mode single: one process, like `dworker --standalone` (all 60000
                 training examples, worker 0's shuffle).
  --mode ddp:    --procs processes (2 by default) under
                 torch.nn.parallel.DistributedDataParallel with the gloo
                 backend on 127.0.0.1, each training on its share of the data
                 (examples i with i % procs == rank, worker `rank`'s shuffle,
                 as each dworker of a job does) with the spec's batch per
                 process; DDP averages the gradients every step.
                 Between hosts (bench multihost): --master ADDR is where
                 rank 0 holds the rendezvous (default 127.0.0.1), --ifname
                 IF the interface gloo binds its sockets to (default lo),
                 --netns NS (once per rank) runs rank i in network namespace
                 NS_i (`ip netns exec`, as root), and --comm-hook fp16
                 compresses the gradients to float16 for the all-reduce
                 (DDP's fp16_compress_hook; the line then says
                 comm_hook=fp16).

What is the same as dworker (read from worker/model/mlp.c, kernels/,
common/vars/init.c, worker/data/idx.c, worker/dworker/feeder.c): the layers
784 -> job.hidden (ReLU) -> 10, a softmax cross-entropy head averaged over
the batch; Glorot-uniform kernels from psd's counter-based splitmix64 keyed
by (job.seed, "dense<l>/kernel"), zero biases; pixels / 255 as float32; each
epoch's Fisher-Yates order from (job.seed, epoch, worker); SGD with momentum
v = m v + g, w -= lr v (torch.optim.SGD, dampening 0). With the same order,
--mode single takes the same steps as dworker --standalone, so its test
accuracy and its parameters after a few steps (--max-steps, --save-params,
compared with dworker's --save-params) match up to float rounding.

Threads: each process runs with 1 intra-op and 1 inter-op thread
(torch.set_num_threads, and OMP/OpenBLAS/MKL_NUM_THREADS=1 set before torch
is imported), because dworker --standalone and each worker of the demo job
use 1 OpenBLAS thread (dworker --threads defaults to 1): the single-process
figures then compare one core's work with one core's work, and DDP's 2
processes use the 2 cores as the demo's 2 workers do. --threads changes it.

The rate is measured, never derived: all processes' training examples over
the wall time from the first step of any process to the last step of any
(CLOCK_MONOTONIC, which every process of one host shares). Loading, the
shuffles (computed before the first step) and the test evaluation are not
in it, as in dworker's wall_s. One stdout line:

  torch: mode=ddp procs=2 threads=1 epochs=5 examples=300000 wall_s=16.8
         examples_per_s=17902 test_accuracy=0.8650 steps=4690     (one line)

(steps: every process's steps added up.)

Exit status 0 on success, 1 on any failure (said on stderr), 2 on a bad
command line. Every wait is bounded (--timeout); a DDP process that fails or
outlives the timeout makes the others be killed by PID.

Run: /usr/bin/python3 tests/bench/torch_baseline.py --mode single|ddp [--spec FILE]
"""
import argparse
import ctypes
import gzip
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEMO_SPEC = os.path.join(HERE, "..", "..", "deploy", "examples", "local.json")
DEFAULT_DATA_DIR = "/usr/share/datasets/fashion-mnist"  # common/spec/job.c's default
M64 = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15  # common/base/rand.h: CM_SPLITMIX64_GAMMA


class Failed(Exception):
    """A failure to report on stderr before exiting 1."""


def say(msg):
    sys.stderr.write("torch_baseline: %s\n" % msg)
    sys.stderr.flush()


# ---- The job, from the spec ----

def read_job(path, epochs):
    """The settings of the spec's job this baseline reproduces; refuses what
    it does not model rather than train something else."""
    try:
        with open(path) as f:
            job = json.load(f)["job"]
    except (OSError, ValueError, KeyError) as e:
        raise Failed("%s: cannot read the spec's job: %s" % (path, e))
    if job.get("model", "mlp") != "mlp":
        raise Failed("%s: job.model is %r; this baseline trains the mlp only"
                     % (path, job["model"]))
    opt = job.get("optimizer", {})
    if opt.get("type") not in ("momentum", "sgd") or "lr" not in opt \
            or set(opt) - {"type", "lr", "momentum"}:
        raise Failed("%s: job.optimizer is %s; this baseline takes momentum or sgd with "
                     "lr (and momentum) given, nothing else" % (path, json.dumps(opt)))
    if opt["type"] == "momentum" and "momentum" not in opt:
        raise Failed("%s: job.optimizer.momentum is not given" % path)
    for key in ("clip_norm", "max_steps", "wire_dtype"):
        if job.get(key):
            raise Failed("%s: job.%s is set; this baseline does not model it" % (path, key))
    return {
        "hidden": list(job.get("hidden", [256, 128])),
        "batch": int(job.get("batch_size", 64)),
        "epochs": epochs if epochs is not None else int(job.get("epochs", 3)),
        "lr": float(opt["lr"]),
        "momentum": float(opt.get("momentum", 0.0)) if opt["type"] == "momentum" else 0.0,
        "seed": int(job.get("seed", 1)),
        "data_dir": job.get("data_dir", DEFAULT_DATA_DIR),
    }


# ---- Data: worker/data/idx.c ----

def load_idx(path, ndim):
    """An IDX file of unsigned bytes (gzipped) as (dims, bytes)."""
    try:
        with gzip.open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise Failed("%s: %s" % (path, e))
    if len(raw) < 4 + 4 * ndim:
        raise Failed("%s: too short for an IDX header" % path)
    magic = struct.unpack(">I", raw[:4])[0]
    if magic != 0x0800 | ndim:
        raise Failed("%s: magic 0x%08x; expected 0x%08x (unsigned bytes, %d dimensions)"
                     % (path, magic, 0x0800 | ndim, ndim))
    dims = struct.unpack(">%dI" % ndim, raw[4:4 + 4 * ndim])
    body = raw[4 + 4 * ndim:]
    count = 1
    for d in dims:
        count *= d
    if len(body) < count:
        raise Failed("%s: %d data bytes; the header promises %d" % (path, len(body), count))
    return dims, body[:count]


def load_set(np, data_dir, prefix, part, nparts):
    """dw_dataset_load: examples i with i % nparts == part, pixels / 255 in
    float32, labels checked to be 0..9."""
    ipath = os.path.join(data_dir, "%s-images-idx3-ubyte.gz" % prefix)
    lpath = os.path.join(data_dir, "%s-labels-idx1-ubyte.gz" % prefix)
    idims, ibytes = load_idx(ipath, 3)
    ldims, lbytes = load_idx(lpath, 1)
    if idims[0] != ldims[0]:
        raise Failed("%s holds %d images but %s %d labels" % (ipath, idims[0], lpath, ldims[0]))
    x = np.frombuffer(ibytes, dtype=np.uint8).reshape(idims[0], idims[1] * idims[2])
    y = np.frombuffer(lbytes, dtype=np.uint8)
    if y.max() >= 10:
        raise Failed("%s: a label is %d; expected 0..9" % (lpath, y.max()))
    x = x[part::nparts].astype(np.float32) / np.float32(255.0)
    return x, y[part::nparts].astype(np.int64)


# ---- Initial values and data order: common/vars/init.c, feeder.c ----

def mix64(np, z):
    """cm_mix64 on a uint64 array (numpy wraps the products mod 2^64)."""
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def init_uniform(np, n, scale, seed, name):
    """cm_init_fill(CM_INIT_UNIFORM): element i of variable `name` is
    (2u - 1) * scale, u the top 24 bits of splitmix64_at(key + i)."""
    h = 0xCBF29CE484222325
    for c in name.encode():
        h = ((h ^ c) * 0x100000001B3) & M64
    key = int(mix64(np, np.array([(seed ^ h) + GAMMA & M64], dtype=np.uint64))[0])
    with np.errstate(over="ignore"):
        r = mix64(np, np.arange(n, dtype=np.uint64) + np.uint64((key + GAMMA) & M64))
    u = (r >> np.uint64(40)).astype(np.float32) * np.float32(1.0 / 16777216.0)
    return (np.float32(2.0) * u - np.float32(1.0)) * np.float32(scale)


def epoch_order(np, n, seed, epoch, worker):
    """feeder.c's shuffle_epoch: Fisher-Yates over 0..n-1 seeded by (seed,
    epoch, worker); the random numbers in one numpy pass, the swaps in a
    loop."""
    s = (seed * GAMMA + epoch * 0xBF58476D1CE4E5B9 + worker * 0x94D049BB133111EB) & M64
    k = np.arange(1, n, dtype=np.uint64)  # the k-th draw advances the state k times
    with np.errstate(over="ignore"):
        r = mix64(np, np.uint64(s) + k * np.uint64(GAMMA))
    bound = np.arange(n, 1, -1, dtype=np.uint64)  # the k-th draw picks from [0, n - k + 1)
    js = (((r >> np.uint64(32)) * bound) >> np.uint64(32)).tolist()
    order = list(range(n))
    for i, j in zip(range(n, 1, -1), js):
        order[i - 1], order[j] = order[j], order[i - 1]
    return order


# ---- Training ----

def train(job, rank, nprocs, threads, max_steps, save_params, comm_hook=None):
    """Trains this process's share; returns its report (first and last step
    times, examples, and on rank 0 the test accuracy)."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    torch.set_num_interop_threads(1)
    x, y = load_set(np, job["data_dir"], "train", rank, nprocs)
    xt, yt = load_set(np, job["data_dir"], "t10k", 0, 1) if rank == 0 else (None, None)
    sizes = [x.shape[1]] + job["hidden"] + [10]
    layers = []
    for l in range(len(sizes) - 1):
        lin = torch.nn.Linear(sizes[l], sizes[l + 1])
        scale = np.sqrt(np.float32(6.0) / np.float32(sizes[l] + sizes[l + 1]))
        w = init_uniform(np, sizes[l] * sizes[l + 1], scale, job["seed"], "dense%d/kernel" % l)
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(w.reshape(sizes[l + 1], sizes[l])))
            lin.bias.zero_()
        layers.append(lin)
        if l + 2 < len(sizes):
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers)
    net = model
    if nprocs > 1:
        net = torch.nn.parallel.DistributedDataParallel(model)
        if comm_hook == "fp16":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
            net.register_comm_hook(None, default_hooks.fp16_compress_hook)
    opt = torch.optim.SGD(model.parameters(), lr=job["lr"], momentum=job["momentum"])

    B, n = job["batch"], x.shape[0]
    spe = (n + B - 1) // B
    total = job["epochs"] * spe
    if max_steps is not None:
        total = min(total, max_steps)
    orders = [torch.tensor(epoch_order(np, n, job["seed"], e, rank), dtype=torch.int64)
              for e in range((total + spe - 1) // spe)]
    xs, ys = torch.from_numpy(x), torch.from_numpy(y)

    examples, loss = 0, None
    start = time.monotonic()
    for t in range(total):
        first = (t % spe) * B
        idx = orders[t // spe][first:first + B]
        xb, yb = xs.index_select(0, idx), ys.index_select(0, idx)
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(xb), yb)
        loss.backward()
        opt.step()
        examples += idx.shape[0]
    end = time.monotonic()
    if loss is not None and not torch.isfinite(loss).item():
        raise Failed("rank %d: the last step's loss is %s" % (rank, loss.item()))

    report = {"rank": rank, "start": start, "end": end, "examples": examples,
              "steps": total, "epochs": len(orders)}
    if rank == 0:
        with torch.no_grad():
            pred = model(torch.from_numpy(xt)).argmax(dim=1)
        report["test_accuracy"] = float((pred == torch.from_numpy(yt)).sum().item()) / len(yt)
        if save_params:
            # dworker's --save-params layout: w0, b0, w1, b1, ... as f32.
            with open(save_params, "wb") as f:
                for p in model.parameters():
                    f.write(p.detach().numpy().astype(np.float32).tobytes())
    return report


def print_result(mode, nprocs, threads, reports, comm_hook=None):
    """The one stdout line: every process's examples over the span from the
    first step of any to the last step of any."""
    examples = sum(r["examples"] for r in reports)
    wall = max(r["end"] for r in reports) - min(r["start"] for r in reports)
    acc = [r["test_accuracy"] for r in reports if "test_accuracy" in r]
    if wall <= 0 or not acc:
        raise Failed("no usable report: %s" % reports)
    print("torch: mode=%s procs=%d threads=%d epochs=%d examples=%d wall_s=%.2f "
          "examples_per_s=%.0f test_accuracy=%.4f steps=%d"
          % (mode, nprocs, threads, reports[0]["epochs"], examples, wall, examples / wall,
             acc[0], sum(r["steps"] for r in reports))
          + (" comm_hook=%s" % comm_hook if comm_hook else ""), flush=True)


# ---- DDP: one child process per rank ----

def ddp_child(args, job):
    """A rank: joins the gloo group, trains, prints its report as JSON."""
    import torch.distributed as dist
    from datetime import timedelta

    # Die with the parent: it kills ranks by PID, but it may itself be killed.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != args.parent:
        raise Failed("rank %d: the launcher is gone" % args.rank)
    dist.init_process_group("gloo", init_method="tcp://%s:%d" % (args.master, args.port),
                            rank=args.rank, world_size=args.procs,
                            timeout=timedelta(seconds=args.timeout))
    try:
        rep = train(job, args.rank, args.procs, args.threads, args.max_steps,
                    args.save_params, args.comm_hook)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    print("report: " + json.dumps(rep), flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ddp(args, job):
    """Starts args.procs ranks of this script, waits for all of them (at most
    args.timeout seconds), kills the rest by PID when one fails, and prints
    the job's line from their reports."""
    port = free_port()
    procs = []
    with tempfile.TemporaryDirectory(prefix="torch-ddp-") as d:
        try:
            for rank in range(args.procs):
                out = open(os.path.join(d, "rank%d.log" % rank), "w+")
                argv = [sys.executable, os.path.abspath(__file__), "--mode", "ddp",
                        "--spec", args.spec, "--epochs", str(job["epochs"]),
                        "--procs", str(args.procs), "--threads", str(args.threads),
                        "--timeout", str(args.timeout), "--rank", str(rank),
                        "--port", str(port), "--parent", str(os.getpid()),
                        "--master", args.master, "--ifname", args.ifname]
                if args.comm_hook:
                    argv += ["--comm-hook", args.comm_hook]
                if args.netns:
                    argv = ["ip", "netns", "exec", args.netns[rank]] + argv
                if args.max_steps is not None:
                    argv += ["--max-steps", str(args.max_steps)]
                if args.save_params and rank == 0:
                    argv += ["--save-params", args.save_params]
                procs.append((subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                               stdin=subprocess.DEVNULL, env=thread_env(args)),
                              out))
            deadline = time.monotonic() + args.timeout
            while any(p.poll() is None for p, _ in procs):
                bad = [(i, p.returncode) for i, (p, _) in enumerate(procs)
                       if p.returncode not in (None, 0)]
                if bad:
                    raise Failed("rank %d exited %d" % bad[0])
                if time.monotonic() > deadline:
                    raise Failed("the ranks did not finish within %ds" % args.timeout)
                time.sleep(0.1)
            bad = [(i, p.returncode) for i, (p, _) in enumerate(procs) if p.returncode != 0]
            if bad:
                raise Failed("rank %d exited %d" % bad[0])
            reports = []
            for i, (_, out) in enumerate(procs):
                out.seek(0)
                lines = [l for l in out.read().splitlines() if l.startswith("report: ")]
                if not lines:
                    raise Failed("rank %d printed no report" % i)
                reports.append(json.loads(lines[-1][len("report: "):]))
            print_result("ddp", args.procs, args.threads, reports, args.comm_hook)
        except Failed as e:
            for p, _ in procs:
                if p.poll() is None:
                    os.kill(p.pid, signal.SIGKILL)
                    p.wait(timeout=10)
            tails = []
            for i, (_, out) in enumerate(procs):
                out.seek(0)
                tails.append("--- rank %d (exit %s):\n%s"
                             % (i, procs[i][0].returncode, out.read()[-1500:]))
            raise Failed("%s\n%s" % (e, "\n".join(tails)))
        finally:
            for _, out in procs:
                out.close()


def thread_env(args):
    """The environment of a process that imports torch: OpenMP, OpenBLAS and
    MKL limited to --threads, gloo on --ifname (the loopback interface by
    default)."""
    e = dict(os.environ)
    for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        e[k] = str(args.threads)
    e["GLOO_SOCKET_IFNAME"] = args.ifname
    return e


def main():
    ap = argparse.ArgumentParser(description="PyTorch baseline of bench train "
                                 "(tests/bench/torch_baseline.py; docs/performance.md)")
    ap.add_argument("--mode", choices=("single", "ddp"), required=True)
    ap.add_argument("--spec", default=os.path.abspath(DEMO_SPEC),
                    help="cluster spec whose job to train (default: the demo's)")
    ap.add_argument("--epochs", type=int, help="instead of the spec's job.epochs")
    ap.add_argument("--procs", type=int, default=2, help="DDP processes (default 2)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads per process (default 1, as dworker's OpenBLAS)")
    ap.add_argument("--timeout", type=int, default=600,
                    help="seconds the whole run may take (default 600)")
    ap.add_argument("--max-steps", type=int, help="stop each process after N steps")
    ap.add_argument("--save-params", help="rank 0 writes its final parameters here "
                    "(dworker --save-params's layout)")
    ap.add_argument("--master", default="127.0.0.1",
                    help="DDP: the address of rank 0's rendezvous (default 127.0.0.1)")
    ap.add_argument("--ifname", default="lo",
                    help="DDP: the interface gloo binds to (default lo)")
    ap.add_argument("--netns", action="append",
                    help="DDP: run the next rank in this network namespace (once per rank)")
    ap.add_argument("--comm-hook", choices=("fp16",),
                    help="DDP: compress gradients to float16 for the all-reduce")
    # A DDP rank, started by the launcher above.
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--parent", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.procs < 1 or args.threads < 1 or args.timeout < 1 \
            or (args.epochs is not None and args.epochs < 1) \
            or (args.max_steps is not None and args.max_steps < 1):
        ap.error("--procs, --threads, --timeout, --epochs and --max-steps take integers >= 1")
    if args.netns and len(args.netns) != args.procs and args.rank is None:
        ap.error("--netns is given %d times; give it once per rank (--procs %d)"
                 % (len(args.netns), args.procs))
    try:
        job = read_job(args.spec, args.epochs)
        if args.rank is not None:
            ddp_child(args, job)
        elif args.mode == "ddp":
            ddp(args, job)
        else:
            # Before torch is imported, so that OpenMP and OpenBLAS see them.
            os.environ.update(thread_env(args))
            rep = train(job, 0, 1, args.threads, args.max_steps, args.save_params)
            print_result("single", 1, args.threads, [rep])
    except Failed as e:
        say(str(e))
        return 1
    except Exception as e:  # torch's errors: a failed rendezvous, a dead peer
        say("%s: %s" % (type(e).__name__, e))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
