#!/usr/bin/python3
"""Does pipelining help? psd.torch.EmbeddingBagCollection trained with and
without psd.torch.pipeline (the next batch's rows pulled while this batch
computes), alternated over rounds, medians (docs/python.md, "Pipelining").

Against 2 shards of its own (loopback), one worker: 26 categorical features
(Criteo's count; ids drawn Zipf-like from 1M-row tables, dim 16, adagrad
rows), a batch of 1,024, a small MLP (416 -> 128 -> 1) over the pooled
features (SGD through DistributedOptimizer), in async mode and in sync
mode. Prints, per mode:

  bench emb mode=async steps=N plain_step_ms=.. pipelined_step_ms=..
        speedup=.. plain_rows_per_s=.. pipelined_rows_per_s=..

rows_per_s: the unique rows pulled (and pushed) per second. A measurement,
not a test: nothing asserts a speed.

Run: /usr/bin/python3 tests/bench/bench_emb.py BUILD_DIR [steps] [rounds]"""
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import harness as h  # noqa: E402

FEATURES, ROWS, DIM, BATCH = 26, 1_000_000, 16, 1024


def batches(torch, n, seed):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        # Zipf-like: a few hot ids and a long tail.
        u = torch.rand(BATCH, FEATURES, generator=g)
        ids = (ROWS * u.pow(4)).long().clamp_(max=ROWS - 1)
        out.append((ids, torch.rand(BATCH, 1, generator=g)))
    return out


def train(pt, torch, ebc, mlp, opt, data, pipelined):
    """Seconds for the steps over data, and the unique rows pulled."""
    rows = sum(int(torch.unique(ids[:, f]).numel())
               for ids, _ in data for f in range(FEATURES))
    it = pt.pipeline(data, ebc, key=lambda b: b[0]) if pipelined else data
    t0 = time.perf_counter()
    for ids, y in it:
        pooled = torch.cat(ebc(ids), dim=1)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(
            mlp(pooled), y)
        loss.backward()
        opt.step()
    return time.perf_counter() - t0, rows


def bench(mode, steps, rounds, d, psd, pt, torch):
    spec = os.path.join(d, mode + ".json")
    tables = [{"name": "f%d" % f, "dim": DIM, "init": "uniform",
               "init_scale": 0.05, "optimizer": {"type": "adagrad",
                                                 "lr": 0.05}}
              for f in range(FEATURES)]
    h.write_spec(spec, nps=2, nworker=1, job={
        "name": "bench-emb-" + mode, "sync": {"mode": mode},
        "optimizer": {"type": "sgd", "lr": 0.05}, "tables": tables})
    procs = [h.start_psd(spec, i) for i in range(2)]
    try:
        c = psd.Client(spec, "worker:0")
        ebc = pt.EmbeddingBagCollection(
            [pt.EmbeddingBag(ROWS, DIM, table="f%d" % f, client=c)
             for f in range(FEATURES)])
        torch.manual_seed(0)
        mlp = torch.nn.Sequential(
            torch.nn.Linear(FEATURES * DIM, 128), torch.nn.ReLU(),
            torch.nn.Linear(128, 1))
        opt = pt.DistributedOptimizer(mlp.named_parameters(), c,
                                      sparse=ebc)
        train(pt, torch, ebc, mlp, opt, batches(torch, 10, 99), False)  # warm
        got = {False: [], True: []}
        for r in range(rounds):
            for pipelined in (False, True):
                data = batches(torch, steps, r)
                got[pipelined].append(train(pt, torch, ebc, mlp, opt, data,
                                            pipelined))
        opt.finish()
        c.close()
    finally:
        for p in procs:
            p.stop()
    step = {k: statistics.median(s / steps for s, _ in v)
            for k, v in got.items()}
    rate = {k: statistics.median(n / s for s, n in v) for k, v in got.items()}
    print("bench emb mode=%s steps=%d rounds=%d features=%d batch=%d dim=%d "
          "plain_step_ms=%.2f pipelined_step_ms=%.2f speedup=%.2f "
          "plain_rows_per_s=%.0f pipelined_rows_per_s=%.0f"
          % (mode, steps, rounds, FEATURES, BATCH, DIM, 1e3 * step[False],
             1e3 * step[True], step[False] / step[True], rate[False],
             rate[True]), flush=True)


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: bench_emb.py BUILD_DIR [steps] [rounds]")
    h.BUILD = os.path.abspath(sys.argv[1])
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    import torch
    torch.set_num_threads(1)
    sys.path.insert(0, h.build_path("worker", "python"))
    import psd
    import psd.torch as pt
    with tempfile.TemporaryDirectory() as d:
        for mode in ("async", "sync"):
            bench(mode, steps, rounds, d, psd, pt, torch)


if __name__ == "__main__":
    main()
