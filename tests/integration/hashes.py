"""docs/tables.md's hashes in Python, for the tests that recompute what
the shards and readers compute: splitmix64 (common/base/rand.h's
cm_splitmix64_at), its finalizer mix64, FNV-1a 64, and the partition of
ids over shards."""

M64 = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15


def mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def splitmix64_at(x):
    return mix64((x + GAMMA) & M64)


def fnv1a64(data):
    """FNV-1a 64 of bytes (a str: its UTF-8 bytes): cm_layout_name_hash."""
    if isinstance(data, str):
        data = data.encode()
    v = 0xCBF29CE484222325
    for b in data:
        v = ((v ^ b) * 0x100000001B3) & M64
    return v


def shard_of(i, nshards):
    """The shard that holds id i: splitmix64(i) % shards (layout.h)."""
    return splitmix64_at(i) % nshards
