"""What the psd Python package's suites (test_python.py,
test_python_client.py) share: the package imported from the build tree, two
psd shards of one spec, and a test class over one async job with momentum
in its spec."""
import os
import sys
import unittest

import numpy as np

import harness as h

F32 = np.float32
LR, MU = 0.1, 0.9  # AsyncCase's optimizer: momentum
psd = None  # set by import_psd


def import_psd():
    """The psd package of BUILD_DIR/worker/python, for a module's
    setUpModule; the module is skipped (unittest.SkipTest) without it."""
    global psd
    sys.path.insert(0, h.build_path("worker", "python"))
    try:
        import psd as mod
    except ImportError as e:
        raise unittest.SkipTest("the psd Python package is not built "
                                "(python3-dev missing?): %s" % e)
    psd = mod
    return mod


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


class AsyncCase(unittest.TestCase):
    """One async job with momentum in its spec (and a table "emb"), its two
    shards started once for the class; each case declares variables of its
    own."""

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
