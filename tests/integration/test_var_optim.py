"""A variable's own optimizer (VarSpec.optimizer) end to end on real psd
processes on 127.0.0.1, declared by hand-built requests (pb.py through
`pstool raw`): a variable declared with {"type": "sgd", "lr": 0.5} on a shard
whose spec says momentum follows the SGD formula to the bit, and psctl shows
it; the same declaration again is the one that exists, another optimizer
(or the spec's) is ALREADY_EXISTS naming both, bad JSON or a bad value is
INVALID_ARGUMENT naming the variable, and a refused Declare creates nothing;
a restart from a checkpoint keeps the variable's own optimizer and slots.
Run: /usr/bin/python3 test_var_optim.py BUILD_DIR"""
import json
import os
import signal
import unittest

import numpy as np

import harness as h
import pb

LR, MU = 0.1, 0.9  # the spec's job.optimizer: momentum
SGD = '{"type": "sgd", "lr": 0.5}'
ADAM = '{"type": "adam", "lr": 0.01, "beta1": 0.8}'
F32 = np.float32


def pulled(out):
    """Values from a pstool pull line: 'OK version=N values=a,b,...'."""
    line = out.strip().splitlines()[-1]
    assert line.startswith("OK "), line
    return np.array([float(v) for v in line.split("values=", 1)[1].split(",")], dtype=F32)


def bits(a):
    return np.ascontiguousarray(a, dtype=F32).view(np.uint32)


class VarOptimTest(h.ProcTest):
    def start(self, checkpoint=None):
        job = {"name": "vo", "optimizer": {"type": "momentum", "lr": LR, "momentum": MU}}
        if checkpoint:
            job["checkpoint"] = {"dir": checkpoint}
        self.spec = os.path.join(self.d, "spec.json")
        if not os.path.exists(self.spec):
            h.write_spec(self.spec, nps=1, nworker=1, job=job)
        p = h.start_psd(self.spec, 0)
        self.procs.append(p)
        return p

    def call(self, *specs):
        """Declares specs (pb.var_spec tuples) on ps:0; returns pstool's result."""
        msg = pb.declare("vo", [pb.var_spec(*s) for s in specs])
        return h.pstool(self.spec, "--shard", "0", "raw", "/psd.v1.Data/Declare", msg.hex())

    def declare_ok(self, *specs):
        r = self.call(*specs)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def declare_error(self, code, *specs):
        r = self.call(*specs)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertTrue(r.stdout.startswith("ERROR %s: " % code), r.stdout)
        return r.stdout

    def tool(self, *args):
        r = h.pstool(self.spec, "--shard", "0", *args)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        return r.stdout

    def push(self, name, g):
        self.tool("push", name, str(len(g)), "0", ",".join(repr(float(x)) for x in g))

    def optimizers(self, command="vars"):
        """{variable: optimizer} as psctl --json vars (or status) shows them."""
        r = h.run([h.build_path("ps-server", "psctl"), "--cluster", self.spec, "--json", command])
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        doc = json.loads(r.stdout)
        found = {}

        def walk(x):
            if isinstance(x, dict):
                if isinstance(x.get("name"), str) and isinstance(x.get("optimizer"), str):
                    found[x["name"]] = x["optimizer"]
                for v in x.values():
                    walk(v)
            elif isinstance(x, list):
                for v in x:
                    walk(v)
        walk(doc)
        return found

    def test_own_sgd_follows_the_formula_and_conflicts_are_refused(self):
        p = self.start()
        self.declare_ok(("s", [4], -1, SGD), ("m", [4]))
        g1 = np.array([1.0, -2.0, 0.25, 3.5], dtype=F32)
        g2 = np.array([0.5, 0.5, -1.0, 2.0], dtype=F32)
        for g in (g1, g2):
            self.push("s", g)
            self.push("m", g)
        # SGD: w = w - lr g per push, in float32, from zeros.
        w = np.zeros(4, dtype=F32)
        for g in (g1, g2):
            w = w - F32(0.5) * g
        got = pulled(self.tool("pull", "s", "0", "4"))
        self.assertTrue(np.array_equal(bits(got), bits(w)), (got, w))
        # The spec's momentum for the other: v = mu v + g; w = w - lr v.
        w, v = np.zeros(4, dtype=F32), np.zeros(4, dtype=F32)
        for g in (g1, g2):
            v = F32(MU) * v + g
            w = w - F32(LR) * v
        got = pulled(self.tool("pull", "m", "0", "4"))
        self.assertTrue(np.array_equal(bits(got), bits(w)), (got, w))
        self.assertIn("'s': optimizer sgd(lr=0.5) (its own, declared)", p.output())
        self.assertEqual(self.optimizers(),
                         {"s": "sgd(lr=0.5)", "m": "momentum(lr=0.1, momentum=0.9)"})
        self.assertEqual(self.optimizers("status"),
                         {"s": "sgd(lr=0.5)", "m": "momentum(lr=0.1, momentum=0.9)"})

        # The same again (spelled otherwise) is the one that exists.
        self.declare_ok(("s", [4], -1, '{"lr": 0.5, "type": "sgd", "momentum": 0.1}'))
        self.declare_ok(("m", [4], -1, '{"type": "momentum", "lr": 0.1, "momentum": 0.9}'))
        self.declare_ok(("m", [4]))
        # Another optimizer, or the spec's, names the variable and both.
        out = self.declare_error("ALREADY_EXISTS", ("s", [4], -1, ADAM))
        self.assertIn("'s'", out)
        self.assertIn("sgd(lr=0.5)", out)
        self.assertIn("adam(lr=0.01, beta1=0.8, beta2=0.999, eps=1e-08)", out)
        out = self.declare_error("ALREADY_EXISTS", ("s", [4]))
        self.assertIn("'s' already exists with optimizer sgd(lr=0.5) (its own, declared); "
                      "this declaration asks for momentum(lr=0.1, momentum=0.9) (the spec's)",
                      out)
        out = self.declare_error("ALREADY_EXISTS", ("m", [4], -1, SGD))
        self.assertIn("'m' already exists with optimizer momentum(lr=0.1, momentum=0.9) "
                      "(the spec's); this declaration asks for sgd(lr=0.5) (its own)", out)

        # Bad JSON and bad values name the variable and what is wrong.
        out = self.declare_error("INVALID_ARGUMENT", ("b1", [2], -1, '{"type": "sgd", "lr": }'))
        self.assertIn("Declare 'b1': optimizer:1:", out)
        self.assertIn("JSON syntax error", out)
        out = self.declare_error("INVALID_ARGUMENT", ("b2", [2], -1, '{"type": "sgd", "lr": -1}'))
        self.assertIn("Declare 'b2': optimizer.lr: expected a positive number, got -1", out)
        out = self.declare_error("INVALID_ARGUMENT", ("b3", [2], -1, '{"type": "sgdd"}'))
        self.assertIn("Declare 'b3': optimizer.type: expected \"sgd\"", out)
        out = self.declare_error("INVALID_ARGUMENT", ("b4", [2], -1, '[0.5]'))
        self.assertIn("Declare 'b4': optimizer: expected an object", out)
        # A name twice with two optimizers in one request.
        out = self.declare_error("INVALID_ARGUMENT", ("b5", [2], -1, SGD), ("b5", [2], -1, ADAM))
        self.assertIn("'b5' is declared twice in one request", out)
        # A refused Declare creates nothing, not even its good variables.
        self.declare_error("INVALID_ARGUMENT", ("ok1", [2], -1, SGD), ("b6", [2], -1, "{"))
        self.declare_error("ALREADY_EXISTS", ("ok2", [2], -1, SGD), ("s", [4], -1, ADAM))
        self.assertEqual(sorted(self.optimizers()), ["m", "s"])
        self.assertIsNone(p.p.poll(), p.output())

    def test_restart_from_checkpoint_keeps_the_own_optimizer(self):
        root = os.path.join(self.d, "ck")
        p = self.start(checkpoint=root)
        self.declare_ok(("a", [3], -1, ADAM), ("m", [3]))
        grads = [np.array([1.0, -0.5, 2.0], dtype=F32), np.array([0.25, 0.75, -1.5], dtype=F32)]
        for g in grads:
            self.push("a", g)
            self.push("m", g)
        self.assertEqual(p.stop(signal.SIGTERM), 0, p.output())
        with open(os.path.join(root, "vo", "ps-0", "ckpt-0000000004", "manifest.json")) as f:
            entries = {e["name"]: e for e in json.load(f)["vars"]}
        self.assertEqual(entries["a"]["optimizer"], "adam")
        self.assertEqual(entries["a"]["own_optimizer"]["lr"], 0.01)
        self.assertNotIn("own_optimizer", entries["m"])

        p = self.start()
        p.wait_for("resumed from step 4")
        self.assertIn("'a': optimizer adam(lr=0.01, beta1=0.8, beta2=0.999, eps=1e-08) "
                      "(its own, declared)", p.output())
        self.assertEqual(self.optimizers()["a"], "adam(lr=0.01, beta1=0.8, beta2=0.999, eps=1e-08)")
        # The worker declares again after the restart: the same is fine, the
        # spec's is not.
        self.declare_ok(("a", [3], -1, ADAM), ("m", [3]))
        self.declare_error("ALREADY_EXISTS", ("a", [3]))
        # A third push goes on from the restored slots and step: Adam, t = 3.
        g3 = np.array([-0.5, 1.0, 0.5], dtype=F32)
        self.push("a", g3)
        w = np.zeros(3, dtype=np.float64)
        m = np.zeros(3, dtype=np.float64)
        v = np.zeros(3, dtype=np.float64)
        for t, g in enumerate(grads + [g3], 1):
            g = g.astype(np.float64)
            m = 0.8 * m + 0.2 * g
            v = 0.999 * v + 0.001 * g * g
            mh, vh = m / (1 - 0.8 ** t), v / (1 - 0.999 ** t)
            w = w - 0.01 * mh / (np.sqrt(vh) + 1e-8)
        got = pulled(self.tool("pull", "a", "0", "3"))
        np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-7)


if __name__ == "__main__":
    h.main()
