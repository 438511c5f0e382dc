#!/usr/bin/python3
"""The host lock (hostsys.py) against a settings file of the test's own
(PSD_TEST_PROC_SYS), never the host's: two test processes that change
net.core.wmem_max at once, as two suites of concurrent runs do, leave it as
they found it.

- interleaved: run A asks for 1 MiB buffers (need_socket_buffers, which
  raises the limit to 4 MiB where lower); while A holds them, run B lowers
  the limit to 212992 (test_local's small-buffers case); A ends, then B.
  Without the lock B finds A's 4 MiB, lowers it, and "restores" 4 MiB after
  A restored 212992: a stock host is left at 4 MiB (the other order leaves a
  4 MiB host at 212992). With it B waits for A, each case runs with the
  limit it needs, and the file ends as it began, in both orders from both
  values.
- killed: A raises the limit and is killed (-9) before its cleanup; the next
  holder writes the value A found back before anything else.
- nested: one case that both needs the buffers and lowers the limit ends
  with the value found before either.

Usage: test_host.py BUILD_DIR [unittest args...]. Waits on the children's
answers, never a fixed sleep.
"""
import os
import subprocess
import sys
import tempfile
import unittest

import harness as h

HERE = os.path.dirname(os.path.abspath(__file__))
NAME = "net.core.wmem_max"

# A test process: takes commands on stdin, answers each with "ok" (or the
# error) once done.
CHILD = r"""
import sys
import hostsys
NAME = "net.core.wmem_max"
for line in sys.stdin:
    cmd = line.split()
    try:
        if cmd[0] == "lower":      # test_local's small-buffers case
            hostsys.hold(); hostsys.change(NAME, 212992)
        elif cmd[0] == "buffers":  # harness.need_socket_buffers
            hostsys.hold()
            if int(hostsys.read(NAME)) < (1 << 20):
                hostsys.change(NAME, 4 << 20)
        elif cmd[0] == "raise":
            hostsys.hold(); hostsys.change(NAME, 4 << 20)
        elif cmd[0] == "end":      # the case's cleanup
            hostsys.release()
        print("ok", flush=True)
    except Exception as e:
        print("error %r" % e, flush=True)
"""


class Child:
    """A test process of a run of its own."""

    def __init__(self, env):
        self.p = subprocess.Popen([sys.executable, "-c", CHILD], cwd=HERE, env=env,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)

    def send(self, cmd):
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()

    def answer(self):
        return self.p.stdout.readline().strip()

    def do(self, cmd):
        self.send(cmd)
        return self.answer()

    def close(self):
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait()
        self.p.stdin.close()
        self.p.stdout.close()


class HostLockTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="psd-test-")
        self.addCleanup(self.tmp.cleanup)
        d = os.path.join(self.tmp.name, "sys", "net", "core")
        os.makedirs(d)
        self.file = os.path.join(d, "wmem_max")
        self.env = dict(os.environ, PSD_TEST_PROC_SYS=os.path.join(self.tmp.name, "sys"),
                        PSD_TEST_HOST_LOCK=os.path.join(self.tmp.name, "lock"))
        self.children = []

    def tearDown(self):
        for c in self.children:
            c.close()

    def child(self):
        c = Child(self.env)
        self.children.append(c)
        return c

    def value(self):
        with open(self.file) as f:
            return int(f.read())

    def found(self, v):
        with open(self.file, "w") as f:
            f.write("%d\n" % v)

    def wants(self, cmd):
        """Asserts the limit is what a case that ran cmd needs."""
        if cmd == "lower":
            self.assertEqual(self.value(), 212992, "the small-buffers case's limit")
        else:
            self.assertGreaterEqual(self.value(), 1 << 20, "1 MiB buffers")

    def interleaved(self, start, first, then):
        """Run A's case does first; while it holds, run B's case asks for
        then; A ends, B ends."""
        self.found(start)
        a, b = self.child(), self.child()
        self.assertEqual(a.do(first), "ok")
        self.wants(first)
        # B waits for the lock (and says so), or, without it, is done at once.
        b.send(then)
        said = b.answer()
        self.assertIn(said, ("ok", "hostsys: waiting for %s: another test holds it"
                             % self.env["PSD_TEST_HOST_LOCK"]))
        self.wants(first)
        self.assertEqual(a.do("end"), "ok")
        if said != "ok":
            self.assertEqual(b.answer(), "ok")
        self.wants(then)
        self.assertEqual(b.do("end"), "ok")
        self.assertEqual(self.value(), start, "two runs at once left the limit changed")

    def test_small_buffers_then_socket_from_4mib(self):
        self.interleaved(4 << 20, "lower", "buffers")

    def test_socket_then_small_buffers_from_stock(self):
        """The order that left hosts at 4 MiB."""
        self.interleaved(212992, "buffers", "lower")

    def test_both_orders_from_each(self):
        for start in (212992, 4 << 20):
            for first, then in (("lower", "buffers"), ("buffers", "lower")):
                with self.subTest(start=start, first=first):
                    self.interleaved(start, first, then)

    def test_killed_holder_is_undone(self):
        self.found(212992)
        a = self.child()
        self.assertEqual(a.do("raise"), "ok")
        self.assertEqual(self.value(), 4 << 20)
        a.p.kill()
        a.p.wait()
        b = self.child()
        self.assertEqual(b.do("buffers"), "ok")  # restores, then raises again
        self.assertEqual(b.do("end"), "ok")
        self.assertEqual(self.value(), 212992)
        with open(self.env["PSD_TEST_HOST_LOCK"]) as f:
            self.assertEqual(f.read(), "", "the lock file still holds a change")

    def test_nested_in_one_case(self):
        """A case that needs the buffers, lowers the limit and raises it
        again ends with the value found before the first."""
        self.found(212992)
        c = self.child()
        for cmd in ("buffers", "lower", "raise"):
            self.assertEqual(c.do(cmd), "ok")
        self.assertEqual(self.value(), 4 << 20)
        self.assertEqual(c.do("end"), "ok")
        self.assertEqual(c.do("end"), "ok")
        self.assertEqual(self.value(), 4 << 20, "still held")
        self.assertEqual(c.do("end"), "ok")
        self.assertEqual(self.value(), 212992)


if __name__ == "__main__":
    h.main()
