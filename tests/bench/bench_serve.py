"""bench serve: online learning's figures (docs/serving.md, "Measured").

  lag:     2 training shards publishing every INTERVAL_S seconds, 2 serving
           tasks; a client pushes a gradient to a row and polls a replica
           until its answer changes: the time from the push's answer to the
           changed lookup, PROBES times at random phases; median and max
           against the interval (the goal: max <= 2 x interval)
  lookups: 1 training shard holding ROWS rows (dim 16, adagrad) and its
           serving task; 2 load processes (online_load.py, batches of 1,024
           ids drawn uniformly) for LOAD_S seconds: rows looked up per
           second by the one serving shard, against psd's table in one
           process with no network (sparse-mem's pulls of the same batch
           size), alternated over 2 rounds
  memory:  the same shard's table bytes (psctl tables) and resident memory
           against its serving task's (psctl serving), for the same rows
  worth:   a drifting stream (psd-ctrgen --drift, PARTS parts) trained by 1
           worker on 2 shards that publish every second; before each part
           is released, it is scored through the serving tier twice: by
           replicas following every publication (live) and by replicas of
           a copy of the publications taken after the first part (frozen);
           AUC per part, and the mean of each over the later parts (with
           --svg, the curve as a picture)
Run: /usr/bin/python3 tests/bench/bench_serve.py BUILD_DIR [lag|lookups|worth ...]
     [--svg FILE]"""
import glob
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import ctr_score  # noqa: E402
import harness as h  # noqa: E402
import pubread  # noqa: E402
import svgplot  # noqa: E402

INTERVAL_S = 2.0
PROBES = 8
ROWS = 1000000
LOAD_S = 5
PARTS = 10
PER_PART = 20000
JOB = "bench-serve"
TABLE16 = {"name": "t16", "dim": 16, "init": "uniform", "init_scale": 0.01,
           "optimizer": {"type": "adagrad", "lr": 0.05, "initial_accumulator": 0.1}}
CTR_TABLES = [
    {"name": "emb", "dim": 8, "init": "uniform", "init_scale": 0.05,
     "optimizer": {"type": "adagrad", "lr": 0.2, "initial_accumulator": 0.1}},
    {"name": "wide", "dim": 1, "init": "zeros",
     "optimizer": {"type": "adagrad", "lr": 0.2, "initial_accumulator": 0.1}},
]


class Failed(Exception):
    pass


def psd_mod():
    sys.path.insert(0, h.build_path("worker", "python"))
    import psd
    return psd


def until(what, cond, timeout=60):
    return h.until(what, cond, timeout, every=0.01, error=Failed)


class Job:
    """The processes of one spec, stopped (SIGTERM) at the end."""

    def __init__(self, d, nps, nserve, job, nworker=1):
        os.makedirs(d, exist_ok=True)
        self.d = d
        ports = h.free_ports(nps + nworker + nserve)
        self.cluster = {"ps": ["127.0.0.1:%d" % p for p in ports[:nps]],
                        "worker": ["127.0.0.1:%d" % p for p in ports[nps:nps + nworker]],
                        "serve": ["127.0.0.1:%d" % p for p in ports[nps + nworker:]]}
        self.job = job
        self.spec = self.write("spec.json", job)
        self.procs = {}

    def write(self, name, job):
        path = os.path.join(self.d, name)
        with open(path, "w") as f:
            json.dump({"cluster": self.cluster, "job": job}, f)
        return path

    def start(self, task, spec=None):
        p = h.Proc([h.build_path("ps-server", "psd"), "--cluster", spec or self.spec,
                    "--task", task])
        p.wait_for("ready: listening on")
        self.procs[task + (spec or "")] = p
        return p

    def pid(self, task):
        return self.procs[task].p.pid

    def stop(self):
        for p in self.procs.values():
            p.stop()

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.stop()


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def lag(d, psd, say):
    job = {"name": JOB, "tables": [TABLE16], "seed": 1,
           "publish": {"dir": "pub", "interval_s": INTERVAL_S}}
    with Job(os.path.join(d, "lag"), 2, 2, job) as j:
        for i in range(2):
            j.start("ps:%d" % i)
        for k in range(2):
            j.start("serve:%d" % k)
        c = psd.Client(j.spec, None)
        s = psd.Serving(j.spec)
        try:
            c.declare_table("t16", 16)
            ids = np.arange(1, 1001, dtype=np.uint64)
            c.push_rows("t16", ids, np.ones((len(ids), 16), np.float32))
            until("the rows served", lambda: s.lookup("t16", ids)[1].all(), 30)
            rng = random.Random(7)
            lags = []
            for k in range(PROBES):
                time.sleep(rng.uniform(0, INTERVAL_S))  # a random phase
                one = ids[k:k + 1]
                before = s.lookup("t16", one)[0].copy()
                c.push_rows("t16", one, np.ones((1, 16), np.float32))
                t0 = time.monotonic()
                until("a pushed row served",
                      lambda: not np.array_equal(s.lookup("t16", one)[0], before),
                      4 * INTERVAL_S + 10)
                lags.append(time.monotonic() - t0)
        finally:
            s.close()
            c.close()
    med, top = statistics.median(lags), max(lags)
    say("bench serve lag interval_s=%.1f probes=%d median_s=%.3f max_s=%.3f "
        "max_over_interval=%.2f goal_max_over_interval=2.0 samples=%s"
        % (INTERVAL_S, len(lags), med, top, top / INTERVAL_S,
           ",".join("%.2f" % x for x in lags)))


def load_rate(j, pool, seconds, nproc=2):
    """Rows per second looked up by nproc online_load.py processes against
    the job's serving tasks: counted rows over the measured wall time."""
    stop = os.path.join(j.d, "stop")
    if os.path.exists(stop):
        os.unlink(stop)
    procs = []
    for k in range(nproc):
        p = h.Proc(["/usr/bin/python3", os.path.join(HERE, "..", "integration",
                                                     "online_load.py"),
                    j.spec, "t16", pool, stop, os.path.join(j.d, "load%d.json" % k),
                    "--batch", "1024", "--seed", str(k + 1), "--build", h.BUILD])
        p.wait_for("load: ready")
        procs.append(p)
    t0 = time.monotonic()
    time.sleep(seconds)
    open(stop, "w").close()
    rows = fails = 0
    for k, p in enumerate(procs):
        if p.wait(timeout=60) != 0:
            raise Failed("online_load.py: %s" % p.output())
        with open(os.path.join(j.d, "load%d.json" % k)) as f:
            got = json.load(f)
        rows += got["rows"]
        fails += got["failures"]
    return rows / (time.monotonic() - t0), fails


def lookups(d, psd, say):
    job = {"name": JOB, "tables": [TABLE16], "seed": 1,
           "publish": {"dir": "pub", "interval_s": 1, "full_every": 1}}
    with Job(os.path.join(d, "lookups"), 1, 1, job) as j:
        j.start("ps:0")
        j.start("serve:0")
        c = psd.Client(j.spec, None)
        s = psd.Serving(j.spec)
        try:
            c.declare_table("t16", 16)
            out = np.empty((65536, 16), np.float32)
            for b in range(0, ROWS, 65536):  # a pull stores a row (admission always)
                ids = np.arange(b, min(b + 65536, ROWS), dtype=np.uint64)
                c.pull_rows("t16", ids, out[:len(ids)])
            last = np.array([ROWS - 1], np.uint64)
            until("every row served", lambda: s.lookup("t16", last)[1].all(), 120)
            pool = os.path.join(j.d, "pool.npy")
            np.save(pool, np.arange(ROWS, dtype=np.uint64))
            served, mem = [], []
            for r in range(2):
                m = h.run([h.build_path("tests", "sparse-mem"), "16", str(ROWS), "3",
                           "1024"], timeout=300)
                kv = dict(p.split("=", 1) for p in m.stdout.split() if "=" in p)
                mem.append(float(kv["pull_rows_per_s"]))
                rate, fails = load_rate(j, pool, LOAD_S)
                if fails:
                    raise Failed("%d lookups failed" % fails)
                served.append(rate)
            tables = json.loads(h.psctl(j.spec, "--json", "tables").stdout)
            serving = json.loads(h.psctl(j.spec, "--json", "serving").stdout)
            train_bytes = sum(t["bytes"] for t in tables["tables"] if t["name"] == "t16")
            serve_bytes = serving["serving"][0]["bytes"]
            rss_train, rss_serve = rss_kib(j.pid("ps:0")), rss_kib(j.pid("serve:0"))
        finally:
            s.close()
            c.close()
    say("bench serve lookups rows=%d dim=16 batch=1024 serving_rows_per_s=%.0f "
        "in_memory_rows_per_s=%.0f ratio=%.2f rounds=%s"
        % (ROWS, statistics.median(served), statistics.median(mem),
           statistics.median(served) / statistics.median(mem),
           ",".join("%.0f/%.0f" % x for x in zip(served, mem))))
    say("bench serve memory rows=%d dim=16 training_table_bytes=%d serving_bytes=%d "
        "ratio=%.2f goal=0.6 training_rss_kib=%d serving_rss_kib=%d rss_ratio=%.2f"
        % (ROWS, train_bytes, serve_bytes, serve_bytes / max(train_bytes, 1), rss_train,
           rss_serve, rss_serve / max(rss_train, 1)))


def served_params(s, dims):
    dense = {}
    for name, shape in dims.items():
        dense[name] = s.dense(name, shape=shape)
    return dense


def score(s, data, dims, fields):
    dense = served_params(s, dims)
    z = ctr_score.logits(data, lambda ids: s.lookup("emb", ids)[0],
                         lambda ids: s.lookup("wide", ids)[0], dense, fields, 8)
    return ctr_score.auc(data[0], z), ctr_score.logloss(data[0], z)


def worth(d, psd, say, svg=None):
    root = os.path.join(d, "worth")
    staging = os.path.join(root, "staging")
    os.makedirs(os.path.join(root, "stream"))
    r = h.run([h.build_path("worker", "psd-ctrgen"), "--drift", "--out", staging,
               "--parts", str(PARTS), "--per-part", str(PER_PART)], timeout=300)
    if r.returncode:
        raise Failed("psd-ctrgen: %s" % r.stderr)
    with open(os.path.join(staging, "truth.json")) as f:
        truth = {p["name"]: p for p in json.load(f)["parts"]}
    parts = sorted(os.path.basename(p) for p in glob.glob(os.path.join(staging, "part-*.svm")))
    hidden = [32, 16]
    job = {"name": JOB, "model": "ctr",
           "ctr": {"fields": 8, "stream": {"dir": "stream", "poll_s": 0.1}},
           "hidden": hidden, "batch_size": 256, "optimizer": {"type": "adam", "lr": 0.002},
           "tables": CTR_TABLES, "seed": 1, "log_every": 1000,
           "publish": {"dir": "pub", "interval_s": 1, "full_every": 10}}
    widths = [8 * 8] + hidden + [1]
    dims = {}
    for layer in range(len(widths) - 1):
        dims["ctr/w%d" % layer] = (widths[layer], widths[layer + 1])
        dims["ctr/b%d" % layer] = (widths[layer + 1],)
    with Job(root, 2, 4, job) as j:
        frozen_spec = j.write("frozen.json", dict(job, publish={"dir": "frozen",
                                                                "interval_s": 1}))
        for i in range(2):
            j.start("ps:%d" % i)
        for k in range(2):
            j.start("serve:%d" % k)
        w = h.Proc([h.build_path("worker", "dworker"), "--cluster", j.spec, "--task",
                    "worker:0"])
        j.procs["worker"] = w
        live = psd.Serving(j.spec, replica=0)
        frozen = None
        rows = []
        try:
            for n, part in enumerate(parts, 1):
                if n > 1:
                    data = ctr_score.read_svm(os.path.join(staging, part))
                    la, ll = score(live, data, dims, 8)
                    fa, fl = score(frozen, data, dims, 8)
                tmp = os.path.join(root, "stream", "." + part)
                shutil.copy(os.path.join(staging, part), tmp)
                os.rename(tmp, os.path.join(root, "stream", part))
                # The worker scores the part too, before training on it, with
                # the model it pulls from the training shards (its window line).
                wl = w.wait_for("window %d (%s): logloss=" % (n, part), timeout=300)
                wauc = float(wl.split("auc=")[1].split()[0])
                if n > 1:
                    t = truth[part]
                    rows.append((n, part, la, fa, t["true_auc"], ll, fl))
                    say("bench serve worth part=%d name=%s live_auc=%.4f frozen_auc=%.4f "
                        "true_auc=%.4f worker_auc=%.4f live_logloss=%.4f frozen_logloss=%.4f"
                        % (n, part, la, fa, t["true_auc"], wauc, ll, fl))
                w.wait_for("window %d (%s): trained" % (n, part), timeout=300)
                # Served once a publication cut after this line is applied.
                newest = [max(pubread.versions(os.path.join(root, "pub", JOB, "ps-%d" % i))
                              or [0]) for i in range(2)]
                until("a publication after part %d served" % n,
                      lambda: all(v > x for v, x in
                                  zip(live.lookup("emb", np.arange(64, dtype=np.uint64))[2],
                                      newest)), 60)
                if n == 1:
                    shutil.copytree(os.path.join(root, "pub"), os.path.join(root, "frozen"))
                    for k in range(2, 4):
                        j.start("serve:%d" % k, frozen_spec)
                    frozen = psd.Serving(frozen_spec, replica=1)
            open(os.path.join(root, "stream", "END"), "w").close()
            if w.wait(timeout=120) != 0:
                raise Failed("dworker: %s" % w.output()[-2000:])
        finally:
            live.close()
            if frozen:
                frozen.close()
    later = rows[1:]
    la = statistics.mean(r[2] for r in later)
    fa = statistics.mean(r[3] for r in later)
    ta = statistics.mean(r[4] for r in later)
    say("bench serve worth parts=%d per_part=%d interval_s=1 later_parts=%d "
        "live_auc_mean=%.4f frozen_auc_mean=%.4f margin=%.4f true_auc_mean=%.4f"
        % (PARTS, PER_PART, len(later), la, fa, la - fa, ta))
    if svg:
        xs = [r[0] for r in rows]
        svgplot.line_chart(svg, "AUC of each part, scored through the serving tier "
                           "before it is trained on", "part of the stream", "AUC", xs,
                           [("served, updated every second", [r[2] for r in rows], "#1f77b4"),
                            ("frozen after the first part", [r[3] for r in rows], "#d62728"),
                            ("the true model", [r[4] for r in rows], "#7f7f7f")])
        say("bench serve worth: the curve is in %s" % svg)


def serve(d, b=None, parts=("lag", "lookups", "worth"), svg=None):
    psd = psd_mod()
    say = lambda line: print(line, flush=True)  # noqa: E731
    fns = {"lag": lambda: lag(d, psd, say), "lookups": lambda: lookups(d, psd, say),
           "worth": lambda: worth(d, psd, say, svg)}
    for p in parts:
        fns[p]()


def main():
    args = sys.argv[1:]
    svg = None
    if "--svg" in args:
        i = args.index("--svg")
        svg = os.path.abspath(args[i + 1])
        del args[i:i + 2]
    if not args:
        sys.stderr.write(__doc__)
        return 2
    h.BUILD = os.path.abspath(args[0])
    with tempfile.TemporaryDirectory(prefix="psd-bench-serve-") as d:
        serve(d, parts=args[1:] or ("lag", "lookups", "worth"), svg=svg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
