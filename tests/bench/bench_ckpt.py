"""bench checkpoint: what a checkpoint of a table costs a client that keeps
stepping (docs/performance.md, "A checkpoint under load").

The job of bench_reshard.py (a table of ROWS rows, dim 16, adagrad, every
row pushed once, and a 4 MiB dense variable, adam) on 2 shards. One client
(a worker's stand-in, psd.Client) pushes and pulls WORK_IDS random table
rows per step, step after step, the whole time. Each round: STEADY_S of
steps with no checkpoint (the baseline, in the same run), then `psctl
checkpoint --wait` while the client steps. The shards write a full
checkpoint as they start; the next 7 rounds' are deltas (the rows pushed
since the one before), the 8th full (a table's chain is at most 8 long);
each round is counted as what ps:0's manifest says it wrote.

Counted: the client's step times (a step is one push_rows plus one
pull_rows of WORK_IDS ids, timed by the client): the median with no
checkpoint, and the slowest while psctl's checkpoint ran; each shard's own
figure for how long its pushes waited on the checkpoint's instant (its
log line "pushes waited up to N ms"), the larger of the two; psctl's wall
time.

Lines: `bench checkpoint` (per kind: full, delta) and the `bench
checkpoint:` summary.

Run: /usr/bin/python3 tests/bench/bench_ckpt.py BUILD_DIR [--rows N] [--rounds R]
Exit: 0 when it ran, 1 on a failure (a checkpoint refused or failed, a
client step that failed), never on a speed; 2 on a bad command line."""
import glob
import json
import os
import re
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_live as bl  # noqa: E402
import bench_reshard as br  # noqa: E402
from bench_reshard import Failed, h, med, tail  # noqa: E402

WORK_IDS = bl.WORK_IDS  # rows a client step pushes and pulls
STEADY_S = 1.5  # the client's steps with no checkpoint, each round
ROUNDS = 8  # 7 deltas, then a full one (a table's chain is 8 long)
WAITED = re.compile(r"checkpoint \([^)]*\) at step \d+ .*pushes waited up to ([0-9.]+) ms")


def step(c, rows, rng):
    """One client step (bench_live's): seconds."""
    return bl.client_step(c, rows, rng)[1]


def waited(bench, seen):
    """The longest 'pushes waited' of the shards' checkpoint lines logged
    since seen (each shard's count of such lines before; a shard logs its
    line after it answers the checkpoint's call, so it is waited for):
    (ms, new seen)."""
    ms, now = [], []
    for p, k in zip(bench.live, seen):
        t_end = time.monotonic() + br.TIMEOUT_S
        while len(WAITED.findall(p.output())) <= k:
            if time.monotonic() > t_end:
                raise Failed("%s logged no checkpoint line: %s" % (" ".join(p.argv),
                                                                   tail(p.output())))
            time.sleep(0.05)
        got = WAITED.findall(p.output())
        ms += [float(x) for x in got[k:]]
        now.append(len(got))
    return max(ms), now


def ckpt_kind(bench):
    """'full' or 'delta': the table's file in ps:0's newest checkpoint."""
    newest = max(glob.glob(os.path.join(bench.jobdir, "ps-0", "ckpt-*", "manifest.json")))
    with open(newest) as f:
        return "delta" if json.load(f)["tables"][0]["delta"] else "full"


def checkpoint(d, b=None, rows=br.ROWS, rounds=ROUNDS):
    """The bench; b (bench.py's module) is unused."""
    psd = br.psd_mod()
    say = lambda line: print(line, flush=True)  # noqa: E731
    t_all = time.monotonic()
    bench = br.Bench(os.path.join(d, "ckpt"), rows)
    rng = np.random.default_rng(7)
    res = {k: {"before": [], "slowest": [], "waited": [], "wall": []} for k in ("full", "delta")}
    try:
        bench.start(2)
        bench.fill(psd)
        bench.stop()
        bench.start(2)
        c = bench.client(psd, 2)
        seen = [0, 0]
        try:
            for r in range(rounds):
                before, during = [], []
                t_end = time.monotonic() + STEADY_S
                while time.monotonic() < t_end:
                    before.append(step(c, rows, rng))
                argv = [h.build_path("ps-server", "psctl"), "--cluster", bench.spec[2],
                        "checkpoint", "--wait"]
                t0 = time.monotonic()
                p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
                while p.poll() is None:
                    during.append(step(c, rows, rng))
                out = p.communicate()[0]
                wall = time.monotonic() - t0
                if p.returncode != 0:
                    raise Failed("%s exited %d: %s" % (" ".join(argv), p.returncode, tail(out)))
                ms, seen = waited(bench, seen)
                x = res[ckpt_kind(bench)]
                x["before"].append(med(before))
                x["slowest"].append(max(during) if during else float("nan"))
                x["waited"].append(ms)
                x["wall"].append(wall)
        finally:
            c.close()
    finally:
        bench.cleanup()
    for kind in ("full", "delta"):
        x = res[kind]
        if not x["wall"]:
            continue
        say("bench checkpoint kind=%s rows=%d dim=%d dense_elems=%d step_ms=%.1f "
            "slowest_step_ms=%.1f pushes_waited_ms=%.1f checkpoint_s=%.2f work_ids=%d "
            "rounds=%d"
            % (kind, rows, br.DIM, br.DENSE[0] * br.DENSE[1], med(x["before"]) * 1e3,
               max(x["slowest"]) * 1e3, max(x["waited"]), med(x["wall"]), WORK_IDS,
               len(x["wall"])))
    f = res["full"]
    if not f["wall"]:
        raise Failed("no round wrote a full checkpoint (%d rounds; 8 make one)" % rounds)
    say("bench checkpoint: %d rows + %d dense elements on 2 shards; a client step takes "
        "%.1f ms with no checkpoint and %.1f ms at most across a full checkpoint (pushes "
        "waited %.1f ms on the shards); %d rounds in %.0f s"
        % (rows, br.DENSE[0] * br.DENSE[1], med(f["before"]) * 1e3, max(f["slowest"]) * 1e3,
           max(f["waited"]), rounds, time.monotonic() - t_all))


def main():
    return br.run_main(sys.argv[1:], "bench_ckpt.py", __doc__, "checkpoint", checkpoint,
                       rounds=ROUNDS)

if __name__ == "__main__":
    sys.exit(main())
