"""The DLRM of deploy/examples/torch-dlrm.json, shared by its psd worker
(dlrm.py) and its one-process baseline (dlrm_local.py): the model, the
command line both take, the data, the test metrics and the final: line.

The model is plain PyTorch. Its embeddings are given to it: a module whose
forward takes the batch's categorical ids, an int64 tensor [B, 26], and
returns 26 [B, dim] tensors (one pooled row per example and feature).
dlrm.py gives it psd.torch.EmbeddingBagCollection over 26
psd.torch.EmbeddingBag (every feature's rows in one pull per step);
dlrm_local.py gives it Bags over 26 torch.nn.EmbeddingBag(sparse=True);
an exported model (psd.export) is the same Bags.

    bottom MLP:   log(1 + max(x, 0)) of the 13 integer features -> dim
    interaction:  the pairwise dot products of the 27 vectors (the bottom
                  MLP's and the 26 embeddings'), DLRM's i > j triangle
    top MLP:      [bottom, dots] -> ... -> 1 logit; BCE loss
"""
import argparse
import json
import os
import shutil
import subprocess
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

NUM_DENSE = 13
NUM_SPARSE = 26
FEATURES = ["C%d" % (f + 1) for f in range(NUM_SPARSE)]  # the tables' names


def mlp(sizes, last_relu):
    """Linear layers of sizes[0] -> sizes[1] -> ..., a ReLU after each but
    (unless last_relu) the last."""
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2 or last_relu:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    """DLRM (Naumov et al. 2019) with dot interactions. embeddings: a module
    mapping int64 ids [B, 26] to 26 [B, dim] tensors (Bags, or
    psd.torch.EmbeddingBagCollection); dim: their width, the bottom MLP's
    output; bottom, top: the hidden widths of the two MLPs."""

    def __init__(self, embeddings, dim=16, bottom=(64,), top=(128, 64)):
        super().__init__()
        self.embeddings = embeddings
        self.bottom = mlp([NUM_DENSE] + list(bottom) + [dim], last_relu=True)
        n = NUM_SPARSE + 1
        li, lj = torch.tril_indices(n, n, offset=-1)
        # z[b, i, j] for i > j, as indices into z[b] flattened
        self.register_buffer("pairs", li * n + lj, persistent=False)
        self.top = mlp([dim + len(li)] + list(top) + [1], last_relu=False)

    def forward(self, dense, sparse):
        x = self.bottom(torch.log1p(torch.clamp(dense, min=0)))
        t = torch.stack([x] + list(self.embeddings(sparse)), dim=1)
        z = torch.bmm(t, t.transpose(1, 2)).flatten(1).index_select(1, self.pairs)
        return self.top(torch.cat([x, z], dim=1)).squeeze(1)


class Bags(nn.Module):
    """torch.nn.EmbeddingBag per feature, called as
    psd.torch.EmbeddingBagCollection is: ids [B, F] -> F [B, dim]. Each
    bag is bags[name] (a ModuleDict: parameter embeddings.bags.C1.weight,
    ...)."""

    def __init__(self, cardinalities, dim, sparse=True, names=FEATURES):
        super().__init__()
        self.names = list(names)
        self.bags = nn.ModuleDict({
            n: nn.EmbeddingBag(int(c), dim, mode="sum", sparse=sparse)
            for n, c in zip(self.names, cardinalities)})
        self._offsets = None

    def forward(self, ids):
        b = ids.shape[0]
        if self._offsets is None or self._offsets.shape[0] != b:
            self._offsets = torch.arange(b, dtype=torch.int64)
        return [self.bags[n](ids[:, f].contiguous(), self._offsets)
                for f, n in enumerate(self.names)]


def init_bags(bags, scale, seed):
    """Uniform in [-scale, scale), the rows' init of the spec's tables
    (docs/tables.md), drawn by torch's generator."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n in bags.names:
            w = bags.bags[n].weight
            w.uniform_(-scale, scale, generator=g)


# ---- the command line and the spec

def parse_args(argv=None, prog=None):
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    ap.add_argument("--spec", help="the job spec (default $PSD_SPEC)")
    ap.add_argument("--train", type=int,
                    help="training examples to generate (default psd-ctrgen's, 4M)")
    ap.add_argument("--test", type=int,
                    help="held-out examples to generate (default psd-ctrgen's, 100k)")
    ap.add_argument("--data-seed", type=int, help="the data's seed (default psd-ctrgen's, 7)")
    ap.add_argument("--dim", type=int, default=16, help="embedding width")
    ap.add_argument("--bottom", default="64", help="bottom MLP hidden widths")
    ap.add_argument("--top", default="128,64", help="top MLP hidden widths")
    ap.add_argument("--max-rows", type=int, default=0,
                    help="cap each table at this many rows (ids %% min(cardinality, cap)); "
                    "0: psd.criteo.CARDINALITIES")
    ap.add_argument("--max-examples", type=int, default=0,
                    help="stop after this many training examples per worker (0: all)")
    ap.add_argument("--predictions", help="write the test set's predictions (float32 .npy)")
    ap.add_argument("--predict-only", action="store_true",
                    help="(dlrm.py) no training: the shards' model predicts the test set")
    ap.add_argument("--predict-data", help="with --predict-only: this Criteo file, not the "
                    "test set")
    ap.add_argument("--threads", type=int,
                    default=int(os.environ.get("PSD_TORCH_THREADS", "1")))
    a = ap.parse_args(argv)
    a.bottom = [int(x) for x in a.bottom.split(",") if x]
    a.top = [int(x) for x in a.top.split(",") if x]
    return a


def load_job(path):
    with open(path) as f:
        return json.load(f)["job"]


def table_settings(job, name):
    """The row settings of table `name` as the shards apply them
    (docs/tables.md): docs/tables.md's defaults, over them
    job.table_defaults, over those the table's job.tables entry (whose
    optimizer object, when given, replaces the default's whole). The
    shards' own resolution is common/'s cm_table_conf_for; psd.export asks
    it (psd.export.Spec), this one-process baseline reads the spec itself."""
    doc_opt = {"type": "adagrad", "lr": 0.05, "eps": 1e-8, "initial_accumulator": 0.1}
    conf = {"init": "uniform", "init_scale": 0.01, "optimizer": dict(doc_opt)}
    layers = [job.get("table_defaults", {})]
    layers += [t for t in job.get("tables", []) if t.get("name") == name][:1]
    for layer in layers:
        for k in ("init", "init_scale"):
            if k in layer:
                conf[k] = layer[k]
        if "optimizer" in layer:
            conf["optimizer"] = dict(doc_opt, **layer["optimizer"])
    return conf


def data_dir(job, spec_path):
    d = job.get("data_dir", "/var/tmp/psd-dlrm")
    if not os.path.isabs(d):
        d = os.path.join(os.path.dirname(os.path.abspath(spec_path)), d)
    return d


def ctrgen_program():
    """psd-ctrgen: $PSD_CTRGEN, the build tree's (beside the psd package
    pslaunch puts first on PYTHONPATH: BUILD/worker/python/psd), or PATH."""
    if os.environ.get("PSD_CTRGEN"):
        return os.environ["PSD_CTRGEN"]
    import psd
    here = os.path.dirname(os.path.abspath(psd.__file__))
    for cand in (os.path.join(here, "..", "..", "psd-ctrgen"),
                 os.path.join(here, "..", "..", "..", "bin", "psd-ctrgen")):
        if os.access(cand, os.X_OK):
            return os.path.normpath(cand)
    found = shutil.which("psd-ctrgen")
    if not found:
        raise FileNotFoundError("psd-ctrgen not found (set PSD_CTRGEN, or build psd)")
    return found


def ensure_data(d, train, test, seed, who="dlrm"):
    """The data in d, by `psd-ctrgen --format criteo --keep` (worker/data/
    ctrdata.h, docs/ctr.md "Whose data"): psd's generated data of these
    sizes and seed (generated when d is new or psd's of other settings), or
    the user's files as they are (Criteo Kaggle's train.txt/test.txt, plain
    or .gz, too; psd writes nothing there); a directory holding neither is
    refused (psd-ctrgen's message, exit 1). Workers starting together: one
    runs it (under an flock on d.lock), the others wait for it. Says which
    files; returns (truth, files): truth.json's dict for psd's data, None for
    the user's (no true model), and {"train": path, "test": path}."""
    import fcntl

    want = {k: v for k, v in (("train", train), ("test", test), ("seed", seed))
            if v is not None}
    os.makedirs(os.path.dirname(os.path.abspath(d)) or ".", exist_ok=True)
    with open(d.rstrip("/") + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        argv = [ctrgen_program(), "--format", "criteo", "--out", d, "--keep"]
        for k, v in want.items():
            argv += ["--" + k, str(v)]
        t0 = time.monotonic()
        r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            raise SystemExit("%s: %s" % (who, r.stderr.strip() or "%s exited %d"
                                         % (" ".join(argv), r.returncode)))
        said = dict(line.split(": ", 1) for line in r.stdout.splitlines()[1:]
                    if ": " in line)
        files = {"train": said["train"], "test": said["test"]}
        truth = read_truth(d) if said.get("data") == "generated" else None
        if not r.stdout.startswith("kept"):
            print("%s: generated the data in %s (%s) in %.1f s, true_auc %.4f"
                  % (who, d, " ".join(argv), time.monotonic() - t0,
                     float(truth.get("true_auc", "nan"))), flush=True)
        print("%s: data: training on %s, testing on %s (%s)"
              % (who, files["train"], files["test"],
                 "psd's generated data set" if truth is not None else
                 "the user's files, read as they are: no true model to compare with"),
              flush=True)
        return truth, files


def read_truth(d):
    """d/truth.json's dict (psd's data: ensure_data reads it only then), or
    None."""
    try:
        with open(os.path.join(d, "truth.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def data_file(d, split):
    """The file of split ("train", "test") in d that a run reads: the first
    of split.tsv, split.tsv.gz, split.txt, split.txt.gz there (Criteo
    Kaggle's names last; worker/data/ctrdata.h's order), else split.tsv. A
    run itself takes its files from ensure_data (psd-ctrgen --keep), which
    also checks whose they are; this is for a reader afterwards, such as
    docs/python.md's predict.py."""
    for name in (split + ".tsv", split + ".tsv.gz", split + ".txt", split + ".txt.gz"):
        if os.path.exists(os.path.join(d, name)):
            return os.path.join(d, name)
    return os.path.join(d, split + ".tsv")


def token(path):
    """path as one key=value token of a final: line, as dworker writes it:
    whitespace, '%' and bytes outside printable ASCII as %XX."""
    return "".join(chr(b) if 0x20 < b < 0x7f and b != 0x25 else "%%%02X" % b
                   for b in os.fsencode(path))


def cardinalities(cap=0):
    """The tables' rows: psd.criteo.CARDINALITIES, each at most cap (> 0)."""
    import psd.criteo
    return [min(int(c), cap) if cap > 0 else int(c) for c in psd.criteo.CARDINALITIES]


def batches(path, batch, share=0, nshares=1, cap=0):
    """(dense [B, 13] f32, ids [B, 26] i64, labels [B] f32) tensors of
    path's lines i with i % nshares == share, ids % cardinalities(cap)."""
    import psd.criteo
    for dense, sparse, labels in psd.criteo.Criteo(path, batch, bounds=cardinalities(cap),
                                                   share=share, nshares=nshares):
        yield torch.from_numpy(dense), torch.from_numpy(sparse), torch.from_numpy(labels)


def train_loss(model, dense, ids, labels):
    return F.binary_cross_entropy_with_logits(model(dense, ids), labels)


# ---- the test metrics

def predict(model, path, cap=0, batch=8192):
    """sigmoid(logit) of every test example, and the labels (numpy)."""
    ps, ys = [], []
    with torch.no_grad():
        for dense, ids, labels in batches(path, batch, cap=cap):
            ps.append(torch.sigmoid(model(dense, ids)).numpy())
            ys.append(labels.numpy())
    return np.concatenate(ps), np.concatenate(ys)


def auc(p, y):
    """The area under the ROC curve (Mann-Whitney, ties averaged)."""
    p = np.asarray(p, np.float64)
    y = np.asarray(y) > 0.5
    order = np.argsort(p, kind="mergesort")
    ps = p[order]
    ranks = np.empty(len(p), np.float64)
    # average ranks over ties
    edges = np.flatnonzero(np.diff(ps)) + 1
    starts = np.concatenate([[0], edges])
    ends = np.concatenate([edges, [len(p)]])
    avg = (starts + ends + 1) / 2.0
    ranks[order] = np.repeat(avg, ends - starts)
    npos = int(y.sum())
    nneg = len(y) - npos
    if npos == 0 or nneg == 0:
        return float("nan")
    return float((ranks[y].sum() - npos * (npos + 1) / 2.0) / (npos * nneg))


def logloss(p, y):
    p = np.clip(np.asarray(p, np.float64), 1e-7, 1 - 1e-7)
    y = np.asarray(y, np.float64)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def final_line(who, p, y, truth, examples, train_s, pulled=None, pushed=None, extra="",
               files=None):
    """The final: line dlrm.py and dlrm_local.py both print; with files
    (ensure_data's), the files trained and tested on at its end
    (train=PATH test=PATH data=generated|user, as dworker's)."""
    true_auc = float(truth.get("true_auc", float("nan"))) if truth else float("nan")
    rate = examples / max(train_s, 1e-9)
    line = ("final: %s test_auc=%.4f test_logloss=%.4f true_auc=%.4f examples=%d "
            "train_s=%.2f examples_per_s=%.0f"
            % (who, auc(p, y), logloss(p, y), true_auc, examples, train_s, rate))
    if pulled is not None:
        line += (" rows_pulled=%d rows_pushed=%d rows_pulled_per_s=%.0f rows_pushed_per_s=%.0f"
                 % (pulled, pushed, pulled / max(train_s, 1e-9), pushed / max(train_s, 1e-9)))
    line += extra
    if files:
        line += " train=%s test=%s data=%s" % (token(files["train"]), token(files["test"]),
                                                "generated" if truth is not None else "user")
    return line


def capped_tables(job, cap):
    """job.tables with each of the 26 tables' id_bound min(cardinality, cap),
    its other settings kept: the spec of a run with --max-rows cap."""
    cards = dict(zip(FEATURES, cardinalities(cap)))
    return [dict(t, id_bound=cards[t["name"]]) if t.get("name") in cards else t
            for t in job.get("tables", [])]
