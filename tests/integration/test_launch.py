#!/usr/bin/python3
"""Integration test for pslaunch (deploy/pslaunch/).

Runs the real pslaunch against fake psd and dworker programs (small shell
scripts written to a temporary directory and passed with --psd/--dworker),
so that it checks the launcher alone: which tasks start, how their output is
prefixed, how the job stops, and the exit codes.

Each fake writes its PID to <tmp>/pid.<task> before anything else, so a test
can tell which tasks started and check afterwards that they are gone. Each
prints "ready <task>" once its SIGTERM trap is set, then waits for the test
to create <tmp>/go (workers finish) or <tmp>/fail.<task> (that task fails).
On SIGTERM it creates <tmp>/term.<task> first, since its output may have
nowhere to go (pslaunch killed).

Usage: test_launch.py BUILD_DIR [unittest args...]   (pslaunch is
BUILD_DIR/deploy/pslaunch). Every wait has a timeout; nothing sleeps to
synchronise: the tests wait for the lines the fakes print.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import unittest

import harness

PSLAUNCH = None  # set from argv[1] in __main__
TIMEOUT = 30  # seconds for any one wait

# $1 --cluster  $2 FILE  $3 --task  $4 ps:I
FAKE_PSD = r"""#!/bin/sh
dir='@DIR@'
task=$4
echo $$ > "$dir/pid.$task"
if [ -n "$FAKE_PS_IGNORE_TERM" ]; then
  trap '' TERM
else
  trap 'touch "$dir/term.$task"; echo "$task got TERM"; exit 0' TERM
fi
echo "ready $task nargs=$#"
echo "$task says hello on stderr" >&2
while :; do
  # The test creates this file to make the task fail.
  if [ -e "$dir/fail.$task" ]; then
    echo "$task giving up" >&2
    exit 1
  fi
  sleep 0.05
done
"""

# $1 --cluster  $2 FILE  $3 --task  $4 worker:I  $5... what follows "--"
FAKE_DWORKER = r"""#!/bin/sh
dir='@DIR@'
task=$4
echo $$ > "$dir/pid.$task"
shift 4
echo "start $task extra: $*"
trap 'touch "$dir/term.$task"; echo "$task got TERM"; exit 0' TERM
echo "ready $task"
# The test says when to go on: "$dir/go" to finish, "$dir/fail.$task" to fail.
while [ ! -e "$dir/go" ]; do
  if [ -e "$dir/fail.$task" ]; then
    echo "$task failing"
    exit 3
  fi
  sleep 0.05
done
i=0
while [ $i -lt ${FAKE_WORKER_LINES:-3} ]; do
  echo "$task line $i $FAKE_PAD"
  i=$((i + 1))
done
echo "$task on stderr" >&2
printf '%s' "$task last words without newline"
exit 0
"""

PREFIX = re.compile(r"^((?:ps|serve|worker):\d+) *\| (.*)$")


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class Launch:
    """One pslaunch run, its stdout and stderr collected line by line."""

    def __init__(self, args, env, cwd):
        self.proc = subprocess.Popen(
            [PSLAUNCH] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=env, cwd=cwd, text=True, errors="replace")
        self.lines = {"out": [], "err": []}
        self.cond = threading.Condition()
        self.readers = [
            threading.Thread(target=self._read, args=(self.proc.stdout, "out"),
                             daemon=True),
            threading.Thread(target=self._read, args=(self.proc.stderr, "err"),
                             daemon=True),
        ]
        for t in self.readers:
            t.start()

    def _read(self, f, which):
        for line in f:
            with self.cond:
                self.lines[which].append(line.rstrip("\n"))
                self.cond.notify_all()

    def wait_for(self, which, regex, count=1, timeout=TIMEOUT):
        """Waits until count lines of stream `which` match regex."""
        rx = re.compile(regex)

        def enough():
            return sum(1 for l in self.lines[which] if rx.search(l)) >= count

        with self.cond:
            if not self.cond.wait_for(enough, timeout):
                raise AssertionError(
                    "timed out waiting for %r on std%s\n%s" %
                    (regex, which, self.dump()))

    def finish(self, timeout=TIMEOUT):
        """Waits for pslaunch to exit; returns its exit code."""
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(TIMEOUT)
            raise AssertionError("pslaunch did not exit within %d s\n%s" %
                                 (timeout, self.dump()))
        for t in self.readers:
            t.join(TIMEOUT)
        self.proc.stdout.close()
        self.proc.stderr.close()
        return rc

    @property
    def out(self):
        return "\n".join(self.lines["out"])

    @property
    def err(self):
        return "\n".join(self.lines["err"])

    def dump(self):
        return "--- stdout:\n%s\n--- stderr:\n%s" % (self.out, self.err)


class LaunchTest(unittest.TestCase):

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="test-launch-")
        self.psd = self._script("fake-psd", FAKE_PSD)
        self.dworker = self._script("fake-dworker", FAKE_DWORKER)
        self.runs = []

    def tearDown(self):
        for run in self.runs:
            if run.proc.poll() is None:
                run.proc.kill()
                run.proc.wait(TIMEOUT)
        # A failed test may leave fakes behind: end them, by their own PIDs.
        for task, pid in self.pids().items():
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.dir, ignore_errors=True)

    def _script(self, name, text):
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            f.write(text.replace("@DIR@", self.dir))
        os.chmod(path, 0o755)
        return path

    def spec(self, ps=None, worker=None, text=None, name="cluster.json"):
        """Writes a cluster spec; by default 2 ps and 2 workers on loopback."""
        if text is None:
            if ps is None or worker is None:
                ports = harness.free_ports(4)
                ps = ps if ps is not None else [
                    "127.0.0.1:%d" % p for p in ports[:2]]
                worker = worker if worker is not None else [
                    "127.0.0.1:%d" % p for p in ports[2:]]
            text = json.dumps({"cluster": {"ps": ps, "worker": worker},
                               "job": {"max_steps": 10}})
        path = os.path.join(self.dir, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def launch(self, args, fakes=True, **fake_env):
        env = dict(os.environ)
        env.pop("TF_CONFIG", None)
        env.update(fake_env)
        if fakes:
            args = ["--psd", self.psd, "--dworker", self.dworker] + args
        run = Launch(args, env, self.dir)
        self.runs.append(run)
        return run

    def pids(self):
        """{task name: PID} of every fake that started."""
        out = {}
        for name in os.listdir(self.dir):
            if name.startswith("pid."):
                with open(os.path.join(self.dir, name)) as f:
                    text = f.read().strip()
                if text:
                    out[name[4:]] = int(text)
        return out

    def assert_all_gone(self, run, expect):
        pids = self.pids()
        self.assertEqual(sorted(pids), sorted(expect), run.dump())
        for task, pid in pids.items():
            self.assertFalse(pid_alive(pid),
                             "%s (pid %d) still running\n%s" %
                             (task, pid, run.dump()))

    def assert_prefixed(self, run):
        """Every child line carries its task's aligned prefix, and holds only
        that task's text (lines never interleave)."""
        width = None
        for line in run.lines["out"]:
            m = PREFIX.match(line)
            self.assertIsNotNone(m, "unprefixed stdout line %r" % line)
            self.assertIn(m.group(1), m.group(2), "mixed line %r" % line)
            bar = line.index("|")
            width = bar if width is None else width
            self.assertEqual(bar, width, "misaligned line %r" % line)
        for line in run.lines["err"]:
            if not line.startswith("pslaunch: "):
                self.assertIsNotNone(PREFIX.match(line),
                                     "unprefixed stderr line %r" % line)

    ALL = ["ps:0", "ps:1", "worker:0", "worker:1"]

    def test_workers_finish(self):
        spec = self.spec()
        run = self.launch([spec, "--", "--max-steps", "100"])
        self.wait_ready(run, self.ALL)
        self.touch("go")
        rc = run.finish()
        self.assertEqual(rc, 0, run.dump())
        self.assert_prefixed(run)
        out = run.lines["out"]
        self.assertIn("ps:0     | ready ps:0 nargs=4", out)
        self.assertIn("ps:1     | ready ps:1 nargs=4", out)
        self.assertIn("worker:0 | start worker:0 extra: --max-steps 100", out)
        self.assertIn("worker:1 | worker:1 line 2 ", out)
        # A last line without its newline is still printed whole.
        self.assertIn("worker:1 | worker:1 last words without newline", out)
        self.assertIn("ps:0     | ps:0 says hello on stderr", run.lines["err"])
        self.assertIn("worker:0 | worker:0 on stderr", run.lines["err"])
        # The ps tasks were stopped with SIGTERM once the workers were done.
        self.assertIn("ps:0     | ps:0 got TERM", out)
        self.assertIn("ps:1     | ps:1 got TERM", out)
        self.assertIn("pslaunch: all 2 local workers finished", run.err)
        self.assert_all_gone(run, self.ALL)

    def serve_spec(self):
        """2 ps, 2 serving tasks (cluster.serve) and 2 workers on loopback."""
        ports = ["127.0.0.1:%d" % p for p in harness.free_ports(6)]
        return self.spec(text=json.dumps({
            "cluster": {"ps": ports[:2], "serve": ports[2:4],
                        "worker": ports[4:]},
            "job": {"max_steps": 10}}))

    SERVE = ALL + ["serve:0", "serve:1"]

    def test_serving_tasks_start_and_stop_with_the_job(self):
        run = self.launch([self.serve_spec()])
        self.wait_ready(run, self.SERVE)
        out = run.lines["out"]
        # psd --cluster FILE --task serve:J, prefixed as its name.
        self.assertIn("serve:0  | ready serve:0 nargs=4", out)
        self.assertIn("serve:1  | ready serve:1 nargs=4", out)
        self.touch("go")
        rc = run.finish()
        self.assertEqual(rc, 0, run.dump())
        self.assert_prefixed(run)
        self.assertIn("serve:0  | serve:0 got TERM", run.lines["out"])
        self.assertIn("serve:1  | serve:1 got TERM", run.lines["out"])
        self.assertIn("pslaunch: all 2 workers finished; stopping the ps and "
                      "serving tasks", run.lines["err"])
        self.assert_all_gone(run, self.SERVE)

    def test_a_serving_task_that_fails_stops_the_job(self):
        run = self.launch([self.serve_spec()])
        self.wait_ready(run, self.SERVE)
        self.touch("fail.serve:1")
        rc = run.finish()
        self.assertEqual(rc, 1, run.dump())
        self.assertIn("pslaunch: serve:1 failed (exit 1)", run.lines["err"])
        self.assert_all_gone(run, self.SERVE)

    def test_only_ps_starts_the_serving_tasks_too(self):
        run = self.launch(["--only", "ps", self.serve_spec()])
        self.wait_ready(run, ["ps:0", "ps:1", "serve:0", "serve:1"])
        self.assertNotIn("worker:0", self.pids())

    def test_lines_never_interleave(self):
        spec = self.spec()
        self.touch("go")
        run = self.launch([spec], FAKE_WORKER_LINES="300",
                          FAKE_PAD="x" * 3000)
        rc = run.finish()
        self.assertEqual(rc, 0, run.dump())
        self.assert_prefixed(run)
        for w in ("worker:0", "worker:1"):
            lines = [l for l in run.lines["out"]
                     if l.startswith(w + " | %s line " % w)]
            self.assertEqual(len(lines), 300, w)
            for l in lines:
                self.assertTrue(l.endswith(" " + "x" * 3000), l[:80])

    def test_worker_fails(self):
        spec = self.spec()
        run = self.launch([spec])
        self.wait_ready(run, self.ALL)
        self.touch("fail.worker:1")
        rc = run.finish()
        self.assertEqual(rc, 1, run.dump())
        self.assertIn("pslaunch: worker:1 failed (exit 3)", run.lines["err"])
        self.assertIn("worker:1 | worker:1 failing", run.lines["out"])
        self.assertIn("worker:0 | worker:0 got TERM", run.lines["out"])
        self.assert_all_gone(run, self.ALL)

    def touch(self, name):
        open(os.path.join(self.dir, name), "w").close()

    def wait_ready(self, run, tasks):
        for task in tasks:
            run.wait_for("out", r"^%s +\| ready %s" % (task, task))

    def test_ps_exits_early(self):
        spec = self.spec()
        run = self.launch([spec])
        self.wait_ready(run, self.ALL)
        self.touch("fail.ps:1")
        rc = run.finish()
        self.assertEqual(rc, 1, run.dump())
        self.assertIn("pslaunch: ps:1 failed (exit 1)", run.lines["err"])
        self.assertIn("ps:1     | ps:1 giving up", run.lines["err"])
        self.assert_all_gone(run, self.ALL)

    def test_sigkill_after_stop_timeout(self):
        spec = self.spec()
        run = self.launch(["--stop-timeout", "0.5", spec],
                          FAKE_PS_IGNORE_TERM="1")
        self.wait_ready(run, self.ALL)
        self.touch("go")
        rc = run.finish()
        self.assertEqual(rc, 0, run.dump())
        self.assertRegex(run.err, r"ps:0 \(pid \d+\) still running; "
                         r"sending SIGKILL")
        self.assertRegex(run.err, r"ps:1 .*killed by signal 9")
        self.assert_all_gone(run, self.ALL)

    def _interrupt(self, sig, code):
        spec = self.spec()
        run = self.launch([spec])
        self.wait_ready(run, self.ALL)
        pids = self.pids()
        self.assertEqual(sorted(pids), sorted(self.ALL))
        run.proc.send_signal(sig)
        rc = run.finish()
        self.assertEqual(rc, code, run.dump())
        for task in self.ALL:
            self.assertRegex(run.out, r"%s +\| %s got TERM" % (task, task))
        self.assert_all_gone(run, self.ALL)

    def test_sigint(self):
        self._interrupt(signal.SIGINT, 130)

    def test_sigterm(self):
        self._interrupt(signal.SIGTERM, 143)

    def test_sigkill_of_pslaunch_stops_every_task(self):
        # pslaunch can do nothing once SIGKILLed: each task asked the kernel
        # for SIGTERM when pslaunch dies. This test adopts the orphans.
        harness.set_subreaper(True)
        self.addCleanup(harness.set_subreaper, False)
        spec = self.spec()
        run = self.launch([spec])
        self.wait_ready(run, self.ALL)
        pids = self.pids()
        self.assertEqual(sorted(pids), sorted(self.ALL))
        run.proc.kill()
        self.assertEqual(run.finish(), -signal.SIGKILL, run.dump())
        for task, pid in pids.items():
            self.assertIsNotNone(harness.wait_pid(pid, TIMEOUT),
                                 "%s (pid %d) still runs" % (task, pid))
            self.assertTrue(os.path.exists(os.path.join(self.dir,
                                                        "term." + task)),
                            "%s got no SIGTERM" % task)

    def test_port_in_use(self):
        ports = harness.free_ports(3)
        with socket.socket() as held:
            held.bind(("127.0.0.1", ports[0]))
            held.listen()
            spec = self.spec(ps=["127.0.0.1:%d" % ports[1],
                                 "127.0.0.1:%d" % ports[0]],
                             worker=["127.0.0.1:%d" % ports[2]])
            run = self.launch([spec])
            rc = run.finish()
        self.assertEqual(rc, 1, run.dump())
        self.assertIn("pslaunch: ps:1: cannot listen on 127.0.0.1:%d: "
                      "Address already in use" % ports[0], run.lines["err"])
        self.assertEqual(self.pids(), {}, "a task was started")
        self.assertEqual(run.lines["out"], [])

    def test_bad_spec(self):
        spec = self.spec(text=json.dumps(
            {"cluster": {"ps": ["127.0.0.1:7100", "127.0.0.1"],
                         "worker": ["127.0.0.1:7200"]}}), name="bad.json")
        run = self.launch([spec])
        rc = run.finish()
        self.assertEqual(rc, 2, run.dump())
        self.assertIn("cluster.ps[1]", run.err)
        self.assertIn("bad.json", run.err)
        self.assertEqual(self.pids(), {})

    def test_spec_syntax_error(self):
        spec = self.spec(text='{"cluster": {"ps": [}', name="broken.json")
        run = self.launch([spec])
        self.assertEqual(run.finish(), 2, run.dump())
        self.assertIn("broken.json", run.err)

    def test_missing_spec_file(self):
        run = self.launch([os.path.join(self.dir, "nowhere.json")])
        self.assertEqual(run.finish(), 2, run.dump())
        self.assertIn("nowhere.json", run.err)

    def test_no_local_tasks(self):
        host = harness.foreign_host()
        spec = self.spec(ps=["%s:7100" % host], worker=["%s:7200" % host])
        run = self.launch([spec])
        self.assertEqual(run.finish(), 2, run.dump())
        self.assertIn("no ps or worker task", run.err)
        self.assertEqual(self.pids(), {})

    def test_missing_binary(self):
        spec = self.spec()
        missing = os.path.join(self.dir, "no-such-dworker")
        run = self.launch(["--psd", self.psd, "--dworker", missing, spec],
                          fakes=False)
        self.assertEqual(run.finish(), 2, run.dump())
        self.assertIn(missing, run.err)
        self.assertEqual(self.pids(), {})

    def test_only_worker(self):
        spec = self.spec()
        # psd is not needed, so a missing one is no error.
        run = self.launch(["--only", "worker", "--psd", "/nonexistent/psd",
                           "--dworker", self.dworker, spec], fakes=False)
        self.wait_ready(run, ["worker:0", "worker:1"])
        self.touch("go")
        self.assertEqual(run.finish(), 0, run.dump())
        self.assert_all_gone(run, ["worker:0", "worker:1"])
        # Without ps tasks the prefixes are as wide as "worker:N".
        self.assertIn("worker:0 | worker:0 line 0 ", run.lines["out"])

    def test_usage_errors(self):
        for args in ([], ["a.json", "b.json"], ["--only", "chief", "a.json"],
                     ["--stop-timeout", "soon", "a.json"], ["--bogus"]):
            run = self.launch(args, fakes=False)
            self.assertEqual(run.finish(), 2, "%r\n%s" % (args, run.dump()))
            self.assertTrue(run.err.startswith("pslaunch: "), run.err)

    def test_help(self):
        run = self.launch(["--help"], fakes=False)
        self.assertEqual(run.finish(), 0, run.dump())
        self.assertIn("Usage: pslaunch", run.out)
        self.assertIn("Exit status:", run.out)
        self.assertIn("--stop-timeout", run.out)
        # What really happens when pslaunch dies, and when workers run
        # elsewhere.
        self.assertRegex(run.out, r"If pslaunch itself dies, even\s+by "
                         r"SIGKILL, the kernel sends every task still running"
                         r"\s+SIGTERM")
        self.assertNotIn("tasks keep running", run.out)
        self.assertRegex(run.out, r"waiting for worker:1 \(training\) to "
                         r"finish; Ctrl-C stops the\s+shards now")


if __name__ == "__main__":
    if len(sys.argv) >= 2 and not sys.argv[1].startswith("-"):
        PSLAUNCH = os.path.join(os.path.abspath(sys.argv[1]), "deploy",
                                "pslaunch")
        if not os.access(PSLAUNCH, os.X_OK):
            sys.stderr.write("%s: not built\n" % PSLAUNCH)
            sys.exit(1)
    harness.main()
