"""Training shards publish what changed, for serving (docs/serving.md,
"Publishing"): real shards and dworkers training the CTR model (two
embedding tables and dense layers) with job.publish every 0.3 s (sync:
0.1 s), read back with a reader of our own (pubread.py: every CRC and size
checked).

- async: each shard's versions are contiguous from 1, the first is full,
  each delta follows its prev and holds only rows that changed (new, or
  other values than the chain had; a few "emb" rows whose gradients in the
  interval were all 0 are allowed, up to 1 in 200); after the workers
  stop, each shard's chain applied in order equals `psctl export` bit for
  bit (every dense variable, every table row); the last publication's log
  line; after `psctl shrink` the next publications name the evicted ids as
  removed, and the chain again equals the export; Status reports the
  publications; a write that fails is logged and counted in Status, and
  the next publication (retried at the next interval) is full and takes
  its version; a shard restarted publishes a full one, next after its
  highest version; shards exit 0 on SIGTERM;
- rows a pull stores without any push are published too;
- sync: both shards publish the same steps (the commits the coordinator
  marks), versions contiguous on each, a full one every full_every (3).
Run: /usr/bin/python3 test_publish.py BUILD_DIR"""
import json
import os
import struct
import time

import numpy as np

import harness as h
import pyshards
from hashes import shard_of
import pubread

TABLES = [
    {"name": "emb", "dim": 4, "init": "uniform", "init_scale": 0.05,
     "optimizer": {"type": "adagrad", "lr": 0.2, "initial_accumulator": 0.1}},
    {"name": "wide", "dim": 1, "init": "zeros",
     "optimizer": {"type": "adagrad", "lr": 0.2, "initial_accumulator": 0.1},
     "eviction": {"min_count": 4}},
]
GEN = {"train": 24000, "test": 1000, "seed": 7, "zipf": 1.6}
# A full publication every FULL_EVERY[mode]: async keeps to deltas after
# the first, so that the ids evicted later are named as removed in a delta
# (a full one would drop them silently); sync has a full one every 3.
FULL_EVERY = {"async": 1000, "sync": 3}


def job(name, mode):
    return {"name": name, "model": "ctr", "data_dir": "data",
            "ctr": {"fields": 6, "generate": dict(GEN)},
            "hidden": [16], "epochs": 3, "batch_size": 64,
            "optimizer": {"type": "adam", "lr": 0.002}, "tables": TABLES,
            "seed": 1, "log_every": 1000, "sync": {"mode": mode},
            "publish": {"dir": "pub", "interval_s": 0.3 if mode == "async" else 0.1,
                        "full_every": FULL_EVERY[mode], "keep": 1000}}


def load_safetensors(path):
    with open(path, "rb") as f:
        b = f.read()
    n = struct.unpack("<Q", b[:8])[0]
    head = json.loads(b[8:8 + n])
    data = b[8 + n:]
    out = {}
    for k, t in head.items():
        if k == "__metadata__":
            continue
        dt = {"F32": "<f4", "U64": "<u8", "I64": "<i8"}[t["dtype"]]
        out[k] = np.frombuffer(data[t["data_offsets"][0]:t["data_offsets"][1]],
                               dtype=dt).reshape(t["shape"])
    return out


class PublishTest(h.ProcTest):
    def start(self, mode):
        """Shards and the data set; returns the spec."""
        spec = os.path.join(self.d, "spec.json")
        h.write_spec(spec, nps=2, nworker=2, job=job("pub-" + mode, mode))
        r = h.run([h.build_path("worker", "psd-ctrgen"), "--out", os.path.join(self.d, "data"),
                   "--train", str(GEN["train"]), "--test", str(GEN["test"]), "--fields", "6",
                   "--zipf", str(GEN["zipf"]), "--seed", str(GEN["seed"])], timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.shards = [h.start_psd(spec, i) for i in range(2)]
        self.procs += self.shards
        return spec

    def train(self, spec):
        ws = [h.Proc([h.build_path("worker", "dworker"), "--cluster", spec, "--task",
                      "worker:%d" % i]) for i in range(2)]
        self.procs += ws
        for w in ws:
            self.assertEqual(w.wait(timeout=300), 0, w.output()[-3000:])

    def pubdir(self, mode, shard):
        return os.path.join(self.d, "pub", "pub-" + mode, "ps-%d" % shard)

    def chain(self, mode, shard, changed_only=True):
        """Reads every publication of the shard, checks the chain's shape
        (and with changed_only that each delta holds only changed rows);
        returns (the applied State, the publications' manifests)."""
        d = self.pubdir(mode, shard)
        vs = pubread.versions(d)
        self.assertTrue(vs, "no publication in %s" % d)
        self.assertEqual(vs, list(range(1, len(vs) + 1)), "versions not contiguous")
        st, pubs = pubread.State(), []
        fulls = getattr(self, "fulls", {}).get(shard, set())
        st_base = 1  # the version of the chain's full one
        for v in vs:
            p = pubread.read(d, v)
            self.assertEqual((p["job"], p["shard"], p["shards"], p["mode"]),
                             ("pub-" + mode, shard, 2, mode))
            if v == 1:
                self.assertTrue(p["full"], "the first publication is full")
            self.assertEqual(p["full"],
                             v == 1 or v in fulls or v - st_base >= FULL_EVERY[mode], v)
            if p["full"]:
                st_base = v
                self.assertEqual((p["base"], p["prev"]), (v, 0))
            else:
                self.assertEqual((p["base"], p["prev"]), (st_base, v - 1))
                for name, (ids, vals, removed) in p["tables"].items():
                    old = st.tables.get(name, {})
                    same = [i for i, row in zip(ids.tolist(), vals)
                            if i in old and np.array_equal(old[i], row)]
                    # A push may leave a row as it was: an "emb" row whose
                    # every gradient in the interval was 0 (no hidden unit
                    # active for its examples). Rare; a delta that held
                    # rows not pushed since would have many.
                    if changed_only:
                        self.assertLessEqual(len(same), len(ids) // 200 if name == "emb" else 0,
                                             "v%d %s: %d of %d rows unchanged, e.g. %s"
                                             % (v, name, len(same), len(ids), same[:5]))
                    for i in removed.tolist():
                        self.assertIn(i, old, "v%d removes %d never published" % (v, i))
            if pubs:
                self.assertGreaterEqual(p["step"], pubs[-1]["step"])
            st.apply(p)
            pubs.append(p)
        return st, pubs

    def export(self, spec, what=None):
        out = os.path.join(self.d, "export-%s.safetensors" % (what or "dense"))
        r = h.psctl(spec, *(["export"] + ([what] if what else []) + ["--out", out]))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        return load_safetensors(out)

    def differences(self, spec, mode):
        """What differs between the shards' chains and psctl export, as a
        list of strings (empty when they agree bit for bit)."""
        states = [self.chain(mode, s)[0] for s in range(2)]
        diffs = []
        dense = self.export(spec)
        for name, whole in dense.items():
            parts = sorted((st.dense[name] for st in states if name in st.dense),
                           key=lambda x: x[0])
            got = np.concatenate([rows for _, rows in parts]) if parts else None
            if got is None or got.shape != whole.shape or \
                    got.tobytes() != whole.tobytes():
                diffs.append("dense %s" % name)
        for t in TABLES:
            ex = self.export(spec, t["name"])
            rows = {}
            for st in states:
                rows.update(st.tables.get(t["name"], {}))
            ids = sorted(rows)
            if ids != ex["ids"].tolist():
                diffs.append("table %s: ids %d vs %d exported" % (t["name"], len(ids),
                                                                 len(ex["ids"])))
            elif np.stack([rows[i] for i in ids]).tobytes() != ex["values"].tobytes():
                diffs.append("table %s: values" % t["name"])
        return diffs

    def until_equal(self, spec, mode, timeout=30):
        """Waits (deadline) until the chains equal the export."""
        deadline = time.monotonic() + timeout
        while True:
            diffs = self.differences(spec, mode)
            if not diffs:
                return
            if time.monotonic() > deadline:
                self.fail("the chains differ from psctl export: %s" % diffs)
            time.sleep(0.2)

    def stop_shards(self):
        """SIGTERM: every shard must exit 0 (its publisher stopped)."""
        rcs = [p.stop() for p in self.shards]
        self.assertEqual(rcs, [0, 0], "\n".join(p.output()[-2000:] for p in self.shards))

    def status(self, spec):
        r = h.psctl(spec, "--json", "status")
        self.assertEqual(r.returncode, 0, r.stderr)
        return json.loads(r.stdout)["shards"]

    def test_async_chain_equals_export_and_removes_evicted(self):
        spec = self.start("async")
        self.train(spec)
        self.until_equal(spec, "async")
        for s in range(2):
            st, pubs = self.chain("async", s)
            self.assertGreaterEqual(len(pubs), 2, "publications of ps:%d" % s)
            self.assertTrue(any(not p["full"] for p in pubs), "no delta")
            self.assertTrue(st.tables["emb"], "no emb rows on ps:%d" % s)
            print("\nps:%d: %s" % (s, " ".join(
                "v%d%s@%d:%d" % (p["version"], "F" if p["full"] else "", p["step"],
                                 sum(len(t[0]) for t in p["tables"].values()))
                for p in pubs)))
            # One line per publication: version, step, rows, bytes, ms.
            p = pubs[-1]
            want = "publication %d (%s) of step %d: %d rows, %d removed, 4 variables, " % (
                p["version"], "full" if p["full"] else "delta", p["step"],
                sum(len(t[0]) for t in p["tables"].values()),
                sum(len(t[2]) for t in p["tables"].values()))
            line = self.shards[s].wait_for(want)
            self.assertRegex(line, r" info: .* variables, [0-9.]+ [KM]?i?B in \d+ ms$")
        sts = self.status(spec)
        for s in range(2):
            p = sts[s]["publish"]
            self.assertEqual(os.path.realpath(p["dir"]),
                             os.path.realpath(self.pubdir("async", s)))
            self.assertGreaterEqual(p["version"], 2)
            self.assertEqual(p["failed"], 0)
            self.assertEqual(p["error"], "")
        # Eviction: the next publications name the evicted ids as removed.
        before = [dict(self.chain("async", s)[0].tables["wide"]) for s in range(2)]
        last = [pubread.versions(self.pubdir("async", s))[-1] for s in range(2)]
        r = h.psctl(spec, "--json", "shrink", "wide")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        evicted = sum(x["evicted"] for x in json.loads(r.stdout)["shards"])
        self.assertGreater(evicted, 0)
        self.until_equal(spec, "async")
        removed = 0
        for s in range(2):
            st, pubs = self.chain("async", s)
            gone = set(before[s]) - set(st.tables["wide"])
            named = set()
            for p in pubs[last[s]:]:
                named |= set(p["tables"]["wide"][2].tolist())
            self.assertEqual(named, gone, "ps:%d" % s)
            removed += len(gone)
        self.assertEqual(removed, evicted)
        # A write that fails is refused loudly and counted; the next one is
        # full and takes its version.
        top = pubread.versions(self.pubdir("async", 0))[-1]
        block = os.path.join(self.pubdir("async", 0),
                             ".tmp-%d-%d" % (top + 1, self.shards[0].p.pid))
        open(block, "w").close()
        row = next(i for i in range(1 << 40, (1 << 40) + 100) if shard_of(i, 2) == 0)
        r = h.pstool(spec, "rows", "emb", "4", "push", str(row), "0.5,0.5,0.5,0.5")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.shards[0].wait_for("error: publication failed: cannot create %s: File exists; "
                                "the next one is full" % block)
        p = self.status(spec)[0]["publish"]
        # failed at least once (the next interval, before this Status, may
        # fail again on a loaded machine), nothing written past top
        self.assertEqual(p["version"], top)
        self.assertGreaterEqual(p["failed"], 1)
        self.assertIn("cannot create %s" % block, p["error"])
        os.remove(block)
        self.shards[0].wait_for("publication %d (full) of step" % (top + 1))
        self.fulls = {0: {top + 1}}
        self.until_equal(spec, "async")
        p = self.status(spec)[0]["publish"]
        # Failed once or more: each interval before the block went tried
        # again (a slow machine's, ASan's, can fit a second), each taking
        # the same version.
        self.assertEqual((p["version"], p["full"], p["error"]), (top + 1, True, ""))
        self.assertGreaterEqual(p["failed"], 1)
        # A shard restarted goes on after its highest version, with a full
        # one (it restarts empty: no checkpoint dir).
        top = pubread.versions(self.pubdir("async", 1))[-1]
        self.assertEqual(self.shards[1].stop(), 0)
        self.shards[1] = h.start_psd(spec, 1)
        self.procs.append(self.shards[1])
        self.shards[1].wait_for("publication %d (full) of step 0" % (top + 1))
        p = pubread.read(self.pubdir("async", 1), top + 1)
        self.assertEqual((p["full"], p["base"], p["prev"]), (True, top + 1, 0))
        self.assertEqual(pubread.versions(self.pubdir("async", 1)),
                         list(range(1, top + 2)))
        self.stop_shards()

    def test_rows_stored_by_pulls_alone_are_published(self):
        """A pull stores a row (admission "always") without any push: the
        next publication holds it (an async shard skips only an interval
        in which nothing changed)."""
        spec = self.start("async")
        psd = pyshards.import_psd()
        c = psd.Client(spec, None)
        self.addCleanup(c.close)
        c.declare_table("emb", 4)
        ids = np.arange(1, 201, dtype=np.uint64)
        out = np.empty((len(ids), 4), np.float32)
        c.push_rows("emb", ids[:100], np.ones((100, 4), np.float32))
        self.until_published(ids[:100])
        c.pull_rows("emb", ids[100:], out[100:])  # stored, never pushed
        self.until_published(ids)

    def until_published(self, ids, timeout=15):
        deadline = time.monotonic() + timeout
        while True:
            held = set()
            for s in range(2):
                if pubread.versions(self.pubdir("async", s)):
                    held |= set(self.chain("async", s, changed_only=False)[0]
                                .tables.get("emb", {}))
            if set(ids.tolist()) <= held:
                return
            if time.monotonic() > deadline:
                self.fail("ids %s never published" % sorted(set(ids.tolist()) - held)[:5])
            time.sleep(0.1)

    def test_sync_shards_publish_the_same_steps(self):
        spec = self.start("sync")
        self.train(spec)
        steps = []
        for s in range(2):
            _, pubs = self.chain("sync", s, changed_only=False)
            steps.append([(p["version"], p["step"]) for p in pubs])
        print("\nsync: (version, step) %s" % steps[0])
        self.assertGreaterEqual(len(steps[0]), 2, steps)
        # the last commit's publication may still be on its way on one
        n = min(len(steps[0]), len(steps[1]))
        self.assertGreaterEqual(n, 2)
        self.assertEqual(steps[0][:n], steps[1][:n])
        self.assertEqual(len(set(st for _, st in steps[0])), len(steps[0]))
        _, pubs = self.chain("sync", 0, changed_only=False)
        self.assertGreaterEqual(len(pubs), 4, "no second full one")
        self.stop_shards()


if __name__ == "__main__":
    h.main()
