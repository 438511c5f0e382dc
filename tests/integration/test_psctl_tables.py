"""psctl's embedding-table commands at their edges, against two real psd
shards (docs/tables.md, psctl(1)):

- a malformed --ids, or --ids / --top given to another command, is a usage
  error (exit 2) said before any shard is asked;
- an id past 2^63 is shown unsigned, and an id never pushed "not stored";
- export of a table no shard has fails (exit 1) naming it, writing nothing;
- with one shard killed, every table command names it and exits 1, while
  what the live shard holds is still shown; export writes nothing.
Run: /usr/bin/python3 test_psctl_tables.py BUILD_DIR"""
import json
import os
import signal
import tempfile
import unittest

import harness as h
from hashes import shard_of



class PsctlTablesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="psd-test-")
        cls.spec = os.path.join(cls.tmp.name, "spec.json")
        h.write_spec(cls.spec, nps=2, nworker=1,
                     job={"name": "pt", "tables": [
                         {"name": "emb", "dim": 2, "optimizer": {"type": "sgd", "lr": 0.5}}]})
        cls.ps = [h.start_psd(cls.spec, i) for i in range(2)]
        # One id on each shard, pushed (twice for the first), so both store a row.
        cls.on = [next(i for i in range(1, 100) if shard_of(i, 2) == s) for s in range(2)]
        for i, n in ((cls.on[0], 2), (cls.on[1], 1)):
            for _ in range(n):
                r = h.pstool(cls.spec, "rows", "emb", "2", "push", str(i), "1.0,1.0")
                assert r.returncode == 0, r.stdout + r.stderr

    @classmethod
    def tearDownClass(cls):
        for p in cls.ps:
            p.stop(signal.SIGTERM)
        cls.tmp.cleanup()

    def psctl(self, *args):
        return h.run([h.build_path("ps-server", "psctl"), "--cluster", self.spec,
                      "--timeout", "3000"] + list(args), timeout=60)

    def test_a_usage_errors(self):
        for ids, bad in (("1,x", "'x'"), ("1, 2", "' 2'"), ("-1", "'-1'"),
                         ("18446744073709551616", "'18446744073709551616'")):
            r = self.psctl("get", "emb", "--ids", ids)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertEqual(r.stderr, "psctl: --ids: %s is not an unsigned 64-bit id\n" % bad)
            self.assertEqual(r.stdout, "")
        r = self.psctl("get", "emb", "--ids", "1,,2")
        self.assertEqual(r.returncode, 2)
        self.assertIn("an empty entry at byte 2", r.stderr)
        for args in (("top", "emb", "--ids", "1"), ("tables", "--top", "3")):
            r = self.psctl(*args)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn("--ids belongs to 'get', --top to 'top'", r.stderr)

    def test_b_big_ids_and_not_stored(self):
        big = 2**64 - 1
        r = self.psctl("get", "emb", "--ids", "%d,%d" % (big, self.on[0]))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("id %d (ps:%d): not stored" % (big, shard_of(big, 2)), r.stdout)
        self.assertIn("id %d (ps:0): count=2" % self.on[0], r.stdout)

    def test_c_export_of_an_unknown_table(self):
        out = os.path.join(self.tmp.name, "nope.safetensors")
        r = self.psctl("export", "nope", "--out", out)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("'nope'", r.stderr)
        self.assertFalse(os.path.exists(out))
        self.assertEqual([f for f in os.listdir(self.tmp.name) if "nope" in f], [])

    def test_z_shard_down(self):
        # Runs last (z): it kills ps:1.
        self.assertEqual(self.ps[1].stop(signal.SIGKILL), -signal.SIGKILL)
        a, b = self.on
        r = self.psctl("get", "emb", "--ids", "%d,%d" % (a, b))
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("id %d (ps:0): count=2" % a, r.stdout)
        self.assertIn("psctl: id %d: its shard ps:1 is down" % b, r.stderr)
        doc = json.loads(self.psctl("--json", "get", "emb", "--ids", "%d,%d" % (a, b)).stdout)
        self.assertEqual([x["id"] for x in doc["rows"]], [a])
        self.assertEqual([d["shard"] for d in doc["down"]], [1])

        r = self.psctl("top", "emb")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertRegex(r.stdout, r"\n\s*1\s+%d\s+2\s+ps:0\n" % a)
        self.assertIn("ps:1", r.stdout + r.stderr)

        r = self.psctl("tables")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertRegex(r.stdout, r"emb\s+2\s+ps:0\s+1\s")

        r = self.psctl("--json", "shrink", "emb")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        doc = json.loads(r.stdout)
        self.assertEqual([(s["shard"], s["rows"]) for s in doc["shards"]], [(0, 1)])

        out = os.path.join(self.tmp.name, "emb.safetensors")
        r = self.psctl("export", "emb", "--out", out)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("ps:1", r.stderr)
        self.assertFalse(os.path.exists(out))


if __name__ == "__main__":
    h.main()
