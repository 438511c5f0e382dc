"""Host-wide settings that psd's tests change (net.core.wmem_max, which
decides whether psd serves its Unix socket), changed under one lock shared
by every psd test on this host, so that the host is left as it was found
whatever runs at once: two suites of one meson run, the runs of two
checkouts, make test beside make asan.

The protocol: a test that depends on a setting takes the host lock (an
exclusive flock on LOCK_PATH) and holds it until its cleanup, so that no
other test changes the setting under it. Before it changes a setting it
writes the value it found into the lock file; when it lets the lock go it
writes every value it found back and empties the file. A lock file found
holding values was left by a test killed before its cleanup: whoever takes
the lock next writes those values back first. meson's first and last tests
(host_check.py) read the settings under the same lock, so they see the
host as no test has it changed.

PSD_TEST_PROC_SYS and PSD_TEST_HOST_LOCK point the module elsewhere than
/proc/sys and the host's lock file (test_host.py plays two runs against a
file of its own that way)."""
import fcntl
import json
import os
import sys
import tempfile
import time

PROC_SYS = os.environ.get("PSD_TEST_PROC_SYS", "/proc/sys")
LOCK_PATH = os.environ.get("PSD_TEST_HOST_LOCK") or os.path.join(
    "/run/lock" if os.path.isdir("/run/lock") else tempfile.gettempdir(),
    "psd-tests-host.lock")
# The settings a test may change, as sysctl names them; host_check.py
# compares them before and after a run.
SETTINGS = ("net.core.wmem_max", "net.core.rmem_max")
# How long a test waits for another to let the lock go.
LOCK_WAIT_S = 600


class _Hold:
    """This process's hold of the host lock."""

    def __init__(self, fd):
        self.fd = fd  # the open lock file, flocked
        self.depth = 1  # holders in this process (a test and its helpers)
        self.found = {}  # setting -> the value found before the first change


_hold = None


def path(name):
    return os.path.join(PROC_SYS, *name.split("."))


def read(name):
    """The setting's value as the kernel prints it, or None where this
    kernel has no such setting."""
    try:
        with open(path(name)) as f:
            return f.read().strip()
    except FileNotFoundError:
        return None


def _write(name, value):
    with open(path(name), "w") as f:
        f.write(str(value))


def _save(fd, found):
    """Writes what the holder found into the lock file (durably: it is what
    the next holder restores should this process be killed)."""
    os.lseek(fd, 0, os.SEEK_SET)
    os.ftruncate(fd, 0)
    if found:
        os.write(fd, json.dumps(found).encode())
    os.fsync(fd)


def _restore_left(fd):
    """Writes back what a holder killed before its cleanup found; returns
    the settings restored."""
    os.lseek(fd, 0, os.SEEK_SET)
    text = os.read(fd, 1 << 16).decode().strip()
    if not text:
        return {}
    left = json.loads(text)
    for name, value in left.items():
        _write(name, value)
    _save(fd, {})
    return left


def hold():
    """Takes the host lock, waiting up to LOCK_WAIT_S for another test to
    let it go; re-entrant within this process. A killed holder's changes
    are undone first: returns the settings so restored ({name: value}).
    Raises RuntimeError when the wait runs out."""
    global _hold
    if _hold:
        _hold.depth += 1
        return {}
    try:
        fd = os.open(LOCK_PATH, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except PermissionError:  # another user's lock file: wait, change nothing
        fd = os.open(LOCK_PATH, os.O_RDONLY | os.O_CLOEXEC)
    deadline, said = time.monotonic() + LOCK_WAIT_S, False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if not said:
                sys.stderr.write("hostsys: waiting for %s: another test holds "
                                 "it\n" % LOCK_PATH)
                sys.stderr.flush()
                said = True
            if time.monotonic() > deadline:
                os.close(fd)
                raise RuntimeError("another test has held %s for %d s"
                                   % (LOCK_PATH, LOCK_WAIT_S))
            time.sleep(0.05)
    left = {}
    try:
        left = _restore_left(fd)
    except OSError:
        pass  # not root: nothing this process could have changed either
    _hold = _Hold(fd)
    return left


def release():
    """Lets this process's hold go; the last release writes back every
    setting changed under it, in any order of the changes, and empties the
    lock file."""
    global _hold
    _hold.depth -= 1
    if _hold.depth:
        return
    h, _hold = _hold, None
    try:
        for name, value in h.found.items():
            _write(name, value)
        if h.found:
            _save(h.fd, {})
    finally:
        os.close(h.fd)  # the flock goes with it


def change(name, value):
    """Sets a setting under this process's hold, recording the value found
    first; raises OSError when it cannot (not root)."""
    old = read(name)
    if old == str(value):
        return
    first = name not in _hold.found
    try:
        if first:
            _hold.found[name] = old
            _save(_hold.fd, _hold.found)
        _write(name, value)
    except OSError:
        if first:
            del _hold.found[name]
            try:
                _save(_hold.fd, _hold.found)
            except OSError:
                pass  # a lock file this user may not write: nothing saved
        raise


def hold_for(test):
    """Holds the host lock for the rest of a unittest case (its cleanup
    lets go, restoring what the case changed)."""
    hold()
    test.addCleanup(release)


def set_for(test, name, value, why):
    """Sets a setting for the rest of a unittest case, holding the lock;
    a case that cannot (not root) is skipped, saying why it needed to."""
    hold_for(test)
    try:
        change(name, value)
    except OSError as e:
        test.skipTest("%s is %s and cannot be set to %s (%s): %s"
                      % (name, read(name), value, e, why))
