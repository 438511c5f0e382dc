"""make bench: psd's figures, each against a baseline measured in the same run
(the machines are shared and noisy, so ratios matter more than absolutes).

  bench transport: push and pull of one variable between 1 psd and 1 client
                   (libpsclient, chunked, loopback gRPC) vs a plain loopback TCP
                   copy of the same bytes
  bench aggregate: 2 shards and 2 clients at once, 64 MiB each, over TCP and
                   over the Unix sockets, against one loopback TCP stream
  bench memory:    a psd's resident memory against the bytes of the
                   variables and optimizer slots it holds
  bench scale:     sync step time of light clients (no model compute) against
                   2 shards as their number grows from 1 to 32
  bench train:     the demo job (2 psd + 2 dworker, async; its rate from
                   pslaunch's job: line) vs one process training the same model
                   on the same data (dworker --standalone) and vs PyTorch, one
                   process and DDP (gloo, 2 processes), the same MLP, data,
                   batch, optimizer and epochs (tests/bench/torch_baseline.py);
                   alternated over 3 rounds, medians and per-round ratios
  bench sync:      sync step time with 4 workers: no straggler, one worker 5x
                   slower behind a plain barrier (k = 4), and the same with a
                   backup worker (k = 3), as ratios to the no-straggler time
  bench optim:     each optimizer update's GB/s (every byte read and written)
                   on 64 MiB of f32 values, against a triad a = b + s*c and
                   an in-place axpy a = a + s*c on arrays of the same size,
                   each measured right before the update, one thread
                   (BUILD/tests/optim-bench)

  bench sparse:    embedding-table rows per second pulled and pushed
                   (adagrad) by 2 clients against 2 shards, batches of 1,024
                   Zipf ids and of 106,496 (4,096 examples x 26 fields), a
                   table of 10 million rows, dim 16 and 64, vs the same work
                   in one process on psd's table code with no network
                   (sparse-mem, the same batches); and the rows' memory
                   overhead

  bench torch:     psd's Python client (psd.torch.DistributedOptimizer, pslaunch,
                   2 shards and 2 workers, async) against PyTorch in one process
                   and DDP (gloo, 2 processes), the demo MLP, 2,000 steps per
                   process, alternated over 3 rounds; then psd.Client's push and
                   pull of a 16 MiB variable against the C client's (pstool
                   roundtrip), alternated (tests/bench/bench_torch.py)

  bench dlrm:      deploy/examples/torch-dlrm.json (pslaunch: 2 shards, 2 workers)
                   against the same DLRM in one PyTorch process (nn.EmbeddingBag,
                   sparse Adagrad), one epoch of psd-ctrgen's Criteo-format set,
                   alternated; examples/s, the ratio, rows pulled and pushed per
                   second, test AUCs against the goals (tests/bench/bench_dlrm.py)

  bench kernels:   GFLOP/s of each layer of the demo MLP and CNN, forward and
                   backward, on the CPU (and the GPU where one works), with the
                   ratio to a plain sgemm of the same (M, N, K) timed in the
                   same run (tests/bench/kernel_bench.c)

  bench multihost: the demo job (2 shards, 2 workers) and PyTorch DDP (gloo,
                   2 ranks), each process in its own network namespace with a
                   tbf-shaped link, at 1 and 10 Gbit/s: examples/s, test
                   accuracy, the bytes the links counted per step, psd's best
                   over DDP's (tests/bench/bench_multihost.py; a SKIP line
                   where namespaces cannot be made)

  bench serve:     online learning (docs/serving.md): a row's change on a
                   training shard to its answer from a serving replica, at a
                   2 s publish interval; rows/s one serving shard looks up
                   for 2 load processes against psd's table in one process;
                   a serving task's memory against its training shard's for
                   the same rows; a drifting stream scored through the
                   serving tier with updates against frozen after its first
                   part (tests/bench/bench_serve.py)

  bench reshard:   psd --reshard of a 2-shard checkpoint (1M rows of dim 16
                   with adagrad state, 4 MiB of adam-trained dense) onto 3
                   shards: rows/s and bytes/s against one client pulling the
                   same rows and variable from the 3 live shards, alternated;
                   the downtime a job sees (stop, reshard, start) against a
                   plain 2 -> 2 restart (tests/bench/bench_reshard.py); then
                   psctl reshard 2 -> 3 -> 2 live under a stepping client: the
                   pause, the cut, the client's slowest step, against the
                   same rows pulled (tests/bench/bench_live.py)

  bench checkpoint: a checkpoint of that job's 1M rows written while a
                   client steps on them: the client's slowest step and the
                   shards' pushes held, full and delta, against its steps
                   with no checkpoint (tests/bench/bench_ckpt.py)


Run: /usr/bin/python3 tests/bench/bench.py BUILD_DIR [transport|aggregate|memory|train|sync|scale|optim|kernels|sparse|torch|dlrm|multihost|serve|reshard|checkpoint ...]
(docs/performance.md says how to read each figure)

Exit status: 0 when every part ran; 1 when any failed (a process that exited
non-zero or ran past its time, a missing result line, an accounting
mismatch): each failure is said on stderr with the part, the command and the
tail of its output, and the other parts still run; 2 on a bad command line."""
import contextlib
import gzip
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import harness as h  # noqa: E402
import bench_ckpt  # noqa: E402
import bench_dlrm  # noqa: E402
import bench_multihost  # noqa: E402
import bench_live  # noqa: E402
import bench_move  # noqa: E402
import bench_reshard  # noqa: E402
import bench_serve  # noqa: E402
import bench_sparse  # noqa: E402
import bench_torch  # noqa: E402
import bench_transport  # noqa: E402

SIZES = [(4096, 400), (1 << 20, 60), (16 << 20, 12), (64 << 20, 4)]
REPEATS = 3  # interleaved repeats per size; medians are printed
TRAIN_ROUNDS = 3  # bench train's rounds of every run, alternated
RUN_TIMEOUT_S = 600  # the longest any one command of a part may take


class BenchFailed(Exception):
    """A part failed; the message names the part, the command, how it ended
    and the tail of its output. main() says it, goes on with the other
    parts and exits 1 at the end."""


def text(b):
    """A TimeoutExpired's output, which may be bytes or None."""
    if isinstance(b, bytes):
        return b.decode(errors="replace")
    return b or ""


def fail(part, argv, why, out):
    raise BenchFailed("bench %s FAILED: %s %s; its output ends:\n%s"
                      % (part, " ".join(argv), why, out[-2000:]))


def run_ok(part, argv, timeout=RUN_TIMEOUT_S):
    """Runs argv to its end; its result, or BenchFailed when it runs past
    timeout (subprocess.run kills it) or exits non-zero."""
    try:
        r = h.run(argv, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        fail(part, argv, "ran past %ds (killed)" % timeout, text(e.stdout) + text(e.stderr))
    if r.returncode != 0:
        fail(part, argv, "exited %d" % r.returncode, r.stdout + r.stderr)
    return r


def wait_all_ok(part, clients, timeout=RUN_TIMEOUT_S):
    """Waits for every one of clients (harness Procs) to exit 0, failing as
    soon as one exits non-zero or the time is up; procs() then stops the
    others by PID."""
    deadline = time.monotonic() + timeout
    while True:
        running = [p for p in clients if p.p.poll() is None]
        for p in clients:
            if p.p.returncode not in (None, 0):
                p.wait(timeout=10)  # its last lines
                fail(part, p.argv, "exited %d" % p.p.returncode, p.output())
        if not running:
            break
        if time.monotonic() > deadline:
            fail(part, running[0].argv, "ran past %ds (killed)" % timeout,
                 running[0].output())
        time.sleep(0.05)
    for p in clients:
        p.wait(timeout=10)  # joins the thread that reads its output


def line_kv(part, argv, lines, prefix):
    """The fields of the last of lines that starts with prefix."""
    got = [l for l in lines if l.startswith(prefix)]
    if not got:
        fail(part, argv, "printed no %r line" % prefix, "\n".join(lines))
    return kv(got[-1])


@contextlib.contextmanager
def procs(part):
    """A list for the processes a part starts (harness Procs). On the way
    out every one still running is stopped (SIGTERM, then SIGKILL, by PID),
    the last started first; when the part itself went well, one that did not
    exit 0 fails it (a psd exits 0 on SIGTERM)."""
    started = []
    try:
        yield started
    finally:
        rcs = [(p, p.stop()) for p in reversed(started)]
    for p, rc in rcs:
        if rc != 0:
            fail(part, p.argv, "exited %s" % rc, p.output())


def start_psd(part, started, spec, index):
    """Starts shard `index` of spec (added to started) and waits for its
    readiness line."""
    p = h.Proc([h.build_path("ps-server", "psd"), "--cluster", spec, "--task", "ps:%d" % index])
    started.append(p)
    try:
        p.wait_for("ready: listening on")
    except AssertionError as e:
        fail(part, p.argv, "did not get ready", str(e))
    return p


def pstool(spec, *args):
    return [h.build_path("tests", "pstool"), "--cluster", spec] + list(args)


def psctl_status(part, spec):
    argv = [h.build_path("ps-server", "psctl"), "--cluster", spec, "--json", "status"]
    r = run_ok(part, argv)
    try:
        return json.loads(r.stdout)
    except ValueError as e:
        fail(part, argv, "printed no JSON (%s)" % e, r.stdout)


def kv(line):
    return dict(re.findall(r"(\w+)=([\w.]+)", line))


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def memory(d):
    """A psd's resident memory against the bytes of variables and slots it holds."""
    spec = os.path.join(d, "mem.json")
    h.write_spec(spec, nps=1, nworker=1,
                 job={"name": "bench-mem", "optimizer": {"type": "momentum"}})
    with procs("memory") as started:
        ps = start_psd("memory", started, spec, 0)
        idle = rss_kib(ps.p.pid)
        run_ok("memory", pstool(spec, "--bytes", str(256 << 20), "--rounds", "2", "roundtrip"))
        rss = rss_kib(ps.p.pid)
        st = psctl_status("memory", spec)
        held = sum(v["bytes"] for v in st["shards"][0]["vars"])
        print("bench memory held_MiB=%.1f rss_MiB=%.1f idle_rss_MiB=%.1f "
              "ratio=%.3f ratio_above_idle=%.3f"
              % (held / 2**20, rss / 1024, idle / 1024, rss * 1024 / held,
                 (rss - idle) * 1024 / held), flush=True)


def scale(d):
    """Light sync clients (no model compute) against 2 shards: step time as n
    grows to 64, and pushes applied per second as a ratio to those at 8
    workers (the issue's 32 / 8 figure). On a machine with few cores the
    clients compete with the shards for them: tests/bench/scale_curve.py
    splits the CPU between the two, and steps-bench's lines give a shard's
    own staging and commit per push, in CPU time."""
    steps = 100
    base = None
    at8 = None
    for n in (1, 2, 4, 8, 16, 32, 64):
        spec = os.path.join(d, "scale%d.json" % n)
        h.write_spec(spec, nps=2, nworker=n,
                     job={"name": "bench-scale", "optimizer": {"type": "momentum"},
                          "sync": {"mode": "sync"}, "heartbeat_ms": 1000,
                          "dead_after_ms": 60000})
        with procs("scale") as started:
            for i in range(2):
                start_psd("scale", started, spec, i)
            clients = []
            for i in range(n):
                clients.append(h.Proc(pstool(spec, "--worker", str(i), "--rounds", str(steps),
                                             "--timeout", "120000", "syncload")))
                started.append(clients[-1])
            wait_all_ok("scale", clients, timeout=900)
            walls = []
            for p in clients:
                walls.append(float(line_kv("scale", p.argv, p.lines, "syncload")["wall_s"]))
            st = psctl_status("scale", spec)["shards"]
        wall = max(walls)
        step_ms = 1000.0 * wall / steps
        base = base or step_ms
        pushes = sum(s["pushes"] for s in st)
        if n == 8:
            at8 = pushes / wall
        print("bench scale workers=%d shards=2 step_ms=%.2f ratio=%.2f pushes_per_s=%.0f%s"
              % (n, step_ms, step_ms / base, pushes / wall,
                 " pushes_ratio_to_8=%.2f" % (pushes / wall / at8) if at8 else ""),
              flush=True)
    # A shard's staging and commit alone, in CPU time (steps-bench): its cost
    # per push at 64 workers against at 8, without the clients or the network.
    r = run_ok("scale", [h.build_path("tests", "steps-bench"), "8", "64"])
    for line in r.stdout.splitlines():
        if line.startswith("bench steps"):
            print(line, flush=True)


def final_line(out):
    for line in reversed(out.splitlines()):
        if "final:" in line:
            return kv(line.split("final:", 1)[1])
    return None


def training_set_size(data_dir):
    """The examples in the training set: the count in the labels file's IDX
    header (60000 for Fashion-MNIST)."""
    with gzip.open(os.path.join(data_dir, "train-labels-idx1-ubyte.gz"), "rb") as f:
        return struct.unpack(">II", f.read(8))[1]


def check_examples(part, argv, out, examples, want):
    """The accounting: a run's examples must be epochs x the training set."""
    if examples != want:
        fail(part, argv, "counted %d training examples, not epochs x training set = %d"
             % (examples, want), out)


def train_job(argv, want):
    """One demo job run by pslaunch: its rate is the job: line's (every
    worker's examples over first step of any worker to last step of any)."""
    t0 = time.monotonic()
    r = run_ok("train", argv)
    wall = time.monotonic() - t0
    j = line_kv("train", argv, r.stdout.splitlines(), "job:")
    if j.get("reported") != j.get("workers"):
        fail("train", argv, "job: line covers %s of %s workers"
             % (j.get("reported"), j.get("workers")), r.stdout)
    check_examples("train", argv, r.stdout, int(float(j["examples"])), want)
    f = final_line(r.stdout)
    if f is None:
        fail("train", argv, "printed no final: line", r.stdout)
    return {"rate": float(j["examples_per_s"]), "acc": float(f["test_accuracy"]),
            "train_s": float(j["wall_s"]), "wall_s": wall}


def train_standalone(argv, want):
    """dworker --standalone: its own rate, worker_examples_per_s."""
    r = run_ok("train", argv)
    f = final_line(r.stdout)
    if f is None or "worker_examples_per_s" not in f:
        fail("train", argv, "printed no final: line with worker_examples_per_s",
             r.stdout + r.stderr)
    check_examples("train", argv, r.stdout, int(f["examples"]), want)
    return {"rate": float(f["worker_examples_per_s"]), "acc": float(f["test_accuracy"]),
            "train_s": float(f["wall_s"])}


def train_torch(argv, want):
    """tests/bench/torch_baseline.py, one process or DDP: its torch: line."""
    r = run_ok("train", argv)
    t = line_kv("train", argv, r.stdout.splitlines(), "torch:")
    check_examples("train", argv, r.stdout, int(t["examples"]), want)
    return {"rate": float(t["examples_per_s"]), "acc": float(t["test_accuracy"]),
            "train_s": float(t["wall_s"])}


def train(d):
    """The demo job as shipped (Unix sockets, push and next pull together),
    and with each lever off, against one process training the same model
    (dworker --standalone) and against PyTorch (one process; DDP over gloo,
    2 processes), the same model, data, batch, optimizer and epochs. Every
    run once per round, in an order rotated each round; medians over the
    rounds, and each ratio taken within a round."""
    with open(os.path.join(HERE, "..", "..", "deploy", "examples", "local.json")) as f:
        base = json.load(f)
    job = base["job"]
    spec = os.path.join(d, "train.json")
    cfg = h.write_spec(spec, nps=2, nworker=2, job=dict(job, log_every=100000))
    cfg["job"]["unix_sockets"] = False
    tcp_spec = os.path.join(d, "train-tcp.json")
    with open(tcp_spec, "w") as f:
        json.dump(cfg, f)
    cfg["job"]["unix_sockets"] = True
    cfg["job"]["wire_dtype"] = "bf16"
    bf16_spec = os.path.join(d, "train-bf16.json")
    with open(bf16_spec, "w") as f:
        json.dump(cfg, f)
    noov = os.path.join(d, "dworker-no-overlap")
    with open(noov, "w") as f:
        f.write("#!/bin/sh\nexec %s --no-overlap \"$@\"\n" % h.build_path("worker", "dworker"))
    os.chmod(noov, 0o755)
    want = job["epochs"] * training_set_size(job["data_dir"])
    pslaunch = h.build_path("deploy", "pslaunch")
    torch = [sys.executable, os.path.join(HERE, "torch_baseline.py"), "--spec", spec,
             "--epochs", str(job["epochs"]), "--threads", "1", "--timeout",
             str(RUN_TIMEOUT_S - 30), "--mode"]
    runs = [
        ("demo", lambda: train_job([pslaunch, spec], want)),
        ("standalone", lambda: train_standalone(
            [h.build_path("worker", "dworker"), "--cluster", spec, "--standalone"], want)),
        ("torch_single", lambda: train_torch(torch + ["single"], want)),
        ("torch_ddp", lambda: train_torch(torch + ["ddp", "--procs", "2"], want)),
        ("tcp", lambda: train_job([pslaunch, tcp_spec], want)),
        ("no_overlap", lambda: train_job([pslaunch, "--dworker", noov, spec], want)),
        ("bf16", lambda: train_job([pslaunch, bf16_spec], want)),
    ]
    variants = ("demo", "tcp", "no_overlap", "bf16")
    baselines = ("standalone", "torch_single", "torch_ddp")
    rounds = []
    for i in range(TRAIN_ROUNDS):
        got = {}
        for name, fn in runs[i % len(runs):] + runs[:i % len(runs)]:
            got[name] = fn()
        rounds.append(got)
        print("bench train round=%d %s" % (i + 1, " ".join(
            "%s=%.0f" % (name, got[name]["rate"]) for name, _ in runs)), flush=True)

    def med(name, key):
        return median([r[name][key] for r in rounds])

    for name in baselines:
        print("bench train baseline=%s procs=%d threads=1 examples_per_s=%.0f "
              "test_accuracy=%.4f training_wall_s=%.1f"
              % (name, 2 if name == "torch_ddp" else 1, med(name, "rate"), med(name, "acc"),
                 med(name, "train_s")), flush=True)
    for name in variants:
        ratios = " ".join("ratio_to_%s=%.2f" % (b, median([r[name]["rate"] / r[b]["rate"]
                                                           for r in rounds]))
                          for b in baselines)
        print("bench train variant=%s workers=2 shards=2 batch=%d epochs=%d rounds=%d "
              "examples=%d examples_per_s=%.0f test_accuracy=%.4f training_wall_s=%.1f "
              "job_wall_s=%.1f %s"
              % (name, job["batch_size"], job["epochs"], len(rounds), want, med(name, "rate"),
                 med(name, "acc"), med(name, "train_s"), med(name, "wall_s"), ratios),
              flush=True)


def sync_run(d, name, k, delay_ms, steps=150):
    spec = os.path.join(d, name + ".json")
    job = {"name": "bench-sync", "epochs": 1, "log_every": 100000, "batch_size": 64,
           "optimizer": {"type": "momentum", "lr": 0.02, "momentum": 0.9},
           "sync": {"mode": "sync", "replicas_to_aggregate": k}}
    h.write_spec(spec, nps=2, nworker=4, job=job)
    with procs("sync") as started:
        for i in range(2):
            start_psd("sync", started, spec, i)
        ws = []
        for i in range(4):
            extra = ["--max-steps", str(steps)]
            if i == 3 and delay_ms:
                extra += ["--inject-delay-ms", str(delay_ms)]
            ws.append(h.Proc([h.build_path("worker", "dworker"), "--cluster", spec, "--task",
                              "worker:%d" % i] + extra))
            started.append(ws[-1])
        wait_all_ok("sync", ws, timeout=900)
        res = [line_kv("sync", w.argv, w.lines, ("done:", "final:")) for w in ws]
    # A fast worker's time per step: what the job's step costs the others.
    return 1000.0 * float(res[0]["wall_s"]) / float(res[0]["steps"]), res


def sync(d):
    base, _ = sync_run(d, "base", 4, 0)
    # The straggler's own step takes about 5x a normal step.
    delay = max(1, int(round(4 * base)))
    barrier, _ = sync_run(d, "barrier", 4, delay)
    backup, res = sync_run(d, "backup", 3, delay)
    print("bench sync workers=4 shards=2 step_ms=%.2f straggler_delay_ms=%d "
          "barrier_k4_step_ms=%.2f barrier_ratio=%.2f backup_k3_step_ms=%.2f backup_ratio=%.2f "
          "straggler_dropped=%s/%s"
          % (base, delay, barrier, barrier / base, backup, backup / base,
             res[3]["dropped"], res[3]["steps"]), flush=True)


def optim(d):
    """The optimizer updates against a triad; optim-bench interleaves its
    repeats and prints the medians itself."""
    r = run_ok("optim", [h.build_path("tests", "optim-bench")])
    for line in r.stdout.splitlines():
        if line.startswith("bench optim"):
            print(line, flush=True)


def kernels(d):
    r = run_ok("kernels", [h.build_path("tests", "kernel_bench")])
    sys.stdout.write(r.stdout)
    sys.stdout.flush()


def main():
    me = sys.modules[__name__]
    parts = {"transport": lambda d: bench_transport.transport(d, me),
             "aggregate": lambda d: bench_transport.aggregate(d, me), "memory": memory,
             "train": train, "sync": sync, "scale": scale, "optim": optim,
             "kernels": kernels, "sparse": lambda d: bench_sparse.sparse(d, sys.modules[__name__]),
             "torch": lambda d: bench_torch.bench(d, sys.modules[__name__]),
             "dlrm": lambda d: bench_dlrm.dlrm(d, sys.modules[__name__]),
             "multihost": lambda d: bench_multihost.multihost(d, sys.modules[__name__]),
             "serve": lambda d: bench_serve.serve(d),
             "reshard": lambda d: (bench_reshard.reshard(d), bench_live.live(d),
                                   bench_move.move(d)),
             "checkpoint": lambda d: bench_ckpt.checkpoint(d, rounds=bench_ckpt.ROUNDS)}
    if len(sys.argv) < 2:
        sys.stderr.write("usage: bench.py BUILD_DIR [%s ...]\n" % "|".join(parts))
        return 2
    h.BUILD = os.path.abspath(sys.argv[1])
    # Every contender on this CPU's OpenBLAS kernels: psd and dworker pick
    # them themselves and pslaunch gives them to a worker_command, but the
    # PyTorch baselines would run Debian's generic fallback (common/base/
    # cpu.h: about a fifth of the sgemm speed here).
    core = h.blas_core()
    if core and not os.environ.get("OPENBLAS_CORETYPE"):
        os.environ["OPENBLAS_CORETYPE"] = core
        print("bench: OPENBLAS_CORETYPE=%s for every contender" % core, flush=True)
    chosen = sys.argv[2:] or list(parts)
    unknown = [p for p in chosen if p not in parts]
    if unknown:
        sys.stderr.write("bench: no part %s; the parts are %s\n"
                         % (", ".join(unknown), ", ".join(parts)))
        return 2
    failed = []
    with tempfile.TemporaryDirectory(prefix="psd-bench-") as d:
        for name in chosen:
            try:
                parts[name](d)
            except BenchFailed as e:
                sys.stdout.flush()
                sys.stderr.write("%s\n" % e)
                failed.append(name)
            except Exception:  # a bug or a surprise in a part: still a failure
                sys.stdout.flush()
                sys.stderr.write("bench %s FAILED:\n%s" % (name, traceback.format_exc()))
                failed.append(name)
            sys.stderr.flush()
    if failed:
        sys.stderr.write("bench: FAILED: %s (of %s)\n" % (" ".join(failed), " ".join(chosen)))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
