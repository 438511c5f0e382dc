#!/usr/bin/python3
"""Criteo's TSV in Python (psd.criteo, docs/ctr.md "The Criteo format") and
psd-ctrgen --format criteo:

- psd.criteo.Criteo's ids equal a pure-Python implementation of the id hash
  (FNV-1a 64 of the value's bytes, splitmix64 with the field), raw and
  % bounds, on a hand-written file and on generated data; dense values,
  missing ones 0; labels;
- shares split the lines (i % nshares == share) with nothing lost or
  repeated; batches and drop_last; gzip reads like plain;
- every mistake raises ValueError naming the file and the line, a missing
  file FileNotFoundError; bad arguments are named;
- psd-ctrgen --format criteo: the same bytes from the same seed, truth.json,
  --count's distinct rows per field equal numpy's count, usage errors; it
  never writes into a directory psd did not generate (the user's data is
  kept and named, anything else refused).
Run: /usr/bin/python3 test_criteo.py BUILD_DIR"""
import gzip
import json
import os
import shutil
import sys
import tempfile
import unittest

import numpy as np

import harness as h
from hashes import fnv1a64, splitmix64_at
import pyshards

psd = None  # imported in setUpModule from the build tree
criteo = None



def criteo_id(field, value):
    """docs/ctr.md's id of categorical field `field` (0-based) with value
    bytes `value`."""
    return splitmix64_at(fnv1a64(value) ^ splitmix64_at(field + 1))


def as_int64(u):
    return u - (1 << 64) if u >= 1 << 63 else u


def parse(lines):
    """The expected (dense, ids u64, labels) of Criteo lines (bytes)."""
    dense, ids, labels = [], [], []
    for line in lines:
        f = line.rstrip(b"\r\n").split(b"\t")
        labels.append(float(f[0]))
        dense.append([float(x) if x else 0.0 for x in f[1:14]])
        ids.append([criteo_id(c, v) for c, v in enumerate(f[14:40])])
    return dense, ids, labels


def line(label, ints, cats):
    return b"\t".join([str(label).encode()] + [str(x).encode() if x is not None else b""
                                               for x in ints] + cats) + b"\n"


HAND = [
    line(1, [1, None, -5] + list(range(4, 14)), [b"%08x" % (i * 77777) for i in range(26)]),
    line(0, [None] * 13, [b""] * 26),
    line(1, [123456789012] + [0] * 12, [b"68fd1e64", b"a"] + [b"x y"] * 24),
]


def setUpModule():
    global psd, criteo
    psd = pyshards.import_psd()
    import psd.criteo as c
    criteo = c


def read_all(path, batch, **kw):
    batches = list(criteo.Criteo(path, batch, **kw))
    if not batches:
        return np.zeros((0, 13), np.float32), np.zeros((0, 26), np.int64), np.zeros(0)
    return tuple(np.concatenate([b[i] for b in batches]) for i in range(3))


class ReaderTest(unittest.TestCase):
    def setUp(self):
        self.d = tempfile.mkdtemp(prefix="psd-test-criteo-")

    def tearDown(self):
        shutil.rmtree(self.d)

    def write(self, name, data):
        p = os.path.join(self.d, name)
        with (gzip.open if name.endswith(".gz") else open)(p, "wb") as f:
            f.write(data)
        return p

    def test_ids_values_and_labels_match_the_hash(self):
        self.assertEqual(criteo_id(0, b"68fd1e64"), 0xC55845092D8F8BAA)
        dense, ids, labels = parse(HAND)
        for name, data in [("a.tsv", b"".join(HAND)),
                           ("crlf.tsv", b"".join(l.replace(b"\n", b"\r\n") for l in HAND)),
                           ("a.tsv.gz", b"".join(HAND)),
                           ("noext", gzip.compress(b"".join(HAND))),
                           ("nolastnl.tsv", b"".join(HAND).rstrip(b"\n"))]:
            p = self.write(name, data)
            d, s, l = read_all(p, 2)
            self.assertEqual((d.dtype, s.dtype, l.dtype),
                             (np.float32, np.int64, np.float32))
            self.assertEqual((d.shape, s.shape, l.shape), ((3, 13), (3, 26), (3,)))
            np.testing.assert_array_equal(d, np.array(dense, np.float32), name)
            np.testing.assert_array_equal(l, np.array(labels, np.float32))
            self.assertEqual(s.tolist(), [[as_int64(u) for u in r] for r in ids], name)
            bounds = [1000 + 7 * f for f in range(26)]
            _, sb, _ = read_all(p, 3, bounds=bounds)
            self.assertEqual(sb.tolist(), [[u % bounds[f] for f, u in enumerate(r)]
                                           for r in ids])

    def test_generated_data_shares_batches_and_gzip(self):
        gen = h.build_path("worker", "psd-ctrgen")
        for gz in ([], ["--gzip"]):
            out = os.path.join(self.d, "g" + "".join(gz))
            r = h.run([gen, "--format", "criteo", "--out", out, "--train", "2000",
                       "--test", "300", "--seed", "5"] + gz, timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
        plain = os.path.join(self.d, "g", "train.tsv")
        with open(plain, "rb") as f:
            lines = f.readlines()
        with gzip.open(os.path.join(self.d, "g--gzip", "train.tsv.gz"), "rb") as f:
            self.assertEqual(f.read(), b"".join(lines))  # the same bytes
        self.assertEqual(len(lines), 2000)
        dense, ids, labels = parse(lines)
        b = list(criteo.CARDINALITIES)
        self.assertEqual(len(b), 26)
        want = np.array([[u % b[f] for f, u in enumerate(r)] for r in ids], np.int64)
        d, s, l = read_all(plain, 512, bounds=b)
        np.testing.assert_array_equal(s, want)
        np.testing.assert_array_equal(d, np.array(dense, np.float32))
        np.testing.assert_array_equal(l, np.array(labels, np.float32))
        self.assertTrue((s >= 0).all() and (s < np.array(b)).all())
        # Shares: worker k of 3 reads lines k, k + 3, ...; batches of 300
        # (the last one short, or left out with drop_last).
        for k in range(3):
            batches = list(criteo.Criteo(plain, 300, bounds=b, share=k, nshares=3))
            self.assertEqual([len(x[2]) for x in batches[:-1]], [300] * (len(batches) - 1))
            got = np.concatenate([x[1] for x in batches])
            np.testing.assert_array_equal(got, want[k::3])
            kept = list(criteo.Criteo(plain, 300, bounds=b, share=k, nshares=3,
                                      drop_last=True))
            self.assertEqual(sum(len(x[2]) for x in kept), len(want[k::3]) // 300 * 300)
        # Under a torch DataLoader's 2 processes each reads half of the share.
        try:
            import torch.utils.data as tud
        except ImportError:
            tud = None
        if tud is not None:
            ds = criteo.Criteo(plain, 100, bounds=b, share=1, nshares=2)
            self.assertIsInstance(ds, tud.IterableDataset)
            got = np.concatenate([x[1].numpy() for x in
                                  tud.DataLoader(ds, batch_size=None, num_workers=2)])
            self.assertEqual(sorted(map(tuple, got.tolist())),
                             sorted(map(tuple, want[1::2].tolist())))
        gzipped = os.path.join(self.d, "g--gzip", "train.tsv.gz")
        np.testing.assert_array_equal(read_all(gzipped, 700, bounds=b)[1], want)
        with open(os.path.join(self.d, "g", "truth.json")) as f:
            truth = json.load(f)
        self.assertEqual(truth["settings"]["format"], "criteo")
        self.assertGreater(truth["true_auc"], truth["dense_true_auc"] + 0.1, truth)
        # --count: distinct ids % the bounds per field, as numpy counts them.
        r = h.run([gen, "--count", plain], timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        rows = [l.split() for l in r.stdout.splitlines() if l.startswith("C")]
        self.assertEqual([int(x[1]) for x in rows], b)
        self.assertEqual([int(x[2]) for x in rows],
                         [len(np.unique(want[:, f])) for f in range(26)])
        self.assertIn("total  rows      %d" % sum(len(np.unique(want[:, f]))
                                                  for f in range(26)), r.stdout)

    def test_mistakes_name_the_file_and_line(self):
        good = HAND[0]
        cases = [
            (b"1\t2\t3\n", "3 tab-separated fields, want 40"),
            (b"\n", "1 tab-separated fields, want 40"),
            (b"2" + good[1:], "the label is '2', not 0 or 1"),
            (good.replace(b"\t-5\t", b"\t-x\t"), "integer feature I3 is '-x'"),
            (good.replace(b"\t4\t", b"\t4.5\t", 1), "integer feature I4 is '4.5'"),
            (good.rstrip(b"\n") + b"\tz\n", "41 tab-separated fields"),
        ]
        for i, (bad, said) in enumerate(cases):
            name = "bad%d.tsv%s" % (i, ".gz" if i % 2 else "")
            p = self.write(name, good + good + bad + good)
            with self.assertRaises(ValueError) as cm:
                read_all(p, 2)
            self.assertIn("%s:3: %s" % (p, said), str(cm.exception))
            # Another share does not parse line 3: it reads on.
            d, s, l = read_all(p, 2, share=1, nshares=3)
            self.assertEqual(len(l), 1)
        with self.assertRaises(FileNotFoundError) as cm:
            list(criteo.Criteo(os.path.join(self.d, "none.tsv"), 8))
        self.assertIn("none.tsv", str(cm.exception))
        p = self.write("t.tsv.gz", b"".join(HAND) * 50)
        with open(p, "rb") as f:
            data = f.read()
        with open(p, "wb") as f:
            f.write(data[:-20])
        with self.assertRaises(OSError) as cm:
            read_all(p, 4)
        self.assertIn(p, str(cm.exception))
        self.assertEqual(str(cm.exception).count(p), 1, str(cm.exception))  # once
        self.assertIn("unexpected end of file", str(cm.exception))
        for kw, said in [({"bounds": [1] * 25}, "bounds"), ({"bounds": [0] * 26}, "bounds"),
                         ({"share": 2, "nshares": 2}, "share 2 of nshares 2")]:
            with self.assertRaises(ValueError) as cm:
                criteo.Criteo(p, 8, **kw)
            self.assertIn(said, str(cm.exception))
        with self.assertRaises(ValueError):
            criteo.Criteo(p, 0)
        r = psd._psd.CriteoReader(self.write("h.tsv", HAND[0]))
        with self.assertRaises(ValueError) as cm:  # float64 for float32
            r.read_into(np.zeros((1, 13)), np.zeros((1, 26), np.int64),
                        np.zeros(1, np.float32))
        self.assertIn("dense: want a C-contiguous float32 array", str(cm.exception))


class CtrgenCriteoUsageTest(unittest.TestCase):
    def test_keep_regenerates_only_other_settings_or_versions(self):
        gen = h.build_path("worker", "psd-ctrgen")
        tmp = tempfile.TemporaryDirectory(prefix="psd-test-")
        self.addCleanup(tmp.cleanup)
        out = os.path.join(tmp.name, "keep")
        argv = [gen, "--format", "criteo", "--out", out, "--train", "500",
                "--test", "100", "--keep"]
        r = h.run(argv, timeout=60)
        self.assertTrue(r.stdout.startswith("wrote"), r.stdout + r.stderr)
        train = os.path.join(out, "train.tsv")
        with open(train, "ab") as f:
            f.write(b"")  # a marker the next run must keep: the mtime
        os.utime(train, (1, 1))
        r = h.run(argv, timeout=60)
        self.assertTrue(r.stdout.startswith("kept %s" % out), r.stdout + r.stderr)
        self.assertEqual(os.stat(train).st_mtime, 1)
        # Another size, or truth.json of another generator version: written.
        for change in ("size", "version"):
            if change == "size":
                r = h.run(argv[:-3] + ["200", "--keep"], timeout=60)
            else:
                path = os.path.join(out, "truth.json")
                with open(path) as f:
                    t = json.load(f)
                t["settings"]["version"] = t["settings"]["version"] - 1
                with open(path, "w") as f:
                    json.dump(t, f)
                r = h.run(argv, timeout=60)
            self.assertTrue(r.stdout.startswith("wrote"), (change, r.stdout, r.stderr))

    def test_never_writes_into_the_users_directory(self):
        """The issue's case: a user's train.tsv and test.tsv beside a
        truth.json psd did not write. --keep reads them as the user's and
        names them; without --keep psd-ctrgen refuses (exit 1, the directory
        named); so does --keep in a directory of other files, naming every
        name it looked for. No byte changes, nothing is added."""
        gen = h.build_path("worker", "psd-ctrgen")
        tmp = tempfile.TemporaryDirectory(prefix="psd-test-")
        self.addCleanup(tmp.cleanup)
        mine = os.path.join(tmp.name, "mine")
        os.mkdir(mine)
        for name, text in [("train.tsv", b"".join(HAND) * 3), ("test.tsv", b"".join(HAND)),
                           ("truth.json", b'{"true_auc": 0.9}\n')]:
            with open(os.path.join(mine, name), "wb") as f:
                f.write(text)
        before = {n: open(os.path.join(mine, n), "rb").read() for n in os.listdir(mine)}
        argv = [gen, "--format", "criteo", "--out", mine, "--train", "50", "--test", "10"]
        r = h.run(argv + ["--keep"], timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.splitlines()[1:],
                         ["train: %s/train.tsv" % mine, "test: %s/test.tsv" % mine,
                          "data: user"], r.stdout)
        self.assertTrue(r.stdout.startswith("kept %s: the user's data" % mine), r.stdout)
        r = h.run(argv, timeout=60)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("psd-ctrgen: the data directory %s is not psd's to write: its "
                      "truth.json has no mark of psd's" % mine, r.stderr)
        os.unlink(os.path.join(mine, "test.tsv"))
        del before["test.tsv"]
        r = h.run(argv + ["--keep"], timeout=60)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("looked for train.tsv, train.tsv.gz, train.txt or train.txt.gz "
                      "(training) and test.tsv, test.tsv.gz, test.txt or test.txt.gz "
                      "(held-out); it holds ", r.stderr)
        self.assertEqual({n: open(os.path.join(mine, n), "rb").read()
                          for n in os.listdir(mine)}, before)

    def test_usage_errors(self):
        gen = h.build_path("worker", "psd-ctrgen")
        with tempfile.TemporaryDirectory(prefix="psd-test-") as d:
            for args, said in [(["--format", "csv"], "--format takes libsvm or criteo, not 'csv'"),
                               (["--format", "criteo", "--fields", "3"],
                                "--fields and --zipf are the LIBSVM format's"),
                               (["--gzip"], "--gzip is for --format criteo"),
                               (["--drift", "--keep"], "--keep is for the training and "
                                "held-out sets, not --drift's parts")]:
                r = h.run([gen, "--out", d] + args, timeout=30)
                self.assertEqual(r.returncode, 2, (args, r.stderr))
                self.assertIn(said, r.stderr)
                self.assertEqual(os.listdir(d), [])
            r = h.run([gen, "--count", os.path.join(d, "none.tsv")], timeout=30)
            self.assertEqual(r.returncode, 1)
            self.assertIn("none.tsv", r.stderr)


if __name__ == "__main__":
    h.main(sys.argv)
