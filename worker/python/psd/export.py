"""A model trained through psd, out to a plain PyTorch process
(docs/python.md, "From a Criteo file to an exported model").

    pslaunch --export model job.json          # or psctl export, each table
                                              # and the variables
    import psd.export
    spec = psd.export.Spec("job.json")        # job.seed, the tables' init
    for name, bag in bags.items():            # torch.nn.EmbeddingBag
        bag.weight.data.copy_(spec.table(f"model/{name}.safetensors", name,
                                         bag.num_embeddings))
    psd.export.load_dense(model, "model/dense.safetensors", skip=("embeddings.",))

A table's export holds the rows the shards store ("ids", U64 [n];
"values", F32 [n, dim]). A row never stored is its initial value, which
docs/tables.md defines from (job.seed, the table's name, the id) and the
table's initializer. Both come from the C code the shards run (common/,
through the extension: _psd.table_init resolves the table's init and
init_scale from the spec as the shards do, its job.tables entry completed
from job.table_defaults; _psd.init_rows computes the rows), never from a
copy here, so the weight equals what a pull of every id would answer, bit
for bit. load_dense() copies each variable of an export's file into the
module's parameter of the same name. Needs numpy (and torch for the
torch-facing calls); reads safetensors itself. No client is opened.
"""
import json
import os
import struct

import numpy as np

from . import _psd

_DTYPES = {"F32": np.float32, "F64": np.float64, "F16": np.float16,
           "U64": np.uint64, "I64": np.int64, "U32": np.uint32, "I32": np.int32,
           "U16": np.uint16, "I16": np.int16, "U8": np.uint8, "I8": np.int8}


def read_safetensors(path):
    """{name: numpy array} of a safetensors file (a view of its bytes read
    once); ValueError naming the file and what is wrong."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path}: {len(data)} bytes; not a safetensors file")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise ValueError(f"{path}: a header of {n} bytes in a file of {len(data)}")
    try:
        header = json.loads(data[8:8 + n])
    except ValueError as e:
        raise ValueError(f"{path}: the header is not JSON: {e}") from None
    base = 8 + n
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        dt = _DTYPES.get(t.get("dtype"))
        if dt is None:
            raise ValueError(f"{path}: tensor '{name}' has dtype {t.get('dtype')!r}")
        b, e = t["data_offsets"]
        shape = tuple(int(x) for x in t["shape"])
        want = int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize
        if e - b != want or base + e > len(data):
            raise ValueError(f"{path}: tensor '{name}' of shape {shape} {t['dtype']} "
                             f"has {e - b} bytes at {b}..{e}")
        out[name] = np.frombuffer(data, dt, count=want // np.dtype(dt).itemsize,
                                  offset=base + b).reshape(shape)
    return out


def initial_rows(spec, table, ids, dim):
    """The initial value of each id's row of table in the job of spec (a
    Spec, a spec file's path, or a whole spec as a dict): float32
    [len(ids), dim], bit for bit what a shard creates (common/'s
    cm_table_init_row, through the extension)."""
    if not isinstance(spec, Spec):
        spec = Spec(spec)
    ids = np.ascontiguousarray(np.asarray(ids).ravel().astype(np.uint64, copy=False))
    out = np.empty((len(ids), dim), np.float32)
    init, scale = spec.init(table)
    _psd.init_rows(table, spec.seed, init, scale, ids, out)
    return out


def table_weight(path, num_embeddings, *, table, spec, chunk=1 << 20):
    """A [num_embeddings, dim] float32 numpy array: the exported rows of
    `psctl export TABLE --out path` (or pslaunch --export's path) where
    stored, every other row its initial value in spec's job
    (initial_rows, in chunks of `chunk` ids). ValueError naming the file
    when an id is at or past num_embeddings."""
    if not isinstance(spec, Spec):
        spec = Spec(spec)
    t = read_safetensors(path)
    for k in ("ids", "values"):
        if k not in t:
            raise ValueError(f"{path}: no '{k}' tensor; is it `psctl export TABLE`'s?")
    ids, values = t["ids"], t["values"]
    if values.ndim != 2 or values.shape[0] != ids.shape[0]:
        raise ValueError(f"{path}: {ids.shape[0]} ids but values of shape {values.shape}")
    dim = values.shape[1]
    if len(ids) and int(ids.max()) >= num_embeddings:
        raise ValueError(f"{path}: table '{table}' holds id {int(ids.max())}, "
                         f"at or past num_embeddings {num_embeddings}")
    init, scale = spec.init(table)
    w = np.empty((num_embeddings, dim), np.float32)
    for b in range(0, num_embeddings, chunk):
        e = min(b + chunk, num_embeddings)
        _psd.init_rows(table, spec.seed, init, scale, np.arange(b, e, dtype=np.uint64),
                       w[b:e])
    w[ids.astype(np.int64)] = values
    return w


class Spec:
    """A job spec's settings an export needs, read by the C parser the
    shards use (a spec with mistakes raises ValueError naming each): spec
    is a file's path, or a whole spec as a dict. seed is job.seed;
    init(table) is the table's (init, init_scale) as the shards resolve
    them: its job.tables entry, where it leaves a setting out
    job.table_defaults', else job.table_defaults (docs/tables.md)."""

    def __init__(self, spec):
        if isinstance(spec, dict):
            self._where = {"text": json.dumps(spec)}
        else:
            self._where = {"path": os.fspath(spec)}
        self._init = {}
        self.seed = self._resolve("")[0]  # the spec's mistakes raised here
        if isinstance(spec, dict):
            self.job = spec.get("job", {})
        else:
            with open(os.fspath(spec)) as f:
                self.job = json.load(f).get("job", {})

    def _resolve(self, table):
        return _psd.table_init(table, **self._where)

    def init(self, table):
        """(init, init_scale) of table: "uniform" or "zeros", and the
        uniform bound (a float32, as the shards hold it)."""
        if table not in self._init:
            _, init, scale = self._resolve(table)
            self._init[table] = (init, scale)
        return self._init[table]

    def table(self, path, table, num_embeddings):
        """table_weight() of this spec's table, as a torch tensor."""
        import torch
        return torch.from_numpy(table_weight(path, num_embeddings, table=table, spec=self))


def load_dense(module, path, prefix="", skip=()):
    """Copies each variable of `psctl export --out path` (named prefix +
    the parameter's name, as DistributedOptimizer declares them) into
    module's parameter of that name. Parameters whose names start with one
    of skip are left alone (the embeddings). KeyError naming every
    parameter the file lacks; ValueError naming a shape that differs.
    Returns the names loaded."""
    import torch
    t = read_safetensors(path)
    missing, loaded = [], []
    with torch.no_grad():
        for name, p in module.named_parameters():
            if any(name.startswith(s) for s in skip):
                continue
            v = t.get(prefix + name)
            if v is None:
                missing.append(prefix + name)
                continue
            if v.size != p.numel():
                raise ValueError(f"{path}: '{prefix + name}' has shape {v.shape}; "
                                 f"the parameter {tuple(p.shape)}")
            p.copy_(torch.from_numpy(v.reshape(tuple(p.shape)).copy()))
            loaded.append(name)
    if missing:
        raise KeyError(f"{path} has no variable {', '.join(missing)}")
    return loaded


__all__ = ["read_safetensors", "initial_rows", "table_weight", "Spec", "load_dense"]
