"""A stand-in for a psd serving task (cluster.serve) in Python's grpcio,
speaking the proto's contract (Serve/Lookup, Admin/Status with its serving
block), for the client's tests: routing, failover and the error paths,
without training or publications (test_serving_client.py). The real
serving task is psd --task serve:J; test_lookup_client.py runs that."""
import struct
import threading
import time
from concurrent import futures

import grpc

import pb

from hashes import shard_of  # noqa: F401 (the training shard of an id)


def row_of(i, dim, shard):
    """The row a stub answers for id i: shard-marked, id-dependent."""
    return [float(i % 1000) + 0.25 * k + 1000.0 * shard for k in range(dim)]


class Stub:
    """serve:task of a job of nps shards, listening on addr. tables:
    {name: dim}; the ids whose row it holds (found) are those in held
    (None: all), each row row_of(id). dense: {name: (row_begin, row_end,
    floats)}. fail: None, or (grpc.StatusCode, message) every Lookup is
    answered with. rule: how its publication places rows ("buckets", or
    "modulo" for a job resumed from a checkpoint before buckets): a Lookup
    whose caller planned by the other rule is answered FAILED_PRECONDITION
    "rows moved", as psd's serving task does."""

    def __init__(self, addr, task, nps, tables=None, held=None, dense=None,
                 version=1, step=10, newest_seen=None, time_unix_ms=None,
                 fail=None, rows=0, bytes_=0, refused=0, last_refusal="",
                 rule="buckets", layout=None):
        self.addr, self.task, self.nps = addr, task, nps
        self.shard = task % nps
        self.tables = tables or {}
        self.held = held
        self.dense = dense or {}
        self.version, self.step = version, step
        self.newest_seen = version if newest_seen is None else newest_seen
        self.time_unix_ms = (int(time.time() * 1000) if time_unix_ms is None
                             else time_unix_ms)
        self.fail = fail
        self.rule = rule
        self.moved = 0  # Lookups answered "rows moved"
        self.rows, self.bytes, self.refused = rows, bytes_, refused
        self.last_refusal = last_refusal
        self.layout = layout  # Status: (version, shards, move_to, moved)
        self.lookups = []    # (table, ids, dense names) per call
        self.misrouted = []  # ids that are not this shard's
        self.lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self.server.add_generic_rpc_handlers((
            grpc.method_handlers_generic_handler("psd.v1.Serve", {
                "Lookup": grpc.unary_unary_rpc_method_handler(self._lookup)}),
            grpc.method_handlers_generic_handler("psd.v1.Admin", {
                "Status": grpc.unary_unary_rpc_method_handler(self._status)}),
        ))
        if not self.server.add_insecure_port(addr):
            raise OSError("cannot listen on %s" % addr)
        self.server.start()

    def stop(self):
        self.server.stop(0).wait()

    def _lookup(self, req, ctx):
        f = pb.fields(req)
        table = f.get(2, [b""])[0].decode()
        dense = [d.decode() for d in f.get(3, [])]
        raw = f.get(14, [b""])[0]
        ids = list(struct.unpack("<%dQ" % (len(raw) // 8), raw))
        caller = pb.fields(f.get(1, [b""])[0])
        planned = caller.get(9, [0])[0]  # Caller.rows: 1 modulo, 2 buckets
        if ids and planned and planned != {"modulo": 1, "buckets": 2}[self.rule]:
            with self.lock:
                self.moved += 1
            ctx.abort(grpc.StatusCode.FAILED_PRECONDITION,
                      "rows moved: serve:%d places rows by %s (...); the lookup "
                      "was planned by another rule" % (self.task, self.rule))
        with self.lock:
            self.lookups.append((table, ids, dense))
            self.misrouted += [i for i in ids
                               if shard_of(i, self.nps, self.rule) != self.shard]
        if self.fail:
            ctx.abort(self.fail[0], self.fail[1])
        out = pb.uint(1, self.version) + pb.uint(2, self.step) + \
            pb.uint(3, self.time_unix_ms)
        data = b""
        if table:
            if table not in self.tables:
                ctx.abort(grpc.StatusCode.NOT_FOUND,
                          "serve:%d: no table '%s'" % (self.task, table))
            dim = self.tables[table]
            found = bytes(1 if self.held is None or i in self.held else 0
                          for i in ids)
            for i, fl in zip(ids, found):
                row = row_of(i, dim, self.shard) if fl else [0.0] * dim
                data += struct.pack("<%df" % dim, *row)
            out += pb.uint(4, dim) + pb.ld(5, found)
        for name in dense:
            if name not in self.dense:
                ctx.abort(grpc.StatusCode.NOT_FOUND,
                          "serve:%d: no dense variable '%s'" % (self.task, name))
            b, e, vals = self.dense[name]
            out += pb.ld(6, pb.ld(1, name) + pb.uint(2, b) + pb.uint(3, e))
            data += struct.pack("<%df" % len(vals), *vals)
        return out + pb.ld(15, data)

    def _status(self, req, ctx):
        sv = (pb.uint(1, self.task) + pb.uint(2, self.shard) +
              pb.ld(3, "/pub/ps-%d" % self.shard) + pb.uint(4, self.version) +
              pb.uint(5, self.step) + pb.uint(6, self.time_unix_ms) +
              pb.uint(7, self.newest_seen) + pb.uint(8, self.rows) +
              pb.uint(9, self.bytes) + pb.uint(10, self.version) +
              pb.uint(11, self.refused) +
              (pb.ld(12, self.last_refusal) if self.last_refusal else b"") +
              pb.uint(13, len(self.lookups)))
        if self.layout:
            sv += b"".join(pb.uint(14 + k, v) for k, v in enumerate(self.layout) if v)
        return pb.ld(3, "serve") + pb.ld(92, sv)
