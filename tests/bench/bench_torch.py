"""bench torch: psd's Python client against PyTorch's own ways to train, all
training the demo job's MLP (deploy/examples/local.json: hidden 256,
128, batch 64, SGD momentum lr 0.02 / 0.9, seed 1) on Fashion-MNIST through
deploy/examples/torch/fmnist.py, a bounded number of steps per process:

  torch_single: one PyTorch process on the whole training set
  torch_ddp:    torch.nn.parallel.DistributedDataParallel over gloo, nproc
                processes (2) on 127.0.0.1 at a free port, each on its share
                (fmnist.shard_batches: examples i with i % nproc == rank)
  psd:          `pslaunch SPEC` (given a build directory): 2 psd shards and
                nproc workers running deploy/examples/torch/train.py (the
                same fmnist.MLP and shard_batches, psd.torch.
                DistributedOptimizer, async as torch-mlp.json), each
                stopping after `steps` steps (job.max_steps); psd_spec
                writes the spec (free loopback ports)

Every process is a fresh one (multiprocessing's spawn) with 1 intra-op and
1 inter-op thread (torch.set_num_threads, and OMP/OpenBLAS/MKL_NUM_THREADS
set before it imports torch), as each dworker runs 1 OpenBLAS thread. Each
trains `steps` steps; data loading, the first epoch's shuffle, DDP's
setup and the test evaluation are outside the timed span.

The rate is measured, never derived: the examples every process trained on
over the wall time from the earliest process's first step to the latest
process's last step (time.monotonic, CLOCK_MONOTONIC, which all processes of
one host share). It is never one process's rate times nproc. psd's is
pslaunch's job: line: ps:0's coordinator adds up every worker's examples
and its first and last step as it leaves the job (train.py's first step
starts at its first gradient hook, its last ends after its last pull).

One line per measurement, then one summary line per contender with the
medians over the rounds (the contenders alternate, their order rotated each
round; a ratio is taken within a round, then its median):

  bench torch round=1 contender=torch_ddp procs=2 steps=2000 examples=256000
        seconds=5.12 examples_per_s=50000 test_accuracy=0.8421
  bench torch contender=torch_ddp procs=2 rounds=3 steps=2000 batch=64
        examples_per_s=50000 test_accuracy=0.8421 ratio_to_torch_single=1.6
  bench torch goal psd/torch_ddp=1.05 (goal >= 1.2): NOT met

(psd's lines add mode= and test_acc_workers=, every worker's test accuracy;
test_accuracy is worker 0's, as the baselines' is rank 0's.)

With a build directory it then measures the Python client against the C
client (clients()): one psd shard, a 16 MiB variable (4M floats) split
across it, 32 pushes and 32 pulls timed by `pstool roundtrip` (C,
libpsclient) and by client_bench.py (psd.Client.push/.pull of preallocated
numpy arrays), each a fresh process, alternated 7 times:

  bench torch client=c bytes=16777216 shards=1 via=unix rounds=32 repeats=7
        push_MBps=1823 pull_MBps=2033
  bench torch client=python ... push_ratio_to_c=0.99 pull_ratio_to_c=0.98
  bench torch goal python/c push=0.99 pull=0.98 (goal >= 0.9): met

Run: /usr/bin/python3 tests/bench/bench_torch.py [--steps N] [--rounds R] [--nproc P]
     [--build BUILD_DIR] (or bench.py BUILD_DIR torch, which adds psd). Exit status 0, 1 on a failure (said on
stderr), 2 on a bad command line, 77 when PyTorch or the data set is missing.
"""
import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.normpath(os.path.join(HERE, "..", "..", "deploy", "examples"))
sys.path.insert(0, os.path.join(EXAMPLES, "torch"))

STEPS = 2000         # training steps per process
ROUNDS = 3           # rounds of every contender, alternated
TIMEOUT_S = 600      # the longest one measurement may take, start to end
EXIT_SKIP = 77


class Failed(Exception):
    """A measurement failed; the message says which process and why."""


def job():
    """The demo job's model, batch, optimizer, seed and data (local.json)."""
    with open(os.path.join(EXAMPLES, "local.json")) as f:
        j = json.load(f)["job"]
    opt = j["optimizer"]
    return {"hidden": list(j["hidden"]), "batch": int(j["batch_size"]),
            "lr": float(opt["lr"]), "momentum": float(opt.get("momentum", 0.0)),
            "seed": int(j["seed"]), "data_dir": j["data_dir"]}


def missing():
    """Why the baselines cannot run here, or None."""
    try:
        import numpy  # noqa: F401
        import torch
        import torch.distributed as dist
    except ImportError as e:
        return "PyTorch or numpy is not installed (python3-torch, python3-numpy): %s" % e
    if not dist.is_available() or not dist.is_gloo_available():
        return "this PyTorch %s has no gloo backend" % torch.__version__
    if not os.path.isdir(job()["data_dir"]):
        return "dataset-fashion-mnist is not installed (%s)" % job()["data_dir"]
    return None


# ---- One process: runs in a fresh interpreter (spawn) ----

def _batches(fmnist, x, y, cfg, rank, nproc):
    """This process's batches, epoch after epoch, without end."""
    epoch = 0
    while True:
        yield from fmnist.shard_batches(x, y, cfg["batch"], epoch, cfg["seed"], rank, nproc)
        epoch += 1


def _train(rank, nproc, steps, port, cfg, conn):
    """Trains `steps` steps as rank `rank` of nproc and sends its report
    (first and last step times, examples, on rank 0 the test accuracy) or
    {"error": traceback} over conn."""
    try:
        import torch
        import torch.nn.functional as F
        import fmnist

        torch.set_num_threads(1)
        torch.set_num_interop_threads(1)
        torch.manual_seed(cfg["seed"])
        x, y = fmnist.load(cfg["data_dir"], "train")
        model = fmnist.MLP(cfg["hidden"])
        net = model
        if nproc > 1:
            import torch.distributed as dist
            from datetime import timedelta

            dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port,
                                    rank=rank, world_size=nproc,
                                    timeout=timedelta(seconds=TIMEOUT_S))
            net = torch.nn.parallel.DistributedDataParallel(model)  # broadcasts rank 0's values
        opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"], momentum=cfg["momentum"])
        batches = _batches(fmnist, x, y, cfg, rank, nproc)
        xb, yb = next(batches)  # the first epoch's shuffle, outside the timed span
        if nproc > 1:
            dist.barrier()
        examples, loss = 0, None
        start = time.monotonic()
        for t in range(steps):
            if t:
                xb, yb = next(batches)
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(net(xb), yb)
            loss.backward()
            opt.step()
            examples += yb.shape[0]
        end = time.monotonic()
        if loss is not None and not torch.isfinite(loss).item():
            raise Failed("rank %d: the last step's loss is %s" % (rank, loss.item()))
        rep = {"rank": rank, "start": start, "end": end, "examples": examples}
        if rank == 0:
            xt, yt = fmnist.load(cfg["data_dir"], "test")
            rep["test_acc"] = fmnist.evaluate(model, xt, yt)
        if nproc > 1:
            dist.barrier()  # no rank leaves while another still needs the group
            dist.destroy_process_group()
        conn.send(rep)
    except BaseException:
        conn.send({"rank": rank, "error": traceback.format_exc()})
    finally:
        conn.close()


# ---- The launcher ----

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(nproc, steps, timeout=TIMEOUT_S):
    """Starts nproc fresh processes (DDP when nproc > 1), waits for all of
    them (at most timeout seconds), kills the rest by PID when one fails, and
    returns the measurement."""
    import multiprocessing as mp

    cfg = job()
    # Before the children import torch: their OpenMP, OpenBLAS and MKL pools
    # get one thread, and gloo the loopback interface.
    for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[k] = "1"
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    ctx = mp.get_context("spawn")
    port = _free_port() if nproc > 1 else 0
    procs, conns, reports = [], [], {}
    try:
        for rank in range(nproc):
            recv, send = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_train, args=(rank, nproc, steps, port, cfg, send),
                            name="bench-torch-rank%d" % rank, daemon=True)
            p.start()
            send.close()  # the child's end; EOF here once the child is gone
            procs.append(p)
            conns.append(recv)
        deadline = time.monotonic() + timeout
        while len(reports) < nproc:
            if time.monotonic() > deadline:
                raise Failed("%d of %d processes did not finish within %ds"
                             % (nproc - len(reports), nproc, timeout))
            for rank, c in enumerate(conns):
                if rank in reports or not c.poll(0.05):
                    continue
                try:
                    rep = c.recv()
                except EOFError:
                    procs[rank].join(5)
                    raise Failed("rank %d exited %s without a report"
                                 % (rank, procs[rank].exitcode))
                if "error" in rep:
                    raise Failed("rank %d failed:\n%s" % (rank, rep["error"]))
                reports[rank] = rep
        for p in procs:
            p.join(30)
            if p.exitcode != 0:
                raise Failed("%s exited %s after its report" % (p.name, p.exitcode))
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()  # SIGKILL to that child's own PID
                p.join(10)
        for c in conns:
            c.close()
    reps = [reports[r] for r in range(nproc)]
    examples = sum(r["examples"] for r in reps)
    seconds = max(r["end"] for r in reps) - min(r["start"] for r in reps)
    if seconds <= 0:
        raise Failed("a span of %g s from the reports %s" % (seconds, reps))
    return {"examples": examples, "seconds": seconds, "rate": examples / seconds,
            "test_acc": reps[0]["test_acc"], "procs": nproc, "steps": steps}


def run_single(steps=STEPS):
    """One PyTorch process training the MLP on the whole training set for
    `steps` steps: {"examples", "seconds", "rate", "test_acc", ...}."""
    return _run(1, steps)


def run_ddp(steps=STEPS, nproc=2):
    """DDP over gloo, nproc processes on loopback, each on its share of the
    training set for `steps` steps: the same dict, examples and seconds
    covering all of them."""
    if nproc < 2:
        raise ValueError("DDP needs nproc >= 2, not %d" % nproc)
    return _run(nproc, steps)


# ---- The psd contender: pslaunch, 2 shards, nproc Python workers ----

def psd_spec(path, steps, nproc, nshards=2):
    """Writes the psd contender's spec to path: deploy/examples/torch-mlp.json
    (async) with the baselines' model, batch, optimizer, seed and data
    (job()), nshards psd and nproc workers on free loopback ports, each
    worker stopping after `steps` steps (job.max_steps; job.epochs is more
    than they need), deploy/examples/torch/train.py as its worker_command.
    Returns the spec's dict."""
    with open(os.path.join(EXAMPLES, "torch-mlp.json")) as f:
        spec = json.load(f)
    cfg = job()
    per_worker = 60000 // nproc  # Fashion-MNIST's training set, shared
    j = spec["job"]
    j.update({"model": "mlp", "hidden": cfg["hidden"], "batch_size": cfg["batch"],
              "optimizer": {"type": "momentum", "lr": cfg["lr"], "momentum": cfg["momentum"]},
              "seed": cfg["seed"], "data_dir": cfg["data_dir"], "max_steps": steps,
              "epochs": steps * cfg["batch"] // per_worker + 2, "log_every": steps,
              "worker_command": ["/usr/bin/python3", os.path.join(EXAMPLES, "torch", "train.py")]})
    socks = []
    try:  # every port held until all are picked: no two alike
        for _ in range(nshards + nproc):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        ports = [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()
    spec["cluster"] = {"ps": ["127.0.0.1:%d" % p for p in ports[:nshards]],
                       "worker": ["127.0.0.1:%d" % p for p in ports[nshards:]]}
    with open(path, "w") as f:
        json.dump(spec, f, indent=2)
    return spec


def _kv(line):
    return dict(re.findall(r"(\w+)=([\w.]+)", line))


def _python_env(build):
    """The environment of a psd Python process: the package from the build,
    one BLAS/OpenMP thread (as the baselines' processes)."""
    env = dict(os.environ)
    pp = os.path.join(os.path.abspath(build), "worker", "python")
    env["PYTHONPATH"] = pp + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[k] = "1"
    env["PSD_TORCH_THREADS"] = "1"
    env.setdefault("GRPC_DNS_RESOLVER", "native")
    return env


def _run_bounded(argv, env, timeout):
    """Runs argv to its end, at most timeout seconds (then SIGTERM to its
    PID, SIGKILL 20 s later: pslaunch stops its own children on SIGTERM);
    returns (exit status, merged output)."""
    try:
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, env=env, text=True)
    except OSError as e:
        raise Failed("cannot run %s: %s" % (" ".join(argv), e))
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.terminate()
        try:
            out, _ = p.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
        raise Failed("%s ran past %ds (stopped); its output ends:\n%s"
                     % (" ".join(argv), timeout, (out or "")[-2000:]))
    return p.returncode, out


def run_psd(steps, nproc, build, tmpdir, timeout=TIMEOUT_S):
    """The psd contender: `pslaunch SPEC` (psd_spec: 2 shards, nproc
    train.py workers, `steps` steps each). Its rate is pslaunch's job: line,
    which ps:0's coordinator counts from the workers' reports as they leave
    (every worker's examples over the first step of any to the last step of
    any); it must cover every worker, and its examples must be the sum of
    the workers' final: lines. The same dict as run_*, test_acc worker 0's
    (the baselines': rank 0's), test_accs every worker's."""
    spec = os.path.join(tmpdir, "bench-torch-psd.json")
    psd_spec(spec, steps, nproc)
    argv = [os.path.join(build, "deploy", "pslaunch"), spec]
    rc, out = _run_bounded(argv, _python_env(build), timeout)
    lines = out.splitlines()
    if rc != 0:
        raise Failed("%s exited %d; its output ends:\n%s" % (" ".join(argv), rc, out[-2000:]))
    jl = [l for l in lines if l.startswith("job:")]
    finals = {}
    for l in lines:
        if "final:" in l:
            f = _kv(l.split("final:", 1)[1])
            finals[int(f["worker"])] = f
    if not jl or sorted(finals) != list(range(nproc)):
        raise Failed("%s printed %s job: line and final: lines of workers %s, not 0..%d; "
                     "its output ends:\n%s" % (" ".join(argv), "a" if jl else "no",
                                                sorted(finals), nproc - 1, out[-2000:]))
    j = _kv(jl[-1])
    examples = int(float(j["examples"]))
    want = sum(int(f["examples"]) for f in finals.values())
    if int(j["reported"]) != nproc or examples != want or \
            any(int(f["steps"]) != steps for f in finals.values()):
        raise Failed("%s: job line %r covers %s workers and %d examples; the final: lines "
                     "say %d examples, steps %s (want %d workers, %d steps each)"
                     % (" ".join(argv), jl[-1], j["reported"], examples, want,
                        [f["steps"] for f in finals.values()], nproc, steps))
    accs = [float(finals[i]["test_acc"]) for i in range(nproc)]
    return {"examples": examples, "seconds": float(j["wall_s"]),
            "rate": float(j["examples_per_s"]), "test_acc": accs[0], "test_accs": accs,
            "procs": nproc, "steps": steps, "mode": finals[0].get("mode", "?")}


# ---- The Python client against the C client: one variable's bytes ----

CLIENT_BYTES = 16 << 20  # the variable: 4M floats
CLIENT_ROUNDS = 32       # timed pushes and pulls per measurement
CLIENT_REPEATS = 7       # measurements of each client, alternated
GOAL_PY_C = 0.9          # the Python client's MB/s over the C client's, the goal


def _client_once(argv, env, prefix):
    rc, out = _run_bounded(argv, env, 120)
    got = [l for l in out.splitlines() if l.startswith(prefix)]
    if rc != 0 or not got:
        raise Failed("%s exited %d%s; its output ends:\n%s" % (
            " ".join(argv), rc, "" if got else " with no %r line" % prefix, out[-2000:]))
    kv = _kv(got[-1])
    return float(kv["push_MBps"]), float(kv["pull_MBps"]), kv.get("via", "")


def clients(build, tmpdir, nbytes=CLIENT_BYTES, nrounds=CLIENT_ROUNDS,
            repeats=CLIENT_REPEATS, out=sys.stdout):
    """One psd shard (sgd); a variable of nbytes split across it, pushed
    and pulled nrounds times from C (`pstool roundtrip`, libpsclient) and
    from Python (client_bench.py: psd.Client.push/.pull of preallocated
    numpy arrays), each a fresh process, alternated `repeats` times (order
    rotated); prints each client's median MB/s and the Python/C ratios
    (within a repeat, then the median) against the goal."""
    sys.path.insert(0, os.path.join(HERE, "..", "integration"))
    import harness as h

    spec = os.path.join(tmpdir, "bench-torch-client.json")
    h.write_spec(spec, nps=1, nworker=1, job={"name": "bench-client",
                                              "optimizer": {"type": "sgd", "lr": 0.01}})
    env = _python_env(build)
    c_argv = [os.path.join(build, "tests", "pstool"), "--cluster", spec, "--bytes",
              str(nbytes), "--rounds", str(nrounds), "roundtrip"]
    py_argv = ["/usr/bin/python3", os.path.join(HERE, "client_bench.py"), "--cluster", spec,
               "--bytes", str(nbytes), "--rounds", str(nrounds)]
    runs = [("c", lambda: _client_once(c_argv, env, "roundtrip")),
            ("python", lambda: _client_once(py_argv, env, "pyclient"))]
    shard = h.Proc([os.path.join(build, "ps-server", "psd"), "--cluster", spec,
                    "--task", "ps:0"], env=env)
    got = {"c": [], "python": []}
    try:
        try:
            shard.wait_for("ready: listening on")
        except AssertionError as e:
            raise Failed("the client bench's psd did not get ready: %s" % e)
        for i in range(repeats):
            for name, fn in runs[i % 2:] + runs[:i % 2]:
                got[name].append(fn())
    finally:
        rc = shard.stop()
    if rc != 0:
        raise Failed("the client bench's psd exited %s:\n%s" % (rc, shard.output()[-2000:]))
    via = got["c"][0][2] or "?"
    med = {n: (median([r[0] for r in got[n]]), median([r[1] for r in got[n]])) for n in got}
    push_q = median([p[0] / c[0] for p, c in zip(got["python"], got["c"])])
    pull_q = median([p[1] / c[1] for p, c in zip(got["python"], got["c"])])
    for n in ("c", "python"):
        out.write("bench torch client=%s bytes=%d shards=1 via=%s rounds=%d repeats=%d "
                  "push_MBps=%.0f pull_MBps=%.0f%s\n"
                  % (n, nbytes, via, nrounds, repeats, med[n][0], med[n][1],
                     " push_ratio_to_c=%.2f pull_ratio_to_c=%.2f" % (push_q, pull_q)
                     if n == "python" else ""))
    worst = min(push_q, pull_q)
    out.write("bench torch goal python/c push=%.2f pull=%.2f (goal >= %.1f): %s\n"
              % (push_q, pull_q, GOAL_PY_C, "met" if worst >= GOAL_PY_C else "NOT met"))
    out.flush()
    return got


def contenders(build=None, tmpdir=None):
    """The contenders: (name, function of (steps, nproc) returning run_*'s
    dict); psd only with a build directory (and a scratch directory)."""
    got = [
        ("torch_single", lambda steps, nproc: run_single(steps)),
        ("torch_ddp", lambda steps, nproc: run_ddp(steps, nproc)),
    ]
    if build:
        got.append(("psd", lambda steps, nproc: run_psd(steps, nproc, build, tmpdir)))
    return got


CONTENDERS = contenders()


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


GOAL_DDP = 1.2  # psd's examples/s over DDP's, the goal


def _extra(r):
    """The fields a measurement line adds for psd."""
    if "test_accs" not in r:
        return ""
    return " mode=%s test_acc_workers=%s" % (
        r["mode"], ",".join("%.4f" % a for a in r["test_accs"]))


def rounds(steps=STEPS, nrounds=ROUNDS, nproc=2, contenders=None, out=sys.stdout):
    """Runs every contender once per round, the order rotated each round,
    printing a line per measurement, then the summary lines (and psd's
    ratio to DDP against the goal); returns {name: [dict per round]}.
    Raises Failed on the first failure."""
    contenders = contenders or CONTENDERS
    batch = job()["batch"]
    got = {name: [] for name, _ in contenders}
    for i in range(nrounds):
        k = i % len(contenders)
        for name, fn in contenders[k:] + contenders[:k]:
            r = fn(steps, nproc)
            got[name].append(r)
            out.write("bench torch round=%d contender=%s procs=%d steps=%d examples=%d "
                      "seconds=%.2f examples_per_s=%.0f test_accuracy=%.4f%s\n"
                      % (i + 1, name, r["procs"], steps, r["examples"], r["seconds"],
                         r["rate"], r["test_acc"], _extra(r)))
            out.flush()

    def ratio(a, b):  # within each round, then the median
        return median([x["rate"] / y["rate"] for x, y in zip(got[a], got[b])])

    base = contenders[0][0]
    for name, _ in contenders:
        rs = got[name]
        line = ("bench torch contender=%s procs=%d rounds=%d steps=%d batch=%d "
                "examples_per_s=%.0f test_accuracy=%.4f"
                % (name, rs[0]["procs"], nrounds, steps, batch, median([r["rate"] for r in rs]),
                   median([r["test_acc"] for r in rs])))
        if name != base:
            line += " ratio_to_%s=%.2f" % (base, ratio(name, base))
        if name == "psd" and "torch_ddp" in got:
            line += " ratio_to_torch_ddp=%.2f" % ratio("psd", "torch_ddp")
        out.write(line + "\n")
        out.flush()
    if "psd" in got and "torch_ddp" in got:
        q = ratio("psd", "torch_ddp")
        out.write("bench torch goal psd/torch_ddp=%.2f (goal >= %.1f): %s\n"
                  % (q, GOAL_DDP, "met" if q >= GOAL_DDP else "NOT met"))
        out.flush()
    return got


def bench(d, b):
    """bench.py's part `torch` (d: its scratch directory, b: bench.py's
    module, whose BenchFailed reports the failure and whose harness h.BUILD
    is the build directory)."""
    why = missing()
    if why:
        raise b.BenchFailed("bench torch FAILED: %s (make bench installs it)" % why)
    try:
        rounds(contenders=contenders(b.h.BUILD, d))
        clients(b.h.BUILD, d)
    except Failed as e:
        raise b.BenchFailed("bench torch FAILED: %s" % e)


def main():
    ap = argparse.ArgumentParser(description="bench torch: psd's Python client against "
                                 "PyTorch (tests/bench/bench_torch.py)")
    ap.add_argument("--steps", type=int, default=STEPS, help="steps per process (%d)" % STEPS)
    ap.add_argument("--rounds", type=int, default=ROUNDS, help="rounds (%d)" % ROUNDS)
    ap.add_argument("--nproc", type=int, default=2, help="DDP processes and psd workers (2)")
    ap.add_argument("--build", help="psd's build directory: adds the psd contender")
    args = ap.parse_args()
    if args.steps < 1 or args.rounds < 1 or args.nproc < 2:
        ap.error("--steps and --rounds take integers >= 1, --nproc >= 2")
    why = missing()
    if why:
        sys.stderr.write("bench torch: SKIP: %s\n" % why)
        return EXIT_SKIP
    try:
        with tempfile.TemporaryDirectory(prefix="psd-bench-torch-") as d:
            rounds(args.steps, args.rounds, args.nproc, contenders(args.build, d))
            if args.build:
                clients(args.build, d)
    except Failed as e:
        sys.stderr.write("bench torch FAILED: %s\n" % e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
