"""bench reshard move: live bucket moves' figures (docs/reshard.md "Live
moves (the shard side)"; issue 37, "Figures").

The job of bench_reshard.py (a table of ROWS rows, dim 16, adagrad, every
row pushed once, and a 4 MiB dense variable, adam) on a spec of 3
addresses whose job starts on 2 (job.shards), ps:2 standing by. One client
(a worker's stand-in, psd.Client, on a thread of its own) pushes and pulls
WORK_IDS random table rows per step, step after step, the whole time. Each
round, on a job started afresh:

  move:  the table rows of 2 -> 3 shards (common/layout's cm_layout_moves,
         a third of the buckets, all to ps:2) by `psctl reshard --shards 3
         --moves`: ps:0 sends each batch (of the buckets it sizes itself:
         16,384 rows at most) from one source as an Admin/MoveBuckets to
         ps:2, one after another (docs/reshard.md "Moving rows live"). The
         move's time is ps:0's (Status.move.elapsed_s, its switch attempt
         included), its rows, bytes and calls ps:0's figures, each batch's
         hand-over pause ps:0's log line for it; the client's step times
         before (STEADY_S), during (every step that overlaps psctl's run)
         and after (STEADY_S)
  pull:  the baseline, a client reading every row and the dense variable
         from the live shards (bench_reshard's pull_all: the same rows,
         their values only) in the same run

Counted: bytes are what MoveBucketsResponse.bytes says the source sent
(ids, values, optimizer state, statistics: 8 + 4 x (dim + nstate) + 16
bytes a row), over the wall time of all the moves; the pull's bytes are the
rows' values (rows x dim x 4) and the dense variable's, over its own wall
time. A step is one push_rows plus one pull_rows of WORK_IDS ids.

The move ends with the switch (Admin/SwitchLayout: the dense variable
re-split among 3, layout 1 of 3), whose pause of the dense calls is ps:0's
figure in psctl's result ("the switch N ms", switch_ms); the client steps
on table rows only, so its steps show the batches' hand-overs.

Lines: `bench reshard move` (rates, pauses, steps, per round) and the
`bench reshard move:` summary.

Run: /usr/bin/python3 tests/bench/bench_move.py BUILD_DIR [--rows N] [--rounds R]
Exit: 0 when it ran, 1 on a failure (a move refused or failed, a client
step that failed, rows not where the map puts them), never on a speed; 2
on a bad command line."""
import json
import os
import re
import statistics
import sys
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import bench_live as bl  # noqa: E402
import bench_reshard as br  # noqa: E402
from bench_reshard import Failed, h, med  # noqa: E402
import pb  # noqa: E402
from hashes import bucket_map  # noqa: E402

ROUNDS = 1


class Stepper:
    """A client stepping on a thread until stopped: each step's end time
    and duration."""

    def __init__(self, psd, bench, seed):
        self.c = bench.client(psd, 3)
        self.rows = bench.rows
        self.rng = np.random.default_rng(seed)
        self.steps = []  # (end, seconds)
        self.error = None
        self.stop = threading.Event()
        self.t = threading.Thread(target=self._run)
        self.t.start()

    def _run(self):
        try:
            while not self.stop.is_set():
                self.steps.append(bl.client_step(self.c, self.rows, self.rng))
        except Exception as e:  # pylint: disable=broad-except
            self.error = repr(e)

    def between(self, a, b):
        """Durations of the steps that overlap [a, b]."""
        return [s for end, s in self.steps if end >= a and end - s <= b]

    def finish(self):
        self.stop.set()
        self.t.join()
        self.c.close()
        if self.error:
            raise Failed("the client's step failed: %s" % self.error)


def move_all(bench):
    """2 -> 3 by psctl reshard --moves, in the batches ps:0 sizes itself,
    and the switch: (ps:0's seconds, rows, bytes, [pause_us], calls, the
    switch's pause in seconds, buckets a batch)."""
    r = h.run([h.build_path("ps-server", "psctl"), "--cluster", bench.spec[3], "reshard",
               "--shards", "3", "--moves"],
              timeout=br.TIMEOUT_S)
    out = r.stdout + r.stderr
    done = re.search(r"ps:0 says done: layout 1 of 3 shards .* the switch ([0-9.]+) ms", out)
    if r.returncode != 0 or not done:
        raise Failed("psctl reshard --moves exited %d: %s" % (r.returncode, out[-2000:]))
    st = h.psctl(bench.spec[3], "--json", "status")
    mv = json.loads(st.stdout)["shards"][0].get("move") if st.returncode == 0 else None
    if not mv or mv["left"] != 0:
        raise Failed("ps:0's move figures after psctl: %s" % (mv or st.stderr[-1000:]))
    pauses = [float(p) * 1000 for p in
              re.findall(r"live move: batch \d+, .* pause ([0-9.]+) ms",
                         bench.live[0].output())]
    if len(pauses) != mv["batches"]:
        raise Failed("ps:0 logged %d batches, its status says %d" % (len(pauses), mv["batches"]))
    return (mv["elapsed_s"], mv["rows"], mv["bytes"], pauses, mv["batches"],
            float(done.group(1)) / 1e3, mv["batch"])


def check_owned(addrs):
    """Each shard owns its buckets of the 3-shard map (Status.buckets_owned)."""
    import grpc  # pylint: disable=import-outside-toplevel
    m3 = bucket_map(3)
    for s, a in enumerate(addrs):
        with grpc.insecure_channel(a) as chan:
            st = pb.fields(chan.unary_unary("/psd.v1.Admin/Status")(pb.caller(br.JOB),
                                                                    timeout=30))
        want = sum(1 for b in m3 if b == s)
        if st.get(99, [0])[0] != want:
            raise Failed("ps:%d owns %d buckets after the moves, not %d"
                         % (s, st.get(99, [0])[0], want))


def move(d, b=None, rows=br.ROWS, rounds=ROUNDS):
    """The bench; b (bench.py's module) is unused."""
    psd = br.psd_mod()
    say = lambda line: print(line, flush=True)  # noqa: E731
    t_all = time.monotonic()
    res = {k: [] for k in ("wall", "rows", "bytes", "pause_max", "pause_med", "calls", "switch",
                           "batch", "before", "during_med", "during_max", "after", "pull")}
    for r in range(rounds):
        bench = bl.LiveBench(os.path.join(d, "move%d" % r), rows)
        with open(bench.spec[3]) as f:
            addrs = json.load(f)["cluster"]["ps"]
        try:
            bench.start(2)
            bench.fill(psd)
            bench.stop()
            bench.start(3)  # ps:2 stands by
            st = Stepper(psd, bench, 7 + r)
            try:
                time.sleep(bl.STEADY_S)  # the steady steps before
                t0 = time.monotonic()
                wall, moved, nbytes, pauses, calls, switch, batch = move_all(bench)
                t1 = time.monotonic()
                time.sleep(bl.STEADY_S)  # and after
            finally:
                st.finish()
            check_owned(addrs)
            pulled, _ = bench.pull_all(psd, 3)
            before = [s for end, s in st.steps if end < t0]
            during = st.between(t0, t1)
            after = [s for end, s in st.steps if end - s > t1]
            if not during:
                raise Failed("no client step overlapped the moves")
            for k, v in (("wall", wall), ("rows", moved), ("bytes", nbytes),
                         ("pause_max", max(pauses) / 1e6),
                         ("pause_med", statistics.median(pauses) / 1e6), ("calls", calls),
                         ("switch", switch), ("batch", batch),
                         ("before", med(before)), ("during_med", med(during)),
                         ("during_max", max(during)), ("after", med(after)),
                         ("pull", pulled)):
                res[k].append(v)
        finally:
            bench.cleanup()
    x = {k: med(v) for k, v in res.items()}
    pull_bytes = rows * br.DIM * 4 + br.DENSE[0] * br.DENSE[1] * 4
    say("bench reshard move from=2 to=3 rows=%d dim=%d batch_buckets=%d calls=%d "
        "moved_rows=%d moved_fraction=%.3f wall_s=%.2f move_MBps=%.0f move_rows_per_s=%.0f "
        "pause_max_ms=%.1f pause_med_ms=%.1f switch_ms=%.1f pull_s=%.2f pull_MBps=%.0f "
        "step_before_ms=%.1f step_during_med_ms=%.1f step_during_max_ms=%.1f "
        "step_after_ms=%.1f work_ids=%d rounds=%s"
        % (rows, br.DIM, x["batch"], x["calls"], x["rows"], x["rows"] / rows, x["wall"],
           x["bytes"] / x["wall"] / 1e6, x["rows"] / x["wall"], x["pause_max"] * 1e3,
           x["pause_med"] * 1e3, x["switch"] * 1e3, x["pull"], pull_bytes / x["pull"] / 1e6, x["before"] * 1e3,
           x["during_med"] * 1e3, x["during_max"] * 1e3, x["after"] * 1e3, bl.WORK_IDS,
           ",".join("%.2f/%.1f" % (w, p * 1e3) for w, p in zip(res["wall"],
                                                              res["during_max"]))))
    say("bench reshard move: %d rows, 2 -> 3 moved %d rows (%.3f) live at %.0f MB/s in %.2f s "
        "(a client's pull of every row: %.0f MB/s), hand-overs paused a batch's writes "
        "%.1f ms at most, the switch the dense calls %.1f ms; the client's slowest step meanwhile %.1f ms (median %.1f ms, "
        "%.1f ms before); %d rounds in %.0f s"
        % (rows, x["rows"], x["rows"] / rows, x["bytes"] / x["wall"] / 1e6, x["wall"],
           pull_bytes / x["pull"] / 1e6, x["pause_max"] * 1e3, x["switch"] * 1e3,
           x["during_max"] * 1e3,
           x["during_med"] * 1e3, x["before"] * 1e3, rounds, time.monotonic() - t_all))


def main():
    return br.run_main(sys.argv[1:], "bench_move.py", __doc__, "reshard move", move)

if __name__ == "__main__":
    sys.exit(main())
