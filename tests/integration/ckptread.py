"""An independent reader of a job's checkpoints (docs/checkpoints.md), by
hand from the format: each shard's newest checkpoint, its variables' rows
put back into whole arrays and its tables' chains (a full file, then
deltas) applied. The whole job's state comes out independent of how many
shards held it, for comparisons bit for bit.
Used by test_reshard.py."""
import glob
import json
import os
import struct

import numpy as np

from test_ckpt import read_safetensors


def newest(shard_dir):
    """The newest ckpt-* directory of a shard's directory."""
    dirs = sorted(glob.glob(os.path.join(shard_dir, "ckpt-*")))
    assert dirs, "no checkpoint in %s" % shard_dir
    return dirs[-1]


def read_table_file(path):
    """A table file (table_file.c): (delta, rows {id: (count, t, last_step,
    value bytes, state bytes)}, evicted ids)."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"PSDTAB1\n", path
    dim, nstate, _, delta, _, _, nrows, nev, nlen = struct.unpack_from("<9Q", data, 8)
    off = 8 + 72 + nlen
    ids = np.frombuffer(data, "<u8", nrows, off)
    off += 8 * nrows
    stats = np.frombuffer(data, np.dtype([("count", "<u4"), ("t", "<u4"),
                                          ("last", "<u8")]), nrows, off)
    off += 16 * nrows
    values = np.frombuffer(data, "<u4", nrows * dim, off).reshape(nrows, dim)
    off += 4 * nrows * dim
    state = np.frombuffer(data, "<u4", nrows * nstate, off).reshape(nrows, nstate)
    off += 4 * nrows * nstate
    evicted = np.frombuffer(data, "<u8", nev, off)
    rows = {int(i): (int(s["count"]), int(s["t"]), int(s["last"]), v.tobytes(), st.tobytes())
            for i, s, v, st in zip(ids, stats, values, state)}
    return bool(delta), rows, [int(e) for e in evicted]


def read_shard(shard_dir):
    """One shard's newest checkpoint: (manifest, {var: (rows, arrays by
    tensor name)}, {table: rows})."""
    ck = newest(shard_dir)
    with open(os.path.join(ck, "manifest.json")) as f:
        m = json.load(f)
    arrays, _ = read_safetensors(os.path.join(ck, "shard.safetensors"))
    tables = {}
    for t in m.get("tables", []):
        rows = {}
        for step in t["chain"]:
            d = os.path.join(shard_dir, "ckpt-%010d" % step)
            with open(os.path.join(d, "manifest.json")) as f:
                entry = [e for e in json.load(f)["tables"] if e["name"] == t["name"]][0]
            delta, got, evicted = read_table_file(os.path.join(d, entry["file"]))
            if not delta:
                rows = {}
            for e in evicted:
                rows.pop(e, None)
            rows.update(got)
        tables[t["name"]] = rows
    return m, arrays, tables


def read_job(root, job):
    """The whole job's state from every ps-* directory's newest checkpoint:
    {"vars": {tensor name: whole array's uint32 bits}, "opt_step": {var:
    step}, "tables": {table: rows}, "steps": [each shard's step],
    "nshards": n, "placement": {var: placement}, "shard_rows": {table:
    [ids of each shard]}}."""
    dirs = sorted(glob.glob(os.path.join(root, job, "ps-*")),
                  key=lambda p: int(p.rsplit("-", 1)[1]))
    out = {"vars": {}, "opt_step": {}, "tables": {}, "steps": [], "placement": {},
           "shard_rows": {}}
    pieces = {}
    for k, d in enumerate(dirs):
        m, arrays, tables = read_shard(d)
        assert m["shard"] == k, (d, m["shard"])
        out["nshards"] = m["nshards"]
        out["steps"].append(m["step"])
        for v in m["vars"]:
            out["placement"][v["name"]] = v["placement"]
            steps = out["opt_step"].setdefault(v["name"], set())
            if v["rows"][1] > v["rows"][0]:
                steps.add(v["opt_step"])
            names = [v["name"]] + ["%s/%s" % (v["name"], s["name"]) for s in v["slots"]]
            tensors = [v["value"]["tensor"]] + [s["tensor"] for s in v["slots"]]
            for name, tensor in zip(names, tensors):
                pieces.setdefault(name, (v["shape"], []))[1].append(
                    (v["rows"][0], v["rows"][1], arrays[tensor]))
        for name, rows in tables.items():
            assert not set(rows) & set(out["tables"].get(name, {})), "an id on two shards"
            out["tables"].setdefault(name, {}).update(rows)
            out["shard_rows"].setdefault(name, []).append(sorted(rows))
    for name, (shape, parts) in pieces.items():
        whole = np.zeros(shape, np.float32).view(np.uint32)
        filled = 0
        for b, e, a in parts:
            whole[b:e] = a.reshape([e - b] + list(shape[1:])).view(np.uint32)
            filled += e - b
        assert filled == shape[0], (name, filled, shape)
        out["vars"][name] = whole
    return out
