"""Scores the CTR model (docs/ctr.md) in numpy from parameters read out of
psd: the serving tier's lookups in the online tests and `bench serve`.

The forward pass is worker/model/ctr.c's: feature id i belongs to field
i // 10**9; a field's vector is the sum (or mean) of its features' `emb` rows
times their values; the fields' vectors concatenated go through the MLP
(`ctr/w<l>` [in, out] row-major, `ctr/b<l>`, ReLU between layers); the wide
part, each feature's `wide` row times its value, is added to the output.
"""
import numpy as np

FIELD = 10 ** 9


def read_svm(path):
    """A LIBSVM file as (labels uint8 [n], starts int64 [n+1], ids uint64,
    vals float32), blank lines and # comments skipped."""
    labels, starts, ids, vals = [], [0], [], []
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].split()
            if not line:
                continue
            labels.append(1 if float(line[0]) > 0 else 0)
            for tok in line[1:]:
                k, v = tok.split(":")
                ids.append(int(k))
                vals.append(float(v))
            starts.append(len(ids))
    return (np.array(labels, np.uint8), np.array(starts, np.int64),
            np.array(ids, np.uint64), np.array(vals, np.float32))


def logits(data, rows, wide, dense, fields, dim, mean=False):
    """The model's logits for data (read_svm's); rows(ids) and wide(ids)
    answer the unique ids' rows ([k, dim] and [k, 1]); dense maps
    "ctr/w0".. to arrays."""
    y, starts, ids, vals = data
    uniq, inv = np.unique(ids, return_inverse=True)
    emb = np.asarray(rows(uniq), np.float32).reshape(len(uniq), dim)
    wd = np.asarray(wide(uniq), np.float32).reshape(len(uniq))
    n = len(y)
    ex = np.repeat(np.arange(n), np.diff(starts))
    field = (ids // np.uint64(FIELD)).astype(np.int64)
    x = np.zeros((n, fields, dim), np.float32)
    np.add.at(x, (ex, field), emb[inv] * vals[:, None])
    if mean:
        cnt = np.zeros((n, fields), np.float32)
        np.add.at(cnt, (ex, field), 1)
        x /= np.maximum(cnt, 1)[:, :, None]
    h = x.reshape(n, fields * dim)
    nl = sum(1 for k in dense if k.startswith("ctr/w"))
    for layer in range(nl):
        w = dense["ctr/w%d" % layer]
        h = h @ w.reshape(h.shape[1], -1) + dense["ctr/b%d" % layer]
        if layer + 1 < nl:
            h = np.maximum(h, 0)
    out = h.reshape(n).astype(np.float64)
    np.add.at(out, ex, (wd[inv] * vals).astype(np.float64))
    return out


def auc(y, score):
    """Area under the ROC curve, ties counted half (the rank statistic)."""
    y = np.asarray(y)
    order = np.argsort(score, kind="mergesort")
    s = np.asarray(score)[order]
    ranks = np.empty(len(s))
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[i]:
            j += 1
        ranks[i:j + 1] = (i + j) / 2.0 + 1
        i = j + 1
    r = np.empty(len(s))
    r[order] = ranks
    pos = int(y.sum())
    neg = len(y) - pos
    if pos == 0 or neg == 0:
        return float("nan")
    return float((r[y == 1].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


def logloss(y, z):
    """Mean logistic loss of logits z."""
    z = np.asarray(z, np.float64)
    return float(np.mean(np.logaddexp(0, z) - np.asarray(y) * z))
