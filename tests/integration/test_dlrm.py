"""deploy/examples/torch-dlrm.json run small, and its model exported: the
DLRM example (deploy/examples/torch/dlrm.py) trained through 2 shards and 2
workers (`pslaunch --only worker` on shards this test starts) on a
`psd-ctrgen --format criteo` set of TRAIN examples, its tables capped at
CAP rows (--max-rows), against the one-process baseline (dlrm_local.py:
nn.EmbeddingBag(sparse=True), torch.optim.Adagrad) on the same data.

  - the psd job's test AUC is README.md's figure for torch-dlrm.json,
    within AUC_VS_BASELINE of the baseline's,
    within AUC_VS_TRUTH of truth.json's true_auc (the generator's model)
    and AUC_OVER_DENSE above its integer term's alone (dense_true_auc);
    every training example was trained on once (the final: lines)
  - `psctl export` of the 26 tables and of the dense variables, loaded by
    psd.export into the plain torch model (nn.EmbeddingBag), predicts the
    test set (every other line with 5 fields' values never seen: rows
    never stored) as the psd-trained model does (dlrm.py --predict-only,
    after training and the export, on the same shards): equal to float32
    rounding
  - rows never stored (not in the export) are filled with docs/tables.md's
    initial row: equal bit for bit to what a pull from the shards answers
  - RowInitTest, on a shard of its own (a few seconds): a job.tables entry
    without init_scale takes job.table_defaults' (as the shards do), so the
    export's never-stored rows equal a shard's pull bit for bit

About 60-90 s on 2 cores. Exits 77 (SKIP) when PyTorch or numpy is missing.
Run: /usr/bin/python3 test_dlrm.py BUILD_DIR"""
import json
import os
import sys
import tempfile
import time
import unittest

import harness as h
from test_examples import stated

try:
    import numpy as np
    import torch
except ImportError as e:
    print("SKIP: PyTorch or numpy is not installed (python3-torch, python3-numpy): %s" % e)
    sys.exit(h.EXIT_SKIP)

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
TORCH_DIR = os.path.join(ROOT, "deploy", "examples", "torch")
sys.path.insert(0, TORCH_DIR)

TRAIN = 300_000         # training examples generated (one epoch)
TEST = 30_000           # held-out examples
CAP = 100_000           # rows per table at most (--max-rows)
AUC_VS_BASELINE = 0.015  # |psd's test AUC - the one-process baseline's| at most
# true_auc - the test AUC at most. One pass over 300,000 examples of
# psd-ctrgen's Criteo data takes this model to 0.816 (psd) and 0.820 (one
# process) of a true AUC of 0.834, 0.018 and 0.014 short (0.005 at the
# example's 5,000,000: docs/ctr.md); the tail's values are seen too rarely to
# learn (more epochs overfit them). Version 1's truth, whose small fields'
# values collided in the tables' rows, stopped 0.034-0.038 short.
AUC_VS_TRUTH = 0.03
# and above the AUC of the true model's integer term alone (dense_true_auc)
# by at least this: the embeddings learned
AUC_OVER_DENSE = 0.08
TIMEOUT_S = 300



def final(lines, who):
    """The key=value pairs of the final: line starting with who."""
    for line in lines:
        if "final: " + who in line:
            return dict(p.split("=", 1) for p in line.split("final: ", 1)[1].split() if "=" in p)
    return None


class DlrmTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        sys.path.insert(0, os.path.join(h.BUILD, "worker", "python"))
        import dlrm_model as dm
        cls.dm = dm
        cls.tmp = tempfile.TemporaryDirectory(prefix="psd-dlrm-")
        d = cls.d = cls.tmp.name
        cls.env = h.torch_env(h.BUILD)
        with open(os.path.join(ROOT, "deploy", "examples", "torch-dlrm.json")) as f:
            base = json.load(f)["job"]
        cap = str(CAP)
        job = dict(base, data_dir=os.path.join(d, "data"), log_every=100,
                   tables=dm.capped_tables(base, CAP),
                   worker_command=["/usr/bin/python3", os.path.join(TORCH_DIR, "dlrm.py"),
                                   "--max-rows", cap, "--train", str(TRAIN), "--test",
                                   str(TEST)])
        cls.job = job
        cls.spec = os.path.join(d, "spec.json")
        h.write_spec(cls.spec, nps=2, nworker=2, job=job)
        t0 = time.monotonic()
        r = h.run([os.path.join(h.BUILD, "worker", "psd-ctrgen"), "--format", "criteo", "--out",
                   job["data_dir"], "--train", str(TRAIN), "--test", str(TEST), "--seed", "7"],
                  timeout=TIMEOUT_S)
        assert r.returncode == 0, r.stdout + r.stderr
        with open(os.path.join(job["data_dir"], "truth.json")) as f:
            cls.truth = json.load(f)
        print("generated in %.1f s" % (time.monotonic() - t0))
        # The one-process baseline.
        t0 = time.monotonic()
        r = h.run(["/usr/bin/python3", os.path.join(TORCH_DIR, "dlrm_local.py"), "--spec",
                   cls.spec, "--max-rows", cap, "--train", str(TRAIN), "--test", str(TEST),
                   "--predictions", os.path.join(d, "local.npy")],
                  timeout=TIMEOUT_S, env=cls.env)
        cls.local_out = r.stdout + r.stderr
        assert r.returncode == 0, cls.local_out
        cls.local = final(r.stdout.splitlines(), "local")
        print("baseline in %.1f s: %s" % (time.monotonic() - t0,
                                          [l for l in r.stdout.splitlines() if "final:" in l]))
        # The psd job, on shards of this test's: they outlive the workers.
        cls.ps = [h.start_psd(cls.spec, i) for i in range(2)]
        try:
            cls.run_psd()
        finally:
            rcs = [p.stop() for p in cls.ps]
        assert rcs == [0, 0], "psd exited %s" % rcs

    @classmethod
    def run_psd(cls):
        d, cap = cls.d, str(CAP)
        t0 = time.monotonic()
        r = h.run([h.build_path("deploy", "pslaunch"), "--only", "worker", cls.spec],
                  timeout=TIMEOUT_S, env=cls.env)
        cls.psd_out = r.stdout + r.stderr
        assert r.returncode == 0, cls.psd_out[-4000:]
        print("psd job in %.1f s: %s" % (time.monotonic() - t0,
                                         [l for l in r.stdout.splitlines() if "final:" in l]))
        lines = r.stdout.splitlines()
        cls.finals = [final(lines, "worker=%d" % i) for i in range(2)]
        cls.exports = {}
        for name in cls.dm.FEATURES:
            out = os.path.join(d, name + ".safetensors")
            r = h.psctl(cls.spec, "export", name, "--out", out)
            assert r.returncode == 0, r.stdout + r.stderr
            cls.exports[name] = out
        cls.dense = os.path.join(d, "dense.safetensors")
        r = h.psctl(cls.spec, "export", "--out", cls.dense)
        assert r.returncode == 0, r.stdout + r.stderr
        # The psd-trained model's predictions: a client that does not join
        # pulls the shards' model once training is over. After the export:
        # a pull stores the rows it touches, so the test set's ids that
        # training never saw are in the export only as initial rows.
        # The data it predicts: the test set with, on every other line, the
        # values of 5 large fields replaced by values never seen (their rows
        # are then initial rows, not in the export).
        cls.probe = os.path.join(d, "probe.tsv")
        fresh = np.random.default_rng(5).integers(0, 1 << 32, size=(TEST, 5))
        with open(cls.dm.data_file(cls.job["data_dir"], "test")) as f, \
                open(cls.probe, "w") as out:
            for i, line in enumerate(f):
                p = line.rstrip("\n").split("\t")
                if i % 2:
                    for k, field in enumerate((3, 4, 12, 16, 21)):
                        p[13 + field] = "%08x" % fresh[i, k]
                out.write("\t".join(p) + "\n")
        pred = os.path.join(d, "psd.npy")
        r = h.run(["/usr/bin/python3", os.path.join(TORCH_DIR, "dlrm.py"), "--spec", cls.spec,
                   "--max-rows", cap, "--predict-only", "--predict-data", cls.probe,
                   "--predictions", pred],
                  timeout=TIMEOUT_S, env=dict(cls.env, PSD_TASK=""))
        assert r.returncode == 0, r.stdout + r.stderr
        cls.psd_pred = np.load(pred)
        # Rows the export lacks, as the shards answer them (a pull stores
        # them, so after the export).
        import psd
        import psd.export
        cls.unstored = {}
        with psd.Client(cls.spec) as c:
            for name, card in zip(("C3", "C12"), (cls.cap("C3"), cls.cap("C12"))):
                have = psd.export.read_safetensors(cls.exports[name])["ids"]
                ids = np.ascontiguousarray(
                    np.setdiff1d(np.arange(card, dtype=np.uint64), have)[::37][:200])
                c.declare_table(name, 16, card)
                cls.unstored[name] = (ids, c.pull_rows(name, ids))

    @classmethod
    def cap(cls, name):
        return dict(zip(cls.dm.FEATURES, cls.dm.cardinalities(CAP)))[name]

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_every_example_trained_once(self):
        self.assertIsNotNone(self.local, self.local_out)
        self.assertEqual(int(self.local["examples"]), TRAIN)
        for i, f in enumerate(self.finals):
            self.assertIsNotNone(f, "worker %d printed no final: line\n%s" % (i, self.psd_out))
            self.assertEqual(f["mode"], "async")
            self.assertGreater(float(f["rows_pulled_per_s"]), 0)
            self.assertGreater(float(f["rows_pushed_per_s"]), 0)
        self.assertEqual(sum(int(f["examples"]) for f in self.finals), TRAIN)
        self.assertIn("test_auc", self.finals[0])

    def test_auc_near_the_baseline_and_the_truth(self):
        psd_auc = float(self.finals[0]["test_auc"])
        local_auc = float(self.local["test_auc"])
        true_auc = float(self.truth["true_auc"])
        self.assertAlmostEqual(float(self.finals[0]["true_auc"]), true_auc, places=4)
        print("test_auc psd=%.4f local=%.4f true=%.4f dense_true=%s"
              % (psd_auc, local_auc, true_auc, self.truth["dense_true_auc"]))
        self.assertLess(abs(psd_auc - local_auc), AUC_VS_BASELINE,
                        "psd %.4f, one process %.4f" % (psd_auc, local_auc))
        self.assertGreater(psd_auc, true_auc - AUC_VS_TRUTH)
        self.assertGreater(local_auc, true_auc - AUC_VS_TRUTH)
        self.assertGreater(psd_auc, float(self.truth["dense_true_auc"]) + AUC_OVER_DENSE)
        stated("torch-dlrm.json").check(self, self.finals[0])  # README's figure

    def test_exported_model_predicts_as_the_psd_model(self):
        import psd.export
        dm = self.dm
        spec = psd.export.Spec(self.spec)
        cards = dm.cardinalities(CAP)
        bags = dm.Bags(cards, 16)
        for name, card in zip(dm.FEATURES, cards):
            bags.bags[name].weight.data.copy_(spec.table(self.exports[name], name, card))
        model = dm.DLRM(bags, 16, [64], [128, 64])
        loaded = psd.export.load_dense(model, self.dense, skip=("embeddings.",))
        self.assertEqual(len(loaded), len([n for n, _ in model.named_parameters()
                                           if not n.startswith("embeddings.")]))
        p, y = dm.predict(model, self.probe, CAP)
        self.assertEqual(p.shape, (TEST,))
        self.assertEqual(self.psd_pred.shape, (TEST,))
        diff = float(np.abs(p - self.psd_pred).max())
        print("exported model: max |p - p_psd| = %g, test_auc %.4f" % (diff, dm.auc(p, y)))
        np.testing.assert_allclose(p, self.psd_pred, rtol=1e-6, atol=1e-7)
        # and the export is not the initial model: it learned
        self.assertGreater(dm.auc(p, y), 0.6)
        # many of the probe's rows were not in the export (initial rows)
        ids = torch.cat([b[1] for b in dm.batches(self.probe, 8192, cap=CAP)]).numpy()
        fresh = 0
        for f in (3, 4, 12, 16, 21):
            have = psd.export.read_safetensors(self.exports["C%d" % f])["ids"]
            fresh += int((~np.isin(ids[1::2, f - 1].astype(np.uint64), have)).sum())
        print("probe rows not in the export: %d" % fresh)
        self.assertGreater(fresh, 1000)

    def test_rows_never_stored_are_their_initial_value(self):
        import psd.export
        spec = psd.export.Spec(self.spec)
        for name, (ids, pulled) in self.unstored.items():
            self.assertGreater(len(ids), 50, name)
            init, scale = spec.init(name)
            self.assertEqual((init, scale), ("uniform", 0.05))
            want = psd.export.initial_rows(spec.seed, name, ids, 16, init, scale)
            np.testing.assert_array_equal(want, pulled)
            w = psd.export.table_weight(self.exports[name], self.cap(name), table=name,
                                        seed=spec.seed, init=init, init_scale=scale)
            np.testing.assert_array_equal(w[ids.astype(np.int64)], pulled)

    def test_export_errors_name_the_file(self):
        import psd.export
        bad = os.path.join(self.d, "bad.safetensors")
        with open(bad, "wb") as f:
            f.write(b"\x04\x00")
        with self.assertRaisesRegex(ValueError, "bad.safetensors: 2 bytes"):
            psd.export.read_safetensors(bad)
        with self.assertRaisesRegex(ValueError, "C3.safetensors: table 'C3' holds id"):
            psd.export.table_weight(self.exports["C3"], 10, table="C3")
        with self.assertRaisesRegex(ValueError, "no 'ids' tensor"):
            psd.export.table_weight(self.dense, 10, table="x")


class RowInitTest(h.ShardsTest):
    """A row's first value has one definition (common/vars/init.c), and a
    table's initializer one resolution (cm_table_conf_for): psd.export asks
    the same C code as the shard. Table "t" is listed in job.tables without
    an init_scale, so it takes job.table_defaults' 0.05 (a copy that fell
    back to docs/tables.md's 0.01 instead differed here); "d" is declared
    by the client alone (job.table_defaults' too)."""

    NPS = 1
    JOB = {"name": "rowinit", "seed": 3,
           "table_defaults": {"init_scale": 0.05, "optimizer": {"type": "sgd", "lr": 1}},
           "tables": [{"name": "t", "dim": 8, "id_bound": 5000}]}

    @classmethod
    def setUpClass(cls):
        sys.path.insert(0, os.path.join(h.BUILD, "worker", "python"))
        super().setUpClass()

    def test_never_stored_rows_equal_a_pull(self):
        import psd
        import psd.export
        d = self.tmp.name
        stored = np.array([4, 17, 4000], np.uint64)
        with psd.Client(self.spec) as c:
            for name in ("t", "d"):
                c.declare_table(name, 8, 5000)
                c.push_rows(name, stored, np.ones((3, 8), np.float32))
                r = h.psctl(self.spec, "export", name, "--out",
                            os.path.join(d, name + ".safetensors"))
                self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            spec = psd.export.Spec(self.spec)
            self.assertEqual(spec.seed, 3)
            for name in ("t", "d"):
                path = os.path.join(d, name + ".safetensors")
                w = spec.table(path, name, 5000).numpy()
                # after the export: a pull stores the rows it touches
                ids = np.setdiff1d(np.arange(0, 5000, 7, dtype=np.uint64), stored)
                np.testing.assert_array_equal(w[ids.astype(np.int64)], c.pull_rows(name, ids),
                                              err_msg="table " + name)
                self.assertEqual(spec.init(name), ("uniform", float(np.float32(0.05))))
                np.testing.assert_array_equal(
                    psd.export.initial_rows(spec, name, ids, 8), w[ids.astype(np.int64)])
                # the stored rows are the export's: initial row - 1 (sgd, lr 1)
                np.testing.assert_array_equal(w[stored.astype(np.int64)],
                                              c.pull_rows(name, stored))
                self.assertGreater(float(np.abs(w[ids.astype(np.int64)]).max()), 0.04)

    def test_spec_mistakes_name_the_file(self):
        import psd.export
        bad = os.path.join(self.tmp.name, "bad.json")
        with open(bad, "w") as f:
            json.dump({"cluster": {"ps": ["127.0.0.1:1"]},
                       "job": {"tables": [{"name": "t", "dim": 8, "init_scale": -1}]}}, f)
        with self.assertRaisesRegex(ValueError, r"bad.json: job.tables\[0\].init_scale"):
            psd.export.Spec(bad)
        with self.assertRaisesRegex(FileNotFoundError, "nothere.json"):
            psd.export.Spec(os.path.join(self.tmp.name, "nothere.json"))


if __name__ == "__main__":
    h.main()
