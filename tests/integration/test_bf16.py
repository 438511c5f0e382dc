"""job.wire_dtype "bf16" as a stock gRPC client sees it (python3-grpcio):
a BF16 push is widened exactly and applied in f32; a BF16 pull answers each
f32 value rounded to nearest even, 2 bytes each, and says so in its dtype;
an F32 pull of the same values is unrounded; an unknown dtype and a bf16
push of the wrong length are refused by name, and the shard serves on.
Run: /usr/bin/python3 test_bf16.py BUILD_DIR"""
import importlib.util
import json
import struct
import unittest

import harness as h
import pb

LR, MU = 0.1, 0.9


f32 = h.f32


class Bf16WireTest(h.ShardsTest):
    NPS = 1
    JOB = {"name": "t", "optimizer": {"type": "momentum", "lr": LR, "momentum": MU}}

    def ok(self, *args):
        r = h.pstool(self.spec, "--shard", "0", *args)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        return r.stdout

    def assert_serving(self):
        r = h.run([h.build_path("ps-server", "psctl"), "--cluster", self.spec, "--json",
                   "status"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIsNone(self.ps[0].p.poll(), "psd exited:\n" + self.ps[0].output())

    @unittest.skipUnless(importlib.util.find_spec("grpc"), "python3-grpcio is not installed")
    def test_bf16_wire_push_and_pull(self):
        import grpc  # pylint: disable=import-outside-toplevel
        self.ok("declare", "b16", "4", "0")  # zeros, whole on ps:0
        g = [1.5, -2.0, 0.25, 3.0]  # bfloat16 holds each exactly
        with open(self.spec) as f:
            addr = json.load(f)["cluster"]["ps"][0]
        with grpc.insecure_channel(addr) as ch:
            push = ch.unary_unary("/psd.v1.Data/Push")
            pull = ch.unary_unary("/psd.v1.Data/Pull")
            push(pb.push("t", [("b16", 0, 4, (4,))], g, dtype=1), timeout=30)
            want = [f32(-f32(f32(LR) * f32(x))) for x in g]  # momentum, from 0
            f = pb.fields(pull(pb.pull("t", [("b16", 0, 4)]), timeout=30))
            self.assertEqual([f32(x) for x in struct.unpack("<4f", f[15][0])], want)
            b = pb.fields(pull(pb.pull("t", [("b16", 0, 4)], dtype=1), timeout=30))
            self.assertEqual(b.get(8, [0])[0], 1)  # PullResponse.dtype BF16
            self.assertEqual(b.get(7, [0])[0], 4)
            self.assertEqual(list(struct.unpack("<4H", b[15][0])), [pb.bf16(x) for x in want])
            with self.assertRaises(grpc.RpcError) as e:
                pull(pb.pull("t", [("b16", 0, 4)], dtype=7), timeout=30)
            self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
            self.assertIn("dtype 7", e.exception.details())
            short = (pb.caller("t") + pb.ld(2, pb.segment("b16", 0, 4, (4,))) +
                     pb.uint(44, 1) + pb.ld(15, b"\0" * 6))  # 4 bf16s need 8 bytes
            with self.assertRaises(grpc.RpcError) as e:
                push(short, timeout=30)
            self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
            self.assertIn("8 bytes of bf16 gradient, but the data field holds 6 bytes",
                          e.exception.details())
        self.assert_serving()



if __name__ == "__main__":
    h.main()
