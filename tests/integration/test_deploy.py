#!/usr/bin/python3
"""Integration test of what deploy/ ships: `meson install`, the systemd units
and the sd_notify protocol of psd and dworker.

- install: `meson install --destdir TMP` puts the binaries, units, sysusers
  file, man pages and example specs where the build's options say; the
  installed binaries run and pslaunch finds the installed psd; every option
  of every program's --help appears in its man page.
- units: `systemd-analyze verify` passes on every unit with no message at
  all (copies of the installed units whose ExecStart points into TMP, since
  verify needs the binaries to exist; man pages looked up in TMP), the
  offline security review rates each service below 2.0, and
  systemd-sysusers accepts the sysusers file (dry run, in an empty root).
- socket: the units' settings give a working same-host socket. Both units
  name the same RuntimeDirectory= (mode 0700, preserved) and User=; a psd
  and a dworker run as that user (nobody stands in for psd; root only) with
  the RUNTIME_DIRECTORY= and UMask= systemd would give them, and the worker
  trains over the shard's socket in that directory, which psd removes when
  it stops.
- notify: a real psd on an ephemeral loopback port with NOTIFY_SOCKET set to
  a datagram socket this test listens on (and WATCHDOG_USEC=200000) sends
  READY=1 (when its port already accepts connections), then STATUS= with
  shard, mode and step, then WATCHDOG=1; a real dworker sends READY=1 after
  it has joined, STATUS= with its epoch and step, WATCHDOG=1 and STOPPING=1,
  and exits 0; psd's STATUS= then counts the worker's steps; SIGTERM makes
  psd send STOPPING=1 and exit 0.

Usage: test_deploy.py BUILD_DIR [unittest args...]. Every wait has a
deadline and waits for a message or a line, never a fixed sleep.
"""

import glob
import json
import os
import pwd
import queue
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import unittest

import harness as h

TIMEOUT = 30  # seconds for any one wait


def have_systemd_notify():
    """True when psd and dworker were built with libsystemd."""
    with open(h.build_path("psd_config.h")) as f:
        return re.search(r"#define PSD_HAVE_SYSTEMD 1\b", f.read()) is not None


def build_options():
    out = subprocess.run(["meson", "introspect", "--buildoptions", h.BUILD],
                         capture_output=True, text=True, check=True).stdout
    return {o["name"]: o["value"] for o in json.loads(out)}


class Installed:
    """One `meson install --destdir` of the build, shared by the tests."""

    dest = None
    tmp = None
    paths = None

    @classmethod
    def get(cls):
        if cls.dest is None:
            cls.tmp = tempfile.TemporaryDirectory(prefix="psd-test-install-")
            r = subprocess.run(["meson", "install", "-C", h.BUILD, "--no-rebuild",
                                "--quiet", "--destdir", cls.tmp.name],
                               capture_output=True, text=True, timeout=120)
            if r.returncode != 0:
                raise AssertionError("meson install failed (%d):\n%s%s"
                                     % (r.returncode, r.stdout, r.stderr))
            cls.dest = cls.tmp.name
            o = build_options()
            prefix = o["prefix"]

            def under(d):
                return os.path.join(prefix, d)
            cls.paths = {
                "bindir": under(o["bindir"]),
                "sbindir": under(o["sbindir"]),
                "mandir": under(o["mandir"]),
                "examples": os.path.join(under(o["datadir"]), "psd", "examples"),
                "unitdir": o["systemdunitdir"] or os.path.join(prefix, "lib", "systemd",
                                                               "system"),
                "sysusersdir": o["sysusersdir"] or os.path.join(prefix, "lib", "sysusers.d"),
            }
        return cls

    @classmethod
    def path(cls, key, *rest):
        """The installed path (as on the target system) of key/rest."""
        return os.path.join(cls.paths[key], *rest)

    @classmethod
    def staged(cls, key, *rest):
        """Where that path lies in the destdir."""
        return cls.dest + cls.path(key, *rest)


def tearDownModule():
    if Installed.tmp is not None:
        Installed.tmp.cleanup()


class InstallTest(unittest.TestCase):
    def setUp(self):
        self.inst = Installed.get()

    def test_expected_files(self):
        i = self.inst
        want = [
            ("bindir", "dworker"), ("bindir", "pslaunch"), ("bindir", "psctl"),
            ("sbindir", "psd"),
            ("unitdir", "psd@.service"), ("unitdir", "dworker@.service"),
            ("unitdir", "psd-serve@.service"),
            ("unitdir", "psd.target"),
            ("sysusersdir", "psd.conf"),
            ("mandir", "man8", "psd.8"), ("mandir", "man1", "dworker.1"),
            ("mandir", "man1", "psctl.1"), ("mandir", "man1", "pslaunch.1"),
            ("mandir", "man5", "psd-spec.5"),
            ("examples", "local.json"), ("examples", "local-sync.json"),
            ("examples", "local-ssp.json"), ("examples", "two-hosts.json"),
            ("examples", "local-adam.json"),
            ("examples", "local-cnn.json"),
        ]
        for key, *rest in want:
            p = i.staged(key, *rest)
            self.assertTrue(os.path.isfile(p), "not installed: %s" % i.path(key, *rest))
            if key in ("bindir", "sbindir"):
                self.assertTrue(os.access(p, os.X_OK), "not executable: %s" % p)
        for key, *rest in want:
            if key == "examples":
                with open(i.staged(key, *rest)) as f:
                    spec = json.load(f)
                self.assertIn("ps", spec["cluster"])
                self.assertIn("worker", spec["cluster"])
        with open(i.staged("examples", "two-hosts.json")) as f:
            spec = json.load(f)
        hosts = {a.rsplit(":", 1)[0] for a in spec["cluster"]["ps"] + spec["cluster"]["worker"]}
        self.assertEqual(len(hosts), 2, "two-hosts.json names %s" % sorted(hosts))

    def test_units_point_at_installed_binaries(self):
        i = self.inst
        with open(i.staged("unitdir", "psd@.service")) as f:
            psd = f.read()
        with open(i.staged("unitdir", "dworker@.service")) as f:
            dw = f.read()
        with open(i.staged("unitdir", "psd-serve@.service")) as f:
            serve = f.read()
        self.assertIn("ExecStart=%s --cluster /etc/psd/cluster.json --task serve:%%i\n"
                      % i.path("sbindir", "psd"), serve)
        self.assertIn("ExecStart=%s --cluster /etc/psd/cluster.json --task ps:%%i\n"
                      % i.path("sbindir", "psd"), psd)
        self.assertIn("ExecStart=%s --cluster /etc/psd/cluster.json --task worker:%%i\n"
                      % i.path("bindir", "dworker"), dw)
        notify = have_systemd_notify()
        for text in (psd, dw, serve):
            for line in ("Type=notify" if notify else "Type=exec", "Restart=on-failure",
                         "User=psd", "ConfigurationDirectory=psd", "NoNewPrivileges=yes",
                         "ProtectSystem=strict", "WantedBy=psd.target", "PartOf=psd.target"):
                self.assertRegex(text, r"(?m)^%s$" % re.escape(line))
            # The watchdog only where the daemons can ping it.
            self.assertRegex(text, r"(?m)^%sWatchdogSec=\S+$" % ("" if notify else "#"))
            self.assertNotRegex(text, r"@[A-Z_]+@")  # every placeholder filled
        self.assertRegex(psd, r"(?m)^StateDirectory=psd/ps-%i$")

    def test_man_pages_have_no_placeholders(self):
        for page in glob.glob(self.inst.staged("mandir", "man*", "*")):
            with open(page) as f:
                text = f.read()
            self.assertNotRegex(text, r"@[A-Z_]+@", page)
            self.assertIn(".TH ", text)
        with open(self.inst.staged("mandir", "man8", "psd.8")) as f:
            self.assertIn(self.inst.path("examples", "local.json"), f.read())

    def test_man_pages_render_cleanly(self):
        if not shutil.which("groff"):
            self.skipTest("groff is not installed")
        for page in glob.glob(self.inst.staged("mandir", "man*", "*")):
            r = subprocess.run(["groff", "-man", "-ww", "-z", page], capture_output=True,
                               text=True, timeout=30)
            self.assertEqual((r.returncode, r.stderr), (0, ""), page)

    def test_man_pages_document_every_option(self):
        """Each long option of a program's --help (and psctl's commands) is in
        its man page, spelled as roff spells it (\\-\\-name)."""
        i = self.inst
        progs = [("psd", i.staged("sbindir", "psd"), ("man8", "psd.8")),
                 ("dworker", i.staged("bindir", "dworker"), ("man1", "dworker.1")),
                 ("pslaunch", i.staged("bindir", "pslaunch"), ("man1", "pslaunch.1")),
                 ("psctl", i.staged("bindir", "psctl"), ("man1", "psctl.1"))]
        for name, exe, page in progs:
            r = h.run([exe, "--help"], timeout=30)
            self.assertEqual(r.returncode, 0, "%s --help: %s" % (name, r.stderr))
            opts = set(re.findall(r"(?<![\w-])--([a-z][a-z-]*)", r.stdout))
            self.assertIn("cluster", opts, name)
            with open(i.staged("mandir", *page)) as f:
                man = f.read().replace("\\-", "-")
            for o in sorted(opts):
                self.assertIn("--" + o, man, "%s(%s) lacks --%s" % (name, page[1], o))
            if name == "psctl":
                cmds = re.findall(r"^  ([a-z]+)\b", r.stdout.split("Commands:")[1]
                                  .split("Options:")[0], re.M)
                self.assertIn("status", cmds)
                for c in cmds:
                    self.assertRegex(man, r"\n\.BI? \"?%s\b" % c,
                                     "psctl(1) lacks the command %s" % c)

    def test_installed_pslaunch_finds_installed_psd(self):
        """pslaunch resolves psd (in sbin) before it tries the ports, so a
        port held here makes it stop at the port check, exit 1, having
        found psd; without psd it would exit 2."""
        held = socket.socket()
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        try:
            with h.TempDir() as d:
                spec = os.path.join(d, "spec.json")
                with open(spec, "w") as f:
                    json.dump({"cluster": {"ps": ["127.0.0.1:%d" % port],
                                           "worker": ["127.0.0.1:%d" % h.free_ports(1)[0]]},
                               "job": {}}, f)
                r = h.run([self.inst.staged("bindir", "pslaunch"), "--only", "ps", spec],
                          timeout=60)
        finally:
            held.close()
        out = r.stdout + r.stderr
        self.assertEqual(r.returncode, 1, out)
        self.assertIn("ps:0: cannot listen on 127.0.0.1:%d" % port, out)
        self.assertNotIn("not found", out)


class UnitsTest(unittest.TestCase):
    def setUp(self):
        if not shutil.which("systemd-analyze"):
            self.skipTest("systemd-analyze is not installed")
        self.inst = Installed.get()
        self.tmp = tempfile.TemporaryDirectory(prefix="psd-test-units-")
        self.units = []
        unitdir = self.inst.staged("unitdir")
        for name in ("psd@.service", "dworker@.service", "psd-serve@.service",
                     "psd.target"):
            with open(os.path.join(unitdir, name)) as f:
                text = f.read()
            # verify needs ExecStart's binary to exist: point it into the destdir.
            text, n = re.subn(r"(?m)^ExecStart=/", "ExecStart=%s/" % self.inst.dest, text)
            self.assertEqual(n, 0 if name.endswith(".target") else 1, name)
            out = os.path.join(self.tmp.name, name)
            with open(out, "w") as f:
                f.write(text)
            self.units.append(out)
        # Instances as well as the templates (%i expands to 0 and 1).
        for tmpl, inst in (("psd@.service", "psd@0.service"),
                           ("dworker@.service", "dworker@1.service"),
                           ("psd-serve@.service", "psd-serve@2.service")):
            out = os.path.join(self.tmp.name, inst)
            shutil.copy(os.path.join(self.tmp.name, tmpl), out)
            self.units.append(out)

    def tearDown(self):
        self.tmp.cleanup()

    def test_verify(self):
        env = dict(os.environ, MANPATH=self.inst.staged("mandir"))
        r = subprocess.run(["systemd-analyze", "verify"] + self.units, capture_output=True,
                           text=True, timeout=120, env=env)
        # verify exits 0 even for an unknown key; every message is a failure.
        self.assertEqual((r.returncode, r.stdout + r.stderr), (0, ""))

    def test_verify_catches_a_mistake(self):
        """The check above can fail: a misspelt key is reported."""
        bad = os.path.join(self.tmp.name, "bad@.service")
        with open(self.units[0]) as f:
            text = f.read().replace("ProtectSystem=strict", "ProtectSytem=strict")
        with open(bad, "w") as f:
            f.write(text)
        env = dict(os.environ, MANPATH=self.inst.staged("mandir"))
        r = subprocess.run(["systemd-analyze", "verify", bad], capture_output=True, text=True,
                           timeout=120, env=env)
        self.assertIn("Unknown key 'ProtectSytem'", r.stdout + r.stderr)

    def test_security_exposure(self):
        for unit in self.units:
            if not unit.endswith(".service"):
                continue
            r = subprocess.run(["systemd-analyze", "security", "--offline=true",
                                "--threshold=20", unit], capture_output=True, text=True,
                               timeout=120)
            level = re.search(r"Overall exposure level for \S+: ([0-9.]+)", r.stdout)
            self.assertIsNotNone(level, r.stdout + r.stderr)
            self.assertLess(float(level.group(1)), 2.0, unit)
            self.assertEqual(r.returncode, 0, r.stdout[-2000:] + r.stderr)

    def test_sysusers(self):
        if not shutil.which("systemd-sysusers"):
            self.skipTest("systemd-sysusers is not installed")
        with tempfile.TemporaryDirectory(prefix="psd-test-root-") as root:
            r = subprocess.run(["systemd-sysusers", "--dry-run", "--root=" + root,
                                self.inst.staged("sysusersdir", "psd.conf")],
                               capture_output=True, text=True, timeout=60)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("Creating user 'psd'", r.stdout + r.stderr)
            self.assertEqual(os.listdir(root), [])


def unit_settings(path):
    """The [Service] settings of a unit file, key to its last value."""
    out = {}
    with open(path) as f:
        for line in f:
            m = re.match(r"^([A-Za-z]+)=(.*)$", line.strip())
            if m:
                out[m.group(1)] = m.group(2)
    return out


class UnitSocketTest(h.ProcTest):
    """What psd@ and dworker@ set up for the same-host socket, run as the
    units would run it."""

    def setUp(self):
        h.need_root(self)
        h.need_socket_buffers(self)
        inst = Installed.get()
        self.psd = unit_settings(inst.staged("unitdir", "psd@.service"))
        self.dw = unit_settings(inst.staged("unitdir", "dworker@.service"))
        super().setUp()
        os.chmod(self.d, 0o755)  # like /run
        # Under the units neither is set; PSD_SOCKET_DIR would win.
        for var in ("PSD_SOCKET_DIR", "XDG_RUNTIME_DIR"):
            if var in os.environ:
                self.addCleanup(os.environ.__setitem__, var, os.environ.pop(var))

    def test_units_share_a_private_socket_directory(self):
        for key in ("User", "RuntimeDirectory", "RuntimeDirectoryMode",
                    "RuntimeDirectoryPreserve", "UMask"):
            self.assertEqual(self.psd.get(key), self.dw.get(key), key)
        self.assertEqual(self.psd["RuntimeDirectoryMode"], "0700")
        # Shared by the host's units: one that stops must not remove it.
        self.assertEqual(self.psd["RuntimeDirectoryPreserve"], "yes")
        self.assertNotIn("Environment", self.psd)

    def test_worker_uses_the_socket_under_the_units_settings(self):
        # What systemd makes: /run/<RuntimeDirectory>, the unit's mode, owned
        # by User= (nobody stands in for psd).
        rundir = os.path.join(self.d, self.psd["RuntimeDirectory"])
        os.makedirs(rundir)
        os.chmod(rundir, int(self.psd["RuntimeDirectoryMode"], 8))
        os.chown(rundir, pwd.getpwnam("nobody").pw_uid, -1)
        umask = int(self.psd["UMask"], 8)
        env = {"RUNTIME_DIRECTORY": rundir}
        spec_path = os.path.join(self.d, "cluster.json")
        spec = h.write_spec(spec_path, nps=1, nworker=1,
                            job={"name": "units", "optimizer": {"type": "sgd"}})
        os.chmod(spec_path, 0o644)
        addr = spec["cluster"]["ps"][0]
        path = os.path.join(rundir, "psd-units-%s.sock" % addr.rsplit(":", 1)[1])

        psd = h.Proc(h.nobody_argv([h.build_path("ps-server", "psd"), "--cluster",
                                    spec_path, "--task", "ps:0"], umask), env=env)
        self.procs.append(psd)
        self.assertIn("and unix:" + path, psd.wait_for("ready: listening on", timeout=TIMEOUT))
        dw = h.Proc(h.nobody_argv([h.build_path("worker", "dworker"), "--cluster", spec_path,
                                   "--task", "worker:0", "--max-steps", "5"], umask),
                    env=env)
        self.procs.append(dw)
        self.assertEqual(dw.wait(timeout=120), 0, dw.output())
        self.assertIn("shard 0 (%s) runs on this host: using unix:%s" % (addr, path),
                      dw.output())
        self.assertNotIn("not using its Unix socket", dw.output())
        self.assertEqual(psd.stop(), 0, psd.output())
        self.assertFalse(os.path.exists(path), "socket file left behind")
        self.assertEqual(os.stat(rundir).st_mode & 0o777, 0o700)


class NotifySocket:
    """An AF_UNIX datagram socket standing in for systemd's notify socket.

    A thread reads it all the time, as systemd does: a daemon's sd_notify
    blocks once the socket's queue is full (net.unix.max_dgram_qlen, 10
    without systemd's sysctl), and psd pings WATCHDOG=1 every 100 ms here,
    so a socket left unread while a worker starts on a loaded machine
    stalled psd's loop and with it the worker's Join."""

    def __init__(self, path):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.messages = []
        self._closed = False
        self._queue = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        self.sock.settimeout(0.2)  # to see close() soon
        while not self._closed:
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                return
            self._queue.put(data.decode())

    def next(self, timeout=TIMEOUT):
        """The next message (one datagram may carry several lines)."""
        try:
            msg = self._queue.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError("no notify message within %ss; so far: %s"
                                 % (timeout, self.messages))
        self.messages.append(msg)
        return msg

    def wait_for(self, pred, what, timeout=TIMEOUT):
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError("no %s within %ss; got: %s" % (what, timeout, self.messages))
            msg = self.next(left)
            if pred(msg):
                return msg

    def close(self):
        self._closed = True
        self._reader.join()
        self.sock.close()


def notify_env(path):
    return {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "200000"}


class NotifyTest(unittest.TestCase):
    def setUp(self):
        if not have_systemd_notify():
            self.skipTest("built without libsystemd (-Dsystemd=disabled)")
        self.tmp = tempfile.TemporaryDirectory(prefix="psd-test-notify-")
        self.procs = []
        self.socks = []
        # Ours, should this run under systemd, would name another process.
        for var in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
            os.environ.pop(var, None)

    def tearDown(self):
        for p in self.procs:
            p.stop(signal.SIGKILL)
        for s in self.socks:
            s.close()
        self.tmp.cleanup()

    def socket(self, name):
        s = NotifySocket(os.path.join(self.tmp.name, name))
        self.socks.append(s)
        return s

    def test_psd_and_dworker(self):
        spec_path = os.path.join(self.tmp.name, "spec.json")
        spec = h.write_spec(spec_path, nps=1, nworker=1,
                            job={"name": "notify-job", "sync": {"mode": "async"},
                                 "batch_size": 32, "log_every": 1000})
        port = int(spec["cluster"]["ps"][0].rsplit(":", 1)[1])
        ps_sock = self.socket("psd.notify")
        psd = h.Proc([h.build_path("ps-server", "psd"), "--cluster", spec_path, "--task",
                      "ps:0"], env=notify_env(ps_sock.path))
        self.procs.append(psd)

        # READY=1 first, and only once the port takes connections.
        first = ps_sock.next()
        self.assertEqual(first, "READY=1")
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
        # Written before READY=1; the thread reading psd's output may lag.
        psd.wait_for("ready: listening on 127.0.0.1:%d" % port, timeout=10)
        status = ps_sock.next()
        self.assertEqual(status, "STATUS=shard 0 of 1 on 127.0.0.1:%d, job 'notify-job', "
                                 "async, step 0, 0 of 1 workers live, 0 pushes/s" % port)
        ps_sock.wait_for(lambda m: m == "WATCHDOG=1", "WATCHDOG=1", timeout=5)
        # Pings keep coming at half of WATCHDOG_USEC.
        ps_sock.wait_for(lambda m: m == "WATCHDOG=1", "a second WATCHDOG=1", timeout=5)

        # A worker: 60 steps of at least 50 ms, so it trains for over 3 s and
        # sends at least one progress STATUS= (every 2 s) and many pings.
        dw_sock = self.socket("dworker.notify")
        dw = h.Proc([h.build_path("worker", "dworker"), "--cluster", spec_path, "--task",
                     "worker:0", "--max-steps", "60", "--inject-delay-ms", "50"],
                    env=notify_env(dw_sock.path))
        self.procs.append(dw)
        self.assertEqual(dw_sock.next(timeout=60), "READY=1")
        self.assertEqual(dw_sock.next(),
                         "STATUS=worker:0 of 1, job 'notify-job', async, joined")
        # psd sees the worker live while it trains.
        ps_sock.wait_for(lambda m: m.startswith("STATUS=") and "1 of 1 workers live" in m,
                         "a STATUS= with the worker live")
        progress = dw_sock.wait_for(lambda m: m.startswith("STATUS=") and "epoch" in m,
                                    "a progress STATUS=")
        self.assertRegex(progress, r"^STATUS=worker:0 of 1, job 'notify-job', async, "
                                   r"epoch 1/\d+, step \d+/60, \d+ ex/s$")
        self.assertIn("WATCHDOG=1", dw_sock.messages)
        dw_sock.wait_for(lambda m: m == "STOPPING=1", "STOPPING=1 from dworker")
        self.assertEqual(dw.wait(timeout=60), 0, dw.output())
        self.assertIn("final: ", dw.output())

        # psd has applied the worker's 60 steps; the worker has left.
        st = ps_sock.wait_for(lambda m: m.startswith("STATUS=") and ", step 60," in m,
                              "a STATUS= at step 60")
        self.assertRegex(st, r"^STATUS=shard 0 of 1 on 127\.0\.0\.1:%d, job 'notify-job', "
                             r"async, step 60, [01] of 1 workers live, [0-9.]+k? pushes/s$"
                         % port)

        psd.p.send_signal(signal.SIGTERM)
        ps_sock.wait_for(lambda m: m == "STOPPING=1", "STOPPING=1 from psd")
        self.assertEqual(psd.wait(timeout=30), 0, psd.output())
        self.assertIn("stopped", psd.output())
        # Nothing but these messages ever came.
        for m in ps_sock.messages + dw_sock.messages:
            self.assertRegex(m, r"^(READY=1|STOPPING=1|WATCHDOG=1|STATUS=.+)$")

    def test_psd_without_watchdog(self):
        """No WATCHDOG_USEC: READY=1 and STATUS=, never WATCHDOG=1."""
        spec_path = os.path.join(self.tmp.name, "spec.json")
        spec = h.write_spec(spec_path, nps=2, nworker=1,
                            job={"name": "sync-job", "sync": {"mode": "sync"}})
        sock = self.socket("psd.notify")
        psd = h.Proc([h.build_path("ps-server", "psd"), "--cluster", spec_path, "--task",
                      "ps:1"], env={"NOTIFY_SOCKET": sock.path})
        self.procs.append(psd)
        self.assertEqual(sock.next(), "READY=1")
        self.assertEqual(sock.next(),
                         "STATUS=shard 1 of 2 on %s, job 'sync-job', sync, step 0, 0 pushes/s"
                         % spec["cluster"]["ps"][1])
        # The next STATUS= comes 2 s later; no ping may come before it.
        self.assertTrue(sock.next(timeout=10).startswith("STATUS="), sock.messages)
        psd.p.send_signal(signal.SIGTERM)
        sock.wait_for(lambda m: m == "STOPPING=1", "STOPPING=1")
        self.assertEqual(psd.wait(timeout=30), 0, psd.output())
        self.assertNotIn("WATCHDOG=1", sock.messages)


if __name__ == "__main__":
    h.main()
