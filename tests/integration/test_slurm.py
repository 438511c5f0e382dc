"""psd under Slurm. Without Slurm: `pslaunch --cluster slurm --print-spec`
in recorded environments (the spec it derives, the variable it names when
one is missing). With root and Slurm's packages (slurmctld, slurmd,
slurm-client, munge): a one-node Slurm cluster of the test's own in a
temporary directory (munged as the munge user on a socket of its own,
slurmctld and slurmd on free ports, no cgroups, no accounting), to which
deploy/slurm/psd-job.sbatch is submitted with sbatch: 2 shards and 2
workers train the demo MLP of deploy/slurm/slurm-mlp.json as shipped (its
ports moved to free ones), worker 0 reports at least the test accuracy
README.md's example table states (test_examples.stated), and Slurm says the
job COMPLETED. Then 2 -> 3 shards between two allocations, as
docs/reshard-deploy.md says (PSD_RESHARD=1: psd --reshard in the batch
script before the step). Every daemon it started is stopped by its PID. Run:
/usr/bin/python3 test_slurm.py BUILD_DIR"""
import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import unittest

import harness as h
from test_examples import stated

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
DATA = "/usr/share/datasets/fashion-mnist"
DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "srun")
JOB_DEADLINE_S = 240  # sbatch to COMPLETED, on 2 shared cores


def free_run(n):
    """A port p such that p..p+n-1 are all free now (on every address)."""
    base = h.free_port_run(n, "0.0.0.0")
    if base is None:
        raise AssertionError("no run of %d free ports" % n)
    return base


class PrintSpecTest(unittest.TestCase):
    """pslaunch --cluster slurm --print-spec, in recorded environments."""

    def print_spec(self, env, *args):
        e = {k: v for k, v in os.environ.items()
             if not k.startswith(("SLURM_", "PSD_SLURM_"))}
        e.update(env)
        return subprocess.run([h.build_path("deploy", "pslaunch"), "--cluster"] +
                              list(args) + ["--print-spec"], env=e, text=True,
                              capture_output=True, timeout=30)

    def test_step_spec(self):
        with h.TempDir() as d:
            job = os.path.join(d, "job.json")
            with open(job, "w") as f:
                json.dump({"job": {"name": "sl", "epochs": 1},
                           "slurm": {"ps": 2, "port": 9000}}, f)
            r = self.print_spec({"SLURM_STEP_NODELIST": "node[009-010],gpu5",
                                 "SLURM_STEP_TASKS_PER_NODE": "2(x2),1",
                                 "SLURM_PROCID": "4", "SLURM_NODEID": "2",
                                 "SLURM_LOCALID": "0"}, "slurm:" + job)
            self.assertEqual(r.returncode, 0, r.stderr)
            spec = json.loads(r.stdout)
            self.assertEqual(spec["cluster"], {
                "ps": ["node009:9000", "node009:9001"],
                "worker": ["node010:9000", "node010:9001", "gpu5:9000"]})
            self.assertEqual(spec["task"], {"type": "worker", "index": 2})
            self.assertEqual(spec["job"], {"name": "sl", "epochs": 1})

    def test_missing_variable(self):
        r = self.print_spec({"SLURM_JOB_NODELIST": "a[1-2]", "SLURM_PROCID": "0"},
                            "slurm")
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertEqual(r.stdout, "")
        self.assertIn("pslaunch: SLURM_TASKS_PER_NODE is not set: not inside a "
                      "Slurm job (run under sbatch, salloc or srun)", r.stderr)
        r = self.print_spec({"SLURM_JOB_NODELIST": "a[1-2",
                             "SLURM_TASKS_PER_NODE": "1(x2)",
                             "SLURM_PROCID": "0"}, "slurm")
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("pslaunch: SLURM_JOB_NODELIST=\"a[1-2\": unbalanced '[' "
                      "at character 2", r.stderr)

    def test_psd_and_dworker_read_it_too(self):
        env = {"SLURM_JOB_NODELIST": "a[1-2]", "SLURM_TASKS_PER_NODE": "1(x2)",
               "SLURM_PROCID": "1"}
        e = {k: v for k, v in os.environ.items()
             if not k.startswith(("SLURM_", "PSD_SLURM_"))}
        e.update(env)
        r = subprocess.run([h.build_path("ps-server", "psd"), "--cluster", "slurm"],
                           env=e, text=True, capture_output=True, timeout=30)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("psd: task worker:0 is not a ps task", r.stderr)
        del e["SLURM_PROCID"]
        r = subprocess.run([h.build_path("worker", "dworker"), "--cluster",
                            "slurm"], env=e, text=True, capture_output=True,
                           timeout=30)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("SLURM_PROCID is not set: not a task of a Slurm job",
                      r.stderr)


def wait_until(what, check, timeout):
    """Polls check() every 0.2 s until it returns something true; returns that."""
    return h.until(what, check, timeout, every=0.2)


class SlurmCluster:
    """A one-node Slurm cluster in directory d: munged, slurmctld and slurmd
    started here, and stopped here by their PIDs."""

    def __init__(self, d):
        self.d = d
        self.procs = []  # (name, Popen), in the order started
        self.files = []  # the daemons' stderr files
        self.env = dict(os.environ, SLURM_CONF=os.path.join(d, "slurm.conf"))
        for k in list(self.env):
            if k.startswith(("SLURM_", "PSD_SLURM_")) and k != "SLURM_CONF":
                del self.env[k]

    def log(self, name):
        """The end of a daemon's log file and of its stderr."""
        text = ""
        for path in (os.path.join(self.d, "munge" if name == "munged" else "",
                                  name + ".log"),
                     os.path.join(self.d, name + ".err")):
            try:
                with open(path) as f:
                    text += f.read()[-3000:]
            except OSError as e:
                text += str(e) + "\n"
        return text

    def err_file(self, name):
        """A file for a daemon's stderr, closed by stop()."""
        f = open(os.path.join(self.d, name + ".err"), "w")
        self.files.append(f)
        return f

    def start_munged(self):
        mdir = os.path.join(self.d, "munge")
        os.mkdir(mdir, 0o755)  # munged wants its socket reachable by all
        mu = pwd.getpwnam("munge")
        key = "/etc/munge/munge.key"
        if not os.path.exists(key):  # never touch an existing one
            key = os.path.join(mdir, "munge.key")
            with open(key, "wb") as f:
                f.write(os.urandom(128))
            os.chmod(key, 0o400)
            os.chown(key, mu.pw_uid, mu.pw_gid)
        os.chown(mdir, mu.pw_uid, mu.pw_gid)
        self.socket = os.path.join(mdir, "munge.socket")
        p = subprocess.Popen(
            ["munged", "--foreground", "--socket=" + self.socket,
             "--key-file=" + key, "--pid-file=" + os.path.join(mdir, "munged.pid"),
             "--log-file=" + os.path.join(mdir, "munged.log"),
             "--seed-file=" + os.path.join(mdir, "munged.seed")],
            user=mu.pw_uid, group=mu.pw_gid, extra_groups=[],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=self.err_file("munged"))
        self.procs.append(("munged", p))
        wait_until("munged's socket", lambda: p.poll() is not None or
                   os.path.exists(self.socket), 20)
        if p.poll() is not None:
            raise AssertionError("munged exited %d: %s" % (p.returncode,
                                                           self.log("munged")))

    def write_conf(self):
        node = subprocess.run(["slurmd", "-C"], capture_output=True, text=True,
                              check=True).stdout.splitlines()[0]
        self.node = re.match(r"NodeName=(\S+)", node).group(1)
        ctld, slurmd = free_run(1), free_run(1)
        while slurmd == ctld:
            slurmd = free_run(1)
        for sub in ("state", "spool"):
            os.mkdir(os.path.join(self.d, sub), 0o755)
        d = self.d
        conf = """ClusterName=psdtest
SlurmctldHost={node}
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld}
SlurmdPort={slurmd}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={sock}
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
{nodeline} State=UNKNOWN
PartitionName=psd Nodes={node} Default=YES MaxTime=10 State=UP
""".format(node=self.node, ctld=ctld, slurmd=slurmd, sock=self.socket, d=d,
           nodeline=node)
        with open(os.path.join(d, "slurm.conf"), "w") as f:
            f.write(conf)

    def start_daemon(self, name, argv):
        p = subprocess.Popen(argv, env=self.env, stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL,
                             stderr=self.err_file(name))
        self.procs.append((name, p))
        return p

    def scontrol(self, *args):
        return subprocess.run(["scontrol"] + list(args), env=self.env,
                              capture_output=True, text=True, timeout=30)

    def node_idle(self):
        for name, p in self.procs:
            if p.poll() is not None:
                raise AssertionError("%s exited %d:\n%s" % (
                    name, p.returncode, self.log(name)))
        r = self.scontrol("show", "node", self.node, "-o")
        m = re.search(r"\bState=(\S+)", r.stdout)
        return m and m.group(1).startswith("IDLE")

    def start(self):
        os.chmod(self.d, 0o755)  # munged (as munge) reaches munge/ below it
        self.start_munged()
        self.write_conf()
        self.start_daemon("slurmctld", ["slurmctld", "-D", "-i"])
        self.start_daemon("slurmd", ["slurmd", "-D"])
        wait_until("node %s IDLE in Slurm" % self.node, self.node_idle, 60)

    def stop(self):
        for name, p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        for f in self.files:
            f.close()


class SlurmJobTest(unittest.TestCase):
    def setUp(self):
        if os.geteuid() != 0:
            self.skipTest("needs root to run slurmctld, slurmd and munged")
        missing = [b for b in DAEMONS if not shutil.which(b)]
        if missing:
            self.skipTest("not installed: %s (deploy/setup.sh installs them)"
                          % ", ".join(missing))
        try:
            pwd.getpwnam("munge")
        except KeyError:
            self.skipTest("no munge user (the munge package makes it)")
        if not os.path.isdir(DATA):
            self.skipTest("dataset-fashion-mnist is not installed")
        self.d = tempfile.mkdtemp(prefix="psd-slurm-")
        self.cluster = SlurmCluster(self.d)

    def tearDown(self):
        self.cluster.stop()
        shutil.rmtree(self.d, ignore_errors=True)

    def job_state(self, jobid):
        r = self.cluster.scontrol("show", "job", jobid, "-o")
        m = re.search(r"\bJobState=(\S+)", r.stdout)
        return m.group(1) if m else None

    def submit(self, jobfile, sbatch_args=(), env=(), dworker_args=()):
        """psd-job.sbatch JOB_FILE DWORKER_ARGS submitted with sbatch's
        extra arguments and environment, waited for: (state, the job's
        output, scontrol's line)."""
        jobid, out = self.submit_nowait(jobfile, sbatch_args, env, dworker_args)
        return self.wait_job(jobid, out)

    def submit_nowait(self, jobfile, sbatch_args=(), env=(), dworker_args=()):
        """The same, submitted only: (job id, the job's output file)."""
        c = self.cluster
        out = os.path.join(self.d, "psd-%j.out")
        e = dict(c.env, PSLAUNCH=h.build_path("deploy", "pslaunch"), **dict(env))
        r = subprocess.run(["sbatch", "--parsable", "--chdir=" + self.d,
                            "--output=" + out, "--time=5"] + list(sbatch_args) +
                           [h.build_path("deploy", "psd-job.sbatch"), jobfile] +
                           list(dworker_args),
                           env=e, capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr + c.log("slurmctld"))
        jobid = r.stdout.strip().split(";")[0]
        return jobid, out.replace("%j", jobid)

    def wait_job(self, jobid, out):
        """Waits for the job to end: (state, its output, scontrol's line)."""
        done = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL",
                "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL", "DEADLINE")
        state = wait_until("job %s to end" % jobid,
                           lambda: (self.job_state(jobid) or "") in done
                           and self.job_state(jobid), JOB_DEADLINE_S)
        with open(out) as f:
            text = f.read()
        return state, text, self.cluster.scontrol("show", "job", jobid, "-o").stdout

    def test_sbatch_live_reshard_2_to_3(self):
        """docs/reshard-deploy.md's live reshard under Slurm: an allocation
        with 3 shard tasks (PSD_SLURM_PS=3) of a job that starts on
        job.shards 2 (ps:2 stands by), a CTR model with a table; once the
        workers train, psctl reshard --shards 3, run outside the job with
        the spec the batch script printed, moves the table's rows to ps:2
        bucket by bucket while they go on, then switches, and the job
        completes with every worker's steps."""
        c = self.cluster
        c.start()
        with open(os.path.join(ROOT, "deploy", "slurm", "slurm-mlp.json")) as f:
            job = json.load(f)
        job["job"].update({"checkpoint": {"dir": os.path.join(self.d, "ckpt")},
                           "shards": 2, "log_every": 20})
        # A model with a table, so that the reshard moves its rows live.
        job["job"].update(h.ctr_table_job(os.path.join(self.d, "ctr")))
        jobfile = os.path.join(self.d, "job.json")
        with open(jobfile, "w") as f:
            json.dump(job, f)
        steps = 250
        jobid, out = self.submit_nowait(
            jobfile, ["--ntasks=5", "--export=ALL,PSD_SLURM_PS=3"],
            env={"PSD_SLURM_PORT": str(free_run(5))},
            dworker_args=["--max-steps", str(steps), "--inject-delay-ms", "20"])

        def output():
            try:
                with open(out) as f:
                    return f.read()
            except FileNotFoundError:
                return ""
        # Training on 2, ps:2 standing by: then the spec it printed.
        text = wait_until("both workers' first progress and ps:2 standing by",
                          lambda: (lambda t: re.search(r"ps:2\s*\| .*standing by", t)
                                   and len(re.findall(r"worker:\d\s*\| .*step 20/", t))
                                   >= 2 and t)(output()), JOB_DEADLINE_S)
        start = text.index("spec:") + len("spec:")
        spec, _ = json.JSONDecoder().raw_decode(text[start:].lstrip())
        self.assertEqual(len(spec["cluster"]["ps"]), 3)
        specfile = os.path.join(self.d, "live.json")
        with open(specfile, "w") as f:
            json.dump({"cluster": spec["cluster"], "job": spec["job"]}, f)
        r = h.psctl(specfile, "reshard", "--shards", "3", timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr + output()[-4000:])
        self.assertRegex(r.stdout, h.LIVE_MOVED)
        state, text, info = self.wait_job(jobid, out)
        self.assertEqual(state, "COMPLETED", info + text[-4000:])
        # Taken in without a restart: its rows moved to it, then the switch.
        self.assertRegex(text, r"ps:2\s*\| .*COMMIT: ps:2 serves layout 1 of 3 shards")
        self.assertGreater(h.rows_moved_in(text), 0, text[-4000:])
        for w in (0, 1):
            self.assertRegex(text, r"worker:%d\s*\| .*layout moved: now layout 1 of 3 "
                                   r"shards" % w)
            # worker 0's final: line, worker 1's done: line
            done = [l for l in text.splitlines()
                    if re.match(r"worker:%d\s*\|" % w, l)
                    and ("final:" in l or "done:" in l)]
            self.assertEqual(len(done), 1, text[-3000:])
            self.assertIn("steps=%d" % steps, done[0])

    def test_sbatch_demo_job_then_reshard_2_to_3(self):
        """deploy/slurm/slurm-mlp.json as shipped (but for a checkpoint
        directory) runs under sbatch to README.md's figure on 2 shards and
        2 workers; then docs/reshard-deploy.md under Slurm: the next
        allocation has 3 shards and PSD_RESHARD=1: the batch script
        restores the checkpoint onto 3 (psd --reshard, once, before the
        step), the old layout kept beside it, and the 3 shards resume from
        its step and the job (60 steps more) completes."""
        c = self.cluster
        c.start()
        with open(os.path.join(ROOT, "deploy", "slurm", "slurm-mlp.json")) as f:
            job = json.load(f)
        epochs = job["job"]["epochs"]
        ckpt = os.path.join(self.d, "ckpt")
        job["job"]["checkpoint"] = {"dir": ckpt}
        name = job["job"]["name"]
        jobfile = os.path.join(self.d, "job.json")
        with open(jobfile, "w") as f:
            json.dump(job, f)

        state, text, info = self.submit(jobfile, env={"PSD_SLURM_PORT": str(free_run(4))})
        self.assertEqual(state, "COMPLETED", info + text[-4000:] + c.log("slurmd"))
        self.assertIn("ExitCode=0:0", info)
        self.assertNotIn("PSD_RESHARD=1", text)
        # The spec the batch script derived: 2 shards, 2 workers, this node.
        self.assertIn('"ps": [', text)
        for s in (0, 1):
            self.assertRegex(text, r"ps:%d\s*\| .*ready: listening" % s)
        last = [l for l in text.splitlines() if "final:" in l]
        self.assertEqual(len(last), 1, text[-3000:])
        kv = dict(re.findall(r"(\w+)=([\d.]+)", last[0].split("final:", 1)[1]))
        self.assertEqual(kv["epochs"], str(epochs))
        h.assert_job_accounting(self, text, epochs, 2)
        acc = float(kv["test_accuracy"])
        jobid = re.search(r"\bJobId=(\d+)", info).group(1)
        print("\nslurm job %s: test_accuracy=%.4f wall_s=%s" % (jobid, acc, kv["wall_s"]))
        stated("slurm-mlp.json").check(self, kv)
        self.assertEqual(sorted(os.listdir(os.path.join(ckpt, name))), ["ps-0", "ps-1"])
        short = ["--max-steps", "60"]

        port = str(free_run(5))
        # docs/reshard-deploy.md's command (and the port, moved to a free one).
        state, text, info = self.submit(
            jobfile, ["--ntasks=5", "--export=ALL,PSD_SLURM_PS=3,PSD_RESHARD=1"],
            dworker_args=short, env={"PSD_SLURM_PORT": port})
        self.assertEqual(state, "COMPLETED", info + text[-4000:])
        m = re.search(r"reshard: done in .* holds the checkpoint of step (\d+) for 3 "
                      r"shards .* the 2-shard layout is kept in (\S+)", text)
        self.assertTrue(m, text[-4000:])
        step = int(m.group(1))
        self.assertGreater(step, 0)
        # Before the step: the reshard's line comes before any shard's.
        self.assertLess(text.index("reshard: done in"), text.index("ready: listening"))
        for s in (0, 1, 2):
            self.assertRegex(text, r"ps:%d\s*\| .*resumed from step %d" % (s, step))
            self.assertRegex(text, r"ps:%d\s*\| .*ready: listening.*shard %d of 3"
                             % (s, s))
        self.assertEqual(sorted(os.listdir(os.path.join(ckpt, name))),
                         ["ps-0", "ps-1", "ps-2"])
        kept = [f for f in os.listdir(ckpt) if f.startswith(name + ".2-shards-")]
        self.assertEqual(len(kept), 1, os.listdir(ckpt))
        self.assertEqual(os.path.join(ckpt, kept[0]), m.group(2).rstrip(";,."))


if __name__ == "__main__":
    h.main()
