"""Shared by the fault tests (test_faults.py runs them all): the helpers that
start, stop, wait on and read psd, dworker and pstool processes (the spec
is harness.spec_in's), and the Faults base class that kills what a test left running before
its own cleanups (namespaces, mounts)."""
import functools
import json
import os
import re
import threading
import time

import harness as h
from netns import netns_argv

DATA = "/usr/share/datasets/fashion-mnist"
SOAK = os.environ.get("PSD_SOAK") == "1"
# Epochs of the accuracy and sync jobs: one under make asan (PSD_SANITIZED=1),
# which looks for memory errors through the same faults at a third of the
# time (each process runs 2-5 times slower there).
EPOCHS = 1 if h.SANITIZED else 2

# The spec the accuracy comparisons run: async, plain sgd whose learning
# rate decays to 0 along a cosine over the job's 2 x EPOCHS x 469 pushes per
# variable, so that where the run ends varies little with the order the two
# workers' pushes arrive in (0.8427 to 0.8441 in 5 runs, faults among them;
# 3 epochs gave 0.8496 to 0.8510 in 6 runs on a loaded machine, at 1.5
# times the time; a constant lr 0.01 gave 0.8212 to 0.8336), short deadlines so a stopped
# shard is noticed quickly, checkpoints often (every 100 push messages a
# shard applies).
ACC_JOB = {"name": "faults", "epochs": EPOCHS, "batch_size": 64, "log_every": 50,
           "optimizer": {"type": "sgd", "lr": 0.05,
                         "schedule": {"type": "cosine", "total_steps": 2 * EPOCHS * 469}},
           "heartbeat_ms": 100, "dead_after_ms": 1500, "rpc_timeout_ms": 2000, "retry_s": 60,
           "checkpoint": {"dir": "ck", "every_steps": 100}}


# The table the load tests load beside their dense variables (pstool load,
# tests/tools/pstool_rowload.c): sgd from zeros, so every update is exact;
# a row is stored on its second push (admission by count) and evicted at a
# checkpoint while pushed fewer than 3 times.
LOAD_TABLE = {"name": "rows", "dim": 8, "init": "zeros",
              "optimizer": {"type": "sgd", "lr": 0.5},
              "admission": {"type": "count", "count": 2},
              "eviction": {"min_count": 3}}


# psctl waits 60 s at most here unless told otherwise.
psctl = functools.partial(h.psctl, timeout=60)


def status(spec):
    r = psctl(spec, "--json", "status")
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)["shards"]


def table_totals(spec, name="rows"):
    """A table's Status counters (rows, admitted, not_admitted, evicted,
    pending), summed over the shards."""
    keys = ("rows", "admitted", "not_admitted", "evicted", "pending")
    out = dict.fromkeys(keys, 0)
    for shard in status(spec):
        for t in shard.get("tables", []):
            if t["name"] == name:
                for k in keys:
                    out[k] += t[k]
    return out


class Checkpointer:
    """Asks the shards for a checkpoint (psctl checkpoint --wait) again and
    again, every `every` seconds, from a thread of its own until stop():
    checkpoints taken under a load, each running the tables' eviction.
    Counts the answers that every shard wrote and those that failed (a shard
    restarting)."""

    def __init__(self, spec, every=1.0):
        self.spec, self.every = spec, every
        self.written, self.failed, self.errors = 0, 0, []
        self.done = threading.Event()
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self):
        while not self.done.wait(self.every):
            r = psctl(self.spec, "--json", "checkpoint", "--wait", timeout=120)
            ok = r.returncode == 0 and all(
                s["written"] for s in json.loads(r.stdout)["shards"])
            if ok:
                self.written += 1
            else:
                self.failed += 1
                self.errors.append(r.stdout + r.stderr)

    def stop(self):
        self.done.set()
        self.t.join()
        return self


def result(p):
    """The key=value pairs of a dworker's final: or done: line."""
    for line in reversed(p.lines):
        if line.startswith(("final:", "done:")):
            return dict(re.findall(r"(\w+)=([-\w.]+)", line))
    raise AssertionError("no result line:\n" + p.output()[-3000:])


def fields(line):
    return dict(re.findall(r"(\w+)=([-\w.]+)", line))


def wait_match(p, pattern, timeout=30, count=1):
    """Waits until `count` lines of p's output match the regex; returns the
    last of them."""
    deadline = time.monotonic() + timeout
    while True:
        hits = [l for l in list(p.lines) if re.search(pattern, l)]
        if len(hits) >= count:
            return hits[count - 1]
        if time.monotonic() > deadline or (p.p.poll() is not None and p.q.empty()):
            raise AssertionError("no %d lines matching %r from %s; output:\n%s"
                                 % (count, pattern, p.argv[0], p.output()[-3000:]))
        time.sleep(0.05)


def wait_any(ps, pattern, timeout=60):
    """Waits until one of the processes prints a line matching the regex;
    returns that process."""
    deadline = time.monotonic() + timeout
    while True:
        for p in ps:
            if any(re.search(pattern, l) for l in list(p.lines)):
                return p
        if time.monotonic() > deadline or all(p.p.poll() is not None for p in ps):
            raise AssertionError("no line matching %r from any of %d processes; "
                                 "outputs:\n%s" % (pattern, len(ps), "\n----\n".join(
                                     p.output()[-2000:] for p in ps)))
        time.sleep(0.05)


class Faults(h.ProcTest):
    """Starts processes through self.proc/self.psd and kills what is left of
    them at the end (h.ProcTest), a stopped one included, before its own
    cleanups (namespaces, mounts)."""

    def setUp(self):
        super().setUp()
        self.cleanups = []

    def tearDown(self):
        self.stop_procs()
        for fn in reversed(self.cleanups):
            fn()
        super().tearDown()

    def proc(self, argv, **kw):
        p = h.Proc(argv, **kw)
        self.procs.append(p)
        return p

    def psd(self, spec, i, env=None, netns=None):
        p = self.proc(netns_argv(netns, [h.build_path("ps-server", "psd"), "--cluster",
                                         spec, "--task", "ps:%d" % i]), env=env)
        p.wait_for("ready: listening on")
        return p

    def worker(self, spec, i, *extra, netns=None):
        argv = [h.build_path("worker", "dworker"), "--cluster", spec, "--task",
                "worker:%d" % i] + list(extra)
        return self.proc(netns_argv(netns, argv))

    def finish(self, ws, timeout=300):
        for w in ws:
            self.assertEqual(w.wait(timeout=timeout), 0, w.output()[-3000:])

    def stop_all(self, ps):
        """SIGTERM every shard; each must exit 0 (its final checkpoint too)."""
        for p in ps:
            self.assertEqual(p.stop(), 0, p.output()[-3000:])
