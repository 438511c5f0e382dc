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
  bench train:     the demo job (2 psd + 2 dworker, async) vs one process
                   training the same model on the same data (dworker --standalone)
  bench sync:      sync step time with 4 workers: no straggler, one worker 5x
                   slower behind a plain barrier (k = 4), and the same with a
                   backup worker (k = 3), as ratios to the no-straggler time
  bench optim:     each optimizer update's GB/s (every byte read and written)
                   on 64 MiB of f32 values, against a triad a = b + s*c and
                   an in-place axpy a = a + s*c on arrays of the same size,
                   each measured right before the update, one thread
                   (BUILD/tests/optim-bench)

  bench kernels:   GFLOP/s of each layer of the demo MLP and CNN, forward and
                   backward, on the CPU (and the GPU where one works), with the
                   ratio to a plain sgemm of the same (M, N, K) timed in the
                   same run (tests/bench/kernel_bench.c)


Run: /usr/bin/python3 tests/bench/bench.py BUILD_DIR [transport|aggregate|memory|train|sync|scale|optim|kernels ...]
(docs/performance.md says how to read each figure)"""
import json
import os
import re
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
import harness as h  # noqa: E402

# PyTorch 1.13 DDP (gloo), 2 processes, the same MLP and batch, measured on
# this kind of machine (issue "Faster than the peers"); PyTorch is not a
# Debian package here, so it cannot be rerun in the same run.
PYTORCH_DDP_EXAMPLES_PER_S = 24600.0

SIZES = [(4096, 400), (1 << 20, 60), (16 << 20, 12), (64 << 20, 4)]
REPEATS = 3  # interleaved repeats per size; medians are printed


def kv(line):
    return dict(re.findall(r"(\w+)=([\w.]+)", line))


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def tcp_mbps(size, rounds):
    t = h.run([h.build_path("tests", "pstool"), "--bytes", str(max(size, 1 << 20)),
               "--rounds", str(max(rounds, 16)), "tcp"])
    return float(kv(t.stdout)["MBps"])


def transport(d):
    """gRPC over TCP (the spec's job.unix_sockets false, as between hosts) and
    over the shard's Unix socket (what a client on the same host picks), each
    against a loopback TCP stream of the same bytes."""
    spec = os.path.join(d, "bench.json")
    cfg = h.write_spec(spec, nps=1, nworker=1, job={"name": "bench", "optimizer": {"type": "sgd"}})
    cfg["job"]["unix_sockets"] = False
    tcp_spec = os.path.join(d, "bench-tcp.json")
    with open(tcp_spec, "w") as f:
        json.dump(cfg, f)
    ps = h.start_psd(spec, 0)
    try:
        for size, rounds in SIZES:
            res = {"tcp": ([], [], []), "unix": ([], [], [])}
            tcp = []
            for _ in range(REPEATS):
                for via, sp in (("tcp", tcp_spec), ("unix", spec)):
                    r = h.pstool(sp, "--bytes", str(size), "--rounds", str(rounds), "roundtrip",
                                 timeout=600)
                    if r.returncode != 0:
                        raise SystemExit("bench transport size=%d FAILED: %s" % (size, r.stderr))
                    rt = kv(r.stdout)
                    if rt.get("via") != via:
                        raise SystemExit("bench transport: wanted %s, pstool used %s"
                                         % (via, rt.get("via")))
                    res[via][0].append(float(rt["push_MBps"]))
                    res[via][1].append(float(rt["pull_MBps"]))
                    res[via][2].append(rt)
                tcp.append(tcp_mbps(size, rounds))
            for via in ("tcp", "unix"):
                push, pull, lat = res[via]
                line = ("bench transport size=%d via=%s push_MBps=%.0f pull_MBps=%.0f "
                        "tcp_MBps=%.0f push_ratio=%.2f pull_ratio=%.2f"
                        % (size, via, median(push), median(pull), median(tcp),
                           median(push) / median(tcp), median(pull) / median(tcp)))
                if size <= 4096:
                    line += (" pull_p50_us=%.0f pull_p99_us=%.0f push_p50_us=%.0f "
                             "push_p99_us=%.0f" % (
                                 median([float(x["pull_p50_us"]) for x in lat]),
                                 median([float(x["pull_p99_us"]) for x in lat]),
                                 median([float(x["push_p50_us"]) for x in lat]),
                                 median([float(x["push_p99_us"]) for x in lat])))
                print(line, flush=True)
    finally:
        ps.stop()


def aggregate(d):
    """2 shards and 2 clients at once, 64 MiB each, over TCP and over the Unix
    sockets, against one TCP stream."""
    spec = os.path.join(d, "agg.json")
    cfg = h.write_spec(spec, nps=2, nworker=2,
                       job={"name": "bench-agg", "optimizer": {"type": "sgd"}})
    cfg["job"]["unix_sockets"] = False
    tcp_spec = os.path.join(d, "agg-tcp.json")
    with open(tcp_spec, "w") as f:
        json.dump(cfg, f)
    ps = [h.start_psd(spec, i) for i in range(2)]
    size, rounds = 64 << 20, 4
    try:
        totals = {"tcp": [], "unix": []}
        for _ in range(REPEATS):
            for via, sp in (("tcp", tcp_spec), ("unix", spec)):
                procs = [h.Proc([h.build_path("tests", "pstool"), "--cluster", sp, "--bytes",
                                 str(size), "--rounds", str(rounds), "--worker", str(i),
                                 "roundtrip"]) for i in range(2)]
                rs = []
                for p in procs:
                    p.wait(timeout=600)
                    rs.append(kv([l for l in p.lines if l.startswith("roundtrip")][-1]))
                if any(r.get("via") != via for r in rs):
                    raise SystemExit("bench aggregate: wanted %s, got %s" % (via, rs))
                totals[via].append((sum(float(r["push_MBps"]) for r in rs),
                                    sum(float(r["pull_MBps"]) for r in rs)))
        tcp = tcp_mbps(size, rounds)
        for via in ("tcp", "unix"):
            push = median([t[0] for t in totals[via]])
            pull = median([t[1] for t in totals[via]])
            print("bench transport shards=2 clients=2 size=%d via=%s push_MBps=%.0f "
                  "pull_MBps=%.0f tcp_MBps=%.0f push_ratio=%.2f pull_ratio=%.2f"
                  % (size, via, push, pull, tcp, push / tcp, pull / tcp), flush=True)
    finally:
        for p in ps:
            p.stop()


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
    ps = h.start_psd(spec, 0)
    try:
        idle = rss_kib(ps.p.pid)
        r = h.pstool(spec, "--bytes", str(256 << 20), "--rounds", "2", "roundtrip", timeout=600)
        assert r.returncode == 0, r.stderr
        rss = rss_kib(ps.p.pid)
        st = json.loads(h.run([h.build_path("ps-server", "psctl"), "--cluster", spec, "--json",
                               "status"]).stdout)
        held = sum(v["bytes"] for v in st["shards"][0]["vars"])
        print("bench memory held_MiB=%.1f rss_MiB=%.1f idle_rss_MiB=%.1f "
              "ratio=%.3f ratio_above_idle=%.3f"
              % (held / 2**20, rss / 1024, idle / 1024, rss * 1024 / held,
                 (rss - idle) * 1024 / held), flush=True)
    finally:
        ps.stop()


def scale(d):
    """Light sync clients (no model compute) against 2 shards: step time as n grows."""
    steps = 100
    base = None
    for n in (1, 2, 4, 8, 16, 32):
        spec = os.path.join(d, "scale%d.json" % n)
        h.write_spec(spec, nps=2, nworker=n,
                     job={"name": "bench-scale", "optimizer": {"type": "momentum"},
                          "sync": {"mode": "sync"}, "heartbeat_ms": 1000,
                          "dead_after_ms": 60000})
        ps = [h.start_psd(spec, i) for i in range(2)]
        try:
            procs = [h.Proc([h.build_path("tests", "pstool"), "--cluster", spec, "--worker",
                             str(i), "--rounds", str(steps), "--timeout", "120000", "syncload"])
                     for i in range(n)]
            walls = []
            for p in procs:
                if p.wait(timeout=900) != 0:
                    raise SystemExit("bench scale n=%d FAILED:\n%s" % (n, p.output()[-2000:]))
                walls.append(float(kv([l for l in p.lines if l.startswith("syncload")][-1])
                                   ["wall_s"]))
            st = json.loads(h.run([h.build_path("ps-server", "psctl"), "--cluster", spec,
                                   "--json", "status"]).stdout)["shards"]
        finally:
            for p in ps:
                p.stop()
        wall = max(walls)
        step_ms = 1000.0 * wall / steps
        base = base or step_ms
        pushes = sum(s["pushes"] for s in st)
        print("bench scale workers=%d shards=2 step_ms=%.2f ratio=%.2f pushes_per_s=%.0f"
              % (n, step_ms, step_ms / base, pushes / wall), flush=True)


def final_line(out):
    for line in reversed(out.splitlines()):
        if "final:" in line:
            return kv(line.split("final:", 1)[1])
    return None


def train(d):
    """The demo job as shipped (Unix sockets, push and next pull together),
    and with each lever off, against one process training the same model;
    interleaved repeats, medians."""
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "deploy", "examples",
                           "local.json")) as f:
        base = json.load(f)
    spec = os.path.join(d, "train.json")
    cfg = h.write_spec(spec, nps=2, nworker=2, job=dict(base["job"], log_every=100000))
    cfg["job"]["unix_sockets"] = False
    tcp_spec = os.path.join(d, "train-tcp.json")
    with open(tcp_spec, "w") as f:
        json.dump(cfg, f)
    noov = os.path.join(d, "dworker-no-overlap")
    with open(noov, "w") as f:
        f.write("#!/bin/sh\nexec %s --no-overlap \"$@\"\n" % h.build_path("worker", "dworker"))
    os.chmod(noov, 0o755)
    variants = [("demo", [spec]), ("tcp", [tcp_spec]), ("no_overlap", ["--dworker", noov, spec])]
    res = {name: [] for name, _ in variants}
    single = []
    for _ in range(REPEATS):
        r = h.run([h.build_path("worker", "dworker"), "--cluster", spec, "--task", "worker:0",
                   "--standalone"], timeout=900)
        s = final_line(r.stdout)
        if not s:
            print("bench train FAILED (single process):\n%s" % r.stdout[-2000:])
            return
        single.append(s)
        for name, args in variants:
            t0 = time.monotonic()
            r = h.run([h.build_path("deploy", "pslaunch")] + args, timeout=900)
            j = final_line(r.stdout)
            if not j or r.returncode != 0:
                print("bench train FAILED (%s):\n%s" % (name, r.stdout[-2000:]))
                return
            j["job_wall_s"] = time.monotonic() - t0
            res[name].append(j)
    se = median([float(s["examples_per_s"]) for s in single])
    for name, _ in variants:
        je = median([float(j["examples_per_s"]) for j in res[name]])
        print("bench train variant=%s workers=2 shards=2 batch=%d epochs=%d examples_per_s=%.0f "
              "single_process_examples_per_s=%.0f ratio=%.2f test_accuracy=%.4f "
              "training_wall_s=%.1f job_wall_s=%.1f single_process_test_accuracy=%.4f "
              "ratio_to_pytorch_ddp=%.2f"
              % (name, base["job"]["batch_size"], base["job"]["epochs"], je, se, je / se,
                 median([float(j["test_accuracy"]) for j in res[name]]),
                 median([float(j["wall_s"]) for j in res[name]]),
                 median([j["job_wall_s"] for j in res[name]]),
                 median([float(s["test_accuracy"]) for s in single]),
                 je / PYTORCH_DDP_EXAMPLES_PER_S), flush=True)


def sync_run(d, name, k, delay_ms, steps=150):
    spec = os.path.join(d, name + ".json")
    job = {"name": "bench-sync", "epochs": 1, "log_every": 100000, "batch_size": 64,
           "optimizer": {"type": "momentum", "lr": 0.02, "momentum": 0.9},
           "sync": {"mode": "sync", "replicas_to_aggregate": k}}
    h.write_spec(spec, nps=2, nworker=4, job=job)
    ps = [h.start_psd(spec, i) for i in range(2)]
    try:
        ws = []
        for i in range(4):
            extra = ["--max-steps", str(steps)]
            if i == 3 and delay_ms:
                extra += ["--inject-delay-ms", str(delay_ms)]
            ws.append(h.Proc([h.build_path("worker", "dworker"), "--cluster", spec, "--task",
                              "worker:%d" % i] + extra))
        for w in ws:
            w.wait(timeout=900)
        res = [kv([l for l in w.lines if l.startswith(("done:", "final:"))][-1]) for w in ws]
    finally:
        for p in ps:
            p.stop()
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
    r = h.run([h.build_path("tests", "optim-bench")], timeout=600)
    if r.returncode != 0:
        raise SystemExit("bench optim FAILED:\n%s" % (r.stdout + r.stderr)[-2000:])
    for line in r.stdout.splitlines():
        if line.startswith("bench optim"):
            print(line, flush=True)


def kernels(d):
    r = h.run([h.build_path("tests", "kernel_bench")], timeout=600)
    sys.stdout.write(r.stdout)
    sys.stdout.flush()
    if r.returncode != 0:
        raise SystemExit("kernel_bench failed (exit %d): %s" % (r.returncode, r.stderr[-2000:]))


def main():
    h.BUILD = os.path.abspath(sys.argv[1])
    parts = {"transport": transport, "aggregate": aggregate, "memory": memory,
             "train": train, "sync": sync, "scale": scale, "optim": optim,
             "kernels": kernels}
    chosen = sys.argv[2:] or list(parts)
    with tempfile.TemporaryDirectory(prefix="psd-bench-") as d:
        for name in chosen:
            parts[name](d)


if __name__ == "__main__":
    main()
