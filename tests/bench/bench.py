"""make bench: psd's figures, each against a baseline measured in the same run
(the machines are shared and noisy, so ratios matter more than absolutes).

  bench transport: push and pull of one variable between 1 psd and 1 client
                   (libpsclient, chunked, loopback gRPC) vs a plain loopback TCP
                   copy of the same bytes
  bench train:     the demo job (2 psd + 2 dworker, async) vs one process
                   training the same model on the same data (dworker --standalone)
  bench sync:      sync step time with 4 workers: no straggler, one worker 5x
                   slower behind a plain barrier (k = 4), and the same with a
                   backup worker (k = 3), as ratios to the no-straggler time

Run: /usr/bin/python3 tests/bench/bench.py BUILD_DIR [transport|train|sync ...]"""
import json
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
import harness as h  # noqa: E402

SIZES = [(4096, 400), (1 << 20, 100), (16 << 20, 16), (64 << 20, 6)]


def kv(line):
    return dict(re.findall(r"(\w+)=([\w.]+)", line))


def transport(d):
    spec = os.path.join(d, "bench.json")
    h.write_spec(spec, nps=1, nworker=1, job={"name": "bench", "optimizer": {"type": "sgd"}})
    ps = h.start_psd(spec, 0)
    try:
        for size, rounds in SIZES:
            r = h.pstool(spec, "--bytes", str(size), "--rounds", str(rounds), "roundtrip",
                         timeout=600)
            if r.returncode != 0:
                print("bench transport size=%d FAILED: %s" % (size, r.stderr.strip()))
                continue
            rt = kv(r.stdout)
            # The baseline moves the same total bytes, in one stream.
            t = h.run([h.build_path("tests", "pstool"), "--bytes", str(max(size, 1 << 20)),
                       "--rounds", str(max(rounds, 16)), "tcp"])
            tcp = float(kv(t.stdout)["MBps"])
            push, pull = float(rt["push_MBps"]), float(rt["pull_MBps"])
            print("bench transport size=%d push_MBps=%.0f pull_MBps=%.0f tcp_MBps=%.0f "
                  "push_ratio=%.2f pull_ratio=%.2f push_us=%s pull_us=%s"
                  % (size, push, pull, tcp, push / tcp, pull / tcp, rt["push_us"], rt["pull_us"]),
                  flush=True)
    finally:
        ps.stop()


def final_line(out):
    for line in reversed(out.splitlines()):
        if "final:" in line:
            return kv(line.split("final:", 1)[1])
    return None


def train(d):
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "deploy", "examples",
                           "local.json")) as f:
        base = json.load(f)
    spec = os.path.join(d, "train.json")
    h.write_spec(spec, nps=2, nworker=2, job=dict(base["job"], log_every=100000))
    single = h.run([h.build_path("worker", "dworker"), "--cluster", spec, "--task", "worker:0",
                    "--standalone"], timeout=900)
    s = final_line(single.stdout)
    job = h.run([h.build_path("worker", "pslaunch"), spec], timeout=900)
    j = final_line(job.stdout)
    if not s or not j:
        print("bench train FAILED:\n%s\n%s" % (single.stdout[-2000:], job.stdout[-2000:]))
        return
    se, je = float(s["examples_per_s"]), float(j["examples_per_s"])
    print("bench train workers=2 shards=2 batch=%d epochs=%d examples_per_s=%.0f "
          "single_process_examples_per_s=%.0f ratio=%.2f test_accuracy=%s "
          "single_process_test_accuracy=%s" % (base["job"]["batch_size"], base["job"]["epochs"],
                                               je, se, je / se,
                                               j["test_accuracy"], s["test_accuracy"]),
          flush=True)


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


def main():
    h.BUILD = os.path.abspath(sys.argv[1])
    parts = {"transport": transport, "train": train, "sync": sync}
    chosen = sys.argv[2:] or list(parts)
    with tempfile.TemporaryDirectory(prefix="psd-bench-") as d:
        for name in chosen:
            parts[name](d)


if __name__ == "__main__":
    main()
