"""bench reshard live: a live reshard's figures (psctl reshard --shards M,
docs/reshard.md "Live"; issue 29, "Measured").

The job of bench_reshard.py (a table of ROWS rows, dim 16, adagrad, every
row pushed once, and a 4 MiB dense variable, adam), on a spec of 3
addresses whose job starts on 2 (job.shards), ps:2 standing by. One client
(a worker's stand-in, psd.Client) pushes and pulls WORK_IDS table rows per
step, step after step, the whole time. Every round, alternated:

  live:  `psctl reshard --shards 3 --stop`, then `--shards 2 --stop`, while the client
         steps: psctl's wall time (the pause: from the request to every
         shard serving the new layout), ps:0's own "cut in" time, and the
         client's step times before (STEADY_S), during (the steps that
         overlap psctl's run) and after (STEADY_S)
  pull:  the baseline, the same client reading every row and the dense
         variable from the live shards (bench_reshard's pull_all: the same
         bytes a reshard moves, read by a client)

Counted: rows (ROWS) over psctl's wall time and over ps:0's cut time; the
client's steps and their durations (a step is one push_rows plus one
pull_rows of WORK_IDS ids, random ones, timed by the client).

Lines: `bench reshard live` (per direction: the pause, the cut, rows/s,
the pull's rows/s in the same run and their ratio, the slowest step in the
pause and the median step before it), and the `bench reshard live:` summary.

Run: /usr/bin/python3 tests/bench/bench_live.py BUILD_DIR [--rows N] [--rounds R]
Exit: 0 when it ran, 1 on a failure (a reshard refused or not done, a
client step that failed, values that changed), never on a speed; 2 on a bad
command line."""
import json
import os
import re
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_reshard as br  # noqa: E402
from bench_reshard import Failed, h, med, tail  # noqa: E402

WORK_IDS = 4096  # rows a client step pushes and pulls
STEADY_S = 1.5  # the client's steady steps measured before and after


def client_step(c, rows, rng):
    """One client step on table t16 of `rows` rows: a push_rows and a
    pull_rows of WORK_IDS random ids (repeats dropped). Returns
    (its end, its seconds), on time.monotonic()."""
    ids = np.unique(rng.integers(0, rows, WORK_IDS).astype(np.uint64))
    g = np.full((len(ids), br.DIM), 1.0 / 1024, np.float32)
    out = np.empty((len(ids), br.DIM), np.float32)
    t0 = time.monotonic()
    c.push_rows("t16", ids, g)
    c.pull_rows("t16", ids, out)
    t1 = time.monotonic()
    return t1, t1 - t0


class LiveBench(br.Bench):
    """bench_reshard's job, with a 3-address spec that starts on 2."""

    def __init__(self, d, rows):
        super().__init__(d, rows)
        with open(self.spec[3]) as f:
            spec = json.load(f)
        spec["job"]["shards"] = 2
        with open(self.spec[3], "w") as f:
            json.dump(spec, f)

    def reshard_live(self, psd, c, m, rng):
        """psctl reshard --shards m while client c steps: (psctl's wall
        seconds, ps:0's cut seconds, step times before, during, after)."""
        before, during, after = [], [], []

        def step():
            return client_step(c, self.rows, rng)[1]

        t_end = time.monotonic() + STEADY_S
        while time.monotonic() < t_end:
            before.append(step())
        argv = [h.build_path("ps-server", "psctl"), "--cluster", self.spec[3], "reshard",
                "--shards", str(m), "--stop"]
        t0 = time.monotonic()
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
        while p.poll() is None:
            during.append(step())
        out = p.communicate()[0]
        took = time.monotonic() - t0
        if p.returncode != 0 or "reshard done in" not in out:
            raise Failed("%s exited %d: %s" % (" ".join(argv), p.returncode, tail(out)))
        cut = re.search(r"cut in ([0-9.]+) s", out)
        t_end = time.monotonic() + STEADY_S
        while time.monotonic() < t_end:
            after.append(step())
        return took, float(cut.group(1)) if cut else float("nan"), before, during, after


def live(d, b=None, rows=br.ROWS, rounds=br.ROUNDS):
    """The bench; b (bench.py's module) is unused."""
    psd = br.psd_mod()
    say = lambda line: print(line, flush=True)  # noqa: E731
    t_all = time.monotonic()
    bench = LiveBench(os.path.join(d, "live"), rows)
    rng = np.random.default_rng(7)
    res = {m: {k: [] for k in ("pause", "cut", "before", "during", "after", "pull")}
           for m in (3, 2)}
    try:
        bench.start(2)
        bench.fill(psd)
        bench.stop()
        bench.start(3)  # ps:2 stands by
        c = bench.client(psd, 3)
        try:
            for r in range(rounds):
                for m in (3, 2):
                    took, cut, bef, dur, aft = bench.reshard_live(psd, c, m, rng)
                    pulled, _ = bench.pull_all(psd, 3)
                    for k, v in (("pause", took), ("cut", cut), ("before", med(bef)),
                                 ("during", max(dur) if dur else float("nan")),
                                 ("after", med(aft)), ("pull", pulled)):
                        res[m][k].append(v)
        finally:
            c.close()
    finally:
        bench.cleanup()
    for m, frm in ((3, 2), (2, 3)):
        x = res[m]
        pause, cut, pull = med(x["pause"]), med(x["cut"]), med(x["pull"])
        say("bench reshard live from=%d to=%d rows=%d dim=%d dense_elems=%d pause_s=%.2f "
            "cut_s=%.2f rows_per_s=%.0f cut_rows_per_s=%.0f pull_s=%.2f pull_rows_per_s=%.0f "
            "ratio_rows=%.3f step_before_ms=%.1f slowest_step_in_pause_s=%.2f "
            "step_after_ms=%.1f work_ids=%d rounds=%s"
            % (frm, m, rows, br.DIM, br.DENSE[0] * br.DENSE[1], pause, cut, rows / pause,
               rows / cut, pull, rows / pull, pull / pause, med(x["before"]) * 1e3,
               med(x["during"]), med(x["after"]) * 1e3, WORK_IDS,
               ",".join("%.2f/%.2f" % v for v in zip(x["pause"], x["pull"]))))
    say("bench reshard live: %d rows + %d dense elements, 2 -> 3 paused the client %.2f s "
        "(cut %.2f s) and 3 -> 2 %.2f s, vs a client's pull of the same rows %.2f s; a "
        "client step takes %.1f ms before; %d rounds in %.0f s"
        % (rows, br.DENSE[0] * br.DENSE[1], med(res[3]["pause"]), med(res[3]["cut"]),
           med(res[2]["pause"]), med(res[3]["pull"]), med(res[3]["before"]) * 1e3, rounds,
           time.monotonic() - t_all))


def main():
    return br.run_main(sys.argv[1:], "bench_live.py", __doc__, "reshard live", live)

if __name__ == "__main__":
    sys.exit(main())
