"""Network namespaces and veth pairs for the integration tests (root and
iproute2's `ip` only): names unique to the test's process, so that parallel
runs never clash, and each thing created deleted by name by a cleanup that
its creation registers with the test case, so that it goes whatever happens
(a failed setUp, a failed assertion, a SIGTERM from meson's timeout)."""
import os
import random
import shutil
import signal
import subprocess
import sys
import time


def ip(*args, check=True):
    return subprocess.run(["ip"] + list(args), capture_output=True, text=True, check=check)


def _exit_on_sigterm():
    """SIGTERM (meson's timeout) raises SystemExit in the main thread, which
    unittest records as the running test's error before it runs the test's
    cleanups: the namespaces go even then."""
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, lambda sig, frame: sys.exit(128 + sig))


class Net:
    """What one test creates: namespaces named prefix+tag+suffix, and veth
    pairs. Skips the test where it cannot (not root, no `ip`, `ip netns
    add` refused)."""

    def __init__(self, test, prefix):
        if os.geteuid() != 0:
            test.skipTest("needs root for network namespaces")
        if not shutil.which("ip"):
            test.skipTest("the ip command (iproute2) is not installed")
        _exit_on_sigterm()
        self.test = test
        self.prefix = prefix
        # Short: a veth end made in this namespace carries it in its name,
        # and an interface's name has at most 15 characters.
        self.tag = "%d%02d" % (os.getpid() % 10000, random.randrange(100))

    def netns(self, suffix=""):
        """A new namespace with its loopback up; returns its name."""
        name = self.prefix + self.tag + suffix
        r = ip("netns", "add", name, check=False)
        if r.returncode != 0:
            self.test.skipTest("ip netns add is not permitted here: " + r.stderr.strip())
        # Deleting a namespace deletes the veth ends in it, and so the pairs.
        self.test.addCleanup(ip, "netns", "del", name, check=False)
        ip("-n", name, "link", "set", "lo", "up")
        return name

    def veth(self, a, b, a_ns=None, b_ns=None, a_addr=None, b_addr=None):
        """A veth pair: end a in namespace a_ns, end b in b_ns (None: this
        test's own namespace, where the name must be unique: take self.tag
        into it), each given its address (CIDR) when one is named, and up."""
        ends = ((a, a_ns, a_addr), (b, b_ns, b_addr))
        for name, ns, _ in ends:
            if ns is None:
                self.test.addCleanup(ip, "link", "del", name, check=False)
        # Each end is made in its namespace, never in this one under a name
        # another run could hold.
        ip("link", "add", a, *(["netns", a_ns] if a_ns else []), "type", "veth",
           "peer", "name", b, *(["netns", b_ns] if b_ns else []))
        for name, ns, addr in ends:
            where = ["-n", ns] if ns else []
            if addr:
                ip(*where, "addr", "add", addr, "dev", name)
            ip(*where, "link", "set", name, "up")


def netns_argv(ns, argv):
    """argv run in network namespace ns (None: here)."""
    return (["ip", "netns", "exec", ns] if ns else []) + list(argv)


# ---- Outside a test case (tests/bench/bench_multihost.py) ----

def why_no_netns():
    """Why network namespaces cannot be made here (not root, no `ip`, `ip
    netns add` refused), or None when they can: the try's namespace is
    deleted at once."""
    if os.geteuid() != 0:
        return "needs root for network namespaces"
    if not shutil.which("ip"):
        return "the ip command (iproute2) is not installed"
    if not shutil.which("tc"):
        return "the tc command (iproute2) is not installed"
    name = "psdtry%d%02d" % (os.getpid() % 10000, random.randrange(100))
    r = ip("netns", "add", name, check=False)
    if r.returncode != 0:
        return "ip netns add is not permitted here: " + r.stderr.strip()
    ip("netns", "del", name, check=False)
    return None


def netns_names():
    """The names `ip netns list` shows (each line's first word)."""
    return {l.split()[0] for l in ip("netns", "list").stdout.splitlines() if l.strip()}


def netns_delete(name, timeout=10):
    """Ends the processes still in namespace name (SIGKILL, by the PIDs `ip
    netns pids` names: a caller's own, started in its own namespace), then
    deletes it by name; with the namespace go the veth ends in it (so their
    pairs) and their qdiscs. Returns what is still there, if anything."""
    if name not in netns_names():
        return None
    deadline = time.monotonic() + timeout
    while True:
        r = ip("netns", "pids", name, check=False)
        pids = [int(p) for p in r.stdout.split()]
        if not pids or time.monotonic() > deadline:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    r = ip("netns", "del", name, check=False)
    if name in netns_names():
        return "namespace %s is still there (ip netns del: %s)" % (name, r.stderr.strip())
    if pids:
        return "namespace %s still held processes %s" % (name, pids)
    return None
