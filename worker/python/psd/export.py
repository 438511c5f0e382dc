"""A model trained through psd, out to a plain PyTorch process
(docs/python.md, "From a Criteo file to an exported model").

    psctl --cluster SPEC export C1 --out C1.safetensors     # each table
    psctl --cluster SPEC export --out dense.safetensors     # the variables

    import psd.export
    spec = psd.export.Spec("job.json")            # job.seed, the tables' init
    for name, bag in bags.items():                # torch.nn.EmbeddingBag
        bag.weight.data.copy_(spec.table(f"{name}.safetensors", name,
                                         bag.num_embeddings))
    psd.export.load_dense(model, "dense.safetensors", skip=("embeddings.",))

A table's export holds the rows the shards store ("ids", U64 [n];
"values", F32 [n, dim]). A row never stored is its initial value, which
docs/tables.md defines from (job.seed, the table's name, the id): table()
fills those rows with the same recipe (splitmix64 in uint64 arithmetic,
vectorised in numpy), so the weight equals what a pull of every id would
answer. load_dense() copies each variable of `psctl export`'s file into the
module's parameter of the same name. Needs numpy (and torch for the
torch-facing calls); reads safetensors itself.
"""
import json
import os
import struct

import numpy as np

_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)
_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_C1 = np.uint64(0xBF58476D1CE4E5B9)
_C2 = np.uint64(0x94D049BB133111EB)
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


def _mix64(z):
    """splitmix64's finalizer, in place on a uint64 array (mod 2^64)."""
    with np.errstate(over="ignore"):
        z ^= z >> np.uint64(30)
        z *= _C1
        z ^= z >> np.uint64(27)
        z *= _C2
        z ^= z >> np.uint64(31)
    return z


def splitmix64(x):
    """cm_splitmix64_at(x) of each element (a new uint64 array)."""
    with np.errstate(over="ignore"):
        return _mix64(np.asarray(x, np.uint64) + _GAMMA)


def fnv1a64(data):
    """FNV-1a 64 of bytes (a table's name in UTF-8)."""
    if isinstance(data, str):
        data = data.encode()
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def initial_rows(seed, table, ids, dim, init="uniform", init_scale=0.01):
    """The initial value of each id's row (docs/tables.md): float32
    [len(ids), dim], bit for bit what a shard creates."""
    ids = np.asarray(ids, np.uint64).ravel()
    if init == "zeros":
        return np.zeros((len(ids), dim), np.float32)
    if init != "uniform":
        raise ValueError(f"table '{table}': init {init!r}; expected 'uniform' or 'zeros'")
    base = splitmix64(np.uint64((int(seed) & 0xFFFFFFFFFFFFFFFF) ^ fnv1a64(table)))
    key = _mix64(base ^ splitmix64(ids))
    out = np.empty((len(ids), dim), np.float32)
    s = np.float32(init_scale)
    with np.errstate(over="ignore"):
        for j in range(dim):
            r = splitmix64(key + np.uint64(j))
            u = (r >> np.uint64(40)).astype(np.float32) * np.float32(1.0 / 16777216.0)
            out[:, j] = (np.float32(2.0) * u - np.float32(1.0)) * s
    return out


def table_weight(path, num_embeddings, *, table, seed=1, init="uniform", init_scale=0.01,
                 chunk=1 << 20):
    """A [num_embeddings, dim] float32 numpy array: the exported rows of
    `psctl export TABLE --out path` where stored, every other row its
    initial value (initial_rows, in chunks of `chunk` ids). ValueError
    naming the file when an id is at or past num_embeddings."""
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
    w = np.empty((num_embeddings, dim), np.float32)
    for b in range(0, num_embeddings, chunk):
        e = min(b + chunk, num_embeddings)
        w[b:e] = initial_rows(seed, table, np.arange(b, e, dtype=np.uint64), dim,
                              init, init_scale)
    w[ids.astype(np.int64)] = values
    return w


class Spec:
    """A job spec's settings an export needs: job.seed, and each table's
    init and init_scale (its job.tables entry, else job.table_defaults,
    else docs/tables.md's defaults: uniform, 0.01)."""

    def __init__(self, spec):
        if isinstance(spec, dict):
            job = spec.get("job", spec)
        else:
            with open(os.fspath(spec)) as f:
                job = json.load(f).get("job", {})
        self.job = job
        self.seed = int(job.get("seed", 1))

    def init(self, table):
        conf = dict(self.job.get("table_defaults", {}))
        for t in self.job.get("tables", []):
            if t.get("name") == table:
                conf = t
                break
        return conf.get("init", "uniform"), float(conf.get("init_scale", 0.01))

    def table(self, path, table, num_embeddings):
        """table_weight() of this spec's table, as a torch tensor."""
        import torch
        init, scale = self.init(table)
        return torch.from_numpy(table_weight(path, num_embeddings, table=table,
                                             seed=self.seed, init=init, init_scale=scale))


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


__all__ = ["read_safetensors", "splitmix64", "fnv1a64", "initial_rows", "table_weight",
           "Spec", "load_dense"]
