"""Shared helpers for psd's integration tests: real psd / dworker processes on
127.0.0.1 with ephemeral ports, readiness read from their logs (never fixed
sleeps), and cleanup by PID of only the processes a test started."""
import ctypes
import json
import os
import pwd
import queue
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import hostsys

BUILD = None  # set by each test module's main from argv[1]
# Under make asan (PSD_SANITIZED=1), which looks for memory errors: the
# tests that train run shorter jobs there (CONTRIBUTING.md, "Sanitizers").
SANITIZED = os.environ.get("PSD_SANITIZED") == "1"


def build_path(*parts):
    return os.path.join(BUILD, *parts)


def sanitizer_cflags():
    """The -fsanitize flag the build was made with (meson's b_sanitize,
    from its introspection files), or []: a program a test builds against
    the sanitized libpsclient.a must link the sanitizers' runtime too."""
    with open(build_path("meson-info", "intro-buildoptions.json")) as f:
        opts = {o["name"]: o["value"] for o in json.load(f)}
    san = opts.get("b_sanitize", "none")
    return [] if san == "none" else ["-fsanitize=" + san]


def _ephemeral_low():
    """The first port of the kernel's ephemeral range (32768 unless set)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_ports = __import__("random").Random(os.getpid() ^ time.monotonic_ns())


def free_ports(n):
    """n distinct ports that nobody listens on just now (each bound and let
    go), drawn at random below the kernel's ephemeral range: tests run two
    at a time, and a port from that range could be taken meanwhile by any
    outgoing connection of the other test's, which the kernel numbers
    from it. Where that range leaves too little room below it, ports the
    kernel hands out, as before."""
    low = _ephemeral_low()
    socks, ports = [], []
    try:
        tries = 0
        while len(ports) < n:
            s = socket.socket()
            socks.append(s)
            tries += 1
            if low > 12000 and tries < 50 * n:
                p = _ports.randrange(10000, low)
                if p in ports:
                    continue
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    continue
            else:
                s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def free_port_run(n, host="127.0.0.1"):
    """A base port such that base .. base + n - 1 are free on host just
    now (bound and let go), or None after 50 tries."""
    for _ in range(50):
        base = free_ports(1)[0]
        if base + n > 65535:
            continue
        socks = []
        try:
            for p in range(base, base + n):
                s = socket.socket()
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                socks.append(s)
                s.bind((host, p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    return None


def blas_core():
    """The OPENBLAS_CORETYPE pslaunch gives a worker_command when none is
    set (common/base/cpu.c, from the CPU's flags): "SkylakeX", "Haswell" or
    None. A baseline run beside psd gets it too, so both use the same
    kernels."""
    flags = set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    if {"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= flags:
        return "SkylakeX"
    return "Haswell" if "avx2" in flags else None


def torch_env(build):
    """The environment of a Python worker on the build's psd package, one
    compute thread per process, this CPU's OpenBLAS kernels (the DLRM's test
    and bench)."""
    e = {"PYTHONPATH": os.path.join(build, "worker", "python"), "PSD_TORCH_THREADS": "1",
         "PSD_CTRGEN": os.path.join(build, "worker", "psd-ctrgen")}
    if blas_core() and not os.environ.get("OPENBLAS_CORETYPE"):
        e["OPENBLAS_CORETYPE"] = blas_core()
    for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        e[k] = "1"
    return e


def write_secret(directory, name, text):
    """Writes text to directory/name, readable by its owner only (a token
    or a key); returns the path."""
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o600)
    return path


def foreign_host():
    """A documentation-range IPv4 address (RFC 5737) that is not one of this
    host's (binding to it fails), for a task that runs "elsewhere". Test
    networks do use these ranges, so three are tried."""
    for host in ("203.0.113.7", "198.51.100.7", "192.0.2.77"):
        with socket.socket() as s:
            try:
                s.bind((host, 0))
            except OSError:
                return host
    raise unittest.SkipTest("every candidate address is local")


def write_spec(path, nps=2, nworker=2, job=None, extra=None, ps_host=None):
    """Writes a spec of nps shards and nworker workers on ports free just
    now, with job and the top-level keys of extra, to path; returns it as a
    dict. With ps_host the shards listen there (ports free on 127.0.0.1
    then, which is what an address of this host offers too)."""
    ports = free_ports(nps + nworker)
    spec = {
        "cluster": {
            "ps": ["%s:%d" % (ps_host or "127.0.0.1", p) for p in ports[:nps]],
            "worker": ["127.0.0.1:%d" % p for p in ports[nps:]],
        },
        "job": job or {},
    }
    if extra:
        spec.update(extra)
    with open(path, "w") as f:
        json.dump(spec, f, indent=2)
    return spec


def spec_in(d, job=None, nps=2, nworker=2, ps_host=None):
    """write_spec to d/spec.json; returns that path."""
    path = os.path.join(d, "spec.json")
    write_spec(path, nps=nps, nworker=nworker, job=job, ps_host=ps_host)
    return path


class Proc:
    """A child process whose merged output is collected line by line."""

    def __init__(self, argv, env=None):
        e = dict(os.environ)
        e.setdefault("GRPC_DNS_RESOLVER", "native")
        if env:
            e.update(env)
        self.argv = argv
        self.p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, env=e, text=True)
        self.lines = []
        self.q = queue.Queue()
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()

    def _read(self):
        for line in self.p.stdout:
            self.lines.append(line.rstrip("\n"))
            self.q.put(line.rstrip("\n"))
        self.q.put(None)

    def wait_for(self, needle, timeout=30, new=False):
        """Blocks until a line containing needle appears (with new=True, one
        printed after this call); returns it."""
        deadline = time.monotonic() + timeout
        if new:
            while not self.q.empty():
                if self.q.get() is None:
                    self.q.put(None)
                    break
        for line in ([] if new else list(self.lines)):
            if needle in line:
                return line
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError("timed out waiting for %r from %s; output:\n%s"
                                     % (needle, self.argv[0], self.output()))
            try:
                line = self.q.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                raise AssertionError("%s exited (%s) before printing %r; output:\n%s"
                                     % (self.argv[0], self.p.wait(), needle, self.output()))
            if needle in line:
                return line

    def output(self):
        return "\n".join(self.lines)

    def wait(self, timeout=60):
        rc = self.p.wait(timeout=timeout)
        self.t.join(timeout=5)
        self.p.stdout.close()
        return rc

    def stop(self, sig=signal.SIGTERM, timeout=20):
        if self.p.poll() is None:
            self.p.send_signal(sig)
            try:
                self.p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.t.join(timeout=5)
        self.p.stdout.close()
        return self.p.returncode


def until(what, cond, timeout=30, every=0.05, error=AssertionError):
    """Polls cond() (reading processes' output or state; a condition, never a
    fixed sleep) until it returns something true; returns that. Fails the
    test (error, AssertionError by default, naming what) after timeout
    seconds."""
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise error("%s: not within %d s" % (what, timeout))
        time.sleep(every)


def ctr_table_job(data_dir):
    """The job keys of a small CTR model (deploy/examples/ctr.json's, on
    50,000 examples generated into data_dir) whose embedding tables give a
    live reshard rows to move (docs/reshard.md "Live"): the live reshard
    tests under Slurm and Kubernetes train it instead of the MLP."""
    return {"model": "ctr", "data_dir": data_dir,
            "ctr": {"fields": 8, "pooling": "sum",
                    "generate": {"train": 50000, "test": 5000, "seed": 7, "zipf": 1.6}},
            "hidden": [32, 16], "batch_size": 256,
            "optimizer": {"type": "adam", "lr": 0.002},
            "tables": [{"name": "emb", "dim": 8, "init": "uniform", "init_scale": 0.05,
                        "optimizer": {"type": "adagrad", "lr": 0.2,
                                      "initial_accumulator": 0.1}},
                       {"name": "wide", "dim": 1, "init": "zeros",
                        "optimizer": {"type": "adagrad", "lr": 0.2,
                                      "initial_accumulator": 0.1}}]}


LIVE_MOVED = (r"reshard done in [0-9.]+ s: ps:0 says done: layout 1 of 3 shards from 2, "
              r"1365 bucket moves .*, [0-9.]+ [kMG]?B of rows")


def rows_moved_in(out):
    """The table rows a shard's log says it took by live moves."""
    return sum(int(n) for n in re.findall(r"moved buckets from ps:\d+: (\d+) rows", out))


def start_psd(spec_path, index, env=None):
    p = Proc([build_path("ps-server", "psd"), "--cluster", spec_path, "--task", "ps:%d" % index],
             env=env)
    p.wait_for("ready: listening on")
    return p


def run(argv, timeout=120, env=None):
    e = dict(os.environ)
    e.setdefault("GRPC_DNS_RESOLVER", "native")
    if env:
        e.update(env)
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=e)


def pstool(spec_path, *args, timeout=120):
    return run([build_path("tests", "pstool"), "--cluster", spec_path] + list(args), timeout=timeout)


def psctl(spec_path, *args, timeout=120):
    return run([build_path("ps-server", "psctl"), "--cluster", spec_path] + list(args),
               timeout=timeout)


PR_SET_CHILD_SUBREAPER = 36


def set_subreaper(on):
    """Makes this process (on=True) the reaper of its descendants that lose
    their parent, as init would be (Linux's PR_SET_CHILD_SUBREAPER), so that
    a test can wait for the tasks of a launcher it killed and read how they
    ended. Raises unittest.SkipTest where the kernel cannot."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1 if on else 0, 0, 0, 0) != 0:
        raise unittest.SkipTest("prctl(PR_SET_CHILD_SUBREAPER): %s"
                                % os.strerror(ctypes.get_errno()))


def wait_pid(pid, timeout):
    """Waits up to timeout seconds for pid, a child of this process (or an
    orphan it adopted as subreaper), to end; returns its waitpid status, or
    None when it still runs."""
    got = []
    t = threading.Thread(target=lambda: got.append(os.waitpid(pid, 0)[1]),
                         daemon=True)
    t.start()
    t.join(timeout)
    return got[0] if got else None


class TempDir:
    def __enter__(self):
        self.d = tempfile.TemporaryDirectory(prefix="psd-test-")
        return self.d.name

    def __exit__(self, *a):
        self.d.cleanup()


class ProcTest(unittest.TestCase):
    """A test case with a temporary directory (self.d) and a list of the
    processes it started (self.procs); tearDown kills what is left of them,
    a SIGSTOPped one included, then removes the directory."""

    def setUp(self):
        self.tmp = TempDir()
        self.d = self.tmp.__enter__()
        self.procs = []

    def stop_procs(self):
        for p in self.procs:
            if p.p.poll() is None:
                p.p.send_signal(signal.SIGCONT)
                p.stop(signal.SIGKILL)

    def tearDown(self):
        self.stop_procs()
        self.tmp.__exit__(None, None, None)


class ShardsTest(unittest.TestCase):
    """A test class with shards of its own, started once for the class: the
    NPS psd processes of a spec (cls.spec, addresses cls.addrs, processes
    cls.ps) whose job is cls.job(), which may name files under cls.tmp, or
    with SHARD that one shard alone (cls.ps is then its process); each
    shard started must exit 0 on SIGTERM at the end."""

    NPS = 2  # shards in the spec
    NWORKER = 1  # workers in the spec
    SHARD = None  # the one shard to start, or None for all NPS
    JOB = {"name": "t"}  # the spec's job, unless job() says otherwise

    @classmethod
    def job(cls):
        return dict(cls.JOB)

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="psd-test-")
        cls.spec = os.path.join(cls.tmp.name, "spec.json")
        spec = write_spec(cls.spec, nps=cls.NPS, nworker=cls.NWORKER, job=cls.job())
        cls.addrs = spec["cluster"]["ps"]
        if cls.SHARD is None:
            cls.ps = [start_psd(cls.spec, i) for i in range(cls.NPS)]
        else:
            cls.ps = start_psd(cls.spec, cls.SHARD)

    @classmethod
    def tearDownClass(cls):
        # cls.ps, as a test may have replaced it (a shard restarted)
        rcs = [p.stop(signal.SIGTERM) for p in (cls.ps if cls.SHARD is None else [cls.ps])]
        cls.tmp.cleanup()
        assert rcs == [0] * len(rcs), "psd did not exit 0 on SIGTERM: %s" % rcs

    def psctl(self, *args):
        """psctl's output on the class's spec; the call must exit 0."""
        r = psctl(self.spec, *args)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        return r.stdout


def nobody_argv(argv, umask=None):
    """argv run as user nobody, through setpriv: another local user in the
    tests of who may own a Unix socket, or a stand-in for the units' user
    psd. The caller must be root (see need_root); umask, when given, is set
    first (as a unit's UMask= is)."""
    pw = pwd.getpwnam("nobody")
    prefix = ["setpriv", "--reuid", str(pw.pw_uid), "--regid", str(pw.pw_gid),
              "--clear-groups"]
    if umask is not None:
        prefix += ["sh", "-c", 'umask %03o && exec "$0" "$@"' % umask]
    return prefix + list(argv)


def need_root(test):
    """Skips test unless it can act as another user (root, setpriv and a
    user nobody)."""
    if os.geteuid() != 0:
        test.skipTest("needs root to act as another user (user nobody)")
    if not shutil.which("setpriv"):
        test.skipTest("setpriv (util-linux) is not installed")
    try:
        pwd.getpwnam("nobody")
    except KeyError:
        test.skipTest("this system has no user nobody")
    # nobody runs the build's programs: every directory above them must let
    # others through (a clone under mktemp -d's 0700 directory does not).
    d = os.path.abspath(BUILD)
    while d != "/":
        if not os.stat(d).st_mode & 0o001:
            test.skipTest("user nobody cannot reach the build's programs: %s is not "
                          "searchable by others (clone the tree where it is)" % d)
        d = os.path.dirname(d)


def set_wmem_max(test, value, why):
    """Sets net.core.wmem_max to value for one test, under the host lock
    that every psd test shares (hostsys.py): restored by its cleanup, and
    no other test changes it meanwhile. A test that cannot (not root) is
    skipped, saying why it needed to."""
    hostsys.set_for(test, "net.core.wmem_max", value, why)


def need_socket_buffers(test):
    """Makes sure psd serves its Unix socket: the kernel must grant 1 MiB
    socket buffers (net.core.wmem_max; common/rpc/endpoint.h). Holds the
    host lock for the test so that no other test lowers the limit under
    it. Stock Debian grants 208 KiB; as root the limit is raised to 4 MiB
    for the test (what deploy/systemd/psd.sysctl sets) and restored by its
    cleanup; else the test is skipped."""
    hostsys.hold_for(test)
    if int(hostsys.read("net.core.wmem_max")) >= (1 << 20):
        return
    set_wmem_max(test, 4 << 20, "psd serves no Unix socket here")


# Exit status of a test module whose every case was skipped: meson reports
# the suite as SKIP, and tests/summary.py counts it apart from the passes.
EXIT_SKIP = 77


class _TimedResult(unittest.TextTestResult):
    """unittest's result, with each case's wall time (times: id -> s)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.times = {}
        self._t0 = None

    def startTest(self, test):
        self._t0 = time.monotonic()
        super().startTest(test)

    def stopTest(self, test):
        super().stopTest(test)
        self.times[test.id()] = time.monotonic() - self._t0


def main(argv=None):
    """Runs a test module: `test_x.py BUILD_DIR [unittest args...]`.
    Exits 1 when a case failed, 77 (SKIP) when every case that ran was
    skipped, else 0. Skipped cases of a module that also passed cases are
    listed on stdout as 'harness: skipped N of M cases' lines, which
    tests/summary.py counts separately from the passes."""
    global BUILD
    argv = list(sys.argv if argv is None else argv)
    if len(argv) < 2 or argv[1].startswith("-"):
        sys.stderr.write("usage: %s BUILD_DIR [unittest args...]\n" % argv[0])
        sys.exit(2)
    BUILD = os.path.abspath(argv[1])
    prog = unittest.main(argv=[argv[0]] + argv[2:], verbosity=2, exit=False,
                         testRunner=unittest.TextTestRunner(resultclass=_TimedResult,
                                                            verbosity=2))
    res = prog.result
    # Where a suite's time goes: its slowest cases (make test's speed).
    for case, s in sorted(res.times.items(), key=lambda kv: -kv[1])[:5]:
        print("harness: took %.1f s: %s" % (s, case))
    # tests/summary.py adds these up: the cases a run ran, whatever the
    # suites were split into.
    print("harness: ran %d cases" % res.testsRun)
    if res.skipped:
        print("harness: skipped %d of %d cases" % (len(res.skipped), res.testsRun))
        for case, why in res.skipped:
            print("harness: skipped %s: %s" % (case.id(), why))
    sys.stdout.flush()
    if not res.wasSuccessful():
        sys.exit(1)
    if res.testsRun == 0 or len(res.skipped) == res.testsRun:
        sys.exit(EXIT_SKIP)
    sys.exit(0)


def f32(x):
    """x rounded to the nearest float32 (the shards' arithmetic)."""
    return struct.unpack("f", struct.pack("f", x))[0]


def job_line(out):
    """The key=value pairs of pslaunch's 'job:' line in out (the job's rate
    as ps:0 measured it), or None when there is none."""
    for line in reversed(out.splitlines()):
        if line.startswith("job: "):
            return dict(p.split("=", 1) for p in line[5:].split() if "=" in p)
    return None


def assert_job_accounting(test, out, epochs, workers, train_size=60000):
    """Checks the job's throughput accounting: every worker reported, and
    their examples add up to epochs x the training set (each worker trains
    on its share). Returns the job line's pairs."""
    job = job_line(out)
    test.assertIsNotNone(job, "pslaunch printed no job: line\n" + out[-3000:])
    test.assertEqual(int(job["workers"]), workers, job)
    test.assertEqual(int(job["reported"]), workers, job)
    test.assertEqual(int(job["examples"]), epochs * train_size, job)
    test.assertGreater(float(job["wall_s"]), 0, job)
    # wall_s is printed to 2 decimals: a short job's rate is checked
    # against the span that rounds to it (0.16 s is 0.155..0.165: +-3%).
    ex, wall, rate = int(job["examples"]), float(job["wall_s"]), float(job["examples_per_s"])
    lo, hi = ex / (wall + 0.005), ex / max(wall - 0.005, 1e-9)
    test.assertTrue(0.99 * lo - 1 <= rate <= 1.01 * hi + 1,
                    "examples_per_s %s is not examples / wall_s (%d / %s): %s"
                    % (rate, ex, job["wall_s"], job))
    return job
