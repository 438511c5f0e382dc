"""psctl against real psd shards on 127.0.0.1: every command's table and
JSON with exact values (variables filled by pstool pushes of known values),
straggler marks on a dworker slowed with --inject-delay-ms (async and sync),
the Prometheus exposition, and a stopped shard named by every command.
Run: /usr/bin/python3 test_psctl.py BUILD_DIR"""
import functools
import json
import math
import os
import re
import signal
import unittest

import harness as h

DATA = "/usr/share/datasets/fashion-mnist"


f32 = h.f32


# psctl waits 60 s at most here unless told otherwise.
psctl = functools.partial(h.psctl, timeout=60)


def pulled(out):
    """Values from a pstool pull line: 'OK version=N values=a,b,...'."""
    line = out.strip().splitlines()[-1]
    assert line.startswith("OK "), line
    vals = line.split("values=", 1)[1]
    return [f32(float(v)) for v in vals.split(",")] if vals else []


def same(a, b):
    """Float lists equal element by element, NaN equal to NaN."""
    if len(a) != len(b):
        return False
    return all((math.isnan(x) and math.isnan(y)) or x == y for x, y in zip(a, b))


def jfloat(v):
    """A value of psctl's JSON: a number or "NaN"/"Infinity"/"-Infinity"."""
    return float(v) if isinstance(v, str) else v


def text_values(out):
    """Values of `psctl get` text: {index: values} from lines 'INDEX: v v ...'
    and their indented continuation lines; comments start with '#'."""
    rows, cur = {}, None
    for line in out.splitlines():
        if not line.strip() or line.startswith("#") or " is down" in line:
            cur = None
            continue
        if ":" in line:
            idx, vals = line.split(":", 1)
            cur = rows[int(idx)] = []
        else:
            vals = line
        cur.extend(f32(float(v)) for v in vals.split())
    return rows


def stats_of(vals):
    """What `get --stats` computes: over the non-NaN values, in order, in double."""
    s = q = 0.0
    n = nan = 0
    lo = hi = None
    for v in vals:
        n += 1
        if math.isnan(v):
            nan += 1
            continue
        lo = v if lo is None or v < lo else lo
        hi = v if hi is None or v > hi else hi
        s += v
        q += v * v
    finite = n - nan
    return {"elements": n, "nan": nan, "min": lo, "max": hi,
            "mean": s / finite if finite else None, "l2": math.sqrt(q)}


PROM_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$')
PROM_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(,|$)')


def parse_prometheus(test, text):
    """Checks the text exposition format line by line; returns
    {family: {"type": t, "samples": [(name, labels, value)]}}."""
    fams, cur = {}, None
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name = line.split()[2]
            test.assertNotIn(name, fams, "family %s twice" % name)
            cur = fams[name] = {"type": None, "samples": []}
            continue
        if line.startswith("# TYPE "):
            _, _, name, typ = line.split(" ", 3)
            test.assertIn(typ, ("counter", "gauge", "histogram"))
            test.assertIs(fams.get(name), cur, "TYPE %s not after its HELP" % name)
            cur["type"] = typ
            continue
        test.assertFalse(line.startswith("#"), line)
        m = PROM_LINE.match(line)
        test.assertIsNotNone(m, "not a sample line: %r" % line)
        name, body, value = m.group(1), m.group(3) or "", m.group(4)
        labels, pos = {}, 0
        while pos < len(body):
            lm = PROM_LABEL.match(body, pos)
            test.assertIsNotNone(lm, "bad labels in %r" % line)
            labels[lm.group(1)] = lm.group(2)
            pos = lm.end()
        v = float(value)  # also accepts +Inf, NaN
        base = re.sub(r"_(bucket|sum|count)$", "", name) if cur and cur["type"] == "histogram" \
            else name
        test.assertIsNotNone(cur, line)
        test.assertIs(fams.get(base), cur, "sample %s outside its family" % name)
        cur["samples"].append((name, labels, v))
    return fams


def check_histograms(test, fams):
    """Buckets cumulative, ending in le="+Inf" equal to _count, per label set."""
    nhist = 0
    for fname, fam in fams.items():
        if fam["type"] != "histogram":
            continue
        series = {}
        for name, labels, v in fam["samples"]:
            key = tuple(sorted((k, x) for k, x in labels.items() if k != "le"))
            s = series.setdefault(key, {"buckets": [], "sum": None, "count": None})
            if name == fname + "_bucket":
                s["buckets"].append((labels["le"], v))
            elif name == fname + "_sum":
                s["sum"] = v
            elif name == fname + "_count":
                s["count"] = v
            else:
                test.fail("unexpected sample %s in histogram %s" % (name, fname))
        for key, s in series.items():
            les = [float(le) for le, _ in s["buckets"]]
            counts = [v for _, v in s["buckets"]]
            test.assertEqual(les, sorted(les), (fname, key))
            test.assertEqual(s["buckets"][-1][0], "+Inf", (fname, key))
            test.assertEqual(counts, sorted(counts), "%s %s not cumulative" % (fname, key))
            test.assertEqual(counts[-1], s["count"], (fname, key))
            test.assertIsNotNone(s["sum"], (fname, key))
            nhist += 1
    return nhist


def value_of(fams, family, name=None, **labels):
    for n, l, v in fams[family]["samples"]:
        if n == (name or family) and all(l.get(k) == x for k, x in labels.items()):
            return v
    raise AssertionError("no %s %s" % (name or family, labels))


# Known gradients (sgd with lr 1 from zeros: each value is minus the gradient).
W = [1.0, -2.0, 0.1, 3.5, -0.25, 1e-30, 7.0, -8.5, float("nan"), 10.0, -11.0, 0.3,
     2.0, 4.0, -6.0, 8.0, 0.5, -0.5, 1.5, -1.5, 33.0, -44.0, 0.125, 9.75]
B = [1.0, 2.0, -3.0, 4.5, 5.0]
# Spots in big (600 x 1024, whole on shard 0, 2 MiB messages): its start, its
# end and both sides of the first message boundary at element 524288.
BIG_SPOTS = {0: [1.0, 2.0, 3.0], 524284: [-1.0, 2.5, 3.25, -4.0, 5.0, -6.5, 7.0, 8.0],
             614397: [9.0, -10.0, 11.0]}


class PsctlTest(h.ShardsTest):
    """One async job; variables filled by pstool; a joined pstool client."""

    JOB = {"name": "ctl", "optimizer": {"type": "sgd", "lr": 1.0},
           "heartbeat_ms": 200, "nonfinite": "apply"}  # W holds a NaN

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        for s in range(2):
            cls.tool("declare", "w", "6,4", "-1", shard=s)   # rows [0,3) and [3,6)
            cls.tool("declare", "b", "5", "1", shard=s)      # whole on shard 1
            cls.tool("declare", "big", "600,1024", "0", shard=s)  # whole on shard 0
        cls.tool("push", "w", "6,4", "0", ",".join(map(repr, W[:12])), shard=0)
        cls.tool("push", "w", "6,4", "12", ",".join(map(repr, W[12:])), shard=1)
        cls.tool("push", "b", "5", "0", ",".join(map(repr, B)), shard=1)
        for off, vals in BIG_SPOTS.items():
            cls.tool("push", "big", "600,1024", str(off), ",".join(map(repr, vals)), shard=0)
        cls.w = pulled(cls.tool("pull", "w", "0", "12", shard=0)) + \
            pulled(cls.tool("pull", "w", "12", "12", shard=1))
        cls.b = pulled(cls.tool("pull", "b", "0", "5", shard=1))
        # A client joined as worker 0: 30 timed pushes plus 2 of the check.
        r = h.pstool(cls.spec, "--join", "--worker", "0", "--bytes", "4096", "--rounds", "30",
                     "roundtrip")
        assert r.returncode == 0, r.stdout + r.stderr

    @classmethod
    def tool(cls, *args, shard=0):
        r = h.pstool(cls.spec, "--shard", str(shard), *args)
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout

    def ctl(self, *args, rc=0, timeout=60):
        r = psctl(self.spec, *args, timeout=timeout)
        self.assertEqual(r.returncode, rc, r.stdout + r.stderr)
        return r

    def test_values_match_what_was_pushed(self):
        # The ground truth itself: minus the gradients, rounded to f32.
        self.assertTrue(same(self.w, [-f32(g) for g in W]))
        self.assertTrue(same(self.b, [-f32(g) for g in B]))

    def test_status_shows_mode_version_and_job(self):
        out = self.ctl("status").stdout
        self.assertRegex(out, r"ps:0\s+127\.0\.0\.1:\d+\s+up\s+async\s+\d+\s+4\s")
        self.assertRegex(out, r"ps:1\s+127\.0\.0\.1:\d+\s+up\s+async\s+\d+\s+4\s")
        self.assertRegex(out, r"JOB ctl\s+mode async\s+workers 0/1 live\s+dropped 0")
        # Async: the worker's pushes (to ps:0, which times them), not the
        # sync-only count of gradients applied in steps (always 0 here).
        self.assertRegex(out, r"WORKER\s+STATE\s+JOINS\s+PUSHES TO PS:0\s+LAST SEEN")
        self.assertRegex(out, r"worker:0\s+left\s+1\s+32\s+\S+ m?s ago")
        self.assertNotIn("APPLIED", out)
        # The job's rate from what the worker reported as it left (pstool
        # counts each of its 30 timed pushes as one example).
        self.assertRegex(out, r"rate: 30 examples by 1 of 1 workers in [\d.]+ s \(first "
                         r"step to last\): \d+/s")
        for line in out.splitlines():
            self.assertLessEqual(len(line), 100, line)
        doc = json.loads(self.ctl("--json", "status").stdout)
        self.assertEqual([s["up"] for s in doc["shards"]], [True, True])
        self.assertEqual(doc["down"], [])
        rate = doc["shards"][0]["job_rate"]
        self.assertEqual((rate["workers"], rate["examples"]), (1, 30))
        self.assertAlmostEqual(rate["examples_per_s"], 30 / rate["wall_s"],
                               delta=0.01 * rate["examples_per_s"])
        self.assertEqual({h["name"] for h in doc["shards"][0]["histograms"]},
                         {"push_seconds", "pull_seconds"})

    def test_vars_table_and_json(self):
        out = self.ctl("vars").stdout
        self.assertRegex(out, r"\nw\s+\[6, 4\]\s+f32\s+ps:0 \[0, 3\) ps:1 \[3, 6\)\s+96 B\s+1\n")
        self.assertRegex(out, r"\nb\s+\[5\]\s+f32\s+ps:1 \[0, 5\)\s+20 B\s+1\n")
        self.assertRegex(out, r"\nbig\s+\[600, 1024\]\s+f32\s+ps:0 \[0, 600\)\s+2\.3 MiB\s+3\n")
        self.assertIn("optimizer (every variable): sgd(lr=1)", out)
        doc = json.loads(self.ctl("vars", "--json").stdout)
        self.assertEqual(doc["down"], [])
        v = {x["name"]: x for x in doc["vars"]}
        self.assertEqual(v["w"]["shape"], [6, 4])
        self.assertEqual(v["w"]["dtype"], "f32")
        self.assertEqual(v["w"]["placement"], -1)
        self.assertEqual([(s["shard"], s["rows"], s["bytes"]) for s in v["w"]["shards"]],
                         [(0, [0, 3], 48), (1, [3, 6], 48)])
        self.assertEqual(v["w"]["bytes"], 96)
        self.assertEqual(v["w"]["version"], 1)
        self.assertEqual(v["b"]["placement"], 1)
        self.assertEqual([(s["shard"], s["rows"]) for s in v["b"]["shards"]], [(1, [0, 5])])
        self.assertEqual(v["big"]["bytes"], 600 * 1024 * 4)
        self.assertEqual(v["big"]["optimizer"], "sgd(lr=1)")

    def test_get_values_equal_pstool_pulls(self):
        doc = json.loads(self.ctl("--json", "get", "w").stdout)
        self.assertEqual(doc["shape"], [6, 4])
        self.assertEqual(doc["rows"], [0, 6])
        self.assertEqual(doc["missing"], [])
        flat = [jfloat(x) for row in doc["values"] for x in row]
        self.assertTrue(same(flat, self.w), (flat, self.w))
        self.assertEqual(doc["values"][2][0], "NaN")
        rows = text_values(self.ctl("get", "w").stdout)
        self.assertEqual(sorted(rows), list(range(6)))
        self.assertTrue(same([x for r in range(6) for x in rows[r]], self.w))
        # 1-D: the compact form, values led by the first one's index.
        out = self.ctl("get", "b").stdout
        self.assertEqual(text_values(out), {0: self.b})
        doc = json.loads(self.ctl("--json", "get", "b").stdout)
        self.assertEqual(doc["values"], self.b)

    def test_get_rows_slices_across_shards(self):
        doc = json.loads(self.ctl("get", "w", "--rows", "2:5", "--json").stdout)
        self.assertEqual(doc["rows"], [2, 5])
        flat = [jfloat(x) for row in doc["values"] for x in row]
        self.assertTrue(same(flat, self.w[8:20]))
        rows = text_values(self.ctl("get", "w", "--rows", "4:").stdout)
        self.assertEqual(sorted(rows), [4, 5])
        self.assertTrue(same(rows[4] + rows[5], self.w[16:24]))
        rows = text_values(self.ctl("get", "b", "--rows", ":2").stdout)
        self.assertEqual(rows, {0: self.b[:2]})

    def test_get_big_variable_in_several_messages(self):
        want = [0.0] * (600 * 1024)
        for off, vals in BIG_SPOTS.items():
            for i, g in enumerate(vals):
                want[off + i] = -f32(g)
        doc = json.loads(self.ctl("--json", "get", "big", timeout=120).stdout)
        flat = [x for row in doc["values"] for x in row]
        self.assertEqual(len(flat), len(want))
        self.assertEqual(flat, want)
        doc = json.loads(self.ctl("--json", "get", "big", "--rows", "511:513").stdout)
        self.assertEqual([x for row in doc["values"] for x in row], want[511 * 1024:513 * 1024])
        # Text: a 1024-value row wrapped over indented lines of at most 80 columns.
        out = self.ctl("get", "big", "--rows", "511:513").stdout
        self.assertEqual(text_values(out), {511: want[511 * 1024:512 * 1024],
                                            512: want[512 * 1024:513 * 1024]})
        self.assertLessEqual(max(len(l) for l in out.splitlines()[1:]), 80)
        st = json.loads(self.ctl("--json", "get", "big", "--stats").stdout)["stats"]
        self.assertEqual(st, stats_of(want))

    def test_get_stats_against_python(self):
        for args, vals in ((["w"], self.w), (["w", "--rows", "1:4"], self.w[4:16]),
                           (["b"], self.b)):
            doc = json.loads(self.ctl("--json", "get", "--stats", *args).stdout)
            got = {k: jfloat(v) for k, v in doc["stats"].items()}
            self.assertEqual(got, stats_of(vals), args)
            self.assertNotIn("values", doc)
        exp = stats_of(self.w)
        self.assertEqual(exp["nan"], 1)
        out = self.ctl("get", "w", "--stats").stdout
        head, row = out.splitlines()[:2]
        self.assertEqual(head.split(), ["VARIABLE", "ROWS", "ELEMENTS", "MIN", "MAX", "MEAN",
                                        "L2", "NORM", "NAN"])
        cells = row.split()
        self.assertEqual(cells[0], "w")
        self.assertEqual(int(cells[3]), 24)
        for cell, key in zip(cells[4:8], ("min", "max", "mean", "l2")):
            self.assertAlmostEqual(float(cell), exp[key], delta=abs(exp[key]) * 1e-8)
        self.assertEqual(int(cells[8]), 1)

    def test_get_errors(self):
        r = self.ctl("get", "nosuch", rc=1)
        self.assertIn("no variable 'nosuch'", r.stderr)
        self.assertIn("w, b, big", r.stderr)
        for bad in ("3:1", "x", "1:2:3", "-1:2", "2:2"):
            r = self.ctl("get", "w", "--rows", bad, rc=2)
            self.assertIn("--rows '%s'" % bad, r.stderr)
        r = self.ctl("get", "w", "--rows", "0:7", rc=2)
        self.assertIn("--rows '0:7'", r.stderr)
        self.assertIn("6 rows", r.stderr)
        self.ctl("get", rc=2)
        self.ctl("vars", "--stats", rc=2)
        self.ctl("nosuchcommand", rc=2)

    def test_workers_shows_timed_pushes(self):
        doc = json.loads(self.ctl("--json", "workers").stdout)
        w = doc["workers"][0]
        self.assertEqual(w["pushes"], 32)       # check push, push_pull, 30 timed rounds
        self.assertEqual(w["step_samples"], 31)  # gaps between them
        self.assertGreater(w["step_p50_ms"], 0)
        self.assertGreaterEqual(w["step_p95_ms"], w["step_p50_ms"])
        self.assertEqual(w["state"], "left")     # it left at the end
        self.assertFalse(w["straggler"])
        out = self.ctl("workers").stdout
        self.assertRegex(out, r"worker:0\s+left\s+32\s+\d")
        self.assertIn("straggler: needs 2 live workers", out)

    def test_metrics_exposition(self):
        r = self.ctl("metrics")
        fams = parse_prometheus(self, r.stdout)
        self.assertGreaterEqual(check_histograms(self, fams), 5)  # push, pull x 2, worker
        st = json.loads(self.ctl("--json", "status").stdout)["shards"]
        for s in range(2):
            self.assertEqual(value_of(fams, "psd_up", shard=str(s)), 1)
            pushes = value_of(fams, "psd_pushes_total", shard=str(s))
            pulls = value_of(fams, "psd_pulls_total", shard=str(s))
            self.assertEqual(pushes, st[s]["pushes"])
            self.assertEqual(value_of(fams, "psd_push_seconds", "psd_push_seconds_count",
                                      shard=str(s)), pushes)
            self.assertEqual(value_of(fams, "psd_pull_seconds", "psd_pull_seconds_count",
                                      shard=str(s)), pulls)
            self.assertEqual(value_of(fams, "psd_variables", shard=str(s)), 4)
            for k, fam in (("errors", "psd_errors_total"), ("bytes_in", "psd_received_bytes_total")):
                self.assertEqual(value_of(fams, fam, shard=str(s)), st[s][k])
        self.assertEqual(fams["psd_pushes_total"]["type"], "counter")
        self.assertEqual(fams["psd_push_seconds"]["type"], "histogram")
        self.assertEqual(value_of(fams, "psd_variable_version", variable="w", shard="1"), 1)
        self.assertEqual(value_of(fams, "psd_variable_version", variable="big", shard="0"), 3)
        self.assertEqual(value_of(fams, "psd_held_bytes", shard="1"), 48 + 20 + 2048)
        self.assertEqual(value_of(fams, "psd_worker_pushes_total", worker="0"), 32)
        self.assertEqual(value_of(fams, "psd_worker_live", worker="0"), 0)
        self.assertEqual(value_of(fams, "psd_worker_step_seconds",
                                  "psd_worker_step_seconds_count", worker="0"), 31)
        doc = json.loads(self.ctl("--json", "metrics").stdout)
        names = [f["name"] for f in doc["metrics"]]
        self.assertIn("psd_worker_step_seconds", names)
        self.assertEqual(doc["down"], [])


class PsctlDownTest(unittest.TestCase):
    """Shard 1 stopped: every command names it, prints shard 0's part, exits 1."""

    def test_every_command_names_the_down_shard(self):
        with h.TempDir() as d:
            spec = os.path.join(d, "spec.json")
            doc = h.write_spec(spec, nps=2, nworker=1,
                               job={"name": "down", "optimizer": {"type": "sgd", "lr": 1.0},
                                    "nonfinite": "apply"})  # W holds a NaN
            addr1 = doc["cluster"]["ps"][1]
            ps = [h.start_psd(spec, i) for i in range(2)]
            try:
                for s in range(2):
                    self.assertEqual(h.pstool(spec, "--shard", str(s), "declare", "w", "6,4",
                                              "-1").returncode, 0)
                    self.assertEqual(h.pstool(spec, "--shard", str(s), "declare", "b", "5",
                                              "1").returncode, 0)
                h.pstool(spec, "--shard", "0", "push", "w", "6,4", "0",
                         ",".join(map(repr, W[:12])))
                r = h.pstool(spec, "--join", "--worker", "0", "--bytes", "4096", "--rounds",
                             "5", "roundtrip")
                self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
                self.assertEqual(ps[1].stop(signal.SIGTERM), 0)
                named = "ps:1 (%s) is down" % addr1
                cases = {
                    ("status",): r"ps:0\s+127\.0\.0\.1:\d+\s+up",
                    ("vars",): r"w\s+\[6, 4\]\s+f32\s+ps:0 \[0, 3\) ps:1\(down\) \[3, 6\)",
                    ("get", "w"): r"0: +-1 +2 ",
                    ("get", "w", "--stats"): r"w\s+\[0, 6\)\s+12\s",
                    ("workers",): r"worker:0\s+left\s+7\s",
                    ("metrics",): r'psd_pushes_total\{shard="0"\} \d+',
                }
                for args, shows in cases.items():
                    r = psctl(spec, *args)
                    self.assertEqual(r.returncode, 1, (args, r.stdout, r.stderr))
                    self.assertIn(named, r.stderr, args)
                    self.assertRegex(r.stdout, shows, args)
                    r = psctl(spec, "--json", *args)
                    self.assertEqual(r.returncode, 1, (args, r.stdout, r.stderr))
                    self.assertIn(named, r.stderr, args)
                    out = json.loads(r.stdout)
                    self.assertEqual([(x["shard"], x["address"]) for x in out["down"]],
                                     [(1, addr1)], args)
                    self.assertIn("UNAVAILABLE", out["down"][0]["error"], args)
                r = psctl(spec, "get", "w")
                self.assertIn("# rows [3, 6) missing: ps:1 (%s)" % addr1, r.stdout)
                self.assertEqual(sorted(text_values(r.stdout)), [0, 1, 2])
                doc = json.loads(psctl(spec, "--json", "get", "w").stdout)
                self.assertEqual(doc["values"][3:], [None, None, None])
                self.assertTrue(same([jfloat(x) for row in doc["values"][:3] for x in row],
                                     [-f32(g) for g in W[:12]]))
                self.assertEqual(doc["missing"], [{"rows": [3, 6], "shard": 1,
                                                   "address": addr1}])
                st = json.loads(psctl(spec, "--json", "status").stdout)["shards"]
                self.assertEqual([s["up"] for s in st], [True, False])
                self.assertIn("UNAVAILABLE", st[1]["error"])
                fams = parse_prometheus(self, psctl(spec, "metrics").stdout)
                self.assertEqual(value_of(fams, "psd_up", shard="1", address=addr1), 0)
                self.assertEqual(value_of(fams, "psd_up", shard="0"), 1)
                check_histograms(self, fams)
                r = psctl(spec, "get", "b")  # held only by the down shard
                self.assertEqual(r.returncode, 1)
                self.assertIn("# rows [0, 5) missing: ps:1 (%s)" % addr1, r.stdout)
                r = psctl(spec, "get", "nosuch")
                self.assertEqual(r.returncode, 1)
                self.assertIn("no variable 'nosuch'", r.stderr)
                self.assertIn("on the shards that answered", r.stderr)
            finally:
                for p in ps:
                    p.stop()


def worker(spec, i, *extra):
    return h.Proc([h.build_path("worker", "dworker"), "--cluster", spec, "--task",
                   "worker:%d" % i] + list(extra))


class PsctlUsageTest(unittest.TestCase):
    """Command-line mistakes: exit 2 before any shard is asked."""

    def test_numbers_are_read_whole(self):
        with h.TempDir() as d:
            spec = os.path.join(d, "spec.json")
            h.write_spec(spec, nps=1, nworker=1, job={"name": "usage"})  # nothing listens
            for args, said in [(["--timeout", "5s"], "--timeout takes milliseconds >= 0, not '5s'"),
                               (["--timeout", "-1"], "--timeout takes milliseconds >= 0, not '-1'"),
                               (["--top", "0"], "--top takes a count >= 1, not '0'"),
                               (["--top", "3x"], "--top takes a count >= 1, not '3x'")]:
                r = psctl(spec, *(args + ["status"]), timeout=10)
                self.assertEqual(r.returncode, 2, (args, r.stdout, r.stderr))
                self.assertEqual(r.stderr.strip(), "psctl: " + said)
                self.assertEqual(r.stdout, "")

    def test_a_mistyped_command_suggests_the_nearest(self):
        with h.TempDir() as d:
            spec = os.path.join(d, "spec.json")
            h.write_spec(spec, nps=1, nworker=1, job={"name": "usage"})  # nothing listens
            for typo, near in [("stauts", "status"), ("wokers", "workers"),
                               ("metric", "metrics"), ("exprot", "export"), ("gte", "get")]:
                r = psctl(spec, typo, timeout=10)
                self.assertEqual(r.returncode, 2, (typo, r.stdout, r.stderr))
                self.assertEqual(r.stderr.splitlines()[0],
                                 "psctl: unknown command '%s'; did you mean '%s'?"
                                 % (typo, near))
                self.assertIn("commands: status vars get workers metrics checkpoint export",
                              r.stderr)
                self.assertEqual(r.stdout, "")
            # Nothing near: no guess. And the same without --cluster.
            r = psctl(spec, "frobnicate", timeout=10)
            self.assertEqual(r.returncode, 2)
            self.assertEqual(r.stderr.splitlines()[0], "psctl: unknown command 'frobnicate'")
            r = h.run([h.build_path("ps-server", "psctl"), "stauts"], timeout=10)
            self.assertEqual(r.returncode, 2)
            self.assertIn("did you mean 'status'?", r.stderr)


@unittest.skipUnless(os.path.isdir(DATA), "dataset-fashion-mnist is not installed")
class PsctlStragglerTest(unittest.TestCase):
    """Two dworkers, worker 1 slowed by 60 ms a step: marked, worker 0 not."""

    def straggler(self, sync):
        with h.TempDir() as d:
            spec = os.path.join(d, "spec.json")
            h.write_spec(spec, nps=2, nworker=2,
                         job={"name": "slow", "epochs": 50, "log_every": 20,
                              "sync": sync, "heartbeat_ms": 100})
            ps = [h.start_psd(spec, i) for i in range(2)]
            ws = [worker(spec, 0), worker(spec, 1, "--inject-delay-ms", "60")]
            try:
                # Step 20 of the slow one: both have 10+ timed steps by then,
                # and the fast one is still far from the end of 50 epochs.
                ws[1].wait_for("step 20/", timeout=120)
                out = psctl(spec, "workers")
                self.assertEqual(out.returncode, 0, out.stderr)
                r = psctl(spec, "--json", "workers")
                self.assertEqual(r.returncode, 0, r.stderr)
                doc = json.loads(r.stdout)
            finally:
                for w in ws:
                    w.stop(signal.SIGKILL)
                rcs = [p.stop() for p in ps]
            self.assertEqual(rcs, [0, 0])
            w0, w1 = doc["workers"]
            self.assertTrue(w0["live"] and w1["live"], doc)
            self.assertGreaterEqual(w1["step_samples"], 10, doc)
            self.assertGreater(w0["step_p50_ms"], 0)
            self.assertGreater(w1["step_p50_ms"], 0)
            self.assertTrue(w1["straggler"], doc)
            self.assertFalse(w0["straggler"], doc)
            lines = {l.split()[0]: l for l in out.stdout.splitlines() if l.startswith("worker:")}
            self.assertTrue(lines["worker:1"].rstrip().endswith("straggler"), out.stdout)
            self.assertFalse(lines["worker:0"].rstrip().endswith("straggler"), out.stdout)
            self.assertRegex(out.stdout, r"straggler: live and (step|lag) p50 > 1\.5 x")
            return doc

    def test_async_straggler_by_step_time(self):
        doc = self.straggler({"mode": "async"})
        w0, w1 = doc["workers"]
        self.assertGreater(w1["step_p50_ms"], 60)
        self.assertGreater(w0["pushes"], w1["pushes"])

    def test_sync_straggler_by_lag(self):
        doc = self.straggler({"mode": "sync", "deterministic": True})
        w0, w1 = doc["workers"]
        # Behind a barrier both step at the slow one's pace; the lag tells them apart.
        self.assertGreater(w0["step_p50_ms"], 50)
        self.assertGreater(w1["lag_p50_ms"], 60)
        self.assertLess(w0["lag_p50_ms"], w1["lag_p50_ms"])
        self.assertGreater(w1["last_step"], 5)


if __name__ == "__main__":
    h.main()
