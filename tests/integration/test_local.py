"""Clients on the shard's host reach it over its Unix socket, chosen without
configuration and reported; job.unix_sockets false keeps TCP; the socket file
is replaced when stale, removed on exit, and never clobbers another file.
Only the right owner's socket is used: a directory and socket squatted by
another user (nobody) are refused by psd and by the client, which says why
and trains over TCP without the squatter ever being called; a psd running
as another user is trusted only when job.socket_owner names that user
(these run as root, else skip).
Run: /usr/bin/python3 test_local.py BUILD_DIR"""
import json
import os
import pwd
import socket
import stat
import sys
import tempfile
import unittest

import harness as h


# A local user's trap: listens where a shard's socket would be and reports
# every connection (which would carry the bearer token).
SQUATTER = r"""
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1])
s.listen(8)
print("listening", flush=True)
s.settimeout(300)
while True:
    c, _ = s.accept()
    print("CONNECTED", flush=True)
    c.close()
"""


def kv(line):
    return dict(p.split("=", 1) for p in line.split() if "=" in p)


class LocalSocketTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="psd-test-")
        self.env = {"PSD_SOCKET_DIR": self.tmp.name}
        os.environ["PSD_SOCKET_DIR"] = self.tmp.name  # for pstool (h.pstool)
        self.spec = os.path.join(self.tmp.name, "spec.json")
        self.cfg = h.write_spec(self.spec, nps=1, nworker=1,
                                job={"name": "local.t", "optimizer": {"type": "sgd"}})
        port = self.cfg["cluster"]["ps"][0].rsplit(":", 1)[1]
        self.path = os.path.join(self.tmp.name, "psd-local.t-%s.sock" % port)
        h.need_socket_buffers(self)

    def tearDown(self):
        os.environ.pop("PSD_SOCKET_DIR", None)
        self.tmp.cleanup()

    def roundtrip(self, spec):
        r = h.pstool(spec, "--bytes", str(1 << 20), "--rounds", "3", "roundtrip")
        self.assertEqual(r.returncode, 0, r.stderr)
        line = r.stdout.strip().splitlines()[-1]
        self.assertNotIn("MISMATCH", line)
        return kv(line)

    def test_same_host_client_uses_the_unix_socket(self):
        ps = h.start_psd(self.spec, 0, env=self.env)
        try:
            ready = ps.wait_for("ready: listening on")
            self.assertIn("and unix:" + self.path, ready)
            self.assertTrue(stat.S_ISSOCK(os.stat(self.path).st_mode))
            self.assertEqual(self.roundtrip(self.spec)["via"], "unix")
        finally:
            self.assertEqual(ps.stop(), 0)
        self.assertFalse(os.path.exists(self.path), "socket file left behind")

    def test_dworker_reports_its_choice(self):
        ps = h.start_psd(self.spec, 0, env=self.env)
        try:
            w = h.Proc([h.build_path("worker", "dworker"), "--cluster", self.spec,
                        "--task", "worker:0", "--max-steps", "5"], env=self.env)
            self.assertEqual(w.wait(timeout=120), 0, w.output())
            self.assertIn("shard 0 (%s) runs on this host: using unix:%s"
                          % (self.cfg["cluster"]["ps"][0], self.path), w.output())
        finally:
            ps.stop()

    def test_unix_sockets_false_keeps_tcp(self):
        self.cfg["job"]["unix_sockets"] = False
        with open(self.spec, "w") as f:
            json.dump(self.cfg, f)
        ps = h.start_psd(self.spec, 0, env=self.env)
        try:
            self.assertNotIn("unix:", ps.wait_for("ready: listening on"))
            self.assertFalse(os.path.exists(self.path))
            self.assertEqual(self.roundtrip(self.spec)["via"], "tcp")
        finally:
            ps.stop()

    def test_client_side_false_keeps_tcp_against_a_unix_shard(self):
        ps = h.start_psd(self.spec, 0, env=self.env)
        try:
            self.cfg["job"]["unix_sockets"] = False
            tcp_spec = os.path.join(self.tmp.name, "tcp.json")
            with open(tcp_spec, "w") as f:
                json.dump(self.cfg, f)
            self.assertEqual(self.roundtrip(tcp_spec)["via"], "tcp")
        finally:
            ps.stop()

    def test_stale_socket_is_replaced(self):
        s = socket.socket(socket.AF_UNIX)
        s.bind(self.path)  # bound, never listening: what a killed psd leaves
        s.close()
        ps = h.start_psd(self.spec, 0, env=self.env)
        try:
            self.assertIn("and unix:", ps.wait_for("ready: listening on"))
            self.assertEqual(self.roundtrip(self.spec)["via"], "unix")
        finally:
            ps.stop()

    def test_small_buffers_keep_tcp(self):
        # Stock Debian's limit (212992): psd says why and serves TCP only.
        h.set_wmem_max(self, 212992, "this case needs the stock limit")
        ps = h.start_psd(self.spec, 0, env=self.env)
        try:
            self.assertNotIn("unix:", ps.wait_for("ready: listening on"))
            self.assertIn("net.core.wmem_max", ps.output())
            self.assertEqual(self.roundtrip(self.spec)["via"], "tcp")
        finally:
            ps.stop()

    def test_another_file_at_the_path_is_left_alone(self):
        with open(self.path, "w") as f:
            f.write("not a socket\n")
        ps = h.start_psd(self.spec, 0, env=self.env)
        try:
            ready = ps.wait_for("ready: listening on")
            self.assertNotIn("unix:", ready)
            self.assertIn("exists and is not a socket", ps.output())
            self.assertEqual(self.roundtrip(self.spec)["via"], "tcp")
        finally:
            ps.stop()
        with open(self.path) as f:
            self.assertEqual(f.read(), "not a socket\n")


class SocketOwnerTest(h.ProcTest):
    """Who may own the socket a client uses: its own user, root, or the
    user job.socket_owner names. Another user stands in as nobody."""

    def setUp(self):
        h.need_root(self)
        super().setUp()
        os.chmod(self.d, 0o711)  # nobody may pass, not list or write
        self.nobody = pwd.getpwnam("nobody").pw_uid
        self.spec = os.path.join(self.d, "spec.json")
        self.cfg = h.write_spec(self.spec, nps=1, nworker=1,
                                job={"name": "owner.t", "optimizer": {"type": "sgd"}})
        os.chmod(self.spec, 0o644)
        self.addr = self.cfg["cluster"]["ps"][0]
        self.name = "psd-owner.t-%s.sock" % self.addr.rsplit(":", 1)[1]

    def start(self, argv, env):
        p = h.Proc(argv, env=env)
        self.procs.append(p)
        return p

    def nobody_dir(self, name, mode):
        d = os.path.join(self.d, name)
        os.mkdir(d)
        os.chown(d, self.nobody, -1)
        os.chmod(d, mode)
        return d

    def worker(self, spec, env):
        w = h.Proc([h.build_path("worker", "dworker"), "--cluster", spec,
                    "--task", "worker:0", "--max-steps", "5"], env=env)
        self.assertEqual(w.wait(timeout=120), 0, w.output())
        return w.output()

    def test_squatted_directory_and_socket_are_refused(self):
        """nobody made the socket directory and listens at the shard's
        path before psd starts: psd will not use the directory, the client
        will not use the socket, and the job trains over TCP."""
        squat = self.nobody_dir("squat", 0o777)
        path = os.path.join(squat, self.name)
        trap = self.start(h.nobody_argv([sys.executable, "-c", SQUATTER, path]), env={})
        trap.wait_for("listening")
        self.assertEqual(os.stat(path).st_uid, self.nobody)
        env = {"PSD_SOCKET_DIR": squat}

        ps = self.start([h.build_path("ps-server", "psd"), "--cluster", self.spec,
                         "--task", "ps:0"], env=env)
        self.assertNotIn("unix:", ps.wait_for("ready: listening on"))
        refusal = ps.wait_for("no Unix socket:")
        self.assertIn(" warn: ", refusal)
        self.assertIn("the socket directory %s belongs to uid %d" % (squat, self.nobody),
                      refusal)
        self.assertIn("clients on this host use TCP", refusal)

        out = self.worker(self.spec, env)
        self.assertIn("ps:0 (%s): not using its Unix socket: the socket file %s belongs to "
                      "uid %d" % (self.addr, path, self.nobody), out)
        self.assertIn("not to this user (uid 0), root or the user job.socket_owner names", out)
        self.assertIn("shard 0: using TCP to %s" % self.addr, out)
        self.assertEqual(out.count("not using its Unix socket"), 1, out)
        self.assertEqual(ps.stop(), 0, ps.output())
        # The trap was never called, and psd left it as it was.
        self.assertNotIn("CONNECTED", trap.output())
        self.assertEqual(os.stat(path).st_uid, self.nobody)

    def test_another_users_psd_needs_socket_owner(self):
        """psd runs as nobody in nobody's private directory; a root worker
        pointed there refuses its socket until job.socket_owner names
        nobody."""
        h.need_socket_buffers(self)
        run = self.nobody_dir("run", 0o700)
        path = os.path.join(run, self.name)
        env = {"PSD_SOCKET_DIR": run}
        ps = self.start(h.nobody_argv([h.build_path("ps-server", "psd"), "--cluster",
                                       self.spec, "--task", "ps:0"]), env=env)
        self.assertIn("and unix:" + path, ps.wait_for("ready: listening on"))
        self.assertEqual(os.stat(path).st_uid, self.nobody)

        out = self.worker(self.spec, env)
        self.assertIn("not using its Unix socket: the socket file %s belongs to uid %d"
                      % (path, self.nobody), out)
        self.assertIn("shard 0: using TCP to", out)

        for owner in ("nobody", self.nobody):
            self.cfg["job"]["socket_owner"] = owner
            trusting = os.path.join(self.d, "trusting.json")
            with open(trusting, "w") as f:
                json.dump(self.cfg, f)
            out = self.worker(trusting, env)
            self.assertIn("shard 0 (%s) runs on this host: using unix:%s" % (self.addr, path),
                          out)
            self.assertNotIn("not using its Unix socket", out)
        self.assertEqual(ps.stop(), 0, ps.output())
        self.assertFalse(os.path.exists(path), "socket file left behind")


if __name__ == "__main__":
    h.main()
