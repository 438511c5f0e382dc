"""bench reshard: the offline reshard's figures (psd --cluster SPEC --reshard,
docs/reshard.md; issue 29, "Measured").

A job of 2 shards holds an embedding table of ROWS rows (dim 16, adagrad:
each row has 16 values and 16 accumulators; every row pushed once) and a
dense variable of DENSE f32 values (4 MiB, split across the shards, adam:
a value and 2 slots per element, pushed once). Every round, alternated:

  restart: SIGTERM to the 2 shards (each writes its final checkpoint and
           exits), the same 2 started again (each loads it and logs
           "ready: listening on"): stop and start wall times
  reshard: SIGTERM to the 2 shards (stop), `psd --cluster SPEC3 --reshard`
           (reshard: its wall time, the process included), the 3 shards of
           the new spec started (start, until all 3 log "ready")
  pull:    one psd.Client of the 3 live shards pulls every row (pull_rows,
           batches of BATCH ids, in id order) and the dense variable: the
           baseline, the same rows read by a client (timed from the first
           pull to the last answer; connecting and declaring not counted)

then the 3 shards are stopped and the 2-shard layout that --reshard kept
aside is put back for the next round (untimed).

Counted (each rate is counted work over the wall time measured for it):
  rows     the table's rows, ROWS (checked against --reshard's own count)
  bytes    what the new checkpoints hold of the state: the rows' values and
           optimizer state, rows x (dim + nstate) x 4 (nstate read from the
           new table files' headers), plus the dense variable's values and
           slots, elements x 4 x 3 (adam). Not counted: ids, per-row
           statistics, headers, CRCs; file_bytes is every byte of the new
           checkpoints' files, for comparison
  pull     a client can only read values: rows x dim x 4 plus elements x 4
           (pull_bytes); ratio_rows compares rows/s, ratio_bytes the
           reshard's counted bytes/s with the pull's value bytes/s

Lines: `bench reshard migrate` (rates, medians, per-round values),
`bench reshard downtime` (stop, reshard and start against restart's stop
and start), `bench reshard where` (from --reshard's own timestamped log,
medians: its "done in" time; load_old_s, the time it spent loading the old
shards' checkpoints, each once when every new shard fits in memory (one
pass); cut_write_check_s, cutting, writing, reading back and checking; and
each new shard's ms since its pass began, per round), and the `bench reshard:` summary.

Run: /usr/bin/python3 tests/bench/bench_reshard.py BUILD_DIR [--rows N] [--rounds R]
Exit: 0 when it ran, 1 on a failure (a process that exited non-zero or
never got ready, a count that does not add up, values that changed),
never on a speed; 2 on a bad command line."""
import glob
import hashlib
import json
import os
import re
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import harness as h  # noqa: E402

ROWS = 1000000
DIM = 16
DENSE = (1024, 1024)  # 4 MiB of f32, split across the shards (>= 256 KiB)
DENSE_SLOTS = 2  # adam: m and v
BATCH = 65536
ROUNDS = 3
JOB = "bench-reshard"
TABLE = {"name": "t16", "dim": DIM, "init": "uniform", "init_scale": 0.01,
         "optimizer": {"type": "adagrad", "lr": 0.05, "initial_accumulator": 0.1}}
READY = "ready: listening on"
TIMEOUT_S = 300  # the longest one stop, start, reshard or pass may take


class Failed(Exception):
    pass


def psd_mod():
    sys.path.insert(0, h.build_path("worker", "python"))
    import psd
    return psd


def tail(text):
    return text[-3000:]


class Bench:
    """One job's specs (2 and 3 shards), its checkpoint root and the shard
    processes it started (stopped by PID at the end)."""

    def __init__(self, d, rows):
        os.makedirs(d, exist_ok=True)
        self.d = d
        self.rows = rows
        self.root = os.path.join(d, "ckpt")
        self.jobdir = os.path.join(self.root, JOB)
        job = {"name": JOB, "optimizer": {"type": "adam", "lr": 0.001},
               "tables": [TABLE], "seed": 1, "checkpoint": {"dir": self.root, "keep": 1}}
        ports = h.free_ports(3 + 1)
        self.spec = {}
        for n in (2, 3):
            path = os.path.join(d, "spec%d.json" % n)
            with open(path, "w") as f:
                json.dump({"cluster": {"ps": ["127.0.0.1:%d" % p for p in ports[:n]],
                                       "worker": ["127.0.0.1:%d" % ports[3]]},
                           "job": job}, f)
            self.spec[n] = path
        self.live = []  # the shard Procs running now
        self.all = []  # every Proc started, for the cleanup

    # ---- shards

    def start(self, n):
        """Starts the n shards of spec n at once; seconds until the last
        one logged its readiness line."""
        t0 = time.monotonic()
        ps = [h.Proc([h.build_path("ps-server", "psd"), "--cluster", self.spec[n], "--task",
                      "ps:%d" % i]) for i in range(n)]
        self.all += ps
        for p in ps:
            try:
                p.wait_for(READY, timeout=TIMEOUT_S)
            except AssertionError as e:
                raise Failed("%s did not get ready: %s" % (" ".join(p.argv), tail(str(e))))
        took = time.monotonic() - t0
        self.live = ps
        return took

    def stop(self):
        """SIGTERM to every live shard at once; seconds until the last one
        exited, each with 0 and its checkpoint at exit written."""
        t0 = time.monotonic()
        for p in self.live:
            p.p.send_signal(signal.SIGTERM)
        for p in self.live:
            try:
                rc = p.wait(timeout=TIMEOUT_S)
            except subprocess.TimeoutExpired:
                raise Failed("%s ran %d s past its SIGTERM" % (" ".join(p.argv), TIMEOUT_S))
            if rc != 0:
                raise Failed("%s exited %d on SIGTERM: %s" % (" ".join(p.argv), rc,
                                                             tail(p.output())))
            if "checkpoint (at exit)" not in p.output():
                raise Failed("%s wrote no checkpoint at exit: %s" % (" ".join(p.argv),
                                                                     tail(p.output())))
        took = time.monotonic() - t0
        self.live = []
        return took

    def cleanup(self):
        for p in reversed(self.all):
            if p.p.poll() is None:
                p.stop(timeout=TIMEOUT_S)

    # ---- the reshard

    def reshard(self, n):
        """psd --reshard onto spec n: (wall seconds, its output)."""
        argv = [h.build_path("ps-server", "psd"), "--cluster", self.spec[n], "--reshard"]
        t0 = time.monotonic()
        try:
            r = h.run(argv, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise Failed("%s ran past %d s" % (" ".join(argv), TIMEOUT_S))
        took = time.monotonic() - t0
        out = r.stdout + r.stderr
        if r.returncode != 0 or "reshard: done in" not in out:
            raise Failed("%s exited %d: %s" % (" ".join(argv), r.returncode, tail(out)))
        return took, out

    def put_back(self, n):
        """Replaces the job's directory by the n-shard layout --reshard kept
        beside it (the newest), as if the reshard never ran."""
        kept = sorted(glob.glob("%s.%d-shards-*" % (self.jobdir, n)), key=os.path.getmtime)
        if not kept:
            raise Failed("no %d-shard layout kept beside %s" % (n, self.jobdir))
        shutil.rmtree(self.jobdir)
        os.rename(kept[-1], self.jobdir)
        for k in kept[:-1]:
            shutil.rmtree(k)

    # ---- the client's side

    def client(self, psd, n):
        c = psd.Client(self.spec[n], None)
        c.declare("w", DENSE, init="uniform", init_scale=0.01)
        c.declare_table("t16", DIM)
        return c

    def fill(self, psd):
        """Every row pushed once (so it holds adagrad state), the dense
        variable pushed once (adam's slots)."""
        rng = np.random.default_rng(1)
        c = self.client(psd, 2)
        try:
            grads = rng.standard_normal((BATCH, DIM)).astype(np.float32)
            for b in range(0, self.rows, BATCH):
                ids = np.arange(b, min(b + BATCH, self.rows), dtype=np.uint64)
                c.push_rows("t16", ids, grads[:len(ids)])
            c.push(["w"], [rng.standard_normal(DENSE).astype(np.float32)])
        finally:
            c.close()

    def pull_all(self, psd, n):
        """Every row and the dense variable pulled by one client of spec n:
        (seconds, a digest of what came back)."""
        c = self.client(psd, n)
        try:
            out = np.empty((self.rows, DIM), np.float32)
            out.fill(0)  # its pages touched before the clock starts
            w = np.zeros(DENSE, np.float32)
            batches = [np.arange(b, min(b + BATCH, self.rows), dtype=np.uint64)
                       for b in range(0, self.rows, BATCH)]
            t0 = time.monotonic()
            for ids in batches:
                c.pull_rows("t16", ids, out[int(ids[0]):int(ids[0]) + len(ids)])
            c.pull(["w"], [w])
            took = time.monotonic() - t0
            dig = hashlib.sha256(out.tobytes())
            dig.update(w.tobytes())
        finally:
            c.close()
        return took, dig.hexdigest()

    # ---- what the new checkpoints hold

    def held(self):
        """(rows, value+state bytes of the tables, every file's bytes) of
        the job's newest checkpoints, from the table files' headers
        (table_file.c: magic, then dim, nstate, ..., nrows)."""
        rows = state_bytes = 0
        for shard in sorted(glob.glob(os.path.join(self.jobdir, "ps-*"))):
            ck = sorted(glob.glob(os.path.join(shard, "ckpt-*")))
            if not ck:
                raise Failed("no checkpoint in %s" % shard)
            for t in glob.glob(os.path.join(ck[-1], "table-*.bin")):
                with open(t, "rb") as f:
                    head = f.read(8 + 9 * 8)
                dim, nstate, _, delta, _, _, nrows, _, _ = struct.unpack_from("<9Q", head, 8)
                if delta:
                    raise Failed("%s: a delta where --reshard writes full snapshots" % t)
                rows += nrows
                state_bytes += nrows * (dim + nstate) * 4
        files = 0
        for top, _, names in os.walk(self.jobdir):
            files += sum(os.path.getsize(os.path.join(top, x)) for x in names)
        return rows, state_bytes, files


def parse_reshard(out):
    """--reshard's own figures: (rows, dense elements, done-in seconds,
    [each new shard's cut+write+check ms])."""
    m = re.search(r"(\d+) of (\d+) table rows and (\d+) of (\d+) dense elements moved", out)
    done = re.search(r"reshard: done in ([\d.]+) s", out)
    shards = [float(x) for x in re.findall(r"read back and checked \((\d+) ms since", out)]
    if not m or not done:
        raise Failed("psd --reshard printed no totals: %s" % tail(out))
    return int(m.group(2)), int(m.group(4)), float(done.group(1)), shards, int(m.group(1))


def phases(out, nold):
    """From --reshard's timestamped log (one table, one pass over the old
    shards): seconds spent loading the old shards' checkpoints (from the
    "per pass" line to the nold-th "restored" line after it) and cutting,
    writing, reading back and checking (from there to the last new shard's
    line); None when the lines are not there or it took several passes."""
    def secs(line):
        m = re.match(r"(\d\d):(\d\d):(\d\d\.\d+) ", line)
        return int(m.group(1)) * 3600 + int(m.group(2)) * 60 + float(m.group(3)) if m else None
    start = loaded = end = None
    loads = passes = 0
    for line in out.splitlines():
        t = secs(line)
        if t is None:
            continue
        if "new shards per pass" in line:
            start = t
            m = re.search(r": (\d+) of the (\d+) new shards per pass", line)
            passes = 1 if m and m.group(1) == m.group(2) else 2
        elif "restored from" in line and start is not None and loaded is None:
            loads += 1
            if loads == nold:
                loaded = t
        elif re.search(r"reshard: new ps-\d+ of", line) and loaded is not None:
            end = t
    if passes != 1 or end is None:
        return None
    return loaded - start, end - loaded


def med(xs):
    return statistics.median(xs)


def reshard(d, b=None, rows=ROWS, rounds=ROUNDS):
    """The bench; b (bench.py's module) is unused, as for serve."""
    psd = psd_mod()
    say = lambda line: print(line, flush=True)  # noqa: E731
    t_all = time.monotonic()
    elems = DENSE[0] * DENSE[1]
    bench = Bench(os.path.join(d, "reshard"), rows)
    res = {k: [] for k in ("rs_s", "rs_psd_s", "pull_s", "stop3", "reshard", "start3",
                           "stop2", "start2", "where", "phases")}
    try:
        bench.start(2)
        bench.fill(psd)
        _, want = bench.pull_all(psd, 2)
        for r in range(rounds):
            # restart: the same 2 shards stopped and started again
            res["stop2"].append(bench.stop())
            res["start2"].append(bench.start(2))
            # reshard: stopped, 2 -> 3, the 3 started
            res["stop3"].append(bench.stop())
            took, out = bench.reshard(3)
            res["reshard"].append(took)
            res["start3"].append(bench.start(3))
            nrows, nelems, psd_s, shard_ms, moved = parse_reshard(out)
            if nrows != rows or nelems != elems:
                raise Failed("psd --reshard moved %d rows and %d dense elements; the job "
                             "holds %d and %d: %s" % (nrows, nelems, rows, elems, tail(out)))
            held_rows, table_bytes, files = bench.held()
            if held_rows != rows:
                raise Failed("the new checkpoints hold %d rows of %d" % (held_rows, rows))
            counted = table_bytes + elems * 4 * (1 + DENSE_SLOTS)
            res["rs_s"].append(took)
            res["rs_psd_s"].append(psd_s)
            res["where"].append(shard_ms)
            res["phases"].append(phases(out, 2))
            # the baseline: the same rows and variable pulled from the 3
            pulled, got = bench.pull_all(psd, 3)
            if got != want:
                raise Failed("round %d: the 3 shards answer other values than the 2 did"
                             % (r + 1))
            res["pull_s"].append(pulled)
            bench.stop()
            bench.put_back(2)
            if r + 1 < rounds:
                bench.start(2)
    finally:
        bench.cleanup()
    pull_bytes = rows * DIM * 4 + elems * 4
    rs_rows = [rows / s for s in res["rs_s"]]
    pl_rows = [rows / s for s in res["pull_s"]]
    rs_med, pl_med = med(res["rs_s"]), med(res["pull_s"])
    say("bench reshard migrate from=2 to=3 rows=%d dim=%d table_state=adagrad dense_elems=%d "
        "dense_opt=adam rows_moved=%d moved_fraction=%.3f (goal <= 0.36: %s) "
        "counted_bytes=%d file_bytes=%d reshard_s=%.2f "
        "rows_per_s=%.0f bytes_per_s=%.0f pull_s=%.2f pull_rows_per_s=%.0f pull_bytes=%d "
        "pull_bytes_per_s=%.0f ratio_rows=%.2f ratio_bytes=%.2f rounds=%s"
        % (rows, DIM, elems, moved, moved / rows, "met" if moved <= 0.36 * rows else "NOT met",
           counted, files, rs_med, rows / rs_med, counted / rs_med,
           pl_med, rows / pl_med, pull_bytes, pull_bytes / pl_med, pl_med / rs_med,
           (counted / rs_med) / (pull_bytes / pl_med),
           ",".join("%.0f/%.0f" % x for x in zip(rs_rows, pl_rows))))
    down = [a + b + c for a, b, c in zip(res["stop3"], res["reshard"], res["start3"])]
    rest = [a + b for a, b in zip(res["stop2"], res["start2"])]
    say("bench reshard downtime from=2 to=3 rows=%d total_s=%.2f stop_s=%.2f reshard_s=%.2f "
        "start_s=%.2f restart_2_to_2_total_s=%.2f restart_stop_s=%.2f restart_start_s=%.2f "
        "ratio=%.2f rounds=%s"
        % (rows, med(down), med(res["stop3"]), med(res["reshard"]), med(res["start3"]),
           med(rest), med(res["stop2"]), med(res["start2"]), med(down) / med(rest),
           ",".join("%.2f/%.2f" % x for x in zip(down, rest))))
    ph = [p for p in res["phases"] if p]
    say("bench reshard where psd_done_in_s=%.1f load_old_s=%s cut_write_check_s=%s "
        "new_shard_ms=%s"
        % (med(res["rs_psd_s"]),
           "%.2f" % med([p[0] for p in ph]) if ph else "na",
           "%.2f" % med([p[1] for p in ph]) if ph else "na",
           ";".join(",".join("%.0f" % x for x in w) for w in res["where"])))
    say("bench reshard: %d rows + %d dense elements 2 -> 3 shards in %.2f s (%.0f rows/s, "
        "%.1f MB/s counted) vs a client's pull %.2f s (ratio %.2f); downtime %.2f s vs "
        "restart %.2f s (%.2fx); %d rounds in %.0f s"
        % (rows, elems, rs_med, rows / rs_med, counted / rs_med / 1e6, pl_med,
           pl_med / rs_med, med(down), med(rest), med(down) / med(rest), rounds,
           time.monotonic() - t_all))


def parse_args(argv, prog, doc):
    """[--rows N] [--rounds R] BUILD_DIR: (build, rows, rounds), or None
    after saying what is wrong (exit 2)."""
    args = list(argv)
    rows, rounds = ROWS, ROUNDS
    try:
        for flag in ("--rows", "--rounds"):
            if flag in args:
                i = args.index(flag)
                v = int(args[i + 1])
                del args[i:i + 2]
                if v < 1:
                    raise ValueError("%s must be >= 1" % flag)
                if flag == "--rows":
                    rows = v
                else:
                    rounds = v
    except (IndexError, ValueError) as e:
        sys.stderr.write("%s: %s\n%s" % (prog, e, doc))
        return None
    if len(args) != 1:
        sys.stderr.write(doc)
        return None
    return os.path.abspath(args[0]), rows, rounds


def run_main(argv, prog, doc, part, fn, rounds=None):
    """A bench file run alone: [--rows N] [--rounds R] BUILD_DIR (rounds:
    its default when not given), fn(d, rows=, rounds=) in a temporary
    directory. Returns the exit status: 0 ran, 1 failed (said as `bench
    PART FAILED: ...`), 2 a bad command line."""
    args = list(argv)
    if rounds is not None and "--rounds" not in args:
        args += ["--rounds", str(rounds)]
    got = parse_args(args, prog, doc)
    if not got:
        return 2
    h.BUILD, rows, rounds = got
    with tempfile.TemporaryDirectory(prefix="psd-bench-%s-" % part.split()[-1]) as d:
        try:
            fn(d, rows=rows, rounds=rounds)
        except Failed as e:
            sys.stdout.flush()
            sys.stderr.write("bench %s FAILED: %s\n" % (part, e))
            return 1
    return 0


def main():
    return run_main(sys.argv[1:], "bench_reshard.py", __doc__, "reshard", reshard)

if __name__ == "__main__":
    sys.exit(main())
