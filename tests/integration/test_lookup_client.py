"""The serving client end to end (psd.Serving over psc_serving, and psctl
serving) against real serving tasks, psd --task serve:J, of a job of 2
shards with 2 replicas each, with the job's bearer token:

- over publications of known contents written by psd's own writer
  (tests/tools/pubwrite): a lookup of ids of both shards, in any order and
  with repeats, answers the published rows bit for bit (found) and the
  table's initial rows for ids never published (not found), with each
  shard's version; a dense variable is assembled from both shards' rows; a
  delta is seen once published; psctl serving shows each task's version,
  step, rows and lookups; a replica killed with SIGKILL is left for the
  other replica of its shard while lookups go on, and psctl names it;
- over a training job that publishes (job.publish): rows pushed by a
  worker reach the serving tasks, and a lookup answers what a training
  pull answers.

Run: /usr/bin/python3 test_lookup_client.py BUILD_DIR [Case.test_name]"""
import json
import os
import signal
import struct
import subprocess
import sys
import time

import numpy as np

import harness as h
import pyshards
from hashes import M64, fnv1a64, mix64, shard_of, splitmix64_at

JOB = "lookupjob"
TOKEN = "lookup-token-0123456789abcdef"
SEED = 5
EMB = {"name": "emb", "dim": 3, "init": "uniform", "init_scale": 0.25}
W = (4, 2)  # dense "w": rows 0..2 on shard 0, 2..4 on shard 1
psd = None


def setUpModule():
    global psd
    psd = pyshards.import_psd()


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def initial_row(i):
    """docs/tables.md's initial row of id i of EMB (cm_table_init_row)."""
    scale = f32(EMB["init_scale"])
    key = mix64(splitmix64_at(SEED ^ fnv1a64(EMB["name"])) ^ splitmix64_at(i))
    return [f32((2 * ((splitmix64_at((key + j) & M64) >> 40) * 2.0**-24) - 1) * scale)
            for j in range(EMB["dim"])]


def ids_of(shard, n, start=1):
    out, i = [], start
    while len(out) < n:
        if shard_of(i, 2) == shard:
            out.append(i)
        i += 1
    return out


def row_value(i, version):
    return [f32(i * 0.001 + version), f32(-i / 7.0), f32(version * 0.5)]


def dense_value(shard, version):
    b, e = (0, 2) if shard == 0 else (2, 4)
    return b, e, [f32(version * 10 + shard * 100 + k + 0.5) for k in range((e - b) * W[1])]


class ServingCase(h.ProcTest):
    """A spec of 2 shards, 1 worker and 4 serving tasks, with a token and
    job.publish."""

    def setUp(self):
        super().setUp()
        h.write_secret(self.d, "token", TOKEN + "\n")
        ports = h.free_ports(7)
        self.serve_addrs = ["127.0.0.1:%d" % p for p in ports[3:7]]
        self.spec = os.path.join(self.d, "spec.json")
        with open(self.spec, "w") as f:
            json.dump({"cluster": {"ps": ["127.0.0.1:%d" % p for p in ports[:2]],
                                   "worker": ["127.0.0.1:%d" % ports[2]],
                                   "serve": self.serve_addrs},
                       "job": {"name": JOB, "seed": SEED, "tables": [EMB],
                               "retry_s": 20, "rpc_timeout_ms": 5000,
                               "publish": {"dir": "pub", "interval_s": 1}},
                       "auth": {"token_file": "token"}}, f)
        self.pub = os.path.join(self.d, "pub")
        self.serving = {}

    def start_serving(self, j):
        p = h.Proc([h.build_path("ps-server", "psd"), "--cluster", self.spec,
                    "--task", "serve:%d" % j])
        p.wait_for("ready: listening on")
        self.procs.append(p)
        self.serving[j] = p
        return p

    def client(self, **kw):
        s = psd.Serving(self.spec, **kw)
        self.addCleanup(s.close)
        return s

    def until(self, what, cond, timeout=20):
        """Polls cond() (a condition, never a fixed sleep) until true."""
        return h.until(what, cond, timeout)


class PublishedCase(ServingCase):
    """Serving tasks over publications of known contents."""

    def write(self, shard, version, full, base, rows, removed=()):
        lines = ["table emb 3"]
        lines += ["row %d %s" % (i, " ".join(float(x).hex() for x in rows[i]))
                  for i in sorted(rows)]
        lines += ["removed %d" % i for i in sorted(removed)]
        b, e, vals = dense_value(shard, version)
        lines.append("dense w %d %d %d,%d %s" % (b, e, W[0], W[1],
                                                 " ".join(v.hex() for v in vals)))
        d = os.path.join(self.pub, JOB, "ps-%d" % shard)
        r = subprocess.run([h.build_path("tests", "pubwrite"), d, JOB, str(shard), "2",
                            str(version), "full" if full else "delta", str(base),
                            str(version * 100)],
                           input="\n".join(lines) + "\n", text=True, capture_output=True,
                           timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)

    def expect(self, ids, rows, found, want):
        for k, i in enumerate(ids):
            if i in want:
                self.assertTrue(found[k], "id %d" % i)
                self.assertEqual(rows[k].tobytes(), np.array(want[i], np.float32).tobytes(),
                                 "id %d" % i)
            else:
                self.assertFalse(found[k], "id %d" % i)
                self.assertEqual(rows[k].tobytes(),
                                 np.array(initial_row(i), np.float32).tobytes(), "id %d" % i)

    def test_lookups_dense_deltas_psctl_and_a_replica_killed(self):
        want = {}
        for shard in (0, 1):
            rows = {i: row_value(i, 1) for i in ids_of(shard, 40)}
            self.write(shard, 1, True, 1, rows)
            want.update(rows)
        for j in range(4):
            self.start_serving(j)
        s = self.client(replica=0)
        self.assertEqual((s.shards, s.replicas, s.dim("emb")), (2, 2, 3))
        never = ids_of(0, 3, 10**6) + ids_of(1, 3, 10**6)
        ids = sorted(want, reverse=True) + never + [next(iter(want))] * 2
        rows, found, versions = self.until(
            "version 1 on both shards",
            lambda: (lambda r: r if list(r[2]) == [1, 1] else None)(s.lookup("emb", ids)))
        self.expect(ids, rows, found, want)
        w = s.dense("w", shape=W)
        np.testing.assert_array_equal(
            w.ravel(), np.array(dense_value(0, 1)[2] + dense_value(1, 1)[2], np.float32))
        with self.assertRaises(psd.Error) as cm:
            s.dim("nope")
        self.assertEqual(cm.exception.code, psd.ENOENT)
        self.assertIn("lookup of table 'nope' at serve:", str(cm.exception))

        # A delta of shard 1: 5 rows changed; seen once published.
        changed = {i: row_value(i, 2) for i in ids_of(1, 5)}
        self.write(1, 2, False, 1, changed)
        want.update(changed)
        rows, found, versions = self.until(
            "version 2 of shard 1",
            lambda: (lambda r: r if list(r[2]) == [1, 2] else None)(s.lookup("emb", ids)))
        self.expect(ids, rows, found, want)

        # psctl serving: every task, its version, step and rows.
        r = h.psctl(self.spec, "--json", "serving")
        self.assertEqual(r.returncode, 0, r.stderr)
        doc = json.loads(r.stdout)
        by = {t["index"]: t for t in doc["serving"]}
        self.assertEqual(sorted(by), [0, 1, 2, 3])
        self.until("serve:3 at version 2", lambda: json.loads(
            h.psctl(self.spec, "--json", "serving").stdout)["serving"][3]["version"] == 2)
        doc = json.loads(h.psctl(self.spec, "--json", "serving").stdout)
        by = {t["index"]: t for t in doc["serving"]}
        for j in range(4):
            self.assertEqual(by[j]["shard"], j % 2)
            self.assertEqual(by[j]["version"], 1 if j % 2 == 0 else 2)
            self.assertEqual(by[j]["step"], by[j]["version"] * 100)
            self.assertEqual(by[j]["rows"], 40)
            self.assertEqual(by[j]["behind"], 0)
            self.assertGreater(by[j]["bytes"], 0)
        self.assertGreater(by[1]["lookups"], 0)
        text = h.psctl(self.spec, "serving")
        self.assertEqual(text.returncode, 0, text.stderr)
        self.assertEqual(text.stdout.splitlines()[0].split()[:4],
                         ["TASK", "ADDRESS", "SHARD", "VERSION"])

        # serve:1 killed: shard 1's lookups go to serve:3, none fails.
        self.serving[1].stop(signal.SIGKILL)
        for _ in range(5):
            rows, found, versions = s.lookup("emb", ids)
            self.expect(ids, rows, found, want)
        self.assertEqual((s.task(0), s.task(1)), (0, 3))
        r = h.psctl(self.spec, "serving")
        self.assertEqual(r.returncode, 1)
        self.assertIn("psctl: serve:1 (%s)" % self.serve_addrs[1], r.stderr)


class TrainingCase(ServingCase):
    """A training job that publishes, and its serving tasks."""

    def test_rows_pushed_in_training_are_looked_up_from_serving(self):
        shards = [h.start_psd(self.spec, i) for i in range(2)]
        self.procs += shards
        c = psd.Client(self.spec, None)
        self.addCleanup(c.close)
        c.declare_table("emb", 3)
        # Both shards' ids interleaved, as a caller's batch comes.
        ids = np.array(sorted(ids_of(0, 10) + ids_of(1, 10), reverse=True), np.uint64)
        c.push_rows("emb", ids, np.ones((len(ids), 3), np.float32))
        pulled = np.empty((len(ids), 3), np.float32)
        c.pull_rows("emb", ids, pulled)
        first = os.path.join(self.pub, JOB, "ps-1", "pub-%010d" % 1)
        deadline = time.monotonic() + 15
        while not os.path.isdir(first) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not os.path.isdir(first):
            self.fail("the training shards wrote no publication within 15 s (job.publish)")
        for j in range(4):
            self.start_serving(j)
        s = self.client()
        rows, found, versions = self.until(
            "the pushed rows served",
            lambda: (lambda r: r if r[1].all() else None)(s.lookup("emb", ids)))
        np.testing.assert_array_equal(rows, pulled)
        self.assertTrue(all(v >= 1 for v in versions), versions)


if __name__ == "__main__":
    h.main(sys.argv)
