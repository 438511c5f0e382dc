"""Embedding modules over psd's tables (docs/python.md, "PyTorch
embeddings"), re-exported by psd.torch:

    emb = psd.torch.EmbeddingBag(1000000, 16, mode="sum")  # nn.EmbeddingBag
    ebc = psd.torch.EmbeddingBagCollection({"C1": ..., "C2": ...})
    opt = psd.torch.DistributedOptimizer(torch.optim.Adagrad(...),
                                         named_parameters=..., sparse=[ebc])

Each module's rows live in one psd table (declared with id_bound =
num_embeddings; the shards' per-row optimizer trains them: job.tables or
job.table_defaults). forward pulls the batch's unique ids once into a leaf
tensor and pools it with torch.nn.functional.embedding_bag; backward hands
that leaf's gradient, already summed per unique id, to the shards as one
row per unique id. A collection does all its features in one multi-table
pull and one push (Client.pull_rows_many / push_rows_many).

Async: the push leaves on a background thread as soon as backward makes the
gradient; bounded staleness: the same, and DistributedOptimizer.step()
waits for it before its clock; sync: the gradient is staged with
push_rows_many(step=...) by step() before it asks to be admitted, and rows
are pulled at the step's version (min_version), as the dense pull_at.

Pipelining (prefetch, pipeline): the next batch's rows are pulled on the
background thread while this batch computes. Async: such a row may miss
this worker's push of the step just before (one step), plus other workers'
pushes in flight, never more. Sync: the pull waits for the step it belongs
to (started once step() admitted the previous one), so the rows are exactly
those a pull in forward gets.
"""
import itertools
import threading

import numpy as np
import torch
import torch.nn.functional as F

import psd
from psd._rows import Rows

_default_client = [None]
_default_lock = threading.Lock()
_unnamed = itertools.count()  # "emb.N": N-th unnamed table in the process


def default_client():
    """The process-wide psd.Client() (from the environment pslaunch sets:
    PSD_SPEC, PSD_TASK) that modules and DistributedOptimizer built with
    client=None share."""
    with _default_lock:
        if _default_client[0] is None or _default_client[0].closed:
            _default_client[0] = psd.Client()
        return _default_client[0]


class _Plan:
    """A batch's lookup, before its pull: per table its unique ids, and per
    feature its rows' indices into the pulled leaf."""

    def __init__(self):
        self.tables, self.uids, self.dims = [], [], []
        self.spans = []  # per table (a, b): its floats in the flat leaf
        self.total = 0  # floats
        self.feats = []  # per feature: (module, index, offsets, psw, shape)


def _bags(mod, input, offsets, psw):
    """torch.nn.EmbeddingBag's input rules: (flat int64 ids, offsets, psw,
    batch shape)."""
    if not isinstance(input, torch.Tensor):
        input = torch.as_tensor(input)
    if input.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"table '{mod.table}': input of {input.dtype}; "
                        "expected int64 (or int32) ids")
    if isinstance(mod, Embedding):
        return input.reshape(-1).long(), None, None, tuple(input.shape)
    if input.dim() == 2:
        if offsets is not None:
            raise ValueError(f"table '{mod.table}': offsets with a 2-D "
                             "input (fixed-size bags); give one or the other")
        b, n = input.shape
        offsets = torch.arange(0, b * n, n, dtype=torch.int64)
        if psw is not None:
            psw = psw.reshape(-1)
        return input.reshape(-1).long(), offsets, psw, (b,)
    if input.dim() != 1:
        raise ValueError(f"table '{mod.table}': input of {input.dim()} "
                         "dimensions; expected 1 (with offsets) or 2")
    if offsets is None:
        raise ValueError(f"table '{mod.table}': a 1-D input needs offsets "
                         "(each bag's start)")
    offsets = torch.as_tensor(offsets).long()
    return input.long(), offsets, psw, (offsets.numel(),)


def _check_ids(mod, ids):
    if ids.numel() == 0:
        return
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0:
        raise IndexError(f"table '{mod.table}': id {lo} is negative")
    if hi >= mod.num_embeddings:
        raise IndexError(f"table '{mod.table}': id {hi} is not below "
                         f"num_embeddings {mod.num_embeddings} (its "
                         "id_bound)")


def plan_lookup(feats):
    """The _Plan of features [(module, input, offsets, psw)]: each table's
    ids over all its features made unique once (torch.unique)."""
    plan = _Plan()
    by_table = {}
    parts = []
    for mod, input, offsets, psw in feats:
        ids, offs, w, shape = _bags(mod, input, offsets, psw)
        _check_ids(mod, ids)
        by_table.setdefault(mod.table, (mod, []))[1].append(len(parts))
        parts.append((mod, ids, offs, w, shape))
    index = [None] * len(parts)
    for table, (mod, members) in by_table.items():
        cat = torch.cat([parts[k][1] for k in members])
        # numpy's sort-based unique: twice as fast as torch.unique on CPU
        # (26 features of 2048 ids: 3.5 ms against 7.2, torch 1.13).
        uniq, inverse = (torch.from_numpy(a) for a in
                         np.unique(cat.numpy(), return_inverse=True))
        at = 0
        for k in members:
            n = parts[k][1].numel()
            index[k] = (len(plan.tables), inverse[at:at + n])
            at += n
        plan.tables.append(table)
        plan.uids.append(uniq.numpy().view(np.uint64))
        plan.dims.append(mod.embedding_dim)
        size = uniq.numel() * mod.embedding_dim
        plan.spans.append((plan.total, plan.total + size))
        plan.total += size
    for k, (mod, ids, offs, w, shape) in enumerate(parts):
        plan.feats.append((mod, index[k], offs, w, shape))
    return plan


def _bag(idx, weight, offsets, mode, psw):
    """F.embedding_bag(idx, weight, offsets, mode, psw), as a row gather
    when every bag holds one id (offsets 0, 1, 2, ...: a [batch, features]
    input), whose backward is an index_add: forward and backward 2.5x
    faster than embedding_bag's on 53k ids (torch 1.13, CPU)."""
    n = idx.numel()
    if offsets.numel() == n and torch.equal(
            offsets, torch.arange(n, dtype=offsets.dtype)):
        out = weight.index_select(0, idx)
        return out * psw.reshape(-1, 1) if psw is not None else out
    return F.embedding_bag(idx, weight, offsets, mode=mode,
                           per_sample_weights=psw)


def pool(plan, leaf):
    """The features' outputs over the pulled leaf: one embedding_bag over
    every feature when they share dim and mode (rows of every table stacked
    as one weight), else one per feature."""
    dims = set(plan.dims)
    modes = {getattr(m, "mode", "sum") for m, *_ in plan.feats}
    embs = any(isinstance(m, Embedding) for m, *_ in plan.feats)
    psws = [w is not None for _, _, _, w, _ in plan.feats]
    one = (len(plan.feats) > 1 and len(dims) == 1 and len(modes) == 1 and not
           embs and (not any(psws) or modes == {"sum"}))
    if one:
        d = dims.pop()
        weight = leaf.view(-1, d)
        base = [a // d for a, _ in plan.spans]
        idx, offs, ws, counts, at = [], [], [], [], 0
        for mod, (t, inv), o, w, shape in plan.feats:
            idx.append(inv + base[t])
            offs.append(o + at)
            at += inv.numel()
            counts.append(o.numel())
            if any(psws):
                ws.append(w.reshape(-1) if w is not None else
                          torch.ones(inv.numel(), dtype=torch.float32))
        out = _bag(torch.cat(idx), weight, torch.cat(offs), modes.pop(),
                   torch.cat(ws) if ws else None)
        return list(torch.split(out, counts))
    outs = []
    for mod, (t, inv), o, w, shape in plan.feats:
        a, b = plan.spans[t]
        weight = leaf[a:b].view(-1, plan.dims[t])
        if isinstance(mod, Embedding):
            outs.append(F.embedding(inv, weight).view(*shape, -1))
        else:
            outs.append(_bag(inv, weight, o, mod.mode, w))
    return outs


def lookup(rows, feats, key=None):
    """Pools features [(module, input, offsets, psw)] over their rows,
    pulled in one call (or prefetched for key), the gradient pushed in one
    call when backward reaches the leaf."""
    got = rows.take(key) if key is not None else None
    plan, buf = got if got is not None else (plan_lookup(feats), None)
    if buf is None:
        buf = rows.fetch(plan, rows.version())
    leaf = torch.from_numpy(buf)
    if torch.is_grad_enabled():
        leaf.requires_grad_(True)
        leaf.register_hook(lambda g: rows.push(plan, g.detach()))
    return pool(plan, leaf)


class EmbeddingBag(torch.nn.Module):
    """EmbeddingBag(num_embeddings, embedding_dim, mode="sum", *,
    table=None, client=None): torch.nn.EmbeddingBag over a psd table.

    forward(input, offsets=None, per_sample_weights=None) as torch's: a
    1-D input with offsets (each bag's start) or a 2-D input of fixed bags;
    mode "sum" or "mean"; per_sample_weights with "sum". table: the table's
    name (None: "emb.N", N counting this process's unnamed tables in
    construction order, the same on every worker that builds the same
    model); client: a psd.Client (None: psd.torch.default_client()). The
    table is declared with id_bound=num_embeddings: an id past it, or a
    negative one, raises IndexError naming the table."""

    def __init__(self, num_embeddings, embedding_dim, mode="sum", *,
                 table=None, client=None):
        super().__init__()
        if mode not in ("sum", "mean"):
            raise ValueError(f"mode {mode!r}; psd's EmbeddingBag pools "
                             "'sum' or 'mean'")
        self.mode = mode
        self._declare(num_embeddings, embedding_dim, table, client)

    def _declare(self, num_embeddings, embedding_dim, table, client):
        self.num_embeddings = int(num_embeddings)
        self.embedding_dim = int(embedding_dim)
        if self.num_embeddings < 1:
            raise ValueError(f"num_embeddings {num_embeddings}; expected >= 1")
        self.table = table if table is not None else f"emb.{next(_unnamed)}"
        self.client = client if client is not None else default_client()
        self.client.declare_table(self.table, self.embedding_dim,
                                  self._id_bound())
        self._rows = Rows(self.client, [self.table])

    def _id_bound(self):
        """num_embeddings, unless the spec's job.tables entry of this table
        sets another bound: its shards then hold the table from their start
        with the entry's id_bound (0, none, when it has none), which the
        declare must name; num_embeddings is checked here either way."""
        for t in (getattr(self.client, "job", None) or {}).get("tables", []):
            if isinstance(t, dict) and t.get("name") == self.table:
                bound = int(t.get("id_bound", 0))
                if bound and bound != self.num_embeddings:
                    raise ValueError(
                        f"table '{self.table}': num_embeddings "
                        f"{self.num_embeddings}, but the spec's job.tables "
                        f"entry has id_bound {bound}")
                return bound
        return self.num_embeddings

    def extra_repr(self):
        return (f"{self.num_embeddings}, {self.embedding_dim}, "
                f"table={self.table!r}" +
                (f", mode={self.mode!r}" if hasattr(self, "mode") else ""))

    def forward(self, input, offsets=None, per_sample_weights=None):
        return lookup(self._rows,
                      [(self, input, offsets, per_sample_weights)])[0]


class Embedding(EmbeddingBag):
    """Embedding(num_embeddings, embedding_dim, *, table=None, client=None):
    torch.nn.Embedding over a psd table; forward(input) of any shape gives
    input.shape + (embedding_dim,)."""

    def __init__(self, num_embeddings, embedding_dim, *, table=None,
                 client=None):
        torch.nn.Module.__init__(self)
        self._declare(num_embeddings, embedding_dim, table, client)

    def forward(self, input):
        return lookup(self._rows, [(self, input, None, None)])[0]


class EmbeddingBagCollection(torch.nn.Module):
    """EmbeddingBagCollection(bags, *, client=None): many features' bags
    (TorchRec's EmbeddingBagCollection), all their rows in one multi-table
    pull per batch and their gradients in one push.

    bags: a dict feature name -> EmbeddingBag (or a list: features "0",
    "1", ...); one bag may serve several features (its ids are then made
    unique together). forward(features): a dict name -> (input, offsets[,
    per_sample_weights]) or an ids tensor (2-D: fixed bags; 1-D: one id per
    example), or an int64 tensor [B, F] (one id per example per feature, in
    bags' order). Returns the F features' [B, dim] outputs, a list in bags'
    order. prefetch(next_features) starts the pull of a later batch's rows
    on a background thread; forward(next_features), with that same object,
    takes them (psd.torch.pipeline does both for a loader)."""

    def __init__(self, bags, *, client=None):
        super().__init__()
        if isinstance(bags, (list, tuple)):
            bags = {str(i): b for i, b in enumerate(bags)}
        if not bags:
            raise ValueError("EmbeddingBagCollection: no bags")
        for name, b in bags.items():
            if not isinstance(b, EmbeddingBag):
                raise TypeError(f"feature '{name}': a {type(b).__name__}; "
                                "expected a psd.torch.EmbeddingBag")
        self.features = list(bags)
        self.bags = torch.nn.ModuleDict(
            {n.replace(".", "_"): b for n, b in bags.items()})
        self._mods = list(bags.values())
        self.client = client if client is not None else self._mods[0].client
        for name, b in bags.items():
            if b.client is not self.client:
                raise ValueError(f"feature '{name}' (table '{b.table}'): "
                                 "its bag has another client; a collection's "
                                 "bags share one")
        self._rows = Rows(self.client, sorted({b.table for b in self._mods}))

    def _feats(self, features):
        if isinstance(features, torch.Tensor):
            if features.dim() != 2 or features.shape[1] != len(self._mods):
                raise ValueError(
                    f"features of shape {tuple(features.shape)}; expected "
                    f"[batch, {len(self._mods)}] (one id per feature)")
            b = features.shape[0]
            offs = torch.arange(b, dtype=torch.int64)
            return [(m, features[:, f].contiguous(), offs, None)
                    for f, m in enumerate(self._mods)]
        out = []
        for name, m in zip(self.features, self._mods):
            if name not in features:
                raise KeyError(f"feature '{name}' (table '{m.table}') is "
                               "missing from the batch")
            x = features[name]
            if isinstance(x, (tuple, list)):
                x = tuple(x) + (None,) * (3 - len(x))
                inp, offs, w = x[:3]
            else:
                inp, offs, w = x, None, None
            if isinstance(inp, torch.Tensor) and inp.dim() == 1 and \
                    offs is None:
                offs = torch.arange(inp.numel(), dtype=torch.int64)
            out.append((m, inp, offs, w))
        return out

    def prefetch(self, next_features):
        """Plans the batch next_features (its unique ids) and pulls its rows
        on the background thread (sync: once step() opened its step)."""
        self._rows.prefetch(
            next_features, lambda: plan_lookup(self._feats(next_features)))

    def forward(self, features):
        return lookup(self._rows, self._feats(features), key=features)

    @property
    def calls(self):
        """The multi-table calls made: {"pull": n, "push": n}."""
        return dict(self._rows.calls)


def pipeline(loader, collection, key=None):
    """Yields loader's batches, each next batch's rows pulled while this one
    computes: before a batch is yielded, the one after it is read and
    collection.prefetch(key(next)) started (key: the batch's features for
    the collection; None: the batch itself). forward must then be given
    that same features object."""
    key = key if key is not None else (lambda b: b)
    it = iter(loader)
    try:
        cur = next(it)
    except StopIteration:
        return
    collection.prefetch(key(cur))
    for nxt in it:
        collection.prefetch(key(nxt))
        yield cur
        cur = nxt
    yield cur


def rows_of(modules):
    """The Rows of every psd embedding module in modules (a module, a
    model holding them, or a list), for DistributedOptimizer(sparse=...)."""
    if isinstance(modules, torch.nn.Module):
        modules = [modules]
    out = []
    for top in modules:
        if not isinstance(top, torch.nn.Module):
            raise TypeError(f"sparse: a {type(top).__name__}; expected psd "
                            "embedding modules (or a model holding them)")
        for m in top.modules():
            r = getattr(m, "_rows", None)
            if isinstance(r, Rows) and all(r is not o for o in out):
                out.append(r)
    if not out:
        raise ValueError("sparse: no psd.torch.EmbeddingBag, Embedding or "
                         "EmbeddingBagCollection in it")
    return out
