#!/usr/bin/python3
"""The psd Python package (worker/python: psd.Client over the _psd extension
over libpsclient) against real psd shards on 127.0.0.1: the optimizer's
formula seen through push and pull, zero copies into the caller's arrays
(no 48 MiB pull makes room for its payload twice), the GIL released while
a pull waits on a stopped shard, every bad buffer refused with ValueError
and nothing sent, spec file names that are not UTF-8, a closed client, no
leak of a payload per call, placement that does not depend on declaration
order, TF_CONFIG and address lists, embedding tables, and clock() under
staleness 0. Declare's values, errors and their codes, a late shard, the
log and Ctrl-C: test_python_client.py.

Run: /usr/bin/python3 test_python.py BUILD_DIR (the package is imported
from BUILD_DIR/worker/python; the suite skips, exit 77, without it)."""
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import unittest

import numpy as np

import harness as h
import pyshards
from pyshards import F32, LR, MU, Shards

psd = None  # imported in setUpModule from the build tree


def setUpModule():
    global psd
    psd = pyshards.import_psd()


def rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in "arena ordblks smblks hblks "
                "hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]


def malloc_in_use():
    """Bytes malloc has handed out and not had back, over every arena and
    mmap (glibc's mallinfo2: uordblks + hblkhd): C's allocations, numpy's
    arrays, and Python's objects above 512 bytes. None without it."""
    f = getattr(ctypes.CDLL(None), "mallinfo2", None)
    if f is None:
        return None
    f.restype = _MallInfo2
    m = f()
    return m.uordblks + m.hblkhd


# Pulls a 48 MiB variable of one shard (argv: the package's directory, the
# spec, the variable's name) and prints, for each of 8 pulls after 3 to warm
# up, how far the peak RSS rose above the RSS before it (VmHWM, reset
# through /proc/self/clear_refs) and the peak of Python's traced
# allocations (tracemalloc: numpy's arrays included), both in KiB. 48 MiB
# is above malloc's largest mmap threshold (32 MiB, which libpsclient sets:
# cm_rpc_global_init), so a temporary of the payload's size is a fresh
# mapping each time, never a heap kept from the last pull.
PEAK_CHILD = r"""
import json, sys, tracemalloc
sys.path.insert(0, sys.argv[1])
import numpy as np, psd
def kib(key):
    with open("/proc/self/status") as f:
        return int([l for l in f if l.startswith(key + ":")][0].split()[1])
c = psd.Client(sys.argv[2], "worker:0")
n = 12 << 20
v = c.declare(sys.argv[3], (n,), placement=0, init="uniform",
              init_scale=0.5, optimizer={"type": "sgd", "lr": 0.1})
a = np.ones(n, np.float32)
for _ in range(3):
    c.pull(v, a)
tracemalloc.start()
out = []
for _ in range(8):
    tracemalloc.reset_peak()
    traced = tracemalloc.get_traced_memory()[0]
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    rss = kib("VmRSS")
    c.pull(v, a)
    out.append([kib("VmHWM") - rss,
                (tracemalloc.get_traced_memory()[1] - traced) // 1024])
c.close()
print(json.dumps(out))
"""

# Opens clients from spec file names that are not UTF-8, in the directory
# it runs in (argv: the package's directory, the shards' addresses joined
# by commas), and prints for each case ["ok", what it saw] or [the
# exception's type, its text], as JSON.
FSNAME_CHILD = r"""
import json, os, pathlib, sys
sys.path.insert(0, sys.argv[1])
import psd
out = {}
def attempt(key, f):
    try:
        out[key] = ["ok", f()]
    except Exception as e:
        out[key] = [type(e).__name__, str(e)]
def use(name):
    with psd.Client(name, "worker:0") as c:
        v = c.declare("fs/w", (3,))
        return [c.num_shards, c.pull(v).tolist()]
real = os.fsdecode(b"real-\xfe.json")
attempt("missing", lambda: psd.Client(os.fsdecode(b"spec-\xff.json"),
                                      "worker:0"))
attempt("str", lambda: use(real))
attempt("bytes", lambda: use(os.fsencode(real)))
attempt("path", lambda: use(pathlib.Path(real)))
attempt("lone", lambda: psd.Client("spec-\ud800.json", "worker:0"))
attempt("token", lambda: psd.Client(addrs=sys.argv[2].split(","),
                                    token_file=os.fsdecode(b"tok-\xfd")))
print(json.dumps(out))
"""


class AsyncTest(pyshards.AsyncCase):
    """One async job with momentum in its spec; each case declares
    variables of its own."""

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
        """A pull lands in the caller's own memory: views of a numpy array
        and of a CPU tensor, taken before the pull, see the pulled values;
        the C side moves exactly the payload."""
        c = self.client()
        h_ = c.declare("z/w", (512, 256), init="uniform", init_scale=0.5)
        a = np.zeros((512, 256), F32)
        view = a.reshape(-1)[::-1]  # the same memory, seen another way
        before = c.bytes_pulled
        c.pull(h_, a)
        self.assertEqual(c.bytes_pulled - before, a.nbytes)
        self.assertGreater(float(np.abs(view).max()), 0.0)
        np.testing.assert_array_equal(view[::-1].reshape(512, 256),
                                      c.pull(h_))
        before = c.bytes_pushed
        c.push(h_, np.zeros_like(a))
        self.assertEqual(c.bytes_pushed - before, a.nbytes)
        try:
            import torch
        except ImportError:
            return
        t = torch.zeros(512, 256)
        tview = t.numpy()  # shares the tensor's memory
        c.pull(h_, t)
        self.assertGreater(float(np.abs(tview).max()), 0.0)
        np.testing.assert_array_equal(tview, a)

    def test_zero_copy_peak(self):
        """No pull makes room for its payload a second time: in a process
        of its own, after 3 pulls of 48 MiB to warm up, the peak RSS of at
        least one of 8 pulls rises less than 4 MiB above the RSS before it
        (gRPC's messages: at most 4 of 2 MiB in flight, on a heap that is
        reused), and Python's traced allocations stay under 1 MiB in every
        pull. A pull into a temporary that is then copied (in C, or a numpy
        copy) raises every pull's peak by 48 MiB."""
        if not os.access("/proc/self/clear_refs", os.W_OK):
            self.skipTest("/proc/self/clear_refs cannot reset the peak RSS")
        r = subprocess.run(
            [sys.executable, "-c", PEAK_CHILD,
             h.build_path("worker", "python"), self.spec, "z/peak"],
            capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        pulls = json.loads(r.stdout)
        self.assertLess(min(p[0] for p in pulls), 4 * 1024,
                        "every 48 MiB pull raised the peak RSS by 4 MiB or "
                        "more (KiB, traced KiB): %r" % pulls)
        self.assertLess(max(p[1] for p in pulls), 1024,
                        "a 48 MiB pull allocated 1 MiB or more in Python "
                        "(KiB, traced KiB): %r" % pulls)

    def test_gil_released(self):
        """While a pull waits on a shard stopped with SIGSTOP, a pure-Python
        thread counts on, and the pull has not returned; after SIGCONT the
        pull completes with the shard's values. Were the GIL held through
        the call, the counting thread (and this one) would stand still
        until the pull gave up."""
        c = self.client(timeout_ms=2000, retry_s=10)
        v = c.declare("gil/w", (1000,), placement=1)  # on ps:1 alone
        c.push(v, np.ones(1000, F32))
        want = c.pull(v).copy()
        self.assertTrue(np.all(want != 0))
        shard = self.shards.procs[1].p
        buf = np.zeros(1000, F32)
        count = [0]
        halt = threading.Event()
        entered, returned = threading.Event(), threading.Event()
        errors = []

        def counter():
            while not halt.is_set():
                count[0] += 1

        def puller():
            entered.set()
            try:
                c.pull(v, buf)
            except BaseException as e:  # reported below
                errors.append(e)
            returned.set()

        os.kill(shard.pid, signal.SIGSTOP)
        tc = threading.Thread(target=counter)
        tp = threading.Thread(target=puller)
        try:
            tc.start()
            tp.start()
            self.assertTrue(entered.wait(30))
            n0 = count[0]
            returned.wait(1.0)  # a second of the pull waiting
            n1 = count[0]
            self.assertFalse(returned.is_set(),
                             "the pull returned while its shard was "
                             "stopped: %r" % errors)
            self.assertGreater(n1 - n0, 1000,
                               "a Python thread counted %d times in the "
                               "second a pull waited" % (n1 - n0))
        finally:
            os.kill(shard.pid, signal.SIGCONT)
            tp.join(60)
            halt.set()
            tc.join(10)
        self.assertTrue(returned.is_set(), "the pull still waits after "
                        "SIGCONT")
        self.assertEqual(errors, [])
        np.testing.assert_array_equal(buf, want)

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
        """Pulls and pushes of a 16 KiB payload, then whole client cycles
        (open, declare, pull, push, close), over and over: the bytes malloc
        holds grow by far less than a payload per call (under 1 KiB per
        call, 4 KiB per cycle of two calls), and the RSS by under 8 KiB per
        cycle."""
        if h.sanitizer_cflags():
            self.skipTest("ASan's allocator and quarantine hold freed memory, "
                          "so malloc's and the RSS's figures say nothing of "
                          "leaks here (the plain build checks them)")
        grad, buf = np.ones(4096, F32), np.empty(4096, F32)
        if malloc_in_use() is None:
            self.skipTest("no mallinfo2 (not glibc 2.33 or later)")

        def calls(c, v, n):
            for _ in range(n):
                c.pull(v, buf)
                c.push(v, grad)

        c = self.client()
        v = c.declare("leak/w", (4096,))
        calls(c, v, 100)  # warm up: gRPC's and the allocator's own pools
        before = malloc_in_use()
        calls(c, v, 500)
        grown = malloc_in_use() - before
        self.assertLess(grown, 1000 * 1024, "malloc holds %d bytes more "
                        "after 1000 calls of 16 KiB" % grown)

        def cycles(n):
            for _ in range(n):
                c = psd.Client(self.spec, "worker:0")
                v = c.declare("leak/w", (4096,))
                c.pull(v, buf)
                c.push(v, grad)
                c.close()

        cycles(30)  # warm up
        before, rss = malloc_in_use(), rss_kib()
        cycles(150)
        grown, rss_grown = malloc_in_use() - before, rss_kib() - rss
        self.assertLess(grown, 150 * 4096, "malloc holds %d bytes more "
                        "after 150 client cycles" % grown)
        self.assertLess(rss_grown, 150 * 8, "RSS grew %d KiB over 150 "
                        "client cycles" % rss_grown)

    def test_spec_name_not_utf8(self):
        """Spec file names of bytes that are not UTF-8, as os.fsdecode
        gives them ("spec-\\udcff.json"), in a process of its own: a
        missing one is psd.Error naming the file (the interpreter crashed
        when the name was encoded with the GIL released); a real one opens,
        as str, bytes or a Path; a name that no encoding makes bytes of, and
        a token file whose name is not UTF-8, are ValueError naming them."""
        dname = os.fsencode(self.d)
        shutil.copy(self.spec, os.path.join(dname, b"real-\xfe.json"))
        self.addCleanup(os.unlink, os.path.join(dname, b"real-\xfe.json"))
        r = subprocess.run(
            [sys.executable, "-c", FSNAME_CHILD,
             h.build_path("worker", "python"),
             ",".join(self.shards.cfg["cluster"]["ps"])],
            capture_output=True, text=True, timeout=120, cwd=self.d)
        self.assertEqual(r.returncode, 0, r.stderr)  # not -11, SIGSEGV
        got = json.loads(r.stdout)
        self.assertEqual(got["missing"][0], "Error", got)
        self.assertIn("spec-\\xff.json", got["missing"][1])
        for k in ("str", "bytes", "path"):
            self.assertEqual(got[k], ["ok", [2, [0.0, 0.0, 0.0]]], k)
        self.assertEqual(got["lone"][0], "ValueError", got)
        self.assertIn("spec-\\ud800.json", got["lone"][1])
        self.assertIn("surrogates not allowed", got["lone"][1])
        self.assertEqual(got["token"][0], "ValueError", got)
        self.assertIn("tok-\\udcfd", got["token"][1])
        self.assertIn("UTF-8", got["token"][1])

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


if __name__ == "__main__":
    h.main()
