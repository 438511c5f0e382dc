"""docs/tables.md's hashes in Python, for the tests that recompute what
the shards and readers compute: splitmix64 (common/base/rand.h's
cm_splitmix64_at), its finalizer mix64, FNV-1a 64, and the partition of
ids over shards (the bucket map of a fresh job, or the modulo rule of a
checkpoint written before buckets)."""

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


_MAPS = {}


def shard_of(i, nshards, rule="buckets"):
    """The shard that holds id i in a layout of nshards (layout.h): its
    bucket's, the top 12 bits of splitmix64(i), in a fresh job's map; with
    rule "modulo" (a checkpoint written before buckets) splitmix64(i) %
    nshards."""
    h = splitmix64_at(i)
    if rule == "modulo":
        return h % nshards
    m = _MAPS.get(nshards)
    if m is None:
        m = _MAPS[nshards] = bucket_map(nshards)
    return m[h >> (64 - BUCKET_BITS)]


BUCKET_BITS = 12


def bucket_map(nshards):
    """The bucket map of nshards shards (cm_layout_map_init): built from
    one shard up, each old shard keeping floor or ceil of 4096 / (k + 1)
    buckets (most held first, then lowest index) and giving the rest, first
    in the order of splitmix64(bucket), to the new shard k."""
    nb = 1 << BUCKET_BITS
    order = sorted(range(nb), key=lambda b: (splitmix64_at(b), b))
    shard, count = [0] * nb, [nb]
    for k in range(1, nshards):
        q, r = divmod(nb, k + 1)
        give = [c - q for c in count]
        chosen = set()
        for _ in range(r):
            best = max((s for s in range(k) if s not in chosen),
                       key=lambda s: (count[s], -s))
            chosen.add(best)
            give[best] -= 1
        count.append(0)
        for b in order:
            s = shard[b]
            if give[s] > 0:
                give[s] -= 1
                count[s] -= 1
                shard[b] = k
                count[k] += 1
    return shard


def moves(n, m):
    """The buckets a move from n shards to m makes, in their order
    (cm_layout_moves): grouped by (the shard in the smaller count's map,
    the shard in the larger's), each group's buckets ascending."""
    a, b = bucket_map(min(n, m)), bucket_map(max(n, m))
    return sorted((k for k in range(1 << BUCKET_BITS) if a[k] != b[k]),
                  key=lambda k: (a[k], b[k], k))
