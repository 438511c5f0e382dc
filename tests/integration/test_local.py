"""Clients on the shard's host reach it over its Unix socket, chosen without
configuration and reported; job.unix_sockets false keeps TCP; the socket file
is replaced when stale, removed on exit, and never clobbers another file.
Run: /usr/bin/python3 test_local.py BUILD_DIR"""
import json
import os
import socket
import stat
import sys
import tempfile
import unittest

import harness as h


def big_buffers():
    """Whether this kernel grants the socket buffers psd's Unix sockets need
    (common/rpc/endpoint.h: at least 1 MiB); without them clients keep TCP."""
    with open("/proc/sys/net/core/wmem_max") as f:
        return int(f.read()) >= (1 << 20)


NEEDS_BUFFERS = unittest.skipUnless(
    big_buffers(), "net.core.wmem_max is below 1 MiB: psd serves no Unix socket here "
    "(test_small_buffers_keep_tcp covers that case)")


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

    def tearDown(self):
        os.environ.pop("PSD_SOCKET_DIR", None)
        self.tmp.cleanup()

    def roundtrip(self, spec):
        r = h.pstool(spec, "--bytes", str(1 << 20), "--rounds", "3", "roundtrip")
        self.assertEqual(r.returncode, 0, r.stderr)
        line = r.stdout.strip().splitlines()[-1]
        self.assertNotIn("MISMATCH", line)
        return kv(line)

    @NEEDS_BUFFERS
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

    @NEEDS_BUFFERS
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

    @NEEDS_BUFFERS
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

    @NEEDS_BUFFERS
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

    @unittest.skipIf(big_buffers(), "net.core.wmem_max allows Unix sockets here")
    def test_small_buffers_keep_tcp(self):
        ps = h.start_psd(self.spec, 0, env=self.env)
        try:
            self.assertNotIn("unix:", ps.wait_for("ready: listening on"))
            self.assertIn("net.core.wmem_max", ps.output())
            self.assertEqual(self.roundtrip(self.spec)["via"], "tcp")
        finally:
            ps.stop()

    @NEEDS_BUFFERS
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


if __name__ == "__main__":
    h.BUILD = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
