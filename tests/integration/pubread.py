"""A reader of a training shard's publications (docs/serving.md,
"Publishing"; ps-server/psd/publish/pubfile.h) in plain Python and numpy, written
from the format's description alone: every CRC-32 and size checked, a
chain applied in order. For the tests."""
import json
import os
import struct
import zlib

import numpy as np


def versions(d):
    """The versions of the pub-* directories in d (a ps-<I> directory),
    ascending."""
    out = []
    for name in os.listdir(d) if os.path.isdir(d) else []:
        if name.startswith("pub-") and len(name) == 14 and name[4:].isdigit():
            out.append(int(name[4:]))
    return sorted(out)


def read(d, version):
    """Publication `version` of d as a dict: the manifest's fields, "dense"
    {name: (row_begin, ndarray of the shard's rows)}, "tables" {name:
    (ids, values, removed)}. Raises ValueError naming what is wrong."""
    p = os.path.join(d, "pub-%010d" % version)
    with open(os.path.join(p, "manifest.json"), "rb") as f:
        m = json.loads(f.read())
    body = {k: v for k, v in m.items() if k != "crc"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    if zlib.crc32(text.encode()) != m["crc"]:
        raise ValueError("%s/manifest.json: checksum" % p)
    if m["format"] != "psd-publication-1" or m["version"] != version:
        raise ValueError("%s: format or version" % p)
    with open(os.path.join(p, m["dense_file"]), "rb") as f:
        b = f.read()
    if len(b) != m["dense_bytes"]:
        raise ValueError("%s: dense file size" % p)
    n = struct.unpack("<Q", b[:8])[0]
    head = json.loads(b[8:8 + n])
    data = b[8 + n:]
    dense = {}
    for e in m["dense"]:
        t = head[e["name"]]
        raw = data[t["data_offsets"][0]:t["data_offsets"][1]]
        if zlib.crc32(raw) != e["crc"]:
            raise ValueError("%s: dense %s checksum" % (p, e["name"]))
        shape = [e["row_end"] - e["row_begin"]] + e["shape"][1:]
        dense[e["name"]] = (e["row_begin"],
                            np.frombuffer(raw, dtype="<f4").reshape(shape))
    tables = {}
    for e in m["tables"]:
        with open(os.path.join(p, e["file"]), "rb") as f:
            b = f.read()
        if len(b) != e["bytes"] or zlib.crc32(b[:-4]) != struct.unpack("<I", b[-4:])[0] \
                or zlib.crc32(b[:-4]) != e["crc"]:
            raise ValueError("%s/%s: size or checksum" % (p, e["file"]))
        if b[:8] != b"PSDPUB1\n":
            raise ValueError("%s/%s: magic" % (p, e["file"]))
        dim, nrows, nrem, ver, nl = struct.unpack("<5Q", b[8:48])
        assert (dim, nrows, nrem, ver) == (e["dim"], e["rows"], e["removed"], version)
        assert b[48:48 + nl].decode() == e["name"]
        at = 48 + nl
        ids = np.frombuffer(b[at:at + 8 * nrows], dtype="<u8")
        at += 8 * nrows
        vals = np.frombuffer(b[at:at + 4 * nrows * dim], dtype="<f4").reshape(nrows, dim)
        at += 4 * nrows * dim
        removed = np.frombuffer(b[at:at + 8 * nrem], dtype="<u8")
        tables[e["name"]] = (ids, vals, removed)
    m["dense"] = dense
    m["tables"] = tables
    return m


class State:
    """A shard's values as a chain of publications applied in order builds
    them: dense {name: (row_begin, rows)}, tables {name: {id: row}}."""

    def __init__(self):
        self.dense = {}
        self.tables = {}
        self.version = 0
        self.step = None

    def apply(self, pub):
        """Applies pub (read()): a full one replaces everything, a delta
        must follow the version applied last."""
        if pub["full"]:
            self.tables = {}
        elif pub["prev"] != self.version:
            raise ValueError("delta %d after %d" % (pub["version"], self.version))
        self.dense = dict(pub["dense"])
        for name, (ids, vals, removed) in pub["tables"].items():
            t = self.tables.setdefault(name, {})
            for i in removed.tolist():
                t.pop(i, None)
            for i, row in zip(ids.tolist(), vals):
                t[i] = row.copy()
        self.version = pub["version"]
        self.step = pub["step"]
