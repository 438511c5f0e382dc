#!/usr/bin/python3
"""The psd Python package's client against real psd shards on 127.0.0.1:
declare's values (the first client's win, whole or staged past a message;
bad ones refused, nothing declared), a shard's refusal as psd.Error with
its gRPC status, one code per condition whoever finds it, a declare that
starts before its shard connecting within 1 s of the shard's readiness,
the library's log lines to a callback, to logging, dropped or on stderr,
and Ctrl-C during a parked pull. The core calls: test_python.py.

Run: /usr/bin/python3 test_python_client.py BUILD_DIR (the package is
imported from BUILD_DIR/worker/python; the suite skips, exit 77, without
it)."""
import os
import re
import signal
import threading
import time
import unittest

import numpy as np

import harness as h
import pyshards
from pyshards import F32, Shards

psd = None  # imported in setUpModule from the build tree


def setUpModule():
    global psd
    psd = pyshards.import_psd()


class DeclareErrorsTest(pyshards.AsyncCase):
    """Declare's values and the errors of an async job with momentum in
    its spec; each case declares variables of its own."""


    def test_declare_values_first_client_wins(self):
        """declare(..., values=...): the first client's values are the
        variable's, whole or split (past a message: staged), and a second
        client's are ignored: both pull the first's. values=None is init."""
        a, b = self.client(), self.client("worker:1")
        for name, shape in (("dv/w", (3, 4)), ("dv/big", (2000, 600))):
            va = np.arange(np.prod(shape), dtype=F32).reshape(shape) + 1
            ha = a.declare(name, shape, values=va)
            hb = b.declare(name, shape, values=-va)
            np.testing.assert_array_equal(a.pull(ha), va)
            np.testing.assert_array_equal(b.pull(hb), va)
        # Any shape of the right size; None: the initializer's zeros.
        hf = a.declare("dv/flat", (2, 3), values=np.full(6, 2.5, F32))
        np.testing.assert_array_equal(a.pull(hf), np.full((2, 3), 2.5, F32))
        hn = a.declare("dv/none", (4,), values=None)
        np.testing.assert_array_equal(a.pull(hn), np.zeros(4, F32))

    def test_declare_values_bad_buffers(self):
        """values of another dtype or size, or not a buffer: ValueError
        naming the variable, and nothing is declared."""
        c = self.client()
        for bad, why in ((np.zeros(3, F32), "its size differs"),
                         (np.zeros(4, np.float64), "its dtype is not float32"),
                         (np.zeros((4, 2), F32)[:, 0], "is no C-contiguous buffer"),
                         ("abcd", "is no C-contiguous buffer")):
            with self.assertRaises(ValueError) as e:
                c.declare("dvb/w", (4,), values=bad)
            self.assertIn("variable 'dvb/w'", str(e.exception))
            self.assertIn(why, str(e.exception))
        with self.assertRaises(KeyError):
            c.shape("dvb/w")
        # Not created on the shards either: a good declare creates it now.
        h_ = c.declare("dvb/w", (4,), values=np.full(4, 7, F32))
        np.testing.assert_array_equal(c.pull(h_), np.full(4, 7, F32))

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

    def test_one_condition_one_code(self):
        """The same condition gets the same code whoever finds it: another
        shape for a variable or a table is psd.EEXIST from a shard
        (ALREADY_EXISTS) and from this client; an id at a table's bound is
        psd.ERANGE; a table never declared is KeyError, as a variable. No
        message names a function of the library's insides."""
        c1, c2 = self.client(), self.client("worker:1")
        c1.declare("cc/w", (10,))
        msgs = []
        for c, want_status in ((c2, 6), (c1, 0)):
            with self.assertRaises(psd.Error) as cm:
                c.declare("cc/w", (11,))
            self.assertEqual((cm.exception.code, cm.exception.grpc_status),
                             (psd.EEXIST, want_status), str(cm.exception))
            self.assertIn("'cc/w'", str(cm.exception))
            msgs.append(str(cm.exception))
        c1.declare_table("cc/t", 4, id_bound=10)
        with self.assertRaises(psd.Error) as cm:
            c2.declare_table("cc/t", 8, id_bound=10)
        self.assertEqual((cm.exception.code, cm.exception.grpc_status),
                         (psd.EEXIST, 6), str(cm.exception))
        msgs.append(str(cm.exception))
        ids = np.array([3, 10], np.uint64)
        with self.assertRaises(psd.Error) as cm:
            c1.push_rows("cc/t", ids, np.zeros((2, 4), F32))
        self.assertEqual(cm.exception.code, psd.ERANGE, str(cm.exception))
        self.assertIn("id 10 (position 1) is not below the table's id_bound 10",
                      str(cm.exception))
        msgs.append(str(cm.exception))
        with self.assertRaises(KeyError) as cm:
            c1.pull_rows("cc/none", ids, np.zeros((2, 4), F32))
        self.assertIn("table 'cc/none' was not declared", str(cm.exception))
        for m in msgs:
            self.assertNotRegex(m, r"\b(dw|cm|psd)_[a-z_]+\b")


class LateShardTest(h.ProcTest):
    """A Python client whose declare starts before its shard."""

    def test_declare_connects_soon_after_the_shard_listens(self):
        """Its first attempts refused, the declare returns within ~100 ms of
        the shard's readiness line (it took 5-6.8 s, gRPC's reconnect
        backoff polled by nobody); the bound is a generous 1 s."""
        spec = os.path.join(self.d, "late.json")
        h.write_spec(spec, nps=1, nworker=1, job={"name": "late"})
        code = ("import psd, sys\n"
                "c = psd.Client(sys.argv[1])\n"
                "print('declaring', flush=True)\n"
                "c.declare('late/w', (4,))\n"
                "print('declared', flush=True)\n")
        c = h.Proc(["/usr/bin/python3", "-c", code, spec],
                   env={"PYTHONPATH": h.build_path("worker", "python")})
        self.procs.append(c)
        c.wait_for("declaring")
        c.wait_for("not reachable: connection refused", timeout=10)
        self.procs.append(h.start_psd(spec, 0))
        ready = time.monotonic()
        c.wait_for("declared", timeout=30)
        self.assertLess(time.monotonic() - ready, 1.0, c.output())
        self.assertEqual(c.wait(timeout=30), 0, c.output())


# The library's log lines from a Python program, against a shard nobody
# runs (each declare fails after 1.5 s, having said "not reachable"): to a
# callback, dropped at "off", to the logging module, on stderr again; each
# phase's start said on stderr.
LOG_PY = r"""
import logging, sys
import psd

def declare():
    c = psd.Client(sys.argv[1], connect_timeout_ms=1500)
    try:
        c.declare("log/w", (4,))
    except psd.Error as e:
        print("declare code", e.code == psd.EUNAVAIL, flush=True)
    c.close()

print("phase callback", file=sys.stderr, flush=True)
psd.set_log_callback(lambda level, line: print("cb", level, line, flush=True))
declare()
print("phase off", file=sys.stderr, flush=True)
psd.set_log_callback(None)
psd.set_log_level("off")
declare()
print("phase logging", file=sys.stderr, flush=True)
psd.set_log_level(logging.INFO)
logging.basicConfig(stream=sys.stdout, level=logging.INFO,
                    format="logging %(name)s %(levelname)s %(message)s")
psd.log_to_logging()
declare()
print("phase stderr", file=sys.stderr, flush=True)
psd.set_log_callback(None)
declare()
try:
    psd.set_log_level("loud")
except ValueError as e:
    print("bad level", e, flush=True)
"""


class LogTest(h.ProcTest):
    def test_log_level_and_callback(self):
        """psd.set_log_callback gets the library's lines (logging's level,
        the message alone) and nothing reaches stderr; set_log_level("off")
        drops them; log_to_logging() files them under the 'psd' logger;
        with no callback they are on stderr again, labelled psd."""
        spec = os.path.join(self.d, "nobody.json")
        addr = h.write_spec(spec, nps=1, nworker=1, job={"name": "log"})["cluster"]["ps"][0]
        r = h.run(["/usr/bin/python3", "-c", LOG_PY, spec], timeout=60,
                  env={"PYTHONPATH": h.build_path("worker", "python")})
        out = r.stdout + r.stderr
        self.assertEqual(r.returncode, 0, out)
        self.assertEqual(r.stdout.count("declare code True"), 4, out)
        line = ("ps:0 (%s) not reachable: connection refused (nothing listens "
                "there?); waiting up to 2 s for it" % addr)
        self.assertIn("cb 30 " + line + "\n", r.stdout)
        self.assertIn("logging psd WARNING " + line + "\n", r.stdout)
        self.assertEqual(r.stdout.count(line), 2, out)
        self.assertIn("bad level log level 'loud'; expected", r.stdout)
        phases = re.split(r"(?m)^phase (\w+)\n", r.stderr)
        self.assertEqual(phases[1::2], ["callback", "off", "logging", "stderr"], r.stderr)
        self.assertEqual(phases[2] + phases[4] + phases[6], "", r.stderr)
        self.assertRegex(phases[8], r"(?m)^\d\d:\d\d:\d\d\.\d{3} psd warn: %s$"
                         % re.escape(line))


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
