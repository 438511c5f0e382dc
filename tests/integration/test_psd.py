"""psd end to end over real gRPC: exact update arithmetic, idempotent declare,
every kind of bad input answered with a clear status while the shard keeps
serving, a 256 MiB variable, psctl, spec mistakes, a taken port, and the BLAS
kernel choice. Run: /usr/bin/python3 test_psd.py BUILD_DIR"""
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import unittest

import harness as h

LR, MU = 0.1, 0.9


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


def pulled(out):
    """Values from a pstool pull line: 'OK version=N values=a,b,...'."""
    line = out.strip().splitlines()[-1]
    assert line.startswith("OK "), line
    vals = line.split("values=", 1)[1]
    return [float(v) for v in vals.split(",")] if vals else []


class PsdTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="psd-test-")
        cls.spec = os.path.join(cls.tmp.name, "spec.json")
        h.write_spec(cls.spec, nps=2, nworker=1,
                     job={"name": "t", "optimizer": {"type": "momentum", "lr": LR, "momentum": MU}})
        cls.ps = [h.start_psd(cls.spec, i) for i in range(2)]

    @classmethod
    def tearDownClass(cls):
        rcs = [p.stop(signal.SIGTERM) for p in cls.ps]
        cls.tmp.cleanup()
        assert rcs == [0, 0], "psd did not exit 0 on SIGTERM: %s" % rcs

    def tool(self, *args, shard=0):
        return h.pstool(self.spec, "--shard", str(shard), *args)

    def ok(self, *args, shard=0):
        r = self.tool(*args, shard=shard)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        return r.stdout

    def error(self, code, *args, shard=0):
        r = self.tool(*args, shard=shard)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertTrue(r.stdout.startswith("ERROR %s: " % code), r.stdout)
        return r.stdout

    def assert_serving(self):
        for s in range(2):
            r = h.run([h.build_path("ps-server", "psctl"), "--cluster", self.spec, "--json",
                       "status"])
            self.assertEqual(r.returncode, 0, r.stderr)
        for p in self.ps:
            self.assertIsNone(p.p.poll(), "psd exited:\n" + p.output())

    def test_push_then_pull_follows_momentum_formula(self):
        # 'm' is (4, 2) split by rows: shard 0 holds rows [0, 2) = elements
        # [0, 4), shard 1 rows [2, 4) = elements [4, 8). Zero-initialised.
        for s in range(2):
            self.ok("declare", "m", "4,2", "-1", shard=s)
        g1 = [1.0, -2.0, 0.25, 3.5, 0.1, 0.2, -0.3, 7.0]
        g2 = [0.5, 0.5, -1.0, 2.0, -0.7, 1.5, 0.0, -2.25]
        w, v = [0.0] * 8, [0.0] * 8
        for g in (g1, g2):
            for s, (lo, hi) in enumerate(((0, 4), (4, 8))):
                self.ok("push", "m", "4,2", str(lo), ",".join(repr(x) for x in g[lo:hi]), shard=s)
            for i in range(8):
                v[i] = f32(f32(f32(MU) * v[i]) + f32(g[i]))
                w[i] = f32(w[i] - f32(f32(LR) * v[i]))
        got = pulled(self.ok("pull", "m", "0", "4", shard=0)) + \
            pulled(self.ok("pull", "m", "4", "4", shard=1))
        self.assertEqual([f32(x) for x in got], w)
        self.assertIn("version=2", self.ok("pull", "m", "4", "4", shard=1))

    def test_declare_is_idempotent_and_refuses_another_shape(self):
        self.ok("declare", "d", "3,5")
        self.ok("declare", "d", "3,5")
        out = self.error("ALREADY_EXISTS", "declare", "d", "3,6")
        self.assertIn("'d'", out)
        self.assertIn("[3, 5]", out)
        self.assertIn("[3, 6]", out)
        self.error("INVALID_ARGUMENT", "declare", "bad", "3,-1")
        self.error("INVALID_ARGUMENT", "declare", "far", "3", "7")
        self.assert_serving()

    def test_push_with_wrong_shape_names_variable_and_both_shapes(self):
        self.ok("declare", "s", "4,3")
        out = self.error("INVALID_ARGUMENT", "push", "s", "4,2", "0", "1,2")
        self.assertIn("'s'", out)
        self.assertIn("[4, 2]", out)
        self.assertIn("[4, 3]", out)
        # Nothing was applied: the variable is still zero.
        self.assertEqual(pulled(self.ok("pull", "s", "0", "6")), [0.0] * 6)
        self.assert_serving()

    def test_push_with_wrong_length_is_refused(self):
        self.ok("declare", "len", "2,2")
        out = self.error("INVALID_ARGUMENT", "raw", "/psd.v1.Data/Push",
                         # segment {name "len", offset 0, count 2, shape [2,2]}, data of 4 bytes
                         "0a030a0174" + "12" + "0d" + "0a036c656e" + "1000" + "1802" + "2202" + "0202"
                         + "7a04" + "0000803f")
        self.assertIn("data field holds 4", out)
        self.assert_serving()

    def test_unknown_variable_is_not_found(self):
        out = self.error("NOT_FOUND", "pull", "nosuchvar", "0", "1")
        self.assertIn("'nosuchvar'", out)
        out = self.error("NOT_FOUND", "push", "nosuchvar2", "1", "0", "1")
        self.assertIn("'nosuchvar2'", out)
        self.assert_serving()

    def test_out_of_range_segment(self):
        self.ok("declare", "r", "4,2")
        out = self.error("OUT_OF_RANGE", "pull", "r", "2", "4")
        self.assertIn("'r'", out)
        self.assert_serving()

    def test_malformed_protobuf_is_invalid_argument(self):
        for method in ("/psd.v1.Data/Push", "/psd.v1.Data/Pull", "/psd.v1.Data/Declare",
                       "/psd.v1.Admin/Status"):
            out = self.error("INVALID_ARGUMENT", "raw", method, "ffffffffffff0102")
            self.assertIn("malformed protobuf", out)
        self.error("UNIMPLEMENTED", "raw", "/psd.v1.Data/Nope", "")
        self.assert_serving()

    def test_wrong_job_is_refused(self):
        other = os.path.join(self.tmp.name, "other.json")
        with open(self.spec) as f:
            spec = json.load(f)
        spec["job"]["name"] = "another"
        with open(other, "w") as f:
            json.dump(spec, f)
        r = h.pstool(other, "pull", "m", "0", "1")
        self.assertEqual(r.returncode, 1)
        self.assertIn("FAILED_PRECONDITION", r.stdout)
        self.assertIn("'another'", r.stdout)

    def test_256_mib_variable_round_trips_exactly(self):
        # Far beyond gRPC's 4 MiB default: chunked into 4 MiB messages.
        r = h.pstool(self.spec, "--bytes", str(256 << 20), "--rounds", "1", "roundtrip",
                     timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("verified", r.stdout)

    def test_psctl_status_table_and_json(self):
        for s in range(2):
            self.ok("declare", "p", "10,4", shard=s)
        r = h.run([h.build_path("ps-server", "psctl"), "--cluster", self.spec, "--json", "status"])
        self.assertEqual(r.returncode, 0, r.stderr)
        doc = json.loads(r.stdout)
        self.assertEqual(len(doc["shards"]), 2)
        for i, s in enumerate(doc["shards"]):
            self.assertTrue(s["up"])
            self.assertEqual(s["shard"], i)
            self.assertEqual(s["job"], "t")
            p = [v for v in s["vars"] if v["name"] == "p"][0]
            self.assertEqual(p["shape"], [10, 4])
            self.assertEqual(p["rows"], [5 * i, 5 * i + 5])
            self.assertEqual(p["bytes"], 5 * 4 * 4 * 2)  # values + momentum slot
        r = h.run([h.build_path("ps-server", "psctl"), "--cluster", self.spec, "status"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("SHARD", r.stdout)
        self.assertRegex(r.stdout, r"ps:1\s+127\.0\.0\.1:\d+\s+up")


class PsdStartupTest(unittest.TestCase):
    def test_spec_mistakes_exit_2_with_json_path(self):
        cases = [
            ({"cluster": {"worker": ["127.0.0.1:1"]}}, "ps:0", "cluster.ps"),
            ({"cluster": {"ps": ["127.0.0.1"], "worker": ["127.0.0.1:2"]}}, "ps:0",
             "cluster.ps[0]"),
            ({"cluster": {"ps": ["127.0.0.1:3"], "worker": ["127.0.0.1:2"]}}, "ps:4",
             "index 4 out of range; cluster.ps has 1 entry"),
            ({"cluster": {"ps": ["127.0.0.1:3"], "worker": ["127.0.0.1:2"]}, "jobb": {}},
             "ps:0", "jobb"),
        ]
        with h.TempDir() as d:
            path = os.path.join(d, "bad.json")
            for spec, task, needle in cases:
                with open(path, "w") as f:
                    json.dump(spec, f)
                r = h.run([h.build_path("ps-server", "psd"), "--cluster", path, "--task", task],
                          timeout=30)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn(needle, r.stderr)
                if needle.startswith(("cluster", "jobb")):
                    self.assertIn("bad.json: " + needle, r.stderr)

    def test_port_in_use_is_a_clear_error(self):
        with h.TempDir() as d:
            path = os.path.join(d, "spec.json")
            spec = h.write_spec(path, nps=1, nworker=1)
            port = int(spec["cluster"]["ps"][0].split(":")[1])
            s = socket.socket()
            s.bind(("127.0.0.1", port))
            s.listen(1)
            try:
                r = h.run([h.build_path("ps-server", "psd"), "--cluster", path, "--task", "ps:0"],
                          timeout=30)
            finally:
                s.close()
            self.assertEqual(r.returncode, 1)
            self.assertIn("Address already in use", r.stderr)

    def blas_line(self, env):
        with h.TempDir() as d:
            path = os.path.join(d, "spec.json")
            h.write_spec(path, nps=1, nworker=1)
            e = {k: v for k, v in os.environ.items()
                 if k not in ("OPENBLAS_CORETYPE", "PSD_OPENBLAS_CORETYPE")}
            e.update(env)
            proc = subprocess.Popen([h.build_path("ps-server", "psd"), "--cluster", path,
                                     "--task", "ps:0"], env=e, stderr=subprocess.PIPE,
                                    stdout=subprocess.DEVNULL, text=True)
            line = ""
            for line in proc.stderr:
                if "OpenBLAS" in line:
                    break
            proc.terminate()
            proc.communicate(timeout=20)
            self.assertIn("OpenBLAS", line)
            return line

    def test_blas_kernels_use_the_cpus_vector_width(self):
        with open("/proc/cpuinfo") as f:
            flags = set(f.read().split())
        if {"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= flags:
            fast = ("SkylakeX", "Cooperlake", "SapphireRapids")
        elif "avx2" in flags:
            fast = ("Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids")
        else:
            self.skipTest("CPU has neither AVX2 nor AVX-512")
        for env in ({}, {"OPENBLAS_CORETYPE": "Prescott"}):
            line = self.blas_line(env)
            self.assertRegex(line, r"core=(%s) " % "|".join(fast))
            if env:
                self.assertIn("replacing the inherited Prescott", line)
        line = self.blas_line({"PSD_OPENBLAS_CORETYPE": "Prescott"})
        self.assertIn("core=Prescott", line)
        self.assertIn("from PSD_OPENBLAS_CORETYPE", line)


if __name__ == "__main__":
    h.BUILD = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
