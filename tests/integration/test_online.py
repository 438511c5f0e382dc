"""Online learning end to end (docs/serving.md, "Online learning"): a CTR
model trained on a stream of click logs while serving replicas answer
lookups from what the training shards publish.

Two training shards, one dworker following job.ctr.stream, four serving
tasks (two replicas per shard), job.publish every 0.5 s. The test feeds the
parts of `psd-ctrgen --drift` one at a time, each once the worker said the
one before is trained, while three load processes (online_load.py) look up
rows of the stream's ids all along. After the second part a serving task is
killed (SIGKILL) and started again; after the third a training shard is
killed (SIGKILL) and started again from its checkpoint. Then:

- no lookup failed, in any load process (the replicas fail over; the
  serving tasks answer the last version while a training shard is down);
- every sampled answer comes from one version per shard: each row equals
  that shard's publications applied up to the version the answer names
  (pubread.py), and `found` says whether the chain holds the id;
- the serving tasks catch up: in the end every shard's served version is
  its newest publication, and a lookup of every id the stream named equals
  a training pull of it bit for bit;
- each window was scored before training (its window line), every part
  trained once, and `psctl metrics` (the coordinator's /metrics) shows the
  last window's AUC and log loss (psd_worker_window_auc, ...).

And deploy/examples/ctr-online.json as shipped (but for its ports and
directories) under pslaunch, over a drifting stream written whole
beforehand: the serving tasks pslaunch starts load the publications, psctl
serving shows them, and the worker's final: line meets README.md's figure.
Run: /usr/bin/python3 test_online.py BUILD_DIR"""
import glob
import json
import os
import shutil
import signal
import sys
import time

import numpy as np

import harness as h
import pubread
import pyshards
from hashes import shard_of
from test_examples import SRC, stated

PARTS = 4
PER_PART = 12000
JOB = "online"
TABLES = [
    {"name": "emb", "dim": 8, "init": "uniform", "init_scale": 0.05,
     "optimizer": {"type": "adagrad", "lr": 0.2, "initial_accumulator": 0.1}},
    {"name": "wide", "dim": 1, "init": "zeros",
     "optimizer": {"type": "adagrad", "lr": 0.2, "initial_accumulator": 0.1}},
]
LOADS = 3
psd = None


def setUpModule():
    global psd
    psd = pyshards.import_psd()


class OnlineTest(h.ProcTest):
    def setUp(self):
        super().setUp()
        ports = h.free_ports(7)
        self.spec = os.path.join(self.d, "spec.json")
        self.stream = os.path.join(self.d, "stream")
        self.staging = os.path.join(self.d, "staging")
        os.mkdir(self.stream)
        with open(self.spec, "w") as f:
            json.dump({"cluster": {"ps": ["127.0.0.1:%d" % p for p in ports[:2]],
                                   "worker": ["127.0.0.1:%d" % ports[2]],
                                   "serve": ["127.0.0.1:%d" % p for p in ports[3:7]]},
                       "job": {"name": JOB, "model": "ctr",
                               "ctr": {"fields": 8, "stream": {"dir": "stream",
                                                               "poll_s": 0.1}},
                               "hidden": [32, 16], "batch_size": 256,
                               "optimizer": {"type": "adam", "lr": 0.002},
                               "tables": TABLES, "seed": 1, "log_every": 20,
                               "retry_s": 60,
                               "checkpoint": {"dir": "ckpt", "every_s": 0.5},
                               "publish": {"dir": "pub", "interval_s": 0.5,
                                           "full_every": 4, "keep": 1000}}}, f)
        r = h.run([h.build_path("worker", "psd-ctrgen"), "--drift", "--out", self.staging,
                   "--parts", str(PARTS), "--per-part", str(PER_PART)], timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.parts = sorted(os.path.basename(p)
                            for p in glob.glob(os.path.join(self.staging, "part-*.svm")))
        self.assertEqual(len(self.parts), PARTS)
        ids = set()
        for p in self.parts:
            with open(os.path.join(self.staging, p)) as f:
                for line in f:
                    ids.update(int(t.split(":")[0]) for t in line.split()[1:])
        self.ids = np.array(sorted(ids), np.uint64)
        np.save(os.path.join(self.d, "ids.npy"), self.ids)
        self.stop_file = os.path.join(self.d, "stop")

    def psd_task(self, task):
        p = h.Proc([h.build_path("ps-server", "psd"), "--cluster", self.spec, "--task", task])
        p.wait_for("ready: listening on")
        self.procs.append(p)
        return p

    def release(self, part):
        tmp = os.path.join(self.stream, "." + part + ".tmp")
        shutil.copy(os.path.join(self.staging, part), tmp)
        os.rename(tmp, os.path.join(self.stream, part))

    def until(self, what, cond, timeout=30):
        """Polls cond() (a condition, never a fixed sleep) until true."""
        return h.until(what, cond, timeout)

    def pubdir(self, shard):
        return os.path.join(self.d, "pub", JOB, "ps-%d" % shard)

    def test_stream_publish_serve_through_restarts(self):
        ps = [self.psd_task("ps:%d" % i) for i in range(2)]
        serve = {j: self.psd_task("serve:%d" % j) for j in range(4)}
        worker = h.Proc([h.build_path("worker", "dworker"), "--cluster", self.spec,
                         "--task", "worker:0"])
        self.procs.append(worker)
        self.release(self.parts[0])
        worker.wait_for("window 1 (%s): trained" % self.parts[0], timeout=120)
        # The loads start once the first part's rows are served.
        s = psd.Serving(self.spec)
        self.addCleanup(s.close)
        self.until("the first part served",
                   lambda: s.lookup("emb", self.ids[:64])[1].any())
        loads = []
        for k in range(LOADS):
            p = h.Proc(["/usr/bin/python3", os.path.join(os.path.dirname(__file__),
                                                         "online_load.py"),
                        self.spec, "emb", os.path.join(self.d, "ids.npy"), self.stop_file,
                        os.path.join(self.d, "load%d.json" % k), "--samples", "5",
                        "--seed", str(k + 1), "--build", h.BUILD],
                       env={"PYTHONPATH": os.path.join(h.BUILD, "worker", "python")})
            p.wait_for("load: ready")
            loads.append(p)
            self.procs.append(p)

        # Part 2, with a serving task killed and started again.
        self.release(self.parts[1])
        serve[1].stop(signal.SIGKILL)
        worker.wait_for("window 2 (%s): trained" % self.parts[1], timeout=120)
        serve[1] = self.psd_task("serve:1")
        # The progressive validation reaches the coordinator's /metrics (the
        # worker's heartbeats carry it): the last window line's figures.
        line = worker.wait_for("window 2 (%s): logloss=" % self.parts[1])
        auc = line.split("auc=")[1].split()[0]
        ll = line.split("logloss=")[1].split()[0]
        self.until("psctl metrics showing window 2", lambda: self.window_metrics() == (
            "2", auc, ll), timeout=30)

        # Part 3, with a training shard killed and started again from its
        # checkpoint (the worker retries meanwhile; serving answers on).
        self.release(self.parts[2])
        worker.wait_for("window 3 (%s): logloss=" % self.parts[2], timeout=120)
        ps[1].stop(signal.SIGKILL)
        ps[1] = self.psd_task("ps:1")
        worker.wait_for("window 3 (%s): trained" % self.parts[2], timeout=120)

        self.release(self.parts[3])
        open(os.path.join(self.stream, "END"), "w").close()
        self.assertEqual(worker.wait(timeout=120), 0, worker.output())
        out = worker.output()
        for n, part in enumerate(self.parts, 1):
            self.assertIn("window %d (%s): logloss=" % (n, part), out)
            self.assertIn("window %d (%s): trained examples=%d" % (n, part, PER_PART), out)

        # The serving tasks catch up: a lookup of every id the stream named
        # equals a training pull of it, bit for bit. The pull comes first:
        # rows stored by the shard killed after its last checkpoint and not
        # seen again are stored anew by it (admission "always"), and so
        # published; and publications may still be cut after the worker left.
        c = psd.Client(self.spec, None)
        self.addCleanup(c.close)
        c.declare_table("emb", 8)
        pulled = np.empty((len(self.ids), 8), np.float32)
        c.pull_rows("emb", self.ids, pulled)

        def caught_up():
            rows, found, _ = s.lookup("emb", self.ids)
            return bool(found.all()) and np.array_equal(rows, pulled)
        self.until("serving answering what training holds", caught_up, timeout=60)
        newest = [pubread.versions(self.pubdir(i))[-1] for i in range(2)]
        self.until("serving at the newest publications %s" % newest,
                   lambda: all(v >= n for v, n in
                               zip(s.lookup("emb", self.ids)[2], newest)))
        open(self.stop_file, "w").close()
        for p in loads:
            self.assertEqual(p.wait(timeout=60), 0, p.output())

        # No lookup failed.
        total = 0
        for k in range(LOADS):
            with open(os.path.join(self.d, "load%d.json" % k)) as f:
                got = json.load(f)
            self.assertEqual(got["failures"], 0, got["errors"])
            self.assertGreater(got["samples"], 0, got)
            total += got["calls"]

        # Every sampled answer is one version of each shard's chain.
        checked = self.check_samples()
        self.assertGreater(checked, 0)

        # And still does, the loads stopped.
        rows, found, _ = s.lookup("emb", self.ids)
        self.assertTrue(found.all())
        np.testing.assert_array_equal(rows, pulled)
        print("online: %d lookups by %d processes, 0 failed; %d sampled answers "
              "checked against their versions" % (total, LOADS, checked))

    def window_metrics(self):
        """worker 0's (windows, AUC, log loss) from psctl metrics, the AUC
        and log loss as the window lines print them."""
        r = h.psctl(self.spec, "metrics")
        got = {}
        for line in r.stdout.splitlines():
            for name in ("psd_worker_windows_total", "psd_worker_window_auc",
                         "psd_worker_window_logloss"):
                if line.startswith(name + '{worker="0"') and " " in line:
                    got[name] = line.rsplit(" ", 1)[1]
        if len(got) < 3:
            return None
        return (got["psd_worker_windows_total"],
                "%.4f" % float(got["psd_worker_window_auc"]),
                "%.4f" % float(got["psd_worker_window_logloss"]))

    def check_samples(self):
        """Checks every sampled answer against the chain of publications of
        each shard at the version it names; returns the rows checked."""
        samples = []
        for k in range(LOADS):
            z = np.load(os.path.join(self.d, "load%d.npz" % k))
            samples += list(zip(z["ids"], z["rows"], z["found"], z["versions"]))
        checked = 0
        for shard in range(2):
            want = {}  # version -> [(ids, rows, found)] of this shard's ids
            for ids, rows, found, versions in samples:
                mine = np.array([shard_of(int(i), 2) == shard for i in ids])
                if mine.any():
                    want.setdefault(int(versions[shard]), []).append(
                        (ids[mine], rows[mine], found[mine]))
            d = self.pubdir(shard)
            st = pubread.State()
            for v in pubread.versions(d):
                st.apply(pubread.read(d, v))
                emb = st.tables.get("emb", {})
                for ids, rows, found in want.pop(v, []):
                    for i, row, f in zip(ids.tolist(), rows, found):
                        self.assertEqual(bool(f), i in emb, "ps:%d v%d id %d" % (shard, v, i))
                        if f:
                            np.testing.assert_array_equal(row, emb[i], "ps:%d v%d id %d"
                                                          % (shard, v, i))
                        checked += 1
            self.assertEqual(list(want), [], "answers of versions never published")
        return checked


EXAMPLE = os.path.join(SRC, "deploy", "examples", "ctr-online.json")


class ExampleTest(h.ProcTest):
    def shipped(self):
        """The example with free loopback ports and its directories under
        the test's; asserts nothing else differs."""
        with open(EXAMPLE) as f:
            shipped = json.load(f)
        spec = json.loads(json.dumps(shipped))
        c = spec["cluster"]
        ports = iter(h.free_ports(len(c["ps"]) + len(c["worker"]) + len(c["serve"])))
        for kind in ("ps", "worker", "serve"):
            c[kind] = ["127.0.0.1:%d" % next(ports) for _ in c[kind]]
        spec["job"]["ctr"]["stream"]["dir"] = os.path.join(self.d, "stream")
        spec["job"]["publish"]["dir"] = os.path.join(self.d, "pub")
        a, b = json.loads(json.dumps(shipped)), json.loads(json.dumps(spec))
        for x in (a, b):
            x.pop("cluster")
            x["job"]["ctr"]["stream"].pop("dir")
            x["job"]["publish"].pop("dir")
        self.assertEqual(a, b, "only the addresses and directories differ")
        path = os.path.join(self.d, "ctr-online.json")
        with open(path, "w") as f:
            json.dump(spec, f)
        return path

    def test_shipped_example(self):
        spec = self.shipped()
        r = h.run([h.build_path("worker", "psd-ctrgen"), "--drift", "--out",
                   os.path.join(self.d, "stream"), "--parts", "5", "--per-part", "20000"],
                  timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        p = h.Proc([h.build_path("deploy", "pslaunch"), spec])
        self.procs.append(p)
        for j in range(4):
            p.wait_for("serve:%d of job 'ctr-online'" % j, timeout=60)
        p.wait_for("window 5 (part-00004.svm): trained", timeout=240)
        # Every serving task pslaunch started holds a publication.
        got = {}

        def all_serving():
            r = h.psctl(spec, "--json", "serving")
            if r.returncode == 0:
                got.update(json.loads(r.stdout))
                return all(t["version"] > 0 for t in got["serving"])
            return False
        deadline = time.monotonic() + 30
        while not all_serving():
            self.assertLess(time.monotonic(), deadline, got)
            time.sleep(0.1)
        self.assertEqual(sorted((t["index"], t["shard"]) for t in got["serving"]),
                         [(0, 0), (1, 1), (2, 0), (3, 1)])
        open(os.path.join(self.d, "stream", "END"), "w").close()
        self.assertEqual(p.wait(timeout=120), 0, p.output())
        out = p.output()
        finals = [dict(kv.split("=", 1) for kv in line.split("final:", 1)[1].split()
                       if "=" in kv) for line in out.splitlines() if "final:" in line]
        self.assertEqual(len(finals), 1, out[-3000:])
        self.assertEqual(finals[0]["windows"], "5")
        print("ctr-online.json: final: %s" % " ".join("%s=%s" % kv for kv in finals[0].items()))
        stated("ctr-online.json").check(self, finals[0])  # README's figure
        for i in range(2):
            self.assertTrue(pubread.versions(os.path.join(self.d, "pub", "ctr-online",
                                                          "ps-%d" % i)))


if __name__ == "__main__":
    h.main(sys.argv)
