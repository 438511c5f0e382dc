"""psd's GET /metrics endpoint (job.metrics_listen, psd --metrics-listen):
shards started with it on free ports, pushes sent with pstool, the page
fetched over HTTP with urllib and parsed with prometheus_client's own parser
(Debian's python3-prometheus-client): the families psctl metrics renders for
the shard, with the same values (pushes counted); the token case (401
without, 200 with), 404 and 405, HTTPS with the spec's TLS, listening on the
given address alone, the base-port form (shard i on port + i), the
command-line override, spec mistakes with their JSON path, a taken port,
and a clean stop. deploy/grafana/psd-dashboard.json queries only names the
endpoint exports. Run: /usr/bin/python3 test_metrics_http.py BUILD_DIR"""
import http.client
import json
import os
import re
import shutil
import signal
import socket
import ssl
import tempfile
import unittest
import urllib.error
import urllib.request

import harness as h

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:  # the test skips, saying so
    text_string_to_metric_families = None

TOKEN = "metrics-token-0123456789abcdef"
DASHBOARD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                         "deploy", "grafana", "psd-dashboard.json")


# Families every shard counts alike, so that each is the job's value on any
# one shard: a sum over the shards multiplies it by their number.
PER_JOB = {
    "psd_examples_total": "each step's examples are counted once on every shard",
    "psd_step": "every shard commits every sync step",
}


def enclosing_aggregations(expr, name):
    """[(function, by labels)] around each occurrence of the family name in
    a PromQL expression, innermost last: 'sum by (shard) (rate(x[1m]))' and
    'sum(rate(x[1m])) by (shard)' both give [('sum', ('shard',)), ('rate', ())]."""
    found = []
    for m in re.finditer(r"\b%s\b" % re.escape(name), expr):
        chain, depth = [], 0
        for p in range(m.start() - 1, -1, -1):
            c = expr[p]
            if c == ")":
                depth += 1
            elif c == "(":
                if depth:
                    depth -= 1
                    continue
                before = expr[:p].rstrip()
                by = ()
                clause = re.search(r"(\w+)\s+(?:by|without)\s*\(([^()]*)\)$", before)
                if clause:  # sum by (labels) (...)
                    op = clause.group(1)
                    by = tuple(x.strip() for x in clause.group(2).split(",") if x.strip())
                else:
                    word = re.search(r"(\w*)$", before).group(1)
                    op = word or "("
                    close = matching_paren(expr, p)
                    after = re.match(r"\s*(?:by|without)\s*\(([^()]*)\)", expr[close + 1:])
                    if after:  # sum(...) by (labels)
                        by = tuple(x.strip() for x in after.group(1).split(",") if x.strip())
                if op != "(":
                    chain.append((op, by))
        found.extend(reversed(chain))
    return found


def matching_paren(expr, p):
    """The index of the ')' that closes the '(' at p."""
    depth = 0
    for i in range(p, len(expr)):
        depth += {"(": 1, ")": -1}.get(expr[i], 0)
        if depth == 0:
            return i
    raise ValueError("unbalanced parentheses in %r" % expr)


def need_parser():
    if text_string_to_metric_families is None:
        raise unittest.SkipTest("no prometheus_client (Debian's python3-prometheus-client)")


def fetch(url, token=None, method="GET", context=None, timeout=10):
    """(status, headers, body) of one request; HTTP errors are answers too."""
    req = urllib.request.Request(url, method=method)
    if token is not None:
        req.add_header("Authorization", "Bearer " + token)
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as r:
            return r.status, r.headers, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read().decode()


def families(text):
    """{family name: Metric} from the exposition text."""
    return {f.name: f for f in text_string_to_metric_families(text)}


def samples(fams):
    """{(sample name, sorted labels): value} over every family."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in fams.values() for s in f.samples}


def value(fams, family, sample=None, **labels):
    for s in fams[family].samples:
        if s.name == (sample or family) and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    raise AssertionError("no %s %s in %s" % (sample or family, labels, sorted(fams)))


def listening(port):
    """The local addresses of TCP sockets listening on port (IPv4 and IPv6),
    from /proc/net/tcp{,6}: what the kernel says, not what a connect finds."""
    found = []
    for name, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        try:
            with open(name) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            addr, p = cols[1].split(":")
            if cols[3] == "0A" and int(p, 16) == port:  # 0A: LISTEN
                found.append(socket.inet_ntop(socket.AF_INET, bytes.fromhex(addr)[::-1])
                             if width == 8 else addr)
    return found


class MetricsTest(h.ShardsTest):
    """Two shards with one metrics address each (the list form)."""

    @classmethod
    def job(cls):
        return {"name": "mh", "optimizer": {"type": "sgd", "lr": 1.0},
                "metrics_listen": ["127.0.0.1:%d" % p for p in cls.mports]}

    @classmethod
    def setUpClass(cls):
        need_parser()
        cls.mports = h.free_ports(2)
        super().setUpClass()
        cls.url = ["http://127.0.0.1:%d/metrics" % p for p in cls.mports]
        # 'm' (4, 2) split by rows over both shards: 3 pushes to shard 0, 2 to 1.
        for s, n in ((0, 3), (1, 2)):
            cls.tool(s, "declare", "m", "4,2", "-1")
            for _ in range(n):
                cls.tool(s, "push", "m", "4,2", str(4 * s), "1,2,3,4")

    @classmethod
    def tool(cls, shard, *args):
        r = h.pstool(cls.spec, "--shard", str(shard), *args)
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout

    def scrape(self, shard):
        status, headers, body = fetch(self.url[shard])
        self.assertEqual(status, 200, body)
        self.assertTrue(headers["Content-Type"].startswith("text/plain; version=0.0.4"),
                        headers["Content-Type"])
        return families(body)

    def test_logs_where_it_serves(self):
        for s in range(2):
            self.assertIn("metrics: serving %s" % self.url[s], self.ps[s].output())

    def test_pushes_counted_per_shard(self):
        for s, pushes in ((0, 3), (1, 2)):
            f = self.scrape(s)
            self.assertEqual(f["psd_pushes"].type, "counter")  # the parser drops _total
            self.assertEqual(value(f, "psd_pushes", "psd_pushes_total", shard=str(s)), pushes)
            self.assertEqual(value(f, "psd_up", shard=str(s), address=self.addrs[s]), 1)
            self.assertEqual(value(f, "psd_variables", shard=str(s)), 1)
            self.assertEqual(value(f, "psd_variable_version", shard=str(s), variable="m"), pushes)
            self.assertEqual(value(f, "psd_received_bytes", "psd_received_bytes_total",
                                   shard=str(s)), pushes * 16)
            self.assertEqual(f["psd_push_seconds"].type, "histogram")
            self.assertEqual(value(f, "psd_push_seconds", "psd_push_seconds_count",
                                   shard=str(s)), pushes)
            self.assertEqual(value(f, "psd_push_seconds", "psd_push_seconds_bucket",
                                   shard=str(s), le="+Inf"), pushes)
            self.assertGreater(value(f, "psd_uptime_seconds", shard=str(s)), 0)
            # Only this shard's samples: each carries its shard label, but
            # shard 0's view of the workers (it coordinates).
            for (name, labels), _ in samples(f).items():
                if s == 0 and name.startswith("psd_worker_"):
                    self.assertEqual(labels[-1][0], "worker", name)
                else:
                    self.assertIn(("shard", str(s)), labels, name)
        f = self.scrape(0)
        self.assertEqual(value(f, "psd_worker_live", worker="0"), 0)  # never joined
        self.assertNotIn("psd_worker_live", self.scrape(1))

    def test_same_families_and_values_as_psctl(self):
        r = h.run([h.build_path("ps-server", "psctl"), "--cluster", self.spec, "metrics"])
        self.assertEqual(r.returncode, 0, r.stderr)
        mine = samples(families(r.stdout))
        for s in range(2):
            got = samples(self.scrape(s))
            want = {k: v for k, v in mine.items() if ("shard", str(s)) in k[1] or
                    (s == 0 and k[0].startswith("psd_worker_"))}
            self.assertEqual(set(got), set(want))
            for k, v in want.items():
                if k[0] != "psd_uptime_seconds":
                    self.assertEqual(got[k], v, k)

    def test_head_answers_without_a_body(self):
        c = http.client.HTTPConnection("127.0.0.1", self.mports[0], timeout=10)
        c.request("HEAD", "/metrics")
        r = c.getresponse()
        self.assertEqual(r.status, 200)
        self.assertEqual(r.read(), b"")
        c.close()

    def test_other_path_404_other_method_405(self):
        base = "http://127.0.0.1:%d" % self.mports[0]
        for path in ("/", "/metric", "/metrics/x", "/status"):
            status, _, body = fetch(base + path)
            self.assertEqual(status, 404, path)
            self.assertIn("psd serves /metrics", body)
        for method in ("POST", "PUT", "DELETE"):
            status, headers, _ = fetch(self.url[0], method=method)
            self.assertEqual(status, 405, method)
            self.assertEqual(headers["Allow"], "GET, HEAD")

    def test_listens_on_the_given_address_alone(self):
        for p in self.mports:
            self.assertEqual(listening(p), ["127.0.0.1"])
        # Another loopback address of this host is refused.
        with self.assertRaises(OSError):
            socket.create_connection(("127.0.0.2", self.mports[0]), timeout=5).close()

    def test_dashboard_queries_exported_names(self):
        with open(DASHBOARD) as f:
            dash = json.load(f)
        # What the endpoint can export: every family of the renderer it
        # shares with psctl (psctl --json metrics lists them all, those empty
        # in this job too: psd_step is sync's, psd_table_* need tables,
        # psd_worker_* joined workers), checked against this job's scrape.
        r = h.run([h.build_path("ps-server", "psctl"), "--cluster", self.spec, "--json",
                   "metrics"])
        self.assertEqual(r.returncode, 0, r.stderr)
        exported = set()
        for fam in json.loads(r.stdout)["metrics"]:
            exported.add(fam["name"])
            if fam["type"] == "histogram":
                exported.update(fam["name"] + x for x in ("_bucket", "_sum", "_count"))
        scraped = {x.name for s in range(2) for fam in self.scrape(s).values()
                   for x in fam.samples}
        self.assertLessEqual(scraped, exported)
        exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
        self.assertGreaterEqual(len(exprs), 10)
        used = set()
        for e in exprs:
            names = set(re.findall(r"\b(psd_[a-z_]+)\b", e))
            self.assertTrue(names, e)
            used |= names
        self.assertEqual(sorted(used - exported), [])
        # The dashboard shows this job's traffic: pushes, latency, bytes.
        for name in ("psd_pushes_total", "psd_push_seconds_bucket", "psd_received_bytes_total"):
            self.assertIn(name, used & scraped)
        # A family every shard counts alike is the job's once, not once per
        # shard: no panel sums it over the shards.
        for e in exprs:
            for name in PER_JOB:
                for op, by in enclosing_aggregations(e, name):
                    self.assertFalse(op == "sum" and "shard" not in by,
                                     "%s sums %s over the shards (%s): %s"
                                     % (e, name, PER_JOB[name], "take max"))

class AggregationReaderTest(unittest.TestCase):
    """The reader the dashboard check uses, on expressions of each form."""

    def test_aggregation_reader(self):
        """What the dashboard check reads in an expression: each
        aggregation around a family, with its by labels, either form."""
        f = enclosing_aggregations
        self.assertEqual(f('sum(rate(psd_examples_total{job=~"$job"}[1m]))',
                           "psd_examples_total"), [("sum", ()), ("rate", ())])
        self.assertEqual(f("max(rate(psd_examples_total[1m]))", "psd_examples_total"),
                         [("max", ()), ("rate", ())])
        self.assertEqual(f("sum by (shard) (rate(psd_examples_total[1m]))",
                           "psd_examples_total"), [("sum", ("shard",)), ("rate", ())])
        self.assertEqual(f("sum(rate(psd_examples_total[1m])) by (job, shard)",
                           "psd_examples_total"), [("sum", ("job", "shard")), ("rate", ())])
        self.assertEqual(f("max(psd_step)", "psd_examples_total"), [])


class MetricsModesTest(unittest.TestCase):
    """One psd at a time: base ports, the override, mistakes, token, TLS."""

    def setUp(self):
        need_parser()
        self.tmp = tempfile.TemporaryDirectory(prefix="psd-test-")
        self.d = self.tmp.name
        self.procs = []

    def tearDown(self):
        for p in self.procs:
            p.stop()
        self.tmp.cleanup()

    def spec(self, job_extra=None, auth=None, nps=2):
        path = os.path.join(self.d, "spec-%d.json" % len(os.listdir(self.d)))
        job = {"name": "mm"}
        job.update(job_extra or {})
        h.write_spec(path, nps=nps, nworker=1, job=job,
                     extra={"auth": auth} if auth else None)
        return path

    def start(self, spec, index, *args):
        p = h.Proc([h.build_path("ps-server", "psd"), "--cluster", spec,
                    "--task", "ps:%d" % index] + list(args))
        self.procs.append(p)
        p.wait_for("ready: listening on")
        return p

    def test_base_port_plus_shard_index(self):
        base = h.free_port_run(2)
        if base is None:
            raise unittest.SkipTest("no 2 consecutive free ports")
        spec = self.spec({"metrics_listen": "127.0.0.1:%d" % base})
        for i in range(2):
            self.start(spec, i)
        for i in range(2):
            status, _, body = fetch("http://127.0.0.1:%d/metrics" % (base + i))
            self.assertEqual(status, 200)
            self.assertEqual(value(families(body), "psd_up", shard=str(i)), 1)

    def test_command_line_overrides_the_spec(self):
        spec_port, cli_port = h.free_ports(2)
        spec = self.spec({"metrics_listen": "127.0.0.1:%d" % spec_port}, nps=1)
        p = self.start(spec, 0, "--metrics-listen", "127.0.0.1:%d" % cli_port)
        self.assertIn("metrics: serving http://127.0.0.1:%d/metrics" % cli_port, p.output())
        self.assertEqual(fetch("http://127.0.0.1:%d/metrics" % cli_port)[0], 200)
        self.assertEqual(listening(spec_port), [])
        # Without either, nothing is served.
        q = self.start(self.spec(nps=1), 0)
        self.assertNotIn("metrics:", q.output())

    def test_clean_stop_closes_the_port(self):
        port = h.free_ports(1)[0]
        p = self.start(self.spec(nps=1), 0, "--metrics-listen", "127.0.0.1:%d" % port)
        self.assertEqual(fetch("http://127.0.0.1:%d/metrics" % port)[0], 200)
        self.assertEqual(p.stop(signal.SIGTERM), 0, p.output())
        self.assertIn("stopped", p.output())
        self.assertEqual(listening(port), [])

    def test_spec_mistakes_name_the_json_path(self):
        port = h.free_ports(1)[0]
        cases = [
            (["127.0.0.1:%d" % port], "job.metrics_listen: 1 addresses for 2 shards"),
            ("127.0.0.1", 'job.metrics_listen: "127.0.0.1" has no port'),
            ("127.0.0.1:65535", "job.metrics_listen: \"127.0.0.1:65535\": shard 1 would "
                                "listen on port 65536"),
            (["127.0.0.1:%d" % port, "127.0.0.1:%d" % port],
             "job.metrics_listen[1]: \"127.0.0.1:%d\" is also job.metrics_listen[0]" % port),
            (["127.0.0.1:%d" % port, "x y:1"], "job.metrics_listen[1]: \"x y:1\""),
            (9100, "job.metrics_listen: expected a \"host:port\" string or an array"),
        ]
        for bad, msg in cases:
            spec = self.spec({"metrics_listen": bad})
            r = h.run([h.build_path("ps-server", "psd"), "--cluster", spec, "--task", "ps:0"])
            self.assertEqual(r.returncode, 2, (bad, r.stderr))
            self.assertIn(msg, r.stderr)
        r = h.run([h.build_path("ps-server", "psd"), "--cluster", self.spec(), "--task", "ps:0",
                   "--metrics-listen", "localhost"])
        self.assertEqual(r.returncode, 2)
        self.assertIn('psd: --metrics-listen: "localhost" has no port', r.stderr)

    def test_taken_port_fails_the_start(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen()
            port = s.getsockname()[1]
            r = h.run([h.build_path("ps-server", "psd"), "--cluster", self.spec(nps=1),
                       "--task", "ps:0", "--metrics-listen", "127.0.0.1:%d" % port], timeout=30)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("metrics: cannot serve http://127.0.0.1:%d/metrics" % port, r.stderr)

    def secret(self, name, text):
        return h.write_secret(self.d, name, text)

    def test_token_required(self):
        self.secret("token", TOKEN + "\n")
        port = h.free_ports(1)[0]
        spec = self.spec({"metrics_listen": "127.0.0.1:%d" % port}, nps=1,
                         auth={"token_file": "token"})
        p = self.start(spec, 0)
        self.assertIn("(bearer token required)", p.output())
        url = "http://127.0.0.1:%d/metrics" % port
        for token in (None, "wrong", TOKEN + "x", ""):
            status, headers, _ = fetch(url, token=token)
            self.assertEqual(status, 401, token)
            self.assertEqual(headers["WWW-Authenticate"], 'Bearer realm="psd"')
        # Without the token nothing else is told, not even a 404.
        self.assertEqual(fetch("http://127.0.0.1:%d/x" % port)[0], 401)
        status, _, body = fetch(url, token=TOKEN)
        self.assertEqual(status, 200)
        self.assertEqual(value(families(body), "psd_up", shard="0"), 1)
        self.assertEqual(fetch("http://127.0.0.1:%d/x" % port, token=TOKEN)[0], 404)

    def test_https_with_the_shards_certificate(self):
        import test_auth  # its certificates (openssl)
        if not shutil.which("openssl"):
            self.skipTest("no openssl to make certificates")
        test_auth.make_certs(self.d)
        self.secret("token", TOKEN + "\n")
        port = h.free_ports(1)[0]
        spec = self.spec({"metrics_listen": "127.0.0.1:%d" % port}, nps=1,
                         auth={"token_file": "token",
                               "tls": {"ca": "ca.pem", "cert": "server.pem",
                                       "key": "server.key"}})
        p = self.start(spec, 0)
        self.assertIn("metrics: serving https://127.0.0.1:%d/metrics" % port, p.output())
        ctx = ssl.create_default_context(cafile=os.path.join(self.d, "ca.pem"))
        url = "https://127.0.0.1:%d/metrics" % port
        status, _, body = fetch(url, token=TOKEN, context=ctx)
        self.assertEqual(status, 200)
        self.assertEqual(value(families(body), "psd_up", shard="0"), 1)
        self.assertEqual(fetch(url, context=ctx)[0], 401)
        # Plain HTTP gets no page.
        with self.assertRaises((OSError, http.client.HTTPException)):
            fetch("http://127.0.0.1:%d/metrics" % port, token=TOKEN, timeout=5)


if __name__ == "__main__":
    h.main()
