#!/usr/bin/env python3
"""A live reshard by stop and cut (psctl reshard --shards M --stop, and a
job that cannot move live, docs/reshard.md "Live"): the shards of a
running job stop for it, ps:0 cuts the checkpoint onto M and
every shard starts again in the new layout, in the same process. Here: the
state is unchanged and placed for M, each variable as declared (split, or
on its shard) through 2 -> 3 -> 2 -> 1 -> 2 -> 3, with a standby outside
both layouts following each; refusals change nothing; a shard, and
ps:0 in the middle of its cut, killed (kill -9) and started again leave one
whole layout; workers that train through reshards (async: every
acknowledged push applied once; sync: bit-identical to no reshard)."""
import os
import signal
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402
import test_reshard as tr  # noqa: E402
from ckptread import read_job  # noqa: E402
from hashes import shard_of  # noqa: E402

psd = None


def setUpModule():
    global psd
    tr.setUpModule()
    psd = tr.psd


def wait_count(p, needle, k, timeout=60):
    """Waits until p has printed needle on k lines (polling its output)."""
    deadline = time.monotonic() + timeout
    while sum(needle in line for line in list(p.lines)) < k:
        if time.monotonic() > deadline or p.p.poll() is not None:
            raise AssertionError("%r not printed %d times; output:\n%s"
                                 % (needle, k, p.output()[-3000:]))
        time.sleep(0.01)


def jansson_compact(v):
    """v as jansson writes it with JSON_COMPACT | JSON_SORT_KEYS (what a
    checkpoint manifest's checksum is taken over): reals as "%.17g"."""
    import json
    if isinstance(v, dict):
        return "{" + ",".join(json.dumps(k, ensure_ascii=False) + ":" + jansson_compact(v[k])
                              for k in sorted(v)) + "}"
    if isinstance(v, list):
        return "[" + ",".join(jansson_compact(x) for x in v) + "]"
    if isinstance(v, float):
        t = "%.17g" % v
        return t if any(c in t for c in ".eE") else t + ".0"
    return json.dumps(v, ensure_ascii=False)


class LiveBase(tr.ReshardBase):
    JOB = "lv"

    def seeded(self, pushes=2):
        """A job of 2 shards with rows and a split dense variable in its
        checkpoint, written through a 2-address spec; returns (specs {2, 3},
        root, the values pushed). The 3-address spec's ps:2 stands by."""
        self.root = os.path.join(self.d, "ck")
        job = {"name": self.JOB, "optimizer": {"type": "sgd", "lr": 1.0},
               "tables": [{"name": "cnt", "dim": 2, "init": "zeros",
                           "optimizer": {"type": "sgd", "lr": 1.0}}],
               "checkpoint": {"dir": self.root}, "shards": 2}
        s = tr.specs(self.d, job, [2, 3], nworker=1)
        ps = self.shards(s[2], 2)
        rng = np.random.default_rng(5)
        self.ids = rng.choice(1 << 50, 3000, replace=False).astype(np.uint64)
        self.rows = np.zeros((3000, 2), np.float32)
        self.dense = np.zeros(70000, np.float32)
        # Small ones placed by the declaration: split, and whole on ps:1.
        self.small = {"sp": np.zeros((10, 3), np.float32), "b1": np.zeros(4, np.float32)}
        c = psd.Client(s[2], None)
        try:
            c.declare("d", (70000,))
            self.declare_small(c)
            c.declare_table("cnt", 2)
            for _ in range(pushes):
                g = (rng.integers(-8, 9, (3000, 2)) / 8).astype(np.float32)
                gd = (rng.integers(-8, 9, 70000) / 8).astype(np.float32)
                c.push_rows("cnt", self.ids, g)
                c.push("d", gd)
                self.rows -= g
                self.dense -= gd
                for name, v in self.small.items():
                    gs = (rng.integers(-8, 9, v.shape) / 8).astype(np.float32)
                    c.push(name, gs)
                    v -= gs
        finally:
            c.close()
        self.stop(ps)
        return s

    def declare_small(self, c):
        """The small variables as every client declares them."""
        c.declare("sp", (10, 3), placement="split")
        c.declare("b1", (4,), placement=1)

    def start3(self, spec):
        """ps:0..ps:2 of the 3-address spec: the first two serve the
        checkpoint's 2-shard layout, ps:2 stands by."""
        ps = self.shards(spec, 3)
        self.assertIn("standing by: the job's layout 0 has 2 shards", ps[2].output())
        return ps

    def reshard_begun(self):
        """The seeded job on 3 addresses (ps:2 standing by), its state, and
        `psctl reshard --shards 3` started: (specs, shards, state, psctl)."""
        s = self.seeded(pushes=1)
        ps = self.start3(s[3])
        before = read_job(self.root, self.JOB)
        first = h.Proc([h.build_path("ps-server", "psctl"), "--cluster", s[3], "reshard",
                        "--shards", "3", "--stop"])
        self.procs.append(first)
        return s, ps, before, first

    def psctl_reshard(self, spec, m):
        r = h.psctl(spec, "reshard", "--shards", str(m), "--stop", timeout=300)
        return r.returncode, r.stdout + r.stderr

    def reshard_ok(self, spec, m, layout):
        rc, out = self.psctl_reshard(spec, m)
        self.assertEqual(rc, 0, out)
        self.assertIn("reshard done in", out)
        self.assertIn("%d shards, layout %d" % (m, layout), out)
        return out

    def status(self, spec, shard):
        import json
        r = h.psctl(spec, "--json", "status")
        doc = json.loads(r.stdout)
        return doc["shards"][shard]


class LiveReshardTest(LiveBase):
    def test_grow_then_shrink_state_unchanged_same_processes(self):
        s = self.seeded()
        ps = self.start3(s[3])
        pids = [p.p.pid for p in ps]
        before = read_job(self.root, self.JOB)
        out = self.reshard_ok(s[3], 3, 1)
        self.assertIn("ps:2: serves layout 1", out)
        self.assert_psctl_rows(s[3], 3)
        self.assertRegex(out, r"done: layout 1 of 3 shards from 2, step \d+, [1-9]\d* of 3000 "
                              r"table rows")
        mid = read_job(self.root, self.JOB)
        self.assert_placed(mid, 3)
        self.assert_same_state(before, mid)
        for p, pid in zip(ps, pids):
            self.assertIsNone(p.p.poll(), p.output()[-2000:])
            self.assertEqual(p.p.pid, pid)
            self.assertIn("reshard: starting again (same process, pid %d)" % pid, p.output())
        out = self.reshard_ok(s[3], 2, 2)
        self.assertIn("ps:2: stands by outside layout 2", out)
        after = read_job(self.root, self.JOB)
        self.assert_placed(after, 2)
        self.assert_same_state(before, after)
        ps[2].wait_for("standing by: the job's layout 2 has 2 shards")
        self.assert_pulled(s[3])
        # Through one shard and back: ps:2, outside both layouts, follows
        # each (it stood by in layout 2 and refused the next reshard to 3),
        # and the declared placements come back (through one shard, split
        # and whole looked alike: the split variable came back whole).
        self.reshard_ok(s[3], 1, 3)
        wait_count(ps[2], "standing by: the job's layout 3 has 1 shard", 1)
        wait_count(ps[2], "ready: listening on", 4)  # its 4th start
        self.assertEqual(self.status(s[3], 2)["layout"], 3)
        self.reshard_ok(s[3], 2, 4)
        wait_count(ps[2], "standing by: the job's layout 4 has 2 shards", 1)
        wait_count(ps[2], "ready: listening on", 5)
        self.assertEqual(self.status(s[3], 2)["layout"], 4)
        mid = read_job(self.root, self.JOB)
        self.assert_placed(mid, 2)
        self.assertEqual((mid["placement"]["sp"], mid["placement"]["b1"]), (-1, 1))
        self.assert_same_state(before, mid)
        self.assert_pulled(s[3])  # declared as before, accepted
        self.reshard_ok(s[3], 3, 5)
        after = read_job(self.root, self.JOB)
        self.assert_placed(after, 3)
        self.assertEqual((after["placement"]["sp"], after["placement"]["b1"]), (-1, 1))
        self.assert_same_state(before, after)

    def test_checkpoint_before_buckets_goes_on_by_modulo_until_resharded(self):
        """A checkpoint whose manifest names no rule for rows (written
        before bucket maps) is resumed by splitmix64(id) % n: psd says so,
        its status says "modulo", a fresh client (which plans by buckets)
        is told once and follows; a live reshard cuts it into buckets."""
        import glob
        import json
        import zlib
        root = os.path.join(self.d, "ck")
        job = {"name": "lg", "optimizer": {"type": "sgd", "lr": 1.0},
               "tables": [{"name": "cnt", "dim": 2, "init": "zeros",
                           "optimizer": {"type": "sgd", "lr": 1.0}}],
               "checkpoint": {"dir": root}, "shards": 1}
        spec = tr.specs(self.d, job, [2], nworker=1)[2]
        ids = np.arange(1000, 1300, dtype=np.uint64)
        g = np.ones((300, 2), np.float32)
        ps = self.shards(spec, 2)
        c = psd.Client(spec, None)
        try:
            c.declare_table("cnt", 2)
            c.push_rows("cnt", ids, g)
        finally:
            c.close()
        self.stop(ps[:1])
        self.assertEqual(ps[1].stop(signal.SIGTERM), 0, ps[1].output()[-2000:])
        newest = sorted(glob.glob(os.path.join(root, "lg", "ps-0", "ckpt-*")))[-1]
        path = os.path.join(newest, "manifest.json")
        with open(path) as f:
            m = json.load(f)
        self.assertEqual(m.pop("rows"), "buckets")
        m.pop("checksum")
        m["checksum"] = zlib.crc32(jansson_compact(m).encode())
        with open(path, "w") as f:
            json.dump(m, f)
        ps = self.shards(spec, 2)
        self.assertIn("place table rows by splitmix64(id) % 1 (written before bucket "
                      "maps)", ps[0].output())
        self.assertEqual(self.status(spec, 0)["rows"], "modulo")
        pulled = self.pull_cnt(spec, ids)
        self.assertTrue(np.array_equal(pulled, -g))
        self.reshard_ok(spec, 2, 1)
        self.assertEqual(self.status(spec, 0)["rows"], "buckets")
        after = read_job(root, "lg")
        self.assert_placed(after, 2)
        for k in range(2):
            newest = sorted(glob.glob(os.path.join(root, "lg", "ps-%d" % k, "ckpt-*")))[-1]
            with open(os.path.join(newest, "manifest.json")) as f:
                self.assertEqual(json.load(f)["rows"], "buckets")
        self.assertTrue(np.array_equal(self.pull_cnt(spec, ids), -g))

    def pull_cnt(self, spec, ids):
        """A fresh client's pull of table cnt's rows of ids."""
        rows = np.empty((len(ids), 2), np.float32)
        c = psd.Client(spec, None)
        try:
            c.declare_table("cnt", 2)
            c.pull_rows("cnt", ids, rows)
        finally:
            c.close()
        return rows

    def assert_psctl_rows(self, spec, n):
        """A fresh psctl of spec (job.shards 2) reads the job's layout of n
        shards first: each id is asked of its home shard there, and its row
        is the one pushed."""
        import json
        pick = list(range(0, 3000, 97))
        ids = ",".join(str(int(self.ids[i])) for i in pick)
        r = h.psctl(spec, "--json", "get", "cnt", "--ids", ids)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        got = {int(e["id"]): e for e in json.loads(r.stdout)["rows"]}
        for i in pick:
            e = got[int(self.ids[i])]
            self.assertEqual(e["shard"], shard_of(int(self.ids[i]), n), e)
            self.assertEqual(e["value"], self.rows[i].tolist(), e)

    def assert_pulled(self, spec):
        """A client of spec declares every variable as the seeding one did,
        and pulls the values pushed."""
        c = psd.Client(spec, None)
        try:
            c.declare("d", (70000,))
            self.declare_small(c)
            c.declare_table("cnt", 2)
            rows = np.empty((3000, 2), np.float32)
            d = np.empty(70000, np.float32)
            c.pull_rows("cnt", self.ids, rows)
            c.pull("d", d)
            for name, want in self.small.items():
                got = np.empty_like(want)
                c.pull(name, got)
                self.assertTrue(np.array_equal(got, want), name)
        finally:
            c.close()
        self.assertTrue(np.array_equal(rows, self.rows))
        self.assertTrue(np.array_equal(d, self.dense))

    def test_refusals_change_nothing(self):
        s = self.seeded(pushes=1)
        ps = self.start3(s[3])
        before = read_job(self.root, self.JOB)
        for m, words in ((4, "shards 4: the spec's cluster.ps lists 3 addresses; "
                             "expected 1..3"),
                         (2, "the job has 2 shards already (layout 0); nothing to do")):
            rc, out = self.psctl_reshard(s[3], m)
            self.assertEqual(rc, 1, out)
            self.assertIn(words, out)
        # A count below 1 is a usage error, ps:0 not asked (docs/reshard.md).
        rc, out = self.psctl_reshard(s[3], 0)
        self.assertEqual(rc, 2, out)
        self.assertIn("psctl: --shards takes a shard count >= 1, not '0'", out)
        # A new shard that does not answer: stopped (SIGSTOP), then not running.
        ps[2].p.send_signal(signal.SIGSTOP)
        rc, out = self.psctl_reshard(s[3], 3)
        ps[2].p.send_signal(signal.SIGCONT)
        self.assertEqual(rc, 1, out)
        self.assertIn("ps:2 (127.0.0.1:", out)
        self.assertIn("is not reachable (DEADLINE_EXCEEDED", out)
        self.assertEqual(ps[2].stop(signal.SIGTERM), 0, ps[2].output())
        rc, out = self.psctl_reshard(s[3], 3)
        self.assertEqual(rc, 1, out)
        self.assertIn("is not reachable (UNAVAILABLE", out)
        self.assertIn("start it (psd --cluster SPEC --task ps:2) and ask again; nothing changed",
                      out)
        after = read_job(self.root, self.JOB)
        self.assertEqual(after["nshards"], 2)
        self.assert_same_state(before, after)
        self.assertFalse(os.path.exists(os.path.join(self.root, ".live-lv-L1")))
        for p in ps[:2]:
            self.assertNotIn("reshard: starting again", p.output())
        # A job without checkpoints cannot be resharded live.
        d2 = os.path.join(self.d, "nock")
        os.mkdir(d2)
        s2 = tr.specs(d2, {"name": "nock", "shards": 1}, [2], nworker=1)[2]
        ps2 = self.shards(s2, 2)
        self.assertIn("standing by: the job's layout 0 has 1 shard", ps2[1].output())
        rc, out = self.psctl_reshard(s2, 2)
        self.assertEqual(rc, 1, out)
        self.assertIn("this job writes none: set job.checkpoint.dir", out)

    def test_source_and_destination_killed_mid_reshard(self):
        """ps:1 (a source) and ps:2 (the destination) killed (kill -9) as
        they stop for the reshard, a second reshard asked for meanwhile
        (refused), both started again as a supervisor would: they wait for
        ps:0, which cuts, and the job ends in the new layout, whole."""
        s, ps, before, first = self.reshard_begun()
        # Killed once they answered ps:0 and stopped taking calls: ps:1 with
        # its final checkpoint written, ps:2 (which has none) at its stop.
        ps[1].wait_for("checkpoint (at exit)")
        ps[1].stop(signal.SIGKILL)
        ps[2].wait_for("no checkpoint written at exit")
        ps[2].stop(signal.SIGKILL)
        rc, out = self.psctl_reshard(s[3], 3)
        self.assertEqual(rc, 1, out)
        self.assertIn("reshard refused by ps:0", out)
        again = [h.Proc([h.build_path("ps-server", "psd"), "--cluster", s[3], "--task",
                         "ps:%d" % i]) for i in (1, 2)]
        self.procs += again
        self.assertEqual(first.wait(timeout=300), 0, first.output())
        for i, p in zip((1, 2), again):
            p.wait_for("ready: listening on", timeout=120)
            # Started before ps:0 wrote the reshard's result, a shard waits
            # for it; started after (ps:0 cuts from the checkpoints on disk
            # and may be done first), it loads the new layout. Either way it
            # serves as shard i of 3, never in the old layout.
            out = p.output()
            if "is under way: waiting for ps:0 to finish it" not in out:
                self.assertIn("the job's checkpoints are of layout 1, 3 shards", out)
            self.assertIn("shard %d of 3," % i, out)
        after = read_job(self.root, self.JOB)
        self.assert_placed(after, 3)
        self.assert_same_state(before, after)

    def test_coordinator_killed_mid_cut(self):
        """ps:0 killed (kill -9) while it cuts: started again, it marks the
        reshard interrupted, the others start again in the layout the
        directory holds (the old one, whole), psctl says so (exit 1); asked
        again, the reshard is done."""
        s, ps, before, first = self.reshard_begun()
        ps[0].wait_for("reshard: new ps-1 of 3", timeout=120)
        ps[0].stop(signal.SIGKILL)
        ps0 = h.Proc([h.build_path("ps-server", "psd"), "--cluster", s[3], "--task", "ps:0"])
        self.procs.append(ps0)
        ps0.wait_for("ready: listening on", timeout=120)
        self.assertIn("has no result: ps:0 stopped before it finished", ps0.output())
        self.assertEqual(first.wait(timeout=300), 1, first.output())
        self.assertIn("reshard not done: ps:0 says interrupted", first.output())
        for p in ps[1:]:
            wait_count(p, "ready: listening on", 2)  # started again
        wait_count(ps[2], "standing by: the job's layout 0 has 2 shards", 2)
        mid = read_job(self.root, self.JOB)
        self.assertEqual(mid["nshards"], 2)
        self.assert_same_state(before, mid)
        self.reshard_ok(s[3], 3, 1)
        after = read_job(self.root, self.JOB)
        self.assert_placed(after, 3)
        self.assert_same_state(before, after)


class LiveSyncTest(LiveBase):
    """A deterministic sync CTR job (2 tables with Adagrad and Adam, an MLP
    with Adam, 2 dworkers) resharded live 2 -> 3 -> 2 while it trains ends
    bit-identical to the same job on 2 shards throughout: ps:0 stops the
    shards between two steps, so no step is redone and no batch skipped."""
    STEPS = 300

    def job(self, data, root):
        return {"name": "ls", "model": "ctr", "data_dir": data, "ctr": {"fields": 8},
                "hidden": [16], "batch_size": 64, "epochs": 10,
                "optimizer": {"type": "adam", "lr": 0.01}, "tables": tr.TABLES,
                "seed": 3, "log_every": 1, "shards": 2,
                "sync": {"mode": "sync", "deterministic": True},
                "checkpoint": {"dir": root}}

    def workers(self, spec):
        ws = [h.Proc([h.build_path("worker", "dworker"), "--cluster", spec, "--task",
                      "worker:%d" % i, "--max-steps", str(self.STEPS)]) for i in range(2)]
        self.procs += ws
        return ws

    def finish(self, ws, ps):
        for w in ws:
            self.assertEqual(w.wait(timeout=300), 0, w.output()[-3000:])
            self.assertNotIn("redone=", w.output())
        for p in ps:
            self.assertEqual(p.stop(signal.SIGTERM), 0, p.output()[-3000:])

    def test_sync_2_3_2_live_bit_identical_to_no_reshard(self):
        data = os.path.join(self.d, "data")
        r = h.run([h.build_path("worker", "psd-ctrgen"), "--out", data, "--train", "4000",
                   "--test", "200", "--fields", "8", "--zipf", "1.6"], timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        for sub in ("a", "b"):
            os.mkdir(os.path.join(self.d, sub))
        ref_root, live_root = os.path.join(self.d, "ref"), os.path.join(self.d, "live")
        sref = tr.specs(os.path.join(self.d, "a"), self.job(data, ref_root), [2])[2]
        slive = tr.specs(os.path.join(self.d, "b"), self.job(data, live_root), [3])[3]
        ps = self.shards(sref, 2)
        self.finish(self.workers(sref), ps)
        ps = self.shards(slive, 3)
        self.assertIn("standing by: the job's layout 0 has 2 shards", ps[2].output())
        ws = self.workers(slive)
        for at, m, v in ((10, 3, 1), (40, 2, 2)):
            # The workers paused (SIGSTOP) mid-step while ps:0 takes the
            # request and holds the next step's pulls: the reshard comes
            # while they train, at a step the test does not choose.
            ws[0].wait_for("step %d/" % at, timeout=120)
            for w in ws:
                w.p.send_signal(signal.SIGSTOP)
            p = h.Proc([h.build_path("ps-server", "psctl"), "--cluster", slive, "reshard",
                        "--shards", str(m), "--stop"])
            self.procs.append(p)
            wait_count(ps[0], "are held; waiting for the commit", v)
            for w in ws:
                w.p.send_signal(signal.SIGCONT)
            self.assertEqual(p.wait(timeout=300), 0, p.output())
            self.assertIn("%d shards, layout %d" % (m, v), p.output())
        self.finish(ws, ps)
        for w in ws:
            self.assertIn("layout moved: now layout 1 of 3 shards", w.output())
            self.assertIn("layout moved: now layout 2 of 2 shards", w.output())
        for p in ps:
            self.assertEqual(p.output().count("reshard: starting again"), 2)
        ref, live = read_job(ref_root, "ls"), read_job(live_root, "ls")
        self.assertEqual(live["nshards"], 2)
        self.assert_same_state(ref, live)


if __name__ == "__main__":
    h.main()
