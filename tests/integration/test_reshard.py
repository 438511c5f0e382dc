"""Restoring a checkpoint onto another number of shards (psd --reshard,
docs/reshard.md), with real psd processes and dworkers on 127.0.0.1.

- Sync, deterministic: a CTR job (two tables, a dense MLP, Adam and
  Adagrad) of 2 workers trained 6 steps on 2 shards, resharded onto 3,
  trained 4 more, resharded back onto 2 and trained 4 more ends with every
  value, optimizer slot, table row (value, state, statistics) and step
  count bit for bit equal to the same job run with the same stops on 2
  shards throughout (ckptread.py reads both from the checkpoint files, by
  hand). A shard of the new count started before the reshard refuses to
  start, naming both counts and the command.
- Async: tables and dense variables pushed by a client, 2 -> 3 -> 1:
  after each reshard the job's state is the one before, bit for bit; each
  new shard holds exactly the rows splitmix64(id) % M gives it; a client of
  the new shard count pulls the same values; the old layout is kept beside
  the job's directory.
- Refusals change nothing: the same shard count, no checkpoint, an old
  shard's checkpoint missing or damaged, --reshard with --task.
Run: /usr/bin/python3 test_reshard.py BUILD_DIR"""
import glob
import json
import os
import re
import shutil
import signal

import numpy as np

import harness as h
from faults import SOAK
import pyshards
from ckptread import read_job
from hashes import shard_of

TABLES = [
    {"name": "emb", "dim": 8, "init": "uniform", "init_scale": 0.05,
     "optimizer": {"type": "adagrad", "lr": 0.2, "initial_accumulator": 0.1}},
    {"name": "wide", "dim": 1, "init": "zeros",
     "optimizer": {"type": "adam", "lr": 0.01}},
]
psd = None


def setUpModule():
    global psd
    psd = pyshards.import_psd()


def specs(d, job, counts, nworker=2):
    """A spec per shard count, same job and workers: {count: path}."""
    ports = h.free_ports(max(counts) + nworker)
    out = {}
    for n in counts:
        path = os.path.join(d, "spec%d.json" % n)
        with open(path, "w") as f:
            json.dump({"cluster": {"ps": ["127.0.0.1:%d" % p for p in ports[:n]],
                                   "worker": ["127.0.0.1:%d" % p
                                              for p in ports[max(counts):]]},
                       "job": job}, f)
        out[n] = path
    return out


class ReshardBase(h.ProcTest):
    def shards(self, spec, n, envs=None):
        """Shards 0..n-1 started, each with envs[i] added to its environment
        when given; waited for."""
        ps = []
        for i in range(n):
            extra = (envs or {}).get(i)
            p = h.Proc([h.build_path("ps-server", "psd"), "--cluster", spec, "--task",
                        "ps:%d" % i], env=dict(os.environ, **extra) if extra else None)
            self.procs.append(p)
            ps.append(p)
        for p in ps:
            p.wait_for("ready: listening on")
        return ps

    def stop(self, ps):
        for p in ps:
            self.assertEqual(p.stop(signal.SIGTERM), 0, p.output()[-3000:])
            self.assertIn("checkpoint (at exit)", p.output())

    def reshard(self, spec, *extra, env=None):
        r = h.run([h.build_path("ps-server", "psd"), "--cluster", spec, "--reshard"]
                  + list(extra), timeout=300, env=env)
        return r.returncode, r.stdout + r.stderr

    def reshard_ok(self, spec, *extra):
        rc, out = self.reshard(spec, *extra)
        self.assertEqual(rc, 0, out)
        self.assertIn("reshard: done in", out)
        return out

    def assert_same_state(self, a, b, stats=True):
        self.assertEqual(sorted(a["vars"]), sorted(b["vars"]))
        for name in a["vars"]:
            self.assertTrue(np.array_equal(a["vars"][name], b["vars"][name]), name)
        self.assertEqual(a["opt_step"], b["opt_step"])
        self.assertEqual(sorted(a["tables"]), sorted(b["tables"]))
        for name in a["tables"]:
            ra, rb = a["tables"][name], b["tables"][name]
            self.assertEqual(sorted(ra), sorted(rb), name)
            for i in ra:
                if stats:
                    self.assertEqual(ra[i], rb[i], (name, i))
                else:
                    self.assertEqual(ra[i][3:], rb[i][3:], (name, i))

    def assert_placed(self, state, n):
        self.assertEqual(state["nshards"], n)
        self.assertEqual(len(state["steps"]), n)
        for name, per in state["shard_rows"].items():
            for k, ids in enumerate(per):
                self.assertTrue(all(shard_of(i, n) == k for i in ids), (name, k))



class ReshardTest(ReshardBase):
    # ---- sync: 2 -> 3 -> 2 ends where 2 shards throughout end

    def sync_run(self, spec, n, steps):
        ps = self.shards(spec, n)
        ws = [h.Proc([h.build_path("worker", "dworker"), "--cluster", spec, "--task",
                      "worker:%d" % i, "--max-steps", str(steps)]) for i in range(2)]
        self.procs += ws
        for w in ws:
            self.assertEqual(w.wait(timeout=300), 0, w.output()[-3000:])
        self.stop(ps)

    def test_sync_2_3_2_bit_identical_to_no_reshard(self):
        data = os.path.join(self.d, "data")
        r = h.run([h.build_path("worker", "psd-ctrgen"), "--out", data, "--train", "6000",
                   "--test", "500", "--fields", "8", "--zipf", "1.6"], timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        job = {"model": "ctr", "data_dir": data, "ctr": {"fields": 8},
               "hidden": [16], "batch_size": 128, "epochs": 10,
               "optimizer": {"type": "adam", "lr": 0.01}, "tables": TABLES,
               "seed": 3, "log_every": 100,
               "sync": {"mode": "sync", "deterministic": True}}
        ref = dict(job, name="rs", checkpoint={"dir": os.path.join(self.d, "ref")})
        res = dict(job, name="rs", checkpoint={"dir": os.path.join(self.d, "res")})
        os.mkdir(os.path.join(self.d, "a"))
        os.mkdir(os.path.join(self.d, "b"))
        sref = specs(os.path.join(self.d, "a"), ref, [2])
        sres = specs(os.path.join(self.d, "b"), res, [2, 3])
        for steps in (6, 4, 4):
            self.sync_run(sref[2], 2, steps)
        self.sync_run(sres[2], 2, 6)
        # A shard of 3 before the reshard refuses to start, by name.
        p = h.Proc([h.build_path("ps-server", "psd"), "--cluster", sres[3], "--task", "ps:2"])
        self.procs.append(p)
        self.assertEqual(p.wait(timeout=60), 1, p.output())
        self.assertIn("was written by a job of 2 shards; the spec has 3", p.output())
        self.assertIn("psd --cluster SPEC --reshard", p.output())
        # A spec of fewer addresses than the checkpoint's shards is refused.
        os.mkdir(os.path.join(self.d, "b1"))
        one = specs(os.path.join(self.d, "b1"), res, [1])[1]
        p = h.Proc([h.build_path("ps-server", "psd"), "--cluster", one, "--task", "ps:0"])
        self.procs.append(p)
        self.assertEqual(p.wait(timeout=60), 1, p.output())
        self.assertIn("was written by a job of 2 shards; the spec lists 1 address", p.output())
        before = read_job(os.path.join(self.d, "res"), "rs")
        out = self.reshard_ok(sres[3])
        self.assertIn("the sync checkpoint of 2 shards (step 6", out)
        self.assertRegex(out, r"new ps-2 of 3: [1-9]\d* table rows")
        state = read_job(os.path.join(self.d, "res"), "rs")
        self.assert_placed(state, 3)
        self.assert_same_state(before, state)
        self.sync_run(sres[3], 3, 4)
        before = read_job(os.path.join(self.d, "res"), "rs")
        self.reshard_ok(sres[2])
        state = read_job(os.path.join(self.d, "res"), "rs")
        self.assert_placed(state, 2)
        self.assert_same_state(before, state)
        self.sync_run(sres[2], 2, 4)
        a = read_job(os.path.join(self.d, "ref"), "rs")
        b = read_job(os.path.join(self.d, "res"), "rs")
        self.assertEqual(a["steps"], [14, 14])
        self.assertEqual(b["steps"], [14, 14])
        self.assertGreater(len(a["tables"]["emb"]), 100)
        self.assert_same_state(a, b)
        # The layouts before each reshard are kept beside the job's.
        kept = sorted(os.path.basename(p) for p in glob.glob(
            os.path.join(self.d, "res", "rs.*-shards-*")))
        self.assertEqual([k.split("-shards")[0] for k in kept], ["rs.2", "rs.3"], kept)

    # ---- async: 2 -> 3 -> 1, the state unchanged by each

    def async_train(self, spec):
        rng = np.random.default_rng(5)
        c = psd.Client(spec, None)
        try:
            c.declare("w", (300, 300), init="uniform", init_scale=0.1)  # split
            c.declare("b", (10,))  # whole, on the shard its name hashes to
            c.declare_table("emb", 4)
            c.declare_table("extra", 3)  # not in job.tables: the defaults
            w = np.empty((300, 300), np.float32)
            b = np.empty(10, np.float32)
            for k in range(3):
                ids = rng.integers(0, 1 << 40, 500).astype(np.uint64)
                c.push(["w", "b"], [rng.standard_normal((300, 300)).astype(np.float32),
                                    rng.standard_normal(10).astype(np.float32)])
                c.push_rows("emb", ids, rng.standard_normal((500, 4)).astype(np.float32))
                c.push_rows("extra", ids[:50], np.ones((50, 3), np.float32))
            c.pull(["w", "b"], [w, b])
            return w, b
        finally:
            c.close()

    def pull_all(self, spec, ids):
        c = psd.Client(spec, None)
        try:
            c.declare("w", (300, 300), init="uniform", init_scale=0.1)
            c.declare("b", (10,))
            c.declare_table("emb", 4)
            w = np.empty((300, 300), np.float32)
            b = np.empty(10, np.float32)
            rows = np.empty((len(ids), 4), np.float32)
            c.pull(["w", "b"], [w, b])
            c.pull_rows("emb", ids, rows)
            return w, b, rows
        finally:
            c.close()

    def test_async_2_3_1_state_unchanged_and_placed(self):
        root = os.path.join(self.d, "ck")
        job = {"name": "as", "optimizer": {"type": "adam", "lr": 0.01},
               "tables": [{"name": "emb", "dim": 4, "init": "uniform",
                           "optimizer": {"type": "adagrad", "lr": 0.1}}],
               "checkpoint": {"dir": root}}
        s = specs(self.d, job, [1, 2, 3], nworker=1)
        ps = self.shards(s[2], 2)
        w, b = self.async_train(s[2])
        self.stop(ps)
        before = read_job(root, "as")
        self.assertEqual(before["placement"]["w"], -1)
        ids = np.array(sorted(before["tables"]["emb"]), np.uint64)
        self.assertEqual(len(ids), 1500)
        self.assertEqual(len(before["tables"]["extra"]), 150)
        for n in (3, 1):
            # Onto 3 one new shard per pass (each reads both old ones), as
            # when memory is short; onto 1 in one pass.
            out = self.reshard_ok(s[n], *(["--reshard-memory", "1"] if n == 3 else []))
            self.assertIn("1 of the %d new shards per pass" % n, out)
            self.assertIn("the async checkpoint of %d shards" % before["nshards"], out)
            moved = re.search(r"(\d+) of (\d+) table rows and (\d+) of (\d+) dense", out)
            self.assertEqual(int(moved.group(2)), 1650, out)
            self.assertGreater(int(moved.group(1)), 0, out)
            self.assertEqual(int(moved.group(4)), 300 * 300 + 10, out)
            after = read_job(root, "as")
            self.assert_placed(after, n)
            self.assertEqual(after["steps"], [max(before["steps"])] * n)
            self.assert_same_state(before, after)
            # The shards of the new count serve it: a client pulls the same.
            ps = self.shards(s[n], n)
            pw, pb, rows = self.pull_all(s[n], ids)
            self.assertTrue(np.array_equal(pw, w))
            self.assertTrue(np.array_equal(pb, b))
            want = np.array([np.frombuffer(before["tables"]["emb"][int(i)][3], np.float32)
                             for i in ids])
            self.assertTrue(np.array_equal(rows, want))
            # A client of the old layout (the old spec) is refused, by name.
            with self.assertRaisesRegex(psd.Error, "cluster specs differ"):
                old = s[3 if n == 1 else 2]
                c = psd.Client(old, None)
                try:
                    c.declare_table("emb", 4)
                    c.pull_rows("emb", ids[:4], np.empty((4, 4), np.float32))
                finally:
                    c.close()
            self.stop(ps)
            before = read_job(root, "as")
        kept = glob.glob(os.path.join(root, "as.*-shards-*"))
        self.assertEqual(len(kept), 2, kept)

    # ---- refusals change nothing

    def test_refusals_change_nothing(self):
        root = os.path.join(self.d, "ck")
        job = {"name": "bad", "checkpoint": {"dir": root},
               "tables": [{"name": "emb", "dim": 2}]}
        s = specs(self.d, job, [2, 3], nworker=1)
        rc, out = self.reshard(s[3])
        self.assertEqual(rc, 1, out)
        self.assertIn("no checkpoint in %s/bad/ps-0: nothing to restore" % root, out)
        ps = self.shards(s[2], 2)
        c = psd.Client(s[2], None)
        c.declare_table("emb", 2)
        c.push_rows("emb", np.arange(100, dtype=np.uint64), np.ones((100, 2), np.float32))
        c.close()
        self.stop(ps)
        # Onto the same count: a re-cut that moves nothing.
        rc, out = self.reshard(s[2])
        self.assertEqual(rc, 0, out)
        self.assertIn("0 of 100 table rows and 0 of 0 dense elements moved", out)
        self.assertEqual(len(glob.glob(os.path.join(root, "bad.2-shards-*"))), 1)
        rc, out = self.reshard(s[3], "--task", "ps:0")
        self.assertEqual(rc, 2, out)
        self.assertIn("--reshard restores the whole job's checkpoint", out)
        before = read_job(root, "bad")
        # ps-1's checkpoint damaged: refused by name, nothing changed.
        ck = glob.glob(os.path.join(root, "bad", "ps-1", "ckpt-*", "table-0.bin"))[0]
        with open(ck, "r+b") as f:
            f.seek(100)
            f.write(b"\xff\xff\xff\xff")
        rc, out = self.reshard(s[3])
        self.assertEqual(rc, 1, out)
        self.assertIn("old shard ps-1", out)
        self.assertIn("bad is unchanged", out)
        self.assertEqual(len(os.listdir(root)), 2)  # bad and bad.2-shards-*
        # ps-1's checkpoints gone: refused by name.
        shutil.rmtree(os.path.join(root, "bad", "ps-1"))
        rc, out = self.reshard(s[3])
        self.assertEqual(rc, 1, out)
        self.assertIn("ps-1 holds no checkpoint, but ps-0's newest was written by 2 shards",
                      out)
        self.assertEqual(sorted(os.listdir(os.path.join(root, "bad"))), ["ps-0"])
        after = read_job(root, "bad")
        self.assertEqual(before["steps"][0], after["steps"][0])


# A file system without renameat2's RENAME_EXCHANGE (Linux's NFS client), and
# a process that dies between the two renames psd falls back to there.
SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
int renameat2(int a, const char *from, int b, const char *to, unsigned flags) {
  (void)a; (void)from; (void)b; (void)to; (void)flags;
  errno = EINVAL;
  return -1;
}
int rename(const char *from, const char *to) {
  static int (*real)(const char *, const char *);
  const char *in = getenv("SHIM_DIE_IN"), *end = getenv("SHIM_DIE_END");
  size_t n = strlen(from), m = end ? strlen(end) : 0;
  if (in && end && strstr(from, in) && n >= m && !strcmp(from + n - m, end))
    _exit(9);
  if (!real)
    real = (int (*)(const char *, const char *))dlsym(RTLD_NEXT, "rename");
  return real(from, to);
}
"""


class NoExchangeTest(ReshardBase):
    def test_two_renames_and_a_death_between_them(self):
        src = os.path.join(self.d, "shim.c")
        with open(src, "w") as f:
            f.write(SHIM)
        so = os.path.join(self.d, "shim.so")
        r = h.run(["cc", "-shared", "-fPIC", "-o", so, src, "-ldl"])
        self.assertEqual(r.returncode, 0, r.stderr)
        pre = ":".join(p for p in (os.environ.get("LD_PRELOAD"), so) if p)
        root = os.path.join(self.d, "ck")
        job = {"name": "nx", "checkpoint": {"dir": root},
               "tables": [{"name": "emb", "dim": 2}]}
        s = specs(self.d, job, [2, 3], nworker=1)
        ps = self.shards(s[2], 2)
        c = psd.Client(s[2], None)
        c.declare_table("emb", 2)
        c.push_rows("emb", np.arange(1000, dtype=np.uint64), np.ones((1000, 2), np.float32))
        c.close()
        self.stop(ps)
        before = read_job(root, "nx")
        # No exchange: two renames, the same result.
        rc, out = self.reshard(s[3], env={"LD_PRELOAD": pre})
        self.assertEqual(rc, 0, out)
        after = read_job(root, "nx")
        self.assert_placed(after, 3)
        self.assert_same_state(before, after)
        # Dead between them: no job directory, the new layout whole beside it.
        rc, out = self.reshard(s[2], env={"LD_PRELOAD": pre, "SHIM_DIE_IN": "/.reshard-nx-",
                                                 "SHIM_DIE_END": "/nx"})
        self.assertEqual(rc, 9, out)
        self.assertFalse(os.path.exists(os.path.join(root, "nx")))
        p = h.Proc([h.build_path("ps-server", "psd"), "--cluster", s[2], "--task", "ps:0"])
        self.procs.append(p)
        self.assertEqual(p.wait(timeout=60), 1, p.output())
        self.assertIn("stopped before it finished: run psd --cluster SPEC --reshard again",
                      p.output())
        out = self.reshard_ok(s[2])
        self.assertIn("finished the swap an earlier --reshard began", out)
        after = read_job(root, "nx")
        self.assert_placed(after, 2)
        self.assert_same_state(before, after)
        ps = self.shards(s[2], 2)
        self.stop(ps)


class ReshardCounterTest(ReshardBase):
    """Known gradients pushed by a client between reshards, each reshard
    killed (kill -9) once at a point its log lines mark and then run again;
    the pushes are multiples of 1/8, so every sum is exact in any order."""
    POOL = 60000  # ids
    PER_PUSH = 6000
    ROUNDS = [2, 3, 2] if not SOAK else [2, 3, 1, 4, 2, 3, 2, 1, 3, 2, 4, 2, 3, 2]

    def test_every_acknowledged_push_applied_once(self):
        root = os.path.join(self.d, "ck")
        job = {"name": "cnt", "optimizer": {"type": "sgd", "lr": 1.0},
               "tables": [{"name": "cnt", "dim": 2, "init": "zeros",
                           "optimizer": {"type": "sgd", "lr": 1.0}}],
               "checkpoint": {"dir": root}}
        s = specs(self.d, job, sorted(set(self.ROUNDS)), nworker=1)
        rng = np.random.default_rng(11)
        pool = rng.choice(1 << 50, self.POOL, replace=False).astype(np.uint64)
        want_rows = np.zeros((self.POOL, 2), np.float32)
        want_d = np.zeros(70000, np.float32)  # 280 KB: split
        acked = 0
        for r, n in enumerate(self.ROUNDS):
            if r:
                self.reshard_killed_then_done(s[n], root, "cnt", n, rng)
            ps = self.shards(s[n], n)
            c = psd.Client(s[n], None)
            try:
                c.declare("d", (70000,))
                c.declare_table("cnt", 2)
                for _ in range(4):
                    pick = rng.choice(self.POOL, self.PER_PUSH, replace=False)
                    g = (rng.integers(-8, 9, (self.PER_PUSH, 2)) / 8).astype(np.float32)
                    gd = (rng.integers(-8, 9, 70000) / 8).astype(np.float32)
                    c.push_rows("cnt", pool[pick], g)
                    want_rows[pick] -= g
                    c.push("d", gd)
                    want_d -= gd
                    acked += 2
            finally:
                c.close()
            self.stop(ps)
        ps = self.shards(s[self.ROUNDS[-1]], self.ROUNDS[-1])
        c = psd.Client(s[self.ROUNDS[-1]], None)
        try:
            c.declare("d", (70000,))
            c.declare_table("cnt", 2)
            rows = np.empty((self.POOL, 2), np.float32)
            d = np.empty(70000, np.float32)
            c.pull_rows("cnt", pool, rows)
            c.pull("d", d)
        finally:
            c.close()
        self.assertTrue(np.array_equal(rows, want_rows))
        self.assertTrue(np.array_equal(d, want_d))
        print("counter: %d pushes acknowledged over %d layouts %s, each applied once"
              % (acked, len(self.ROUNDS), self.ROUNDS))

    def reshard_killed_then_done(self, spec, root, job, n, rng):
        """psd --reshard onto n, kill -9 once a line says new shard k is
        written (k random): the job's directory then holds the old layout
        or the new one, the same state either way; run again, it finishes
        (an unfinished directory of the killed run is set aside, named)."""
        before = read_job(root, job)
        k = int(rng.integers(0, n))
        p = h.Proc([h.build_path("ps-server", "psd"), "--cluster", spec, "--reshard"])
        self.procs.append(p)
        p.wait_for("reshard: new ps-%d of %d" % (k, n), timeout=120)
        p.stop(signal.SIGKILL)
        mid = read_job(root, job)
        print("killed after new ps-%d of %d: %d shards' layout" % (k, n, mid["nshards"]))
        self.assertIn(mid["nshards"], (before["nshards"], n))
        self.assert_same_state(before, mid)
        left = glob.glob(os.path.join(root, ".reshard-%s-*" % job))
        out = self.reshard_ok(spec)
        if left:
            self.assertIn("was left by an earlier --reshard that stopped", out)
        after = read_job(root, job)
        self.assert_placed(after, n)
        self.assert_same_state(before, after)


if __name__ == "__main__":
    h.main()
