#!/usr/bin/python3
"""Integration test for pslaunch's job.worker_command (deploy/pslaunch/,
command.c): the real pslaunch and psd on loopback, with workers that are a
small Python script the test writes instead of dworker.

The script records what it was started with (TF_CONFIG, PSD_SPEC, PSD_TASK,
PYTHONPATH, its working directory and arguments) in
<spec dir>/seen.<task>.json and prints one line on stdout and one on stderr;
it exits 3 when its task is named in the environment variable FAIL_TASK,
else 0. The tests check what each worker saw, that pslaunch passed their
output on with the task's prefix, and pslaunch's exit code and messages.

The spec lives in a directory of its own (<tmp>/job) and pslaunch runs from
another (<tmp>), so that the command's working directory, and a relative
program path, are seen to be the spec file's directory.

ExportTest runs pslaunch --export on a worker that declares two tables
(one named "a/b") and a variable, pushes to them and writes what it then
pulled: the files in DIR hold those values, and a second run into the same
DIR is refused before anything starts, leaving the files as they were.

Usage: test_launch_command.py BUILD_DIR [unittest args...]"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import harness as h

TIMEOUT = 30  # seconds for any one pslaunch run

WORKER = r"""#!/usr/bin/python3
import json, os, sys
task = os.environ.get("PSD_TASK", "?")
seen = {
    "TF_CONFIG": json.loads(os.environ["TF_CONFIG"]),
    "PSD_SPEC": os.environ.get("PSD_SPEC"),
    "PSD_TASK": task,
    "PYTHONPATH": os.environ.get("PYTHONPATH"),
    "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE"),
    "cwd": os.getcwd(),
    "argv": sys.argv[1:],
}
with open(os.path.join(os.path.dirname(os.environ["PSD_SPEC"]),
                       "seen.%s.json" % task), "w") as f:
    json.dump(seen, f)
print("hello from %s" % task, flush=True)
print("%s on stderr" % task, file=sys.stderr, flush=True)
sys.exit(3 if os.environ.get("FAIL_TASK") == task else 0)
"""


class WorkerCommandTest(unittest.TestCase):

    def setUp(self):
        self.d = os.path.realpath(tempfile.mkdtemp(prefix="test-launch-cmd-"))
        self.job = os.path.join(self.d, "job")
        os.mkdir(self.job)
        self.script = os.path.join(self.job, "worker.py")
        with open(self.script, "w") as f:
            f.write(WORKER)
        os.chmod(self.script, 0o755)
        self.psd = h.build_path("ps-server", "psd")

    def tearDown(self):
        shutil.rmtree(self.d, ignore_errors=True)

    def spec(self, command, nps=1, nworker=2):
        """Writes <tmp>/job/spec.json with job.worker_command; returns its
        cluster (addresses as written)."""
        ports = h.free_ports(nps + nworker)
        cluster = {"ps": ["127.0.0.1:%d" % p for p in ports[:nps]],
                   # One written as a name, to see it passed on as written.
                   "worker": ["127.0.0.1:%d" % ports[nps]] +
                   ["localhost:%d" % p for p in ports[nps + 1:]]}
        with open(self.spec_path, "w") as f:
            json.dump({"cluster": cluster,
                       "job": {"name": "launch-cmd-%d" % os.getpid(),
                               "worker_command": command}}, f)
        return cluster

    @property
    def spec_path(self):
        return os.path.join(self.job, "spec.json")

    def launch(self, args, pslaunch=None, env=None):
        """Runs pslaunch from <tmp> to the end; returns the CompletedProcess.
        The spec is named relative to <tmp> (job/spec.json)."""
        e = dict(os.environ)
        e.pop("TF_CONFIG", None)
        e.pop("FAIL_TASK", None)
        e.setdefault("GRPC_DNS_RESOLVER", "native")
        e.update(env or {})
        argv = [pslaunch or h.build_path("deploy", "pslaunch")] + args
        try:
            return subprocess.run(argv, cwd=self.d, env=e, capture_output=True,
                                  text=True, timeout=TIMEOUT,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as x:
            raise AssertionError("pslaunch ran past %d s\n%s\n%s"
                                 % (TIMEOUT, x.stdout, x.stderr))

    def seen(self, task):
        path = os.path.join(self.job, "seen.%s.json" % task)
        self.assertTrue(os.path.exists(path), "%s did not run" % task)
        with open(path) as f:
            return json.load(f)

    def dump(self, r):
        return "--- rc %s\n--- stdout:\n%s\n--- stderr:\n%s" % (
            r.returncode, r.stdout, r.stderr)

    def test_under_slurm_the_derived_spec_is_a_file(self):
        """--cluster slurm:FILE: the spec exists only as derived text, so
        pslaunch writes it to a file of its own for PSD_SPEC (removed at
        the end), and the command runs in FILE's directory."""
        script = os.path.join(self.job, "copy.py")
        with open(script, "w") as f:
            f.write("import os, shutil\n"
                    "shutil.copy(os.environ['PSD_SPEC'], 'derived.json')\n"
                    "open('psd_spec.txt', 'w').write(os.environ['PSD_SPEC'])\n")
        with open(os.path.join(self.job, "job.json"), "w") as f:
            json.dump({"job": {"name": "slurm-cmd-%d" % os.getpid(),
                               "worker_command": ["/usr/bin/python3",
                                                  "copy.py"]},
                       "slurm": {"ps": 1, "port": h.free_ports(1)[0]}}, f)
        env = {"SLURM_JOB_NODELIST": "localhost", "SLURM_TASKS_PER_NODE": "2",
               "SLURM_PROCID": "1"}  # task 1 of 2, ps 1: worker:0
        r = self.launch(["--cluster", "slurm:job/job.json"], env=env)
        self.assertEqual(r.returncode, 0, self.dump(r))
        with open(os.path.join(self.job, "derived.json")) as f:
            derived = json.load(f)
        self.assertEqual(derived["task"], {"type": "worker", "index": 0})
        self.assertEqual(len(derived["cluster"]["ps"]), 1)
        self.assertEqual(derived["job"]["worker_command"][1], "copy.py")
        with open(os.path.join(self.job, "psd_spec.txt")) as f:
            path = f.read()
        self.assertFalse(os.path.exists(path), "%s was left behind" % path)

    def test_the_command_gets_this_cpus_blas_kernels(self):
        """OPENBLAS_CORETYPE as psd's programs pick it from CPUID (PyTorch's
        OpenBLAS falls back to generic kernels here without it): set when
        unset or narrower, kept when as wide, PSD_OPENBLAS_CORETYPE wins."""
        best = h.blas_core()
        self.spec(["/usr/bin/python3", "worker.py"])
        for env, want in (({"OPENBLAS_CORETYPE": ""}, best),
                          ({"OPENBLAS_CORETYPE": "Prescott"}, best or "Prescott"),
                          ({"OPENBLAS_CORETYPE": "Cooperlake"}, "Cooperlake"),
                          ({"PSD_OPENBLAS_CORETYPE": "Haswell",
                            "OPENBLAS_CORETYPE": "SkylakeX"}, "Haswell")):
            r = self.launch(["--psd", self.psd, "job/spec.json"], env=env)
            self.assertEqual(r.returncode, 0, self.dump(r))
            got = self.seen("worker:1")["OPENBLAS_CORETYPE"]
            self.assertEqual(got or None, want, env)

    def test_each_worker_runs_the_command(self):
        cluster = self.spec(["/usr/bin/python3", "worker.py", "two words"],
                            nps=2)
        r = self.launch(["--psd", self.psd, "job/spec.json", "--", "--x"],
                        env={"PYTHONPATH": "/opt/mine"})
        self.assertEqual(r.returncode, 0, self.dump(r))
        for i in (0, 1):
            task = "worker:%d" % i
            seen = self.seen(task)
            self.assertEqual(seen["TF_CONFIG"], {
                "cluster": cluster,
                "task": {"type": "worker", "index": i}}, task)
            self.assertEqual(seen["PSD_SPEC"], self.spec_path)
            self.assertEqual(seen["PSD_TASK"], task)
            self.assertEqual(seen["cwd"], self.job)
            self.assertEqual(seen["argv"], ["two words", "--x"])
            # From the build tree: its worker/python first, when built.
            python = h.build_path("worker", "python")
            self.assertEqual(seen["PYTHONPATH"],
                             python + ":/opt/mine" if os.path.isdir(python)
                             else "/opt/mine")
            self.assertIn("%s | hello from %s" % (task, task),
                          r.stdout.splitlines())
            self.assertIn("%s | %s on stderr" % (task, task),
                          r.stderr.splitlines())
            self.assertRegex(r.stderr, r"pslaunch:   %s +pid \d+ .* exit 0\n"
                             % task)
        # The shards ran (psd itself) and were stopped once both were done
        # (maybe before psd handles SIGTERM: it may have just started).
        self.assertIn("pslaunch: all 2 workers finished; stopping the ps "
                      "tasks", r.stderr)
        for ps in ("ps:0", "ps:1"):
            self.assertRegex(r.stderr, r"pslaunch:   %s +pid \d+ .*, after "
                             r"SIGTERM\n" % ps)
        self.assertIn("pslaunch: all 2 local workers finished", r.stderr)

    def test_program_path_relative_to_spec_and_in_path(self):
        # A relative path with a slash: the spec file's directory, not
        # pslaunch's working directory.
        self.spec(["./worker.py", "rel"])
        r = self.launch(["--psd", self.psd, "job/spec.json"])
        self.assertEqual(r.returncode, 0, self.dump(r))
        for task in ("worker:0", "worker:1"):
            self.assertEqual(self.seen(task)["argv"], ["rel"])
            os.unlink(os.path.join(self.job, "seen.%s.json" % task))
        # A bare name: looked up in PATH.
        bindir = os.path.join(self.d, "bin")
        os.mkdir(bindir)
        shutil.copy(self.script, os.path.join(bindir, "psd-test-worker"))
        self.spec(["psd-test-worker", "path"])
        r = self.launch(["--psd", self.psd, "job/spec.json"],
                        env={"PATH": bindir + ":" + os.environ["PATH"]})
        self.assertEqual(r.returncode, 0, self.dump(r))
        for task in ("worker:0", "worker:1"):
            seen = self.seen(task)
            self.assertEqual(seen["argv"], ["path"])
            self.assertEqual(seen["cwd"], self.job)

    def test_failing_command_fails_the_job(self):
        self.spec(["/usr/bin/python3", "worker.py"])
        r = self.launch(["--psd", self.psd, "job/spec.json"],
                        env={"FAIL_TASK": "worker:1"})
        self.assertEqual(r.returncode, 1, self.dump(r))
        self.assertIn("pslaunch: worker:1 failed (exit 3)",
                      r.stderr.splitlines())
        self.assertIn("pslaunch: stopped because worker:1 failed",
                      r.stderr.splitlines())
        self.assertEqual(self.seen("worker:1")["PSD_TASK"], "worker:1")

    def test_program_not_found(self):
        self.spec(["./nowhere.py"])
        r = self.launch(["--psd", self.psd, "job/spec.json"])
        self.assertEqual(r.returncode, 2, self.dump(r))
        self.assertIn("pslaunch: job/spec.json: job.worker_command[0]: "
                      "./nowhere.py (%s/./nowhere.py): No such file or "
                      "directory" % self.job, r.stderr.splitlines())
        self.assertNotIn("started", r.stderr)
        self.spec(["no-such-psd-worker"])
        r = self.launch(["--psd", self.psd, "job/spec.json"])
        self.assertEqual(r.returncode, 2, self.dump(r))
        self.assertIn("pslaunch: job/spec.json: job.worker_command[0]: "
                      "no-such-psd-worker: not found in PATH",
                      r.stderr.splitlines())
        self.assertNotIn("started", r.stderr)

    def test_refusals(self):
        # --dworker names what the spec replaces: refused, nothing started.
        self.spec(["/usr/bin/python3", "worker.py"])
        r = self.launch(["--psd", self.psd, "--dworker",
                         h.build_path("worker", "dworker"), "job/spec.json"])
        self.assertEqual(r.returncode, 2, self.dump(r))
        self.assertIn("job.worker_command, which the workers run instead of "
                      "dworker", r.stderr)
        self.assertNotIn("started", r.stderr)
        # A mistake in the key is the spec's, with its path.
        self.spec(["/usr/bin/python3", 5])
        r = self.launch(["--psd", self.psd, "job/spec.json"])
        self.assertEqual(r.returncode, 2, self.dump(r))
        self.assertIn("pslaunch: job/spec.json: job.worker_command[1]: 5 is a "
                      "number; expected a string", r.stderr.splitlines())

    def copy_pslaunch(self, rel):
        """A copy of pslaunch at <tmp>/rel (it links no library of the
        build), so that it can be run from a tree laid out by the test."""
        path = os.path.join(self.d, rel)
        os.makedirs(os.path.dirname(path))
        shutil.copy(h.build_path("deploy", "pslaunch"), path)
        return path

    def test_pythonpath_from_a_build_tree(self):
        self.spec(["/usr/bin/python3", "worker.py"])
        # A build tree (meson-info) whose worker/python exists: first.
        tree = os.path.join(self.d, "b")
        copy = self.copy_pslaunch("b/deploy/pslaunch")
        os.makedirs(os.path.join(tree, "meson-info"))
        os.makedirs(os.path.join(tree, "worker", "python"))
        r = self.launch(["--psd", self.psd, "job/spec.json"], pslaunch=copy,
                        env={"PYTHONPATH": "/opt/a:/opt/b"})
        self.assertEqual(r.returncode, 0, self.dump(r))
        self.assertEqual(self.seen("worker:0")["PYTHONPATH"],
                         os.path.join(tree, "worker", "python") +
                         ":/opt/a:/opt/b")
        # With no PYTHONPATH of its own, only that.
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        r = subprocess.run([copy, "--psd", self.psd, "job/spec.json"],
                           cwd=self.d, env=env, capture_output=True,
                           text=True, timeout=TIMEOUT,
                           stdin=subprocess.DEVNULL)
        self.assertEqual(r.returncode, 0, self.dump(r))
        self.assertEqual(self.seen("worker:1")["PYTHONPATH"],
                         os.path.join(tree, "worker", "python"))
        # Not a build tree (no meson-info), though worker/python exists
        # beside it: nothing added.
        inst = self.copy_pslaunch("usr/bin/pslaunch")
        os.makedirs(os.path.join(self.d, "usr", "worker", "python"))
        r = self.launch(["--psd", self.psd, "job/spec.json"], pslaunch=inst,
                        env={"PYTHONPATH": "/opt/a"})
        self.assertEqual(r.returncode, 0, self.dump(r))
        self.assertEqual(self.seen("worker:0")["PYTHONPATH"], "/opt/a")


EXPORT_WORKER = r"""#!/usr/bin/python3
import json, os, sys
import numpy as np, psd
with psd.Client() as c:
    c.declare_table("emb", 4, 100)
    c.declare_table("a/b", 2)
    v = c.declare("w", (3,), init="uniform", init_scale=0.1)
    ids = np.array([1, 5, 77], np.uint64)
    c.push_rows("emb", ids, np.ones((3, 4), np.float32))
    c.push([v], [np.ones(3, np.float32)], examples=1)
    seen = {"emb": c.pull_rows("emb", ids).tolist(), "w": c.pull([v])[0].tolist()}
with open(os.path.join(os.path.dirname(os.environ["PSD_SPEC"]), "pulled.json"), "w") as f:
    json.dump(seen, f)
"""


class ExportTest(unittest.TestCase):
    """pslaunch --export DIR (export.c), with WorkerCommandTest's helpers
    (not its cases)."""

    tearDown = WorkerCommandTest.tearDown
    spec = WorkerCommandTest.spec
    spec_path = WorkerCommandTest.spec_path
    launch = WorkerCommandTest.launch
    dump = WorkerCommandTest.dump

    def setUp(self):
        WorkerCommandTest.setUp(self)
        try:
            import numpy  # noqa: F401
        except ImportError:
            self.skipTest("numpy is not installed (python3-numpy)")
        sys.path.insert(0, h.build_path("worker", "python"))
        with open(self.script, "w") as f:
            f.write(EXPORT_WORKER)

    def test_export_before_the_shards_stop(self):
        import numpy as np
        import psd.export
        self.spec(["./worker.py"], nps=2, nworker=1)
        r = self.launch(["--export", "model", "job/spec.json"])
        self.assertEqual(r.returncode, 0, self.dump(r))
        self.assertIn("exporting 2 tables and the variables to model before the ps tasks "
                      "stop", r.stderr)
        self.assertIn("pslaunch: exported 2 tables and the variables to model", r.stderr)
        self.assertIn("export   | exported table 'emb': 3 rows of dim 4", r.stdout)
        self.assertIn("export    3 of 3 files written to model", r.stderr)
        out = os.path.join(self.d, "model")
        self.assertEqual(sorted(os.listdir(out)), ["dense.safetensors", "tables"])
        self.assertEqual(sorted(os.listdir(os.path.join(out, "tables"))),
                         ["a%2Fb.safetensors", "emb.safetensors"])
        with open(os.path.join(self.job, "pulled.json")) as f:
            pulled = json.load(f)
        emb = psd.export.read_safetensors(os.path.join(out, "tables", "emb.safetensors"))
        self.assertEqual(emb["ids"].tolist(), [1, 5, 77])
        np.testing.assert_array_equal(emb["values"], np.array(pulled["emb"], np.float32))
        dense = psd.export.read_safetensors(os.path.join(out, "dense.safetensors"))
        np.testing.assert_array_equal(dense["w"], np.array(pulled["w"], np.float32))
        ab = psd.export.read_safetensors(os.path.join(out, "tables", "a%2Fb.safetensors"))
        self.assertEqual(ab["values"].shape, (0, 2))

        # Again into the same directory: refused before anything starts,
        # nothing replaced.
        before = {n: os.stat(os.path.join(out, "tables", n)).st_mtime_ns
                  for n in os.listdir(os.path.join(out, "tables"))}
        r = self.launch(["--export", "model", "job/spec.json"])
        self.assertEqual(r.returncode, 2, self.dump(r))
        self.assertIn("pslaunch: --export model: the directory holds", r.stderr)
        self.assertIn("never replaces a file it did not write", r.stderr)
        self.assertNotIn("started", r.stderr)
        self.assertEqual(before, {n: os.stat(os.path.join(out, "tables", n)).st_mtime_ns
                                  for n in os.listdir(os.path.join(out, "tables"))})

    def test_no_export_when_a_worker_fails(self):
        self.spec(["./worker.py"], nps=1, nworker=1)
        with open(self.script, "a") as f:
            f.write("sys.exit(3)\n")
        r = self.launch(["--export", "model", "job/spec.json"])
        self.assertEqual(r.returncode, 1, self.dump(r))
        self.assertIn("worker:0 failed (exit 3)", r.stderr)
        self.assertNotIn("exporting", r.stderr)
        self.assertEqual(os.listdir(os.path.join(self.d, "model")), [])


if __name__ == "__main__":
    h.main()
