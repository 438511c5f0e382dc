"""Serving tasks (psd --task serve:J, docs/serving.md) over publications of
known contents, written by psd's own writer (tests/tools/pubwrite.c, the
format of ps-server/psd/publish/pubfile.h), called through a stock gRPC client
with the job's bearer token:

- Lookup answers the published rows bit for bit with found 1, ids never
  published with found 0 and the table's initial row, dense variables by
  name, each answer's version and step; every replica of a shard alike;
- a delta (rows changed, one removed, one added) is followed within
  seconds; min_version ahead is UNAVAILABLE; an unknown table or variable
  NOT_FOUND naming it; an id of another shard INVALID_ARGUMENT; a call
  without the token UNAUTHENTICATED; Push, SparsePush and Pull refused
  FAILED_PRECONDITION naming the call and the task; Status's serving part;
- a publication with a flipped byte, a truncated one and a skipped version
  are refused loudly (an error line naming the file or version,
  ServingStatus.refused and last_refusal) while answers go on from the
  last good version, which the next full publication replaces; a
  directory emptied and begun again is said, and answers stay;
- a serving task killed with SIGKILL and started again loads the newest
  full publication and the deltas after it, and another replica of the
  shard answers meanwhile;
- lookups from several threads while 30 versions are applied, each
  changing every row: every answer holds the rows of the one version it
  names, none fails;
- a serving task without job.publish.dir, or given --metrics-listen, exits
  2 saying why;
- with TLS in the spec's auth a serving task answers a TLS client with the
  token, and no plaintext one.
test_serve_train.py serves a CTR job that trains.
Run: /usr/bin/python3 test_serve.py BUILD_DIR [ServeTest.test_name]"""
import importlib.util
import json
import os
import shutil
import signal
import struct
import subprocess
import time
import unittest

import harness as h
from hashes import M64, fnv1a64, mix64, shard_of, splitmix64_at
import pb

JOB = "srv"
TOKEN = "serving-token-0123456789abcdef"
SEED = 5
EMB = {"name": "emb", "dim": 3, "init": "uniform", "init_scale": 0.25}
W_SHAPE = (4, 2)  # dense "w": rows 0..2 on shard 0, 2..4 on shard 1


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def initial_row(i, table=None, seed=SEED):
    """docs/tables.md's initial row of id i of table (EMB unless given; a
    uniform one): what cm_table_init_row gives, and a training pull."""
    table = table or EMB
    scale = f32(table["init_scale"])
    key = mix64(splitmix64_at(seed ^ fnv1a64(table["name"])) ^ splitmix64_at(i))
    return [f32((2 * ((splitmix64_at((key + j) & M64) >> 40) * 2.0**-24) - 1) * scale)
            for j in range(table["dim"])]


def ids_of(shard, n, start=1):
    out, i = [], start
    while len(out) < n:
        if shard_of(i, 2) == shard:
            out.append(i)
        i += 1
    return out


def row_value(i, version):
    """A row's floats in a version: exact float32s, with a negative zero,
    a subnormal and a large value among them."""
    return [f32(i * 0.001 + version), [-0.0, 1e-40, 3.0e38][i % 3], f32(-i / 7.0)]


def bits(xs):
    return struct.pack("<%df" % len(xs), *xs)


def decode(msg):
    """A message's top-level fields: {number: [value, ...]}; varints as
    ints, length-delimited as bytes, fixed64 and fixed32 as bytes."""
    out, i = {}, 0

    def varint():
        nonlocal i
        n, shift = 0, 0
        while True:
            b = msg[i]
            i += 1
            n |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return n

    while i < len(msg):
        k = varint()
        wt = k & 7
        if wt == 0:
            v = varint()
        elif wt == 2:
            n = varint()
            v, i = bytes(msg[i:i + n]), i + n
        elif wt in (1, 5):
            n = 8 if wt == 1 else 4
            v, i = bytes(msg[i:i + n]), i + n
        else:
            raise ValueError("wire type %d" % wt)
        out.setdefault(k >> 3, []).append(v)
    return out


@unittest.skipUnless(importlib.util.find_spec("grpc"), "python3-grpcio is not installed")
class ServeTest(h.ProcTest):
    def setUp(self):
        super().setUp()
        self.pub = os.path.join(self.d, "pub")
        self.stage = os.path.join(self.d, "stage")
        h.write_secret(self.d, "token", TOKEN + "\n")
        ports = h.free_ports(7)
        self.spec = os.path.join(self.d, "spec.json")
        self.serve_addrs = ["127.0.0.1:%d" % p for p in ports[3:7]]
        with open(self.spec, "w") as f:
            json.dump({"cluster": {"ps": ["127.0.0.1:%d" % p for p in ports[:2]],
                                   "worker": ["127.0.0.1:%d" % ports[2]],
                                   "serve": self.serve_addrs},
                       "job": {"name": JOB, "seed": SEED, "tables": [EMB],
                               "publish": {"dir": "pub", "interval_s": 1}},
                       "auth": {"token_file": "token"}}, f)
        self.serving = {}
        self.channels = []
        import grpc  # pylint: disable=import-outside-toplevel
        self.grpc = grpc

    def tearDown(self):
        for ch in self.channels:
            ch.close()
        super().tearDown()

    # ---- publications ----

    def write(self, shard, version, full, base, rows=None, removed=(), dense=True,
              into=None):
        """pub-<version> of shard (into: another ps-<I> directory, to be
        damaged before it is moved into place); rows: {id: floats}."""
        lines = ["table emb 3"]
        for i in sorted(rows or {}):
            lines.append("row %d %s" % (i, " ".join(float(x).hex() for x in rows[i])))
        lines += ["removed %d" % i for i in sorted(removed)]
        if dense:
            b, e = (0, 2) if shard == 0 else (2, 4)
            vals = [f32(version * 10 + k + 0.5) for k in range((e - b) * W_SHAPE[1])]
            lines.append("dense w %d %d %d,%d %s" % (b, e, W_SHAPE[0], W_SHAPE[1],
                                                     " ".join(v.hex() for v in vals)))
        d = into or os.path.join(self.pub, JOB, "ps-%d" % shard)
        r = subprocess.run([h.build_path("tests", "pubwrite"), d, JOB, str(shard), "2",
                            str(version), "full" if full else "delta", str(base),
                            str(version * 100)],
                           input="\n".join(lines) + "\n", text=True, capture_output=True,
                           timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        return os.path.join(d, "pub-%010d" % version)

    def damaged(self, shard, version, full, base, rows, how):
        """Writes pub-<version> elsewhere, damages its table file (how:
        'flip' a byte, 'truncate' it), then moves it into place at once,
        as a whole (a rename)."""
        stage = os.path.join(self.stage, "ps-%d" % shard)
        path = self.write(shard, version, full, base, rows, into=stage)
        table = os.path.join(path, "table-0.bin")
        with open(table, "r+b") as f:
            data = bytearray(f.read())
            if how == "flip":
                data[len(data) // 2] ^= 0x10
            else:
                data = data[:len(data) - 9]
            f.seek(0)
            f.truncate()
            f.write(data)
        dest = os.path.join(self.pub, JOB, "ps-%d" % shard, os.path.basename(path))
        os.rename(path, dest)
        return dest

    # ---- serving tasks and calls ----

    def start(self, j):
        p = h.Proc([h.build_path("ps-server", "psd"), "--cluster", self.spec,
                    "--task", "serve:%d" % j])
        p.wait_for("ready: listening on")
        self.procs.append(p)
        self.serving[j] = p
        return p

    def call(self, j, method, msg, token=True):
        ch = self.grpc.insecure_channel(self.serve_addrs[j])
        self.channels.append(ch)
        md = [("authorization", "Bearer " + TOKEN)] if token else []
        return ch.unary_unary(method)(msg, timeout=30, metadata=md)

    def fails(self, j, method, msg, code, *needles, token=True):
        with self.assertRaises(self.grpc.RpcError) as e:
            self.call(j, method, msg, token=token)
        self.assertEqual(e.exception.code(), code, e.exception.details())
        for n in needles:
            self.assertIn(n, e.exception.details())

    def lookup(self, j, ids, dense=(), min_version=0, table="emb"):
        """(version, step, found, rows, dense floats) of a Lookup."""
        msg = pb.caller(JOB) + (pb.ld(2, table) if table else b"")
        msg += b"".join(pb.ld(3, d) for d in dense) + pb.uint(4, min_version)
        msg += pb.ld(14, struct.pack("<%dQ" % len(ids), *ids)) if ids else b""
        r = decode(self.call(j, "/psd.v1.Serve/Lookup", msg))
        dim = r.get(4, [0])[0]
        data = r.get(15, [b""])[0]
        found = list(r.get(5, [b""])[0])
        nrow = len(ids) * dim * 4
        rows = [data[k * dim * 4:(k + 1) * dim * 4] for k in range(len(ids))]
        return r.get(1, [0])[0], r.get(2, [0])[0], found, rows, data[nrow:]

    def status(self, j):
        r = decode(self.call(j, "/psd.v1.Admin/Status", pb.caller(JOB)))
        s = decode(r[92][0])
        return {"replica": s.get(1, [0])[0], "shard": s.get(2, [0])[0],
                "version": s.get(4, [0])[0], "newest_seen": s.get(7, [0])[0],
                "rows": s.get(8, [0])[0], "bytes": s.get(9, [0])[0],
                "applied": s.get(10, [0])[0], "refused": s.get(11, [0])[0],
                "last_refusal": s.get(12, [b""])[0].decode(),
                "lookups": s.get(13, [0])[0]}

    def wait_status(self, j, key, value, timeout=20):
        """Polls Status until its serving field key reaches value (a
        condition, not a sleep: the follower looks every 100 ms)."""
        deadline = time.monotonic() + timeout
        while True:
            st = self.status(j)
            if st[key] >= value:
                return st
            if time.monotonic() > deadline:
                self.fail("serve:%d: %s stayed %r, not %r; output:\n%s"
                          % (j, key, st[key], value, self.serving[j].output()))
            time.sleep(0.05)

    def check_rows(self, j, want, version, gone=()):
        """Lookup of want's ids, of gone (ids published before, removed
        since) and of ids never published, from serve:j: the version's rows
        bit for bit with found 1, the others' initial rows with found 0."""
        shard = j % 2
        never = [i for i in ids_of(shard, 40, 10**6) if i not in want][:3]
        ask = sorted(want) + list(gone) + never
        v, step, found, rows, _ = self.lookup(j, ask)
        self.assertEqual(v, version)
        self.assertEqual(step, version * 100)
        for i, f, row in zip(ask, found, rows):
            if i in want:
                self.assertEqual((i, f, row), (i, 1, bits(want[i])))
            else:
                self.assertEqual((i, f, row), (i, 0, bits(initial_row(i))))

    # ---- tests ----

    def test_lookup_answers_each_version_bit_for_bit(self):
        grpc = self.grpc
        want = {}
        for shard in (0, 1):
            want[shard] = {i: row_value(i, 1) for i in ids_of(shard, 50)}
            self.write(shard, 1, True, 1, want[shard])
        for j in (0, 1, 2):
            self.start(j)
        for j in (0, 1, 2):
            self.wait_status(j, "version", 1)
            self.check_rows(j, want[j % 2], 1)
        # dense alone, and with rows: this shard's rows of w
        _, _, _, _, dense = self.lookup(1, [], dense=["w"], table="")
        self.assertEqual(dense, bits([f32(10 + k + 0.5) for k in range(4)]))
        # a delta: 5 rows changed, one removed, one added
        ids = sorted(want[0])
        change = {i: row_value(i, 2) for i in ids[:5]}
        added = ids_of(0, 1, 5000)[0]
        change[added] = row_value(added, 2)
        self.write(0, 2, False, 1, change, removed=[ids[-1]])
        want[0].update(change)
        del want[0][ids[-1]]
        self.wait_status(0, "version", 2)
        self.check_rows(0, want[0], 2, gone=[ids[-1]])
        _, _, _, _, dense = self.lookup(0, ids[:1], dense=["w"])
        self.assertEqual(dense, bits([f32(20 + k + 0.5) for k in range(4)]))
        # An empty Lookup (no table, ids or dense): the version held, its
        # step, and nothing else (docs/serving.md "Lookup").
        self.assertEqual(self.lookup(0, [], table=""), (2, 200, [], [], b""))
        st = self.wait_status(2, "version", 2)
        # Status's replica is J itself, serving shard J % nps
        self.assertEqual((st["replica"], st["shard"], st["rows"], st["applied"]),
                         (2, 0, 50, 2))
        self.assertGreater(st["bytes"], 50 * 3 * 4)
        self.assertEqual(self.status(1)["version"], 1)  # shard 1 published once
        # refusals, each naming what is wrong
        msg = pb.caller(JOB) + pb.ld(2, "emb") + pb.ld(14, struct.pack("<Q", ids[0]))
        self.fails(0, "/psd.v1.Serve/Lookup", msg + pb.uint(4, 3),
                   grpc.StatusCode.UNAVAILABLE, "serve:0 holds version 2",
                   "min_version 3")
        self.fails(0, "/psd.v1.Serve/Lookup",
                   pb.caller(JOB) + pb.ld(2, "nope") + pb.ld(14, struct.pack("<Q", ids[0])),
                   grpc.StatusCode.NOT_FOUND, "no table 'nope'")
        self.fails(0, "/psd.v1.Serve/Lookup", pb.caller(JOB) + pb.ld(3, "v"),
                   grpc.StatusCode.NOT_FOUND, "no dense variable 'v'")
        other = ids_of(1, 1)[0]
        self.fails(0, "/psd.v1.Serve/Lookup",
                   pb.caller(JOB) + pb.ld(2, "emb") + pb.ld(14, struct.pack("<Q", other)),
                   grpc.StatusCode.INVALID_ARGUMENT, "belongs to shard 1")
        self.fails(0, "/psd.v1.Serve/Lookup", msg, grpc.StatusCode.UNAUTHENTICATED,
                   token=False)
        push = pb.push(JOB, [("w", 0, 2, [4, 2])], [1.0, 2.0])
        for method, name in (("/psd.v1.Data/Push", "Data/Push"),
                             ("/psd.v1.Data/SparsePush", "Data/SparsePush"),
                             ("/psd.v1.Data/Pull", "Data/Pull")):
            self.fails(0, method, push, grpc.StatusCode.FAILED_PRECONDITION,
                       "serve:0 is a serving task (read-only): %s is refused" % name)
        self.check_rows(0, want[0], 2)  # nothing changed
        self.assertGreaterEqual(self.status(0)["lookups"], 4)

    def test_damaged_and_skipped_publications_are_refused(self):
        ids = ids_of(0, 30)
        good = {i: row_value(i, 1) for i in ids}
        self.write(0, 1, True, 1, good)
        two = {i: row_value(i, 2) for i in ids[:10]}
        self.write(0, 2, False, 1, two)
        good.update(two)
        p = self.start(0)
        self.wait_status(0, "version", 2)
        # a flipped byte in a delta: refused, answers stay at version 2
        self.damaged(0, 3, False, 1, {i: row_value(i, 3) for i in ids[:3]}, "flip")
        st = self.wait_status(0, "refused", 1)
        line = p.wait_for("pub-0000000003 refused")
        self.assertIn("table-0.bin", line)
        self.assertIn("answers stay at version 2", line)
        self.assertIn("pub-0000000003 refused", st["last_refusal"])
        self.assertEqual(st["version"], 2)
        self.check_rows(0, good, 2)
        # a good delta after it is not applied: the chain is broken
        self.write(0, 4, False, 1, {i: row_value(i, 4) for i in ids[:3]})
        self.wait_status(0, "newest_seen", 4)
        p.wait_for("waiting for a full publication after version 3")
        self.check_rows(0, good, 2)
        # a truncated full one: refused too
        self.damaged(0, 5, True, 5, {i: row_value(i, 5) for i in ids}, "truncate")
        st = self.wait_status(0, "refused", 2)
        self.assertIn("pub-0000000005 refused", p.wait_for("pub-0000000005 refused"))
        self.check_rows(0, good, 2)
        # the next full one is loaded
        six = {i: row_value(i, 6) for i in ids[5:]}
        self.write(0, 6, True, 6, six)
        self.wait_status(0, "version", 6)
        self.check_rows(0, six, 6, gone=ids[:5])
        # version 7 never comes: 8 is a skip, refused
        self.write(0, 8, False, 6, {ids[5]: row_value(ids[5], 8)})
        st = self.wait_status(0, "refused", 3)
        line = p.wait_for("version 7 is missing (skipped)")
        self.assertIn("pub-0000000007 refused", line)
        self.assertEqual(st["version"], 6)
        self.check_rows(0, six, 6, gone=ids[:5])
        self.write(0, 9, True, 9, good)
        self.wait_status(0, "version", 9)
        self.check_rows(0, good, 9)
        self.assertEqual(self.status(0)["refused"], 3)
        # the directory emptied and begun again: said, answers stay. Moved
        # away whole first: a follower that looked while rmtree was halfway
        # saw version 8 as the newest, said that once, and never version 1.
        gone = os.path.join(self.d, "ps-0-removed")
        os.rename(os.path.join(self.pub, JOB, "ps-0"), gone)
        shutil.rmtree(gone)
        self.write(0, 1, True, 1, six)
        p.wait_for("the newest in %s is version 1, older than version 9 held"
                   % os.path.join(self.pub, JOB, "ps-0"))
        self.check_rows(0, good, 9)

    def test_every_answer_comes_from_one_version(self):
        import threading  # pylint: disable=import-outside-toplevel
        ids = ids_of(0, 10000)
        self.write(0, 1, True, 1, {i: row_value(i, 1) for i in ids})
        self.start(0)
        self.wait_status(0, "version", 1)
        stop, seen, bad, want = threading.Event(), [], [], {}

        def expected(v):  # the rows of version v, made once
            if v not in want:
                want[v] = b"".join(bits(row_value(i, v)) for i in ids)
            return want[v]

        def load():
            while not stop.is_set():
                try:
                    v, _, found, rows, _ = self.lookup(0, ids)
                except self.grpc.RpcError as e:
                    bad.append("%s %s" % (e.code(), e.details()))
                    continue
                seen.append(v)
                if found != [1] * len(ids) or b"".join(rows) != expected(v):
                    bad.append("version %d: rows of other versions" % v)

        threads = [threading.Thread(target=load) for _ in range(4)]
        for t in threads:
            t.start()
        try:
            for v in range(2, 31):
                self.write(0, v, False, 1, {i: row_value(i, v) for i in ids})
                self.wait_status(0, "version", v)
        finally:
            stop.set()
            for t in threads:
                t.join(60)
        self.assertEqual(bad, [])
        self.assertGreater(len(set(seen)), 3, "lookups saw too few versions")
        self.assertEqual(self.status(0)["applied"], 30)

    def test_refused_settings_exit_2(self):
        with open(self.spec) as f:
            cfg = json.load(f)
        del cfg["job"]["publish"]
        nopub = os.path.join(self.d, "nopub.json")
        with open(nopub, "w") as f:
            json.dump(cfg, f)
        psd = h.build_path("ps-server", "psd")
        r = h.run([psd, "--cluster", nopub, "--task", "serve:1"], timeout=30)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("psd: serve:1 follows the publications of shard 1, but the spec has "
                      "no job.publish.dir", r.stderr)
        r = h.run([psd, "--cluster", self.spec, "--task", "serve:0", "--metrics-listen",
                   "127.0.0.1:0"], timeout=30)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("a serving task (serve:0) serves no /metrics", r.stderr)
        r = h.run([psd, "--cluster", self.spec, "--task", "serve:4"], timeout=30)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("cluster.serve has 4 entries", r.stderr)

    @unittest.skipUnless(shutil.which("openssl"), "the openssl command is not installed")
    def test_tls_as_every_shard(self):
        from test_auth import make_certs  # pylint: disable=import-outside-toplevel
        grpc = self.grpc
        make_certs(self.d)
        with open(self.spec) as f:
            cfg = json.load(f)
        cfg["auth"]["tls"] = {"ca": "ca.pem", "cert": "server.pem", "key": "server.key"}
        with open(self.spec, "w") as f:
            json.dump(cfg, f)
        want = {i: row_value(i, 1) for i in ids_of(0, 5)}
        self.write(0, 1, True, 1, want)
        p = self.start(0)
        self.assertIn("security: bearer token required, TLS", p.output())
        with open(os.path.join(self.d, "ca.pem"), "rb") as f:
            creds = grpc.ssl_channel_credentials(root_certificates=f.read())
        ids = sorted(want)
        msg = pb.caller(JOB) + pb.ld(2, "emb") + pb.ld(14, struct.pack("<%dQ" % len(ids), *ids))
        md = [("authorization", "Bearer " + TOKEN)]
        deadline = time.monotonic() + 20
        with grpc.secure_channel(self.serve_addrs[0], creds) as ch:
            lookup = ch.unary_unary("/psd.v1.Serve/Lookup")
            while True:  # until version 1 is loaded
                try:
                    r = decode(lookup(msg, timeout=10, metadata=md))
                    break
                except grpc.RpcError as e:
                    if e.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
            self.assertEqual(r[1][0], 1)
            self.assertEqual(r[15][0], b"".join(bits(want[i]) for i in ids))
            with self.assertRaises(grpc.RpcError) as e:
                lookup(msg, timeout=10)
            self.assertEqual(e.exception.code(), grpc.StatusCode.UNAUTHENTICATED)
        with self.assertRaises(grpc.RpcError) as e:  # plaintext: no connection
            self.call(0, "/psd.v1.Serve/Lookup", msg)
        self.assertIn(e.exception.code(), (grpc.StatusCode.UNAVAILABLE,
                                           grpc.StatusCode.DEADLINE_EXCEEDED))

    def test_restarted_task_catches_up_while_a_replica_answers(self):
        ids = ids_of(0, 40)
        want = {i: row_value(i, 1) for i in ids}
        self.write(0, 1, True, 1, want)
        for v in (2, 3):
            change = {i: row_value(i, v) for i in ids[v:v + 5]}
            self.write(0, v, False, 1, change, removed=[ids[-v]])
            want.update(change)
            del want[ids[-v]]
        p = self.start(0)
        self.start(2)
        for j in (0, 2):
            self.wait_status(j, "version", 3)
            self.check_rows(j, want, 3, gone=[ids[-2], ids[-3]])
        p.stop(signal.SIGKILL)
        self.write(0, 4, False, 1, {ids[0]: row_value(ids[0], 4)})
        want[ids[0]] = row_value(ids[0], 4)
        self.wait_status(2, "version", 4)
        self.check_rows(2, want, 4)  # the other replica answers meanwhile
        want = {i: row_value(i, 5) for i in ids[10:]}
        self.write(0, 5, True, 5, want)
        self.write(0, 6, False, 5, {ids[11]: row_value(ids[11], 6)}, removed=[ids[12]])
        want[ids[11]] = row_value(ids[11], 6)
        del want[ids[12]]
        self.wait_status(2, "version", 6)
        self.check_rows(2, want, 6, gone=ids[:10] + [ids[12]])  # in place
        p = self.start(0)
        self.wait_status(0, "version", 6)
        self.check_rows(0, want, 6, gone=ids[:10] + [ids[12]])
        # its log line may follow the Status that showed the version
        p.wait_for("serving version 6 (delta")
        self.assertIn("serving version 5 (full", p.output())
        self.assertNotIn("serving version 4", p.output())  # from the newest full
        self.assertEqual(self.serving[2].stop(signal.SIGTERM), 0)
        self.assertEqual(p.stop(signal.SIGTERM), 0)



if __name__ == "__main__":
    h.main()
