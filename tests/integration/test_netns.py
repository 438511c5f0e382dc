"""A job across real addresses, not 127.0.0.1: three network namespaces on a
bridge (in a fourth), each with its own 10.213.7.x/24 address; ps:0 and
worker:1 in the first, ps:1 in the second, worker:0 alone in the third.
With a bearer token and TLS (a certificate for those addresses) they train
the demo MLP to the demo's accuracy, while worker:0's link is cut and
restored mid-training: it says the shards are unreachable, then back, and
finishes. Each psd listens on its spec address only, never 0.0.0.0. Needs
root and iproute2 (else exit 77). Run:
/usr/bin/python3 test_netns.py BUILD_DIR"""
import json
import os
import re
import shutil
import time
import unittest

import harness as h
from faults import Faults, result, wait_match
from netns import Net, ip
from test_auth import TOKEN, make_certs
from test_train import DATA, demo_job

# The demo's epochs, but at least 3 (make asan's demo_job trains one): the
# link is cut once worker:0 is in its second epoch.
NETNS_EPOCHS = max(demo_job()["epochs"], 3)

# The namespaces' addresses: ns1, ns2, ns3 (each namespace is this test's
# own, so the same addresses in a parallel run never meet these).
ADDR = {1: "10.213.7.1", 2: "10.213.7.2", 3: "10.213.7.3"}
PS = ["%s:7100" % ADDR[1], "%s:7100" % ADDR[2]]
WORKER = ["%s:7200" % ADDR[3], "%s:7200" % ADDR[1]]


def listeners(ns):
    """The TCP sockets listening in namespace ns: {(local address, pid)}.
    gRPC listens on an IPv6 socket bound to the IPv4-mapped address
    ([::ffff:10.213.7.1]:7100), which takes that IPv4 address's
    connections only: it is given as the IPv4 address."""
    r = ip("netns", "exec", ns, "ss", "-Hltnp")
    out = set()
    for line in r.stdout.splitlines():
        local = re.sub(r"^\[::ffff:([\d.]+)\]", r"\1", line.split()[3])
        for pid in set(re.findall(r"pid=(\d+)", line)) or {"?"}:
            out.add((local, pid))
    return out


@unittest.skipUnless(os.path.isdir(DATA), "dataset-fashion-mnist is not installed")
@unittest.skipUnless(shutil.which("openssl"), "the openssl command is not installed")
@unittest.skipUnless(shutil.which("ss"), "the ss command (iproute2) is not installed")
class NetnsJobTest(Faults):
    def setUp(self):
        super().setUp()
        net = Net(self, "psdn")
        self.br = net.netns("b")
        ip("-n", self.br, "link", "add", "br0", "type", "bridge")
        ip("-n", self.br, "link", "set", "br0", "up")
        self.ns = {}
        for i in ADDR:
            self.ns[i] = net.netns(str(i))
            net.veth("eth0", "p%d" % i, self.ns[i], self.br, ADDR[i] + "/24")
            ip("-n", self.br, "link", "set", "p%d" % i, "master", "br0")

    def write_spec(self):
        make_certs(self.d, ips=(ADDR[1], ADDR[2]))
        token = os.path.join(self.d, "token")
        with open(os.open(token, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write(TOKEN + "\n")
        # The demo job; calls time out after 1 s so that the cut is noticed
        # soon (the demo's default is longer).
        spec = {"cluster": {"ps": PS, "worker": WORKER},
                "job": demo_job(rpc_timeout_ms=1000, epochs=NETNS_EPOCHS),
                "auth": {"token_file": "token",
                         "tls": {"ca": "ca.pem", "cert": "server.pem", "key": "server.key"}}}
        path = os.path.join(self.d, "spec.json")
        with open(path, "w") as f:
            json.dump(spec, f, indent=2)
        return path, spec["job"]

    def test_job_across_namespaces_survives_a_cut_link(self):
        t0 = time.monotonic()
        spec, job = self.write_spec()
        ps = [self.psd(spec, 0, netns=self.ns[1]), self.psd(spec, 1, netns=self.ns[2])]
        for i, p in enumerate(ps):
            self.assertIn("security: bearer token required, TLS", p.output())
            self.assertIn("ready: listening on %s" % PS[i], p.output())
        ws = [self.worker(spec, 0, netns=self.ns[3]), self.worker(spec, 1, netns=self.ns[1])]
        for w in ws:
            for s in (0, 1):
                self.assertIn("shard %d: using TCP to %s" % (s, PS[s]),
                              w.wait_for("shard %d: using" % s, timeout=60))

        # Each psd listens on its spec address, and nothing else listens
        # (dworker serves nothing): no 0.0.0.0, no [::], no 127.0.0.1.
        self.assertEqual(listeners(self.ns[1]), {(PS[0], str(ps[0].p.pid))})
        self.assertEqual(listeners(self.ns[2]), {(PS[1], str(ps[1].p.pid))})
        self.assertEqual(listeners(self.ns[3]), set())

        # Cut worker:0 off mid-training (its bridge port down: its packets
        # go nowhere), until it says so.
        ws[0].wait_for("epoch 2/%d" % job["epochs"], timeout=120)
        ip("-n", self.br, "link", "set", "p3", "down")
        cut = time.monotonic()
        try:
            line = ws[0].wait_for(") unreachable (", timeout=30)
            self.assertRegex(line, r"ps:(0 \(%s\)|1 \(%s\)) unreachable \(DEADLINE_EXCEEDED"
                             % (PS[0], PS[1]))
        finally:
            ip("-n", self.br, "link", "set", "p3", "up")
        back = wait_match(ws[0], r"ps:\d \(10\.213\.7\.\d:7100\) back after \d+\.\d s",
                          timeout=60)
        outage = time.monotonic() - cut

        self.finish(ws, timeout=120)
        res = result(ws[0])
        self.assertEqual(res["epochs"], str(job["epochs"]))
        self.assertEqual(res["examples"], str(job["epochs"] * 30000))
        acc = float(res["test_accuracy"])
        self.stop_all(ps)
        print("\ntest_accuracy=%.4f; worker:0 cut off for %.1f s (%s); %.1f s in all"
              % (acc, outage, back.split("] ")[-1], time.monotonic() - t0))
        # What the demo reaches (test_train.py).
        self.assertGreaterEqual(acc, 0.84)


if __name__ == "__main__":
    h.main()
