#!/usr/bin/python3
"""The psd Python package (worker/python: psd.Client over the _psd extension
over libpsclient) against real psd shards on 127.0.0.1: the optimizer's
formula seen through push and pull, zero copies into the caller's arrays,
the GIL released during calls, every bad input refused with ValueError and
nothing sent, psd.Error carrying the gRPC status, a closed client, no
leaks over repeated clients, Ctrl-C during a parked pull, placement that
does not depend on declaration order, TF_CONFIG and address lists, and
embedding tables.

Run: /usr/bin/python3 test_python.py BUILD_DIR (the package is imported
from BUILD_DIR/worker/python; the suite skips, exit 77, without it)."""
import json
import os
import signal
import sys
import threading
import time
import unittest

import numpy as np

import harness as h

F32 = np.float32
LR, MU = 0.1, 0.9  # the spec's optimizer: momentum
psd = None  # imported in setUpModule from the build tree


def setUpModule():
    global psd
    sys.path.insert(0, h.build_path("worker", "python"))
    try:
        import psd as mod
    except ImportError as e:
        raise unittest.SkipTest("the psd Python package is not built "
                                "(python3-dev missing?): %s" % e)
    psd = mod


def rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Shards:
    """Two psd shards of one spec, for a whole test class."""

    def __init__(self, d, job):
        self.spec = os.path.join(d, "spec.json")
        self.cfg = h.write_spec(self.spec, nps=2, nworker=2, job=job)
        self.procs = [h.start_psd(self.spec, i) for i in range(2)]

    def stop(self):
        try:
            self.procs[0].stop()
        finally:
            self.procs[1].stop()


class AsyncTest(unittest.TestCase):
    """One async job with momentum in its spec; each case declares
    variables of its own."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = h.TempDir()
        cls.d = cls.tmp.__enter__()
        cls.shards = Shards(cls.d, {
            "name": "pyjob", "optimizer": {"type": "momentum", "lr": LR,
                                           "momentum": MU},
            "tables": [{"name": "emb", "dim": 4, "init": "zeros",
                        "optimizer": {"type": "sgd", "lr": 0.5}}]})
        cls.spec = cls.shards.spec

    @classmethod
    def tearDownClass(cls):
        cls.shards.stop()
        cls.tmp.__exit__(None, None, None)

    def client(self, task="worker:0", **kw):
        c = psd.Client(self.spec, task, **kw)
        self.addCleanup(c.close)
        return c

    def test_formula_push_then_pull(self):
        """A push then a pull equals the optimizer's formula, in numpy: the
        spec's momentum, and a variable's own SGD."""
        c = self.client()
        m = c.declare("f/m", (3, 5))
        s = c.declare("f/s", (7,), optimizer={"type": "sgd", "lr": 0.5})
        rng = np.random.default_rng(1)
        w, v = np.zeros((3, 5), F32), np.zeros((3, 5), F32)
        ws = np.zeros(7, F32)
        for _ in range(3):
            g = rng.standard_normal((3, 5)).astype(F32)
            gs = rng.standard_normal(7).astype(F32)
            c.push([m, s], [g, gs], examples=8)
            v = F32(MU) * v + g
            w = w - F32(LR) * v
            ws = ws - F32(0.5) * gs
            got_m, got_s = c.pull([m, s])
            np.testing.assert_allclose(got_m, w, rtol=1e-6, atol=1e-7)
            np.testing.assert_array_equal(got_s, ws)
        # push_pull: one round trip, the same arithmetic once it is seen.
        g = np.ones(7, F32)
        c.push_pull(s, g, np.empty(7, F32))
        np.testing.assert_array_equal(c.pull(s), ws - F32(0.5) * g)

    def test_zero_copy(self):
        """A pull writes into the caller's own memory (numpy array or CPU
        tensor) and the C side moves exactly the payload."""
        c = self.client()
        h_ = c.declare("z/w", (512, 256), init="uniform", init_scale=0.5)
        a = np.zeros((512, 256), F32)
        addr, before = a.ctypes.data, c.bytes_pulled
        c.pull(h_, a)
        self.assertEqual(a.ctypes.data, addr)
        self.assertEqual(c.bytes_pulled - before, a.nbytes)
        self.assertGreater(float(np.abs(a).max()), 0.0)
        before = c.bytes_pushed
        c.push(h_, np.zeros_like(a))
        self.assertEqual(c.bytes_pushed - before, a.nbytes)
        try:
            import torch
        except ImportError:
            return
        t = torch.zeros(512, 256)
        ptr = t.data_ptr()
        c.pull(h_, t)
        self.assertEqual(t.data_ptr(), ptr)
        np.testing.assert_array_equal(t.numpy(), a)

    def test_gil_released(self):
        """Two threads pulling at once, each with its own client, overlap
        in time: neither holds the GIL while its call waits."""
        c1, c2 = self.client(), self.client()
        n = 4 << 20  # 16 MiB
        v1 = c1.declare("gil/a", (n,))
        v2 = c2.declare("gil/b", (n,))
        spans = {0: [], 1: []}

        def work(k, c, v):
            buf = np.empty(n, F32)
            for _ in range(6):
                t0 = time.monotonic()
                c.pull(v, buf)
                spans[k].append((t0, time.monotonic()))

        ts = [threading.Thread(target=work, args=(0, c1, v1)),
              threading.Thread(target=work, args=(1, c2, v2))]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
        overlap = sum(1 for a in spans[0] for b in spans[1]
                      if a[0] < b[1] and b[0] < a[1])
        self.assertEqual(len(spans[0]), 6)
        self.assertEqual(len(spans[1]), 6)
        self.assertGreater(overlap, 0, "no two pulls overlapped: %r" % spans)

    def test_bad_buffers(self):
        """Wrong size, dtype or contiguity: ValueError naming the variable
        and both shapes, and nothing sent (the value stays)."""
        c = self.client()
        v = c.declare("bad/w", (4, 6))
        c.push(v, np.ones((4, 6), F32))
        want = c.pull(v).copy()
        pushed = c.bytes_pushed
        cases = [
            (np.ones((4, 5), F32), "(4, 5)", "size"),
            (np.ones((4, 6), np.float64), "(4, 6)", "float32"),
            (np.ones((6, 4), F32), "(6, 4)", "shape"),
            (np.ones((6, 4), F32).T, "(4, 6)", "C-contiguous"),
            ("not a buffer", "(4, 6)", "buffer"),
        ]
        for buf, shape, why in cases:
            with self.assertRaises(ValueError) as cm:
                c.push(v, buf)
            msg = str(cm.exception)
            self.assertIn("bad/w", msg)
            self.assertIn(shape, msg)
            self.assertIn(why, msg)
        with self.assertRaises(ValueError):
            c.pull(v, np.empty((4, 6), F32)[:, :3])
        ro = np.empty((4, 6), F32)
        ro.setflags(write=False)
        with self.assertRaises(ValueError) as cm:
            c.pull(v, ro)
        self.assertIn("writable", str(cm.exception))
        self.assertEqual(c.bytes_pushed, pushed)
        np.testing.assert_array_equal(c.pull(v), want)
        # A flat buffer of the right size is the variable's shape too.
        c.pull(v, np.empty(24, F32))
        with self.assertRaises(KeyError):
            c.pull("never/declared", np.empty(1, F32))
        c.declare("bad/scalar", ())  # a scalar is a (1,) variable
        with self.assertRaises(ValueError) as cm:
            c.declare("bad/neg", (3, -1))
        self.assertIn("bad/neg", str(cm.exception))
        try:
            import torch
        except ImportError:
            return
        with self.assertRaises(ValueError) as cm:
            c.push(v, torch.ones(6, 4).t())
        self.assertIn("C-contiguous", str(cm.exception))

    def test_errors_carry_grpc_status(self):
        """A shard's refusal is psd.Error with the status and a message
        naming the variable and the shard."""
        c1, c2 = self.client(), self.client("worker:1")
        c1.declare("err/w", (10,))
        with self.assertRaises(psd.Error) as cm:
            c2.declare("err/w", (11,))
        e = cm.exception
        self.assertEqual(e.grpc_name, "ALREADY_EXISTS")
        self.assertEqual(e.grpc_status, 6)
        self.assertLess(e.code, 0)
        self.assertIn("err/w", str(e))
        self.assertIn("ps:", str(e))
        with self.assertRaises(psd.Error) as cm:
            c1.declare("err/opt", (3,), optimizer={"type": "sgd", "lr": -1})
        self.assertEqual(cm.exception.grpc_name, "INVALID_ARGUMENT")
        self.assertIn("err/opt", str(cm.exception))
        with self.assertRaises(psd.Error) as cm:
            psd.Client(os.path.join(self.d, "missing.json"))
        self.assertIn("missing.json", str(cm.exception))

    def test_closed_client(self):
        """A closed client raises, never crashes; close twice is fine."""
        c = psd.Client(self.spec, "worker:0")
        v = c.declare("closed/w", (5,))
        c.close()
        c.close()
        self.assertTrue(c.closed)
        for call in (lambda: c.pull(v, np.empty(5, F32)),
                     lambda: c.push(v, np.empty(5, F32)),
                     lambda: c.declare("closed/x", (1,)),
                     lambda: c.num_shards):
            with self.assertRaises(RuntimeError):
                call()

    def test_no_leaks(self):
        """Create, declare, pull, push, close, over and over: the RSS
        stays flat."""
        if h.sanitizer_cflags():
            self.skipTest("ASan's quarantine holds freed memory, so RSS says "
                          "nothing of leaks here (the plain build checks it)")
        grad = np.ones(4096, F32)
        buf = np.empty(4096, F32)

        def cycles(n):
            for _ in range(n):
                c = psd.Client(self.spec, "worker:0")
                v = c.declare("leak/w", (4096,))
                c.pull(v, buf)
                c.push(v, grad)
                c.close()

        cycles(30)  # warm up: gRPC's and the allocator's own pools
        before = rss_kib()
        cycles(150)
        grown = rss_kib() - before
        self.assertLess(grown, 6 * 1024, "RSS grew %d KiB over 150 "
                        "client cycles" % grown)

    def test_placement_any_order(self):
        """Two clients declaring the same small variables in opposite
        orders, one a subset, agree (no ALREADY_EXISTS), and see one
        another's pushes."""
        names = ["ord/%d" % i for i in range(6)]
        c1, c2 = self.client(), self.client("worker:1")
        h1 = [c1.declare(n, (3,)) for n in names]
        h2 = [c2.declare(n, (3,)) for n in reversed(names[1:])]
        c1.push(h1[3], np.full(3, 1.0, F32))
        np.testing.assert_allclose(c2.pull(names[3]), np.full(3, -LR, F32),
                                   rtol=1e-6)
        self.assertEqual(len(h2), 5)

    def test_tf_config_and_addresses(self):
        """The same job reached from a TF_CONFIG text and from the shards'
        addresses."""
        c = self.client()
        v = c.declare("open/w", (4,))
        c.push(v, np.ones(4, F32))
        want = c.pull(v)
        tf = dict(self.shards.cfg, task={"type": "worker", "index": 1})
        c2 = psd.Client(tf_config=json.dumps(tf))
        self.addCleanup(c2.close)
        self.assertEqual(c2.task_index, 1)
        c5 = psd.Client(json.dumps(tf))  # the text as the first argument
        self.addCleanup(c5.close)
        self.assertEqual((c5.task_index, c5.num_shards), (1, 2))
        c2.declare("open/w", (4,))
        np.testing.assert_array_equal(c2.pull("open/w"), want)
        c3 = psd.Client(addrs=self.shards.cfg["cluster"]["ps"], job="pyjob")
        self.addCleanup(c3.close)
        self.assertEqual(c3.task_index, -1)
        c3.declare("open/w", (4,))
        np.testing.assert_array_equal(c3.pull("open/w"), want)
        c4 = psd.Client(addrs=self.shards.cfg["cluster"]["ps"], job="other",
                        timeout_ms=5000)
        self.addCleanup(c4.close)
        with self.assertRaises(psd.Error) as cm:
            c4.declare("open/w", (4,))
        self.assertIn("pyjob", str(cm.exception))

    def test_tables(self):
        """pull_rows / push_rows: the table's SGD to the bit, repeats
        summed; a rows buffer of the wrong size is refused."""
        c = self.client()
        c.declare_table("emb", 4)
        ids = np.array([3, 99, 3, 2 ** 63 + 5], np.uint64)
        before = c.pull_rows("emb", ids)
        self.assertEqual(before.shape, (4, 4))
        g = np.arange(16, dtype=F32).reshape(4, 4)
        c.push_rows("emb", ids, g)
        after = c.pull_rows("emb", ids)
        want3 = before[0] - F32(0.5) * (g[0] + g[2])
        np.testing.assert_allclose(after[0], want3, rtol=1e-6)
        np.testing.assert_allclose(after[2], want3, rtol=1e-6)
        np.testing.assert_allclose(after[1], before[1] - F32(0.5) * g[1],
                                   rtol=1e-6)
        with self.assertRaises(ValueError) as cm:
            c.pull_rows("emb", ids, np.empty((4, 3), F32))
        self.assertIn("emb", str(cm.exception))
        with self.assertRaises(ValueError):
            c.pull_rows("emb", ids.astype(np.float64), np.empty((4, 4), F32))
        with self.assertRaises(KeyError):
            c.pull_rows("nope", ids)


class StalenessTest(unittest.TestCase):
    """clock() with job.sync.staleness 0: a worker one clock ahead waits
    for the slowest, and goes on once it catches up."""

    def setUp(self):
        self.tmp = h.TempDir()
        d = self.tmp.__enter__()
        self.shards = Shards(d, {"name": "pyssp",
                                 "sync": {"mode": "async", "staleness": 0}})

    def tearDown(self):
        self.shards.stop()
        self.tmp.__exit__(None, None, None)

    def test_clock_waits_for_the_slowest(self):
        c0 = psd.Client(self.shards.spec, "worker:0")
        c1 = psd.Client(self.shards.spec, "worker:1")
        self.addCleanup(c0.close)
        self.addCleanup(c1.close)
        self.assertEqual((c0.mode, c0.staleness), ("async", 0))
        c0.join()
        c1.join()
        done = threading.Event()
        errors = []

        def ahead():
            try:
                c0.clock(1)
            except BaseException as e:  # reported below
                errors.append(e)
            done.set()

        t = threading.Thread(target=ahead)
        t.start()
        self.assertFalse(done.wait(1.0), "clock(1) did not wait for worker 1")
        c1.clock(1)
        self.assertTrue(done.wait(30), "clock(1) still waits")
        t.join()
        self.assertEqual(errors, [])


class InterruptTest(unittest.TestCase):
    """Ctrl-C during a pull that a sync shard parks: KeyboardInterrupt,
    the call cancelled, and the client still usable."""

    def setUp(self):
        self.tmp = h.TempDir()
        d = self.tmp.__enter__()
        self.shards = Shards(d, {"name": "pysync", "sync": {"mode": "sync"}})

    def tearDown(self):
        self.shards.stop()
        self.tmp.__exit__(None, None, None)

    def test_ctrl_c_cancels_a_parked_pull(self):
        c = psd.Client(self.shards.spec, "worker:0", timeout_ms=20000)
        self.addCleanup(c.close)
        v = c.declare("int/w", (1000,))
        buf = np.empty(1000, F32)
        timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
        t0 = time.monotonic()
        timer.start()
        try:
            with self.assertRaises(KeyboardInterrupt):
                c.pull_at(v, buf, 1)  # parked: no worker pushes step 0
        finally:
            timer.cancel()
            timer.join()
        took = time.monotonic() - t0
        self.assertLess(took, 5.0, "the interrupt took %.1f s" % took)
        c.pull(v, buf)  # the client goes on
        np.testing.assert_array_equal(buf, np.zeros(1000, F32))


if __name__ == "__main__":
    h.main()
