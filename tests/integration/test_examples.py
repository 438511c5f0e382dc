#!/usr/bin/python3
"""Every shipped example runs, as shipped, to the figure README.md states.

README.md's table under "## The examples" is the one place an example's
figure is written: stated(NAME) reads it there, and every test that runs an
example checks the job's `final:` line against it, so the docs and the
tests cannot say two things.

- coverage: every deploy/examples/*.json, deploy/examples/c/*.c and
  deploy/slurm/*.json has a row; each row names integration tests that
  exist (tests/meson.build), and each of those calls something with the
  file's name (stated("x.json"), run_example("x.json"), ...) and reads its
  figure with stated(). A new example that no test runs fails here.
- installed: `meson install --destdir TMP` puts every file below
  deploy/examples (torch/ and c/ too) and deploy/slurm's job file under
  TMP's share/psd/examples, with the source's contents.
- run from the installed tree, with TMP's pslaunch (which finds TMP's psd
  and dworker) and TMP's psd Python package: local-adam.json and
  two-hosts.json (dworker), torch-mlp.json and torch-cnn.json (their
  job.worker_command, torch/train.py, resolved beside the installed spec),
  each to its stated figure. The other examples are run to theirs by the
  tests the table names (the demo's by integration-train, ...), and
  installed linreg.c is built with pkg-config by integration-clib.

What a test may change in an example: the cluster's addresses and ports
(free ports on loopback; two-hosts.json's two hosts become 127.0.0.1 and
127.0.0.2) and job.data_dir where the example writes it (ctr.json's
generated data). Never a training setting: as_shipped() asserts that the
rest of the spec is the shipped file's. Under make asan (PSD_SANITIZED=1)
the runs train one epoch and the figure is not asserted: they look for
memory errors, and the figure is an unsanitized build's.

Usage: test_examples.py BUILD_DIR [unittest args...]. Each run waits for
pslaunch to exit, with a deadline.
"""

import copy
import filecmp
import glob
import importlib.util
import json
import os
import re
import subprocess
import tempfile
import unittest

import harness as h

SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = os.path.join(SRC, "README.md")
SECTION = "## The examples"
SANITIZED = h.SANITIZED  # importers read it here too
DATA = "/usr/share/datasets/fashion-mnist"
# A row of the table: | [`NAME`](PATH) | trains | FIGURE | RUN BY |
ROW = re.compile(r"^\| \[`[^`]+`\]\(([^)]+)\) \|[^|]*\| ([^|]+) \| ([^|]+) \|$")
# A figure: `METRIC` >= BOUND, or `METRIC` < BOUND x `OTHER` (linreg's loss).
FIGURE = re.compile(r"^`(\w+)` (≥|<) ([0-9.]+)(?: × `(\w+)`)?")


class Stated:
    """One row of README's table: the example's path in the repository,
    the metric its final line reports and the bound it must meet, and the
    integration tests that run it."""

    def __init__(self, path, metric, op, bound, of, tests):
        self.path = path  # e.g. deploy/examples/local.json
        self.metric = metric  # a key of the final: line, e.g. test_accuracy
        self.op = op  # "≥": at least bound; "<": below bound (x of)
        self.bound = bound  # the stated number
        self.of = of  # the final line's key bound multiplies, or None
        self.tests = tests  # ["integration-train", ...]

    def check(self, test, final, who="worker:0"):
        """Asserts the figure on a final: line's key=value pairs."""
        test.assertIn(self.metric, final, "%s: %s has no %s" % (self.path, who, self.metric))
        value = float(final[self.metric])
        limit = self.bound * float(final[self.of]) if self.of else self.bound
        what = "%s: %s's %s=%s, README.md states %s %s%s" % (
            self.path, who, self.metric, final[self.metric], self.op, self.bound,
            " x %s" % self.of if self.of else "")
        if self.op == "≥":
            test.assertGreaterEqual(value, limit, what)
        else:
            test.assertLess(value, limit, what)
        return value


def table(readme=README):
    """README.md's example table: {repository path: Stated}."""
    with open(readme) as f:
        text = f.read()
    if SECTION not in text:
        raise AssertionError("%s has no section %r" % (readme, SECTION))
    rows = {}
    for line in text.split(SECTION, 1)[1].split("\n## ", 1)[0].splitlines():
        m = ROW.match(line.strip())
        if not m:
            continue
        path, figure, tests = m.groups()
        f = FIGURE.match(figure.strip())
        if not f:
            raise AssertionError("%s: %s: the figure %r is not `METRIC` ≥ N or "
                                 "`METRIC` < N × `OTHER`" % (readme, path, figure))
        rows[path] = Stated(path, f.group(1), f.group(2), float(f.group(3)), f.group(4),
                            re.findall(r"`(integration-[\w-]+)`", tests))
    if not rows:
        raise AssertionError("%s: no rows under %r" % (readme, SECTION))
    return rows


def stated(name):
    """The row of README's table for the example named (its file name,
    e.g. "local-cnn.json", or its repository path)."""
    rows = table()
    hits = [r for p, r in rows.items() if p == name or os.path.basename(p) == name]
    if len(hits) != 1:
        raise AssertionError("README.md's example table has %d rows for %s"
                             % (len(hits), name))
    return hits[0]


def final_lines(out):
    """Every final: line's key=value pairs, in order."""
    return [dict(p.split("=", 1) for p in line.split("final:", 1)[1].split() if "=" in p)
            for line in out.splitlines() if "final:" in line]


def as_shipped(src, dst, data_dir=None, epochs=None, max_steps=None):
    """Writes the example spec src to dst with the cluster on free loopback
    ports (distinct hosts of src become 127.0.0.1, 127.0.0.2, ... in
    order), and job.data_dir replaced when data_dir is given; asserts that
    nothing else differs. epochs and max_steps (make asan's shorter runs
    alone) replace job.epochs and set job.max_steps. Returns the spec
    written."""
    with open(src) as f:
        shipped = json.load(f)
    spec = copy.deepcopy(shipped)
    addrs = spec["cluster"]["ps"] + spec["cluster"]["worker"]
    ports = h.free_ports(len(addrs))
    hosts = {}
    for a in addrs:
        hosts.setdefault(a.rsplit(":", 1)[0], "127.0.0.%d" % (len(hosts) + 1))
    it = iter(ports)
    for kind in ("ps", "worker"):
        spec["cluster"][kind] = ["%s:%d" % (hosts[a.rsplit(":", 1)[0]], next(it))
                                 for a in spec["cluster"][kind]]
    if data_dir is not None:
        spec["job"]["data_dir"] = data_dir
    if epochs is not None:
        spec["job"]["epochs"] = epochs
    if max_steps is not None:
        spec["job"]["max_steps"] = max_steps
    # Nothing but the addresses and the data's place changed.
    a, b = copy.deepcopy(shipped), copy.deepcopy(spec)
    for s in (a, b):
        s.pop("cluster")
        if data_dir is not None:
            s["job"].pop("data_dir")
        if epochs is not None:
            s["job"].pop("epochs")
        if max_steps is not None:
            s["job"].pop("max_steps", None)
    if a != b:
        raise AssertionError("%s: as_shipped changed more than the addresses, data_dir "
                             "and epochs" % src)
    with open(dst, "w") as f:
        json.dump(spec, f, indent=2)
    return spec


def build_options():
    out = subprocess.run(["meson", "introspect", "--buildoptions", h.BUILD],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    return {o["name"]: o["value"] for o in json.loads(out)}


class Installed:
    """One `meson install --destdir` of the build, shared by the tests."""

    tmp = None

    @classmethod
    def get(cls):
        if cls.tmp is None:
            tmp = tempfile.TemporaryDirectory(prefix="psd-test-examples-")
            r = subprocess.run(["meson", "install", "-C", h.BUILD, "--no-rebuild", "--quiet",
                                "--destdir", tmp.name],
                               capture_output=True, text=True, timeout=120)
            if r.returncode != 0:
                tmp.cleanup()
                raise AssertionError("meson install failed (%d):\n%s%s"
                                     % (r.returncode, r.stdout, r.stderr))
            o = build_options()
            prefix = o["prefix"]
            cls.tmp = tmp
            cls.staged = lambda path: tmp.name + path
            cls.examples = cls.staged(os.path.join(prefix, o["datadir"], "psd", "examples"))
            cls.bindir = cls.staged(os.path.join(prefix, o["bindir"]))
            cls.python = glob.glob(cls.staged(os.path.join(prefix, "lib", "python3*",
                                                           "*-packages")))
        return cls


def tearDownModule():
    if Installed.tmp is not None:
        Installed.tmp.cleanup()


class CoverageTest(unittest.TestCase):
    """The table covers every example, and each is run by a test that
    reads its figure from the table."""

    def shipped(self):
        pats = ["deploy/examples/*.json", "deploy/examples/c/*.c", "deploy/slurm/*.json"]
        return sorted(os.path.relpath(p, SRC)
                      for pat in pats for p in glob.glob(os.path.join(SRC, pat)))

    def integration_tests(self):
        with open(os.path.join(SRC, "tests", "meson.build")) as f:
            text = f.read()
        names = set(re.findall(r"^\s*'(\w+)': \d+,", text, re.M))
        names |= set(n[len("integration-"):] for n in
                     re.findall(r"test\('(integration-\w+)'", text))
        return names

    def test_every_example_has_a_row(self):
        rows = table()
        self.assertEqual(sorted(rows), self.shipped(),
                         "README.md's example table and the shipped examples differ")

    def test_every_row_is_run_by_a_test_that_reads_its_figure(self):
        known = self.integration_tests()
        for path, row in sorted(table().items()):
            self.assertTrue(row.tests, "%s: README.md names no test that runs it" % path)
            name = os.path.basename(path)
            for t in row.tests:
                short = t[len("integration-"):]
                self.assertIn(short, known, "%s: %s is not in tests/meson.build" % (path, t))
                with open(os.path.join(SRC, "tests", "integration",
                                       "test_%s.py" % short)) as f:
                    text = f.read()
                # A call with the example as its argument (stated("x.json"),
                # run_example("x.json"), ...), and README's figure read.
                self.assertTrue(re.search(r'\w\("%s"' % re.escape(name), text),
                                "%s runs no %s" % (t, name))
                self.assertTrue(re.search(r"\bstated\(", text),
                                "%s does not read README's figure" % t)

    def test_parser_refuses_what_it_cannot_read(self):
        """A row whose figure is not in the form fails loudly, and a
        missing section too, rather than checking nothing."""
        with tempfile.TemporaryDirectory(prefix="psd-test-") as d:
            p = os.path.join(d, "README.md")
            with open(p, "w") as f:
                f.write("%s\n\n| [`x.json`](deploy/examples/x.json) | y | about 0.9 | "
                        "`integration-train` |\n" % SECTION)
            with self.assertRaisesRegex(AssertionError, "about 0.9"):
                table(p)
            with open(p, "w") as f:
                f.write("# nothing\n")
            with self.assertRaisesRegex(AssertionError, "no section"):
                table(p)


class InstallTest(unittest.TestCase):
    def test_every_example_file_is_installed(self):
        i = Installed.get()
        want = []
        root = os.path.join(SRC, "deploy", "examples")
        for d, dirs, files in os.walk(root):
            dirs[:] = [x for x in dirs if x != "__pycache__"]
            want += [os.path.relpath(os.path.join(d, f), root) for f in files
                     if not f.endswith(".pyc")]
        for rel in sorted(want):
            p = os.path.join(i.examples, rel)
            self.assertTrue(os.path.isfile(p), "not installed: share/psd/examples/" + rel)
            self.assertTrue(filecmp.cmp(p, os.path.join(root, rel), shallow=False), rel)
        for f in glob.glob(os.path.join(SRC, "deploy", "slurm", "*.json")):
            p = os.path.join(i.examples, os.path.basename(f))
            self.assertTrue(os.path.isfile(p), "not installed: " + p)


@unittest.skipUnless(os.path.isdir(DATA), "dataset-fashion-mnist is not installed")
class InstalledRunTest(h.ProcTest):
    """Examples run from the installed tree, as a user who installed psd
    runs them: `pslaunch /usr/local/share/psd/examples/X.json`."""

    def setUp(self):
        super().setUp()
        self.i = Installed.get()

    def launch(self, name, timeout, env=None, **kw):
        """Runs the installed example name (ports rewritten, in a copy
        beside the installed one, so that paths relative to the spec's
        directory resolve as they would) with the installed pslaunch.
        Returns pslaunch's output and the final lines."""
        src = os.path.join(self.i.examples, name)
        self.assertTrue(os.path.isfile(src), "not installed: share/psd/examples/" + name)
        spec = os.path.join(self.i.examples, "test-" + name)
        as_shipped(src, spec, epochs=1 if SANITIZED else None, **kw)
        self.addCleanup(os.remove, spec)
        e = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        e.update(env or {})
        r = subprocess.run([os.path.join(self.i.bindir, "pslaunch"), spec],
                           capture_output=True, text=True, timeout=timeout, env=e,
                           cwd=self.d)
        out = r.stdout + r.stderr
        self.assertEqual(r.returncode, 0, out[-4000:])
        finals = final_lines(out)
        self.assertTrue(finals, "no final: line\n" + out[-3000:])
        return out, finals

    def check_dworker(self, name, timeout):
        out, finals = self.launch(name, timeout)
        self.assertIn(" dworker worker:0 ", out)  # dworker ran, not a worker_command
        self.assertEqual(len(finals), 1, out[-2000:])  # worker 0's
        with open(os.path.join(SRC, "deploy", "examples", name)) as f:
            epochs = 1 if SANITIZED else json.load(f)["job"]["epochs"]
        self.assertEqual(finals[0]["epochs"], str(epochs))
        job = h.assert_job_accounting(self, out, epochs, 2)
        acc = finals[0]["test_accuracy"]
        print("\n%s (installed): test_accuracy=%s job wall_s=%s" % (name, acc, job["wall_s"]))
        if not SANITIZED:
            stated(name).check(self, finals[0])
        return out

    def test_local_adam(self):
        self.check_dworker("local-adam.json", 600)

    def test_two_hosts(self):
        """two-hosts.json's hosts 10.0.0.1 and 10.0.0.2 become 127.0.0.1
        and 127.0.0.2, both this host's: one pslaunch starts all four."""
        out = self.check_dworker("two-hosts.json", 600)
        self.assertRegex(out, r"ps:0\s*\| .*ready: listening on 127\.0\.0\.1:")
        self.assertRegex(out, r"ps:1\s*\| .*ready: listening on 127\.0\.0\.2:")

    def check_torch(self, name, timeout):
        if importlib.util.find_spec("torch") is None:
            self.skipTest("python3-torch is not installed")
        if not self.i.python:
            self.skipTest("the psd Python package is not installed (python3-dev missing?)")
        # Where a real install's python3 finds it (/usr/local/lib/python3.X/
        # dist-packages is on Debian's path); nothing of the build tree.
        # Under make asan, 100 steps: PyTorch's own allocations go through
        # the sanitizer's allocator there (it is preloaded for psd's
        # extension), which made one epoch of torch-cnn take 200 s.
        out, finals = self.launch(name, timeout, env={"PYTHONPATH": self.i.python[0]},
                                  max_steps=100 if SANITIZED else None)
        self.assertEqual(sorted(int(f["worker"]) for f in finals), [0, 1], out[-3000:])
        for f in finals:
            print("\n%s (installed): worker %s test_acc=%s train_s=%s"
                  % (name, f["worker"], f["test_acc"], f.get("train_s")))
            if not SANITIZED:
                stated(name).check(self, f, "worker:" + f["worker"])
        self.assertIsNotNone(h.job_line(out), out[-2000:])

    def test_torch_mlp(self):
        self.check_torch("torch-mlp.json", 600)

    def test_torch_cnn(self):
        self.check_torch("torch-cnn.json", 600)


if __name__ == "__main__":
    h.main()
