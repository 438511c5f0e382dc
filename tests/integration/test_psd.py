"""psd end to end over real gRPC: exact update arithmetic, idempotent declare,
every kind of bad input answered with a clear status while the shard keeps
serving (fields of every call, a missing caller, overflowing shapes and
offsets, overlapping segments, NaN and Inf under both job.nonfinite
policies, oversize messages against job.max_message_mb, sync pushes for a
closed step), pull answers that fit a stock client's 4 MiB limit (partial,
then the rest), a 256 MiB variable, psctl, spec mistakes, a taken port, and
the BLAS kernel choice. Run: /usr/bin/python3 test_psd.py BUILD_DIR"""
import importlib.util
import json
import os
import re
import socket
import struct
import subprocess
import unittest

import harness as h
import pb

LR, MU = 0.1, 0.9


f32 = h.f32


def pulled(out):
    """Values from a pstool pull line: 'OK version=N values=a,b,...'."""
    line = out.strip().splitlines()[-1]
    assert line.startswith("OK "), line
    vals = line.split("values=", 1)[1]
    return [float(v) for v in vals.split(",")] if vals else []


class PsdTest(h.ShardsTest):
    JOB = {"name": "t", "optimizer": {"type": "momentum", "lr": LR, "momentum": MU}}

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
        self.assertIn("push to 'len' on shard 0: its 1 segment describes 2 elements, 8 bytes "
                      "of f32 gradient, but the data field holds 4 bytes", out)
        # Two variables in one push: both named, with the bytes each side counts.
        self.ok("declare", "len2", "2,3")
        out = self.error("INVALID_ARGUMENT", "raw", "/psd.v1.Data/Push",
                         pb.hexa(pb.push("t", [("len", 0, 2, (2, 2)), ("len2", 0, 3, (2, 3))],
                                         [1.0] * 4)))
        self.assertIn("push to 'len', 'len2' on shard 0: the 2 segments describe 5 elements, "
                      "20 bytes of f32 gradient, but the data field holds 16 bytes; send each "
                      "segment's count x 4 bytes, back to back in segment order", out)
        self.assertEqual(pulled(self.ok("pull", "len", "0", "2")), [0.0, 0.0])  # nothing applied
        self.assert_serving()

    def fill_mebi(self, name):
        """Declares name, 1 Mi floats (exactly 4 MiB) whole on shard 0, pushes 1
        everywhere then 2 on its last 16 elements; returns the values psd holds."""
        n = 1 << 20
        self.ok("declare", name, "1024,1024", "0")
        self.ok("pushfill", name, "1024,1024", "0", str(n), "1")
        self.ok("pushfill", name, "1024,1024", str(n - 16), "16", "2")
        v1 = f32(1.0)
        w1 = f32(0.0 - f32(f32(LR) * v1))
        v2 = f32(f32(f32(MU) * v1) + f32(2.0))
        w2 = f32(w1 - f32(f32(LR) * v2))
        return [w1] * (n - 16) + [w2] * 16

    def test_stock_receive_limit_gets_4_mib_in_two_answers(self):
        # pstool --max-message-mb 4 receives what a stock gRPC client does
        # (4 MiB) and names no max_answer_bytes. 4 MiB of elements and a
        # head do not fit in 4 MiB: psd sends the first ones, marked partial
        # (before, gRPC refused the answer: RESOURCE_EXHAUSTED (4194312 vs.
        # 4194304)), and the rest comes whole.
        n = 1 << 20
        want = self.fill_mebi("mebi")
        out = self.ok("--max-message-mb", "4", "pull", "mebi", "0", str(n))
        m = re.match(r"OK version=\d+ partial elements=(\d+) values=", out)
        self.assertIsNotNone(m, out[:200])
        k = int(m.group(1))
        self.assertTrue(n - 16 <= k < n, k)
        first = pulled(out)
        self.assertEqual(len(first), k)
        out = self.ok("--max-message-mb", "4", "pull", "mebi", str(k), str(n - k))
        self.assertNotIn("partial", out)
        self.assertEqual([f32(x) for x in first + pulled(out)], want)

    @unittest.skipUnless(importlib.util.find_spec("grpc"), "python3-grpcio is not installed")
    def test_stock_python_grpc_client_pulls_4_mib(self):
        import grpc  # pylint: disable=import-outside-toplevel
        n = 1 << 20
        want = self.fill_mebi("mebi_py")
        with open(self.spec) as f:
            addr = json.load(f)["cluster"]["ps"][0]
        got, calls = [], 0
        with grpc.insecure_channel(addr) as ch:  # every option at gRPC's default
            pull = ch.unary_unary("/psd.v1.Data/Pull")  # bytes in, bytes out
            while len(got) < n and calls < 4:
                off = len(got)
                msg = pb.fields(pull(pb.pull("t", [("mebi_py", off, n - off)]), timeout=30))
                data = msg.get(15, [b""])[0]
                k = len(data) // 4
                self.assertEqual(msg.get(7, [0])[0], k)
                self.assertEqual(bool(msg.get(6, [0])[0]), off + k < n)
                got += struct.unpack("<%df" % k, data)
                calls += 1
        self.assertEqual(calls, 2)  # one partial answer, then the rest
        self.assertEqual([f32(x) for x in got], want)

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

    def test_missing_caller_is_invalid_argument(self):
        self.ok("declare", "mc", "2")
        for method, msg in (("/psd.v1.Data/Push", pb.push(None, [("mc", 0, 1, [2])], [1.0])),
                            ("/psd.v1.Data/Pull", pb.ld(2, pb.segment("x", 0, 1))),
                            ("/psd.v1.Admin/Status", b""),
                            ("/psd.v1.Coord/Join", pb.uint(2, 0))):
            out = self.error("INVALID_ARGUMENT", "raw", method, msg.hex())
            self.assertIn("caller.job is missing; every request names its job", out)
            self.assertIn("'t'", out)
        self.assertEqual(pulled(self.ok("pull", "mc", "0", "1")), [0.0])
        self.assert_serving()

    def test_declare_fields_are_checked(self):
        cases = [
            (("bad5", "1,1,1,1,1"), "INVALID_ARGUMENT", "the shape has 5 dimensions; expected 1..4"),
            (("bad0", "3,0"), "INVALID_ARGUMENT", "shape [3, 0]: dimension 1 is 0"),
            (("huge", "1048576,2097152"), "INVALID_ARGUMENT", "more than 2^40 elements"),
            (("wrap", "4611686018427387904,4"), "INVALID_ARGUMENT", "more than 2^40 elements"),
            (("", "3"), "INVALID_ARGUMENT", "the variable name is 0 bytes long"),
            (("x" * 201, "3"), "INVALID_ARGUMENT", "the variable name is 201 bytes long"),
            (("tab\there", "3"), "INVALID_ARGUMENT", "control character (0x09) at byte 3"),
            (("far", "3", "2"), "INVALID_ARGUMENT", "placement 2; expected -1 (split) or a shard "
                                                   "index 0..1"),
            # 2^39 floats split in two: 1 TiB on each shard, beyond any memory here.
            (("tib", "549755813888"), "RESOURCE_EXHAUSTED", "(this machine's memory)"),
        ]
        for args, code, needle in cases:
            out = self.error(code, "declare", *args)
            self.assertIn(needle, out, args)
        r = h.run([h.build_path("ps-server", "psctl"), "--cluster", self.spec, "--json", "vars"])
        names = [v["name"] for v in json.loads(r.stdout)["vars"]]
        for args, _, _ in cases:
            self.assertNotIn(args[0], names)
        self.assert_serving()

    def test_offset_plus_count_overflow_is_out_of_range(self):
        self.ok("declare", "ov", "4,2")
        out = self.error("OUT_OF_RANGE", "pull", "ov", str(1 << 63), str((1 << 63) + 5))
        self.assertIn("elements [9223372036854775808, 9223372036854775808 + "
                      "9223372036854775813)", out)
        out = self.error("INVALID_ARGUMENT", "pull", "ov", "0", "0")
        self.assertIn("segment 0 has count 0", out)
        self.assert_serving()

    def test_overlapping_segments_are_refused_and_nothing_applied(self):
        self.ok("declare", "olap", "4,2")  # shard 0: elements [0, 4)
        msg = pb.push("t", [("olap", 0, 3, [4, 2]), ("olap", 2, 2, [4, 2])], [1.0] * 5)
        out = self.error("INVALID_ARGUMENT", "raw", "/psd.v1.Data/Push", msg.hex())
        self.assertIn("push to 'olap': segments 0 and 1 overlap (elements [0, 3) and [2, 4))",
                      out)
        self.assertEqual(pulled(self.ok("pull", "olap", "0", "4")), [0.0] * 4)
        # Adjacent is fine.
        msg = pb.push("t", [("olap", 0, 2, [4, 2]), ("olap", 2, 2, [4, 2])], [1.0] * 4)
        self.ok("raw", "/psd.v1.Data/Push", msg.hex())
        self.assertEqual([f32(x) for x in pulled(self.ok("pull", "olap", "0", "4"))],
                         [f32(-f32(LR))] * 4)
        self.assert_serving()

    def nonfinite(self):
        r = h.run([h.build_path("ps-server", "psctl"), "--cluster", self.spec, "--json", "status"])
        self.assertEqual(r.returncode, 0, r.stderr)
        return [s["nonfinite_pushes"] for s in json.loads(r.stdout)["shards"]]

    def test_nan_and_inf_are_rejected_naming_variable_and_element(self):
        for shard in range(2):
            self.ok("declare", "nf", "4,2", shard=shard)  # shard 1: elements [4, 8)
        before = self.nonfinite()
        for value, word in (("nan", "NaN"), ("inf", "+Inf"), ("-inf", "-Inf")):
            msg = pb.push("t", [("nf", 4, 2, [4, 2]), ("nf", 6, 2, [4, 2])],
                          [1.0, 2.0, 3.0, float(value)])
            out = self.error("INVALID_ARGUMENT", "raw", "/psd.v1.Data/Push", msg.hex(), shard=1)
            self.assertIn("push to 'nf': gradient element 7 (segment 1) is %s; nothing of this "
                          "push was applied (job.nonfinite is \"reject\")" % word, out)
        out = self.error("INVALID_ARGUMENT", "pushfill", "nf", "4,2", "4", "4", "nan", shard=1)
        self.assertIn("gradient element 4 (segment 0) is NaN", out)
        # Nothing of any of them was applied, and each was counted.
        self.assertEqual(pulled(self.ok("pull", "nf", "4", "4", shard=1)), [0.0] * 4)
        self.assertEqual(self.nonfinite(), [before[0], before[1] + 4])
        r = h.run([h.build_path("ps-server", "psctl"), "--cluster", self.spec, "metrics"])
        self.assertIn('psd_nonfinite_pushes_total{shard="1"} %d' % (before[1] + 4), r.stdout)
        self.assertIn("# TYPE psd_nonfinite_pushes_total counter", r.stdout)
        r = h.run([h.build_path("ps-server", "psctl"), "--cluster", self.spec, "status"])
        self.assertIn('ps:1: %d pushes with NaN or Inf in the gradient rejected '
                      '(job.nonfinite "reject")' % (before[1] + 4), r.stdout)
        self.assert_serving()

    def test_client_refuses_a_nan_gradient_whole(self):
        # Each shard judges only its own messages, so libpsclient checks the
        # whole gradient first: a NaN in shard 1's part must not leave shard
        # 0's part applied. 4 MiB split over both shards, the NaN in the last
        # element (shard 1's).
        before = self.nonfinite()
        r = h.pstool(self.spec, "--bytes", str(4 << 20), "nanpush", str((1 << 20) - 1))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("refused: push: gradient of 'nanpush' element 1048575 is NaN; nothing "
                      "of this push was sent (job.nonfinite is \"reject\")", r.stdout)
        self.assertIn("OK unchanged", r.stdout)
        # Nothing reached a shard.
        self.assertEqual(self.nonfinite(), before)
        self.assert_serving()

    def test_worker_index_out_of_range(self):
        self.ok("declare", "wk", "2")
        msg = pb.push("t", [("wk", 0, 1, [2])], [1.0], worker=5) + pb.uint(30, 1)
        out = self.error("INVALID_ARGUMENT", "raw", "/psd.v1.Data/Push", msg.hex())
        self.assertIn("Push: worker 5 out of range; cluster.worker has 1 entries", out)
        out = self.error("INVALID_ARGUMENT", "raw", "/psd.v1.Coord/Heartbeat",
                         (pb.caller("t") + pb.uint(2, 3)).hex())
        self.assertIn("Heartbeat: worker 3 out of range", out)
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


class PsdLimitsTest(h.ShardsTest):
    """A shard with the smallest message limit and job.nonfinite "skip"."""

    NPS = 1
    SHARD = 0
    JOB = {"name": "lim", "optimizer": {"type": "sgd", "lr": 1.0},
           "max_message_mb": 4, "nonfinite": "skip"}

    def tool(self, *args):
        return h.pstool(self.spec, *args)

    def test_limits_are_logged(self):
        self.ps.wait_for('input: messages over 4 MiB are refused (job.max_message_mb); pushes '
                         'with NaN or Inf are acknowledged, skipped and counted '
                         '(job.nonfinite "skip")')

    def test_oversize_message_is_resource_exhausted_and_psd_serves_on(self):
        r = self.tool("declare", "big", "2048,1024")
        self.assertEqual(r.returncode, 0, r.stdout)
        # 5 MiB of gradient: pstool itself refuses to send it at the job's limit...
        r = self.tool("pushfill", "big", "2048,1024", "0", str(5 << 18), "1")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertTrue(r.stdout.startswith("ERROR RESOURCE_EXHAUSTED: "), r.stdout)
        # ... and psd refuses it when a client sends it anyway.
        r = self.tool("--max-message-mb", "64", "pushfill", "big", "2048,1024", "0",
                      str(5 << 18), "1")
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertTrue(r.stdout.startswith("ERROR RESOURCE_EXHAUSTED: "), r.stdout)
        self.assertIn("4194304", r.stdout)  # gRPC names the limit
        # A pull whose answer would not fit the shard's limit: the first
        # elements, marked partial, whatever the client accepts.
        r = self.tool("--max-message-mb", "64", "pull", "big", "0", str(5 << 18))
        self.assertEqual(r.returncode, 0, r.stdout[:300] + r.stderr)
        m = re.match(r"OK version=\d+ partial elements=(\d+) values=", r.stdout)
        self.assertIsNotNone(m, r.stdout[:300])
        self.assertTrue((1 << 20) - 16 <= int(m.group(1)) < 1 << 20, m.group(1))
        # Nothing was applied; a push within the limit is.
        r = self.tool("pushfill", "big", "2048,1024", "0", str(1 << 18), "1")
        self.assertEqual(r.returncode, 0, r.stdout)
        r = self.tool("pull", "big", str((1 << 18) - 2), "4")
        self.assertEqual(pulled(r.stdout), [-1.0, -1.0, 0.0, 0.0])
        self.assertIsNone(self.ps.p.poll())
        # The roundtrip of a variable larger than the limit still works: chunked.
        r = self.tool("--bytes", str(8 << 20), "--rounds", "1", "roundtrip")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("verified", r.stdout)

    def test_nonfinite_skip_acknowledges_without_applying(self):
        self.assertEqual(self.tool("declare", "sk", "4").returncode, 0)
        st = json.loads(h.run([h.build_path("ps-server", "psctl"), "--cluster", self.spec,
                               "--json", "status"]).stdout)["shards"][0]
        before, pushes = st["nonfinite_pushes"], st["pushes"]
        self.assertEqual(st["nonfinite"], "skip")
        r = self.tool("push", "sk", "4", "0", "1,inf,2,3")
        self.assertEqual(r.returncode, 0, r.stdout)
        self.assertEqual(pulled(self.tool("pull", "sk", "0", "4").stdout), [0.0] * 4)
        r = self.tool("push", "sk", "4", "0", "1,2,3,4")
        self.assertEqual(r.returncode, 0, r.stdout)
        self.assertEqual(pulled(self.tool("pull", "sk", "0", "4").stdout), [-1.0, -2.0, -3.0, -4.0])
        st = json.loads(h.run([h.build_path("ps-server", "psctl"), "--cluster", self.spec,
                               "--json", "status"]).stdout)["shards"][0]
        self.assertEqual(st["nonfinite_pushes"], before + 1)
        self.assertEqual(st["pushes"], pushes + 1)
        out = h.run([h.build_path("ps-server", "psctl"), "--cluster", self.spec, "status"]).stdout
        self.assertIn('ps:0: %d push%s with NaN or Inf in the gradient skipped (job.nonfinite '
                      '"skip")' % (before + 1, "" if before == 0 else "es"), out)
        self.ps.wait_for("skipped a push from")


class PsdSyncBadInputTest(h.ShardsTest):
    """A sync shard (shard 1, not the coordinator) given commits by hand."""

    NWORKER = 2
    SHARD = 1
    JOB = {"name": "sy", "optimizer": {"type": "sgd", "lr": 1.0}, "sync": {"mode": "sync"}}

    def tool(self, *args):
        return h.pstool(self.spec, "--shard", "1", *args)

    def expect(self, code, *args):
        r = self.tool(*args)
        self.assertEqual(r.returncode, 0 if code == "OK" else 1, r.stdout + r.stderr)
        self.assertTrue(r.stdout.startswith(code), r.stdout)
        return r.stdout

    def test_push_for_a_closed_step_is_aborted_and_dropped(self):
        self.expect("OK", "declare", "s", "4", "1")  # whole on shard 1
        self.expect("OK", "--step", "0", "--worker", "0", "push", "s", "4", "0", "1,2,3,4")
        out = self.expect("ERROR FAILED_PRECONDITION", "--step", "9", "--worker", "1", "push",
                          "s", "4", "0", "1,2,3,4")
        self.assertIn("push to 's' for step 9 from worker 1: this shard has committed 0 steps "
                      "(the open step is 0)", out)
        out = self.expect("ERROR INVALID_ARGUMENT", "--step", "0", "--worker", "1", "push", "s",
                          "4", "0", "1,nan,3,4")
        self.assertIn("push to 's': gradient element 1 (segment 0) is NaN", out)
        # The commit's sets are checked before anything happens.
        for applied, dropped, needle in (([0, 0], [], "worker 0 is listed twice in applied"),
                                         ([0], [0], "worker 0 is listed both in applied and "
                                                    "in dropped"),
                                         ([0, 2], [], "worker 2 in applied is out of range")):
            out = self.expect("ERROR INVALID_ARGUMENT", "raw", "/psd.v1.Data/Commit",
                              pb.commit("sy", 0, applied, dropped).hex())
            self.assertIn("Commit of step 0: " + needle, out)
        # A pull more than one step ahead is refused, not parked.
        out = self.expect("ERROR FAILED_PRECONDITION", "raw", "/psd.v1.Data/Pull",
                          pb.pull("sy", [("s", 0, 4)], min_version=2).hex())
        self.assertIn("Pull: version 2 asked for, but shard 1 has committed 0 steps", out)
        self.expect("OK", "raw", "/psd.v1.Data/Commit", pb.commit("sy", 0, [0], [1]).hex())
        self.assertEqual(pulled(self.expect("OK", "pull", "s", "0", "4")), [-1.0, -2.0, -3.0, -4.0])
        # Step 0 is closed now: its late gradient is ABORTED and dropped.
        out = self.expect("ERROR ABORTED", "--step", "0", "--worker", "1", "push", "s", "4", "0",
                          "10,10,10,10")
        self.assertIn("push to 's' for step 0 from worker 1: step 0 is already closed (this "
                      "shard has committed 1 steps; the open step is 1); the gradient is "
                      "dropped", out)
        self.expect("OK", "raw", "/psd.v1.Data/Commit", pb.commit("sy", 1, [1], [0]).hex())
        self.assertEqual(pulled(self.expect("OK", "pull", "s", "0", "4")), [-1.0, -2.0, -3.0, -4.0])
        self.assertIsNone(self.ps.p.poll())


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
    h.main()
