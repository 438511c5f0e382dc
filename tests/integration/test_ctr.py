"""The click-through-rate example end to end (docs/ctr.md): pslaunch starts 2
shards and 2 dworkers training the wide & deep model over two embedding
tables on a generated LIBSVM data set.

- async: deploy/examples/ctr.json, as shipped but for its addresses and
  data directory: the held-out AUC comes within 0.01 of the true model's
  AUC (which the generator wrote in truth.json) and meets the figure
  README.md's example table states (test_examples.stated), and the job:
  line's accounting adds up (every worker's examples = epochs x the
  training set);
- bounded staleness (SSP) trains too;
- sync, deterministic: two runs give identical tables, byte for byte: the
  sha256 of every shard's table files in the final checkpoint match, and so
  do the final lines' AUC;
- sync, a shard killed (kill -9) and restarted from its checkpoint: the job
  rolls back, and each worker's end-of-run line counts the steps it redid
  (redone=N, steps = the job's steps + N), as the image models' lines do;
- job.ctr.format "criteo": the same model on generated Criteo TSV (26
  categorical fields, 13 integer ones) comes within 0.02 of the true AUC;
  a user's files (Criteo Kaggle's names, gzip too, beside a truth.json psd
  did not write) are read as they are and never written, and a directory
  of other files is refused (docs/ctr.md, "Whose data").
Run: /usr/bin/python3 test_ctr.py BUILD_DIR"""
import glob
import gzip
import hashlib
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import unittest

import harness as h
from faults import result
from test_examples import SANITIZED, as_shipped, stated

EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "deploy",
                       "examples", "ctr.json")

TABLES = [
    {"name": "emb", "dim": 8, "init": "uniform", "init_scale": 0.05,
     "optimizer": {"type": "adagrad", "lr": 0.2, "initial_accumulator": 0.1}},
    {"name": "wide", "dim": 1, "init": "zeros",
     "optimizer": {"type": "adagrad", "lr": 0.2, "initial_accumulator": 0.1}},
]


def job(name, data, train, test, extra=None):
    j = {"name": name, "model": "ctr", "data_dir": data,
         "ctr": {"fields": 8, "generate": {"train": train, "test": test, "seed": 7,
                                           "zipf": 1.6}},
         "hidden": [64, 32], "epochs": 2, "batch_size": 256,
         "optimizer": {"type": "adam", "lr": 0.002}, "tables": TABLES,
         "seed": 1, "log_every": 100}
    j.update(extra or {})
    return j


def final(out):
    for line in reversed(out.splitlines()):
        if "final:" in line:
            return dict(p.split("=", 1) for p in line.split("final:", 1)[1].split())
    return None


class CtrgenUsageTest(unittest.TestCase):
    """psd-ctrgen's numbers are read whole: a typo is named, exit 2."""

    def test_bad_numbers_are_named(self):
        with h.TempDir() as d:
            gen = h.build_path("worker", "psd-ctrgen")
            for args, said in [(["--train", "5k"], "--train takes a whole number >= 0, not '5k'"),
                               (["--test", "-1"], "--test takes a whole number >= 0, not '-1'"),
                               (["--seed", "1e3"], "--seed takes a whole number >= 0, not '1e3'"),
                               (["--fields", "65"], "--fields takes a whole number 1..64, not '65'"),
                               (["--zipf", "x"], "--zipf takes a number above 1, not 'x'")]:
                r = h.run([gen, "--out", d] + args, timeout=30)
                self.assertEqual(r.returncode, 2, (args, r.stderr))
                self.assertEqual(r.stderr.strip(), "psd-ctrgen: " + said)
                self.assertEqual(os.listdir(d), [])
            r = h.run([gen, "--out", d, "--train", "50", "--test", "20", "--fields", "2",
                       "--zipf", "1.3", "--seed", "3"], timeout=60)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("wrote %s: 50 training and 20 held-out examples, 2 fields" % d,
                          r.stdout)


class CtrTest(unittest.TestCase):
    def launch(self, spec):
        r = h.run([h.build_path("deploy", "pslaunch"), spec], timeout=600)
        out = r.stdout + r.stderr
        self.assertEqual(r.returncode, 0, out[-4000:])
        f = final(out)
        self.assertIsNotNone(f, out[-4000:])
        return out, f

    def test_example_reaches_the_true_models_auc(self):
        """deploy/examples/ctr.json as shipped, but for its addresses, its
        data's place (a temporary directory) and job.tensorboard_dir added
        (where events go; nothing of the training)."""
        with tempfile.TemporaryDirectory(prefix="psd-test-") as tmp:
            spec = os.path.join(tmp, "ctr.json")
            shipped = as_shipped(EXAMPLE, spec, data_dir="data")
            shipped["job"]["tensorboard_dir"] = "tb"
            with open(spec, "w") as fh:
                json.dump(shipped, fh)
            epochs = shipped["job"]["epochs"]
            train = shipped["job"]["ctr"]["generate"]["train"]
            out, f = self.launch(spec)
            with open(os.path.join(tmp, "data", "truth.json")) as fh:
                truth = json.load(fh)
            self.assertAlmostEqual(float(f["true_auc"]), truth["true_auc"], places=3)
            print("\nctr.json: test_auc=%s true_auc=%s" % (f["test_auc"], f["true_auc"]))
            self.assertGreater(float(f["test_auc"]), truth["true_auc"] - 0.01, f)
            if not SANITIZED:
                stated("ctr.json").check(self, f)  # README's figure
            self.assertLess(float(f["test_logloss"]), truth["true_logloss"] + 0.02, f)
            self.assertIn("auc=", out)  # the progress lines
            h.assert_job_accounting(self, out, epochs=epochs, workers=2, train_size=train)
            # TensorBoard: worker 0's events, read back with the checked
            # reader, end with the final line's AUC and log loss.
            import glob
            from test_tensorboard import decode_event, read_records
            files = sorted(glob.glob(os.path.join(tmp, "tb", "events.out.tfevents.*.0")))
            self.assertEqual(len(files), 1, os.listdir(tmp))
            events = [decode_event(d) for d in read_records(self, files[0])[1:]]
            self.assertIn("train/auc", events[0]["scalars"])
            test = events[-1]["scalars"]
            self.assertAlmostEqual(test["test/auc"], float(f["test_auc"]), places=3)
            self.assertAlmostEqual(test["test/logloss"], float(f["test_logloss"]),
                                   places=3)

    def test_ssp_trains(self):
        with tempfile.TemporaryDirectory(prefix="psd-test-") as tmp:
            spec = os.path.join(tmp, "ctr.json")
            h.write_spec(spec, nps=2, nworker=2,
                         job=job("ctr-ssp", "data", 100000, 5000,
                                 {"sync": {"mode": "async", "staleness": 2}}))
            out, f = self.launch(spec)
            self.assertGreater(float(f["test_auc"]), 0.7, f)
            h.assert_job_accounting(self, out, epochs=2, workers=2, train_size=100000)

    def test_sync_deterministic_runs_give_identical_tables(self):
        digests, aucs = [], []
        with tempfile.TemporaryDirectory(prefix="psd-test-") as tmp:
            for run in range(2):
                spec = os.path.join(tmp, "ctr%d.json" % run)
                ck = os.path.join(tmp, "ckpt%d" % run)
                h.write_spec(spec, nps=2, nworker=2,
                             job=job("ctr-sync", "data", 20000, 2000,
                                     {"sync": {"mode": "sync", "deterministic": True},
                                      "checkpoint": {"dir": ck}}))
                out, f = self.launch(spec)
                aucs.append(f["test_auc"])
                files = sorted(glob.glob(os.path.join(ck, "ctr-sync", "ps-*", "ckpt-*",
                                                      "table-*.bin")))
                self.assertEqual(len(files), 4, files)  # 2 shards x 2 tables
                d = hashlib.sha256()
                for p in files:
                    with open(p, "rb") as fh:
                        d.update(os.path.relpath(p, ck).encode() + fh.read())
                digests.append(d.hexdigest())
                # A run this short (under a second) prints wall_s too coarsely
                # for the rate check: the examples and reports are checked.
                job_ = h.job_line(out)
                self.assertEqual((int(job_["examples"]), int(job_["reported"])),
                                 (2 * 20000, 2), job_)
        self.assertEqual(aucs[0], aucs[1])
        self.assertEqual(digests[0], digests[1])


class CtrCriteoTest(unittest.TestCase):
    """job.ctr.format "criteo" (docs/ctr.md): generated when absent, then
    trained; Criteo's own files (no truth.json) are read as they are."""

    def spec(self, tmp, name, train, test, epochs=2, data="data"):
        spec = os.path.join(tmp, name + ".json")
        h.write_spec(spec, nps=2, nworker=2,
                     job=job(name, data, train, test,
                             {"ctr": {"format": "criteo",
                                      "generate": {"train": train, "test": test,
                                                   "seed": 7}},
                              "epochs": epochs}))
        return spec

    def test_criteo_format_reaches_the_true_auc(self):
        with tempfile.TemporaryDirectory(prefix="psd-test-") as tmp:
            r = h.run([h.build_path("deploy", "pslaunch"),
                       self.spec(tmp, "ctr-criteo", 200000, 20000)], timeout=600)
            out = r.stdout + r.stderr
            self.assertEqual(r.returncode, 0, out[-4000:])
            f = final(out)
            with open(os.path.join(tmp, "data", "truth.json")) as fh:
                truth = json.load(fh)
            self.assertEqual(truth["settings"]["format"], "criteo")
            self.assertTrue(os.path.exists(os.path.join(tmp, "data", "train.tsv")))
            print("\nctr criteo: test_auc=%s true_auc=%s (integer term alone %.4f)"
                  % (f["test_auc"], f["true_auc"], truth["dense_true_auc"]))
            self.assertAlmostEqual(float(f["true_auc"]), truth["true_auc"], places=3)
            self.assertEqual((f["train"], f["test"], f["data"]),
                             (os.path.join(tmp, "data", "train.tsv"),
                              os.path.join(tmp, "data", "test.tsv"), "generated"), f)
            self.assertEqual(truth["generator"], "psd-ctrgen")  # psd's mark
            # The two workers start together on a new directory: one
            # generates under the directory's lock, the other waits and
            # reads psd's set (ctrdata.h, dw_ctrdata_lock); two writers
            # would race on the same files.
            self.assertEqual(out.count("generating the CTR data set in"), 1, out[-4000:])
            self.assertEqual(out.count("(psd's generated data set)"), 2, out[-4000:])
            self.assertGreater(float(f["test_auc"]), truth["true_auc"] - 0.02, f)
            self.assertGreater(float(f["test_auc"]), truth["dense_true_auc"] + 0.1, f)
            h.assert_job_accounting(self, out, epochs=2, workers=2, train_size=200000)

    def test_users_files_are_read_never_written(self):
        """A user's Criteo files under Kaggle's names (train.txt plain,
        test.txt.gz) beside a truth.json psd did not write: trained on as
        they are, every byte kept, named at the start and in the final:
        line; a bad line fails the job naming the file and line; a
        directory of other files is refused, naming it and every name
        looked for, and nothing is written there."""
        with tempfile.TemporaryDirectory(prefix="psd-test-") as tmp:
            gen, data = os.path.join(tmp, "gen"), os.path.join(tmp, "data")
            r = h.run([h.build_path("worker", "psd-ctrgen"), "--format", "criteo",
                       "--out", gen, "--train", "4000", "--test", "1000"])
            self.assertEqual(r.returncode, 0, r.stderr)
            os.mkdir(data)
            shutil.copy(os.path.join(gen, "train.tsv"), os.path.join(data, "train.txt"))
            with open(os.path.join(gen, "test.tsv"), "rb") as fh, \
                    gzip.open(os.path.join(data, "test.txt.gz"), "wb") as out:
                out.write(fh.read())
            with open(os.path.join(data, "truth.json"), "w") as fh:
                json.dump({"true_auc": 0.99, "note": "the user's own"}, fh)
            before = digests(data)
            r = h.run([h.build_path("deploy", "pslaunch"),
                       self.spec(tmp, "ctr-criteo-own", 1000, 10, epochs=1)], timeout=300)
            out = r.stdout + r.stderr
            self.assertEqual(r.returncode, 0, out[-4000:])
            self.assertIn("data: training on %s/train.txt, testing on %s/test.txt.gz (the "
                          "user's files, read as they are" % (data, data), out)
            f = final(out)
            self.assertEqual((f["true_auc"], f["data"]), ("nan", "user"), f)
            self.assertEqual((f["train"], f["test"]), (os.path.join(data, "train.txt"),
                                                       os.path.join(data, "test.txt.gz")), f)
            h.assert_job_accounting(self, out, epochs=1, workers=2, train_size=4000)
            self.assertEqual(digests(data), before)  # not a byte written
            # A bad line is named by file and line, and the job fails.
            with open(os.path.join(data, "train.txt"), "ab") as fh:
                fh.write(b"1\tx\n")
            r = h.run([h.build_path("deploy", "pslaunch"),
                       self.spec(tmp, "ctr-criteo-bad", 1000, 10, epochs=1)], timeout=300)
            out = r.stdout + r.stderr
            self.assertNotEqual(r.returncode, 0, out[-4000:])
            self.assertIn("%s/train.txt:4001: 2 tab-separated fields, want 40" % data, out)
            # Nothing psd reads, and not psd's: refused, nothing written.
            other = os.path.join(tmp, "other")
            os.mkdir(other)
            with open(os.path.join(other, "notes.txt"), "w") as fh:
                fh.write("mine\n")
            before = digests(other)
            r = h.run([h.build_path("deploy", "pslaunch"),
                       self.spec(tmp, "ctr-criteo-other", 1000, 10, epochs=1, data="other")],
                      timeout=300)
            out = r.stdout + r.stderr
            self.assertNotEqual(r.returncode, 0, out[-4000:])
            self.assertIn("the data directory %s holds no Criteo data psd can read, and psd "
                          "did not write it" % other, out)
            self.assertIn("looked for train.tsv, train.tsv.gz, train.txt or train.txt.gz "
                          "(training) and test.tsv, test.tsv.gz, test.txt or test.txt.gz "
                          "(held-out); it holds notes.txt", out)
            self.assertEqual(digests(other), before)


def digests(d):
    """{name: sha256} of every file in d: what a run must leave as it was."""
    out = {}
    for name in sorted(os.listdir(d)):
        with open(os.path.join(d, name), "rb") as fh:
            out[name] = hashlib.sha256(fh.read()).hexdigest()
    return out


class CtrSyncRestartTest(h.ProcTest):
    """A sync CTR job survives kill -9 + restart of ps:1: the coordinator
    rolls the job back to ps:1's checkpoint, and the workers take the undone
    steps again and count them in their end-of-run lines."""

    # 2 x 16000 examples of 32: 500 steps an epoch per worker, 1000 in all,
    # long enough to kill ps:1 well past its checkpoint of step 200.
    TRAIN, TEST, BATCH = 32000, 2000, 32

    def test_shard_restart_rolls_back_and_end_of_run_lines_count_redone_steps(self):
        data = os.path.join(self.d, "data")
        r = h.run([h.build_path("worker", "psd-ctrgen"), "--out", data, "--train",
                   str(self.TRAIN), "--test", str(self.TEST), "--fields", "8",
                   "--seed", "7", "--zipf", "1.6"])
        self.assertEqual(r.returncode, 0, r.stderr)
        spec = os.path.join(self.d, "ctr.json")
        h.write_spec(spec, nps=2, nworker=2,
                     job=job("ctr-rollback", "data", self.TRAIN, self.TEST,
                             {"sync": {"mode": "sync"}, "batch_size": self.BATCH,
                              "log_every": 10, "heartbeat_ms": 100,
                              "dead_after_ms": 1500, "rpc_timeout_ms": 2000,
                              "retry_s": 60,
                              "checkpoint": {"dir": "ck", "every_steps": 200}}))
        ps = [h.start_psd(spec, i) for i in range(2)]
        self.procs.extend(ps)
        ws = [h.Proc([h.build_path("worker", "dworker"), "--cluster", spec, "--task",
                      "worker:%d" % i]) for i in range(2)]
        self.procs.extend(ws)
        ps[1].wait_for("checkpoint (every_steps) at step 200 ", timeout=120)
        for w in ws:
            w.wait_for("step 250/", timeout=120)
        ps[1].p.send_signal(signal.SIGKILL)
        self.assertEqual(ps[1].wait(), -signal.SIGKILL)
        ps[1] = h.start_psd(spec, 1)
        self.procs.append(ps[1])
        ps[1].wait_for("resumed from step 200")
        m = re.search(r"rolled the job back to step 200: ps:1 restarted from its "
                      r"checkpoint of step 200 while the others were at step (\d+); "
                      r"(\d+) steps are redone",
                      ps[0].wait_for("rolled the job back to step", timeout=60))
        self.assertTrue(m, ps[0].output()[-3000:])
        for w in ws:
            self.assertEqual(w.wait(timeout=300), 0, w.output()[-3000:])
        total = 2 * (self.TRAIN // 2 // self.BATCH)
        print("\nctr sync: ps:1 restarted from step 200, the job was at step %s; the "
              "workers redid %s steps" % (m.group(1), " and ".join(
                  result(w).get("redone", "0") for w in ws)))
        for w in ws:
            r = result(w)
            self.assertGreater(int(r.get("redone", 0)), 0, r)
            self.assertEqual(int(r["steps"]), total + int(r["redone"]), r)
            # Said once: the rollback's generation is counted.
            self.assertEqual(len(re.findall("the job rolled back to step 200",
                                            w.output())), 1, w.output()[-3000:])
        self.assertIn("test_auc", result(ws[0]))
        for p in ps:
            self.assertEqual(p.stop(), 0, p.output()[-3000:])


if __name__ == "__main__":
    h.main(sys.argv)
