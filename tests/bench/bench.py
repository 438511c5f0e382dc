"""make bench: psd's figures, each against a baseline measured in the same run
(the machines are shared and noisy, so ratios matter more than absolutes).

  bench transport: push and pull of one variable between 1 psd and 1 client
                   (libpsclient, chunked, loopback gRPC) vs a plain loopback TCP
                   copy of the same bytes
  bench train:     the demo job (2 psd + 2 dworker, async) vs one process
                   training the same model on the same data (dworker --standalone)

Run: /usr/bin/python3 tests/bench/bench.py BUILD_DIR"""
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


def main():
    h.BUILD = os.path.abspath(sys.argv[1])
    with tempfile.TemporaryDirectory(prefix="psd-bench-") as d:
        transport(d)
        train(d)


if __name__ == "__main__":
    main()
