"""Who may talk to psd: a bearer token on every call (admin calls included),
TLS, and mutual TLS, with certificates this test makes with openssl. Wrong or
missing credentials get UNAUTHENTICATED (token) or no connection (TLS), are
counted and logged once per peer; bad auth settings stop psd with exit 2.
Run: /usr/bin/python3 test_auth.py BUILD_DIR"""
import json
import os
import shutil
import subprocess
import tempfile
import unittest

import harness as h

TOKEN = "k3y-0f-the-job-7c9f2e"


def openssl(*args, cwd):
    r = subprocess.run(["openssl"] + list(args), cwd=cwd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r


def make_certs(d, ips=("127.0.0.1",)):
    """A CA, a shard certificate for the addresses ips (and localhost)
    signed by it, a client certificate signed by it, and a second CA that
    signed nothing of ours."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for ca in ("ca", "other-ca"):
        openssl("req", "-x509", *ec, "-keyout", ca + ".key", "-out", ca + ".pem",
                "-days", "2", "-subj", "/CN=psd test " + ca, cwd=d)
    with open(os.path.join(d, "san.ext"), "w") as f:
        f.write("subjectAltName=%s,DNS:localhost\n" % ",".join("IP:" + a for a in ips))
    for name, ext in (("server", ["-extfile", "san.ext"]), ("client", [])):
        openssl("req", *ec, "-keyout", name + ".key", "-out", name + ".csr",
                "-subj", "/CN=psd test " + name, cwd=d)
        openssl("x509", "-req", "-in", name + ".csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", name + ".pem", "-days", "2", *ext, cwd=d)


class AuthTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="psd-test-")
        self.d = self.tmp.name
        self.base = h.write_spec(os.path.join(self.d, "base.json"), nps=2, nworker=1,
                                 job={"name": "auth", "optimizer": {"type": "sgd"}})
        self.procs = []

    def tearDown(self):
        for p in self.procs:
            p.stop()
        self.tmp.cleanup()

    def spec(self, name, auth=None):
        cfg = json.loads(json.dumps(self.base))
        if auth is not None:
            cfg["auth"] = auth
        path = os.path.join(self.d, name)
        with open(path, "w") as f:
            json.dump(cfg, f)
        return path

    def secret(self, name, text):
        return h.write_secret(self.d, name, text)

    def shards(self, spec):
        self.procs = [h.start_psd(spec, i) for i in range(2)]
        return self.procs

    def roundtrip(self, spec):
        return h.pstool(spec, "--bytes", str(1 << 20), "--rounds", "2", "roundtrip")

    def test_token_required_on_every_call(self):
        self.secret("token", TOKEN + "\n")
        self.secret("wrong", "not-" + TOKEN + "\n")
        good = self.spec("good.json", {"token_file": "token"})
        none = self.spec("none.json")
        wrong = self.spec("wrong.json", {"token_file": "wrong"})
        ps = self.shards(good)
        self.assertIn("security: bearer token required", ps[0].output())

        r = self.roundtrip(good)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("verified", r.stdout)
        st = h.run([h.build_path("ps-server", "psctl"), "--cluster", good, "--json", "status"])
        self.assertEqual(st.returncode, 0, st.stderr)

        for spec in (none, wrong):
            # Data, Admin and Coord calls alike.
            r = h.pstool(spec, "--shard", "1", "pull", "roundtrip/1048576/0", "0", "4")
            self.assertEqual(r.returncode, 1)
            self.assertIn("ERROR UNAUTHENTICATED: missing or wrong bearer token", r.stdout)
            st = h.run([h.build_path("ps-server", "psctl"), "--cluster", spec, "status"])
            self.assertEqual(st.returncode, 1)
            self.assertIn("UNAUTHENTICATED", st.stderr)
            w = h.run([h.build_path("worker", "dworker"), "--cluster", spec, "--task",
                       "worker:0", "--max-steps", "1", "--connect-timeout-ms", "5000"],
                      timeout=120)
            self.assertEqual(w.returncode, 1)
            self.assertIn("UNAUTHENTICATED", w.stderr)

        # Counted on each shard, logged once per peer host (not per call).
        st = h.run([h.build_path("ps-server", "psctl"), "--cluster", good, "--json", "status"])
        doc = json.loads(st.stdout)
        refused = [s["unauthenticated"] for s in doc["shards"]]
        self.assertGreaterEqual(refused[1], 4, refused)
        self.assertGreaterEqual(refused[0], 2, refused)
        for p in ps:
            lines = [l for l in p.lines if "refused a call from ipv4:127.0.0.1" in l]
            self.assertEqual(len(lines), 1, p.output())
            self.assertNotIn(TOKEN, p.output())
        m = h.run([h.build_path("ps-server", "psctl"), "--cluster", good, "metrics"])
        self.assertIn('psd_unauthenticated_total{shard="1"} %d' % refused[1], m.stdout)

    def test_bad_auth_settings_stop_psd_with_exit_2(self):
        cases = [
            ({"token_file": "missing"}, "auth.token_file: cannot read %s/missing"),
            ({"token": TOKEN}, "auth.token: a token is never written in the spec"),
            ({"token_file": "empty"}, "auth.token_file: %s/empty is empty"),
            ({"tls": {"ca": "ca.pem", "cert": "nope.pem", "key": "k"}},
             "auth.tls.cert: cannot read %s/nope.pem"),
        ]
        self.secret("empty", "\n")
        for i, (auth, msg) in enumerate(cases):
            spec = self.spec("bad%d.json" % i, auth)
            r = h.run([h.build_path("ps-server", "psd"), "--cluster", spec, "--task", "ps:0"])
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertIn(msg.replace("%s", os.path.realpath(self.d)), r.stderr)
            self.assertNotIn(TOKEN, r.stderr)


@unittest.skipUnless(shutil.which("openssl"), "the openssl command is not installed")
class TlsTest(AuthTest):
    def setUp(self):
        super().setUp()
        make_certs(self.d)
        self.secret("token", TOKEN + "\n")

    def tls(self, **extra):
        t = {"ca": "ca.pem", "cert": "server.pem", "key": "server.key"}
        t.update(extra)
        return {"token_file": "token", "tls": t}

    def test_tls(self):
        good = self.spec("tls.json", self.tls())
        plain = self.spec("plain.json", {"token_file": "token"})
        stranger = self.spec("stranger.json", self.tls(ca="other-ca.pem"))
        ps = self.shards(good)
        self.assertIn("security: bearer token required, TLS", ps[0].output())
        self.assertIn("no Unix socket: TLS is on", ps[0].output())
        r = self.roundtrip(good)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("via=tcp", r.stdout)  # TLS stays on TCP, even on one host
        # A plaintext client, and one trusting another CA, never get through.
        for spec in (plain, stranger):
            r = h.pstool(spec, "--timeout", "3000", "--shard", "0", "pull", "x", "0", "1")
            self.assertEqual(r.returncode, 1)
            self.assertRegex(r.stdout, r"ERROR (UNAVAILABLE|DEADLINE_EXCEEDED)")
        st = h.run([h.build_path("ps-server", "psctl"), "--cluster", good, "status"])
        self.assertEqual(st.returncode, 0, st.stderr)

    def test_mutual_tls(self):
        good = self.spec("mtls.json", self.tls(mutual=True, client_cert="client.pem",
                                               client_key="client.key"))
        # The same shards, a client that presents no certificate (TLS only),
        # and one that presents a certificate from another CA.
        anon = self.spec("anon.json", self.tls())
        forged = self.spec("forged.json", self.tls(mutual=True, client_cert="other-ca.pem",
                                                   client_key="other-ca.key"))
        ps = self.shards(good)
        self.assertIn("TLS with client certificates (mutual)", ps[0].output())
        r = self.roundtrip(good)
        self.assertEqual(r.returncode, 0, r.stderr)
        w = h.run([h.build_path("worker", "dworker"), "--cluster", good, "--task", "worker:0",
                   "--max-steps", "20"], timeout=300)
        self.assertEqual(w.returncode, 0, w.stderr[-2000:])
        self.assertIn("final: test_accuracy=", w.stdout)
        for spec in (anon, forged):
            r = h.pstool(spec, "--timeout", "3000", "--shard", "0", "pull", "x", "0", "1")
            self.assertEqual(r.returncode, 1)
            self.assertRegex(r.stdout, r"ERROR (UNAVAILABLE|DEADLINE_EXCEEDED)")

    # The token tests need no certificates; don't run them twice.
    test_token_required_on_every_call = None
    test_bad_auth_settings_stop_psd_with_exit_2 = None


if __name__ == "__main__":
    h.main()
